"""Named fused-MoE plans for qwen3-30b-a3b's layer shape (H 2048, N 768, E 128, top 8) on the H200.

- `RUN3_BEST`: each step size's fastest plan of run 3 (benchmarks/kernels/data/moe_run3/moe.md),
  the baseline run 4 times side by side with the new candidates.
- `run4_candidates(T, k, E)`: run 4's new plans at T (the "hist" grouping and the Triton k-sum for
  the grouped path, new tiles for the prefill GEMMs, direct-path variants for decode: evict-first
  weight loads, an early programmatic dependent launch with an L2 prefetch of the down weights,
  the down launch's own warps and a narrower down tile, FMA loops pipelined through shared memory).
- `PREFILL_RUN5`: run 5's prefill plans, timed against run 4's best (`run4_best`): the activations in
  sorted order with a TMA-fed (and persistent) down launch, the k-sum as the down epilogue's atomics,
  and gate+up stage / K-step variants.
- `run6_candidates(T, k, E)`: run 6's plans, one step from run 5's winners (`run5_best`).

Plans measured and lost were removed from the tree with the code only they reached (run 5's one-launch
decode path, run 7's half tiles, run 8's chained down and tail lists, run 9's one-step variants, run 10's
pipelined down loop, runs 13-15's prefill launches): benchmarks/kernels/MOE.md, "Removed after
measurement". Their keys in the committed data (benchmarks/kernels/data/) are not known plans here:
`propose_rule` skips them.

- `run16_candidates(T, k, E)`: two programs a SM for each prefill launch (run 16); the down launch's won.
- `engine_tiles(T, k, E)`: what the engine runs (kernels.backend's Triton `fused_moe` is
  `engine_fused_moe`): the measured rule (`RUN22_BEST`) with 32 or more experts, run 2's tiles with fewer.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kernels.fused_moe import MoeTiles, fused_moe, run2_tiles
from kernels.moe_direct import DirectTiles

# run 3's fastest plan per T on qwen3-30b-a3b (us in moe_run3/moe.md: 27.5, 49.3, 81.0, 134.3, ...)
_R3_DIRECT = DirectTiles(16, 256, 8, 128, 4, pdl=True)
_R3_SMALL = MoeTiles(16, 32, 128, 4, 4, atomic_sum=True)
_R3_BIG = MoeTiles(128, 128, 64, 8, 3, tma=True)
RUN3_BEST: dict[int, MoeTiles | DirectTiles] = {
    1: _R3_DIRECT, 2: DirectTiles(32, 128, 16, 64, 4), 4: _R3_DIRECT, 8: _R3_SMALL, 16: _R3_SMALL, 32: _R3_SMALL,
    64: _R3_SMALL, 128: MoeTiles(16, 64, 128, 4, 4, atomic_sum=True), 256: MoeTiles(32, 64, 128, 4, 3, atomic_sum=True),
    1024: _R3_BIG,
    4096: dataclasses.replace(_R3_BIG, down_block_n=256, down_block_k=64, down_num_warps=8, down_num_stages=3),
}


def plan_key(t: MoeTiles | DirectTiles) -> str:
    """A plan's name in the benchmark's tables (run 3's names unchanged; run 4's fields appended)."""
    if isinstance(t, DirectTiles):
        return (f"direct n{t.block_n}k{t.block_k}/n{t.down_block_n}k{t.down_block_k}w{t.num_warps}s{t.num_stages}"
                f"{'dot' if t.use_dot else ''}{'pdl' if t.pdl else ''}"
                f"{f'dw{t.down_num_warps}' if t.down_num_warps else ''}{'evict' if t.evict else ''}"
                f"{'early' if t.early else ''}{'pipe' if t.pipeline else ''}{'wide' if t.down_wide else ''}{' upwide' if t.up_wide else ''}")
    key = f"m{t.block_m}n{t.block_n}k{t.block_k}w{t.num_warps}s{t.num_stages}g{t.group_m}" + ("tma" if t.tma else "")
    if t.down_block_n or t.down_block_k:
        key += f"/down n{t.down_block_n}k{t.down_block_k}w{t.down_num_warps}s{t.down_num_stages}"
    key += "atomic" if t.atomic_sum else ""
    key += " joint" if t.joint and t.tma else ""
    key += (" sorted" + (f" persist{t.persistent}" if t.persistent else "")) if t.sorted_act else ""
    key += f" upersist{t.up_persistent}" if t.up_persistent and t.joint and t.tma else ""
    key += "" if t.align in ("blocks", "legacy") else f" {t.align}"
    return key + (" ksum-triton" if t.ksum == "triton" and not t.atomic_sum else "")


def run3_best(num_tokens: int) -> MoeTiles | DirectTiles:
    """Run 3's best plan at the measured T nearest below `num_tokens` (T=1's below 1)."""
    known = [t for t in sorted(RUN3_BEST) if t <= num_tokens] or [1]
    return RUN3_BEST[known[-1]]


# decode: the direct path's new variants (sm90 compile, benchmarks/kernels/moe_compile.py: run 3's
# n8k128 down tile takes 156 registers a thread at 4 warps, 97 at 8)
_D = DirectTiles(16, 256, 8, 128, 4, pdl=True, down_num_warps=8)
DIRECT_RUN4 = [
    _D,
    dataclasses.replace(_D, early=True),
    dataclasses.replace(_D, early=True, evict=True),
    DirectTiles(16, 256, 4, 128, 4, pdl=True),
    # pipelined FMA loops (cp.async; sm90 compile: no spills, 17-66 KB shared)
    dataclasses.replace(_D, pipeline=True),
    dataclasses.replace(_D, pipeline=True, early=True),
    DirectTiles(8, 256, 8, 128, 4, 3, pdl=True, early=True, down_num_warps=8, pipeline=True),
    DirectTiles(16, 128, 8, 64, 4, 4, pdl=True, early=True, down_num_warps=8, pipeline=True),
    DirectTiles(32, 128, 16, 64, 4, 3, pdl=True, early=True, down_num_warps=8, pipeline=True),
]
DIRECT_RUN4_MAX_PAIRS = 64

# prefill: gate+up / down tiles, a joint gate+up dot (sm90 compile, no spills: 128x128x32 s5 174 registers against
# 217 at x64 s3; down 128x128x64 w8 s4 118 registers). Kept to 9 (each a compile of ~2-4 s in a 150 s run).
_DOWN256 = {"down_block_n": 256, "down_block_k": 64, "down_num_warps": 8, "down_num_stages": 3}
_H = {"align": "hist", "ksum": "triton"}
PREFILL_RUN4 = [
    dataclasses.replace(_R3_BIG, align="hist", **_DOWN256),
    dataclasses.replace(_R3_BIG, **_H, **_DOWN256),
    MoeTiles(128, 128, 32, 8, 5, tma=True, **_H, **_DOWN256),
    MoeTiles(128, 128, 64, 8, 4, tma=True, **_H, **_DOWN256),
    MoeTiles(128, 128, 64, 8, 3, tma=True, **_H, down_block_n=128, down_block_k=64, down_num_warps=8,
             down_num_stages=4),
    MoeTiles(128, 128, 64, 8, 3, tma=True, **_H, down_block_n=256, down_block_k=32, down_num_warps=8,
             down_num_stages=5),
    # gate+up as one dot of 2 * BLOCK_N columns (sm90: m64n256k16 wgmma, 174 registers, no spills)
    MoeTiles(128, 128, 64, 8, 3, tma=True, joint=True, **_H, **_DOWN256),
    MoeTiles(128, 128, 64, 8, 4, tma=True, joint=True, **_H, **_DOWN256),
    MoeTiles(128, 64, 64, 4, 4, tma=True, joint=True, **_H, **_DOWN256),
]


def run4_candidates(num_tokens: int, top_k: int, num_experts: int) -> list[MoeTiles | DirectTiles]:
    """The new plans timed at T: direct variants up to DIRECT_RUN4_MAX_PAIRS pairs, run 3's best
    grouped plan with the "hist" grouping (and the Triton k-sum where it has no atomic sum), the
    prefill tiles from 64 rows per expert."""
    pairs = num_tokens * top_k
    out: list[MoeTiles | DirectTiles] = list(DIRECT_RUN4) if pairs <= DIRECT_RUN4_MAX_PAIRS else []
    base = run3_best(num_tokens)
    if isinstance(base, MoeTiles):
        out.append(dataclasses.replace(base, align="hist"))
        if not base.atomic_sum:
            out.append(dataclasses.replace(base, align="hist", ksum="triton"))
    if pairs / num_experts >= 64:
        out += PREFILL_RUN4
    return list({repr(p): p for p in out}.values())  # distinct, in order


def known_plans() -> dict[str, MoeTiles | DirectTiles]:
    """key -> plan of every plan named here (run 3's best, run 4's candidates at each of its T)."""
    plans = [*RUN3_BEST.values(), *DIRECT_RUN4, *PREFILL_RUN4, *PREFILL_RUN5, *DIRECT_RUN6,
             *PREFILL_RUN6, *RUN6_BEST.values(), *RUN12_BEST.values(), *RUN16_BEST.values()]
    for t in RUN3_BEST:
        plans += run4_candidates(t, 8, 128) + run11_candidates(t, 8, 128) + run12_candidates(t, 8, 128)
    return {plan_key(p): p for p in plans}


def propose_rule(speed_rows: list[dict]) -> dict[int, MoeTiles | DirectTiles]:
    """T -> the fastest known plan measured at T, from the benchmark's moe.json "speed" rows of one
    preset (each row's `fused_by_tiles`: plan key -> us); plans this module does not name are skipped (among
    them the keys of the runs removed after measurement: benchmarks/kernels/MOE.md)."""
    known = known_plans()
    out = {}
    for row in speed_rows:
        timed = {key: us for key, us in row.get("fused_by_tiles", {}).items() if key in known and us is not None}
        if timed:
            out[row["T"]] = known[min(timed, key=timed.get)]
    return dict(sorted(out.items()))


def rule_tiles(num_tokens: int, rule: dict[int, MoeTiles | DirectTiles]) -> MoeTiles | DirectTiles:
    """The plan of the measured T nearest `num_tokens` in log2 (a tie: the smaller T)."""
    x = math.log2(max(num_tokens, 1))
    return rule[min(rule, key=lambda t: (abs(math.log2(t) - x), t))]


# The proposed rule for E >= 32 (qwen3-30b-a3b: 128 experts, top 8): each measured T's fastest plan,
# `{**RUN3_BEST, **propose_rule(rows)}` of run 4 (benchmarks/kernels/data/moe_run4/moe.json, H200,
# 2026-12-03 08:45 UTC): T = 1 23.9 us, 2 42.5, 4 77.7, 8 132.4, 1024 370.7, 4096 722.8; T = 16-256
# were not timed in run 4 and keep run 3's plans.
_PREFILL_BEST = MoeTiles(128, 128, 64, 8, 4, tma=True, joint=True, **_H, **_DOWN256)
PROPOSED_RULE: dict[int, MoeTiles | DirectTiles] = {
    **RUN3_BEST,
    1: DirectTiles(8, 256, 8, 128, 4, 3, pdl=True, early=True, down_num_warps=8, pipeline=True),
    2: dataclasses.replace(_D, pipeline=True),
    4: dataclasses.replace(_D, pipeline=True),
    8: dataclasses.replace(_R3_SMALL, align="hist"),
    1024: _PREFILL_BEST,
    4096: _PREFILL_BEST,
}


def run4_best(num_tokens: int) -> MoeTiles | DirectTiles:
    """Run 4's fastest plan at the measured T nearest `num_tokens` (PROPOSED_RULE): run 5's baseline."""
    return rule_tiles(num_tokens, PROPOSED_RULE)


# ------------------------------------------------------------------------------- run 5
# prefill: run 4's best, then one change each. Its 128-row blocks pad each expert's run: at T = 4096 (256
# +- 16 rows an expert) the GEMMs compute 1.25x the real rows, 64-row blocks 1.12x (T = 1024: 2.0x and
# 1.47x; uniform top 8 of 128, 5 draws). sm90 compile, none spill: down on sorted activations n256k64 s3
# 180 registers (one tile a program), persistent with a flattened loop 182 / 176 KB shared (s3), 208 /
# 224 KB (s4), with atomics (not flattened) 253 / 144 KB; joint gate+up k32 s6 172 / 144 KB; 64-row
# blocks: gate+up 8 warps s4 110 / 160 KB (2 x m64n128 wgmma), 4 warps s3 168 / 120 KB (m64n256),
# down n256 8 warps s4 flattened 120 / 176 KB.
_P = _PREFILL_BEST
_SP = {"sorted_act": True, "persistent": 1}
PREFILL_RUN5 = [
    dataclasses.replace(_P, sorted_act=True),  # down's activation tiles through TMA, one tile a program
    dataclasses.replace(_P, **_SP),  # + a persistent down grid over the used blocks only
    dataclasses.replace(_P, **_SP, down_num_stages=4),
    dataclasses.replace(_P, **_SP, atomic_sum=True),  # the k-sum as float32 atomics in the down epilogue
    dataclasses.replace(_P, **_SP, down_block_n=128, down_num_stages=4),
    dataclasses.replace(_P, block_k=32, num_stages=6),  # gate+up: half the K step, deeper pipeline
    dataclasses.replace(_P, group_m=16),  # 16 blocks sweep the N tiles together
    dataclasses.replace(_P, block_k=32, num_stages=6, **_SP),
    # gate+up persistent too (flattened loop; sm90: 255 registers, no spill, 224 KB shared at s4)
    dataclasses.replace(_P, **_SP, up_persistent=1),
    # 64-row blocks: half the padding rows
    MoeTiles(64, 128, 64, 8, 4, tma=True, joint=True, **_H, **_SP, down_block_n=256, down_block_k=64,
             down_num_warps=8, down_num_stages=4),
    MoeTiles(64, 128, 64, 4, 3, tma=True, joint=True, **_H, **_SP, down_block_n=256, down_block_k=64,
             down_num_warps=8, down_num_stages=3),
]


# ------------------------------------------------------------------------------- run 6
# Run 5 (benchmarks/kernels/data/moe_run5, H200 2026-12-03 12:01 UTC): the sorted activations with a
# persistent TMA-fed down launch at down s4 won the prefill sizes (T = 4096 657.1 us, 471 TFLOP/s, 59.6% of
# 790; T = 1024 362.0 us) and the one-launch direct path lost decode (T = 1 32.2 us against run 4's 23.8:
# its down items spin on counters). Run 6 varies the two winners one step further: the persistent
# gate+up (10 us off at down s3 in run 5) on the s4 winner, and the run 4 direct plan's K steps, stages
# and warps (T = 1 is 1.32x its roofline, the target 1.3x).
_P5 = dataclasses.replace(_P, **_SP, down_num_stages=4)
RUN5_BEST: dict[int, MoeTiles | DirectTiles] = {**PROPOSED_RULE, 1024: _P5, 4096: _P5}
PREFILL_RUN6 = [
    dataclasses.replace(_P5, up_persistent=1),
    dataclasses.replace(_P5, up_persistent=1, num_stages=3),  # gate+up s3 frees shared memory for 2 a SM
    dataclasses.replace(_P5, up_persistent=1, group_m=16),
    dataclasses.replace(_P5, group_m=4),
]
_D4 = PROPOSED_RULE[1]
DIRECT_RUN6 = [
    dataclasses.replace(_D4, num_stages=4),
    dataclasses.replace(_D4, block_k=512),
    dataclasses.replace(_D4, block_k=512, num_stages=2),
    dataclasses.replace(_D4, down_block_k=256),
    dataclasses.replace(_D4, down_block_n=16),
    dataclasses.replace(_D4, evict=True),
    dataclasses.replace(_D4, num_warps=8),
    dataclasses.replace(_D4, block_n=4),
]
DIRECT_RUN6_MAX_PAIRS = 16


def run5_best(num_tokens: int) -> MoeTiles | DirectTiles:
    """Run 5's fastest plan at the measured T nearest `num_tokens` (RUN5_BEST): run 6's baseline."""
    return rule_tiles(num_tokens, RUN5_BEST)


def run6_candidates(num_tokens: int, top_k: int, num_experts: int) -> list[MoeTiles | DirectTiles]:
    """Run 6's new plans at T: the direct variants up to DIRECT_RUN6_MAX_PAIRS pairs, the prefill
    variants from 64 rows per expert."""
    pairs = num_tokens * top_k
    out: list[MoeTiles | DirectTiles] = list(DIRECT_RUN6) if pairs <= DIRECT_RUN6_MAX_PAIRS else []
    if pairs / num_experts >= 64:
        out += PREFILL_RUN6
    return out


# ------------------------------------------------------------------------------- what the engine runs
# Run 6 (benchmarks/kernels/data/moe_run6, H200 2026-12-03 12:09 UTC): the persistent gate+up on run 5's
# winner, T = 4096 653.4 us (473 TFLOP/s, 59.9% of 790), T = 1024 358.4 us; a 16-wide down tile at T = 1,
# 23.3 us (1.29x its roofline); T = 2 kept run 4's 42.6 us. T = 4-256 keep runs 3-4's measured plans.
_P6 = dataclasses.replace(_P5, up_persistent=1)
RUN6_BEST: dict[int, MoeTiles | DirectTiles] = {
    **RUN5_BEST, 1: dataclasses.replace(_D4, down_block_n=16), 1024: _P6, 4096: _P6}
ENGINE_RULE_MIN_EXPERTS = 32  # the rule was measured at top 8 of 128 (qwen3-30b-a3b)


def run6_best(num_tokens: int) -> MoeTiles | DirectTiles:
    """Run 6's fastest plan at the measured T nearest `num_tokens` (RUN6_BEST): run 7's baseline."""
    return rule_tiles(num_tokens, RUN6_BEST)


# ------------------------------------------------------------------------------- runs 7-10 (removed)
# None adopted; their plans and the code only they reached were removed after measurement (the figures and the
# commit where they last live: benchmarks/kernels/MOE.md, "Removed after measurement"):
# - run 7: each expert's last, part-filled 128-row block as a 64-row tile (a branch in the persistent loops):
#   T = 4096 668.9 us at best against run 6's 636.9;
# - run 8: the down projection chained onto gate+up for decode (T = 1 25.6 us at best against 24.0), and run 7's
#   half tiles as a second launch over a list of the half blocks (T = 4096 704.0-771.6 us against 650.6);
# - run 9: one-step tile variants of the engine's two plans (T = 4096 656.4-853.5 us against 642.7; T = 1
#   23.2-34.7 against 23.2);
# - run 10: the direct path's down loop pipelined through shared memory (T = 1 26.8-33.3 us against the plain
#   loop's 22.6).


# ------------------------------------------------------------------------------- run 11
# The direct path's down launch with its K loop unrolled over N (DirectTiles.down_wide), each on the engine's
# plan at T (gate+up unchanged). sm90 compile (ptxas -v, PREFETCH on), no spills: n16k128 8 warps 193
# registers (one program a SM, the engine's grid), n8k256 w8 117, n8k128 w8 130, n4k256 w8 73 (3 a SM), n4k256
# w4 133, n4k128 w4 112, n2k256 w4 96, n2k512 w4 102. In the SASS most of a program's weight loads come before
# its first multiply (n4k256 w8: 11 of 19); the plain loop's one K step at a time.
RUN11_DOWN = [
    {"down_block_n": 16, "down_block_k": 128, "down_num_warps": 8},
    {"down_block_n": 8, "down_block_k": 256, "down_num_warps": 8},
    {"down_block_n": 8, "down_block_k": 128, "down_num_warps": 8},
    {"down_block_n": 4, "down_block_k": 256, "down_num_warps": 8},
    {"down_block_n": 4, "down_block_k": 256, "down_num_warps": 4},
    {"down_block_n": 4, "down_block_k": 128, "down_num_warps": 4},
    {"down_block_n": 2, "down_block_k": 256, "down_num_warps": 4},
    {"down_block_n": 2, "down_block_k": 512, "down_num_warps": 4},
]


def run6_engine_tiles(num_tokens: int, top_k: int, num_experts: int) -> MoeTiles | DirectTiles:
    """The plan the engine ran before run 12's rule (RUN6_BEST with 32 or more experts, run 2's tiles with
    fewer): runs 11-12's baseline."""
    if num_experts < ENGINE_RULE_MIN_EXPERTS:
        return run2_tiles(num_tokens, top_k, num_experts)
    return rule_tiles(num_tokens, RUN6_BEST)


