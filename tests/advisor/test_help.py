"""`--help` of every command fits 100 columns with each description under its flag (advisor/help.py),
one placeholder style, and no option without a description."""

from __future__ import annotations

import re

import click
import pytest
import typer
from typer.testing import CliRunner

from costline.cli import app

runner = CliRunner()
COMMANDS = [["simulate"], ["advise"], ["engine", "run"], ["engine", "bench"], ["workload", "describe"],
            ["workload", "fit"], ["workload", "export"], ["workload", "presets"], ["calibrate"], ["validate"], ["app"],
            ["demo"]]
METAVAR = re.compile(r"^(<int>|<float>|<str>|<path>|<int range>|<float range>|<str,str>\.\.\.|<[a-z_]+>|\[[a-z0-9_|.-]+\])$")


def _command(path: list[str]) -> click.Command:
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return cmd


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("columns", [100, 200])
def test_help_fits_100_columns_with_descriptions_under_flags(path: list[str], columns: int) -> None:
    res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(columns)})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(len(line) for line in lines) <= 100
    options = [p for p in _command(path).params if isinstance(p, click.Option) and not p.hidden]
    for opt in options:
        first = next((i for i, line in enumerate(lines) if line.startswith("  ") and not line.startswith("    ")
                      and opt.opts[0] in re.split(r"[ ,/]+", line.strip())), None)
        assert first is not None, f"{opt.opts[0]} is not shown whole on a line of its own"
        flag_line, text_line = lines[first], lines[first + 1]
        assert text_line.startswith("    ") and text_line.strip(), f"{opt.opts[0]} has no description under it"
        if not opt.is_flag:
            metavar = flag_line.strip().rsplit(" ", 1)[-1] if not flag_line.strip().endswith("...") else \
                " ".join(flag_line.strip().split()[-1:])
            assert METAVAR.match(metavar), (opt.opts[0], metavar)


def test_the_simulate_help_is_short_and_names_each_flag_once() -> None:
    out = runner.invoke(app, ["simulate", "--help"], env={"COLUMNS": "100"}).output
    assert len(out.splitlines()) < 130  # 219 in the narrow-column layout
    assert "  --max-num-batched-tokens <int>\n    token budget per step" in out
    assert "(accepts 8k = 8000, 8K = 8192)" in out and "[default: (" not in out
    assert "  --label <str>\n    name of this run" in out
