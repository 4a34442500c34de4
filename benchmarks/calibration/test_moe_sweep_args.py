"""moe_sweep.py: a partial call takes the earlier sweep's mixed-graph capture size from its index, and
an index that does not record it is refused with an error naming the flag."""

import argparse
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from moe_sweep import earlier_capture_size


def test_the_earlier_sweeps_capture_size_or_a_clear_error(tmp_path, capsys):
    ap = argparse.ArgumentParser(prog="moe_sweep.py")
    recorded = tmp_path / "index.json"
    recorded.write_text(json.dumps({"capacity_rps": {"chat-production": 1.5}, "max_cudagraph_capture_size": 2048}))
    assert earlier_capture_size(recorded, ap) == 2048
    old = tmp_path / "old-index.json"
    old.write_text(json.dumps({"capacity_rps": {"chat-production": 1.5}}))
    with pytest.raises(SystemExit):
        earlier_capture_size(old, ap)
    err = capsys.readouterr().err
    assert "--max-cudagraph-capture-size" in err and "old-index.json" in err
