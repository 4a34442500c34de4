#!/usr/bin/env python3
"""What the fp8 decode variants compile to on an H100/H200, with no GPU: the decode kernel
compiled by Triton for sm90 and assembled by its ptxas and nvdisasm (shipped in the triton
wheel), per variant and launch shape: registers, spills, shared memory and the SASS
instructions that tell the variants apart (single-byte shared loads, shared loads and stores,
ldmatrix, e4m3 -> fp16 conversions, tensor-core ops), in total and in the main KV loop.

Llama-3.1-8B decode layout (32 query heads, 8 KV heads, head dim 128, block 16, bf16 q),
strides specialised as a launch specialises them (16-divisible, per-head scales of stride 1).

    python3 benchmarks/kernels/fp8_compile.py --out DIR [--fp8-variants words,fp16] \
        [--points 128,3,4,256,3,4]

Writes DIR/fp8_compile.json and DIR/fp8_compile.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

# the compiler, not the interpreter: a jitted function under TRITON_INTERPRET cannot be compiled
os.environ.pop("TRITON_INTERPRET", None)

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels.paged_attention import FP8_CONVERTS, _paged_attention_kernel

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
TARGET = GPUTarget("cuda", 90, 32)
QUERIES_PER_KV, HEAD_DIM, BLOCK_SIZE = 4, 128, 16
DEFAULT_POINTS = "128,3,4,256,3,4,128,3,8,256,3,8"  # (tile_n, stages, warps) x 4
# SASS opcode prefixes counted (LDS.U8/LDS.S8 = one byte per shared-memory load)
COUNTED = {"lds_u8": r"LDS\.[US]8", "lds": r"LDS\b", "ldsm": r"LDSM\b", "sts": r"STS", "f2fp": r"F2FP",
           "hmma": r"HMMA", "ldgsts": r"LDGSTS", "prmt": r"PRMT", "lop3": r"LOP3", "shf": r"SHF"}  # fmt: skip


@dataclass(slots=True)
class CompileReport:
    variant: str
    tile_n: int
    stages: int
    warps: int
    registers: int | None
    spill_store_bytes: int | None
    spill_load_bytes: int | None
    shared_bytes: int
    sass_total: int
    sass: dict  # COUNTED name -> count over the whole kernel
    main_loop_total: int  # instructions of the first KV loop (the unmasked tiles)
    main_loop: dict  # COUNTED name -> count in that loop
    compile_s: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for fp8_compile.json/.md")
    p.add_argument("--fp8-variants", default=",".join(FP8_CONVERTS), help="comma-separated")
    p.add_argument("--points", default=DEFAULT_POINTS,
                   help="tile_n,stages,warps triples, flattened: '128,3,4,256,3,4'")
    p.add_argument("--budget-s", type=float, default=600.0, help="start no compilation past this")
    args = p.parse_args(argv)
    variants = [v for v in args.fp8_variants.split(",") if v]
    if not variants or any(v not in FP8_CONVERTS for v in variants):
        p.error(f"--fp8-variants: each of {', '.join(variants) or '(none)'} must be one of "
                f"{', '.join(FP8_CONVERTS)}")  # fmt: skip
    nums = [int(x) for x in args.points.split(",") if x.strip().isdigit()]
    if len(nums) != len(args.points.split(",")) or not nums or len(nums) % 3:
        p.error(f"--points: want integer triples tile_n,stages,warps; got {args.points!r}")
    args.variants = variants
    args.point_list = [tuple(nums[i : i + 3]) for i in range(0, len(nums), 3)]
    return args


def signature(variant: str, tile_n: int) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) of the decode launch of an fp8 cache."""
    constexprs = {"NUM_QUERIES_PER_KV": QUERIES_PER_KV, "BLOCK_M": 16, "BLOCK_Q": 16 // QUERIES_PER_KV,
                  "HEAD_DIM": HEAD_DIM, "HEAD_DIM_PAD": HEAD_DIM, "BLOCK_SIZE": BLOCK_SIZE,
                  "TILE_N": tile_n, "IS_SPLIT": False, "DOT_PRECISION": "tf32", "KV_FP8": True,
                  "FP8_CONVERT": variant, "stride_k_scale": 1, "stride_v_scale": 1,
                  "SEQ_KIND": 0, "DECODE_MAX_Q": 4, "USE_WORK": False}  # fmt: skip
    names = _paged_attention_kernel.arg_names
    sig = {n: "constexpr" if n in constexprs else ("*bf16" if n.endswith("_ptr") else "i32") for n in names}
    sig.update({n: "*i32" for n in ("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr", "work_ptr",
                                    "num_work_ptr")})
    sig.update({n: "*fp32" for n in ("segm_out_ptr", "segm_lse_ptr", "k_scale_ptr", "v_scale_ptr")})
    sig.update({"k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv", "qk_scale": "fp32"})
    unaligned = {"num_seqs", "num_splits", "min_tiles_per_split"}  # run-time values
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items()
             if t not in ("constexpr", "fp32") and n not in unaligned}  # fmt: skip
    return sig, constexprs, attrs


