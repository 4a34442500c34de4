"""Whether the fused Triton element-wise kernels can run, without importing Triton eagerly."""

from __future__ import annotations


def fused_ops_available(head_dim: int) -> bool:
    half = head_dim // 2
    if head_dim % 2 or half & (half - 1):
        return False  # the fused rotary kernel needs head_dim / 2 a power of two
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
