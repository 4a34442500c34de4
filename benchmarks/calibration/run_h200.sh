#!/usr/bin/env bash
# One GPU call of the calibration sweep for one model: runs gpu_sweep.py and packs its run folders
# into $OUT (at most 8 files come back from a device call: one archive per part).
#   bash benchmarks/calibration/run_h200.sh llama-3.2-1b [deadline_s]
set -uo pipefail
model=$1; deadline=${2:-480}
work=/tmp/calibration
python3 benchmarks/calibration/gpu_sweep.py --model "$model" --out "$work" --deadline-s "$deadline" 2>&1 \
  | tee "$OUT/sweep-$model.log"
cd "$work/$model" || exit 1
for part in sweep validation; do
  [ -d "$part" ] && tar cf - "$part" | xz -T0 -6 > "$OUT/$model-$part.tar.xz"
done
cp index.json "$OUT/$model-index.json"
ls -la "$OUT"