def sass_lines(sass: str) -> list[tuple[int, str]]:
    """(address, instruction) of every SASS instruction, and the labels as (-1, name)."""
    out = []
    for line in sass.splitlines():
        if m := re.match(r"^\.(L_x_\d+):", line):
            out.append((-1, m.group(1)))
        elif m := re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line):
            out.append((int(m.group(1), 16), re.sub(r"^@!?U?P\w+\s+", "", m.group(2))))
    return out


def main_loop(lines: list[tuple[int, str]]) -> list[str]:
    """The body of the first loop (backward branch) with tensor-core ops: the unmasked KV loop."""
    labels, pending = {}, []
    for addr, text in lines:
        if addr < 0:
            pending.append(text)
        else:
            labels.update({name: addr for name in pending})
            pending = []
    loops = [(labels[m.group(1)], addr) for addr, text in lines if addr >= 0
             and (m := re.search(r"BRA\s+`?\(?\.?(L_x_\d+)", text)) and labels.get(m.group(1), addr) < addr]  # fmt: skip
    for lo, hi in sorted(loops):
        body = [text for addr, text in lines if lo <= addr <= hi]
        if any(text.startswith("HMMA") for text in body):
            return body
    return []


def counts(instrs: list[str]) -> dict:
    ops = Counter(text.split()[0] for text in instrs if text)
    return {name: sum(n for op, n in ops.items() if re.match(pat, op)) for name, pat in COUNTED.items()}


def compile_point(variant: str, tile_n: int, stages: int, warps: int) -> CompileReport:
    t = time.time()
    kernel = triton.compile(ASTSource(_paged_attention_kernel, *signature(variant, tile_n)),
                            target=TARGET, options={"num_warps": warps, "num_stages": stages})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        ptx.write_text(kernel.asm["ptx"])
        report = subprocess.run([str(BIN / "ptxas"), "-v", "--gpu-name=sm_90a", str(ptx), "-o", str(cubin)],
                                capture_output=True, text=True, check=True).stderr  # fmt: skip
        sass = subprocess.run([str(BIN / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
    number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, report)) else None
    lines = sass_lines(sass)
    instrs = [text for addr, text in lines if addr >= 0]
    loop = main_loop(lines)
    return CompileReport(variant, tile_n, stages, warps, number(r"Used (\d+) registers"),
                         number(r"(\d+) bytes spill stores"), number(r"(\d+) bytes spill loads"),
                         kernel.metadata.shared, len(instrs), counts(instrs), len(loop), counts(loop),
                         round(time.time() - t, 1))  # fmt: skip


def markdown(rows: list[CompileReport]) -> str:
    lines = ["# FP8 decode variants compiled for sm90 (Triton + ptxas, no GPU)", "",
             "Main loop = the unmasked KV loop's instructions (per tile of K and V).", "",
             ("| variant | tile_n, stages, warps | regs | spills B | smem B | SASS | loop | loop LDS.U8 | "
              "loop LDS | loop LDSM | loop STS | loop F2FP | loop HMMA |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        m = r.main_loop
        lines.append(f"| {r.variant} | {r.tile_n}, {r.stages}, {r.warps} | {r.registers} | "
                     f"{r.spill_store_bytes} | {r.shared_bytes} | {r.sass_total} | {r.main_loop_total} | "
                     f"{m['lds_u8']} | {m['lds']} | {m['ldsm']} | {m['sts']} | {m['f2fp']} | {m['hmma']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    t0 = time.time()
    rows = []
    for tile_n, stages, warps in args.point_list:
        for variant in args.variants:
            if time.time() - t0 > args.budget_s:
                print(f"out of time budget before {variant} {tile_n},{stages},{warps}", flush=True)
                break
            rows.append(compile_point(variant, tile_n, stages, warps))
            r = rows[-1]
            print(f"{variant:>6} tile {tile_n} stages {stages} warps {warps}: {r.registers} regs, "
                  f"spills {r.spill_store_bytes} B, loop {r.main_loop_total} instrs {r.main_loop}", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fp8_compile.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    (args.out / "fp8_compile.md").write_text(markdown(rows))


if __name__ == "__main__":
    main()
