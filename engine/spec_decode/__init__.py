"""Speculative decoding in the real engine: the `--speculative-config` record (config.py, no
torch), the proposers (proposers.py) and the acceptance rule (rejection.py)."""
