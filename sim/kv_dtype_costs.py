"""What a quantised KV cache does to attention time: measured kernel ratios, not the byte ratio.

Halving the KV bytes halves a memory-bound kernel's time only if the kernel converts the elements
as fast as HBM delivers them. On the H200 it does not: costline's fp8 (e4m3) decode kernel moves
2.4-2.8 TB/s of fp8 bytes where the bf16 kernel moves 4.1, and FlashInfer 0.6.4's fp8 decode is
within 4% of it at 64 x 4096 (229 vs 220 us), so fp8 decode attention takes 0.85x the bf16 time,
not 0.5x. Prefill attention, which converts each K/V tile once per query tile, takes 1.42x.

The simulator prices attention with these ratios against the 16-bit cache's time (`Roofline.of`);
the capacity gain (twice the KV blocks in the same memory) comes from the bytes and is kept whole
(sim/memory.py), as is the KV a disaggregated transfer moves.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KvDtypeCost:
    """Attention kernel time with a KV cache dtype over the time with the model's 16-bit cache,
    for the same batch and contexts."""

    decode_time_ratio: float  # decode attention (KV-read bound)
    prefill_time_ratio: float  # prefill attention (FLOP bound), the new tokens read from the cache
    source: str
    byte_ratio: float = 1.0  # the dtype's bytes per element over 16-bit's

    @property
    def decode_per_byte(self) -> float:
        """Decode attention's time per KV byte over the 16-bit cache's: what multiplies the
        dtype's own bytes / bandwidth (1 / 0.5 x 0.845 = 1.69 for fp8 on the H200)."""
        return self.decode_time_ratio / self.byte_ratio


SIXTEEN_BIT = KvDtypeCost(1.0, 1.0, "16-bit cache: the reference")

# H200, torch 2.11, Triton 3.6, graph replays, L2 flushed (benchmarks/kernels):
# decode: run 6 (data/run6/fp8_words.json), the shipped `words` config (tile 128, 2 stages, 4
#   warps) at 64 x 4096 (Llama-3.1-8B layer: 32 q / 8 KV heads, D 128): 220.3 us vs bf16 260.8 us.
#   Other shapes of the same run: 32 x 32768 768.7 / 998.5 = 0.770, 8 x 4096 44.7 / 44.9 = 0.996
#   (launch-bound; there the fitted profiles' small-batch terms dominate anyway).
# prefill: run 4 (results.md, "FP8 (e4m3) KV cache vs bf16"): 8 x 2048 new tokens 1168.5 / 840.5 us
#   = 1.390, with 4096 cached 5200.8 / 3596.1 = 1.446; the geometric mean.
H200_FP8 = KvDtypeCost(
    decode_time_ratio=220.3 / 260.8,
    prefill_time_ratio=(1168.5 / 840.5 * 5200.8 / 3596.1) ** 0.5,
    source="measured on the H200: decode 64x4096 220.3 vs 260.8 us (benchmarks/kernels run 6), "
           "prefill 8x2048 (+0, +4096 cached) 1.39x / 1.45x (run 4)",
    byte_ratio=0.5,
)
MEASURED_FP8: dict[str, KvDtypeCost] = {"h200": H200_FP8}
FP8_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")


def kv_dtype_cost(kv_cache_dtype: str, gpu: str) -> KvDtypeCost:
    """The attention time ratios of `kv_cache_dtype` (vLLM's `--kv-cache-dtype`) on `gpu`.

    16-bit caches ("auto", "bfloat16", "float16") are the reference. FP8 takes the GPU's own
    measurement where one exists, else the H200's: the other GPUs have no measurement, and the
    conversion cost is the SMs' work, which the H200 shares with the H100 (the same SMs, less
    bandwidth: there fp8 would gain a little more) and which older GPUs do no faster. e5m2 is
    priced as e4m3 (its conversion is cheaper, but no kernel here stores it)."""
    if kv_cache_dtype not in FP8_DTYPES:
        return SIXTEEN_BIT
    own = MEASURED_FP8.get(gpu)
    if own is not None:
        return own
    return KvDtypeCost(H200_FP8.decode_time_ratio, H200_FP8.prefill_time_ratio,
                       f"not measured on {gpu}: the H200's ratios ({H200_FP8.source})", H200_FP8.byte_ratio)


__all__ = ["FP8_DTYPES", "H200_FP8", "MEASURED_FP8", "SIXTEEN_BIT", "KvDtypeCost", "kv_dtype_cost"]
