"""Each vLLM engine flag defined once: name, type, default, bounds, help, CLI spellings, rules.

The real engine's `EngineArgs`, the simulator's `EngineConfig`, the `costline simulate` /
`engine run` / `engine bench` options and `EngineConfig.to_vllm_args` are all built from the
`Flag` records below, so a flag's default or bound lives in one place. The dashboard builds its
controls from the same records (`Flag.name`, `type`, `default`, `ge`/`gt`/`le`, `choices`, `help`).

vLLM's start-up rules (budget vs sequences vs length, block size per attention backend, heads vs
tensor parallelism) are functions here, shared by engine and simulator; each cites where vLLM
applies it. A broken rule raises `FlagError`, a `ValueError` that names the field from Python and
the flag as typed on the command line (`FlagError.render(cli_spelling)`).
No torch here: the simulator imports this module.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model

from engine.core.flag_error import FlagError
from engine.core.speculative_config import SpeculativeConfig

UsageContext = Literal["api_server", "offline"]
# vLLM's compilation_config.cudagraph_mode values that costline's engine runs
CUDAGRAPH_MODES = ("NONE", "FULL_DECODE_ONLY", "FULL")
GIB = 2**30


@dataclass(frozen=True, slots=True)
class Flag:
    """One engine flag. `default` None = resolved at start-up (see `resolve_limits`)."""

    name: str  # vLLM's field name (dashes -> underscores)
    type: type  # int, float, bool or str
    default: Any
    help: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()
    human_size: bool = False  # accepts vLLM's `8k` (8000) / `8K` (8192)
    aliases: tuple[str, ...] = ()  # extra spellings vLLM accepts (`-tp`, `--device-memory-utilization`)
    negatives: tuple[str, ...] = ()  # bool: the spellings that set it False
    vllm_values: tuple[str, ...] | None = None  # choices `vllm serve` knows (None = all)
    in_vllm: bool = True  # False: a costline-only setting, never printed as a `vllm serve` flag
    annotation: Any = None  # the Python type when it is richer than `type` (a JSON config)

    def __post_init__(self) -> None:
        if self.type is bool and not self.negatives:
            raise ValueError(f"flag {self.name}: a bool flag needs its False spelling(s) in `negatives`")

    @property
    def cli(self) -> str:
        """The primary spelling, `--max-num-seqs`."""
        return "--" + self.name.replace("_", "-")

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.cli, *self.aliases)

    def python_type(self) -> Any:
        if self.annotation is not None:
            return self.annotation
        base: Any = Literal[self.choices] if self.choices else self.type
        return base | None if self.default is None else base

    def field(self) -> tuple[Any, Any]:
        """(annotation, pydantic Field) for a model built from flags."""
        return self.python_type(), Field(self.default, ge=self.ge, gt=self.gt, le=self.le,
                                         description=self.help)

    def vllm_args(self, value: Any) -> list[str]:
        """`value` as `vllm serve` arguments; [] for costline-only settings and values."""
        if not self.in_vllm or value is None:
            return []
        if self.type is bool:
            return [self.cli] if value else [self.negatives[0]]
        if self.vllm_values is not None and value not in self.vllm_values:
            return []
        if hasattr(value, "vllm_json"):  # a JSON-valued config
            return [self.cli, f"'{value.vllm_json()}'"]
        return [self.cli, str(value)]

    def expectation(self) -> str:
        """What a valid value looks like, for error messages: 'must be in (0, 1]'."""
        if self.choices:
            return "must be one of " + ", ".join(self.choices)
        kind = {int: "an integer", float: "a number", bool: "true or false"}.get(self.type, "a string")
        if self.gt is not None and self.le is not None:
            return f"must be in ({self.gt:g}, {self.le:g}]"
        if self.ge is not None and self.le is not None:
            return f"must be {kind} from {self.ge:g} to {self.le:g}"
        if self.ge is not None:
            return f"must be {kind} >= {self.ge:g}"
        if self.gt is not None:
            return f"must be {kind} > {self.gt:g}"
        return f"must be {kind}"


def flag_model(name: str, flags: Sequence[Flag], base: type[BaseModel]) -> type[BaseModel]:
    """A pydantic model class `name` deriving `base`, with one field per flag."""
    return create_model(name, __base__=base, __module__=base.__module__,
                        **{f.name: f.field() for f in flags})  # type: ignore[call-overload]


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)([kKmMgGtT])\s*$")
_PLAIN_INT = re.compile(r"^\s*[-+]?\d+\s*$")
_SIZE_UNIT = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str | int, field: str) -> int:
    """vLLM's human-readable integers (vllm/engine/arg_utils.py `human_readable_int`): `8k` = 8000,
    `8K` = 8192 (lower case decimal, upper binary); a decimal only with a decimal suffix (`1.5k`).
    A plain negative integer parses; the flag's bound then refuses it with its expectation."""
    raw = str(text)
    if _PLAIN_INT.match(raw):
        return int(raw)
    m = _SIZE.match(raw)
    if not m:
        raise FlagError(field, repr(text), "use an integer, optionally with k/K, m/M, g/G or t/T (e.g. 8K = 8192)")
    number, unit = m.groups()
    if "." in number and unit.isupper():  # vLLM: "Decimals are not allowed with binary suffixes"
        raise FlagError(field, repr(text), f"a decimal needs a decimal suffix: did you mean {number}{unit.lower()}?")
    return int(float(number) * _SIZE_UNIT[unit])


