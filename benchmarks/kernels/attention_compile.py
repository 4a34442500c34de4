"""Every attention launch variant the engine makes, compiled for sm90 on the CPU (no GPU).

    python3 benchmarks/kernels/attention_compile.py [--out FILE.json]

Triton builds the kernel for an H100/H200 target, ptxas reports registers, spills and shared
memory, nvdisasm counts instructions: decode and prefill tile shapes (bf16 cache, the 8B
layer: 4 query heads per KV head, D 128), static grid or work list, split or not, and the
split merge both ways. A compile error or a spill change shows here before any GPU time is
spent; fp8_compile.py does the same for the fp8 conversion variants.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fp8_compile as fc
import triton
from triton.compiler import ASTSource

from kernels.paged_attention import CONFIG_TABLE, _merge_splits_kernel, _paged_attention_kernel

POINTERS_I32 = ("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr", "work_ptr", "num_work_ptr")
POINTERS_F32 = ("segm_out_ptr", "segm_lse_ptr", "k_scale_ptr", "v_scale_ptr")
RUNTIME_INTS = {"num_seqs", "num_splits", "min_tiles_per_split", "block_q"}


def _signature(kernel, constexprs: dict) -> tuple[dict, dict]:
    names = kernel.arg_names
    constexprs = {k: v for k, v in constexprs.items() if k in names}
    sig = {n: "constexpr" if n in constexprs else ("*bf16" if n.endswith("_ptr") else "i32") for n in names}
    sig.update({n: "*i32" for n in POINTERS_I32 if n in names})
    sig.update({n: "*fp32" for n in POINTERS_F32 if n in names})
    if "qk_scale" in sig:
        sig["qk_scale"] = "fp32"
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items()
             if t not in ("constexpr", "fp32") and n not in RUNTIME_INTS}  # fmt: skip
    return sig, constexprs, attrs


def compile_report(kernel, constexprs: dict, warps: int, stages: int) -> dict:
    sig, cons, attrs = _signature(kernel, constexprs)
    k = triton.compile(ASTSource(kernel, sig, cons, attrs), target=fc.TARGET,
                       options={"num_warps": warps, "num_stages": stages})
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        ptx.write_text(k.asm["ptx"])
        report = subprocess.run([str(fc.BIN / "ptxas"), "-v", "--gpu-name=sm_90a", str(ptx), "-o", str(cubin)],
                                capture_output=True, text=True, check=True).stderr  # fmt: skip
        sass = subprocess.run([str(fc.BIN / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
    number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, report)) else None
    instrs = [text for addr, text in fc.sass_lines(sass) if addr >= 0]
    return {"registers": number(r"Used (\d+) registers"), "spill_store_bytes": number(r"(\d+) bytes spill stores"),
            "shared_bytes": k.metadata.shared, "sass": len(instrs),
            "mma": sum(t.startswith(("HMMA", "HGMMA")) for t in instrs)}


def variants() -> list[tuple[str, object, dict, int, int]]:
    out = []
    for path, kind in (("decode", 1), ("prefill", 2)):
        cfg = CONFIG_TABLE[path, "16bit"]
        base = {"NUM_QUERIES_PER_KV": 4, "BLOCK_M": cfg.block_m, "BLOCK_Q": cfg.block_m // 4, "HEAD_DIM": 128,
                "HEAD_DIM_PAD": 128, "BLOCK_SIZE": 16, "TILE_N": cfg.tile_n, "DOT_PRECISION": "tf32",
                "KV_FP8": False, "FP8_CONVERT": "native", "stride_k_scale": 0, "stride_v_scale": 0,
                "DECODE_MAX_Q": 4}
        for work in (False, True):
            for split in (False, True):
                name = f"attention {path}{' work' if work else ''}{' split' if split else ''}"
                out.append((name, _paged_attention_kernel, {**base, "SEQ_KIND": kind if work else 0,
                                                            "IS_SPLIT": split, "USE_WORK": work},
                            cfg.num_warps, cfg.num_stages))
            merge = {"TILE_N": cfg.tile_n, "HEAD_DIM": 128, "HEAD_DIM_PAD": 128, "NUM_SPLITS_PAD": 16,
                     "SEQ_KIND": kind if work else 0, "DECODE_MAX_Q": 4, "USE_WORK": work}
            out.append((f"merge {path}{' work' if work else ''}", _merge_splits_kernel, merge, 4, 1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = []
    for name, kernel, cons, warps, stages in variants():
        rows.append({"variant": name, "num_warps": warps, "num_stages": stages,
                     **compile_report(kernel, cons, warps, stages)})
        print(json.dumps(rows[-1]), flush=True)
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
