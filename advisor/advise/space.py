"""The knobs the advisor searches, in vLLM's names, and the configurations they make.

A `Candidate` picks one `Option` per `Dimension`; the first option of every dimension is vLLM's
default, so the all-first candidate is the baseline. Layouts (tensor parallelism, replicas,
disaggregated prefill P:D) depend on the GPUs given and on the model's attention heads.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.core.model_spec import get_model
from sim.config import DisaggConfig, EngineConfig
from sim.run import SimConfig
from sim.serve_line import ServeLine, serve_line


@dataclass(frozen=True, slots=True)
class Layout:
    tensor_parallel_size: int
    num_gpus: int
    prefill_replicas: int = 0  # 0 = aggregated serving
    decode_replicas: int = 0

    @property
    def name(self) -> str:
        if self.prefill_replicas:
            tp = f" TP{self.tensor_parallel_size}" if self.tensor_parallel_size > 1 else ""
            return f"P/D {self.prefill_replicas}P:{self.decode_replicas}D{tp}"
        return f"TP{self.tensor_parallel_size} x{self.num_gpus // self.tensor_parallel_size}"

    def disaggregation(self) -> DisaggConfig | None:
        if not self.prefill_replicas:
            return None
        return DisaggConfig(num_prefill_replicas=self.prefill_replicas, num_decode_replicas=self.decode_replicas,
                            link="nvlink")


@dataclass(frozen=True, slots=True)
class Option:
    name: str
    flags: dict[str, Any] = field(default_factory=dict)  # EngineConfig field -> value
    layout: Layout | None = None


@dataclass(frozen=True, slots=True)
class Dimension:
    name: str  # the optimization, as the ladder and the report name it
    options: tuple[Option, ...]  # options[0] = vLLM's default


def _spec(method: str, k: int) -> dict[str, Any]:
    return {"speculative_config": {"method": method, "num_speculative_tokens": k}}


ENGINE_DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("prefix caching", (Option("on"), Option("off", {"enable_prefix_caching": False}))),
    Dimension("token budget", (Option("default"), Option("2048", {"max_num_batched_tokens": 2048}),
                               Option("16384", {"max_num_batched_tokens": 16384}))),
    Dimension("max-num-seqs", (Option("default"), Option("128", {"max_num_seqs": 128}))),
    Dimension("block size", (Option("16"), Option("64", {"block_size": 64}))),
    Dimension("speculative decoding", (Option("off"), Option("ngram k=4", _spec("ngram", 4)),
                                       Option("eagle3 k=2", _spec("eagle3", 2)),
                                       Option("eagle3 k=4", _spec("eagle3", 4)))),
    Dimension("FP8", (Option("bf16"), Option("fp8 KV cache", {"kv_cache_dtype": "fp8"}),
                      Option("fp8 KV + weights", {"kv_cache_dtype": "fp8", "quantization": "fp8"}),
                      # weights only: the fp8 cache's kernels convert slower than HBM streams and
                      # slow prefill attention (sim/kv_dtype_costs.py), so a prefill-heavy load
                      # can want the GEMM gain without the cache
                      Option("fp8 weights", {"quantization": "fp8"}))),
    Dimension("gpu memory utilization", (Option("0.92"), Option("0.95", {"gpu_memory_utilization": 0.95}))),
)


# --allow / --forbid: the names of what an option changes, and groups of them
FEATURES: dict[str, str] = {
    "prefix-caching": "turning prefix caching off",
    "token-budget": "--max-num-batched-tokens",
    "max-num-seqs": "--max-num-seqs",
    "block-size": "--block-size",
    "ngram": "n-gram speculative decoding",
    "eagle3": "EAGLE-3 speculative decoding (needs a draft head)",
    "fp8-kv": "an FP8 KV cache (--kv-cache-dtype fp8; lossy)",
    "fp8-weights": "FP8 weights (--quantization fp8; lossy)",
    "gpu-memory-utilization": "--gpu-memory-utilization",
    "tp": "tensor parallelism (--tensor-parallel-size > 1)",
    "pd": "disaggregated prefill (P/D)",
}
FEATURE_GROUPS: dict[str, tuple[str, ...]] = {"spec": ("ngram", "eagle3"), "fp8": ("fp8-kv", "fp8-weights"),
                                              "parallelism": ("tp", "pd")}
_FLAG_FEATURES = {"enable_prefix_caching": "prefix-caching", "max_num_batched_tokens": "token-budget",
                  "max_num_seqs": "max-num-seqs", "block_size": "block-size",
                  "gpu_memory_utilization": "gpu-memory-utilization"}


def option_features(opt: Option) -> frozenset[str]:
    """What `opt` changes from vLLM's defaults, in --allow / --forbid names."""
    out = {_FLAG_FEATURES[k] for k in opt.flags if k in _FLAG_FEATURES}
    spec = opt.flags.get("speculative_config")
    if spec:
        out.add(spec["method"])
    if opt.flags.get("kv_cache_dtype", "auto") != "auto":
        out.add("fp8-kv")
    if opt.flags.get("quantization"):
        out.add("fp8-weights")
    if opt.layout is not None:
        out |= {"tp"} if opt.layout.tensor_parallel_size > 1 else set()
        out |= {"pd"} if opt.layout.prefill_replicas else set()
    return frozenset(out)


