"""The engine loop: scheduler -> input preparation -> forward -> sampling -> scheduler update.

`EngineCore.step()` runs one iteration and returns what it produced plus one `StepRecord`
(engine/core/records.py: the step table's columns, shared with the simulator). Scheduling decisions are the shared `Scheduler`'s,
unchanged; this module only executes them and keeps each request's tokens and timestamps.

With `speculative_config` the step runs synchronously: schedule (1 + k slots per decode) ->
the proposer (draft model forwards, EAGLE-3 head steps, or the n-gram drafts found after the
previous step) -> one target forward verifying every draft -> accepted tokens (-> the EAGLE-3
head's catch-up over the step's positions) -> the scheduler rolls back the rejected drafts' slots.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.core.config import EngineArgs, scheduler_config
from engine.core.flags import FlagError
from engine.core.model_spec import ModelSpec, get_model
from engine.core.records import StepRecord, step_composition
from engine.core.request import FIRST_CONTENT_TOKEN_ID, Request
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import RequestResult, SchedulerOutput
from engine.model import TORCH_DTYPES, LlamaModel
from engine.runner import ModelRunner
from engine.sampling import Sampler, SamplingParams
from engine.spec_decode.eagle import EagleHead, EagleProposer
from engine.spec_decode.proposers import DraftModelProposer, NgramProposer, Proposal, WithDrafts
from engine.startup import StartupLog, log_progress, process_age_s
from engine.tensor_parallel import TPGroup, check_tp_shape
from engine.tp_worker import (
    SHARE_DEVICE_ENV,
    BuildWorker,
    rank_device,
    register_shutdown,
    sharing_device,
    start_workers,
    stop_workers,
)
from kernels import compiled_kernel_count


@dataclass
class RequestState:
    """What the engine tracks for one request (the scheduler keeps the scheduling state)."""

    request: Request
    params: SamplingParams
    token_ids: list[int]  # prompt, then generated tokens
    num_prompt_tokens: int
    arrival_s: float  # engine clock
    first_scheduled_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    finished_s: float | None = None
    status: str = "running"
    finish_reason: str | None = None  # "length", "stop", or the rejection reason
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    stop_len: int | None = None  # len(token_ids) when a stop token was sampled
    # speculative decoding, vLLM's counters per request
    num_spec_drafts: int = 0  # decode steps that verified drafts
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    stop_ids: frozenset[int] = frozenset()  # tokens that end it: EOS unless ignore_eos, its stop ids

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens: self.stop_len]


@dataclass
class StepResult:
    new_tokens: dict[int, list[int]]
    finished: list[RequestState]
    trace: StepRecord | None  # None when nothing was scheduled
    # host seconds to enqueue the traced step's forward (async: and its sampling): an eager
    # forward that takes about its GPU time to launch is launch-bound, so host stalls show as GPU time
    launch_s: float = math.nan


@dataclass
class _Pending:
    """A launched step whose sampled tokens are not yet on the host (async scheduling)."""

    out: object  # SchedulerOutput
    sample_ids: list[int]  # row i of the sampled tokens is sample_ids[i]'s
    tokens_dev: torch.Tensor | None
    tokens_host: torch.Tensor | None
    done: object  # torch.cuda.Event or None
    events: tuple | None
    t0: float
    schedule_s: float
    prepare_s: float
    launch_s: float
    finished: list = field(default_factory=list)  # RequestResults waiting for these tokens


# Warm-up requests: ids far above any workload's, a few output tokens (decode steps of each size)
WARM_UP_REQUEST_ID_BASE = 1 << 62
WARM_UP_OUTPUT_TOKENS = 3


@dataclass(frozen=True, slots=True)
class WarmUpReport:
    seconds: float
    num_requests: int
    num_steps: int
    kernels_compiled: int  # Triton variants compiled during the warm-up


def warm_up_prompt_lens(max_num_batched_tokens: int, max_model_len: int) -> list[int]:
    """Prompt lengths whose steps reach every kernel specialisation a replay can (see warm_up):
    lengths = 1 and around multiples of 16, up to twice the token budget (chunked over steps
    that sample nothing), each short enough to leave room for the warm-up's output tokens."""
    b = max_num_batched_tokens
    wanted = [1, 2, 15, 16, 17, 31, 100, 128, 255, 512, 1000, 2053, b - 1, b, b + 1, 2 * b + 5]
    cap = max_model_len - WARM_UP_OUTPUT_TOKENS
    return sorted({n for n in wanted if 1 <= n <= cap})


def content_hash_ids(token_ids: Sequence[int], block: int = 16) -> tuple[int, ...]:
    """Chained hash ids of `block`-token chunks, so equal token prefixes get equal leading ids."""
    out, prev = [], 0
    for i in range(0, len(token_ids), block):
        prev = hash((prev, tuple(token_ids[i: i + block]))) & 0x7FFF_FFFF_FFFF_FFFF
        out.append(prev)
    return tuple(out)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_model(config: EngineArgs, device: torch.device, max_model_len: int | None = None,
                tp: TPGroup | None = None, spec: ModelSpec | None = None) -> LlamaModel:
    """A preset with seeded random weights, or a checkpoint directory (FP8 weights with
    `quantization="fp8"`, engine/quant.py); under tensor parallelism (`tp`) this rank's shard.
    `spec`: the architecture to build instead of the preset's (a TP worker gets rank 0's)."""
    path = Path(config.model)
    dtype = None if config.dtype == "auto" else TORCH_DTYPES[config.dtype]
    backend = config.attention_backend
    if backend == "auto":
        backend = "triton" if device.type == "cuda" else "torch"
    if path.is_dir():
        from engine.loader import load_model

        model = load_model(path, device=device, dtype=dtype, attention_backend=backend,
                           max_positions=max_model_len, tp=tp)
    else:
        spec = spec or get_model(config.model)
        model = LlamaModel(spec, max_positions=max_model_len or spec.max_position_embeddings, device=device,
                           dtype=dtype, attention_backend=backend, seed=config.seed, tp=tp)
    if config.quantization == "fp8":
        from engine.quant import quantize_fp8

        quantize_fp8(model)
    return model


