"""A Triton GEMM for the decode step's small batches: ``y = x @ W^T``, x [M, K], W [N, K].

At decode M (the batch) is 1..256 while N and K are thousands, so the product is bound by
reading W once: every program streams one [BLOCK_N, K] band of W (or one K-slice of it) and
multiplies it with all rows of its [BLOCK_M] block of x, accumulating in fp32. Where the N
bands alone cannot fill the GPU (a 4096-wide o_proj gives 64 bands of 64 for 132 SMs), K is
split: each split writes its fp32 partial sum into a workspace and a second kernel adds the
splits in a fixed order, so the result is the same on every run (no atomics) and both launches
are graph-capturable.

Launch parameters come from ``skinny_gemm_configs.json`` (written by
benchmarks/kernels/bench_gemm.py from the GPU's measurements), keyed by (M bucket, N, K); a
shape not in the table gets ``default_config``. ``linear`` sends M above the table's
``max_m`` to torch's BLAS (``kernels.reference.linear_ref``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import torch
import triton
import triton.language as tl

from kernels.reference import linear_ref

CONFIG_PATH = Path(__file__).with_name("skinny_gemm_configs.json")
NUM_SMS_DEFAULT = 132  # H100/H200; the default split-K aims to fill this many SMs
DEFAULT_MAX_M = 64  # above this the default table sends the GEMM to F.linear
M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True, slots=True)
class GemmConfig:
    """One launch: tile sizes, K splits and Triton's warps/pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"GemmConfig.{name}={v}: needs a power of two >= 16")
        if self.split_k < 1:
            raise ValueError(f"GemmConfig.split_k={self.split_k}: needs >= 1")


def m_bucket(m: int) -> int:
    """The smallest bucket of ``M_BUCKETS`` holding ``m`` rows (the last one beyond it)."""
    return next((b for b in M_BUCKETS if m <= b), M_BUCKETS[-1])


def config_key(m: int, n: int, k: int) -> str:
    return f"{m_bucket(m)},{n},{k}"


def default_config(m: int, n: int, k: int, num_sms: int = NUM_SMS_DEFAULT) -> GemmConfig:
    """Tiles for a shape nobody measured: 64-wide N bands, K split until ~2 programs per SM,
    each split keeping at least 4 K tiles so the reduction stays small next to the stream."""
    block_m = min(max(triton.next_power_of_2(m), 16), 64)
    block_n, block_k = 64, 128
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    k_tiles = triton.cdiv(k, block_k)
    split_k = 1
    while tiles * split_k < 2 * num_sms and k_tiles // (split_k * 2) >= 4:
        split_k *= 2
    return GemmConfig(block_m, block_n, block_k, split_k)


@dataclass(frozen=True, slots=True)
class ConfigTable:
    """Measured best configs by ``config_key`` and the largest M the Triton path takes."""

    max_m: int
    configs: dict[str, GemmConfig]

    def lookup(self, m: int, n: int, k: int) -> GemmConfig:
        return self.configs.get(config_key(m, n, k)) or default_config(m, n, k)

    def to_json(self) -> dict:
        return {"max_m": self.max_m, "configs": {k: asdict(c) for k, c in self.configs.items()}}

    @classmethod
    def from_json(cls, data: dict) -> ConfigTable:
        configs = {key: GemmConfig(**c) for key, c in data.get("configs", {}).items()}
        return cls(int(data.get("max_m", DEFAULT_MAX_M)), configs)


@lru_cache(maxsize=1)
def config_table() -> ConfigTable:
    """The table shipped next to this module, or an empty one (defaults) when there is none."""
    if not CONFIG_PATH.exists():
        return ConfigTable(DEFAULT_MAX_M, {})
    return ConfigTable.from_json(json.loads(CONFIG_PATH.read_text()))


