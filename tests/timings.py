"""Refresh tests/slow_tests.txt and tests/file_seconds.txt from a full run's durations.

    bash dev.sh test --durations=0 > run.log
    python -m tests.timings run.log [--slow-s 1.0]

Both lists are measured, never guessed: the root conftest.py marks the listed tests `slow` and deals
the heaviest files to the workers first. A test's seconds are setup + call + teardown summed over
its parametrizations; a file's, over its tests.
"""

from __future__ import annotations

import argparse
import datetime
import re
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
DURATION = re.compile(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+)")


def seconds_by_test(log: str) -> Counter[str]:
    """Seconds per test id (parametrizations folded into their test) from pytest's --durations lines."""
    out: Counter[str] = Counter()
    for line in log.splitlines():
        m = DURATION.match(line)
        if m:
            # a parametrization's id may hold spaces (a dataclass's repr): the id read is cut at the
            # first one, so the test is everything before its "["
            out[m.group(2).split("[", 1)[0]] += float(m.group(1))
    return out


def seconds_by_file(by_test: Counter[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for test, s in by_test.items():
        out[test.split("::", 1)[0]] += s
    return out


def slow_list(by_test: Counter[str], slow_s: float, when: str) -> str:
    head = (f"# Tests marked `slow` (the root conftest.py reads this list): each took >= {slow_s} s (setup + call +\n"
            f"# teardown, all parametrizations) in a full run on the 2-core development machine, {when}\n"
            "# (`bash dev.sh test --durations=0`, then `python -m tests.timings LOG`). `bash dev.sh test -m \"not slow\"`\n"
            "# leaves them out; CI runs everything.\n")
    return head + "".join(f"{t}\n" for t in sorted(t for t, s in by_test.items() if s >= slow_s))


def file_list(by_file: Counter[str], when: str) -> str:
    head = ("# Seconds per test file (setup + call + teardown, all its tests) in a full run on the 2-core development\n"
            f"# machine, {when} (`bash dev.sh test --durations=0`, then `python -m tests.timings LOG`): the root\n"
            "# conftest.py deals the heaviest files to the workers first. Files not listed count as 0 s (dealt last).\n")
    return head + "".join(f"{s:.1f} {f}\n" for f, s in sorted(by_file.items(), key=lambda kv: (-kv[1], kv[0]))
                          if s >= 0.05)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path, help="output of `bash dev.sh test --durations=0`")
    ap.add_argument("--slow-s", type=float, default=1.0, help="a test this slow or slower is marked slow")
    a = ap.parse_args(argv)
    by_test = seconds_by_test(a.log.read_text())
    if len(by_test) < 100:
        raise SystemExit(f"error: {a.log} has {len(by_test)} timed tests: run the whole suite with --durations=0")
    when = datetime.date.today().isoformat()
    (HERE / "slow_tests.txt").write_text(slow_list(by_test, a.slow_s, when))
    (HERE / "file_seconds.txt").write_text(file_list(seconds_by_file(by_test), when))
    print(f"{sum(s >= a.slow_s for s in by_test.values())} slow tests, {len(by_test)} timed, "
          f"{sum(by_test.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
