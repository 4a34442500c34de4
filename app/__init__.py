"""The Streamlit what-if dashboard: it calls the same functions as the command line (sim.run, the advisor)."""