def parse_features(value: str | list[str] | tuple[str, ...] | None) -> list[str] | None:
    """'fp8-weights,spec' (or a list) as feature names, groups expanded; an unknown name is refused
    naming every valid name (the caller names the flag)."""
    if value is None:
        return None
    parts = value.replace(",", " ").split() if isinstance(value, str) else [str(v).strip() for v in value]
    out: list[str] = []
    for name in parts:
        key = name.lower()
        if key in FEATURE_GROUPS:
            out += [f for f in FEATURE_GROUPS[key] if f not in out]
        elif key in FEATURES:
            out += [key] if key not in out else []
        else:
            raise ValueError(f"unknown name {name!r}; use any of {', '.join(FEATURES)} or the groups "
                             + ", ".join(f"{g} ({'+'.join(fs)})" for g, fs in FEATURE_GROUPS.items())
                             + " (comma-separated)")
    return out


def restrict(dims: tuple[Dimension, ...], allow: list[str] | None, forbid: list[str] | None) -> tuple[Dimension, ...]:
    """The dimensions with only the options `allow` (None = all) permits and `forbid` does not
    name; every dimension keeps vLLM's default (option 0)."""
    def kept(opt: Option) -> bool:
        f = option_features(opt)
        return (allow is None or f <= set(allow)) and not f & set(forbid or ())

    return tuple(dataclasses.replace(d, options=(d.options[0], *(o for o in d.options[1:] if kept(o)))) for d in dims)


