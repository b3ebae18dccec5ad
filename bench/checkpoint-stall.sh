#!/usr/bin/env bash
# How long training stands still for a checkpoint: synchronous (the step waits for the whole
# write: serialise, checksum, fsync, rename) against checkpoint.async = true (the step waits only
# for the copy to host memory). Each run trains STEPS steps with a checkpoint every EVERY steps;
# the trainer records each save's stall as {"event": "checkpoint", "stall_s": ...} in its metrics.
# The run's last save waits for its write in both modes and is left out. Runs alternate sync and
# async, REPS of each; the figure is the median over all their saves.
#   bench/checkpoint-stall.sh [BUILD]     (default build/; data from scripts/quickstart.sh and
#                                          scripts/make-text-data.sh: data/fashion-mnist, data/kjv)
# Env: REPS (3), STEPS (60), EVERY (5), OUT (results/checkpoint-stall).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
TRAIN=$BUILD/apps/lockstep-train
REPS=${REPS:-3} STEPS=${STEPS:-60} EVERY=${EVERY:-5}
OUT=${OUT:-$ROOT/results/checkpoint-stall}
mkdir -p "$OUT"
for d in "$ROOT/data/fashion-mnist" "$ROOT/data/kjv"; do
  [ -d "$d" ] || { echo "checkpoint-stall.sh: $d missing (scripts/quickstart.sh, scripts/make-text-data.sh)" >&2; exit 1; }
done
WORKLOADS=(
  "fashion_cnn|$ROOT/configs/fashion_cnn.ini|--data.test= --optim.warmup_steps=5"
  "gpt-mini|$ROOT/configs/gpt_tiny.ini|--model.spec=gpt-mini --data.test= --optim.warmup_steps=5"
)
echo "checkpoint stall, $(date -u +%F), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -n1);" \
  "checkpoint.dir on $(df -h "$OUT" | awk 'NR==2 {print $1}'), $REPS x $STEPS steps, a save every $EVERY"
printf '%-12s %10s %14s %14s %8s\n' workload "file MiB" "sync stall ms" "async stall ms" "ratio"
for w in "${WORKLOADS[@]}"; do
  IFS='|' read -r name config args <<<"$w"
  read -r -a args <<<"$args"
  for rep in $(seq "$REPS"); do
    for mode in false true; do
      dir=$OUT/$name-$mode-$rep
      rm -rf "$dir" "$dir.jsonl"
      (cd "$ROOT" && "$TRAIN" --config "$config" "${args[@]}" --train.threads=1 --train.max_steps=$STEPS \
        --train.epochs=100 --checkpoint.dir="$dir" --checkpoint.every_steps=$EVERY --checkpoint.keep=2 \
        --checkpoint.async=$mode --log.metrics="$dir.jsonl" --log.progress=none >"$dir.log" 2>&1) ||
        { tail -n 5 "$dir.log" >&2; exit 1; }
    done
  done
  python3 - "$OUT" "$name" "$STEPS" <<'PY'
import glob, json, os, statistics, sys
out, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def stalls(mode):
    v = []
    for f in glob.glob(f"{out}/{name}-{mode}-*.jsonl"):
        v += [r["stall_s"] for r in map(json.loads, open(f))
              if r.get("event") == "checkpoint" and r["step"] != steps]
    return v
sync, asyn = stalls("false"), stalls("true")
size = max(os.path.getsize(f) for f in glob.glob(f"{out}/{name}-false-1/ckpt-*.h5")) / 2**20
s, a = statistics.median(sync), statistics.median(asyn)
print(f"{name:<12} {size:10.1f} {s * 1e3:14.2f} {a * 1e3:14.2f} {a / s:8.3f}   ({len(sync)} and {len(asyn)} saves)")
PY
done
