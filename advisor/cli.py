"""The `costline` command line: the top of the stack (docs/design.md).

Command groups live in `advisor/commands/`, one module each, so that the light
commands start without importing the heavy layers (torch, triton) they do not use.
"""

from __future__ import annotations

import typer

from advisor.commands import engine as engine_cmd
from advisor.commands import simulate, workload

app = typer.Typer(
    help="costline: what each LLM-serving optimization really buys under your traffic.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(workload.app, name="workload")
app.command("simulate")(simulate.simulate)
app.add_typer(engine_cmd.app, name="engine")


@app.command()
def demo() -> None:
    """The main job on a built-in default: the production-like chat workload on one H200 serving Llama-3.1-8B."""
    workload.describe("chat-production", as_json=False)
    simulate.simulate(workload="chat-production", model="llama-3.1-8b", gpu="h200", num_gpus=1,
                      goodput="ttft:500 tpot:50", label="demo: chat-production")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
