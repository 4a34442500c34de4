"""The Streamlit what-if dashboard (a later issue)."""
