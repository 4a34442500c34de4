#!/usr/bin/env python3
"""What the fused-MoE kernels compile to on an H100/H200, with no GPU: each kernel compiled by Triton
for sm90 and assembled by ptxas (`-v`), per plan: registers, spilled bytes, shared memory, cp.async
copies in the main loop (a pipelined loop) and the widest wgmma. qwen3-30b-a3b's layer (H 2048,
N 768, 128 experts, top 8), arguments specialised as a launch specialises them (pointers and
16-divisible sizes and strides; the step's counts not).

    python3 benchmarks/kernels/moe_compile.py [--out DIR]     # prints a markdown table; DIR/moe_compile.md

Why: run 3's grouping ("blocks") scatter holds [256, 128] int32 one-hots (128 KB of shared memory,
255 registers and spills), and the direct path's FMA loops are not pipelined (no cp.async); run 4's
kernels were shaped by this table before the GPU run, and run 5's prefill kernels (`run5_rows`) likewise.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # the compiler, not the interpreter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels import fused_moe as fm
from kernels import moe_align as ma
from kernels import moe_direct as md

TARGET = GPUTarget("cuda", 90, 32)
PTRS = {"ids_ptr": "*i32", "bexp_ptr": "*i32", "hist_ptr": "*i32", "sorted_ptr": "*i32", "tw_ptr": "*fp32"}


def _ptxas() -> str:
    import shutil

    found = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return str(bundled) if bundled.exists() else found


def compile_row(fn, constexprs: dict, options: dict, unaligned: tuple = (), sig_over: dict | None = None) -> dict:
    """Compile one specialisation of `fn`; its resources."""
    names = fn.arg_names
    sig = {n: "constexpr" if n in constexprs else (PTRS.get(n, "*bf16") if n.endswith(("_ptr",)) else "i32")
           for n in names}
    sig.update(sig_over or {})
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items()
             if t != "constexpr" and not t.startswith("tensordesc") and n not in unaligned}
    k = triton.compile(ASTSource(fn, sig, constexprs, attrs), target=TARGET, options=options)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    out = subprocess.run([_ptxas(), "-v", "-arch=sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True,
                         check=False).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores", out)
    mma = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", k.asm["ptx"])))
    return {"kernel": fn.__name__, "plan": ", ".join(f"{a}={b}" for a, b in constexprs.items() if a != "w_desc")
            + f", warps={options['num_warps']}, stages={options.get('num_stages', 3)}",
            "registers": int(regs.group(1)) if regs else None, "spill_bytes": int(spill.group(1)) if spill else None,
            "shared_bytes": k.metadata.shared, "async_copies": k.asm["ttgir"].count("async_copy_global_to_local"),
            "wgmma": " ".join(mma) or "-", "tma_copies": k.asm["ttgir"].count("ttng.async_tma_copy_global_to_local"),
            "loop_depth": loop_depth(k.asm["ttgir"])}


def loop_depth(ttgir: str) -> int:
    """The deepest nesting of scf.for loops in the TTGIR: a persistent kernel whose tile loop Triton
    flattened (the K loop fused into it, `tl.range(..., flatten=True)`) has 1, one that it did not
    (the flag off, or a branch in the loop body) 2. A loop's closing brace has the loop's indent."""
    open_at, deepest = [], 0
    for line in ttgir.splitlines():
        indent = len(line) - len(line.lstrip())
        if " scf.for " in f" {line.strip()}" or "= scf.for " in line:
            open_at.append(indent)
            deepest = max(deepest, len(open_at))
        elif line.strip().startswith("}") and open_at and indent == open_at[-1] and not line.strip().startswith("} else"):
            open_at.pop()
    return deepest


def rows() -> list[dict]:
    al = ("n", "num_experts", "cap", "num_blocks", "num_chunks")
    gu = ("num_pairs", "top_k", "num_blocks")
    dd = ("num_tokens", "top_k")
    d_gu = {"USE_DOT": False, "USE_GDC": True, "EVICT": "", "EARLY": False, "ONE_LOOP": False, "STAGES": 1, "WIDE_STEPS": 0}
    d_dn = {"KP2": 8, "USE_DOT": False, "USE_GDC": True, "EVICT": "", "PREFETCH": False, "LINES": 16, "WIDE_STEPS": 0}
    ids64 = {"ids_ptr": "*i64"}
    return [
        compile_row(ma._scatter_kernel, {"BLOCK_M": 128, "EP2": 128, "CHUNK": 256, "ROWS": 16, "COUNT_HERE": False},
                    {"num_warps": 8}, al, ids64),
        compile_row(ma._place_kernel, {"BLOCK_M": 128, "EP2": 128, "LOG_EP2": 7, "CHUNK": 256, "ROWS": 32,
                                       "COUNT_HERE": False}, {"num_warps": 4}, al, ids64),
        compile_row(ma._hist_kernel, {"EP2": 128, "CHUNK": 256}, {"num_warps": 4}, ("n",), ids64),
        compile_row(fm._ksum_kernel, {"KP2": 8, "BLOCK_H": 1024}, {"num_warps": 4}, ("num_tokens",)),
        compile_row(md._gate_up_direct_kernel, {"BLOCK_N": 16, "BLOCK_K": 256, **d_gu},
                    {"num_warps": 4, "num_stages": 3}, gu, ids64),
        compile_row(md._gate_up_direct_kernel, {"BLOCK_N": 16, "BLOCK_K": 256, **d_gu, "ONE_LOOP": True, "STAGES": 3},
                    {"num_warps": 4, "num_stages": 3}, gu, ids64),
        compile_row(md._down_direct_kernel, {"BLOCK_N": 8, "BLOCK_K": 128, **d_dn}, {"num_warps": 4, "num_stages": 3},
                    dd, ids64),
        compile_row(md._down_direct_kernel, {"BLOCK_N": 8, "BLOCK_K": 128, **d_dn}, {"num_warps": 8, "num_stages": 3},
                    dd, ids64),
        compile_row(md._down_direct_kernel, {"BLOCK_N": 8, "BLOCK_K": 128, **d_dn, "PREFETCH": True},
                    {"num_warps": 8, "num_stages": 3}, dd, ids64),
        compile_row(fm._gate_up_kernel, {"w_desc": None, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8,
                                         "USE_TMA": False}, {"num_warps": 8, "num_stages": 3}, gu),
        compile_row(fm._gate_up_kernel, {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "USE_TMA": True},
                    {"num_warps": 8, "num_stages": 3}, gu, {"w_desc": "tensordesc<bf16[128, 64]>"}),
        compile_row(fm._gate_up_joint_kernel, {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8},
                    {"num_warps": 8, "num_stages": 3}, gu, {"w_desc": "tensordesc<bf16[1, 2, 128, 64]>"}),
        compile_row(fm._down_kernel, {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "ATOMIC": False,
                                      "USE_TMA": True}, {"num_warps": 8, "num_stages": 3}, gu,
                    {"w_desc": "tensordesc<bf16[256, 64]>"}),
        *run5_rows(gu),
    ]


def run5_rows(gu: tuple) -> list[dict]:
    """Each kernel run 5's prefill plans launch (kernels.moe_plans.PREFILL_RUN5) once, with how many of
    its programs an SM holds at once (`resident_per_sm`)."""
    from kernels.moe_align import padded_length
    from kernels.moe_plans import PREFILL_RUN5

    specs = {}
    for p in PREFILL_RUN5:
        ce = {"BLOCK_M": p.block_m, "BLOCK_N": p.block_n, "BLOCK_K": p.block_k, "GROUP_M": p.group_m,
              "SORTED": p.sorted_act}
        fn = fm._gate_up_joint_kernel
        if p.up_persistent:
            fn, ce = fm._gate_up_joint_persistent_kernel, {**ce, "NB_P2": 512, "FLATTEN": True}
        specs.setdefault(("gu", fn.__name__, *ce.values(), p.num_warps, p.num_stages), (
            fn, ce, {"num_warps": p.num_warps, "num_stages": p.num_stages}, gu,
            {"w_desc": f"tensordesc<bf16[1, 2, {p.block_n}, {p.block_k}]>"}))
        d = p.down()
        over = {"w_desc": f"tensordesc<bf16[{d.block_n}, {d.block_k}]>", "out_ptr": "*fp32" if d.atomic_sum else "*bf16"}
        opts = {"num_warps": d.num_warps, "num_stages": d.num_stages}
        if d.sorted_act:
            blocks = padded_length(4096 * 8, 128, d.block_m) // d.block_m
            ce = {"BLOCK_M": d.block_m, "BLOCK_N": d.block_n, "BLOCK_K": d.block_k, "GROUP_M": d.group_m,
                  "NB_P2": 1 << (blocks - 1).bit_length(), "ATOMIC": d.atomic_sum,
                  "FLATTEN": bool(d.persistent) and not d.atomic_sum}
            spec = (fm._down_sorted_kernel, ce, opts, gu, {**over, "a_desc": f"tensordesc<bf16[{d.block_m}, {d.block_k}]>"})
        else:
            ce = {"BLOCK_M": d.block_m, "BLOCK_N": d.block_n, "BLOCK_K": d.block_k, "GROUP_M": d.group_m,
                  "ATOMIC": d.atomic_sum, "USE_TMA": d.tma}
            spec = (fm._down_kernel, ce, opts, gu, over)
        specs.setdefault(("down", spec[0].__name__, *ce.values(), *opts.values()), spec)
    rows = []
    for fn, ce, opts, unaligned, over in specs.values():
        row = compile_row(fn, ce, opts, unaligned, over)
        row["plan"] += f", {resident_per_sm(row['registers'], row['shared_bytes'], opts['num_warps'])} a SM"
        rows.append(row)
    return rows


def resident_per_sm(registers: int | None, shared: int, num_warps: int) -> int:
    """How many programs of a compiled kernel one SM holds at once (sm90: 64K registers, allocated per
    warp in 256s; 228 KB shared memory, 1 KB reserved per program; 64 warps; 32 programs)."""
    regs_per_warp = -(-max(registers or 1, 1) * 32 // 256) * 256
    by_regs = 65536 // (regs_per_warp * num_warps)
    by_smem = 233472 // (shared + 1024)
    return max(1, min(by_regs, by_smem, 64 // num_warps, 32))


def markdown(table: list[dict]) -> str:
    lines = ["| kernel | plan | registers | spill bytes | shared bytes | cp.async copies | wgmma |",
             "|---|---|---:|---:|---:|---:|---|"]
    lines += [f"| {r['kernel']} | {r['plan']} | {r['registers']} | {r['spill_bytes']} | {r['shared_bytes']} | "
              f"{r['async_copies']} | {r['wgmma']} |" for r in table]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    text = markdown(rows())
    print(text, end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "moe_compile.md").write_text(text)


if __name__ == "__main__":
    main()