def run11_candidates(num_tokens: int, top_k: int, num_experts: int) -> list[MoeTiles | DirectTiles]:
    """Run 11's plans at T: the engine's plan then (run6_engine_tiles) with each RUN11_DOWN wide down launch,
    where that plan is a direct one (none otherwise)."""
    base = run6_engine_tiles(num_tokens, top_k, num_experts)
    if not isinstance(base, DirectTiles):
        return []
    return [dataclasses.replace(base, down_wide=True, **v) for v in RUN11_DOWN]


# ------------------------------------------------------------------------------- run 12
# Run 11 (benchmarks/kernels/data/moe_run11, H200 2026-12-03 23:48 UTC, 9 rounds, the engine's plan beside each):
# the wide down launch won at every T: T = 1 n8k256 8 warps 22.5 us against 23.3 (ratio 0.967; its down launch
# alone 10.5 us against 11.2), T = 2 n2k256 4 warps 39.7 against 42.4 (0.932), T = 4 the same tile 69.7 against
# 76.8 (0.907). Run 12 keeps each T's winner and unrolls gate+up's K loop too (DirectTiles.up_wide; sm90
# compile, no spills: n8k256 w4 79 registers, n4k256 w4 88, n4k512 w4 100, n2k512 w4 64, n16k256 w8 74, n4k256
# w2 79, n2k1024 w4 62; the engine's pipelined n8k256 80 registers and 17 KB of shared memory).
RUN11_BEST_DOWN = {1: {"down_block_n": 8, "down_block_k": 256, "down_num_warps": 8},
                   2: {"down_block_n": 2, "down_block_k": 256, "down_num_warps": 4},
                   4: {"down_block_n": 2, "down_block_k": 256, "down_num_warps": 4}}
