"""Triton paged-attention kernels and their plain-PyTorch references."""