@triton.jit
def _skinny_gemm_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K, k_per_split,
    stride_xm, stride_wn, stride_om, stride_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FP32_DOT: tl.constexpr, EVEN_K: tl.constexpr,
):
    # Program (n band, m block, k split); k_per_split is a multiple of BLOCK_K. EVEN_K: every
    # split ends on a whole tile, so the loads need no K mask (which would cost the compiler
    # its proof that a row of W is read in contiguous 16-byte vectors).
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        kk = k0 + rk
        if EVEN_K:
            x = tl.load(x_rows + kk[None, :], mask=rm[:, None] < M, other=0.0)
            w = tl.load(w_rows + kk[None, :], mask=rn[:, None] < N, other=0.0)
        else:
            x = tl.load(x_rows + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < k_end), other=0.0)
            w = tl.load(w_rows + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < k_end), other=0.0)
        if FP32_DOT:  # fp32 inputs: exact fp32 products, not TF32
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    dst = out_ptr + pid_k.to(tl.int64) * stride_split + rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _sum_splits_kernel(part_ptr, out_ptr, MN, N, stride_om, stride_split,
                       SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    # Adds the fp32 partials of the K splits in split order (deterministic), rounds once.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + s * stride_split + offs, mask=mask, other=0.0)
    row, col = offs // N, offs % N
    tl.store(out_ptr + row * stride_om + col, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _check_operands(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"skinny_gemm: need x [M, K] and weight [N, K]; got {tuple(x.shape)} "
                         f"and {tuple(weight.shape)}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("skinny_gemm: x and weight need a contiguous last dimension")
    if out is not None and (out.shape != (x.shape[0], weight.shape[0]) or out.stride(1) != 1):
        raise ValueError(f"skinny_gemm: out must be [M, N] = [{x.shape[0]}, {weight.shape[0]}] "
                         f"with a contiguous last dimension; got {tuple(out.shape)}")


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None,
                config: GemmConfig | None = None) -> torch.Tensor:
    """``x @ weight.T`` (x [M, K], weight [N, K], same dtype) in x's dtype, accumulated in fp32.

    ``config`` overrides the table (the benchmark's sweep). Graph-capturable: the split-K
    workspace comes from torch's caching allocator, which a capture gives a private pool.
    """
    _check_operands(x, weight, out)
    (m, k), n = x.shape, weight.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    cfg = config or config_table().lookup(m, n, k)
    k_tiles = triton.cdiv(k, cfg.block_k)
    split_k = min(cfg.split_k, k_tiles)
    k_per_split = triton.cdiv(k_tiles, split_k) * cfg.block_k
    split_k = triton.cdiv(k, k_per_split)  # no empty splits
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), split_k)
    fp32, even_k = x.dtype == torch.float32, k % k_per_split == 0
    if split_k == 1:
        _skinny_gemm_kernel[grid](x, weight, out, m, n, k, k_per_split, x.stride(0),
                                  weight.stride(0), out.stride(0), 0, cfg.block_m, cfg.block_n,
                                  cfg.block_k, fp32, even_k, num_warps=cfg.num_warps,
                                  num_stages=cfg.num_stages)
        return out
    part = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
    _skinny_gemm_kernel[grid](x, weight, part, m, n, k, k_per_split, x.stride(0), weight.stride(0),
                              n, m * n, cfg.block_m, cfg.block_n, cfg.block_k, fp32, even_k,
                              num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    block = 1024
    _sum_splits_kernel[(triton.cdiv(m * n, block),)](part, out, m * n, n, out.stride(0), m * n,
                                                    split_k, block, num_warps=4)
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for x [..., K] (``out``: 2-D x only): the skinny kernel when
    the rows number at most the table's ``max_m``, torch's BLAS above (prefill chunks, large
    batches)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] > config_table().max_m or x2.stride(-1) != 1:
        return linear_ref(x, weight, bias, out)
    y = skinny_gemm(x2, weight, out)
    if bias is not None:  # Qwen2's q/k/v bias: a rare case, not worth a fused epilogue
        y += bias
    return y if out is not None else y.reshape(*x.shape[:-1], weight.shape[0])