def make_runner(model: LlamaModel, config: EngineArgs, max_model_len: int) -> ModelRunner:
    """The runner of a resolved config (every tensor-parallel rank builds the same one)."""
    return ModelRunner(
        model, block_size=config.block_size, max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=max_model_len,
        kv_cache_dtype=config.kv_cache_dtype, max_cudagraph_capture_size=config.max_cudagraph_capture_size)


def check_tp_config(config: EngineArgs, device: torch.device, given_model: bool) -> None:
    """What tensor parallelism (--tensor-parallel-size > 1) runs with, checked before any spawn."""
    tp = config.tensor_parallel_size
    if tp == 1:
        return
    fix = "; run it with --tensor-parallel-size 1"
    if not given_model:  # the shape is checked before any worker is spawned
        path = Path(config.model)
        if path.is_dir():
            from engine.hf_config import spec_of_folder

            check_tp_shape(spec_of_folder(path), tp)
        else:
            check_tp_shape(get_model(config.model), tp)
    if config.speculative_config is not None:
        raise FlagError("tensor_parallel_size", tp, "does not run with --speculative-config yet" + fix)
    if given_model:
        raise FlagError("tensor_parallel_size", tp, "needs the engine to build its model (every rank builds "
                        "its shard): pass a preset or checkpoint name, not a model object" + fix)
    if device.type == "cuda" and sharing_device():  # test hook: gloo on one GPU, which no graph captures
        if not config.enforce_eager and config.cudagraph_mode != "NONE":
            raise FlagError("tensor_parallel_size", tp, f"with {SHARE_DEVICE_ENV}=1 (ranks sharing one GPU over "
                            "gloo) runs eagerly; add --enforce-eager")
    elif device.type == "cuda":
        have = torch.cuda.device_count() - (device.index or 0)
        if have < tp:
            raise FlagError("tensor_parallel_size", tp, f"needs {tp} GPUs but {have} are visible from {device}; "
                            "lower {tensor_parallel_size}")


