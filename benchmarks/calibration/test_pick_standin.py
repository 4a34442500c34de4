"""pick_standin.py: the setting whose worst source routes closest to uniform wins."""

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from pick_standin import ratios


def _probe(path: Path, residual: float, rows: dict[tuple[float, str], float], tokens: int = 16) -> None:
    """A routing_probe.py file: {(embed scale, source): distinct experts} at `tokens`, uniform 80."""
    results = [{"init": f"embed x{e:g}", "source": src, "temperature": 1.0,
                "by_tokens": [{"tokens": tokens, "distinct_mean": d, "uniform_expected": 80.0},
                              {"tokens": 1, "distinct_mean": 8.0, "uniform_expected": 8.0}]}
               for (e, src), d in rows.items()]
    results.append({"init": "embed x99", "source": "chat", "temperature": 0.0,  # greedy: ignored
                    "by_tokens": [{"tokens": tokens, "distinct_mean": 80.0, "uniform_expected": 80.0}]})
    path.write_text(json.dumps({"residual_scale": residual, "results": results}))


def test_ratios_and_pick_the_best_worst_source(tmp_path):
    _probe(tmp_path / "a.json", 1.0, {(4, "chat"): 60, (4, "code"): 20, (64, "chat"): 70, (64, "code"): 40})
    _probe(tmp_path / "b.json", 0.01, {(8, "chat"): 76, (8, "code"): 72, (64, "chat"): 79, (64, "code"): 64})
    table = ratios([tmp_path / "a.json", tmp_path / "b.json"], 16)
    assert table[(1.0, 4.0)] == {"chat": 0.75, "code": 0.25}
    assert table[(0.01, 64.0)] == {"chat": 79 / 80, "code": 0.8}
    assert (1.0, 99.0) not in table  # greedy probes are not candidates
    out = subprocess.run([sys.executable, str(HERE / "pick_standin.py"), str(tmp_path / "a.json"),
                          str(tmp_path / "b.json"), "--out", str(tmp_path / "pick.json")],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0.01", "8", "0.900"]  # worst source 72/80 beats 64/80 and 40/80
    assert len(json.loads((tmp_path / "pick.json").read_text())) == 4


def test_no_candidate_is_a_clear_error(tmp_path):
    _probe(tmp_path / "a.json", 1.0, {(4, "chat"): 60}, tokens=8)
    res = subprocess.run([sys.executable, str(HERE / "pick_standin.py"), str(tmp_path / "a.json")],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 1 and "no sampled probe with 16-token decode forwards" in res.stderr
