"""Triton paged-attention kernels and their plain-PyTorch references.

``paged_attention`` / ``write_kv_cache`` are the Triton kernels; ``paged_attention_ref`` /
``write_kv_cache_ref`` compute the same thing in plain PyTorch. ``get_backend("triton" | "torch")``
returns either pair behind one interface so callers choose at run time.
"""

from kernels.backend import AttentionBackend, get_backend
from kernels.cache_write import write_kv_cache
from kernels.paged_attention import AttentionConfig, paged_attention
from kernels.reference import paged_attention_ref, write_kv_cache_ref

__all__ = [
    "AttentionBackend",
    "AttentionConfig",
    "get_backend",
    "paged_attention",
    "paged_attention_ref",
    "write_kv_cache",
    "write_kv_cache_ref",
]
