"""Turn a `WorkloadSpec` into a `Workload`, vectorised and deterministic in `spec.seed`.

Each ingredient (arrivals, lengths, system prompts, dynamic content, task mix,
sessions) draws from its own child stream of the seed, so changing one part of
a spec (say the task mix) leaves the others' draws unchanged.
"""

from __future__ import annotations

import numpy as np

from sim.arrivals import arrival_times
from sim.lengths import mean_length, sample_lengths
from sim.prefixes import session_runs, shared_blocks, single_turn_runs
from sim.workload import Workload, segment_arange
from sim.workload_spec import Sessions, WorkloadSpec

_STREAMS = ("arrival", "prompt", "output", "system", "dynamic", "task", "session", "sys_lengths")


def _rngs(seed: int) -> dict[str, np.random.Generator]:
    children = np.random.SeedSequence(seed).spawn(len(_STREAMS))
    return {name: np.random.default_rng(child) for name, child in zip(_STREAMS, children, strict=True)}


def _system_prompts(spec: WorkloadSpec, rngs: dict[str, np.random.Generator]) -> tuple[np.ndarray, np.ndarray, int]:
    """Lengths of the system prompts, the first id of each, and the first id left free."""
    if spec.system_prompts is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    sys_len = sample_lengths(spec.system_prompts.tokens, spec.system_prompts.count, rngs["sys_lengths"])
    n_blocks = sys_len // spec.hash_block_size
    sys_base = np.cumsum(n_blocks) - n_blocks
    return sys_len, sys_base.astype(np.int64), int(n_blocks.sum())