# --------------------------------------------------------------------------- the flags
# vLLM 0.33 `vllm serve --help=all` (vllm/engine/arg_utils.py); defaults there unless noted.
SCHEDULING_FLAGS: tuple[Flag, ...] = (
    Flag("max_num_batched_tokens", int, None, "token budget per step; default from the GPU and the "
         "entry point: vllm serve 8192 on GPUs of >= 70 GiB other than A100, else 2048; the offline "
         "LLM class 16384 / 8192", ge=1, human_size=True),
    Flag("max_num_seqs", int, None, "cap on running requests; default 1024 on GPUs of >= 70 GiB "
         "other than A100, else 256", ge=1, human_size=True),
    Flag("max_model_len", int, None, "prompt + output cap per request; default the model's "
         "max_position_embeddings", ge=1, human_size=True),
    # vLLM takes 1-128 on most GPU backends and sizes hybrid models' blocks itself (2,048, vllm#53749);
    # far beyond that a block is a whole prompt, and a 1e9-token block only exhausts memory
    Flag("block_size", int, 16, "tokens per KV block (FlashAttention wants a multiple of 16)", ge=1, le=4096),
    Flag("gpu_memory_utilization", float, 0.92, "share of GPU memory for weights, activations and "
         "KV cache (vLLM PR #38284 made it 0.92)", gt=0.0, le=1.0,
         aliases=("--device-memory-utilization",)),
    Flag("num_gpu_blocks_override", int, None, "KV blocks in the pool, overriding the memory sizing",
         ge=1),
    Flag("enable_prefix_caching", bool, True, "reuse KV blocks of equal prompt prefixes",
         negatives=("--disable-prefix-caching", "--no-enable-prefix-caching")),
    # "builtin" is costline's fast non-cryptographic key; `vllm serve` knows sha256 and xxhash.
    Flag("prefix_caching_hash_algo", str, "builtin", "hash of prefix-cache block keys",
         choices=("builtin", "xxhash", "sha256"), vllm_values=("xxhash", "sha256")),
    Flag("enable_chunked_prefill", bool, True, "split long prompts across steps",
         negatives=("--disable-chunked-prefill", "--no-enable-chunked-prefill")),
    Flag("long_prefill_token_threshold", int, 0, "per-request token cap per step (0 = none)", ge=0,
         human_size=True),
    Flag("scheduling_policy", str, "fcfs", "fcfs or priority (lower value first, then arrival)",
         choices=("fcfs", "priority")),
    # vLLM decides at start-up when unset; costline models it off unless asked.
    Flag("async_scheduling", bool, False, "schedule step N+1 while the GPU runs step N (a stop token is seen "
         "one step late, as in vLLM); off with --speculative-config", negatives=("--no-async-scheduling",)),
)

