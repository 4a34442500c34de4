"""The fused Triton element-wise kernels (CPU interpreter here) against their references in
kernels.reference, the references against independent formulas, and the two KV-cache writers
(the fused rotary kernel's and kernels.cache_write's) against each other."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.cache_write import write_kv_cache
from kernels.fused import add_rms_norm, rope_fusable, rope_store_kv, silu_mul
from kernels.reference import add_rms_norm_ref, rope_store_kv_ref, silu_mul_ref
from tests.kernels.helpers import SETTINGS

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SENTINEL = 7.0  # cache cells nobody wrote keep it


def close(dtype: torch.dtype) -> dict:
    """fp32: rounding noise; half types: one rounding step apart (both round an fp32 value once,
    and Triton's CPU interpreter rounds fp32 to bf16 toward zero where torch rounds to nearest)."""
    return {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {}


def rope_tables(max_positions: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv)
    return angles.cos().float(), angles.sin().float()


def rope_case(num_tokens, num_kv_heads, group, head_dim, block_size, dtype, seed):
    """Strided qkv rows (a view into a wider buffer, as a projection's output slice could be),
    positions, slots with padding (-1), and sentinel-filled caches."""
    gen = torch.Generator().manual_seed(seed)
    hq = num_kv_heads * group
    width = (hq + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_tokens, width + 5, generator=gen).to(dtype)[:, :width]
    positions = torch.randint(0, 64, (num_tokens,), generator=gen)
    num_blocks = num_tokens // block_size + 2
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[torch.rand(num_tokens, generator=gen) < 0.25] = -1
    cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), SENTINEL, dtype=dtype)
    return qkv, positions, slots, cache, hq


rope_shapes = {
    "num_tokens": st.integers(1, 12),
    "num_kv_heads": st.sampled_from([1, 2]),
    "group": st.sampled_from([1, 2, 4]),
    "head_dim": st.sampled_from([8, 16, 32, 64]),
    "block_size": st.sampled_from([4, 8, 16]),
    "dtype": st.sampled_from(DTYPES),
    "seed": st.integers(0, 2**16),
}


@settings(max_examples=25, **SETTINGS)
@given(**rope_shapes)
def test_rope_store_kv_matches_reference(num_tokens, num_kv_heads, group, head_dim, block_size,
                                         dtype, seed):
    qkv, positions, slots, cache, hq = rope_case(num_tokens, num_kv_heads, group, head_dim,
                                                 block_size, dtype, seed)
    cos, sin = rope_tables(64, head_dim)
    kc, vc, kc_ref, vc_ref = (cache.clone() for _ in range(4))
    args = (num_kv_heads, head_dim)
    q = rope_store_kv(qkv, positions, cos, sin, kc, vc, slots, hq, *args)
    q_ref = rope_store_kv_ref(qkv, positions, cos, sin, kc_ref, vc_ref, slots, hq, *args)
    torch.testing.assert_close(q, q_ref, **close(dtype))
    torch.testing.assert_close(kc, kc_ref, **close(dtype))
    assert torch.equal(vc, vc_ref)  # v is copied, never computed on
    written = int((slots >= 0).sum())
    assert int((kc == SENTINEL).all(-1).all(-1).sum()) == cache.shape[0] * block_size - written


@settings(max_examples=20, **SETTINGS)
@given(**rope_shapes)
def test_the_two_kv_cache_writers_agree_bit_for_bit(num_tokens, num_kv_heads, group, head_dim,
                                                    block_size, dtype, seed):
    """The fused kernel's k store against write_kv_cache fed the same rotated k. The k heads are
    copies of the first q heads, so the rotated q the kernel returns holds that rotated k."""
    qkv, positions, slots, cache, hq = rope_case(num_tokens, num_kv_heads, group, head_dim,
                                                 block_size, dtype, seed)
    heads = qkv.unflatten(1, (hq + 2 * num_kv_heads, head_dim))
    heads[:, hq: hq + num_kv_heads] = heads[:, :num_kv_heads]
    cos, sin = rope_tables(64, head_dim)
    kc_fused, vc_fused, kc_plain, vc_plain = (cache.clone() for _ in range(4))
    q = rope_store_kv(qkv, positions, cos, sin, kc_fused, vc_fused, slots, hq, num_kv_heads,
                      head_dim)
    write_kv_cache(q[:, :num_kv_heads], heads[:, hq + num_kv_heads:], kc_plain, vc_plain, slots)
    assert torch.equal(kc_fused, kc_plain) and torch.equal(vc_fused, vc_plain)


