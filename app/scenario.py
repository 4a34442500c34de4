"""The dashboard's scenario: what to simulate, as plain data that round-trips through the URL.

A `Scenario` names the workload (a preset, a built-in trace, an edited spec or an upload) and the
deployment (model, GPU, count, SLOs, profile, and every engine flag that differs from vLLM's
default, by its vLLM name). `to_query_params` / `from_query_params` make it shareable: the URL
carries only what differs from the defaults, and an edited spec travels compressed in `spec`.
An upload's bytes do not travel (a URL cannot hold a trace); the page says so.

Anyone who can open the dashboard can write its URL, so a scenario names only what ships with the
package (presets, built-in traces, shipped profiles, model and GPU presets): never a path on the
server. Every number is bounded as the command line bounds its flag, and by the dashboard's own
budget (`APP_MAX_REQUESTS` requests, `APP_MAX_SIMULATED_BLOCKS` KV blocks a page may simulate),
so no link can make a page load read a file, run for minutes or take gigabytes. A parameter that
does not pass is ignored and named (`from_query_params`), and so is one the deployment refuses
(a memory share the model does not fit in, a budget below --max-num-seqs).

No Streamlit here, so the round-trip is unit-tested without a browser.
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine.core.flags import Flag
from engine.core.input_files import plain_message
from engine.core.run_summary import SLO
from sim.builtin_traces import BUILTIN_TRACES
from sim.config import ENGINE_CONFIG_FLAGS, EngineConfig, RouterPolicy
from sim.hardware import GPU_PRESETS
from sim.profile_files import shipped_profiles
from sim.run import MAX_NUM_GPUS, SimConfig, check_simulation_size
from sim.workload_presets import preset_names
from sim.workload_spec import WorkloadSpec

FLAGS: dict[str, Flag] = {f.name: f for f in ENGINE_CONFIG_FLAGS}
DEFAULT_WORKLOAD = "chat-production"
DEFAULT_SLO = "ttft:500 tpot:50"
# Traces hold ~10k requests; the dashboard simulates their first N so a what-if answers in ~1 s.
DEFAULT_TRACE_REQUESTS = 2000
# The cost profile `sim.run` uses when none is named; "auto" stands for None (pick by model and GPU).
SIM_DEFAULT_PROFILE = SimConfig.model_fields["profile"].default
DEFAULT_PROFILE = SIM_DEFAULT_PROFILE or "auto"
UPLOAD = "upload"  # the workload name of an uploaded trace or spec
CUSTOM = "custom"  # the workload name of a spec edited on the Workload page
# What one page load may simulate: ~10 s and ~250 MB on a 2-core server at most. The command line
# has no such budget (a user's own machine); a dashboard is shared by whoever has its address.
APP_MAX_REQUESTS = 10_000
APP_MAX_SIMULATED_BLOCKS = 2_000_000  # ~110 bytes each in the simulator's block manager
MAX_SPEC_JSON_BYTES = 1 << 20  # an edited spec in the URL, unpacked
MAX_SEED = 2**53 - 1  # the largest integer a browser number input holds exactly


class QueryParamError(ValueError):
    """A query parameter that does not parse; the message names it and the fix."""


class Scenario(BaseModel):
    """One what-if: the workload and the deployment, with vLLM's flag names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: str = DEFAULT_WORKLOAD
    spec: str | None = Field(None, description="the edited WorkloadSpec as JSON (workload 'custom')")
    first: int | None = Field(None, ge=1, le=APP_MAX_REQUESTS, description="simulate a trace's first N requests")
    trace_format: Literal["auto", "mooncake", "azure", "burstgpt"] = "auto"
    lenient: bool = Field(False, description="skip a trace's bad rows (counted) instead of refusing it")
    model: str = "llama-3.1-8b"
    gpu: str = "h200"
    num_gpus: int = Field(1, ge=1, le=MAX_NUM_GPUS)
    slo: str = DEFAULT_SLO
    seed: int = Field(0, ge=0, le=MAX_SEED)
    profile: str = DEFAULT_PROFILE
    router: RouterPolicy = "least_loaded"
    disagg: str = Field("", description="disaggregated prefill, P:D replica counts (costline simulate --disagg)")
    kv_link: Literal["network", "nvlink"] = "network"
    flags: dict[str, Any] = Field(default_factory=dict, description="engine flags that differ from the defaults")

    @field_validator("workload")
    @classmethod
    def _shipped_workload(cls, v: str) -> str:
        if v in (CUSTOM, UPLOAD) or v in preset_names() or v in BUILTIN_TRACES:
            return v
        raise ValueError(f"{v!r} is not a preset or built-in trace ({', '.join([*preset_names(), *BUILTIN_TRACES])});"
                         " the dashboard reads your own files only as uploads (Workload page)")

    @field_validator("spec")
    @classmethod
    def _bounded_spec(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if len(v) > MAX_SPEC_JSON_BYTES:
            raise ValueError(f"the edited spec is {len(v):,} bytes; at most {MAX_SPEC_JSON_BYTES:,}")
        spec = WorkloadSpec.model_validate_json(v)
        if spec.num_requests > APP_MAX_REQUESTS:
            raise ValueError(f"the spec asks for {spec.num_requests:,} requests; the dashboard simulates at most "
                             f"{APP_MAX_REQUESTS:,} (`costline simulate` takes more)")
        return v

    @field_validator("model")
    @classmethod
    def _model_preset(cls, v: str) -> str:
        from sim.models import preset_of

        return preset_of(v)  # a Hugging Face id (meta-llama/Llama-3.1-8B-Instruct) as its preset

    @field_validator("gpu")
    @classmethod
    def _gpu_preset(cls, v: str) -> str:
        if v not in GPU_PRESETS:
            raise ValueError(f"{v!r} is not a GPU preset ({', '.join(GPU_PRESETS)})")
        return v

    @field_validator("profile")
    @classmethod
    def _shipped_profile(cls, v: str) -> str:
        if v == "auto" or v in shipped_profiles():
            return v
        raise ValueError(f"{v!r} is not a shipped cost profile (auto, {', '.join(shipped_profiles())}); the "
                         "dashboard never reads a profile from a path")

    @field_validator("slo")
    @classmethod
    def _slo(cls, v: str) -> str:
        SLO.parse(v)  # a malformed pair is refused, naming it
        return v

    @field_validator("disagg")
    @classmethod
    def _disagg(cls, v: str) -> str:
        if v:
            from advisor.commands.simulate import parse_disagg

            d = parse_disagg(v, link="network", link_gb_per_s=None, link_latency_ms=None)
            if d is not None and d.num_prefill_replicas + d.num_decode_replicas > MAX_NUM_GPUS:
                raise ValueError(f"{v!r}: more than {MAX_NUM_GPUS} replicas")
        return v

    @field_validator("flags")
    @classmethod
    def _flags(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(v) - set(FLAGS))
        if unknown:
            raise ValueError(f"not engine flags: {', '.join(unknown)}")
        EngineConfig(**v)
        return v

    def engine(self) -> EngineConfig:
        return EngineConfig(**self.flags)

    def sim_config(self) -> SimConfig:
        """The `sim.run.SimConfig` this scenario describes (coarsened KV blocks: the fast setting)."""
        from advisor.commands.simulate import parse_disagg

        pd = parse_disagg(self.disagg or None, link=self.kv_link, link_gb_per_s=None, link_latency_ms=None)
        # with a P/D split the GPU count follows from it (P + D replicas x TP)
        return SimConfig(model=self.model, gpu=self.gpu, num_gpus=None if pd else self.num_gpus,
                         engine=self.engine(), router=self.router, disaggregation=pd, seed=self.seed,
                         profile=self.sim_profile(), slo=self.slo or None, kv_block_coarsening="auto",
                         label=self.label())

    def sim_profile(self) -> str | None:
        """The profile as SimConfig takes it ("auto" is None where SimConfig's default is None)."""
        return None if self.profile == "auto" and SIM_DEFAULT_PROFILE is None else self.profile

    def label(self) -> str:
        return f"{self.workload} | {self.model} on {self.num_gpus}x {self.gpu}"

    def workload_spec(self) -> WorkloadSpec | None:
        return WorkloadSpec.model_validate_json(self.spec) if self.spec else None

    def key(self) -> str:
        """A canonical string naming this scenario (the cache key of its run)."""
        return self.model_dump_json()


# ------------------------------------------------------------------------- URL round-trip
_SCALARS = ("workload", "first", "trace_format", "lenient", "model", "gpu", "num_gpus", "slo", "seed", "profile", "router", "disagg",
            "kv_link")


def pack_spec(spec_json: str) -> str:
    """A spec's JSON, compressed and URL-safe."""
    compact = json.dumps(json.loads(spec_json), separators=(",", ":"))
    return base64.urlsafe_b64encode(zlib.compress(compact.encode(), 9)).decode().rstrip("=")


def unpack_spec(packed: str) -> str:
    try:
        inflate = zlib.decompressobj()
        raw = inflate.decompress(base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4)), MAX_SPEC_JSON_BYTES)
        if inflate.unconsumed_tail:  # a zip bomb in a link: refused before it is inflated
            raise ValueError(f"it unpacks to more than {MAX_SPEC_JSON_BYTES:,} bytes")
        return WorkloadSpec.model_validate_json(raw).model_dump_json()
    except (ValueError, zlib.error) as exc:
        first = str(exc).splitlines()[0]
        raise QueryParamError(f"query parameter spec: not a packed workload spec ({first}); "
                              "remove it from the URL or share the link again") from None


