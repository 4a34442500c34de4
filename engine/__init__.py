"""The real engine. `request`, `model_spec`, `block_manager` and `scheduler` import neither torch
nor triton: the simulator drives the very same scheduler objects."""