RUN12_UP = [(8, 256, 4), (4, 256, 4), (4, 512, 4), (2, 512, 4), (16, 256, 8), (4, 256, 2), (2, 1024, 4)]


def run11_best(num_tokens: int, top_k: int, num_experts: int) -> MoeTiles | DirectTiles:
    """Run 11's baseline plan at T (run6_engine_tiles) with its winning wide down launch (the T of RUN11_BEST_DOWN
    nearest in log2)."""
    base = run6_engine_tiles(num_tokens, top_k, num_experts)
    if not isinstance(base, DirectTiles):
        return base
    return dataclasses.replace(base, down_wide=True, **rule_tiles(num_tokens, RUN11_BEST_DOWN))


def run12_candidates(num_tokens: int, top_k: int, num_experts: int) -> list[MoeTiles | DirectTiles]:
    """Run 12's plans at T: run 11's best, alone and with each RUN12_UP wide gate+up (block_n, block_k, warps),
    where run 11's baseline at T (run6_engine_tiles) is a direct plan (none otherwise)."""
    base = run11_best(num_tokens, top_k, num_experts)
    if not isinstance(base, DirectTiles):
        return []
    return [base, *(dataclasses.replace(base, up_wide=True, block_n=n, block_k=k, num_warps=w) for n, k, w in RUN12_UP)]