@pytest.mark.parametrize("head_dim", [24, 80])
def test_rope_store_kv_without_a_fusable_head_dim_equals_the_reference(head_dim):
    """head_dim / 2 not a power of two: PyTorch rotary, then the Triton cache writer."""
    assert not rope_fusable(head_dim)
    qkv, positions, slots, cache, hq = rope_case(9, 2, 2, head_dim, 4, torch.bfloat16, seed=4)
    cos, sin = rope_tables(64, head_dim)
    kc, vc, kc_ref, vc_ref = (cache.clone() for _ in range(4))
    q = rope_store_kv(qkv, positions, cos, sin, kc, vc, slots, hq, 2, head_dim)
    q_ref = rope_store_kv_ref(qkv, positions, cos, sin, kc_ref, vc_ref, slots, hq, 2, head_dim)
    assert torch.equal(q, q_ref) and torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)


def test_rope_fusable_head_dims():
    assert [d for d in range(1, 257) if rope_fusable(d)] == [2, 4, 8, 16, 32, 64, 128, 256]


def test_rope_store_kv_names_a_wrong_qkv_width():
    qkv, positions, slots, cache, hq = rope_case(3, 1, 2, 16, 4, torch.float32, seed=0)
    cos, sin = rope_tables(64, 16)
    with pytest.raises(ValueError, match=r"qkv must be \[num_tokens, \(Hq \+ 2 Hkv\)"):
        rope_store_kv(qkv[:, :-16], positions, cos, sin, cache, cache.clone(), slots, hq, 1, 16)


@settings(max_examples=15, **SETTINGS)
@given(num_tokens=st.integers(1, 5), n_cols=st.integers(1, 2100), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**16))
def test_silu_mul_matches_reference(num_tokens, n_cols, dtype, seed):
    """Widths past 1024 take two column blocks, the second one partial."""
    gen = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(num_tokens, 2 * n_cols, generator=gen) * 4).to(dtype)
    torch.testing.assert_close(silu_mul(gate_up), silu_mul_ref(gate_up), **close(dtype))


@settings(max_examples=15, **SETTINGS)
@given(num_tokens=st.integers(1, 5), n_cols=st.integers(1, 300), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**16))
def test_add_rms_norm_matches_reference(num_tokens, n_cols, dtype, seed):
    """Widths that are not a power of two leave part of the kernel's tile masked."""
    gen = torch.Generator().manual_seed(seed)
    x, delta = (torch.randn(num_tokens, n_cols, generator=gen).to(dtype) for _ in range(2))
    weight = (torch.rand(n_cols, generator=gen) + 0.5).to(dtype)
    total, normed = add_rms_norm(x, delta, weight, 1e-5)
    total_ref, normed_ref = add_rms_norm_ref(x, delta, weight, 1e-5)
    if dtype == torch.bfloat16:
        torch.testing.assert_close(total, total_ref)
    else:  # the sum of two fp16/fp32 values rounds alike everywhere
        assert torch.equal(total, total_ref)
    torch.testing.assert_close(normed, normed_ref, **close(dtype))


def test_references_equal_independent_formulas():
    """Rotary as a complex multiply, RMSNorm and SiLU from their textbook forms, in float64."""
    gen = torch.Generator().manual_seed(9)
    qkv, positions, slots, cache, hq = rope_case(6, 2, 2, 16, 4, torch.float32, seed=9)
    cos, sin = rope_tables(64, 16)
    kc, vc = cache.clone(), cache.clone()
    q = rope_store_kv_ref(qkv, positions, cos, sin, kc, vc, slots, hq, 2, 16)
    x = qkv.unflatten(1, (hq + 4, 16))[:, :hq].double()
    angle = torch.complex(cos[positions].double(), sin[positions].double()).unsqueeze(1)
    rotated = torch.complex(x[..., :8], x[..., 8:]) * angle
    torch.testing.assert_close(q.double(), torch.cat((rotated.real, rotated.imag), -1),
                               atol=1e-6, rtol=1e-5)

    a, b = torch.randn(3, 40, generator=gen), torch.randn(3, 40, generator=gen)
    w = torch.rand(40, generator=gen)
    s = (a + b).double()
    rms = (s.square().mean(-1, keepdim=True) + 1e-6).sqrt()
    torch.testing.assert_close(add_rms_norm_ref(a, b, w, 1e-6)[1].double(), s / rms * w.double(),
                               atol=1e-6, rtol=1e-5)

    g, u = torch.randn(4, 30, generator=gen).double(), torch.randn(4, 30, generator=gen).double()
    expected = g / (1 + torch.exp(-g)) * u
    torch.testing.assert_close(silu_mul_ref(torch.cat((g, u), -1).float()).double(), expected,
                               atol=1e-6, rtol=1e-5)
    assert not torch.allclose(silu_mul_ref(torch.cat((g, u), -1).float()).double(), F.silu(u) * g)