def layouts(model: str, num_gpus: int, *, min_gpus: int | None = None) -> list[Layout]:
    """Aggregated TP x replicas and P:D splits (TP1) on `num_gpus` GPUs, vLLM's default (one GPU
    per replica) first; a layout the model does not fit is refused by the simulator's memory
    check and scores zero. `min_gpus` adds the same layouts on fewer GPUs (min-gpus, cost)."""
    heads = get_model(model).num_heads
    counts = range(min_gpus or num_gpus, num_gpus + 1)
    out: list[Layout] = []
    for n in counts:
        out += [Layout(tp, n) for tp in (1, 2, 4, 8) if tp <= n and n % tp == 0 and heads % tp == 0]
        out += [Layout(1, n, p, n - p) for p in range(1, n) if n <= 4 or p in (1, n // 2, n - 1)]
    default = Layout(1, num_gpus)
    return [default] + [lay for lay in out if lay != default]


ACCEPTANCE_CONCENTRATION = 20.0  # a measured mean's Beta spread across requests: the prior table's


def with_acceptance(dims: tuple[Dimension, ...], acceptance: Mapping[str, Mapping[str, float]]) -> tuple[Dimension, ...]:
    """The speculative options carrying the user's measured mean acceptance (method -> task ->
    rate; method "*" for every method) over the prior table's, as `acceptance_beta`."""
    def measured(opt: Option) -> Option:
        spec = opt.flags.get("speculative_config")
        rates = acceptance.get(spec["method"], acceptance.get("*")) if spec else None
        if not rates:
            return opt
        beta = {task: (m * ACCEPTANCE_CONCENTRATION, (1 - m) * ACCEPTANCE_CONCENTRATION) for task, m in rates.items()}
        return dataclasses.replace(opt, flags=opt.flags | {"speculative_config": spec | {"acceptance_beta": beta}})

    return tuple(dataclasses.replace(d, options=tuple(measured(o) for o in d.options)) for d in dims)


def dimensions(model: str, num_gpus: int, *, min_gpus: int | None = None,
               acceptance: Mapping[str, Mapping[str, float]] | None = None,
               allow: list[str] | None = None, forbid: list[str] | None = None) -> tuple[Dimension, ...]:
    lays = layouts(model, num_gpus, min_gpus=min_gpus)
    dims = with_acceptance(ENGINE_DIMENSIONS, acceptance) if acceptance else ENGINE_DIMENSIONS
    if len(lays) > 1:
        dims = (*dims, Dimension("parallelism", tuple(Option(lay.name, layout=lay) for lay in lays)))
    return restrict(dims, parse_features(allow), parse_features(forbid)) if allow is not None or forbid else dims


@dataclass(frozen=True, slots=True)
class Candidate:
    """One option per dimension, as indices into `dims[i].options`."""

    picks: tuple[int, ...]

    def options(self, dims: tuple[Dimension, ...]) -> list[Option]:
        return [d.options[i] for d, i in zip(dims, self.picks, strict=True)]

    def engine_overrides(self, dims: tuple[Dimension, ...]) -> dict[str, Any]:
        flags: dict[str, Any] = {}
        for opt in self.options(dims):
            flags |= opt.flags
            if opt.layout is not None:
                flags["tensor_parallel_size"] = opt.layout.tensor_parallel_size
        return {k: v for k, v in flags.items() if not (k == "tensor_parallel_size" and v == 1)}

    def layout(self, dims: tuple[Dimension, ...], num_gpus: int) -> Layout:
        lays = [o.layout for o in self.options(dims) if o.layout is not None]
        return lays[0] if lays else Layout(1, num_gpus)

    def label(self, dims: tuple[Dimension, ...]) -> str:
        parts = [f"{d.name} {o.name}" for d, o, i in zip(dims, self.options(dims), self.picks, strict=True) if i]
        return ", ".join(parts) or "vLLM defaults"

    def with_pick(self, dim: int, option: int) -> Candidate:
        picks = list(self.picks)
        picks[dim] = option
        return Candidate(tuple(picks))

    def num_changes(self) -> int:
        return sum(1 for i in self.picks if i)


def baseline(dims: tuple[Dimension, ...]) -> Candidate:
    return Candidate((0,) * len(dims))


def sim_config(cand: Candidate, dims: tuple[Dimension, ...], *, model: str, gpu: str, num_gpus: int,
               slo: str | None, seed: int, profile: str | None) -> SimConfig:
    lay = cand.layout(dims, num_gpus)
    kwargs: dict[str, Any] = {"profile": profile} if profile else {}
    return SimConfig(model=model, gpu=gpu, num_gpus=lay.num_gpus, engine=EngineConfig(**cand.engine_overrides(dims)),
                     disaggregation=lay.disaggregation(), seed=seed, slo=slo, skip_ahead=True,
                     kv_block_coarsening="auto", label=cand.label(dims), **kwargs)


def vllm_flags(engine: EngineConfig, layout: Layout) -> dict[str, Any]:
    """The non-default `vllm serve` flags of `engine` (name -> value), plus the KV connector of a
    P:D layout."""
    base = EngineConfig()
    flags: dict[str, Any] = {}
    for name in type(engine).model_fields:
        value = getattr(engine, name)
        if value != getattr(base, name):
            flags[name] = json.loads(value.vllm_json()) if hasattr(value, "vllm_json") else value
    if layout.prefill_replicas:
        d = layout.disaggregation()
        assert d is not None
        flags["kv_transfer_config"] = {"kv_connector": d.kv_connector, "kv_role": "kv_both"}
    return flags


def serve_command(model: str, engine: EngineConfig, layout: Layout) -> ServeLine:
    """`vllm serve HF_ID` plus only the non-default flags (one line per instance kind): the one
    builder, `sim.serve_line`."""
    d = layout.disaggregation()
    return serve_line(model, engine, replicas=layout.num_gpus // layout.tensor_parallel_size,
                      kv_connector=d.kv_connector if d else None, prefill_replicas=layout.prefill_replicas,
                      decode_replicas=layout.decode_replicas)
