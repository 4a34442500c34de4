"""Controls built from definitions: one per engine flag (`sim.config.ENGINE_CONFIG_FLAGS`, labelled
with its `vllm serve` spelling), the deployment's, and small formatting helpers shared by pages.
"""

from __future__ import annotations

import math
from typing import Any

import streamlit as st

from app.scenario import DEFAULT_PROFILE, MAX_SEED, Scenario
from engine.core.flags import Flag
from engine.core.model_spec import MODEL_PRESETS
from sim.config import ENGINE_CONFIG_FLAGS, EngineConfig
from sim.hardware import GPU_PRESETS
from sim.profile_files import shipped_profiles

ROUTERS = ("least_loaded", "round_robin", "prefix_aware")
AUTO = "(auto)"  # a flag left to vLLM's start-up default


def flag_key(flag: Flag) -> str:
    return f"flag.{flag.name}"


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else value.model_dump_json(exclude_none=True) \
        if hasattr(value, "model_dump_json") else str(value)


def auto_defaults(s: Scenario) -> dict[str, Any]:
    """What vLLM picks for the flags left to its start-up default (`--max-num-seqs`, ...) on the
    scenario's GPU and model: shown in those controls instead of a placeholder sentence that a
    narrow sidebar cuts off. {} when the scenario does not resolve (its error is shown elsewhere)."""
    from engine.core.model_spec import get_model
    from sim.hardware import get_gpu

    try:
        resolved = EngineConfig(**s.flags).resolved_for(get_gpu(s.gpu), get_model(s.model))
    except ValueError:
        return {}
    return {f.name: getattr(resolved, f.name) for f in ENGINE_CONFIG_FLAGS
            if f.default is None and getattr(resolved, f.name, None) is not None}


def flag_control(flag: Flag, current: Any, auto: Any = None) -> Any:
    """One widget for `flag`, showing `current`; returns the value the user set. `auto`: what vLLM
    picks when the flag is left unset (shown as the empty control's placeholder)."""
    label, key, help_ = flag.cli, flag_key(flag), flag.help
    if flag.default is None and flag.type is int:
        picked = f"{auto:,}" if isinstance(auto, int) else None
        help_ = f"{help_} Empty = vLLM's default" + (f" for this GPU and model: {picked}." if picked else ".")
    if flag.type is bool:
        return st.toggle(label, value=bool(current), key=key, help=help_)
    if flag.choices:
        options = ([AUTO] if flag.default is None else []) + list(flag.choices)
        picked = st.selectbox(label, options, index=options.index(current if current is not None else AUTO),
                              key=key, help=help_)
        return None if picked == AUTO else picked
    if flag.type is int:
        low = int(flag.ge) if flag.ge is not None else (int(flag.gt) + 1 if flag.gt is not None else None)
        return st.number_input(label, min_value=low, value=current, step=1, key=key, help=help_,
                               placeholder=auto_placeholder(auto) if flag.default is None else None)
    if flag.type is float:
        low = flag.ge if flag.ge is not None else (flag.gt + 0.01 if flag.gt is not None else None)
        return st.number_input(label, min_value=low, max_value=flag.le, value=current, step=0.01,
                               format="%.2f", key=key, help=help_)
    text = st.text_input(label, value=_text(current), key=key, help=help_,
                         placeholder='{"method":"ngram","num_speculative_tokens":4}')
    return text.strip() or None


def auto_placeholder(auto: Any) -> str:
    """`auto: 8,192`: short enough for the sidebar's narrowest control."""
    return f"auto: {auto:,}" if isinstance(auto, int) else "auto"


def flag_controls(s: Scenario) -> dict[str, Any]:
    """Every engine flag as a control; returns the flags that differ from the defaults."""
    changed: dict[str, Any] = {}
    autos = auto_defaults(s)
    for flag in ENGINE_CONFIG_FLAGS:
        current = s.flags.get(flag.name, flag.default)
        value = flag_control(flag, current, autos.get(flag.name))
        if isinstance(value, float) and isinstance(flag.default, float) and math.isclose(value, flag.default):
            continue
        if value != flag.default:
            changed[flag.name] = value
    return changed


def profile_names() -> list[str]:
    """The profiles a scenario may name: auto and the shipped ones (never a path)."""
    return list(dict.fromkeys([DEFAULT_PROFILE, "default", *shipped_profiles()]))


def _select(label: str, options: list[str], current: str, key: str, help_: str | None = None) -> str:
    opts = options if current in options else [current, *options]
    return st.selectbox(label, opts, index=opts.index(current), key=key, help=help_)


def deployment_controls(s: Scenario) -> dict[str, Any]:
    """Model, GPU, count, SLOs, seed, router and cost profile; returns the scenario fields."""
    return {
        "model": _select("--model", list(MODEL_PRESETS), s.model, "dep.model", "model preset"),
        "gpu": _select("GPU", list(GPU_PRESETS), s.gpu, "dep.gpu", "GPU preset (sim/hardware.py)"),
        "num_gpus": st.number_input("GPUs in total", min_value=1, max_value=4096, value=s.num_gpus, step=1,
                                    key="dep.num_gpus", help="replicas = GPUs / --tensor-parallel-size"),
        "slo": st.text_input("--goodput (SLOs in ms)", value=s.slo, key="dep.slo",
                             help='as vllm bench serve --goodput, e.g. "ttft:500 tpot:50 e2el:10000"'),
        "router": _select("router", list(ROUTERS), s.router, "dep.router", "how requests reach replicas"),
        "profile": _select("cost profile", profile_names(), s.profile, "dep.profile",
                           "step-cost profile (sim/profiles); the Calibration page shows which one ran"),
        "seed": st.number_input("seed", min_value=0, max_value=MAX_SEED, value=s.seed, step=1, key="dep.seed"),
        "disagg": st.text_input("disaggregated prefill (P:D replicas)", value=s.disagg, key="dep.disagg",
                                placeholder="off; e.g. 3:1", help="prefill and decode on separate replicas; "
                                "the GPU count then follows (P + D) x --tensor-parallel-size").strip(),
        "kv_link": _select("P/D KV link", ["network", "nvlink"], s.kv_link, "dep.kv_link",
                           "how KV moves from prefill to decode replicas"),
    }


def error_text(exc: BaseException) -> str:
    """An error as a page shows it: an input error's own message (flags by their vLLM spelling), or,
    for anything else, that it is a bug (never presented as the user's fault)."""
    from advisor.errors import BUG, is_input_error
    from advisor.options import cli_message

    if is_input_error(exc):
        return cli_message(exc) if isinstance(exc, ValueError) else str(exc)
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{BUG}: {type(exc).__name__}{': ' + first if first else ''}; please report it"


SIGNIFICANT = 3
MAX_DECIMALS = 6


def fmt(x: Any, sig: int = SIGNIFICANT) -> str:
    """A figure as the pages show it, to `sig` significant digits and no more decimals than that
    needs (2,418 tok/s, 7.25 req/s, 0.0123), thousands separated; tests format the API's numbers
    the same way."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x == 0:
            return "0"
        decimals = min(max(0, sig - 1 - math.floor(math.log10(abs(x)))), MAX_DECIMALS)
        text = f"{x:,.{decimals}f}"
        return "0" if float(text.replace(",", "")) == 0 else text  # never "-0"
    return str(x)


__all__ = ["AUTO", "deployment_controls", "error_text", "flag_control", "flag_controls", "flag_key", "fmt",
           "profile_names"]
