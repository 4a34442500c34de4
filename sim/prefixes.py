"""Prefix structure as runs of hash ids: system prompts, dynamic content, multi-turn carry-over.

Rule for every case: a hash block gets a shared id only when all of its
`hash_block_size` tokens are shared content; a block that is partial, or that
mixes shared and per-request content, gets a fresh id nobody else uses.

- System prompt k of L_k tokens owns ids sys_base[k] .. sys_base[k] + L_k // bs - 1.
  A request using it shares min(L_k, prompt_len) // bs leading blocks.
- Dynamic content at token position q cuts sharing at block q // bs.
- Session turn k repeats turn k-1's ids for the blocks turn k-1's prompt covers
  fully (prompt_{k-1} // bs of them); the rest are fresh. So the id of block b
  in turn k was created by the first turn whose prompt covered b fully, or by
  turn k itself.
"""

from __future__ import annotations

import numpy as np

from sim.workload import segment_arange


def ceil_div(a: np.ndarray, b: int) -> np.ndarray:
    return -(-a // b)


def shared_blocks(
    prompt_len: np.ndarray,
    sys_choice: np.ndarray,
    sys_len: np.ndarray,
    dynamic_pos: np.ndarray,
    block_size: int,
) -> np.ndarray:
    """Leading blocks each request shares with its system prompt (`sys_choice` -1 = none;
    `dynamic_pos` -1 = no per-request content)."""
    has_sys = sys_choice >= 0
    own_sys_len = np.where(has_sys, sys_len[np.maximum(sys_choice, 0)] if sys_len.size else 0, 0)
    shared = np.minimum(own_sys_len, prompt_len) // block_size
    cut = np.where(dynamic_pos >= 0, dynamic_pos // block_size, np.iinfo(np.int64).max)
    return np.minimum(shared, cut)


def single_turn_runs(
    prompt_len: np.ndarray,
    sys_choice: np.ndarray,
    n_shared: np.ndarray,
    sys_base: np.ndarray,
    fresh_base: int,
    block_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Runs for independent requests: [system prompt blocks] + [fresh blocks].

    Returns run_start, run_len, run_offsets and the next unused id."""
    n_fresh = ceil_div(prompt_len, block_size) - n_shared
    fresh_start = fresh_base + np.cumsum(n_fresh) - n_fresh
    sys_start = sys_base[np.maximum(sys_choice, 0)] if sys_base.size else np.zeros_like(prompt_len)
    starts = np.stack([np.where(sys_choice >= 0, sys_start, 0), fresh_start], axis=1)
    lens = np.stack([n_shared, n_fresh], axis=1)
    keep = lens > 0
    counts = keep.sum(axis=1)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return starts[keep].astype(np.int64), lens[keep].astype(np.int64), offsets, int(fresh_base + n_fresh.sum())


def session_runs(
    prompt_len: np.ndarray,
    turn: np.ndarray,
    first_of_session: np.ndarray,
    n_shared_first: np.ndarray,
    sys_start_first: np.ndarray,
    fresh_base: int,
    block_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Runs for requests grouped by session, turns in order (row r is turn `turn[r]` of the session
    whose first row is `first_of_session[r]`).

    Turn j creates one fresh run covering blocks [full_{j-1}, ceil(p_j / bs)), where full_{-1} is
    the system-prompt share; later turns keep its first full_j - full_{j-1} ids. Turn k's runs are
    the system run, the kept part of each earlier turn's run, then its own whole run."""
    full = prompt_len // block_size
    prev_full = np.where(turn == 0, n_shared_first[first_of_session], np.roll(full, 1))
    own_len = ceil_div(prompt_len, block_size) - prev_full  # blocks this turn creates
    kept_len = full - prev_full  # of those, blocks later turns repeat
    own_start = fresh_base + np.cumsum(own_len) - own_len

    # row r has 1 + turn[r] + 1 candidate runs: system, turns 0..turn-1 kept, its own
    n_cand = turn + 2
    row = np.repeat(np.arange(prompt_len.size), n_cand)
    j = segment_arange(n_cand) - 1  # -1 = system run, 0..turn = turn j's run
    first = first_of_session[row]
    src = first + np.maximum(j, 0)  # the row of turn j in this session
    kind = (j >= 0).astype(np.int64) + (j == turn[row])  # 0 system, 1 kept part of turn j, 2 own run
    src[kind == 0] = first[kind == 0]
    n_rows = prompt_len.size
    start_table = np.concatenate([sys_start_first, own_start, own_start])
    len_table = np.concatenate([n_shared_first, kept_len, own_len])
    flat = kind * n_rows + src  # one gather instead of nested selects over every candidate
    starts, lens = start_table[flat], len_table[flat]
    keep = lens > 0
    counts = np.bincount(row[keep], minlength=prompt_len.size)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return starts[keep].astype(np.int64), lens[keep].astype(np.int64), offsets, int(fresh_base + own_len.sum())
