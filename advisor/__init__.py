"""Configuration search, recommendations and the `costline` command line."""
