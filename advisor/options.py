"""Command-line options built from definitions, shared by several commands.

`flag_options(flags)` adds one option per `engine.core.flags.Flag` (its vLLM spellings, help and
default) to a command and hands the command a dict of the values the user gave; the model the
command builds (`EngineConfig`, `EngineArgs`) fills the rest, so defaults live in one place.
`source_options()` adds the workload-source options and hands over a `SourceOptions`.
`cli_message` turns a validation failure into one line naming the flag as typed.

Both decorators rewrite the command's signature (typer reads parameters from it), so a command
stays a plain function that Python can call with keywords.
"""

from __future__ import annotations

import inspect
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from functools import wraps
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError

from advisor import errors
from advisor.console import console, styled
from advisor.errors import error_text, is_input_error
from engine.core.flags import FLAGS_BY_NAME, Flag, FlagError, parse_size
from sim.config import SIM_ONLY_FLAGS
from sim.workload_source import SourceOptions
from sim.workload_spec import MAX_REQUESTS

F = TypeVar("F", bound=Callable[..., Any])
_KW = inspect.Parameter.KEYWORD_ONLY


def _with_parameters(extra: Sequence[inspect.Parameter], into: str,
                     collect: Callable[[dict[str, Any]], Any]) -> Callable[[F], F]:
    """Replace the command's parameter `into` by the `extra` ones; `collect` turns their values
    into the object the command receives as `into`."""

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)
        own = [p.replace(kind=_KW) for p in sig.parameters.values() if p.name != into]

        @wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            values = {p.name: kwargs.pop(p.name, p.default) for p in extra}
            return fn(*args, **kwargs, **{into: collect(values)})

        params = own + list(extra)
        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return decorate


# --------------------------------------------------------------------------- engine flags
def _flag_parameter(flag: Flag) -> inspect.Parameter:
    # the default in the help text itself: the option's own default is None (= not given)
    text = flag.help + ("" if flag.default is None else f"  [default: {str(flag.default).lower()}]")
    if flag.type is bool:
        decls = [f"{flag.cli}/{flag.negatives[0]}", *(f" /{n}" for n in flag.negatives[1:])]
        option = typer.Option(*decls, help=text, show_default=False)
        return inspect.Parameter(flag.name, _KW, default=None, annotation=Annotated[bool | None, option])
    metavar = "[" + "|".join(flag.choices) + "]" if flag.choices else {int: "<int>", float: "<float>"}.get(flag.type, "<str>")
    if flag.human_size:
        text += " (accepts 8k = 8000, 8K = 8192)"
    option = typer.Option(*flag.spellings, help=text, show_default=False, metavar=metavar)
    return inspect.Parameter(flag.name, _KW, default=None, annotation=Annotated[str | None, option])


