"""The dashboard's scenario: what to simulate, as plain data that round-trips through the URL.

A `Scenario` names the workload (a preset, a built-in trace, an edited spec or an upload) and the
deployment (model, GPU, count, SLOs, profile, and every engine flag that differs from vLLM's
default, by its vLLM name). `to_query_params` / `from_query_params` make it shareable: the URL
carries only what differs from the defaults, and an edited spec travels compressed in `spec`.
An upload's bytes do not travel (a URL cannot hold a trace); the page says so.

No Streamlit here, so the round-trip is unit-tested without a browser.
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.flags import Flag
from sim.config import ENGINE_CONFIG_FLAGS, EngineConfig
from sim.run import SimConfig
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


class QueryParamError(ValueError):
    """A query parameter that does not parse; the message names it and the fix."""


class Scenario(BaseModel):
    """One what-if: the workload and the deployment, with vLLM's flag names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: str = DEFAULT_WORKLOAD
    spec: str | None = Field(None, description="the edited WorkloadSpec as JSON (workload 'custom')")
    first: int | None = Field(None, ge=1, description="simulate a trace's first N requests")
    trace_format: Literal["auto", "mooncake", "azure", "burstgpt"] = "auto"
    lenient: bool = Field(False, description="skip a trace's bad rows (counted) instead of refusing it")
    model: str = "llama-3.1-8b"
    gpu: str = "h200"
    num_gpus: int = Field(1, ge=1, le=4096)
    slo: str = DEFAULT_SLO
    seed: int = Field(0, ge=0)
    profile: str = DEFAULT_PROFILE
    router: str = "least_loaded"
    disagg: str = Field("", description="disaggregated prefill, P:D replica counts (costline simulate --disagg)")
    kv_link: Literal["network", "nvlink"] = "network"
    flags: dict[str, Any] = Field(default_factory=dict, description="engine flags that differ from the defaults")

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
        raw = zlib.decompress(base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4)))
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
    unparsable or out of range), naming it: a shared link never breaks the page."""
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


def _one_line(exc: Exception, key: str) -> str:
    if isinstance(exc, QueryParamError):
        return f"{exc}; ignored"
    msg = str(exc).splitlines()
    detail = msg[-2].strip() if isinstance(exc, ValidationError) and len(msg) > 1 else msg[0]
    return f"query parameter {key}: {detail}; ignored"


def _validated(values: dict[str, Any], flags: dict[str, Any], problems: list[str]) -> Scenario:
    """A Scenario from parsed parameters, dropping (and reporting) the fields that do not validate."""
    try:
        return Scenario(**values, flags=flags)
    except ValidationError as exc:
        bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
        for key in sorted(bad):
            problems.append(f"query parameter {key}={values.get(key)!r}: "
                            f"{next(e['msg'] for e in exc.errors() if e['loc'] and e['loc'][0] == key)}; ignored")
        return Scenario(**{k: v for k, v in values.items() if k not in bad},
                        flags={} if "flags" in bad else flags)


__all__ = ["CUSTOM", "DEFAULT_PROFILE", "DEFAULT_SLO", "DEFAULT_TRACE_REQUESTS", "DEFAULT_WORKLOAD", "FLAGS", "UPLOAD",
           "QueryParamError", "Scenario", "flag_param", "from_query_params", "pack_spec",
           "parse_flag_value", "to_query_params", "unpack_spec"]
