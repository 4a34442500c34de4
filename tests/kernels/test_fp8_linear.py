"""The Triton activation quantization of FP8 weights' linear (kernels/fp8_linear.py: one dynamic
scale per tensor, as vLLM's default) gives the reference's values bit for bit, on batches whose
rows span many scales; the linear equals the reference's."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.fp8_linear import linear_fp8, quantize_fp8_tensor
from kernels.reference import FP8_MAX, linear_fp8_ref
from kernels.reference import quantize_fp8_tensor as quantize_ref


@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 9), k=st.sampled_from([16, 48, 64, 200]), seed=st.integers(0, 10**6),
       spread=st.floats(1e-3, 1e3), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_quantization_matches_the_reference_bit_for_bit(m, k, seed, spread, dtype):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * torch.logspace(-2, 2, m).reshape(-1, 1) * spread).to(dtype)
    q, s = quantize_fp8_tensor(x)
    q_ref, s_ref = quantize_ref(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == ()
    assert torch.equal(s, s_ref)  # the largest |x| of all rows, found across programs
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert float(q.float().abs().max()) == FP8_MAX


def test_an_all_zero_batch_gets_the_floor_scale_not_a_division_by_zero():
    q, s = quantize_fp8_tensor(torch.zeros(2, 32))
    assert bool((q.float() == 0).all()) and float(s) == pytest.approx(1e-12 / FP8_MAX)


def test_linear_equals_the_reference_and_keeps_leading_dims():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 64, generator=g)
    w = torch.randn(32, 64, generator=g)
    scale = w.abs().amax() / FP8_MAX
    wq = (w / scale).to(torch.float8_e4m3fn)
    got = linear_fp8(x, wq, scale)
    want = linear_fp8_ref(x.reshape(6, 64), wq, scale).reshape(2, 3, 32)
    assert got.shape == (2, 3, 32) and torch.equal(got, want)  # fast accumulation is a GPU mode


def test_a_non_matrix_is_refused_naming_the_shape():
    with pytest.raises(ValueError, match=r"\[M, K\]"):
        quantize_fp8_tensor(torch.zeros(2, 3, 4))
