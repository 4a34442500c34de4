"""One backend object for every kernel: what each name holds, and what importing costs."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

from kernels import BACKEND_NAMES, Backend, get_backend
from tests.conftest import REPO

ENTRIES = ("paged_attention", "write_kv_cache", "rope_store_kv", "add_rms_norm", "silu_mul", "linear",
           "linear_fp8", "work_block_qs")


def run_python(code: str, **env: str) -> None:
    """Run `code` in a fresh interpreter at the repository root; fail with its stderr."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=False, cwd=REPO,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_each_name_holds_its_own_set_of_kernels():
    from kernels import cache_write, fused, paged_attention, reference

    assert [f.name for f in dataclasses.fields(Backend)] == ["name", *ENTRIES, "fused_moe"]
    torch_backend, triton_backend = get_backend("torch"), get_backend("triton")
    # mixture of experts: the per-expert loop / Triton's fused_moe with the plan moe_plans.engine_tiles picks
    from kernels import moe_plans, moe_reference
    assert torch_backend.fused_moe is moe_reference.fused_moe_ref
    assert triton_backend.fused_moe is moe_plans.engine_fused_moe
    assert torch_backend.name == "torch" and triton_backend.name == "triton"
    for entry in ENTRIES:
        assert getattr(torch_backend, entry) is getattr(reference, entry + "_ref")
    assert triton_backend.paged_attention is paged_attention.paged_attention
    assert triton_backend.write_kv_cache is cache_write.write_kv_cache
    assert triton_backend.work_block_qs is paged_attention.work_block_qs
    assert torch_backend.work_block_qs(32, 8) is None  # the reference takes no work lists
    for entry in ("rope_store_kv", "add_rms_norm", "silu_mul"):
        assert getattr(triton_backend, entry) is getattr(fused, entry)
    # FP8 weights: the Triton backend quantizes activations in one kernel, then torch._scaled_mm
    from kernels import fp8_linear
    assert triton_backend.linear_fp8 is fp8_linear.linear_fp8
    assert set(BACKEND_NAMES) == {"torch", "triton"}


def test_an_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match=r"unknown kernel backend 'cuda-magic'.*'torch', 'triton'"):
        get_backend("cuda-magic")


def test_the_torch_backend_runs_a_forward_without_importing_triton():
    run_python("""
        import sys
        import torch
        import kernels
        from engine.attention import AttentionMetadata
        from engine.model import LlamaModel
        from engine.core.model_spec import get_model

        model = LlamaModel(get_model("tiny"), max_positions=64, seed=0)
        assert model.backend.name == "torch"
        kv = torch.zeros(2, 2, 4, 4, 2, 16)
        meta = AttentionMetadata(
            slot_mapping=torch.arange(5), block_tables=torch.tensor([[0, 1]], dtype=torch.int32),
            seq_lens=torch.tensor([5], dtype=torch.int32),
            query_start_loc=torch.tensor([0, 5], dtype=torch.int32), max_query_len=5,
            max_seq_len=5)
        with torch.no_grad():
            logits = model.compute_logits(model(torch.arange(5), torch.arange(5), kv, meta))
        assert logits.shape == (5, 512) and bool(logits.isfinite().all())
        assert "triton" not in sys.modules, "the torch backend imported triton"
    """)


def test_importing_the_triton_kernels_patches_no_interpreter_internals():
    """The Triton 3.6 interpreter work-around is the tests' job (tests/conftest.py), never a side
    effect of importing a production module."""
    run_python("""
        import kernels.cache_write, kernels.fused, kernels.paged_attention
        from kernels import get_backend
        from triton.runtime import interpreter

        get_backend("triton")
        assert interpreter._patch_lang_tensor.__module__ == "triton.runtime.interpreter"
        assert interpreter.InterpreterBuilder.create_dot.__module__ == "triton.runtime.interpreter"
        from kernels import _interpreter_compat

        _interpreter_compat.apply()  # what tests/conftest.py does
        assert interpreter._patch_lang_tensor.__module__ == "kernels._interpreter_compat"
    """, TRITON_INTERPRET="1")
