"""Speculative decoding in the real engine: the proposers (proposers.py) and the acceptance rule
(rejection.py). The `--speculative-config` record is torch-free, in `engine.core.speculative_config`."""
