#!/usr/bin/env bash
# What log.trace costs: the step time of 2-rank DDP runs with the trace window over almost every
# step (log.trace_steps = 2:STEPS-1) against the same runs without it. Runs alternate off and on,
# REPS of each; the figure is the median over runs of each run's median step_time_s (the
# trainer's per-interval metrics, first interval left out: warm-up).
#   bench/trace-overhead.sh [BUILD]   (data from scripts/quickstart.sh: data/fashion-mnist)
# Env: REPS (5), STEPS (300), OUT (results/trace-overhead).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
REPS=${REPS:-5} STEPS=${STEPS:-300}
OUT=${OUT:-$ROOT/results/trace-overhead}
mkdir -p "$OUT"
[ -d "$ROOT/data/fashion-mnist" ] || { echo "trace-overhead.sh: data/fashion-mnist missing (scripts/quickstart.sh)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
echo "log.trace overhead, $(date -u +%F), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -n1);" \
  "2 ranks x 1 thread, $REPS runs of $STEPS steps each way"
for config in fashion_mlp fashion_cnn; do
  for rep in $(seq "$REPS"); do
    for mode in off on; do
      trace=(); [ $mode = on ] && trace=(--log.trace="$OUT/$config-$rep.json" --log.trace_steps=2:$((STEPS - 1)))
      (cd "$ROOT" && mpirun -np 2 --oversubscribe --bind-to none "$BUILD/apps/lockstep-train" \
        --config "configs/$config.ini" --data.test= --optim.warmup_steps=10 --train.threads=1 --train.max_steps=$STEPS \
        --train.epochs=100 --log.every=20 --log.progress=none --log.metrics="$OUT/$config-$mode-$rep.jsonl" \
        "${trace[@]}" >"$OUT/$config-$mode-$rep.log" 2>&1) || { tail -n 5 "$OUT/$config-$mode-$rep.log" >&2; exit 1; }
    done
  done
  python3 - "$OUT" "$config" <<'PY'
import glob, json, statistics, sys
out, config = sys.argv[1], sys.argv[2]
def step_time(mode):
    per_run = []
    for f in sorted(glob.glob(f"{out}/{config}-{mode}-*.jsonl")):
        v = [r["step_time_s"] for r in map(json.loads, open(f)) if "step_time_s" in r][1:]
        per_run.append(statistics.median(v))
    return statistics.median(per_run), per_run
off, offs = step_time("off")
on, ons = step_time("on")
events = max(len(json.load(open(f))["traceEvents"]) for f in glob.glob(f"{out}/{config}-*.json"))
print(f"{config:<12} off {off*1e3:8.3f} ms/step  on {on*1e3:8.3f} ms/step  overhead {100*(on/off-1):+.1f}%"
      f"   ({events} events per trace; per run off {[round(x*1e3,3) for x in offs]}, on {[round(x*1e3,3) for x in ons]})")
PY
done
