"""The model runner: KV cache sizing, input preparation, the forward pass, CUDA graphs.

One step = one flattened batch: every scheduled request contributes `num_new_tokens` tokens
(a prefill chunk, a recomputation after preemption, or one decode token). Inputs are built with
numpy on the host, staged in pinned memory and copied to persistent device buffers without a
sync; the only sync of a step is the sampler's read-back of the sampled tokens. The block
table is kept on the device and mirrored on the host, and updated incrementally: a decode step
writes a row only when its request crossed into a new block, joined, or moved to another row,
and sends the device only the entries it changed. Under async scheduling a decode's input
token, sampled by the previous step and still on the device, is gathered on the device (inside
the step's CUDA graph when it replays one).

On a GPU, pure-decode batches (every request computes exactly one token) replay a CUDA graph
captured for the next bucket size up, and so do uniform speculative verify batches (every
request a decode with k drafts: 1 + k tokens each, logits at every position). With
cudagraph_mode FULL, any other batch of at most max_cudagraph_capture_size tokens (prefill
chunks beside decodes, non-uniform verify batches) replays a "mixed" graph captured for the
next token bucket up: the real tokens first, padding tokens that belong to no sequence, and
zero-token dummy sequences up to the graph's sequence count, so padding is neither attended
nor written; the attention's launches stride over the step's work lists (the Q blocks of its
decodes and of its chunks, staged with the inputs), so the padding costs them no programs. A mixed graph ends at the hidden states (in a persistent buffer); the LM head runs
eagerly on the rows that sample, whose number varies (as vLLM keeps compute_logits outside).
Larger batches run eagerly.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import operator
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.attention import AttentionMetadata
from engine.core.cuda_graphs import (
    VERIFY_GRAPH_MAX_TOKENS,
    decode_graph_buckets,
    mixed_graph_buckets,
)
from engine.core.flags import FlagError
from engine.core.scheduler_output import StepColumns
from engine.model import LlamaModel
from kernels import DECODE_MAX_QUERY_LEN
from kernels.work_lists import AttentionWork, plan_work, work_capacity

# Block-table rows to update one slice at a time; more go through one numpy scatter.
ROW_SLICE_MAX_ROWS = 16


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's element type for vLLM's `--kv-cache-dtype`: "auto" (or the model dtype by
    name) = the model dtype, "fp8" = "fp8_e4m3" = float8_e4m3fn (with per-layer scales, see
    engine.model). The kernels store and read nothing else."""
    if kv_cache_dtype == "auto" or kv_cache_dtype == str(model_dtype).removeprefix("torch."):
        return model_dtype
    if kv_cache_dtype in ("fp8", "fp8_e4m3"):
        return torch.float8_e4m3fn
    raise FlagError("kv_cache_dtype", kv_cache_dtype,
                    f"the engine stores auto (= the model's {str(model_dtype).removeprefix('torch.')}) "
                    "or fp8 (= fp8_e4m3); set {kv_cache_dtype} to one of those")


@dataclass
class StepInputs:
    """Host-side description of one prepared step (the tensors are in the runner's buffers)."""

    request_ids: list[int]  # scheduled order
    sample_request_ids: list[int]  # requests that produce a token this step, in logits-row order
    num_tokens: int
    num_padded_tokens: int
    graph_size: int | None  # the decode CUDA graph to replay, None = eager
    max_query_len: int
    max_seq_len: int
    num_seqs: int
    # logits rows: one per sampling request, 1 + its drafts for a speculative verify (in order)
    num_logits: int = 0
    graph_q: int = 1  # tokens per sequence of the graph: 1 (decode) or 1 + k (verify graph)
    graph_kind: str | None = None  # "decode", "verify" or "mixed" (graph_size tokens); None = eager
    num_decode_seqs: int | None = None  # sequences of <= DECODE_MAX_QUERY_LEN tokens (kernel hint)
    # (decode, prefill) Q blocks in the attention's work lists (staged with the step), or None
    # when the step's attention takes none (a decode or verify graph, an eager pure-decode step)
    work_items: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class StagedCopy:
    """What a step's host-to-device copy moved: the staging bytes [0, end), then the block
    table's update (the changed entries, or `packed` (seqs, cols) rows)."""

    end_bytes: int
    entries: bool | None  # some entries changed (None: rows sent packed instead)
    packed: tuple[int, int] | None


@dataclass(slots=True)
class _InputTokens:
    """The step's input token ids, flattened; a decode whose input token the previous step
    sampled but the host has not read yet holds a 0 at `gather_dst[i]`, filled on the device
    from row `gather_src[i]` of the previous step's sampled tokens (lists, or int64 arrays)."""

    flat_ids: list[int] | np.ndarray
    gather_dst: list[int] | np.ndarray
    gather_src: list[int] | np.ndarray


@dataclass(slots=True)
class _StepLayout:
    """Host arrays of one step: where each token and sequence goes, padding included."""

    num_seqs: int
    num_tokens: int
    padded_seqs: int  # = graph_size on a graph replay (dummy sequences of one token), else num_seqs
    padded_tokens: int
    graph_size: int | None
    graph_q: int  # query tokens per sequence of that graph (padding sequences get as many)
    graph_kind: str | None  # see StepInputs
    seq_lens: np.ndarray  # [num_seqs] context including this step's tokens
    qsl: np.ndarray  # [padded_seqs + 1] query start offsets
    positions: np.ndarray  # [num_tokens]
    slots: np.ndarray  # [num_tokens] flat KV-cache slots
    sample_rows: Sequence[int]  # scheduled rows that sample a token (a range when all do)
    block_cols: int  # block-table columns to copy: the widest row of the step


@dataclass(frozen=True, slots=True)
class _GraphChoice:
    """The CUDA graph a step replays."""

    kind: str  # "decode", "verify" or "mixed"
    size: int  # sequences (decode, verify) or tokens (mixed) of the graph
    q: int  # tokens per padding sequence: 1 (decode), 1 + k (verify), 0 (mixed: empty dummies)


@dataclass(slots=True)
class _RowCache:
    """What the block table's rows hold (host mirror and device alike): per row, the table
    (list) last written there, how many of its blocks were written and that step's first
    token position."""

    tables: list[list[int] | None]
    num_blocks: np.ndarray
    starts: np.ndarray

    @classmethod
    def empty(cls, num_rows: int) -> _RowCache:
        return cls([None] * num_rows, np.zeros(num_rows, dtype=np.int64), np.zeros(num_rows, dtype=np.int64))

    def forget(self, lo: int, hi: int) -> None:
        """Rows [lo, hi) were overwritten with something else (padding)."""
        self.tables[lo:hi] = [None] * (hi - lo)


def _row_of(rows: dict[int, int] | Sequence[int]) -> dict[int, int]:
    """In-flight rows as a dict: request id -> row (given as one, or as the ids by row)."""
    return rows if isinstance(rows, dict) else {r: i for i, r in enumerate(rows)}


def _input_tokens(rids: Sequence[int], starts: Sequence[int], q_lens: Sequence[int],
                  token_ids: dict[int, list[int]],
                  inflight: tuple[dict[int, int] | Sequence[int], torch.Tensor] | None,
                  one_each: bool | None = None) -> _InputTokens:
    """Each request's tokens [start, start + q_len) from `token_ids`, or from `inflight` for a
    decode whose input token was sampled by the previous step and is not on the host yet.
    `one_each`: whether every q_len is 1 (None: found here)."""
    n = len(q_lens)
    if one_each is None:
        one_each = n == sum(q_lens)
    if one_each:  # one token per request (a decode batch): C-level passes
        lists = map(token_ids.__getitem__, rids)
        if inflight is None:
            # every input token on the host (synchronous scheduling); an IndexError means
            # some token is unknown, which the loop names
            try:
                return _InputTokens(list(map(operator.getitem, lists, starts)), [], [])
            except IndexError:
                pass
        elif list(map(len, lists)) == list(starts):
            # every input token is the one the previous step sampled (steady async decoding);
            # a KeyError (a request the previous step did not sample) is named by the loop
            rows = inflight[0]
            if not isinstance(rows, dict) and list(rows) == list(rids):  # the same batch, in order
                return _InputTokens(np.zeros(n, dtype=np.int64), np.arange(n), np.arange(n))
            try:
                src = np.fromiter(map(_row_of(rows).__getitem__, rids), dtype=np.int64, count=n)
            except KeyError:
                pass
            else:
                return _InputTokens(np.zeros(n, dtype=np.int64), np.arange(n), src)
    if inflight is not None:
        inflight = (_row_of(inflight[0]), inflight[1])
    tokens = _InputTokens([], [], [])
    flat_ids = tokens.flat_ids
    for rid, c, q in zip(rids, starts, q_lens):
        toks = token_ids[rid]
        if q == 1:
            if c < len(toks):
                flat_ids.append(toks[c])
            else:  # sampled by the previous step, not yet on the host
                if inflight is None or c != len(toks) or rid not in inflight[0]:
                    raise RuntimeError(f"request {rid}: input token {c} is unknown")
                tokens.gather_dst.append(len(flat_ids))
                tokens.gather_src.append(inflight[0][rid])
                flat_ids.append(0)
        else:
            if c + q > len(toks):
                raise RuntimeError(f"request {rid}: tokens {c}..{c + q} not all known")
            flat_ids.extend(toks[c: c + q])
    return tokens


