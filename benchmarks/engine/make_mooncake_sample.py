"""Derive the 1,000-request Mooncake sample the GPU benchmark replays (lengths, arrivals, hash ids).

The first 1,000 requests of the conversation trace, in order (so multi-turn prefix sharing is
kept). Run: python benchmarks/engine/make_mooncake_sample.py [trace] > writes mooncake_sample_1000.json
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_TRACE = HERE.parents[2] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def main() -> None:
    trace = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_TRACE
    raw = trace.read_bytes()
    rows = [json.loads(line) for line in raw.decode().splitlines()[:1000]]
    out = {
        "source": trace.name, "source_sha256": hashlib.sha256(raw).hexdigest(),
        "selection": "first 1000 rows, in trace order", "hash_block_size": 512,
        "timestamp_unit": "ms",
        "requests": [[r["timestamp"], r["input_length"], r["output_length"], r["hash_ids"]] for r in rows],
    }
    (HERE / "mooncake_sample_1000.json").write_text(json.dumps(out, separators=(",", ":")))


if __name__ == "__main__":
    main()
