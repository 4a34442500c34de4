"""gain_coverage.py's --slo: each SLO is checked before any run is simulated, and a bad one is refused
with an error naming the flag and the value."""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gain_coverage


def test_a_bad_slo_is_refused_before_any_run_is_read(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gain_coverage.py", str(tmp_path / "no-such-run"), "--slo", "ttft:250 tpot:18",
                                      "--slo", "ttft:abc"])
    with pytest.raises(SystemExit):
        gain_coverage.main()
    err = capsys.readouterr().err
    assert "--slo 'ttft:abc'" in err and "not a number of milliseconds" in err
