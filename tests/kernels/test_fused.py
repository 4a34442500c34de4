"""The fused Triton element-wise kernels (CPU interpreter here) equal the plain PyTorch steps
they replace: rotary + K/V cache store, and SiLU(gate) * up."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from engine.model import Rotary
from engine.model_spec import get_model

if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1", allow_module_level=True)

from engine.fused_ops import rope_store_kv, silu_mul


@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 16), (2, 2, 8)])
def test_rope_store_kv_matches_torch(hq, hkv, d):
    g = torch.Generator().manual_seed(0)
    t, blocks, bs = 7, 6, 4
    spec = get_model("tiny").model_copy(update={"num_heads": hq, "num_kv_heads": hkv,
                                                "hidden_size": hq * d, "head_dim": d})
    assert spec.head_dim == d
    rot = Rotary(spec, 64, torch.device("cpu"))
    # Strided qkv rows (a view into a wider buffer), as a projection's output slice could be.
    wide = torch.randn(t, (hq + 2 * hkv) * d + 5, generator=g)
    qkv = wide[:, : (hq + 2 * hkv) * d]
    positions = torch.tensor([0, 5, 63, 17, 2, 9, 30])
    slots = torch.tensor([3, -1, 22, 0, 9, 14, -1])  # -1: padding, stored nowhere
    kc = torch.zeros(blocks, bs, hkv, d)
    vc = torch.zeros(blocks, bs, hkv, d)
    q = rope_store_kv(qkv, positions, rot.cos, rot.sin, kc, vc, slots, hq, hkv, d)

    cos, sin = rot.lookup(positions, torch.float32)
    qk = Rotary.apply(qkv[:, : (hq + hkv) * d].reshape(t, hq + hkv, d), cos, sin)
    v = qkv[:, (hq + hkv) * d:].reshape(t, hkv, d)
    torch.testing.assert_close(q, qk[:, :hq], atol=1e-6, rtol=1e-5)
    kref = torch.zeros_like(kc).view(-1, hkv, d)
    vref = torch.zeros_like(vc).view(-1, hkv, d)
    ok = slots >= 0
    kref[slots[ok]] = qk[ok, hq:]
    vref[slots[ok]] = v[ok]
    torch.testing.assert_close(kc.view(-1, hkv, d), kref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(vc.view(-1, hkv, d), vref, atol=0, rtol=0)


def test_silu_mul_matches_torch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 2 * 1500, generator=g) * 4  # 1500: two column blocks, the second partial
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(silu_mul(x), F.silu(gate) * up, atol=1e-5, rtol=1e-5)


def test_add_rms_norm_matches_torch():
    from engine.fused_ops import add_rms_norm

    g = torch.Generator().manual_seed(2)
    x, d = torch.randn(4, 48, generator=g), torch.randn(4, 48, generator=g)  # 48: padded to 64
    w = torch.rand(48, generator=g) + 0.5
    s, h = add_rms_norm(x, d, w, 1e-5)
    torch.testing.assert_close(s, x + d, atol=0, rtol=0)
    torch.testing.assert_close(h, F.rms_norm(x + d, (48,), w, 1e-5), atol=1e-6, rtol=1e-5)