# Run 12 (benchmarks/kernels/data/moe_run12, H200 2026-12-03 23:53 UTC, 9 rounds): gate+up unrolled in two
# 1,024-wide K steps over 2-row tiles beside run 11's wide down won at every T, by ~1% over run 11's best
# (T = 1 22.1 us, 1.23x its roofline, against the run 6 plan's 23.1 in the same rounds: ratio 0.955; T = 2
# 38.6 against 41.8, 0.923; T = 4 68.1 against 76.3, 0.893). The other unrolled gate+up tiles lost (up to
# 1.13x the run 6 plan): the pipelined loop already streams at ~3.6 TB/s.
_UP12 = {"up_wide": True, "block_n": 2, "block_k": 1024, "num_warps": 4}
RUN12_BEST: dict[int, MoeTiles | DirectTiles] = {
    **RUN6_BEST, **{t: dataclasses.replace(run11_best(t, 8, 128), **_UP12) for t in (1, 2, 4)}}


# Run 16: two programs per SM, so one program's epilogue (SiLU and the activation store; the routing weight
# and the scatter of the down rows) runs while the other's MMAs go on, with no warp specialisation. A
# program then gets half an SM: a 128 x 128 accumulator (down n128, the joint gate+up n64), and shared memory
# and registers for two (sm90 compile, benchmarks/kernels/moe_compile.py's rows: down n128 w8 s2 112
# registers 98 KB, w4 s3 243 / 107 KB; gate+up n64 w8 s3 128 / 115 KB, w4 s3 255 / 107 KB: two a SM each,
# against one for the engine's 128 x 256 tiles). The cost: a third more shared-memory fill per MMA.
RUN16_DOWN = ({"down_block_n": 128, "down_num_warps": 8, "down_num_stages": 2, "persistent": 2},
              {"down_block_n": 128, "down_num_warps": 4, "down_num_stages": 3, "persistent": 2})
