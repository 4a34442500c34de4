"""The conversation benchmark here and at an earlier commit, interleaved on this machine.

    PYTHONPATH=. python benchmarks/sim/speed_against_commit.py 4933d55 --rounds 4 --repeat 5

A figure in simulated requests per CPU second is this machine's as much as the code's: the same
benchmark runs 2-3x slower on some of the shared 2-core machines than on others. Issue 26's
targets were set on the machine that measured commit 4933d55 at 5,775 requests per CPU s
(results.md, "Earlier"), so the speed-up over that commit, measured here in one run, is the
machine-independent figure: each round runs `bench_conversation.py` once in a worktree of the
earlier commit and once in this tree (alternating which goes first), best of `--repeat` inside
each run, and the ratio is taken between the best runs of each side. Both sides must simulate the
same steps (engine steps and step rows are compared): a faster loop that simulates something else
is not a speed-up. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = "benchmarks/sim/bench_conversation.py"
SAME = ("requests", "engine_steps", "step_rows", "completed")


def bench(tree: Path, repeat: int) -> dict:
    """One run of the conversation benchmark in `tree`, its JSON."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, BENCH, "--repeat", str(repeat)], cwd=tree, env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out[out.index("{"):])


def compare(runs: dict[str, list[dict]], reference_rps: float) -> dict:
    """The best run of each side, the speed-up, and what it makes of the earlier commit's figure on
    the machine that set the target; refused when the two sides simulated different runs."""
    for key in SAME:
        values = {r[key] for rs in runs.values() for r in rs}
        if len(values) != 1:
            raise SystemExit(f"the two trees simulate different runs: {key} = {sorted(values)}")
    best = {side: max(r["simulated_requests_per_cpu_s"] for r in rs) for side, rs in runs.items()}
    ratio = best["here"] / best["earlier"]
    return {"best": best, "speedup": round(ratio, 3), "at_reference_machine": round(reference_rps * ratio),
            "engine_steps": runs["here"][0]["engine_steps"], "step_rows": runs["here"][0]["step_rows"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("commit", help="the earlier commit (its tree must have benchmarks/sim/bench_conversation.py)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5, help="bench_conversation.py --repeat")
    ap.add_argument("--reference-rps", type=float, default=5775.0,
                    help="the earlier commit's figure where the target was set (4933d55: 5,775)")
    ap.add_argument("--out", type=Path, help="also write the JSON here (an existing file needs --force)")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    if args.out and args.out.exists() and not args.force:
        raise SystemExit(f"--out {args.out}: exists; pass --force to overwrite it")
    sha = subprocess.run(["git", "rev-parse", "--short", args.commit], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    head = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    runs: dict[str, list[dict]] = {"earlier": [], "here": []}
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "earlier"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), sha], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for i in range(args.rounds):
                order = [("earlier", old), ("here", ROOT)]
                for side, tree in order if i % 2 == 0 else order[::-1]:
                    runs[side].append(bench(tree, args.repeat))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)
    figures = compare(runs, args.reference_rps)
    report = json.dumps({
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "earlier": sha, "here": head,
        "load_average_end": os.getloadavg(), "rounds": args.rounds, "repeat": args.repeat,
        "requests_per_cpu_s": {side: [r["simulated_requests_per_cpu_s"] for r in rs] for side, rs in runs.items()},
        **figures,
    }, indent=2)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
