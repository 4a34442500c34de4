"""Pick the stand-in scaling whose decode steps route most like uniform, from routing_probe.py's results.

For each (residual scale, embedding scale) probed: per source, the distinct experts a 16-token decode
forward touches (mean over its layers and forwards) over what uniform routing touches; the setting's
score is its worst source. Prints `RESIDUAL_SCALE EMBED_SCALE SCORE` of the best setting (for a shell
script to pass on to moe_sweep.py) and writes every setting's ratios with --out.

    python3 benchmarks/calibration/pick_standin.py $OUT/routing-*.json --tokens 16 --out $OUT/pick.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def ratios(files: list[Path], tokens: int) -> dict[tuple[float, float], dict[str, float]]:
    """{(residual scale, embed scale): {source: distinct / uniform at `tokens` decode tokens}}."""
    out: dict[tuple[float, float], dict[str, float]] = defaultdict(dict)
    for f in files:
        doc = json.loads(f.read_text())
        residual = float(doc.get("residual_scale", 1.0))
        for res in doc["results"]:
            if not res["init"].startswith("embed x") or res["temperature"] <= 0:
                continue
            row = next((r for r in res["by_tokens"] if r["tokens"] == tokens), None)
            if row is not None:
                out[(residual, float(res["init"][len("embed x"):]))][res["source"]] = (
                    row["distinct_mean"] / row["uniform_expected"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", type=Path, nargs="+", help="routing_probe.py --out files")
    ap.add_argument("--tokens", type=int, default=16, help="decode forwards of this many tokens")
    ap.add_argument("--out", type=Path, help="every setting's ratios as JSON")
    a = ap.parse_args()
    table = ratios(a.files, a.tokens)
    if not table:
        raise SystemExit(f"pick_standin: no sampled probe with {a.tokens}-token decode forwards in {a.files}")
    best = max(table, key=lambda key: min(table[key].values()))
    if a.out:
        a.out.write_text(json.dumps([{"residual_scale": r, "embed_scale": e, "ratio_by_source": v,
                                      "worst": min(v.values())} for (r, e), v in sorted(table.items())], indent=1))
    print(f"{best[0]:g} {best[1]:g} {min(table[best].values()):.3f}")


if __name__ == "__main__":
    main()