def flag_param(flag: Flag) -> str:
    """A flag's query-parameter name: its vLLM spelling without the dashes in front."""
    return flag.cli.removeprefix("--")


def _flag_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, BaseModel):
        return value.model_dump_json(exclude_none=True)
    return str(value)


def to_query_params(s: Scenario) -> dict[str, str]:
    """What differs from the default scenario, as URL query parameters."""
    default = Scenario()
    out = {k: _flag_text(getattr(s, k)) for k in _SCALARS if getattr(s, k) != getattr(default, k)}
    if s.spec:
        out["spec"] = pack_spec(s.spec)
    for name, value in s.flags.items():
        out[flag_param(FLAGS[name])] = _flag_text(value)
    return out


def parse_flag_value(flag: Flag, text: str) -> Any:
    """A flag's value from text, by its type (bounds are checked by EngineConfig)."""
    if flag.type is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise QueryParamError(f"query parameter {flag_param(flag)}={text!r}: use true or false")
        return text.lower() in ("true", "1")
    if flag.type in (int, float):
        try:
            return flag.type(text)
        except ValueError:
            raise QueryParamError(f"query parameter {flag_param(flag)}={text!r}: {flag.expectation()}") from None
    return text


def from_query_params(params: dict[str, str]) -> tuple[Scenario, list[str]]:
    """The scenario a URL describes, and one message per parameter that was ignored (unknown,
    unparsable, out of range, or refused by the deployment it describes), naming it: a shared
    link never breaks the page, and never reaches a simulation the command line would refuse."""
    scenario, problems = _parsed(params)
    return _deployable(scenario, params, problems), problems