def given_flags(values: dict[str, Any]) -> dict[str, Any]:
    """The flags the user typed (None = not given), human sizes parsed."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if value is None:
            continue
        flag = FLAGS_BY_NAME.get(name)
        out[name] = parse_size(value, name) if flag is not None and flag.human_size else value
    return out


def flag_options(flags: Iterable[Flag], into: str = "flags") -> Callable[[F], F]:
    """One option per flag; the command receives `into`: {field: value} of the flags given."""
    params = [_flag_parameter(f) for f in flags]
    return _with_parameters(params, into, given_flags)


# --------------------------------------------------------------------------- workload sources
_SOURCE_HELP: dict[str, tuple[tuple[str, ...], str]] = {
    "trace_format": (("--format",), "trace format: auto, mooncake, azure, burstgpt"),
    "lenient": (("--lenient",), "skip bad trace rows (reported with counts and reasons)"),
    "hash_block_size": (("--hash-block-size",), "tokens per hash id of a trace (Mooncake: 512, inferred)"),
    "keep_failed": (("--keep-failed",), "BurstGPT: keep failed rows (Response tokens = 0) as 1-token outputs"),
    "spread": (("--spread",), "spread tied timestamps (Mooncake's 3-s steps) uniformly within each step, seeded"),
    "seed": (("--seed",), "seed for a spec/preset (overrides its own) and for --spread"),
    "num_requests": (("--num-requests", "-n"), "requests to generate from a spec/preset"),
    "start_s": (("--start-s",), "keep arrivals at or after this time (s)"),
    "end_s": (("--end-s",), "keep arrivals before this time (s)"),
    "first": (("--first",), "keep only the first N requests (after the window)"),
    "speedup": (("--speedup",), "divide arrival times by this factor (2 = twice the rate)"),
    "rate_rps": (("--rate",), "rescale time to this mean rate (req/s)"),
}


def _source_parameter(name: str) -> inspect.Parameter:
    spellings, text = _SOURCE_HELP[name]
    info = SourceOptions.model_fields[name]
    annotation = info.annotation
    if annotation is not bool:  # typer needs a plain type: the model validates the rest
        annotation = {"trace_format": str}.get(name, annotation)
    return inspect.Parameter(name, _KW, default=info.default,
                             annotation=Annotated[annotation, typer.Option(*spellings, help=text)])


# Requests generated from a spec or preset: each is a Python object of ~1 KB in the simulator
# (request, log row, scheduler state), so 10M requests are ~10 GB; a larger run is split instead.
# One cap for specs, source options and this flag.
MAX_NUM_REQUESTS = MAX_REQUESTS


def _source(values: dict[str, Any]) -> SourceOptions:
    n = values.get("num_requests")
    if n is not None and n > MAX_NUM_REQUESTS:  # before a generator allocates arrays of n
        raise FlagError("num_requests", n, f"must be <= {MAX_NUM_REQUESTS} (about 1 KB of simulator "
                        "memory per request); lower {num_requests}, or simulate a shorter window")
    return SourceOptions(**values)


def source_options(exclude: Iterable[str] = (), into: str = "source") -> Callable[[F], F]:
    """The workload-source options; the command receives `into`: a `SourceOptions`."""
    skip = set(exclude)
    params = [_source_parameter(n) for n in _SOURCE_HELP if n not in skip]
    return _with_parameters(params, into, _source)


# --------------------------------------------------------------------------- shared by commands
ModelOpt = Annotated[str, typer.Option("--model", help="model preset or Hugging Face id (llama-3.1-8b = "
                                       "meta-llama/Llama-3.1-8B-Instruct, qwen2.5-7b, ...)")]

# --------------------------------------------------------------------------- outputs
Force = Annotated[bool, typer.Option(
    "--force", help="replace an existing output file or run folder (an input is never replaced)")]


# --------------------------------------------------------------------------- errors
ALL_FLAGS: dict[str, Flag] = FLAGS_BY_NAME | {f.name: f for f in SIM_ONLY_FLAGS}
# Config fields whose option is not spelled like the field.
OPTION_OF_FIELD = {"disaggregation": "--disagg", "kv_block_coarsening": "--sim-block-coarsening",
                   "link_gb_per_s": "--kv-link-gb-per-s", "link": "--kv-link", "rate_rps": "--rate",
                   "trace_format": "--format", "slo": "--goodput",
                   "min_gain_pct": "--min-gain"}


# the arguments the running `costline` command was invoked with (advisor/cli.py's group sets it):
# in-process runs (tests, CliRunner) have someone else's sys.argv, and errors are rendered after
# click's context is gone
INVOKED_ARGV: ContextVar[list[str] | None] = ContextVar("costline_invoked_argv", default=None)


def cli_spelling(field: str) -> str:
    """The option a field was typed as: the alias found on the command line (`-tp`), else the
    primary spelling (`gpu_memory_utilization` -> `--gpu-memory-utilization`). Click records no
    alias once parsed, hence the look at the arguments (INVOKED_ARGV, else sys.argv)."""
    if field in OPTION_OF_FIELD:
        return OPTION_OF_FIELD[field]
    argv = INVOKED_ARGV.get()
    typed = set(sys.argv[1:] if argv is None else argv)
    flag = ALL_FLAGS.get(field)
    if flag is not None:
        return next((s for s in (*flag.spellings, *flag.negatives) if s in typed), flag.cli)
    if field in _SOURCE_HELP:
        spellings = _SOURCE_HELP[field][0]
        return next((s for s in spellings if s in typed), spellings[0])
    return "--" + field.replace("_", "-")


# pydantic's error types in plain words (its own messages name internal types and add a URL).
_PLAIN = {
    "greater_than_equal": "must be >= {ge}", "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}", "less_than": "must be < {lt}",
    "int_parsing": "use an integer", "int_from_float": "use a whole number", "float_parsing": "use a number",
    "bool_parsing": "use true or false", "finite_number": "must be a finite number",
    "literal_error": "must be one of {expected}", "missing": "is required",
    "extra_forbidden": "is not a known field (check its spelling)",
}


def _plain(err: dict[str, Any]) -> str:
    try:
        return _PLAIN[err["type"]].format(**(err.get("ctx") or {}))
    except (KeyError, IndexError):
        return err["msg"]


def cli_message(exc: Exception) -> str:
    """One line per problem, naming the option as typed and what it must be."""
    spell = cli_spelling

    if isinstance(exc, FlagError):
        return exc.render(spell)
    if not isinstance(exc, ValidationError):
        return str(exc)
    lines = []
    for err in exc.errors():
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FlagError):
            lines.append(cause.render(spell))
            continue
        field = str(err["loc"][-1]) if err["loc"] else ""
        if err["type"] == "value_error":
            lines.append(f"{spell(field)} {err['input']!r}: {cause or err['msg']}" if field else str(cause))
        elif field in ALL_FLAGS:
            lines.append(f"{spell(field)} {err['input']}: {ALL_FLAGS[field].expectation()}")
        else:
            lines.append(f"{spell(field)} {err['input']!r}: {_plain(err)}" if field else _plain(err))
    return "\n".join(lines)


def clean_errors(fn: F) -> F:
    """Turn input errors (advisor/errors.py `is_input_error`) into one message on stderr and exit
    status 2, never a traceback (with --debug the traceback comes first). Anything else is a bug
    and propagates to the entry point's handler (advisor/cli.py), which says so."""

    @wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ValueError, KeyError, OSError) as exc:
            if not is_input_error(exc):
                raise
            if errors.DEBUG:
                traceback.print_exc()
            msg = error_text(exc) if isinstance(exc, KeyError) else cli_message(exc)
            console(stderr=True).print(styled(("error:", "bold red"), " ", msg), soft_wrap=True)
            raise typer.Exit(code=2) from None

    return command  # type: ignore[return-value]


__all__ = ["ALL_FLAGS", "INVOKED_ARGV", "MAX_NUM_REQUESTS", "Force", "clean_errors", "cli_message", "cli_spelling", "flag_options", "given_flags", "source_options"]
