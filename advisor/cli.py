"""The advisor's side of the `costline` command line; costline/cli.py composes it with `costline engine`
(the torch engine) at the top of the stack (docs/design.md), so the advisor never imports the engine.

Command groups live in `advisor/commands/`, one module each, so that the light
commands start without importing the heavy layers (torch, triton) they do not use.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from typing import Annotated

import typer
from typer.core import TyperGroup

from advisor import errors
from advisor.commands import advise as advise_cmd
from advisor.commands import app as app_cmd
from advisor.commands import simulate, workload
from advisor.commands import validate as validate_cmd
from advisor.commands.calibrate import calibrate
from advisor.errors import bug_line
from advisor.help import HELP
from advisor.options import INVOKED_ARGV


class _ArgvGroup(TyperGroup):
    """Keeps the arguments it was invoked with (`INVOKED_ARGV`), so an error names an option as
    typed (`-tp`) also when the command runs in-process (tests, CliRunner), where sys.argv is
    someone else's."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        INVOKED_ARGV.set(list(args))
        return super().parse_args(ctx, args)


DEBUG_FLAG = "--debug"


def _options(
    debug: Annotated[bool, typer.Option(DEBUG_FLAG, help="show the traceback of an unexpected error "
                                        "(accepted anywhere on the command line)")] = False,
) -> None:
    """costline: what each LLM-serving optimization really buys under your traffic."""


def demo() -> None:
    """The main job on a built-in default: advise on the production-like chat workload for Llama-3.1-8B on one H200."""
    workload.describe("chat-production", as_json=False)
    # 400 requests keep the demo near half a minute on two cores; `costline advise` takes the whole trace
    advise_cmd.advise(workload="chat-production", model="llama-3.1-8b", gpu="h200", num_gpus=1,
                      slo="ttft_p99:500 tpot_p99:50", budget="quick", num_requests=400)


def build_app(groups: dict[str, typer.Typer] | None = None) -> typer.Typer:
    """The `costline` app: the advisor's commands, and `groups` (name -> typer app) of the layers above
    or beside it, listed after `simulate` (costline/cli.py passes `engine`)."""
    app = typer.Typer(
        cls=_ArgvGroup,
        help="costline: what each LLM-serving optimization really buys under your traffic.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
    )
    app.callback()(_options)
    app.add_typer(workload.app, name="workload")
    app.command("simulate", **HELP)(simulate.simulate)
    for name, group in (groups or {}).items():
        app.add_typer(group, name=name)
    app.command("advise", **HELP)(advise_cmd.advise)
    app.command("app", **HELP)(app_cmd.serve)
    app.command("calibrate", **HELP)(calibrate)
    app.command("validate", **HELP)(validate_cmd.validate)
    app.command("demo", **HELP)(demo)
    return app


def run(app: typer.Typer, argv: Sequence[str] | None = None) -> None:
    """Run `app` as the `costline` entry point (costline/cli.py's main). An input error already ends as one line and exit status 2
    (advisor.options.clean_errors); anything else that escapes is a bug (advisor/errors.py): one
    line saying so and exit status 1, the traceback only with --debug."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in args
    errors.DEBUG = debug
    try:
        app(args=[a for a in args if a != DEBUG_FLAG], prog_name="costline")
    except Exception as exc:  # noqa: BLE001 - the last line of defence, by design
        if debug:
            traceback.print_exc()
        else:
            print(f"error: unexpected {bug_line(exc)}\nrun again with {DEBUG_FLAG} for the traceback, and "
                  "please report it", file=sys.stderr)
        raise SystemExit(1) from None