def _choose_system_prompt(spec: WorkloadSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """Per request: index of its system prompt (Zipf popularity), or -1 for none."""
    sp = spec.system_prompts
    if sp is None:
        return np.full(n, -1, np.int64)
    weights = np.arange(1, sp.count + 1, dtype=np.float64) ** -sp.zipf_exponent
    choice = rng.choice(sp.count, size=n, p=weights / weights.sum()).astype(np.int64)
    if sp.share_of_requests < 1.0:
        choice[rng.random(n) >= sp.share_of_requests] = -1
    return choice


def _dynamic_positions(spec: WorkloadSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    dp = spec.dynamic_prefix
    if dp is None:
        return np.full(n, -1, np.int64)
    return np.where(rng.random(n) < dp.share_of_requests, dp.position_tokens, -1).astype(np.int64)


def _task_codes(spec: WorkloadSpec, n: int, rng: np.random.Generator) -> tuple[np.ndarray, tuple[str, ...]]:
    names = tuple(spec.task_mix)
    w = np.array([spec.task_mix[k] for k in names], dtype=np.float64)
    return rng.choice(len(names), size=n, p=w / w.sum()).astype(np.int32), names


def generate(spec: WorkloadSpec) -> Workload:
    """The workload `spec` describes: `spec.num_requests` requests sorted by arrival."""
    with np.errstate(over="ignore", invalid="ignore"):
        wl = _generate(spec)
    if not np.isfinite(wl.arrival_s).all():
        # a rate near the smallest float makes gaps of 1e308 s and more
        raise ValueError(f"field 'arrival': arrival times overflow (the arrival rate is too small for "
                         f"{spec.num_requests:,} requests). Fix: raise the arrival rate")
    return wl


def _generate(spec: WorkloadSpec) -> Workload:
    rngs = _rngs(spec.seed)
    if spec.sessions is not None:
        return _generate_sessions(spec, spec.sessions, rngs)
    n, bs = spec.num_requests, spec.hash_block_size
    arrival_s = arrival_times(spec.arrival, n, rngs["arrival"])
    prompt_len = sample_lengths(spec.prompt_tokens, n, rngs["prompt"])
    output_len = sample_lengths(spec.output_tokens, n, rngs["output"])
    sys_len, sys_base, next_id = _system_prompts(spec, rngs)
    sys_choice = _choose_system_prompt(spec, n, rngs["system"])
    n_shared = shared_blocks(prompt_len, sys_choice, sys_len, _dynamic_positions(spec, n, rngs["dynamic"]), bs)
    run_start, run_len, run_offsets, _ = single_turn_runs(prompt_len, sys_choice, n_shared, sys_base, next_id, bs)
    codes, names = _task_codes(spec, n, rngs["task"])
    return Workload(
        arrival_s=arrival_s, prompt_len=prompt_len, output_len=output_len,
        run_start=run_start, run_len=run_len, run_offsets=run_offsets, hash_block_size=bs,
        category_code=codes, categories=names, session_id=np.full(n, -1, np.int64), name=spec.name,
    )


def _generate_sessions(spec: WorkloadSpec, ss: Sessions, rngs: dict[str, np.random.Generator]) -> Workload:
    """Sessions start at the arrival process's times; keep the first `num_requests` turns by arrival.

    Sessions not generated start after the last generated one, so the first n turns are exact as
    long as the n-th earliest turn arrives no later than the last generated session start."""
    n = spec.num_requests
    mean_turns = max(1.0, mean_length(ss.turns))
    n_sessions = int(n / mean_turns * 1.2) + 16
    while True:
        wl, last_start_s = _sessions(spec, ss, rngs, n_sessions)
        if len(wl) >= n and wl.arrival_s[n - 1] <= last_start_s:
            break
        n_sessions *= 2
        rngs = _rngs(spec.seed)  # redraw from scratch so the result depends only on the seed
    out = wl.take(np.arange(n))
    del wl
    return out


def _sessions(
    spec: WorkloadSpec, ss: Sessions, rngs: dict[str, np.random.Generator], n_sessions: int
) -> tuple[Workload, float]:
    """`n_sessions` whole sessions sorted by arrival, and the last session's start time."""
    bs = spec.hash_block_size
    start_s = arrival_times(spec.arrival, n_sessions, rngs["arrival"])
    turns = sample_lengths(ss.turns, n_sessions, rngs["session"])
    first_prompt = sample_lengths(spec.prompt_tokens, n_sessions, rngs["prompt"])
    if ss.max_context_tokens is not None:
        first_prompt = np.minimum(first_prompt, ss.max_context_tokens)
    total = int(turns.sum())
    sess = np.repeat(np.arange(n_sessions), turns)
    turn = segment_arange(turns)
    output_len = sample_lengths(spec.output_tokens, total, rngs["output"])
    message = sample_lengths(ss.user_message_tokens, total, rngs["session"])
    think_s = rngs["session"].exponential(ss.mean_think_time_s, total)

    # prompt_k = prompt_{k-1} + output_{k-1} + message_k: a cumulative sum restarted per session
    step = np.where(turn == 0, first_prompt[sess], np.roll(output_len, 1) + message)
    csum = np.cumsum(step)
    first_row = np.cumsum(turns) - turns
    prompt_len = csum - np.repeat(csum[first_row] - step[first_row], turns)
    gap = np.where(turn == 0, 0.0, think_s)
    tsum = np.cumsum(gap)
    arrival_s = start_s[sess] + tsum - np.repeat(tsum[first_row], turns)

    if ss.max_context_tokens is not None:  # a session ends at its first turn over the limit
        over = prompt_len > ss.max_context_tokens
        first_over = np.minimum.reduceat(np.where(over, turn, np.iinfo(np.int64).max), first_row)
        keep = turn < first_over[sess]
        idx = np.flatnonzero(keep)
        sess, turn, output_len, prompt_len, arrival_s = sess[idx], turn[idx], output_len[idx], prompt_len[idx], arrival_s[idx]
        turns = np.bincount(sess, minlength=n_sessions)
        first_row = np.cumsum(turns) - turns

    sys_len, sys_base, next_id = _system_prompts(spec, rngs)
    sys_choice = _choose_system_prompt(spec, n_sessions, rngs["system"])
    dyn = _dynamic_positions(spec, n_sessions, rngs["dynamic"])
    n_shared_s = shared_blocks(first_prompt, sys_choice, sys_len, dyn, bs)
    sys_start_s = np.where(sys_choice >= 0, sys_base[np.maximum(sys_choice, 0)] if sys_base.size else 0, 0)
    first_of = np.repeat(first_row, turns)
    run_start, run_len, run_offsets, _ = session_runs(
        prompt_len, turn, first_of, n_shared_s[sess], sys_start_s[sess], next_id, bs)
    codes_s, names = _task_codes(spec, n_sessions, rngs["task"])

    wl = Workload(
        arrival_s=arrival_s, prompt_len=prompt_len, output_len=output_len,
        run_start=run_start, run_len=run_len, run_offsets=run_offsets, hash_block_size=bs,
        category_code=codes_s[sess], categories=names, session_id=sess.astype(np.int64), name=spec.name,
    )
    return wl.take(np.argsort(arrival_s, kind="stable")), float(start_s[-1])