def _parsed(params: dict[str, str]) -> tuple[Scenario, list[str]]:
    problems: list[str] = []
    by_param = {flag_param(f): f for f in ENGINE_CONFIG_FLAGS}
    values: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    for key, text in params.items():
        try:
            if key in _SCALARS:
                values[key] = text
            elif key == "spec":
                values["spec"] = unpack_spec(text)
            elif key in by_param:
                flag = by_param[key]
                flags[flag.name] = parse_flag_value(flag, text)
                EngineConfig(**{flag.name: flags[flag.name]})
            else:
                problems.append(f"query parameter {key!r} is not a scenario setting; ignored")
        except (QueryParamError, ValidationError, ValueError) as exc:
            flags.pop(getattr(by_param.get(key), "name", ""), None)
            problems.append(_one_line(exc, key))
    return _validated(values, flags, problems), problems


# Scenario fields a deployment depends on, and the URL parameter of each.
_DEPLOYMENT = ("num_gpus", "model", "gpu", "disagg", "kv_link", "router", "profile", "first", "workload", "spec", "seed")


def deployment_problem(s: Scenario) -> str | None:
    """Why the scenario cannot be simulated on a dashboard (None: it can): vLLM's start-up rules,
    the model fitting its GPUs, the dashboard's simulation budget, and an edited spec that
    generates (its arrivals within the simulation clock)."""
    refusal = _refusal(s)
    return None if refusal is None else refusal[0]


def _refusal(s: Scenario) -> tuple[str, str | None] | None:
    """(the message, the field it names, if any), or None when the scenario may run."""
    from advisor.options import cli_message

    try:
        check_budget(s)
        if s.spec:
            from sim.generate import generate
            from sim.workload_source import SourceOptions, check_arrival_times

            spec = WorkloadSpec.model_validate_json(s.spec).with_overrides(seed=s.seed)
            check_arrival_times(generate(spec), "the edited spec", SourceOptions())
    except (ValidationError, ValueError) as exc:
        cause = exc
        if isinstance(exc, ValidationError) and exc.errors():
            cause = (exc.errors()[0].get("ctx") or {}).get("error", exc)
        return cli_message(exc).splitlines()[0], getattr(cause, "field", None)
    return None