def _spec_counts(num_spec_tokens: Sequence[int], sample_rows: Sequence[int]) -> np.ndarray:
    """Drafts verified by each sampling row."""
    return np.fromiter((num_spec_tokens[i] for i in sample_rows), dtype=np.int64, count=len(sample_rows))


@dataclass(frozen=True, slots=True)
class _Section:
    """One input's place in the staging byte buffer (the same on the host and the device)."""

    name: str
    dtype: torch.dtype
    numel: int
    offset_bytes: int

    @property
    def end_bytes(self) -> int:
        return self.offset_bytes + self.numel * self.dtype.itemsize


# Section starts aligned like a fresh allocation's, so kernels see the alignment they would
STAGING_ALIGN_BYTES = 256


def block_entry_capacity(seqs: int) -> int:
    """Block-table entries a step sends as (index, value) pairs; a step that changes more
    sends its rows packed instead. Room for every row crossing into a new block at once (a
    batch admitted together crosses together) and a few admissions' rows beside them."""
    return 2 * seqs + 256


def _staging_sections(tokens: int, seqs: int, max_blocks: int, work_items: int = 0) -> list[_Section]:
    """The staging layout: small per-sequence inputs (the attention's work lists, the in-flight
    gather's lists and the block-table entries changed this step among them), the per-token
    inputs, then the packed block-table rows last (their used part varies most, and a step
    that sends them copies up to their end). The token ids have one element more than the
    token capacity: where the fixed-size gather lists' unused entries write."""
    wanted = [("seq_lens", torch.int32, seqs), ("qsl", torch.int32, seqs + 1),
              ("work_counts", torch.int32, 2), ("work", torch.int32, max(work_items, 1)),
              ("gather_dst", torch.int64, seqs), ("gather_src", torch.int64, seqs),
              ("bt_idx", torch.int64, block_entry_capacity(seqs)),
              ("bt_val", torch.int32, block_entry_capacity(seqs)),
              ("ids", torch.int64, tokens + 1), ("pos", torch.int64, tokens), ("slots", torch.int64, tokens),
              ("logits_idx", torch.int64, tokens), ("bt_packed", torch.int32, seqs * max_blocks)]
    sections, off = [], 0
    for name, dtype, numel in wanted:
        sections.append(_Section(name, dtype, numel, off))
        off = -(-sections[-1].end_bytes // STAGING_ALIGN_BYTES) * STAGING_ALIGN_BYTES
    return sections


@dataclass(frozen=True, slots=True)
class RunnerCall:
    """A runner method rank 0 of a tensor-parallel group ran, for every worker to run too."""

    name: str
    args: tuple
    kwargs: dict


@dataclass(slots=True)
class StepMessage:
    """One step as rank 0 prepared it, for the workers: the step's description, the parts of its
    staging bytes the step uses ((offset, bytes) chunks), its copy plan, and whether its decodes
    gather in-flight tokens (rank 0 then also broadcasts its sampled-token buffer on the device
    group)."""

    inputs: StepInputs
    chunks: list[tuple[int, bytes]]
    copy: StagedCopy
    gathers: bool


def mirrored(method: Callable) -> Callable:
    """Rank 0 of a tensor-parallel group first tells the workers to make the same call (with
    the same arguments, less a `progress` callback): the calls that allocate, capture or run
    collectives must happen on every rank in the same order."""
    @functools.wraps(method)
    def call(self: ModelRunner, *args: Any, **kwargs: Any) -> Any:
        tp = self.tp
        if tp is not None and tp.world_size > 1 and tp.is_driver:
            tp.send(RunnerCall(method.__name__, args, {k: v for k, v in kwargs.items() if k != "progress"}))
        return method(self, *args, **kwargs)
    return call


def _typed_view(raw: torch.Tensor, sec: _Section) -> torch.Tensor:
    """The section of byte buffer `raw` as a 1-D tensor of its dtype (same storage)."""
    return raw[sec.offset_bytes: sec.end_bytes].view(sec.dtype)


class ModelRunner:
    """Owns the KV cache and the device-side input buffers of one model."""

    def __init__(self, model: LlamaModel, *, block_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int, kv_cache_dtype: str = "auto",
                 max_cudagraph_capture_size: int = VERIFY_GRAPH_MAX_TOKENS) -> None:
        self.model = model
        self.kv_dtype = kv_cache_torch_dtype(kv_cache_dtype, model.dtype)
        self.spec = model.spec
        # tensor parallelism: this rank's group (None: one GPU) and its share of the KV heads
        self.tp = model.tp_group
        self.num_kv_heads = model.spec.num_kv_heads // model.tp_size
        self._last_copy: StagedCopy | None = None  # the last step's copy plan (sent to the workers)
        self._last_gathers = False
        self.device = model.embed_tokens.device
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.max_cudagraph_capture_size = max_cudagraph_capture_size
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.kv_caches: torch.Tensor | None = None
        self.num_blocks = 0
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._decode_sizes_key: tuple[int, int] | None = None
        self._decode_sizes_list: list[int] = []
        # verify graphs: batch size -> graph of that many decodes with k drafts each (q = 1 + k)
        self.verify_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.verify_q = 0
        self._verify_logits: dict[int, torch.Tensor] = {}
        # mixed graphs: step token bucket -> graph of that many tokens (see mixed_graph_forward)
        self.mixed_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._mixed_sizes: list[int] = []  # sorted keys of mixed_graphs
        self._mixed_hidden = torch.empty(0)  # the graphs' hidden states [tokens, hidden]
        self.num_mixed_graph_replays = 0  # steps served by a mixed graph (also in num_graph_replays)
        self.num_graph_replays = 0  # steps served by a captured graph
        self.num_graph_captures = 0  # graphs captured (only the capture_*_graphs functions do it)
        self.memory_report: dict[str, float] = {}  # GPU: the terms the KV cache size came from
        # a draft model's KV per block, paged with the same block ids: sized together with ours
        self.draft_block_bytes = 0
        self.num_eager_forwards = 0
        self._graph_logits: dict[int, torch.Tensor] = {}
        self.is_cuda = self.device.type == "cuda"
        # the attention's work lists (kernels.paged_attention.plan_work), when the backend
        # takes them: Q blocks of each launch of a step with prefill chunks, staged per step
        self._work_block_qs = model.backend.work_block_qs(
            self.spec.num_heads // model.tp_size, self.num_kv_heads, self.kv_dtype == torch.float8_e4m3fn)
        self._work_cap = (0, 0)
        if self._work_block_qs is not None:
            self._work_cap = work_capacity(max_num_seqs, max(max_num_batched_tokens, max_num_seqs),
                                           self._work_block_qs)
        self._alloc_buffers()

    # ------------------------------------------------------------------ buffers
    def _alloc_buffers(self) -> None:
        t = max(self.max_num_batched_tokens, self.max_num_seqs)
        b = self.max_num_seqs
        pin = self.is_cuda
        self._sections = _staging_sections(t, b, self.max_blocks_per_seq, sum(self._work_cap))
        nbytes = self._sections[-1].end_bytes
        self._alloc_host_stages(nbytes, pin)
        self._alloc_block_table_mirror(b, t)
        # shared read-only arrays (a one-token step's q_lens and query offsets are views of them)
        self._arange = np.arange(t + 1, dtype=np.int64)
        self._ones = np.ones(t, dtype=np.int64)
        self._arange.flags.writeable = self._ones.flags.writeable = False
        self._stage_done: list[torch.cuda.Event | None] = [None, None]
        self._stream = None  # the stream the steps' copies run on (taken at the first record)
        self._stage_idx = 0
        self._num_logits = 0  # logits rows of the step staged last
        self._use_stage(0)
        self._alloc_device_inputs(nbytes, t, b)

    def _alloc_host_stages(self, nbytes: int, pin: bool) -> None:
        """The two host staging sets (one byte buffer each, every input a typed view)."""
        # Host staging, pinned on GPU machines so the copies are truly asynchronous. Two sets,
        # used alternately, so that preparing step N+1 never overwrites what step N's copies
        # may still be reading (with async scheduling the host runs a step ahead). Each set is
        # one byte buffer (every input a typed view into it), copied with ONE host-to-device
        # copy into one device byte buffer of the same layout: one copy call per step instead
        # of seven, each a launch the GPU host pays in Python and driver time.
        self._stages = []
        for _ in range(2):
            raw = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=pin)
            st = {sec.name: _typed_view(raw, sec) for sec in self._sections}
            st["raw"] = raw
            self._stages.append(st)
        self._stage_views = [{k: v.numpy() for k, v in st.items()} for st in self._stages]

    def _alloc_block_table_mirror(self, b: int, t: int) -> None:
        """The host mirror of the device block table and the fixed-size update lists' spare entries."""
        # The block table as the device holds it, mirrored on the host (full-width rows kept
        # between steps): a step sends the device only the entries it changed, as (flat
        # index, block id) pairs applied by one fixed-size index_copy_ (entries past the
        # step's own point at the table's one spare element), or, past their capacity, its
        # rows packed (one more section of the copy) and spread on the device.
        self._bt_cap = block_entry_capacity(b)
        self._bt_dummy = b * self.max_blocks_per_seq  # the spare element
        self._bt_host = np.zeros((b, self.max_blocks_per_seq), dtype=np.int32)
        self._bt_host_flat = self._bt_host.reshape(-1)
        self._row_cache = _RowCache.empty(b)
        self._row_starts = np.arange(b, dtype=np.int64) * self.max_blocks_per_seq  # flat index of each row
        # The in-flight gather's fixed-size lists: entries past the step's own write the
        # spare token id (index t) from row 0
        self._ids_dummy = t
        for sv in self._stage_views:
            sv["bt_idx"][:] = self._bt_dummy
            sv["gather_dst"][:] = t
        self._staged_entries = [0, 0]  # per staging set: block-table entries written last time
        self._staged_gathers = [0, 0]  # per staging set: gather entries written last time

    def _alloc_device_inputs(self, nbytes: int, t: int, b: int) -> None:
        """The persistent device inputs, the device block table and the sampled-token buffer."""
        # The persistent device inputs are views into one device buffer laid out as the host
        # staging: their storage never changes, so the CUDA graphs' captured pointers stay valid.
        self.d_raw = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
        d = {sec.name: _typed_view(self.d_raw, sec) for sec in self._sections}
        self.d_ids_ext = d["ids"]  # the token ids and the gather's spare element
        self.d_input_ids, self.d_positions, self.d_slots = d["ids"][:t], d["pos"], d["slots"]
        self.d_slots.fill_(-1)
        self.d_seq_lens, self.d_qsl = d["seq_lens"], d["qsl"]
        self.d_logits_idx = d["logits_idx"]  # verify: 1 + k rows each
        self.d_gather_dst, self.d_gather_src = d["gather_dst"], d["gather_src"]
        self.d_gather_dst.fill_(t)
        self.d_bt_idx, self.d_bt_val = d["bt_idx"], d["bt_val"]
        self.d_bt_idx.fill_(self._bt_dummy)
        self.d_bt_packed = d["bt_packed"]
        self.d_work, self.d_work_counts = d["work"], d["work_counts"]
        self.d_bt_flat = torch.zeros(b * self.max_blocks_per_seq + 1, dtype=torch.int32, device=self.device)
        self.d_block_tables = self.d_bt_flat[: b * self.max_blocks_per_seq].view(b, self.max_blocks_per_seq)
        # The sampled tokens of a step, where the next step's graphs gather their in-flight
        # input tokens from (the engine's sampler writes here: sampled_tokens_out)
        self.d_sampled = torch.zeros(b, dtype=torch.int64, device=self.device)
        self._sampled_views: dict[int, torch.Tensor] = {}
        # views of the host-to-device copy by its end (bytes), per staging set
        self._copy_views: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = [{}, {}]

    def _use_stage(self, i: int) -> None:
        self.h_raw = self._stages[i]["raw"]
        # numpy views of the same memory, made once (a .numpy() call per use costs more)
        self._np = self._stage_views[i]

    def lower_row_starts(self, starts: Sequence[int]) -> None:
        """Rows [0, len(starts)) were last written for steps that run ahead of their requests'
        committed tokens (a draft model's single-token rounds at c + i): record `starts[i]`
        (the position the request's kept tokens are sure to reach) instead, where lower, so the
        next write of the same table rewrites every block past it (a verify step may replace
        the blocks past the tokens it keeps, which the round's own start would skip)."""
        n = len(starts)
        np.minimum(self._row_cache.starts[:n], np.asarray(starts, dtype=np.int64), out=self._row_cache.starts[:n])

    def reset_block_tables(self) -> None:
        """Zero the device block table and its host mirror, every row to be written whole
        again (after writing the device table directly: warm-up launches, graph capture)."""
        self.d_block_tables.zero_()
        self._bt_host.fill(0)
        self._row_cache = _RowCache.empty(self.max_num_seqs)

    def sampled_tokens_out(self, n: int) -> torch.Tensor:
        """The first `n` rows of the persistent sampled-token buffer, for the sampler's output:
        a next step that passes them as its in-flight tokens gathers inside its CUDA graph (any
        other tensor is first copied there)."""
        v = self._sampled_views.get(n)
        if v is None:
            v = self._sampled_views[n] = self.d_sampled[:n]
        return v

    # ------------------------------------------------------------------ KV cache
    def block_bytes(self) -> int:
        """Bytes one KV block takes over all layers (K and V), at the cache's element size."""
        s = self.spec
        return (2 * s.num_layers * self.block_size * self.num_kv_heads * s.head_dim
                * torch.finfo(self.kv_dtype).bits // 8)

    def new_kv(self, num_blocks: int) -> torch.Tensor:
        """This rank's KV cache: its share of the KV heads (all of them without TP)."""
        s = self.spec
        return torch.zeros((s.num_layers, 2, num_blocks, self.block_size, self.num_kv_heads, s.head_dim),
                           dtype=self.kv_dtype, device=self.device)

    @torch.inference_mode()
    def profile_peak_bytes(self) -> tuple[int, int]:
        """Run the largest batch once; return (peak bytes allocated, of which temporary KV bytes).

        The largest batch is `max_num_batched_tokens` prompt tokens split over up to
        `max_num_seqs` sequences, with logits for every sequence.
        """
        seqs = max(1, min(self.max_num_seqs, self.max_num_batched_tokens))
        tokens = self.max_num_batched_tokens
        lens = np.full(seqs, tokens // seqs, dtype=np.int64)
        lens[: tokens - int(lens.sum())] += 1
        blocks_needed = int(sum(-(-int(n) // self.block_size) for n in lens))
        kv = self.new_kv(blocks_needed)
        kv_bytes = kv.numel() * kv.element_size()
        torch.cuda.reset_peak_memory_stats(self.device)
        qsl = np.concatenate([[0], np.cumsum(lens)])
        positions = np.concatenate([np.arange(n) for n in lens])
        bt = np.zeros((seqs, self.max_blocks_per_seq), dtype=np.int32)
        nxt = 0
        for i, n in enumerate(lens):
            nb = -(-int(n) // self.block_size)
            bt[i, :nb] = np.arange(nxt, nxt + nb)
            nxt += nb
        seq_idx = np.repeat(np.arange(seqs), lens)
        slots = bt[seq_idx, positions // self.block_size].astype(np.int64) * self.block_size + positions % self.block_size
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(slots).to(dev),
            block_tables=torch.from_numpy(bt).to(dev),
            seq_lens=torch.from_numpy(lens.astype(np.int32)).to(dev),
            query_start_loc=torch.from_numpy(qsl.astype(np.int32)).to(dev),
            max_query_len=int(lens.max()), max_seq_len=int(lens.max()),
        )
        ids = torch.zeros(tokens, dtype=torch.int64, device=dev)
        hidden = self.model(ids, torch.from_numpy(positions).to(dev), kv, meta)
        self.model.compute_logits(hidden[torch.from_numpy(qsl[1:] - 1).to(dev)])
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev)
        del kv, hidden
        torch.cuda.empty_cache()
        return peak, kv_bytes

    def _check_kv_fits(self, num_blocks: int, field: str, value: int) -> None:
        """Refuse, before allocating, a KV cache larger than the device's free memory (an
        override or a CPU size is taken as given, so an absurd one would die in the allocator)."""
        need = num_blocks * (self.block_bytes() + self.draft_block_bytes)
        if self.is_cuda:
            free = torch.cuda.mem_get_info(self.device)[0]
        else:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if need > free:
            raise FlagError(field, value, f"needs {need / 2**30:,.1f} GiB of KV cache ({num_blocks:,} blocks "
                            f"of {self.block_bytes():,} bytes) but {self.device.type} memory has "
                            f"{free / 2**30:,.1f} GiB free; lower {{{field}}}")

    @mirrored
    def allocate_kv_cache(self, *, gpu_memory_utilization: float = 0.92,
                          num_gpu_blocks_override: int | None = None,
                          cpu_kv_cache_bytes: int = 256 << 20) -> int:
        """Size and allocate the KV cache; returns the number of blocks.

        GPU: blocks = (total memory x utilization - peak of the profiling forward, less its own
        temporary KV - memory used outside this process's torch allocator) / block bytes.
        CPU: `cpu_kv_cache_bytes` (vLLM's VLLM_CPU_KVCACHE_SPACE), capped at what
        `max_num_seqs` full-length sequences could use. Under tensor parallelism each rank
        holds its KV heads of every block, so a block costs 1/tp of the bytes; the ranks agree
        on the smallest count any of them can hold (the one scheduler pages them all).
        """
        if num_gpu_blocks_override is not None:
            n = num_gpu_blocks_override
        elif self.is_cuda:
            peak, tmp_kv = self.profile_peak_bytes()
            # Blocks cached by torch's allocator but unused are counted as free below; hand them
            # back first, else one large KV allocation can fail against a fragmented cache.
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info(self.device)
            other = (total - free) - torch.cuda.memory_reserved(self.device)  # other processes, CUDA ctx
            budget = total * gpu_memory_utilization - (peak - tmp_kv) - max(other, 0)
            n = int(budget // (self.block_bytes() + self.draft_block_bytes))
            # what the KV size came from: calibration reproduces the block count from these
            self.memory_report = {"total_bytes": int(total), "gpu_memory_utilization": gpu_memory_utilization,
                                  "weights_bytes": sum(t.numel() * t.element_size() for t in self.model.parameters()),
                                  "profile_peak_bytes": int(peak), "profile_tmp_kv_bytes": int(tmp_kv),
                                  "other_bytes": int(max(other, 0)), "block_bytes": int(self.block_bytes())}
        else:
            cap = self.max_num_seqs * self.max_blocks_per_seq + 1
            n = min(cpu_kv_cache_bytes // (self.block_bytes() + self.draft_block_bytes), cap)
        if self.tp is not None:
            n = self.tp.min_int(n)
        if n < 1:
            raise ValueError(
                f"no memory left for the KV cache (computed {n} blocks); raise "
                "--gpu-memory-utilization, lower --max-num-batched-tokens, or use a smaller model"
            )
        if num_gpu_blocks_override is not None or not self.is_cuda:
            self._check_kv_fits(n, "num_gpu_blocks_override" if num_gpu_blocks_override is not None
                                else "cpu_kv_cache_bytes",
                                num_gpu_blocks_override if num_gpu_blocks_override is not None
                                else cpu_kv_cache_bytes)
        self.kv_caches = self.new_kv(n)
        self.num_blocks = n
        return n

    # ------------------------------------------------------------------ inputs
    def prepare(self, scheduled, token_ids: dict[int, list[int]],
                inflight: tuple[dict[int, int] | Sequence[int], torch.Tensor] | None = None, *,
                verify: bool = False) -> StepInputs:
        """Fill the device buffers from the scheduler's output; no device sync.

        `scheduled`: the SchedulerOutput's per-request entries, or its `columns()` (the same
        fields, read without building an entry per plain decode). Their `block_ids` are the
        scheduler's live tables: between steps one only grows at its end or, after a verify
        step, loses blocks past its kept tokens; anything else must come as a new list (rows
        of the block table are kept per list and updated incrementally). `token_ids[rid]`
        holds the request's prompt then its generated tokens (other requests' entries are
        not read). A request samples a token when this step
        reaches the end of the tokens it holds (end of prefill, a decode, or the end of a
        recomputation after preemption).

        `inflight` (async scheduling): (row of each request in the previous step's sampled
        tokens, as a dict or as the request ids by row; those tokens on the device). A decode whose input token is still in flight gets
        it by a device-side gather, so the host never waits for it: inside the step's CUDA
        graph when it replays one (the tokens are read from the persistent buffer that
        `sampled_tokens_out` hands the sampler; other tensors are copied there first), here
        for an eager step.

        `verify`: some decodes carry drafts (their token lists include them): every one of
        their positions gets a logits row.

        A steady decode step (every request one token, block tables grown by at most their
        new blocks) runs one host-to-device copy, plus one fixed-size index_copy_ when some
        row crossed into a new block: no other torch call, no view made.
        """
        self._next_stage()
        # every field prepare reads, as columns: from the scheduler's records for a batch of
        # plain decodes (SchedulerOutput.columns), else in one C-level pass over the entries
        # (a pass per field cost ~0.15 us per entry each: a third of prepare at batch 128)
        cols = scheduled if isinstance(scheduled, StepColumns) else StepColumns.of(scheduled)
        n = len(cols)
        rids, q_t, c_t, samples, tables = (cols.request_ids, cols.num_new_tokens, cols.num_computed_tokens,
                                           cols.samples, cols.block_ids)
        one_each = n == sum(q_t)  # one token per request (none computes 0)
        all_sample = samples.count(True) == n
        q_lens = self._ones[:n] if one_each else np.array(q_t, dtype=np.int64)  # read only
        starts = np.array(c_t, dtype=np.int64)
        tokens = _input_tokens(rids, c_t, q_t, token_ids, inflight, one_each)
        entries, max_blocks = self._stage_block_tables(tables, starts)
        sample_rows = range(n) if all_sample else list(itertools.compress(range(n), samples))
        spec = _spec_counts(cols.num_spec_tokens, sample_rows) if verify else None
        layout = self._layout(q_lens, starts, sample_rows, max_blocks, spec)
        num_logits = self._stage_host(layout, tokens.flat_ids, spec)
        work_items = self._stage_work(layout, q_lens)
        num_gather = self._stage_gather(tokens)
        self._copy_to_device(layout, self._stage_block_entries(layout, entries))
        self._last_gathers = bool(num_gather)
        if num_gather:
            assert inflight is not None  # _input_tokens gathers only from inflight tokens
            self._gather_inflight(layout, inflight[1])
        self._record_stage_done()
        sample_ids = list(rids) if all_sample else [rids[i] for i in sample_rows]
        return _step_inputs(rids, sample_ids, layout, q_lens, one_each, num_logits, work_items)

    def _next_stage(self) -> None:
        """Switch to the other host staging set, once the copies that last read it are done."""
        self._stage_idx ^= 1
        done = self._stage_done[self._stage_idx]
        if done is not None:
            done.synchronize()  # the copies that last read this staging set have finished
        self._use_stage(self._stage_idx)

    def _record_stage_done(self) -> None:
        """Mark (on the GPU stream) where this step's copies out of the staging set end."""
        if self.is_cuda:
            # one event per staging set, re-recorded: _next_stage waited on its last record
            # before this set was written again (saves an event creation per step); recorded
            # on the stream the steps run on, taken once (current_stream() builds a Stream
            # object per call)
            ev = self._stage_done[self._stage_idx]
            if ev is None:
                ev = self._stage_done[self._stage_idx] = torch.cuda.Event()
            if self._stream is None:
                self._stream = torch.cuda.current_stream(self.device)
            ev.record(self._stream)

    def _stage_block_tables(self, tables: Sequence[list[int]], starts: np.ndarray
                            ) -> tuple[tuple[np.ndarray, list[int]] | None, int]:
        """Bring the host mirror's row of each scheduled request (its live table `tables[i]`)
        up to date; returns the entries written ((flat indices, block ids), None if none) and
        the widest row.

        A row that held the same request's table (the same list) when last written, for a step
        starting at token c, is only written from block c // bs + 1 on (or from where it was
        written up to, if less): the scheduler only appends to a live table, or, after a
        verify step, truncates the blocks past the tokens kept, which are at least c + 1; a
        preempted request gets a new list. Any other row is written whole. A steady decode
        batch thus writes only the rows that crossed into a new block: their new block."""
        cache = self._row_cache
        n = len(tables)
        nbs = np.fromiter(map(len, tables), dtype=np.int64, count=n)
        firsts = np.minimum(cache.num_blocks[:n], cache.starts[:n] // self.block_size + 1)
        held = cache.tables[:n]
        # every row holds its request's table again (a steady batch): one C-level compare,
        # which short-cuts on identity (a new list equal to the old one is as good: the row
        # holds its blocks); else row by row, by identity
        if held != list(tables):
            firsts[~np.fromiter(map(operator.is_, held, tables), dtype=bool, count=n)] = 0
        rows = np.flatnonzero(nbs > firsts)
        cache.tables[:n] = tables
        cache.num_blocks[:n] = nbs
        cache.starts[:n] = starts
        entries = self._write_rows(tables, rows, firsts[rows], nbs[rows]) if len(rows) else None
        return entries, max(1, int(nbs.max()) if n else 1)

    def _write_rows(self, tables: Sequence[list[int]], rows: np.ndarray, firsts: np.ndarray,
                    ends: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """Block ids [firsts[k], ends[k]) of tables[rows[k]] into their rows of the host
        mirror; returns their (flat indices, block ids). Python lists when the rows are few
        (a steady decode batch), else numpy repeats."""
        mb = self.max_blocks_per_seq
        if len(rows) <= ROW_SLICE_MAX_ROWS:
            flat: list[int] = []
            vals: list[int] = []
            for i, j, e in zip(rows.tolist(), firsts.tolist(), ends.tolist()):
                vals += tables[i][j:e]
                flat += range(i * mb + j, i * mb + e)
            idx = np.array(flat, dtype=np.int64)
        else:
            counts = ends - firsts
            vals = list(itertools.chain.from_iterable(
                tables[i][j:e] for i, j, e in zip(rows.tolist(), firsts.tolist(), ends.tolist())))
            offsets = np.repeat(np.cumsum(counts) - counts - firsts, counts)
            idx = np.repeat(rows, counts) * mb + (np.arange(len(vals)) - offsets)
        self._bt_host_flat[idx] = vals
        return idx, vals

    def _stage_block_entries(self, layout: _StepLayout, entries: tuple[np.ndarray, list[int]] | None
                             ) -> int | None:
        """Stage the block-table entries this step changed: its rows' (`entries`) and the
        first column of its padding sequences' rows, zeroed where it is not (a padding
        sequence attends to block 0's slots). Returns their number, or None when they exceed
        the capacity: the step then sends its rows packed."""
        n, padded = layout.num_seqs, layout.padded_seqs
        if padded > n:
            self._row_cache.forget(n, padded)  # rewritten whole when a sequence takes them again
            col0 = self._bt_host[n:padded, 0]
            pad = np.flatnonzero(col0)
            if len(pad):
                col0[pad] = 0
                pad_idx = (pad + n) * self.max_blocks_per_seq
                entries = ((pad_idx, [0] * len(pad)) if entries is None
                           else (np.concatenate((entries[0], pad_idx)), entries[1] + [0] * len(pad)))
        k = 0 if entries is None else len(entries[1])
        if k > self._bt_cap:
            return None
        st = self._stage_idx
        last = self._staged_entries[st]
        if entries is not None:
            self._np["bt_idx"][:k] = entries[0]
            self._np["bt_val"][:k] = entries[1]
        if last > k:  # entries this set held past this step's now point at the spare element
            self._np["bt_idx"][k:last] = self._bt_dummy
        self._staged_entries[st] = k
        return k

    def _pick_graph(self, q_lens: np.ndarray, sample_rows: Sequence[int], spec: np.ndarray | None,
                    num_tokens: int) -> _GraphChoice | None:
        """The CUDA graph this step replays, or None (eager): a decode graph for a pure decode
        batch, a verify graph when every request is a decode with exactly k drafts (the
        captured q = 1 + k), else a mixed graph when the step's tokens fit one."""
        n = len(q_lens)
        if len(sample_rows) == n:
            if spec is None and self.graphs and num_tokens == n:
                sizes = self._decode_sizes()
                if n <= sizes[-1]:
                    return _GraphChoice("decode", sizes[bisect.bisect_left(sizes, n)], 1)
            q = self.verify_q
            if spec is not None and self.verify_graphs and bool((spec == q - 1).all()) \
                    and bool((q_lens == q).all()):
                b = next((b for b in sorted(self.verify_graphs) if b >= n), None)
                if b is not None:
                    return _GraphChoice("verify", b, q)
        if self.mixed_graphs and num_tokens <= self._mixed_sizes[-1]:
            t = next(t for t in self._mixed_sizes if t >= num_tokens)
            if n <= self.mixed_graph_seqs(t):
                return _GraphChoice("mixed", t, 0)
        return None

    def _decode_sizes(self) -> list[int]:
        """The decode graphs' sizes, sorted (kept while `graphs` is the same dict of as many)."""
        key = (id(self.graphs), len(self.graphs))
        if self._decode_sizes_key != key:
            self._decode_sizes_key, self._decode_sizes_list = key, sorted(self.graphs)
        return self._decode_sizes_list

    def _layout(self, q_lens: np.ndarray, starts: np.ndarray, sample_rows: Sequence[int],
                max_blocks: int, spec: np.ndarray | None = None) -> _StepLayout:
        """Where every token of the step goes: the CUDA graph (if any), padding, positions,
        query offsets and KV slots (from the block table's host mirror, already updated)."""
        n = len(q_lens)
        num_tokens = n if q_lens.base is self._ones else int(q_lens.sum())  # a view of ones: n
        choice = self._pick_graph(q_lens, sample_rows, spec, num_tokens)
        gq = 1 if choice is None else choice.q
        # a graph reads the full-width table, but the kernels read a row only up to its
        # sequence's length (a padding sequence: column 0): the copy stops at the widest row
        if choice is None:
            padded_seqs, padded_tokens = n, num_tokens
        elif choice.kind == "mixed":
            padded_seqs, padded_tokens = self.mixed_graph_seqs(choice.size), choice.size
        else:
            padded_seqs, padded_tokens = choice.size, choice.size * gq
        bs = self.block_size
        if num_tokens == n and (gq == 1 or padded_seqs == n):
            # one token per sequence, padding sequences too: the offsets are 0, 1, 2, ...
            qsl = self._arange[: padded_seqs + 1]  # read only
        else:
            qsl = np.zeros(padded_seqs + 1, dtype=np.int64)
            np.cumsum(q_lens, out=qsl[1: n + 1])
            # padding sequences: gq dummy tokens each (none for a mixed graph: its padding
            # tokens follow the last sequence and belong to none)
            qsl[n + 1:] = num_tokens + gq * self._arange[1: padded_seqs - n + 1]
        if num_tokens == n:  # one token per sequence (no request computes 0): no repeats needed
            positions, rows_at = starts, self._row_starts[:n]
        else:
            positions = np.repeat(starts - qsl[:n], q_lens) + self._arange[:num_tokens]
            rows_at = np.repeat(self._row_starts[:n], q_lens)
        # each token's block id, read from the mirror's flat rows
        slots = self._bt_host_flat[rows_at + positions // bs].astype(np.int64) * bs + positions % bs
        return _StepLayout(
            num_seqs=n, num_tokens=num_tokens, padded_seqs=padded_seqs, padded_tokens=padded_tokens,
            graph_size=None if choice is None else choice.size, graph_q=gq,
            graph_kind=None if choice is None else choice.kind,
            seq_lens=starts + q_lens, qsl=qsl, positions=positions, slots=slots,
            sample_rows=sample_rows, block_cols=max_blocks,
        )

    def _stage_host(self, layout: _StepLayout, flat_ids: list[int], spec: np.ndarray | None) -> int:
        """Write the step's ids, positions, slots, lengths and logits rows into the host
        staging set; padding tokens write nowhere and padding sequences attend to one slot.
        `spec`: drafts per sampling row (None: none), whose verify positions all get logits.
        Returns the number of logits rows."""
        n, num_tokens, padded_tokens = layout.num_seqs, layout.num_tokens, layout.padded_tokens
        h_ids, h_pos, h_slots = self._np["ids"], self._np["pos"], self._np["slots"]
        h_ids[:num_tokens] = flat_ids
        h_pos[:num_tokens] = layout.positions
        h_slots[:num_tokens] = layout.slots
        if padded_tokens > num_tokens:
            h_ids[num_tokens:padded_tokens] = 0
            h_pos[num_tokens:padded_tokens] = 0
            h_slots[num_tokens:padded_tokens] = -1
        h_sl = self._np["seq_lens"]
        h_sl[:n] = layout.seq_lens
        # dummy sequences attend to their gq (garbage) slots, causally valid, output dropped;
        # a mixed graph's dummies are empty (gq = 0)
        h_sl[n:layout.padded_seqs] = layout.graph_q
        self._np["qsl"][: layout.padded_seqs + 1] = layout.qsl
        h_li = self._np["logits_idx"]
        rows = layout.sample_rows
        ends = layout.qsl[1: n + 1] if len(rows) == n else layout.qsl[1:][rows]
        if spec is None:
            self._num_logits = len(ends)
            h_li[: len(ends)] = ends - 1
        else:
            counts = spec + 1
            self._num_logits = int(counts.sum())
            first = np.repeat(ends - counts, counts)
            h_li[: self._num_logits] = first + np.arange(self._num_logits) - np.repeat(
                np.cumsum(counts) - counts, counts)
        return self._num_logits

    def _stage_work(self, layout: _StepLayout, q_lens: np.ndarray) -> tuple[int, int] | None:
        """Plan and stage the attention's work lists of a step with prefill chunks (eager or a
        mixed graph); (decode, prefill) items, or None (no lists: the backend takes none, or a
        decode / verify graph or an eager pure-decode step, whose launches need none)."""
        if self._work_block_qs is None or layout.graph_kind in ("decode", "verify"):
            return None
        if layout.graph_kind is None and int(q_lens.max(initial=0)) <= DECODE_MAX_QUERY_LEN:
            return None
        counts = plan_work(q_lens, layout.seq_lens, self._work_block_qs, self._np["work"], self._work_cap[0])
        self._np["work_counts"][:2] = counts
        return counts

    def work_bound(self, num_tokens: int, num_seqs: int) -> tuple[int, int]:
        """The most work items a step of at most this many tokens and sequences can list."""
        return work_capacity(num_seqs, num_tokens, self._work_block_qs)

    def _work(self, items: tuple[int, int] | None, in_graph: bool = False) -> AttentionWork | None:
        """The kernels' view of the staged work lists (None when the step has none)."""
        if items is None:
            return None
        return AttentionWork(self.d_work, self.d_work_counts, self._work_cap[0], items,
                             self._work_block_qs, in_graph)

    # copies of the packed block-table rows end on a multiple of this (fewer distinct views)
    _COPY_END_QUANTUM_BYTES = 4096

    def _copy_to_device(self, layout: _StepLayout, entries: int | None) -> None:
        """ONE asynchronous copy of the staged inputs into the persistent device buffers, then
        the block table's update: the `entries` changed ones by one fixed-size index_copy_
        (none when no entry changed), or (`entries` None: too many) the step's rows packed
        in the same copy and spread on the device into the table's full-width rows (whose
        stride the CUDA graphs captured). The copy runs to the start of the packed rows, or
        to their end when they are sent. The token sections go whole (4 x 8 bytes per token
        of capacity, e.g. 64 KiB at 2048 tokens: microseconds of copy engine time, far less
        than the launches saved). The gather indices (async scheduling) travel in the same
        copy. The copy's views are kept by its end, so a steady step makes none."""
        packed_at = self._sections[-1].offset_bytes
        if entries is None:
            seqs, cols = layout.padded_seqs, layout.block_cols
            packed = self._np["bt_packed"][: seqs * cols].reshape(seqs, cols)
            np.copyto(packed, self._bt_host[:seqs, :cols])
            q = self._COPY_END_QUANTUM_BYTES
            end = min(packed_at + -(-seqs * cols * 4 // q) * q, self._sections[-1].end_bytes)
        else:
            end = packed_at
        self._last_copy = StagedCopy(end, None if entries is None else bool(entries),
                                     (seqs, cols) if entries is None else None)
        self._device_copy(self._last_copy)

    def _device_copy(self, copy: StagedCopy) -> None:
        """The copy `_copy_to_device` planned (a TP worker replays rank 0's plan on its bytes)."""
        end = copy.end_bytes
        views = self._copy_views[self._stage_idx]
        dst_src = views.get(end)
        if dst_src is None:
            if len(views) >= 64:
                views.clear()
            dst_src = views[end] = (self.d_raw[:end], self.h_raw[:end])
        dst_src[0].copy_(dst_src[1], non_blocking=True)
        if copy.packed is not None:
            seqs, cols = copy.packed
            self.d_block_tables[:seqs, :cols].copy_(self.d_bt_packed[: seqs * cols].view(seqs, cols))
        elif copy.entries:
            self.d_bt_flat.index_copy_(0, self.d_bt_idx, self.d_bt_val)

    def _stage_gather(self, tokens: _InputTokens) -> int:
        """Stage the gather lists of the decodes whose input token is still on the device:
        fixed-size lists (a captured graph reads all of them), entries past the step's own
        writing the spare token id from row 0."""
        g = len(tokens.gather_dst)
        st = self._stage_idx
        last = self._staged_gathers[st]
        if g:
            self._np["gather_dst"][:g] = tokens.gather_dst
            self._np["gather_src"][:g] = tokens.gather_src
        if last > g:
            self._np["gather_dst"][g:last] = self._ids_dummy
            self._np["gather_src"][g:last] = 0
        self._staged_gathers[st] = g
        return g

    def _gather_inflight(self, layout: _StepLayout, inflight_tokens: torch.Tensor) -> None:
        """The previous step's sampled tokens, still on the device, into this step's ids (their
        indices came with the step's one copy): the step's CUDA graph gathers them from the
        persistent sampled-token buffer, where tokens sampled elsewhere are copied first; an
        eager step gathers here."""
        n = inflight_tokens.shape[0]
        if self._sampled_views.get(n) is not inflight_tokens:
            self.sampled_tokens_out(n).copy_(inflight_tokens)
        if layout.graph_kind is None:
            self._gather()

    def _gather(self) -> None:
        """ids[dst[i]] = sampled[src[i]] over the whole fixed-size lists (captured in every
        CUDA graph; entries a step does not use write the spare id)."""
        self.d_ids_ext.index_copy_(0, self.d_gather_dst, self.d_sampled.index_select(0, self.d_gather_src))

    def _meta(self, num_tokens: int, num_seqs: int, max_query_len: int, max_seq_len: int,
              nb_cols: int, num_decode_seqs: int | None = None, work=None) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.d_slots[:num_tokens],
            block_tables=self.d_block_tables[:num_seqs, :nb_cols],
            seq_lens=self.d_seq_lens[:num_seqs],
            query_start_loc=self.d_qsl[: num_seqs + 1],
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            num_decode_seqs=num_decode_seqs,
            work=work,
        )

    # ------------------------------------------------------------------ forward
    @torch.inference_mode()
    def forward(self, inp: StepInputs) -> torch.Tensor:
        """Logits [len(sample_request_ids), vocab] (model dtype) of the requests that sample."""
        assert self.kv_caches is not None, "allocate_kv_cache() first"
        if self.tp is not None and self.tp.world_size > 1 and self.tp.is_driver:
            self._send_step(inp)
        if inp.graph_kind is not None:
            self.num_graph_replays += 1
            if inp.graph_kind == "verify":
                self.verify_graphs[inp.graph_size].replay()
                return self._verify_logits[inp.graph_size][: inp.num_logits]
            if inp.graph_kind == "decode":
                self.graphs[inp.graph_size].replay()
                return self._graph_logits[inp.graph_size][: inp.num_seqs]
            self.num_mixed_graph_replays += 1
            self.mixed_graphs[inp.graph_size].replay()
            hidden = self._mixed_hidden
        else:
            self.num_eager_forwards += 1
            t = inp.num_tokens
            meta = self._meta(t, inp.num_seqs, inp.max_query_len, inp.max_seq_len,
                              int(self._max_cols(inp)), inp.num_decode_seqs, self._work(inp.work_items))
            hidden = self.model(self.d_input_ids[:t], self.d_positions[:t], self.kv_caches, meta)
        k = inp.num_logits
        return self.model.compute_logits(hidden[self.d_logits_idx[:k]])

    def _send_step(self, inp: StepInputs) -> None:
        """Rank 0: the step to the workers (its staging bytes and copy plan, pickled over the
        control group), then, when its decodes gather in-flight tokens, the sampled-token buffer
        over the device group (so rank 0 never waits for its tokens on the host)."""
        # the workers' forward reads none of the request ids (hundreds of ints a step, pickled)
        shape = dataclasses.replace(inp, request_ids=[], sample_request_ids=[])
        self.tp.send(StepMessage(shape, self._used_chunks(inp), self._last_copy, self._last_gathers))
        if self._last_gathers:
            self.tp.broadcast(self.d_sampled)

    # per-token sections: a step sends only the entries it uses (its padded tokens, its logits rows)
    _TOKEN_SECTIONS = ("ids", "pos", "slots", "logits_idx")

    def _used_chunks(self, inp: StepInputs) -> list[tuple[int, bytes]]:
        """The staging bytes a step's kernels read: the per-sequence sections whole (small, and
        their fixed-size lists are read whole), the per-token ones up to the step's padded tokens
        or logits rows, the packed block-table rows when sent. The per-token sections' capacity
        (4 x 8 bytes a token: 256 KiB at an 8,192-token budget) is mostly unused by a decode step."""
        raw, secs = self._np["raw"], {sec.name: sec for sec in self._sections}
        first = secs[self._TOKEN_SECTIONS[0]].offset_bytes
        chunks = [(0, raw[:first].tobytes())]
        for name in self._TOKEN_SECTIONS:
            sec = secs[name]
            n = inp.num_logits if name == "logits_idx" else inp.num_padded_tokens
            chunks.append((sec.offset_bytes, raw[sec.offset_bytes: sec.offset_bytes + n * sec.dtype.itemsize].tobytes()))
        packed_at = self._sections[-1].offset_bytes
        if self._last_copy.end_bytes > packed_at:
            chunks.append((packed_at, raw[packed_at: self._last_copy.end_bytes].tobytes()))
        return chunks

    @torch.inference_mode()
    def run_step_message(self, msg: StepMessage) -> torch.Tensor:
        """A worker: rank 0's step into this rank's buffers (the bytes it uses, the same copy
        plan), its in-flight tokens from rank 0's buffer, then the same forward."""
        self._next_stage()
        raw = self._np["raw"]
        for offset, data in msg.chunks:
            raw[offset: offset + len(data)] = np.frombuffer(data, dtype=np.uint8)
        self._device_copy(msg.copy)
        if msg.gathers:
            self.tp.broadcast(self.d_sampled)
            if msg.inputs.graph_kind is None:
                self._gather()
        self._record_stage_done()
        return self.forward(msg.inputs)

    def _max_cols(self, inp: StepInputs) -> int:
        return max(1, -(-inp.max_seq_len // self.block_size))

    # Eager-step batch shapes whose attention launches differ (kernels.paged_attention.launch_kinds):
    # all decode-like, one sequence past DECODE_MAX_QUERY_LEN, and both in one batch
    _WARM_ATTENTION_Q_LENS = ((1, 1), (DECODE_MAX_QUERY_LEN + 1,), (1, DECODE_MAX_QUERY_LEN + 1))

    @mirrored
    @torch.inference_mode()
    def warm_up_attention_launches(self) -> int:
        """Launch layer 0's attention (Triton backend) on a tiny batch of each eager shape,
        unsplit and split (once per width of the split merge), through the buffers a step uses
        (the same pointers, strides and dtypes, so the same Triton specialisations). Which of
        these a replay meets depends on its sequences' lengths (split-KV comes with long
        contexts beside few sequences); compiled here, none compiles mid-replay. Returns the
        launches. A batch with a chunk launches through the work lists, as an eager step with
        chunks does (their own Triton variants)."""
        assert self.kv_caches is not None, "allocate_kv_cache() first"
        backend = self.model.backend
        if backend.name != "triton":
            return 0
        # paged_attention itself, for its num_splits override
        from kernels.paged_attention import MERGE_SPLITS_PADS, paged_attention

        split_counts = (1, 2, *(pad + 1 for pad in MERGE_SPLITS_PADS[:-1]))
        layer = self.model.layers[0]
        width = (layer.hq + 2 * layer.hkv) * layer.d
        k_cache, v_cache = self.kv_caches[0, 0], self.kv_caches[0, 1]
        launches = 0
        for q_lens in self._WARM_ATTENTION_Q_LENS:
            n, t = len(q_lens), sum(q_lens)
            seq_lens = [q + self.block_size for q in q_lens]  # a block of context each
            qsl = [0, *itertools.accumulate(q_lens)]
            self.d_seq_lens[:n].copy_(torch.tensor(seq_lens, dtype=torch.int32))
            self.d_qsl[: n + 1].copy_(torch.tensor(qsl, dtype=torch.int32))
            self.d_block_tables[:n].zero_()
            cols = -(-max(seq_lens) // self.block_size)
            qkv = torch.zeros((t, width), dtype=self.model.dtype, device=self.device)
            no_slots = torch.full((t,), -1, dtype=torch.int64, device=self.device)  # store nothing
            q = backend.rope_store_kv(qkv, torch.zeros(t, dtype=torch.int64, device=self.device),
                                      self.model.rotary.cos, self.model.rotary.sin, k_cache, v_cache,
                                      no_slots, layer.hq, layer.hkv, layer.d, layer.k_scale, layer.v_scale)
            num_decode = sum(1 for x in q_lens if x <= DECODE_MAX_QUERY_LEN)
            work = None
            if max(q_lens) > DECODE_MAX_QUERY_LEN and self._work_block_qs is not None:
                items = np.zeros(sum(self._work_cap), dtype=np.int32)
                counts = plan_work(np.array(q_lens), np.array(seq_lens), self._work_block_qs, items,
                                   self._work_cap[0])
                self.d_work.copy_(torch.from_numpy(items))
                self.d_work_counts.copy_(torch.tensor(counts, dtype=torch.int32))
                work = self._work(counts)
            for splits in split_counts:
                paged_attention(q, k_cache, v_cache, self.d_block_tables[:n, :cols], self.d_seq_lens[:n],
                                self.d_qsl[: n + 1], layer.scale, max(q_lens), max(seq_lens),
                                k_scale=layer.k_scale, v_scale=layer.v_scale, num_splits=splits,
                                prefill_splits=splits, num_decode_seqs=num_decode, work=work)
                launches += 1
        self.reset_block_tables()
        self.d_work_counts.zero_()
        return launches

    def decode_graph_sizes(self) -> list[int]:
        """Decode batch sizes that get a CUDA graph."""
        return decode_graph_buckets(self.max_num_seqs)

    @mirrored
    @torch.inference_mode()
    def capture_decode_graphs(self, sizes: list[int] | None = None,
                              progress: Callable[[int], None] | None = None) -> float:
        """Capture one CUDA graph per decode bucket (largest first, one memory pool); returns seconds.

        Captured with max_seq_len = max_model_len and the full block-table width, so any decode
        batch of at most that size can replay it.
        """
        assert self.is_cuda and self.kv_caches is not None
        t0 = time.perf_counter()
        sizes = sorted(sizes or self.decode_graph_sizes(), reverse=True)
        # Safe dummy inputs: one token per sequence at position 0, written nowhere.
        self.d_input_ids.zero_()
        self.d_positions.zero_()
        self.d_slots.fill_(-1)
        self.d_seq_lens.fill_(1)
        self.d_qsl.copy_(torch.arange(self.max_num_seqs + 1, dtype=torch.int32, device=self.device))
        self.reset_block_tables()
        # One logits buffer for every graph (graph b writes its first b rows): a buffer per graph
        # would keep sum(buckets) x vocab logits alive, 17 GB for max_num_seqs 1024 at a 128k vocab,
        # memory the KV cache was already given.
        self._logits_buf = torch.empty(max(sizes), self.spec.vocab_size, dtype=self.model.lm_head_weight.dtype,
                                       device=self.device)
        for b, (g, logits) in self._capture(sizes, lambda b: self.graph_forward(b, 1, self._logits_buf),
                                            progress).items():
            self.graphs[b] = g
            self._graph_logits[b] = logits
        return time.perf_counter() - t0

    def verify_graph_sizes(self, k: int) -> list[int]:
        """Batch sizes that get a verify graph: the decode buckets whose b x (1 + k) tokens fit
        the token buffers and vLLM's default graph capture limit of 512 tokens (the logits of
        every position are kept, b x (1 + k) x vocab; max_cudagraph_capture_size)."""
        cap = min(self.d_input_ids.shape[0], self.max_cudagraph_capture_size) // (k + 1)
        return [b for b in decode_graph_buckets(self.max_num_seqs) if b <= cap]

    def graph_forward(self, b: int, q: int, logits_out: torch.Tensor) -> torch.Tensor:
        """What a graph of `b` sequences of `q` tokens runs: the model over the persistent
        buffers, max_seq_len = max_model_len and the full block-table width (so any such batch
        can replay it), logits of every token into `logits_out`."""
        t = b * q
        self._gather()  # async scheduling's in-flight input tokens (see prepare)
        meta = self._meta(t, b, q, self.max_model_len, self.max_blocks_per_seq)
        h = self.model(self.d_input_ids[:t], self.d_positions[:t], self.kv_caches, meta)
        return self.model.compute_logits(h, out=logits_out[:t])

    @mirrored
    @torch.inference_mode()
    def capture_verify_graphs(self, k: int, progress: Callable[[int], None] | None = None) -> float:
        """One CUDA graph per verify bucket (uniform batches of decodes with k drafts each);
        returns seconds. Dummy inputs as for decode graphs, q = 1 + k tokens per sequence."""
        assert self.is_cuda and self.kv_caches is not None
        t0 = time.perf_counter()
        q = k + 1
        sizes = sorted(self.verify_graph_sizes(k), reverse=True)
        if not sizes:
            return 0.0
        self.verify_q = q
        self.verify_graphs, self._verify_logits = {}, {}  # another k's graphs are of no use
        self.d_input_ids.zero_()
        self.d_positions.zero_()
        self.d_slots.fill_(-1)
        self.d_seq_lens.fill_(q)
        self.d_qsl.copy_(q * torch.arange(self.max_num_seqs + 1, dtype=torch.int32, device=self.device))
        self.reset_block_tables()
        buf = torch.empty(max(sizes) * q, self.spec.vocab_size, dtype=self.model.lm_head_weight.dtype,
                          device=self.device)
        for b, (g, logits) in self._capture(sizes, lambda b: self.graph_forward(b, q, buf), progress).items():
            self.verify_graphs[b] = g
            self._verify_logits[b] = logits
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ mixed graphs
    def mixed_graph_sizes(self) -> list[int]:
        """Token buckets that get a mixed graph (`mixed_graph_buckets`), up to the capture
        limit and the token budget."""
        return mixed_graph_buckets(min(self.max_cudagraph_capture_size, self.max_num_batched_tokens))

    def mixed_graph_seqs(self, num_tokens: int) -> int:
        """Sequences of the mixed graph of `num_tokens` tokens: every step that fits it has at
        most that many (each computes a token or more), and never more than max_num_seqs."""
        return min(self.max_num_seqs, num_tokens)

    def mixed_graph_forward(self, num_tokens: int) -> torch.Tensor:
        """What the mixed graph of `num_tokens` tokens runs: the model over the persistent
        buffers with the graph's fixed sequence count, max_query_len = its token count,
        max_seq_len = max_model_len and the full block-table width (so any step that fits can
        replay it; the kernel plans both its launches, not knowing the batch's kinds), hidden
        states copied into the persistent buffer the eager LM head reads."""
        t, s = num_tokens, self.mixed_graph_seqs(num_tokens)
        self._gather()  # async scheduling's in-flight input tokens (see prepare)
        work = None if self._work_block_qs is None else self._work(self.work_bound(t, s), in_graph=True)
        meta = self._meta(t, s, t, self.max_model_len, self.max_blocks_per_seq, work=work)
        h = self.model(self.d_input_ids[:t], self.d_positions[:t], self.kv_caches, meta)
        return self._mixed_hidden[:t].copy_(h)

    def use_mixed_graphs(self, graphs: dict[int, torch.cuda.CUDAGraph]) -> None:
        """Register mixed graphs by token bucket (the capture does; CPU tests pass stand-ins)."""
        self.mixed_graphs = graphs
        self._mixed_sizes = sorted(graphs)
        if self._mixed_hidden.shape[0] < max(graphs, default=0):
            self._mixed_hidden = torch.empty(max(graphs), self.spec.hidden_size, dtype=self.model.dtype,
                                             device=self.device)

    @mirrored
    @torch.inference_mode()
    def capture_mixed_graphs(self, progress: Callable[[int], None] | None = None) -> float:
        """One CUDA graph per mixed token bucket (largest first, one memory pool); returns
        seconds. Captured over empty sequences (nothing attended, nothing written)."""
        assert self.is_cuda and self.kv_caches is not None
        t0 = time.perf_counter()
        sizes = sorted(self.mixed_graph_sizes(), reverse=True)
        self.use_mixed_graphs({})
        self._mixed_hidden = torch.empty(max(sizes), self.spec.hidden_size, dtype=self.model.dtype,
                                         device=self.device)
        self.d_input_ids.zero_()
        self.d_positions.zero_()
        self.d_slots.fill_(-1)
        self.d_seq_lens.zero_()
        self.d_qsl.zero_()
        self.d_work_counts.zero_()  # no work listed: the captured launches attend nothing
        captured = self._capture(sizes, self.mixed_graph_forward, progress)
        self.use_mixed_graphs({t: g for t, (g, _) in captured.items()})
        return time.perf_counter() - t0

    def _capture(self, sizes: list[int], forward: Callable[[int], Any], progress: Callable[[int], None] | None = None
                 ) -> dict[int, tuple[torch.cuda.CUDAGraph, Any]]:
        """One CUDA graph of `forward(n)` per size, in the order given (largest first: one
        memory pool serves the smaller ones): each run twice on a side stream first (Triton
        compiles there), then captured; (graph, the captured call's output) by size.
        `progress(done)` is told after each graph."""
        captured: dict[int, tuple[torch.cuda.CUDAGraph, Any]] = {}
        pool = None
        stream = torch.cuda.Stream(self.device)
        for n in sizes:
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    forward(n)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = forward(n)
            pool = g.pool()
            self.num_graph_captures += 1
            captured[n] = (g, out)
            if progress is not None:
                progress(len(captured))
        torch.cuda.synchronize(self.device)
        return captured


def _step_inputs(rids: Sequence[int], sample_ids: list[int], layout: _StepLayout, q_lens: np.ndarray, one_each: bool,
                 num_logits: int, work_items: tuple[int, int] | None) -> StepInputs:
    """What `prepare` staged, as the forward reads it (shapes, graph choice, counts)."""
    n = len(rids)
    return StepInputs(
        request_ids=list(rids), sample_request_ids=sample_ids,
        num_tokens=layout.num_tokens, num_padded_tokens=layout.padded_tokens,
        graph_size=layout.graph_size, graph_q=layout.graph_q, graph_kind=layout.graph_kind,
        num_decode_seqs=n if one_each else int(np.count_nonzero(q_lens <= DECODE_MAX_QUERY_LEN)),
        max_query_len=(1 if one_each else int(q_lens.max())) if n else 0,
        max_seq_len=int(layout.seq_lens.max()) if n else 0, num_seqs=n, num_logits=num_logits,
        work_items=work_items,
    )
