#!/usr/bin/env python3
"""Does a hand-written warp-specialised GEMM (Gluon, Hopper) run on this stack, and how fast against cuBLAS
and a Triton persistent GEMM of the same tile? Run 15's automatic specialisation hung, so each case here runs
in its own process under a time limit.

    python3 benchmarks/kernels/gluon_ws_probe.py --out DIR [--limit-s 60]
    python3 benchmarks/kernels/gluon_ws_probe.py --compile-only     # sm90 compile, no GPU

The kernel: a persistent C = A B^T in bf16, 128 x 256 tiles, K steps of 64 through a ring of STAGES shared
buffers; a one-warp loader partition issues the TMA loads (ready / empty mbarriers per stage), the default
partition's two warpgroups issue the wgmmas (64 rows each) and store the tile. Writes DIR/gluon_ws_probe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

BM, BN, BK = 128, 256, 64
SHAPES = {"square": (8192, 8192, 8192), "gate_up": (40960, 1536, 2048)}  # M, N, K (gate+up: P rows x 2N x H)


@gluon.jit
def _loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, STAGES: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    tiles_n = gl.cdiv(N, BLOCK_N)
    it = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * tiles_n, gl.num_programs(0)):
        off_m = (tile // tiles_n) * BLOCK_M
        off_n = (tile % tiles_n) * BLOCK_N
        for k in range(0, K, BLOCK_K):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [off_m, k], ready.index(s), a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [off_n, k], ready.index(s), b_bufs.index(s))
            it += 1


@gluon.jit
def _mma(a_bufs, b_bufs, ready, empty, c_ptr, M, N, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
         BLOCK_K: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BLOCK_N, 16])
    tiles_n = gl.cdiv(N, BLOCK_N)
    it = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * tiles_n, gl.num_programs(0)):
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
        for k in range(0, K, BLOCK_K):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            # the wgmma before this one is done: its stage goes back to the loader
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), count=1, pred=k > 0)
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), count=1)
        rows = (tile // tiles_n) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        cols = (tile % tiles_n) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        gl.store(c_ptr + rows[:, None].to(gl.int64) * N + cols[None, :], acc.to(gl.bfloat16))


@gluon.jit
def ws_gemm_kernel(a_desc, b_desc, c_ptr, M, N, K, STAGES: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([(_mma, (a_bufs, b_bufs, ready, empty, c_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, STAGES,
                                num_warps)),
                        (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, STAGES))], [1], [24])


@triton.jit
def tl_gemm_kernel(a_desc, b_desc, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """The same GEMM as a Triton persistent kernel (one flattened loop): the software-pipelined baseline."""
    tiles_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tiles_n, tl.num_programs(0), flatten=True):
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            acc = tl.dot(a_desc.load([(tile // tiles_n) * BLOCK_M, k]),
                         tl.trans(b_desc.load([(tile % tiles_n) * BLOCK_N, k])), acc)
        rows = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(c_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], acc.to(tl.bfloat16))


def _gluon_descs(a, b):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    la = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    lb = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    return TensorDescriptor.from_tensor(a, [BM, BK], la), TensorDescriptor.from_tensor(b, [BN, BK], lb)


def _case(name: str, shape: str) -> dict:
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, n, k = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, k, generator=g, device="cuda").to(torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if name == "cublas":
        def run():
            torch.mm(a, b.t(), out=c)
    elif name == "triton":
        da, db = TensorDescriptor.from_tensor(a, [BM, BK]), TensorDescriptor.from_tensor(b, [BN, BK])

        def run():
            tl_gemm_kernel[(sms,)](da, db, c, m, n, k, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, num_warps=8, num_stages=4)
    else:
        da, db = _gluon_descs(a, b)
        stages = int(name.split("-s")[1])

        def run():
            ws_gemm_kernel[(sms,)](da, db, c, m, n, k, STAGES=stages, num_warps=8, maxnreg=168)
    run()
    torch.cuda.synchronize()
    ref = a.float() @ b.float().t()
    err = ((c.float() - ref).norm() / ref.norm()).item()
    times = []
    for _ in range(7):
        s, f = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(5):
            run()
        f.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(f) * 1e3 / 5)
    us = sorted(times)[3]
    return {"case": name, "shape": shape, "rel_err": err, "us": us, "tflops": 2 * m * n * k / us / 1e6}


def compile_only() -> None:
    """sm90 compile of the Gluon kernel (no GPU): partitions, registers, shared memory."""
    os.environ.pop("TRITON_INTERPRET", None)
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    la = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    lb = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    sig = {"a_desc": f"tensordesc<bf16[{BM}, {BK}],{la!r}>", "b_desc": f"tensordesc<bf16[{BN}, {BK}],{lb!r}>",
           "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "STAGES": "constexpr", "num_warps": "constexpr"}
    k = triton.compile(GluonASTSource(ws_gemm_kernel, sig, {"STAGES": 4, "num_warps": 8}),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "maxnreg": 168})
    print("shared", k.metadata.shared, "warps", k.metadata.num_warps, "setmaxnreg" in k.asm["ptx"],
          sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", k.asm["ptx"]))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--limit-s", type=float, default=60)
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--case", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.compile_only:
        compile_only()
        return
    if args.case:
        print(json.dumps(_case(*args.case)), flush=True)
        return
    rows, hung = [], False
    for shape in SHAPES:
        for name in ("cublas", "triton", "gluon-ws-s4", "gluon-ws-s3"):
            if hung and name.startswith("gluon"):  # one hang is the answer: no more device time on it
                rows.append({"case": name, "shape": shape, "skipped": "an earlier Gluon case hung"})
                continue
            t0 = time.time()
            try:
                r = subprocess.run([sys.executable, __file__, "--case", name, shape], capture_output=True, text=True,
                                   timeout=args.limit_s, check=False)
                lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
                row = json.loads(lines[-1]) if lines else {"case": name, "shape": shape, "error": r.stderr[-1500:]}
            except subprocess.TimeoutExpired:
                row, hung = {"case": name, "shape": shape, "hung": True}, True
            row["wall_s"] = round(time.time() - t0, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gluon_ws_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
