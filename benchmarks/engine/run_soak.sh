#!/usr/bin/env bash
# The soak on a device machine, across calls (one call is at most 10 minutes; the soak runs ~22):
#   bash benchmarks/engine/run_soak.sh start [soak.py args]   # starts it in its own session, then waits ~9 min
#   bash benchmarks/engine/run_soak.sh wait                   # waits ~9.5 more minutes
#   bash benchmarks/engine/run_soak.sh collect                # waits for the end (<= 8 min), packs DIR into $OUT
set -uo pipefail
dir=/tmp/soak
case "$1" in
  start)
    shift
    mkdir -p "$dir"
    setsid nohup python3 benchmarks/engine/soak.py --out "$dir" "$@" > "$dir.log" 2>&1 < /dev/null &
    echo $! > "$dir.pid"
    sleep 540 ;;
  wait) sleep 570 ;;
  collect)
    for _ in $(seq 480); do kill -0 "$(cat $dir.pid)" 2>/dev/null || break; sleep 1; done
    kill -0 "$(cat $dir.pid)" 2>/dev/null && { echo "soak still running: stopping it"; kill "$(cat $dir.pid)"; sleep 5; }
    cp "$dir.log" "$OUT/soak.log"; cp "$dir/soak.json" "$OUT/soak.json"
    cd "$dir" || exit 1
    for m in */; do
      m=${m%/}
      for part in sweep validation soak; do
        [ -d "$m/$part" ] && tar cf - "$m/$part" "$m/index.json" | xz -T0 -6 > "$OUT/$m-$part.tar.xz"
      done
    done
    ls -la "$OUT" ;;
esac
grep -v "engine: .*graphs: [0-9]*/" "$dir.log" | tail -40