RUN16_UP = ({"block_n": 64, "num_warps": 8, "num_stages": 3, "up_persistent": 2},
            {"block_n": 64, "num_warps": 4, "num_stages": 3, "up_persistent": 2})


def _sorted_prefill(plan: MoeTiles | DirectTiles) -> bool:
    """Whether `plan` is the sorted persistent prefill plan (joint TMA gate+up, sorted activations, persistent
    down launch) that runs 16, 16b and 22 start from or compare against."""
    return isinstance(plan, MoeTiles) and plan.sorted_act and bool(plan.persistent) and plan.joint and plan.tma


def run16_candidates(num_tokens: int, top_k: int, num_experts: int) -> list[MoeTiles | DirectTiles]:
    """Run 16's plans at T: the engine's plan with each RUN16_DOWN down launch, each RUN16_UP gate+up launch,
    and each pair at the same warps; none where the engine's plan then (run 12's rule, `run12_engine_tiles`) is
    not the sorted persistent prefill plan."""
    base = run12_engine_tiles(num_tokens, top_k, num_experts)
    if not _sorted_prefill(base):
        return []
    return [*(dataclasses.replace(base, **d) for d in RUN16_DOWN), *(dataclasses.replace(base, **u) for u in RUN16_UP),
            *(dataclasses.replace(base, **d, **u) for d, u in zip(RUN16_DOWN, RUN16_UP))]


