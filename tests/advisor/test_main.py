"""The `costline` entry point: an unexpected error is one line and exit status 1, the traceback
only behind --debug; input errors keep their own message and status 2."""

from __future__ import annotations

import pytest

import advisor.commands.workload as workload_cmd
from costline.cli import main


def boom(*args, **kwargs):
    raise RuntimeError("boom\nsecond line")


def run_main(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as ended:
        main(argv)
    return ended.value.code


def test_an_unexpected_error_is_one_line_and_a_hint(monkeypatch, capsys):
    monkeypatch.setattr(workload_cmd, "describe_workload", boom)
    assert run_main(["workload", "describe", "lab-poisson", "-n", "5"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [("error: unexpected internal error (a bug in costline, not a problem with your "
                                 "input): RuntimeError: boom"),
                                "run again with --debug for the traceback, and please report it"]


@pytest.mark.parametrize("where", [0, 3])  # before the command or after its arguments
def test_debug_shows_the_traceback_anywhere_on_the_line(monkeypatch, capsys, where):
    monkeypatch.setattr(workload_cmd, "describe_workload", boom)
    argv = ["workload", "describe", "lab-poisson"]
    argv.insert(where, "--debug")
    assert run_main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "RuntimeError: boom" in err and "--debug for" not in err


def test_an_input_error_keeps_status_2_and_its_message(capsys):
    assert run_main(["workload", "describe", "no-such-preset-or-file"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "unexpected" not in err and "Traceback" not in err


def test_success_exits_0(capsys):
    assert run_main(["workload", "presets"]) == 0
    assert "chat-production" in capsys.readouterr().out
