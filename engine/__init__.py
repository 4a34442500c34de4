"""The real engine. `request`, `model_spec`, `block_pool`, `block_keys`, `scheduler` and `decode_skip` import neither torch
nor triton: the simulator drives the very same scheduler objects."""
