"""The `costline` command line: the advisor's commands (advisor/cli.py) and `costline engine`
(costline/engine_commands.py, which runs the torch engine). Composed here, above both layers, so the
advisor never imports the engine."""

from __future__ import annotations

from collections.abc import Sequence

from advisor.cli import build_app, run
from costline import engine_commands

app = build_app({"engine": engine_commands.app})


def main(argv: Sequence[str] | None = None) -> None:
    """The `costline` entry point (pyproject.toml): see advisor.cli.run."""
    run(app, argv)


if __name__ == "__main__":
    main()