ENGINE_ONLY_FLAGS: tuple[Flag, ...] = (
    Flag("model", str, "tiny", "model preset name or a Hugging Face-style directory"),
    Flag("dtype", str, "auto", "weight and activation dtype",
         choices=("auto", "bfloat16", "float16", "float32")),
    # vLLM seeds numpy too (`set_random_seed`), which refuses a negative seed.
    Flag("seed", int, 0, "seed of sampling and of random weights", ge=0),
    Flag("device", str, "auto", "'auto' = cuda when available, else cpu", in_vllm=False),
    Flag("enforce_eager", bool, False, "no CUDA graphs", negatives=("--no-enforce-eager",)),
    # vLLM sets this inside --compilation-config ('{"cudagraph_mode": "FULL"}'), not as a flag of
    # its own, so it is never printed as one; its default there is FULL_AND_PIECEWISE (piecewise
    # graphs come from torch.compile, which costline does not use): FULL is the nearest mode.
    Flag("cudagraph_mode", str, "FULL", "CUDA graphs: FULL = whole-forward graphs for decode, "
         "speculative verify and mixed prefill+decode steps up to --max-cudagraph-capture-size "
         "tokens; FULL_DECODE_ONLY = decode and uniform verify steps only; NONE = none (as "
         "--enforce-eager)", choices=CUDAGRAPH_MODES, in_vllm=False),
    # vLLM's default is 512; costline's engine captures to 2,048 because its eager steps are
    # launch-bound on the GPU hosts (H200: ~30 us per cuBLAS call, ~50 us per Triton launch
    # from Python; a 768-token Llama-3.2-1B step took 9.2 ms eager, 3.5 ms as a mixed graph,
    # benchmarks/engine/profile_steps.py), where vLLM's eager steps run torch.compile'd code.
    # Mixture-of-experts models default to the token budget (EngineArgs.resolved: an eager MoE
    # step launches ~1,500 kernels from Python, 46-85 ms on the H200).
    Flag("max_cudagraph_capture_size", int, 2048, "largest step, in tokens, of a mixed or "
         "speculative-verify CUDA graph (decode graphs cover every batch up to --max-num-seqs); "
         "a mixture-of-experts model's default is the token budget",
         ge=1),
    Flag("cpu_kv_cache_bytes", int, 256 << 20, "KV cache size on the CPU (vLLM's "
         "VLLM_CPU_KVCACHE_SPACE)", ge=1, human_size=True, in_vllm=False),
    Flag("speculative_config", str, None, 'speculative decoding, JSON: \'{"method":"ngram",'
         '"num_speculative_tokens":4}\' or \'{"model":DIR_OR_PRESET,"num_speculative_tokens":3}\' '
         "(a draft model); runs with synchronous scheduling", aliases=("-sc",),
         annotation=SpeculativeConfig | None),
    Flag("attention_backend", str, "auto", "'auto' = triton on the GPU, the torch reference on the CPU",
         choices=("auto", "torch", "triton"), in_vllm=False),
    # vLLM's spellings, as the simulator's flag has them; the engine stores auto (= the model
    # dtype, or that dtype named) and e4m3 (engine.runner.kv_cache_torch_dtype says so for others)
    Flag("kv_cache_dtype", str, "auto", "KV cache element type: auto = the model dtype; fp8 = "
         "fp8_e4m3 with per-layer scales (1.0 unless set), half the bytes per block",
         choices=("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")),
    Flag("quantization", str, None, "fp8 = dynamic FP8 weights (W8A8) on a 16-bit checkpoint: the "
         "decoder's projections in float8_e4m3fn with per-tensor scales, activations per token",
         choices=("fp8",), aliases=("-q",)),
    # The simulator's flag of the same name prices it (sim.config.SIM_ONLY_FLAGS); the engine runs it
    # (engine/tensor_parallel.py: one process per rank, NCCL on GPUs, gloo on the CPU).
    Flag("tensor_parallel_size", int, 1, "GPUs (CPU: processes) the model is split over; a power of two "
         "that divides the attention heads, the KV heads and the MLP", ge=1, aliases=("-tp",)),
)

# The flags defined here; the simulator adds its own (`sim.config.SIM_ONLY_FLAGS`).
FLAGS_BY_NAME: dict[str, Flag] = {f.name: f for f in SCHEDULING_FLAGS + ENGINE_ONLY_FLAGS}


# --------------------------------------------------------------------------- defaults and rules
@dataclass(frozen=True, slots=True)
class BatchDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int


def batch_defaults(device_name: str, device_memory_bytes: float, usage: UsageContext) -> BatchDefaults:
    """vLLM's GPU-dependent batch defaults (`EngineArgs.get_batch_defaults`, vllm/engine/arg_utils.py,
    2026): GPUs of >= 70 GiB other than A100 get the large tier."""
    large = device_memory_bytes >= 70 * GIB and "a100" not in device_name.lower()
    if usage == "offline":
        return BatchDefaults(16384 if large else 8192, 1024 if large else 256)
    return BatchDefaults(8192 if large else 2048, 1024 if large else 256)


def default_max_model_len(max_position_embeddings: int) -> int:
    """vLLM derives the default length from the model config's max_position_embeddings."""
    return max_position_embeddings