def run12_engine_tiles(num_tokens: int, top_k: int, num_experts: int) -> MoeTiles | DirectTiles:
    """The plan the engine ran before run 16's adoption (RUN12_BEST with 32 or more experts, run 2's tiles with
    fewer): the qwen3-30b-a3b profile's sweep and held-out runs were recorded on it; runs 15-16's baseline."""
    if num_experts < ENGINE_RULE_MIN_EXPERTS:
        return run2_tiles(num_tokens, top_k, num_experts)
    return rule_tiles(num_tokens, RUN12_BEST)


# Run 16 (benchmarks/kernels/data/moe_run16, H200 2026-12-04 10:53 UTC, 7 rounds): the down launch at two
# programs a SM (n128 k64, 4 warps, 3 stages) beside run 12's plan won at every prefill T, median of per-round
# ratios 0.956 at T = 4096, 0.941 at 8192, 0.982 at 2048, 0.991 at 1024; every two-a-SM gate+up lost
# (1.02-1.20). Adopted at T >= 1024 (the down tile of every sorted persistent plan). Two confirming calls (9 and
# 11 rounds, run 12's plan over this one): 1.008 / 1.024 at T = 4096, 1.006 / 1.019 at 8192, 1.005 / 0.997 at 1024.
_DOWN16 = RUN16_DOWN[1]
RUN16_BEST: dict[int, MoeTiles | DirectTiles] = {
    **RUN12_BEST, **{t: dataclasses.replace(RUN12_BEST[t], **_DOWN16) for t in (1024, 4096)}}


