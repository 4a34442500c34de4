"""tests/timings.py reads pytest's --durations lines: per test (parametrizations and phases summed)
and per file, the slow list at its threshold, the files heaviest first."""

from __future__ import annotations

import pytest

from tests.timings import file_list, seconds_by_file, seconds_by_test, slow_list

LOG = """
============================= slowest durations ==============================
2.50s call     tests/a/test_x.py::test_big[1-2]
0.75s call     tests/a/test_x.py::test_big[3-4]
0.40s setup    tests/a/test_x.py::test_big[1-2]
1.00s call     tests/b/test_y.py::test_mid
0.60s teardown tests/b/test_y.py::test_mid
0.01s call     tests/b/test_y.py::test_small
0.30s call     tests/b/test_y.py::test_small[Tiles(m=1, n=2)]
(120 durations < 0.005s hidden.  Use -vv to show these durations.)
"""


def test_durations_add_up_per_test_and_per_file():
    by_test = seconds_by_test(LOG)
    assert by_test == pytest.approx({"tests/a/test_x.py::test_big": 3.65, "tests/b/test_y.py::test_mid": 1.6,
                                     "tests/b/test_y.py::test_small": 0.31})
    assert seconds_by_file(by_test) == pytest.approx({"tests/a/test_x.py": 3.65, "tests/b/test_y.py": 1.91})


def test_lists_keep_the_threshold_and_put_heavy_files_first():
    by_test = seconds_by_test(LOG)
    slow = [line for line in slow_list(by_test, 1.6, "today").splitlines() if not line.startswith("#")]
    assert slow == ["tests/a/test_x.py::test_big", "tests/b/test_y.py::test_mid"]
    files = [line for line in file_list(seconds_by_file(by_test), "today").splitlines() if not line.startswith("#")]
    assert files == ["3.6 tests/a/test_x.py", "1.9 tests/b/test_y.py"]