def check_max_model_len(max_model_len: int, max_position_embeddings: int) -> None:
    # vLLM config/model.py `_get_and_verify_max_len`: longer than the model's positions is an error.
    if max_model_len > max_position_embeddings:
        raise FlagError("max_model_len", max_model_len,
                        f"exceeds the model's max_position_embeddings ({max_position_embeddings}); "
                        "lower {max_model_len}")


@dataclass(frozen=True, slots=True)
class BatchLimits:
    max_num_batched_tokens: int
    max_num_seqs: int


def resolve_batch(max_num_batched_tokens: int | None, max_num_seqs: int | None, *, max_model_len: int,
                  enable_chunked_prefill: bool, defaults: BatchDefaults) -> BatchLimits:
    """Fill unset budgets as vLLM does, then check its start-up rules.

    Defaults only (arg_utils `_set_default_max_num_seqs_and_batched_tokens_args`): without chunked
    prefill the budget is raised to max_model_len; the budget is capped at max_num_seqs x
    max_model_len and max_num_seqs at the budget. Values the user set are never changed.
    """
    seqs = max_num_seqs if max_num_seqs is not None else defaults.max_num_seqs
    budget = max_num_batched_tokens
    if budget is None:
        budget = defaults.max_num_batched_tokens
        if not enable_chunked_prefill:
            budget = max(budget, max_model_len)
        budget = min(budget, seqs * max_model_len)
    if max_num_seqs is None:
        seqs = min(seqs, budget)
    check_batch(budget, seqs, max_model_len=max_model_len, enable_chunked_prefill=enable_chunked_prefill,
                budget_is_default=max_num_batched_tokens is None)
    return BatchLimits(budget, seqs)


def check_batch(max_num_batched_tokens: int, max_num_seqs: int | None, *, max_model_len: int | None,
                enable_chunked_prefill: bool, budget_is_default: bool = False) -> None:
    """vLLM config/scheduler.py `SchedulerConfig._verify_args` / `verify_max_model_len`; a value
    still None (resolved later) is not checked yet."""
    if max_num_seqs is not None and max_num_batched_tokens < max_num_seqs:
        if budget_is_default:
            raise FlagError("max_num_seqs", max_num_seqs,
                            f"must be <= {{max_num_batched_tokens}} ({max_num_batched_tokens}, the "
                            "default here); lower it or raise {max_num_batched_tokens}")
        raise FlagError("max_num_batched_tokens", max_num_batched_tokens,
                        f"must be >= {{max_num_seqs}} ({max_num_seqs}); raise it or lower {{max_num_seqs}}")
    if not enable_chunked_prefill and max_model_len is not None and max_num_batched_tokens < max_model_len:
        raise FlagError("max_num_batched_tokens", max_num_batched_tokens,
                        f"must be >= {{max_model_len}} ({max_model_len}) when chunked prefill is off "
                        "(a whole prompt runs in one step); raise it, lower {max_model_len} or turn "
                        "chunked prefill on")


# Block sizes an attention backend accepts: vLLM's FlashAttention / FlashInfer backends want a
# multiple of 16 (their `get_supported_kernel_block_sizes`); costline's torch and Triton kernels take any size.
BLOCK_SIZE_MULTIPLE = {"flash_attn": 16, "flashinfer": 16, "costline": 1, "torch": 1, "triton": 1}


def check_block_size(block_size: int, backend: str) -> None:
    multiple = BLOCK_SIZE_MULTIPLE[backend]
    if block_size % multiple:
        raise FlagError("block_size", block_size,
                        f"must be a multiple of {multiple} for the {backend} attention backend "
                        f"(e.g. {max(multiple, block_size - block_size % multiple)})")


def check_tensor_parallel(num_attention_heads: int, tensor_parallel_size: int) -> None:
    # vLLM config/model.py `verify_with_parallel_config`: heads are split evenly across ranks.
    if num_attention_heads % tensor_parallel_size:
        raise FlagError("tensor_parallel_size", tensor_parallel_size,
                        f"must divide the model's {num_attention_heads} attention heads")


__all__ = [
    "CUDAGRAPH_MODES",
    "ENGINE_ONLY_FLAGS",
    "FLAGS_BY_NAME",
    "SCHEDULING_FLAGS",
    "BatchDefaults",
    "BatchLimits",
    "Flag",
    "FlagError",
    "UsageContext",
    "batch_defaults",
    "check_batch",
    "check_block_size",
    "check_max_model_len",
    "check_tensor_parallel",
    "default_max_model_len",
    "flag_model",
    "parse_size",
]