def check_budget(s: Scenario, coarsening: int | None = None) -> None:
    """Refuse a scenario whose simulated KV pools exceed the dashboard's budget (or that vLLM would
    refuse to start). `coarsening` is the workload's (None: the finest its source can have)."""
    cfg = s.sim_config()
    deployment = cfg.deployment()
    check_simulation_size(deployment, coarsening or workload_coarsening(s), limit=APP_MAX_SIMULATED_BLOCKS,
                          limit_hint="the dashboard's budget; `costline simulate` takes more")


def workload_coarsening(s: Scenario) -> int:
    """The KV block coarsening 'auto' gives the scenario's workload, before it is loaded: from the
    hash block its source records (an upload's is not known yet: the finest, 1)."""
    from sim.run import kv_block_coarsening_for

    if s.workload in BUILTIN_TRACES:
        hash_block = BUILTIN_TRACES[s.workload].hash_block_size
    elif s.workload == UPLOAD:
        return 1
    else:
        from sim.workload_presets import get_preset

        hash_block = (s.workload_spec() or get_preset(s.workload if s.workload in preset_names()
                                                      else DEFAULT_WORKLOAD)).hash_block_size
    block = s.engine().block_size

    class _R:  # what kv_block_coarsening_for reads of a request
        hash_block_size = hash_block

    return kv_block_coarsening_for("auto", block, [_R()])  # type: ignore[list-item]


# A refused field's URL parameter, where the names differ.
_PARAM_OF_FIELD = {"disaggregation": "disagg", "slo": "slo"}


def _deployable(s: Scenario, params: dict[str, str], problems: list[str]) -> Scenario:
    """`s`, less the URL parameters its deployment refuses: the one the refusal names (or else the
    first whose removal alone makes it valid) is dropped and named; failing that, every one the
    URL set."""
    refusal = _refusal(s)
    if refusal is None:
        return s
    why, field = refusal
    default = Scenario()
    trials: list[tuple[str, Scenario]] = []
    for name in s.flags:
        if flag_param(FLAGS[name]) in params:
            trial = s.model_copy(update={"flags": {k: v for k, v in s.flags.items() if k != name}})
            trials.append((flag_param(FLAGS[name]), trial))
    for name in _DEPLOYMENT:
        if name in params and getattr(s, name) != getattr(default, name):
            trials.append((name, s.model_copy(update={name: getattr(default, name)})))
    named = FLAGS[field].cli.removeprefix("--") if field in FLAGS else _PARAM_OF_FIELD.get(field or "", field)
    trials.sort(key=lambda t: t[0] != named)  # the parameter the refusal names first
    for param, trial in trials:
        if _refusal(trial) is None:
            problems.append(f"query parameter {param}={params[param]}: {why}; ignored")
            return trial
    problems.append(f"query parameters {', '.join(p for p, _ in trials) or '(none)'}: {why}; ignored")
    kept = default.model_copy(update={"workload": s.workload, "spec": s.spec})
    return default if _refusal(kept) else kept


def _one_line(exc: Exception, key: str) -> str:
    if isinstance(exc, QueryParamError):
        return f"{exc}; ignored"
    if isinstance(exc, ValidationError):
        detail = plain_message(exc.errors()[0])
    else:
        detail = str(exc).splitlines()[0]
    return f"query parameter {key}: {detail}; ignored"


def _validated(values: dict[str, Any], flags: dict[str, Any], problems: list[str]) -> Scenario:
    """A Scenario from parsed parameters, dropping (and reporting) the fields that do not validate."""
    try:
        return Scenario(**values, flags=flags)
    except ValidationError as exc:
        bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
        for key in sorted(bad):
            err = next(e for e in exc.errors() if e["loc"] and e["loc"][0] == key)
            shown = (", ".join(f"{flag_param(FLAGS[n])}={_flag_text(v)}" for n, v in flags.items()) if key == "flags"
                     else f"{key}={_shorten(values.get(key))}")
            problems.append(f"query parameter{'s' if key == 'flags' else ''} {shown}: {plain_message(err)}; ignored")
        return Scenario(**{k: v for k, v in values.items() if k not in bad},
                        flags={} if "flags" in bad else flags)


def _shorten(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = ["APP_MAX_REQUESTS", "APP_MAX_SIMULATED_BLOCKS", "CUSTOM", "DEFAULT_PROFILE", "DEFAULT_SLO",
           "DEFAULT_TRACE_REQUESTS", "DEFAULT_WORKLOAD", "FLAGS", "UPLOAD", "QueryParamError", "Scenario", "check_budget",
           "deployment_problem", "flag_param", "from_query_params", "pack_spec", "parse_flag_value", "to_query_params",
           "unpack_spec", "workload_coarsening"]