def run16b_candidates(num_tokens: int, top_k: int, num_experts: int) -> list[MoeTiles | DirectTiles]:
    """The second call on run 16's adoption: run 12's plan at T (the engine's before) and two more down tiles
    at two or three programs a SM (n128 k32 s5; n64 k64 s2 at three), each on the engine's plan at T; none
    where the engine's plan is not the sorted persistent prefill plan."""
    base = engine_tiles(num_tokens, top_k, num_experts)
    if not _sorted_prefill(base):
        return []
    return [run12_engine_tiles(num_tokens, top_k, num_experts),
            dataclasses.replace(base, down_block_k=32, down_num_stages=5),
            dataclasses.replace(base, down_block_n=64, down_num_stages=2, persistent=3)]


def run22_candidates(num_tokens: int, top_k: int, num_experts: int) -> list[MoeTiles | DirectTiles]:
    """Run 22: the sorted persistent prefill plan (the engine's at T = 1024) at steps between 256 and 1,024
    tokens where the engine's rule runs run 6's T = 256 plan (the atomic 32-row tile). Why: run 21 timed that
    plan at 364.9 us at T = 512 and the prefill plan at 344.1 us at T = 768 (benchmarks/kernels/MOE.md). Since
    run 22's adoption the rule runs the prefill plan from T = 479, so the round holds 256 < T < 479."""
    base = engine_tiles(num_tokens, top_k, num_experts)
    if num_experts < ENGINE_RULE_MIN_EXPERTS or _sorted_prefill(base) or not 256 < num_tokens < 1024:
        return []
    return [RUN16_BEST[1024]]