def device_facts(device: torch.device) -> tuple[str, float]:
    """(name, total memory in bytes) of `device`: what vLLM's batch defaults depend on."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.name, float(props.total_memory)
    return device.type, 0.0


def build_draft_model(config: EngineArgs, device: torch.device, max_model_len: int) -> LlamaModel:
    """The draft of `speculative_config.model`: a checkpoint directory or a preset (seeded
    random weights with the engine's seed, like the target's)."""
    assert config.speculative_config is not None and config.speculative_config.model
    # the draft keeps its own precision (vLLM applies --quantization to the target only)
    return build_model(config.model_copy(update={"model": config.speculative_config.model, "quantization": None}),
                       device, max_model_len)


def check_draft(draft: LlamaModel, target: LlamaModel, max_model_len: int) -> None:
    if draft.spec.vocab_size != target.spec.vocab_size:
        raise ValueError(f"--speculative-config: the draft model's vocabulary ({draft.spec.vocab_size} tokens) "
                         f"differs from the target's ({target.spec.vocab_size}); use a draft with the "
                         "target's tokenizer")
    if draft.rotary.cos.shape[0] < max_model_len:
        raise ValueError(f"--speculative-config: the draft model covers {draft.rotary.cos.shape[0]} positions, "
                         f"fewer than max_model_len {max_model_len}; lower --max-model-len")


class EngineCore:
    def __init__(self, config: EngineArgs, model: LlamaModel | None = None,
                 eos_token_ids: tuple[int, ...] = (), draft_model: LlamaModel | EagleHead | None = None,
                 progress: Callable[[str], None] = log_progress, tp: TPGroup | None = None) -> None:
        """`progress` hears each start-up phase as it ends (and a long capture's progress).
        `tp`: a tensor-parallel group this process already joined as rank 0 (benchmarks: a
        world of one rank through the TP code path); without it, --tensor-parallel-size > 1
        spawns the workers here."""
        self.startup = StartupLog(progress)
        self.ready_s: float | None = None  # process start -> first request accepted
        self.device = resolve_device(config.device)
        check_tp_config(config, self.device, model is not None)
        self._join_tensor_parallel(config, tp)
        if model is None:
            with self.startup.phase("model") as detail:
                model = build_model(config, self.device, config.max_model_len, tp=self.tp)
                detail.append(f"{model.spec.name}, {model.dtype}")
        self.model = model
        self.spec = model.spec
        name, memory_bytes = device_facts(self.device)
        config = config.resolved(device_name=name, device_memory_bytes=memory_bytes,
                                 max_position_embeddings=model.rotary.cos.shape[0],
                                 moe=model.spec.num_experts > 0)
        self.config = self._built_config = config
        self.max_model_len = config.max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.async_scheduling = config.async_scheduling
        if self.tp is not None and self.tp.world_size > 1:  # the workers build the same shard and runner
            self.tp.send(BuildWorker(config, self.max_model_len, model.spec))
        self.runner = make_runner(model, config, self.max_model_len)
        self._init_speculation(config, draft_model)
        self._allocate_kv_cache(config)
        self.graph_capture_s = 0.0
        graphs = not config.enforce_eager and config.cudagraph_mode != "NONE"
        if self.runner.is_cuda and graphs and model.backend.name == "triton":
            self.graph_capture_s = self._capture_graphs(config)
        self.scheduler = Scheduler(scheduler_config(config, num_gpu_blocks=self.num_gpu_blocks,
                                                    max_model_len=self.max_model_len,
                                                    num_speculative_tokens=self.spec_k))
        self._init_step_state(config)

    def _join_tensor_parallel(self, config: EngineArgs, tp: TPGroup | None) -> None:
        """Use the given tensor-parallel group, or spawn the workers of --tensor-parallel-size > 1."""
        self.tp: TPGroup | None = tp
        self._tp_procs: list = []
        if tp is not None and tp.world_size != config.tensor_parallel_size:
            raise FlagError("tensor_parallel_size", config.tensor_parallel_size,
                            f"differs from the given group's {tp.world_size} ranks; make them equal")
        if tp is None and config.tensor_parallel_size > 1:
            with self.startup.phase("tensor-parallel workers") as detail:
                self.device = rank_device(self.device, 0)
                self.tp, self._tp_procs = start_workers(config.tensor_parallel_size, self.device)
                register_shutdown(self.tp, self._tp_procs)
                detail.append(f"{config.tensor_parallel_size} ranks")

    def _allocate_kv_cache(self, config: EngineArgs) -> None:
        """The KV pool (and the draft's KV of as many blocks), a start-up phase."""
        with self.startup.phase("KV cache") as detail:
            self.num_gpu_blocks = self.runner.allocate_kv_cache(
                gpu_memory_utilization=config.gpu_memory_utilization,
                num_gpu_blocks_override=config.num_gpu_blocks_override,
                cpu_kv_cache_bytes=config.cpu_kv_cache_bytes)
            proposer = self.drafter or self.eagle
            if proposer is not None:
                proposer.allocate_kv(self.num_gpu_blocks)
                self.runner.memory_report |= {"draft_weights_bytes": proposer.weights_bytes(),
                                              "draft_kv_bytes_per_block": self.runner.draft_block_bytes}
            detail.append(f"{self.num_gpu_blocks:,} blocks of {config.block_size} tokens")

    def _init_step_state(self, config: EngineArgs) -> None:
        """The sampler, the request table, step timing and the host buffers of sampled tokens."""
        self.sampler = Sampler(self.device, default_seed=config.seed)
        self.requests: dict[int, RequestState] = {}
        # each unfinished request's token list (RequestState.token_ids), what runner.prepare reads
        self._token_ids: dict[int, list[int]] = {}
        self.epoch = time.perf_counter()
        # Step timing events: CUDA events on a GPU (tests inject a stand-in with the same contract)
        self._use_events = self.runner.is_cuda
        self._new_event = lambda: torch.cuda.Event(enable_timing=True)
        self._pending: _Pending | None = None
        self._stopped_ids: list[int] = []  # async: stopped by tokens collected, not yet ended
        b = config.max_num_seqs
        self._token_bufs = [torch.zeros(b, dtype=torch.int64, pin_memory=self.runner.is_cuda)
                            for _ in range(2)]
        self._token_buf_idx = 0

    def close(self) -> None:
        """Stop the tensor-parallel workers (nothing to do on one GPU); safe to call twice."""
        if self._tp_procs:
            stop_workers(self.tp, self._tp_procs)
            self._tp_procs = []

    def _capture_graphs(self, config: EngineArgs) -> float:
        """Every CUDA graph the engine replays, each kind a start-up phase; returns seconds."""
        runner, drafter, eagle = self.runner, self.drafter, self.eagle
        kinds = [("decode graphs", runner.decode_graph_sizes(), runner.capture_decode_graphs, ())]
        if config.cudagraph_mode == "FULL":
            kinds.append(("mixed graphs", runner.mixed_graph_sizes(), runner.capture_mixed_graphs, ()))
        if drafter is not None:  # the draft's single-token forwards are pure decodes; its
            # catch-up of a decode batch is uniform two-token (proposers._two_token_catch_up)
            kinds += [("draft decode graphs", drafter.runner.decode_graph_sizes(),
                       drafter.runner.capture_decode_graphs, ()),
                      ("draft verify graphs", drafter.runner.verify_graph_sizes(1),
                       drafter.runner.capture_verify_graphs, (1,))]
        if eagle is not None:  # the head's draft steps are pure decodes; its catch-up after a
            # uniform verify step is a uniform verify-shaped batch of 1 + k tokens per request
            kinds += [("eagle3 decode graphs", eagle.runner.decode_graph_sizes(),
                       eagle.runner.capture_decode_graphs, ()),
                      ("eagle3 catch-up graphs", eagle.runner.verify_graph_sizes(self.spec_k),
                       eagle.runner.capture_verify_graphs, (self.spec_k,))]
        if self.spec_k:
            kinds.append(("verify graphs", runner.verify_graph_sizes(self.spec_k), runner.capture_verify_graphs,
                          (self.spec_k,)))
        seconds = 0.0
        for name, sizes, capture, args in kinds:
            with self.startup.phase(name) as detail:
                seconds += capture(*args, progress=self.startup.counter(name, len(sizes)))
                detail.append(f"{len(sizes)} graphs" + (f", {min(sizes)}-{max(sizes)}" if sizes else ""))
        return seconds

    def _init_speculation(self, config: EngineArgs, draft_model: LlamaModel | None) -> None:
        """The proposer of `speculative_config`; a draft model's weights are loaded and its KV
        per block counted before the KV pool is sized."""
        sc = config.speculative_config
        self.spec_k = config.num_speculative_tokens
        self.ngram = NgramProposer(sc.lookup_min, sc.lookup_max) if sc and sc.method == "ngram" else None
        self._ngram_drafts: dict[int, list[int]] = {}
        self.drafter: DraftModelProposer | None = None
        self.eagle: EagleProposer | None = None
        self._catch_up_events = None  # the last EAGLE-3 catch-up's CUDA events, read a step later
        if sc is not None and sc.method == "eagle3":
            self._init_eagle(config, draft_model)
            return
        if sc is None or sc.method != "draft_model":
            return
        if draft_model is None:
            draft_model = build_draft_model(config, self.device, self.max_model_len)
        check_draft(draft_model, self.model, self.max_model_len)
        self.drafter = DraftModelProposer(draft_model, block_size=config.block_size,
                                          max_num_seqs=config.max_num_seqs,
                                          max_num_batched_tokens=config.max_num_batched_tokens,
                                          max_model_len=self.max_model_len)
        self.runner.draft_block_bytes = self.drafter.runner.block_bytes()

    def _init_eagle(self, config: EngineArgs, head: LlamaModel | EagleHead | None) -> None:
        """The EAGLE-3 head of `speculative_config.model` (a head directory; another name: a
        seeded random head), or the one given; the target keeps its aux hidden states."""
        from engine.spec_decode.eagle import is_head_dir, load_head, random_head

        sc = config.speculative_config
        assert sc is not None and sc.model
        if head is None:
            head = (load_head(sc.model, self.model) if is_head_dir(sc.model)
                    else random_head(self.model, config.seed))
        if not isinstance(head, EagleHead) or head.target is not self.model:
            raise ValueError("--speculative-config: method eagle3 needs an EAGLE-3 head built on this target "
                             "(engine.spec_decode.eagle.EagleHead), not a draft model")
        self.eagle = EagleProposer(head, block_size=config.block_size, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   max_model_len=self.max_model_len,
                                   target_max_tokens=self.runner.d_input_ids.shape[0])
        self.runner.draft_block_bytes = self.eagle.runner.block_bytes()

    def _switch_speculation(self, cfg: EngineArgs) -> None:
        """start_over with another n-gram speculation (or none): nothing to load, and the verify
        graphs of a new k are captured now. A draft model sizes the KV pool: it is fixed at build."""
        sc, built = cfg.speculative_config, self._built_config.speculative_config
        if self.drafter is not None or self.eagle is not None or (sc is not None and sc.method != "ngram"):
            if sc != built:
                raise ValueError("start_over cannot change a draft model's speculative_config: build a new engine; "
                                 "it switches only n-gram speculation on and off")
            return
        self._init_speculation(cfg, None)
        graphs = not cfg.enforce_eager and cfg.cudagraph_mode != "NONE"
        if self.spec_k and self.runner.is_cuda and graphs and self.model.backend.name == "triton" \
                and self.runner.verify_q != self.spec_k + 1:
            with self.startup.phase("verify graphs") as detail:
                sizes = self.runner.verify_graph_sizes(self.spec_k)
                self.graph_capture_s += self.runner.capture_verify_graphs(self.spec_k)
                detail.append(f"{len(sizes)} graphs for k={self.spec_k}")

    def now(self) -> float:
        """Seconds on the engine clock (since construction or `reset_clock`)."""
        return time.perf_counter() - self.epoch

    def reset_clock(self) -> None:
        self.epoch = time.perf_counter()

    # ------------------------------------------------------------------ warm-up
    def warm_up(self) -> WarmUpReport:
        """Run throwaway requests through the real step path, then start over with an empty
        scheduler, so no measured request pays kernel compilation.

        Triton compiles one variant per specialisation (integer arguments equal to 1 or divisible
        by 16, the decode vs prefill tile shape, split-KV or not), and eager steps reach many of
        them; CUDA graphs only cover decode-only batches. The prompt lengths below hit each kind
        of step a replay can produce: one and several sequences, chunks of 1 token up to the
        token budget, prompts longer than the budget (steps that sample nothing), a cached prefix.
        """
        t0 = time.perf_counter()
        compiled0 = compiled_kernel_count()
        lens = warm_up_prompt_lens(self.config.max_num_batched_tokens, self.max_model_len)
        rng = torch.Generator().manual_seed(0)

        def fresh_prompts() -> list[list[int]]:
            return [torch.randint(FIRST_CONTENT_TOKEN_ID, self.spec.vocab_size, (n,), generator=rng).tolist()
                    for n in lens]

        # Each wave gets prompts of its own: a wave reusing the last one's prompts would hit the
        # prefix cache and compute only their tails, and single-sequence prefills (one launch
        # over all sequences with the prefill tiles) would first compile mid-replay (H200: a
        # 1.1 s first step in the disaggregated runs and the calibration sweeps)
        together, alone = fresh_prompts(), fresh_prompts()
        ids = itertools.count(WARM_UP_REQUEST_ID_BASE)
        steps = 0
        with self.startup.phase("warm-up batches") as detail:
            # together (mixed batches), one by one, then the longest again (a cache hit)
            waves = [together] + [[p] for p in alone] + [[alone[-1]]]
            told = self.startup.counter("warm-up batches", len(waves) + 2)
            for i, wave in enumerate(waves):
                for prompt in wave:
                    self._add_warm_request(next(ids), prompt)
                steps += self._drain()
                told(i + 1)
            # short chunks beside running decodes (1 and 7 of them): eager steps of few tokens
            short = [p for p in fresh_prompts() if len(p) <= 128]
            for num_decoding in (1, 7):
                for k in range(num_decoding):
                    self._add_warm_request(next(ids), short[0] * 16, output_len=2 * WARM_UP_OUTPUT_TOKENS + k)
                steps += self._drain(max_steps=2)
                for p in short:
                    self._add_warm_request(next(ids), p)
                steps += self._drain()
            num_requests = next(ids) - WARM_UP_REQUEST_ID_BASE
            detail.append(f"{num_requests} requests, {steps} steps, prompts up to {max(lens)} tokens")
        # every attention launch an eager step can make, split or not (which of them a replay
        # meets depends on its batches' lengths)
        with self.startup.phase("attention launches") as detail:
            detail.append(f"{self.runner.warm_up_attention_launches()} launches")
            if self.runner.is_cuda:
                torch.cuda.synchronize(self.device)
        self.start_over()
        return WarmUpReport(seconds=time.perf_counter() - t0, num_requests=num_requests,
                            num_steps=steps, kernels_compiled=compiled_kernel_count() - compiled0)

    def _add_warm_request(self, request_id: int, prompt: list[int], output_len: int = WARM_UP_OUTPUT_TOKENS) -> None:
        req = Request(request_id=request_id, arrival_s=0.0, prompt_len=len(prompt),
                      output_len=output_len, hash_ids=tuple(range(-(-len(prompt) // 16))))
        self.add_request(req, SamplingParams(max_tokens=output_len, ignore_eos=True), prompt, arrival_s=0.0)

    def _drain(self, max_steps: int | None = None) -> int:
        """Step until nothing is left (or `max_steps` steps); returns the steps taken."""
        n = 0
        while self.has_unfinished() and (max_steps is None or n < max_steps):
            self.step()
            n += 1
        return n

    # scheduling flags start_over may change: they size nothing the runner allocated
    RESTART_FLAGS = frozenset({"max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks_override",
                               "enable_prefix_caching", "enable_chunked_prefill", "async_scheduling",
                               "long_prefill_token_threshold", "max_num_partial_prefills"})

    def start_over(self, **scheduling_flags) -> None:
        """Forget every request and cached block (a fresh scheduler over the same KV memory): a
        replay after the warm-up starts from the state the simulator assumes.

        `scheduling_flags` (RESTART_FLAGS) restart it with other scheduling flags than those it
        was built with (earlier restarts' flags do not carry over), without a new
        model or KV allocation: batch limits at most those the runner was sized for, and at most
        the allocated KV blocks (a smaller pool leaves the rest of the KV memory unused).
        """
        bad = set(scheduling_flags) - self.RESTART_FLAGS - {"speculative_config"}
        if bad:
            raise ValueError(f"start_over cannot change {sorted(bad)}: they size the runner; build a new engine")
        flags = dict(scheduling_flags)
        spec = flags.pop("speculative_config", self._built_config.speculative_config)
        cfg = self._built_config.model_copy(update=flags)  # flags of earlier restarts do not stick
        if spec != self._built_config.speculative_config:
            cfg = EngineArgs.model_validate(cfg.model_dump() | {"speculative_config": spec})
        if cfg.speculative_config != self.config.speculative_config:
            self._switch_speculation(cfg)
        cfg = cfg.with_effective_async()
        for name, cap in (("max_num_seqs", self.runner.max_num_seqs),
                          ("max_num_batched_tokens", self.runner.max_num_batched_tokens),
                          ("num_gpu_blocks_override", self.runner.num_blocks)):
            v = getattr(cfg, name)
            if v is not None and v > cap:
                raise ValueError(f"start_over: {name}={v} exceeds the {cap} the engine was built with")
        self.config = cfg
        self.async_scheduling = cfg.async_scheduling
        self.num_gpu_blocks = num_blocks = cfg.num_gpu_blocks_override or self.runner.num_blocks
        self.scheduler = Scheduler(scheduler_config(cfg, num_gpu_blocks=num_blocks,
                                                    max_model_len=self.max_model_len,
                                                    num_speculative_tokens=self.spec_k))
        self._ngram_drafts.clear()
        if self.drafter is not None:
            self.drafter.reset()
        if self.eagle is not None:
            self.eagle.reset()
            self._catch_up_events = None
        self.requests.clear()
        self._token_ids.clear()
        self._pending = None
        self._stopped_ids = []
        self.reset_clock()

    # ------------------------------------------------------------------ requests
    def add_request(self, request: Request, params: SamplingParams, prompt_token_ids: list[int],
                    arrival_s: float | None = None, *, num_external_computed_tokens: int = 0,
                    hold_blocks_on_finish: bool = False) -> None:
        """The last two keywords are the scheduler's disaggregated-prefill hooks (engine/disagg/)."""
        disagg = {"num_external_computed_tokens": num_external_computed_tokens,
                  "hold_blocks_on_finish": hold_blocks_on_finish}
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id} was already added")
        if self.ready_s is None and request.request_id < WARM_UP_REQUEST_ID_BASE:
            self.ready_s = process_age_s()
        st = RequestState(request=request, params=params, token_ids=list(prompt_token_ids),
                          num_prompt_tokens=len(prompt_token_ids),
                          arrival_s=self.now() if arrival_s is None else arrival_s,
                          stop_ids=frozenset(params.stop_token_ids).union(
                              () if params.ignore_eos else self.eos_token_ids))
        self.requests[request.request_id] = st
        self._token_ids[request.request_id] = st.token_ids
        self.sampler.add_request(request.request_id, params)
        if self.async_scheduling:
            # The scheduler is told token counts, not ids (they are still on the GPU when it
            # runs), so it keys the prefix cache by content hash ids of the prompt instead.
            bs = self.config.block_size  # hash at KV-block granularity: every full block can hit
            request = dataclasses.replace(
                request, prompt_token_ids=None, hash_block_size=bs,
                hash_ids=content_hash_ids(prompt_token_ids, bs))
            self.scheduler.add_request(request, **disagg)
        else:
            self.scheduler.add_request(request, prompt_token_ids=list(prompt_token_ids), **disagg)

    def abort_requests(self, request_ids: Sequence[int]) -> list[RequestState]:
        """End unfinished requests now (a replay cut off): blocks freed, sampler state dropped."""
        return [self._end_request(res) for res in self.scheduler.finish_requests(list(request_ids), "abort")]

    def forget(self, request_ids: Sequence[int]) -> None:
        """Drop ended requests' states here and in the scheduler (a server's memory stays flat).
        Under async scheduling the step in flight when a request ended may still carry a token
        for it: call this only after the next step() has returned."""
        ended = [rid for rid in request_ids
                 if (st := self.requests.get(rid)) is not None and st.finished_s is not None]
        for rid in ended:
            del self.requests[rid]
        self.scheduler.forget_finished(ended)

    def release_held(self, request_id: int) -> int:
        """Free the KV blocks a finished `hold_blocks_on_finish` request kept (its transfer is done)."""
        return self.scheduler.release_held(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._pending is not None

    # ------------------------------------------------------------------ one step
    def step(self) -> StepResult:
        return self._step_async() if self.async_scheduling else self._step_sync()

    def _step_sync(self) -> StepResult:
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        t1 = time.perf_counter()
        if not out.num_scheduled:
            return StepResult({}, self._finish_unscheduled(out), None)
        self._note_first_scheduled(out, t1 - self.epoch)
        verify = bool(out.num_spec_tokens)
        proposals, propose_s = self._propose(out, verify)
        cols = out.columns()
        inp = self.runner.prepare(cols, self._input_token_ids(out, cols, proposals, verify), verify=verify)
        t2 = time.perf_counter()
        ev0 = ev1 = None
        if self._use_events:
            ev0, ev1 = self._new_event(), self._new_event()
            ev0.record()
        logits = self.runner.forward(inp)
        if self._use_events:
            ev1.record()
        t3 = time.perf_counter()
        sample_ids = inp.sample_request_ids
        if verify:
            spec = {s.request_id: s.num_spec_tokens for s in out.scheduled if s.num_spec_tokens}
            kept = self._verify(spec, logits, sample_ids, proposals)
            t4 = time.perf_counter()
            sampled, stopped = self._record_kept(spec, sample_ids, kept, t4 - self.epoch)
        else:
            sampled, stopped, t4 = self.sample_step(logits, sample_ids)
        num_visible = sum(map(len, sampled.values())) if verify else len(sampled)
        if self.eagle is not None:  # before the scheduler frees the rejected drafts' slots
            propose_s += self._eagle_catch_up(out, inp.num_tokens, sampled)
        finished = [self._end_request(res)
                    for res in self.scheduler.update_from_output(out, sampled, stopped=stopped)]
        if self.ngram is not None:
            propose_s += self._propose_ngram(sampled)
        t5 = time.perf_counter()
        forward_s, sample_s = self._forward_and_sample_s(ev0, ev1, t2, t3, t4)
        # the proposer's time (draft forwards, n-gram lookups) is its own column, not host prep
        prepare_s = max(0.0, t2 - t1 + (t5 - t4) - propose_s)
        trace = self._step_record(out, t0, t1 - t0, prepare_s, forward_s, sample_s, t5 - t0, num_visible)
        if self.spec_k:
            _add_spec_columns(trace, propose_s, num_visible - len(sampled), out.num_spec_tokens)
        return StepResult(sampled, finished, trace, launch_s=t3 - t2)

    def _propose(self, out: SchedulerOutput, verify: bool) -> tuple[dict[int, Proposal], float]:
        """The drafts this step verifies (draft model, EAGLE-3 head, or the last step's n-gram
        lookups) and the seconds the proposer took."""
        proposals: dict[int, Proposal] = {}
        propose_s = 0.0
        if self.drafter is not None:
            proposals, propose_s = self._propose_draft(out)
        elif self.eagle is not None:
            proposals, propose_s = self._propose_eagle(out)
        elif verify:
            proposals = {rid: Proposal(d) for rid, d in self._ngram_drafts.items()}
        return proposals, propose_s

    def _forward_and_sample_s(self, ev0: Any, ev1: Any, t2: float, t3: float, t4: float) -> tuple[float, float]:
        """(forward, sampling) seconds of a synchronous step: GPU time from the CUDA events, else host time."""
        if self._use_events:
            # A step that samples nothing (only partial prefill chunks: a prompt longer than the
            # token budget) has no .tolist() to wait on, so wait for the end event explicitly;
            # after a .tolist() it is already done and this returns at once.
            ev1.synchronize()
            forward_s = ev0.elapsed_time(ev1) / 1e3  # GPU time
            # The forward's launch overlaps its GPU execution; the rest of t2..t4 is sampling+sync.
            return forward_s, max(0.0, (t4 - t2) - forward_s)
        return t3 - t2, t4 - t3

    def sample_step(self, logits: torch.Tensor, sample_ids: list[int]
                ) -> tuple[dict[int, list[int]], set[int], float]:
        """One token per sampling request, recorded; (sampled, stopped, time the tokens arrived)."""
        tokens: list[int] = []
        if sample_ids:
            params = self._sampling_params(sample_ids)
            tokens = self.sampler.sample(logits, sample_ids, params).tolist()  # the step's one sync
        t4 = time.perf_counter()
        t_tok = t4 - self.epoch
        sampled: dict[int, list[int]] = {}
        stopped: set[int] = set()  # decided per request, from its own sampling params
        reqs = self.requests
        for rid, tok in zip(sample_ids, tokens):  # _record_token, inlined (a call per token)
            sampled[rid] = [tok]
            st = reqs[rid]
            ids = st.token_ids
            ids.append(tok)
            st.token_times_s.append(t_tok)
            if tok in st.stop_ids:
                st.stop_len = len(ids)
                stopped.add(rid)
        return sampled, stopped, t4

    def _sampling_params(self, sample_ids: list[int]) -> list[SamplingParams] | None:
        """The sampler's params of these requests; None when every request is greedy."""
        if not self.sampler.has_random:
            return None
        reqs = self.requests
        return [reqs[r].params for r in sample_ids]

    # ------------------------------------------------------------------ speculative decoding
    def _propose_draft(self, out: SchedulerOutput) -> tuple[dict[int, Proposal], float]:
        """Run the draft model over this step's new tokens and draft positions; (proposals, seconds)."""
        assert self.drafter is not None
        for rid in out.preempted_ids:  # their blocks, and the draft KV in them, are gone
            self.drafter.forget(rid)
        t = time.perf_counter()
        if self._use_events:
            e0, e1 = self._new_event(), self._new_event()
            e0.record()
        reqs = self.requests
        props = self.drafter.propose(out.scheduled, {s.request_id: reqs[s.request_id].token_ids
                                                     for s in out.scheduled},
                                     {s.request_id: reqs[s.request_id].params for s in out.scheduled},
                                     self.sampler)
        if self._use_events:
            e1.record()
            e1.synchronize()
            return props, e0.elapsed_time(e1) / 1e3
        return props, time.perf_counter() - t

    def _timed(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        """fn() and its seconds: GPU time between events on a GPU, wall time on a CPU."""
        t = time.perf_counter()
        if self._use_events:
            e0, e1 = self._new_event(), self._new_event()
            e0.record()
        res = fn()
        if self._use_events:
            e1.record()
            e1.synchronize()
            return res, e0.elapsed_time(e1) / 1e3
        return res, time.perf_counter() - t

    def _propose_eagle(self, out: SchedulerOutput) -> tuple[dict[int, Proposal], float]:
        """The EAGLE-3 head's drafts 2..k for this step's decodes; (proposals, seconds)."""
        assert self.eagle is not None
        for rid in out.preempted_ids:  # their blocks, and the head's KV in them, are gone
            self.eagle.forget(rid)
        if not out.num_spec_tokens:
            return {}, 0.0
        return self._timed(lambda: self.eagle.propose(out.scheduled, self._token_ids))

    def _eagle_catch_up(self, out: SchedulerOutput, num_tokens: int, sampled: dict[int, list[int]]) -> float:
        """The head over this step's positions (draft 1 of the next step), launched without
        waiting for it: the host goes on to the scheduler while the GPU runs it. Returns the
        seconds to charge this step: on a GPU the previous step's catch-up (its events are done:
        this step's sampling synchronized after them), so each step's `propose_s` holds one
        catch-up and one round of head steps; on a CPU this one's wall time."""
        assert self.eagle is not None
        kept = {rid: len(toks) for rid, toks in sampled.items()}
        reqs = self.requests
        token_ids = {s.request_id: reqs[s.request_id].token_ids for s in out.scheduled}
        if not self._use_events:
            return self._timed(lambda: self.eagle.catch_up(out.scheduled, num_tokens, token_ids, kept))[1]
        done = self._catch_up_events
        e0, e1 = self._new_event(), self._new_event()
        e0.record()
        self.eagle.catch_up(out.scheduled, num_tokens, token_ids, kept)
        e1.record()
        self._catch_up_events = (e0, e1)
        if done is None:
            return 0.0
        done[1].synchronize()  # already complete: returns at once
        return done[0].elapsed_time(done[1]) / 1e3

    def _propose_ngram(self, sampled: dict[int, list[int]]) -> float:
        """Prompt lookup for the next step of every request that got tokens and goes on; the
        scheduler reserves as many draft slots as were found."""
        assert self.ngram is not None
        t = time.perf_counter()
        for rid in sampled:
            st = self.requests[rid]
            if st.status != "running" or st.stop_len is not None:
                self._ngram_drafts.pop(rid, None)
                continue
            drafts = self.ngram.propose(st.token_ids, self.spec_k)
            self._ngram_drafts[rid] = drafts
            self.scheduler.set_num_drafts(rid, len(drafts))
        return time.perf_counter() - t

    def _input_token_ids(self, out: SchedulerOutput, cols, proposals: dict[int, Proposal], verify: bool) -> dict:
        """Each scheduled request's tokens; a verifying decode's followed by its drafts."""
        reqs = self.requests
        if not verify:
            return self._token_ids
        return {s.request_id: (WithDrafts(reqs[s.request_id].token_ids,
                                          proposals[s.request_id].tokens[: s.num_spec_tokens])
                               if s.num_spec_tokens else reqs[s.request_id].token_ids)
                for s in out.scheduled}

    def _verify(self, spec: dict[int, int], logits: torch.Tensor, sample_ids: list[int],
                proposals: dict[int, Proposal]) -> list[list[int]]:
        """The tokens each sampling request keeps (accepted drafts + one); `spec`: drafts per
        verifying request."""
        drafts, probs = [], []
        for rid in sample_ids:
            d = spec.get(rid, 0)
            p = proposals.get(rid)
            drafts.append(p.tokens[:d] if d else [])
            probs.append(p.probs[:d] if d and p.probs is not None else None)
        return self.sampler.verify(logits, sample_ids, [self.requests[r].params for r in sample_ids],
                                   drafts, probs)

    def _record_kept(self, spec: dict[int, int], sample_ids: list[int], kept: list[list[int]], t_s: float
                     ) -> tuple[dict[int, list[int]], set[int]]:
        """Record each request's kept tokens up to a stop token (the rest are discarded) and its
        draft counters."""
        sampled: dict[int, list[int]] = {}
        stopped: set[int] = set()
        for rid, toks in zip(sample_ids, kept):
            st = self.requests[rid]
            for j, tok in enumerate(toks):
                if self._record_token(st, tok, t_s):
                    toks = toks[: j + 1]
                    stopped.add(rid)
                    break
            sampled[rid] = toks
            d = spec.get(rid, 0)
            if d:
                st.num_spec_drafts += 1
                st.num_spec_draft_tokens += d
                st.num_spec_accepted_tokens += len(toks) - 1
        return sampled, stopped

    def _is_stop(self, st: RequestState, tok: int) -> bool:
        """Whether `tok` ends this request: EOS unless its ignore_eos, or one of its stop ids."""
        return tok in st.stop_ids

    def _finish_unscheduled(self, out) -> list[RequestState]:
        """Finish what an empty step still reports (rejections come back from the scheduler here)."""
        return [self._end_request(res)
                for res in self.scheduler.update_from_output(out, {})]

    def _note_first_scheduled(self, out, now_s: float) -> None:
        """Stamp each request's first scheduling time and the prefix-cache hit it was admitted with
        (a request is first scheduled by its admission: only this step's admissions are read)."""
        for s in out.admitted:
            st = self.requests[s.request_id]
            if st.first_scheduled_s is None:
                st.first_scheduled_s = now_s
                st.num_cached_tokens = s.num_cached_tokens

    def _end_request(self, res: RequestResult) -> RequestState:
        """The scheduler let this request go (finished or rejected): final state, sampler freed."""
        st = self.requests[res.request_id]
        st.status = res.status
        st.finish_reason = "stop" if st.stop_len is not None else res.reason
        st.num_preemptions = res.num_preemptions
        st.num_cached_tokens = res.num_cached_tokens
        st.finished_s = self.now()
        self._token_ids.pop(res.request_id, None)
        self.sampler.remove_request(res.request_id)
        self._ngram_drafts.pop(res.request_id, None)
        if self.drafter is not None:
            self.drafter.forget(res.request_id)
        if self.eagle is not None:
            self.eagle.forget(res.request_id)
        return st

    def _step_record(self, out: SchedulerOutput, t0: float, schedule_s: float, prepare_s: float, gpu_s: float,
                     sample_s: float, total_s: float, num_output_tokens: int) -> StepRecord:
        """The step's row: batch composition as the scheduler counted it (the simulator's cost
        model reads the same fields), timings, and the scheduler's gauges after the step."""
        return StepRecord(
            t_start_s=t0 - self.epoch, total_s=total_s, first_dt_s=total_s, last_dt_s=total_s, gpu_s=gpu_s,
            cpu_s=schedule_s + prepare_s + sample_s, schedule_s=schedule_s, prepare_s=prepare_s,
            sample_s=sample_s, num_output_tokens=num_output_tokens, **step_composition(out, self.scheduler))

    def _record_token(self, st: RequestState, tok: int, t_s: float) -> bool:
        """Append a sampled token to its request; whether it stops the request."""
        st.token_ids.append(tok)
        st.token_times_s.append(t_s)
        if self._is_stop(st, tok):
            st.stop_len = len(st.token_ids)
            return True
        return False

    # ------------------------------------------------------------------ async scheduling
    def _step_async(self) -> StepResult:
        """Schedule and launch step N, then collect step N-1's tokens while the GPU runs N.

        The scheduler is updated with token counts right after the launch, so the next
        schedule() runs on the host while this step computes; decodes read their in-flight
        input token on the device (runner.prepare's gather). Returns step N-1's results.
        """
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        t1 = time.perf_counter()
        if not out.num_scheduled:
            immediate = self._finish_unscheduled(out)
            prev = self._collect(t0)
            self._end_stopped(prev)
            prev.finished[:0] = immediate
            return prev
        self._note_first_scheduled(out, t1 - self.epoch)
        p = self._pending
        inflight = (p.sample_ids, p.tokens_dev) if p is not None and p.tokens_dev is not None else None
        cols = out.columns()
        inp = self.runner.prepare(cols, self._token_ids, inflight)
        t2 = time.perf_counter()
        events = None
        if self._use_events:
            events = tuple(self._new_event() for _ in range(3))
            events[0].record()
        logits = self.runner.forward(inp)
        if events:
            events[1].record()
        sample_ids = inp.sample_request_ids
        tokens_dev = tokens_host = done = None
        if sample_ids:
            # into the runner's persistent buffer: the next step's graph gathers from there
            tokens_dev = self.sampler.sample(logits, sample_ids, self._sampling_params(sample_ids),
                                             out=self.runner.sampled_tokens_out(len(sample_ids)))
            self._token_buf_idx ^= 1
            tokens_host = self._token_bufs[self._token_buf_idx][: len(sample_ids)]
            tokens_host.copy_(tokens_dev, non_blocking=True)
        if events:
            events[2].record()
            done = events[2]
        t3 = time.perf_counter()
        # While the GPU runs this step: collect the previous one, then tell the scheduler.
        prev = self._collect(t0)
        pend = _Pending(out=out, sample_ids=sample_ids,
                        tokens_dev=tokens_dev, tokens_host=tokens_host, done=done, events=events,
                        t0=t0, schedule_s=t1 - t0, prepare_s=t2 - t1, launch_s=t3 - t2)
        for res in self.scheduler.update_from_output(out, {r: 1 for r in sample_ids}):
            if res.status == "rejected" or self.requests[res.request_id].stop_len is not None:
                # rejected, or stopped by a token collected just now: nothing visible in flight
                prev.finished.append(self._end_request(res))
            else:
                pend.finished.append(res)  # its last token is still in flight
        self._end_stopped(prev)
        self._pending = pend
        return prev

    def _end_stopped(self, prev: StepResult) -> None:
        """Async: requests whose stop token was collected just now were already scheduled
        (and maybe launched) for one more step, as vLLM's async scheduling does; end them in
        the scheduler now. That step's token for them is discarded when collected."""
        ids, self._stopped_ids = self._stopped_ids, []
        for res in self.scheduler.finish_requests(ids, "stop"):
            prev.finished.append(self._end_request(res))

    def _collect(self, next_t0: float) -> StepResult:
        """Wait for the pending step's tokens, record them, finish what it finished."""
        p = self._pending
        if p is None:
            return StepResult({}, [], None)
        self._pending = None
        tokens: list[int] = []
        if p.done is not None:
            # also when nothing was sampled (partial prefill chunks only): the timing events
            # below may only be read once the step's last event has completed
            p.done.synchronize()
        if p.tokens_host is not None:
            tokens = p.tokens_host.tolist()
        t_tok = time.perf_counter() - self.epoch
        sampled: dict[int, list[int]] = {}
        reqs = self.requests
        for rid, tok in zip(p.sample_ids, tokens):
            st = reqs[rid]
            if st.stop_len is not None:  # the wasted lookahead token after a stop: discarded
                continue
            sampled[rid] = [tok]
            ids = st.token_ids  # _record_token, inlined (a call per token)
            ids.append(tok)
            st.token_times_s.append(t_tok)
            if tok in st.stop_ids:
                st.stop_len = len(ids)
                self._stopped_ids.append(rid)
        finished = [self._end_request(r) for r in p.finished]
        if p.events is not None:
            forward_s = p.events[0].elapsed_time(p.events[1]) / 1e3
            sample_s = p.events[1].elapsed_time(p.events[2]) / 1e3
        else:
            forward_s, sample_s = p.launch_s, 0.0
        # total_s: the step's period (its start to the next step's start, or to its collection).
        end = next_t0 if next_t0 > p.t0 else time.perf_counter()
        trace = self._step_record(p.out, p.t0, p.schedule_s, p.prepare_s, forward_s, sample_s, end - p.t0,
                                  len(sampled))
        return StepResult(sampled, finished, trace, launch_s=p.launch_s)


def _add_spec_columns(trace: StepRecord, propose_s: float, accepted: int, drafted: int) -> None:
    """A speculative step's record: the proposer's seconds (GPU time too), tokens accepted and drafted."""
    trace.propose_s = propose_s
    trace.gpu_s += propose_s
    trace.num_spec_accepted_tokens = trace.accepted = accepted
    trace.drafted = drafted
