"""The Streamlit what-if dashboard: it calls the same functions as the command line (sim.run, the advisor)."""

# Uploads larger than this are refused by the uploader and by the server (`costline app` passes it
# to Streamlit); kept here so the command line can read it without importing Streamlit.
MAX_UPLOAD_MB = 32