# Run 22 (benchmarks/kernels/data/moe_run22, H200 2026-12-04 12:48 UTC, 5 rounds): the prefill plan over the
# atomic 32-row tile, median of per-round ratios 1.060 / 1.055 / 1.043 / 1.015 at T = 288 / 320 / 384 / 448 and
# 0.948 at T = 512 (346.7 against 365.9 us). Adopted at T = 512 (448 keeps the atomic tile, so the rule moves
# only steps of 479-512 tokens).
RUN22_BEST: dict[int, MoeTiles | DirectTiles] = {**RUN16_BEST, 448: RUN16_BEST[256], 512: RUN16_BEST[1024]}


def engine_tiles(num_tokens: int, top_k: int, num_experts: int) -> MoeTiles | DirectTiles:
    """The plan the engine's Triton backend runs at a step of T tokens: with 32 or more experts the
    measured plan of the nearest T in log2 (RUN22_BEST: run 6's plans with run 12's at T = 1-4, run 16's
    down launch from T = 1024 and run 22's prefill plan from T = 479; qwen3-30b-a3b's profile was calibrated on
    run 12's, `run12_engine_tiles`); with fewer (mixtral-8x7b's 8) run 2's tiles (`run2_tiles`), on which
    mixtral's profile was calibrated (run 3 measured its direct path 22% slower there at T = 1)."""
    if num_experts < ENGINE_RULE_MIN_EXPERTS:
        return run2_tiles(num_tokens, top_k, num_experts)
    return rule_tiles(num_tokens, RUN22_BEST)


def engine_fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor) -> torch.Tensor:
    """`kernels.fused_moe.fused_moe` with the engine's plan for the step (`engine_tiles`)."""
    tiles = engine_tiles(x.shape[0], topk_ids.shape[1], w13.shape[0])
    return fused_moe(x, w13, w2, topk_weights, topk_ids, tiles)


__all__ = [
    "DIRECT_RUN4",
    "DIRECT_RUN6",
    "ENGINE_RULE_MIN_EXPERTS",
    "PREFILL_RUN4",
    "PREFILL_RUN5",
    "PREFILL_RUN6",
    "PROPOSED_RULE",
    "RUN3_BEST",
    "RUN5_BEST",
    "RUN6_BEST",
    "RUN11_BEST_DOWN",
    "RUN11_DOWN",
    "RUN12_BEST",
    "RUN12_UP",
    "RUN16_BEST",
    "RUN16_DOWN",
    "RUN16_UP",
    "RUN22_BEST",
    "engine_fused_moe",
    "engine_tiles",
    "known_plans",
    "plan_key",
    "propose_rule",
    "rule_tiles",
    "run3_best",
    "run4_best",
    "run4_candidates",
    "run5_best",
    "run6_best",
    "run6_candidates",
    "run6_engine_tiles",
    "run11_best",
    "run11_candidates",
    "run12_candidates",
    "run12_engine_tiles",
    "run16_candidates",
    "run16b_candidates",
    "run22_candidates",
]
