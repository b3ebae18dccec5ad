#!/usr/bin/env bash
# What log.trace costs, measured inside each run: 2-rank DDP runs of STEPS steps with the trace
# window over one half of the steps, the first half in odd runs and the second in even ones (so a
# drift of the machine's speed over a run cancels). Each run gives the ratio of the median
# step_time_s of its log intervals inside the window to those outside (the trainer's metrics, one
# record per 20 steps, the first interval left out: warm-up); the figure is the median ratio over
# pairs of runs (below). Comparing halves of one run avoids the run-to-run spread of a shared 2-core machine
# (about +-8% between whole runs here, far above the cost being measured).
#   bench/trace-overhead.sh [BUILD]   (data from scripts/quickstart.sh: data/fashion-mnist)
# Env: REPS (6, even), STEPS (400), OUT (results/trace-overhead).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
REPS=${REPS:-6} STEPS=${STEPS:-400} EVERY=20
OUT=${OUT:-$ROOT/results/trace-overhead}
mkdir -p "$OUT"
[ -d "$ROOT/data/fashion-mnist" ] || { echo "trace-overhead.sh: data/fashion-mnist missing (scripts/quickstart.sh)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
half=$((STEPS / 2))
echo "log.trace overhead, $(date -u +%F), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -n1);" \
  "2 ranks x 1 thread, $REPS runs of $STEPS steps, the window over one half; load $(cut -d' ' -f1-3 /proc/loadavg)"
for config in fashion_mlp fashion_cnn; do
  for rep in $(seq "$REPS"); do
    if [ $((rep % 2)) = 1 ]; then window=$((EVERY + 1)):$half; else window=$((half + 1)):$STEPS; fi
    (cd "$ROOT" && mpirun -np 2 --oversubscribe --bind-to none "$BUILD/apps/lockstep-train" \
      --config "configs/$config.ini" --data.test= --optim.warmup_steps=10 --train.threads=1 \
      --train.max_steps=$STEPS --train.epochs=100 --log.every=$EVERY --log.progress=none \
      --log.metrics="$OUT/$config-$rep.jsonl" --log.trace="$OUT/$config-$rep.json" \
      --log.trace_steps=$window >"$OUT/$config-$rep.log" 2>&1) ||
      { tail -n 5 "$OUT/$config-$rep.log" >&2; exit 1; }
    echo "$window" >"$OUT/$config-$rep.window"
  done
  python3 - "$OUT" "$config" "$REPS" <<'PY'
import json, statistics, sys
out, config, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
ratios, on_ms, off_ms, events = [], [], [], []
for rep in range(1, reps + 1):
    first, last = map(int, open(f"{out}/{config}-{rep}.window").read().split(":"))
    recs = [r for r in map(json.loads, open(f"{out}/{config}-{rep}.jsonl")) if "step_time_s" in r][1:]
    # An interval record at step s covers steps s-19..s: inside when all of them are.
    on = [r["step_time_s"] for r in recs if first <= r["step"] - 19 and r["step"] <= last]
    off = [r["step_time_s"] for r in recs if r["step"] < first or r["step"] - 19 > last]
    ratios.append(statistics.median(on) / statistics.median(off))
    on_ms.append(1e3 * statistics.median(on)); off_ms.append(1e3 * statistics.median(off))
    events.append(len(json.load(open(f"{out}/{config}-{rep}.json"))["traceEvents"]))
# A run is often slower in its first half (warm-up beyond the first interval): a run with the
# window first reads drift + cost, one with the window second cost - drift, so each pair of runs
# gives sqrt(r_first * r_second), where a drift linear in the pair cancels.
pairs = [(ratios[i] * ratios[i + 1]) ** 0.5 for i in range(0, len(ratios) - 1, 2)]
print(f"{config:<12} step off {statistics.median(off_ms):7.3f} ms, on {statistics.median(on_ms):7.3f} ms;"
      f" overhead {100 * (statistics.median(pairs) - 1):+.2f}% (median over {len(pairs)} pairs:"
      f" {', '.join(f'{100 * (p - 1):+.1f}%' for p in pairs)}; in-run ratios, window first/second:"
      f" {', '.join(f'{100 * (r - 1):+.1f}%' for r in ratios)}); {statistics.median(events)} events per trace")
PY
done
