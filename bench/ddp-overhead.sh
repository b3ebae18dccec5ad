#!/usr/bin/env bash
# The cost of gradient communication in DDP, measured in one run on this machine:
#   - DDP throughput with gradient sync vs the same ranks with sync turned off (--dist.sync=false)
#   - 1 rank vs N ranks at the same global batch (scaling)
#   - the step split into compute (forward+backward, overlapped communication included),
#     exposed communication and data wait, from the trainer's metrics
# Model: MLP 784-1024-1024-10 (mlp:1024,1024), global batch 256, 1 thread per rank.
#   bench/ddp-overhead.sh                    2 ranks, 3 repetitions, 120 steps each
#   RANKS=4 REPS=5 STEPS=200 bench/ddp-overhead.sh
# Writes results/ddp-overhead/runs.jsonl, summary.json and summary.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
RANKS=${RANKS:-2}
REPS=${REPS:-3}
STEPS=${STEPS:-120}
EVERY=${EVERY:-20}
SPEC=${SPEC:-mlp:1024,1024}
BATCH=${BATCH:-256}
OUT=${OUT:-results/ddp-overhead}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
[ -x build/apps/lockstep-train ] || scripts/build.sh
ls data/fashion-mnist/train-*-of-*.h5 >/dev/null 2>&1 ||
  build/apps/lockstep-shard fashion-mnist --out=data/fashion-mnist --shards=4
mkdir -p "$OUT"
: >"$OUT/runs.jsonl"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

run() {  # run NAME RANKS SYNC
  local name=$1 np=$2 sync=$3 metrics="$OUT/tmp-metrics.jsonl"
  mpirun -np "$np" --oversubscribe --bind-to none build/apps/lockstep-train \
    --config configs/fashion_mlp.ini --model.spec="$SPEC" --train.global_batch="$BATCH" \
    --train.threads=1 --train.max_steps="$STEPS" --train.eval=false --optim.schedule=constant \
    --optim.warmup_steps=0 --log.every="$EVERY" --log.progress=none --dist.sync="$sync" \
    --log.metrics="$metrics" >/dev/null
  # Every interval record but the first (warm-up: allocation, page faults, first buckets).
  grep '"samples_per_s"' "$metrics" | grep '"step"' | tail -n +2 |
    sed "s/^{/{\"run\": \"$name\", \"ranks\": $np, /" >>"$OUT/runs.jsonl"
}

for rep in $(seq 1 "$REPS"); do
  echo "ddp-overhead: repetition $rep/$REPS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  # Interleaved, so drifting background load hits every variant alike.
  run "ddp_sync" "$RANKS" true
  run "ddp_nosync" "$RANKS" false
  run "one_rank" 1 true
done
rm -f "$OUT/tmp-metrics.jsonl"

python3 - "$OUT" "$RANKS" "$load_start" "$SPEC" "$BATCH" <<'PY'
import json, statistics, sys, subprocess, os, time
out, ranks, load, spec, batch = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
def med(name, key):
    v = [r[key] for r in runs if r["run"] == name]
    return statistics.median(v) if v else float("nan")
keys = ["samples_per_s", "step_time_s", "compute_s", "comm_exposed_s", "data_wait_s"]
s = {n: {k: med(n, k) for k in keys} for n in ("ddp_sync", "ddp_nosync", "one_rank")}
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
summary = {
    "machine": {"cpu": cpu, "cores": os.cpu_count(), "load_at_start": load, "date": time.strftime("%Y-%m-%d")},
    "model": spec, "global_batch": batch, "ranks": ranks, "threads_per_rank": 1,
    "medians": s,
    "sync_over_nosync": s["ddp_sync"]["samples_per_s"] / s["ddp_nosync"]["samples_per_s"],
    "speedup_vs_one_rank": s["ddp_sync"]["samples_per_s"] / s["one_rank"]["samples_per_s"],
    "scaling_efficiency": s["ddp_sync"]["samples_per_s"] / (ranks * s["one_rank"]["samples_per_s"]),
    "data_wait_fraction": s["ddp_sync"]["data_wait_s"] / s["ddp_sync"]["step_time_s"],
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
with open(f"{out}/summary.md", "w") as f:
    f.write(f"DDP overhead, {spec}, global batch {batch}, 1 thread per rank; {cpu}, {os.cpu_count()} cores, load at start {load}\n\n")
    f.write("| run | ranks | samples/s | step ms | compute ms | exposed comm ms | data wait ms |\n| --- | --- | --- | --- | --- | --- | --- |\n")
    for n, r in (("ddp_sync", ranks), ("ddp_nosync", ranks), ("one_rank", 1)):
        m = s[n]
        f.write(f"| {n} | {r} | {m['samples_per_s']:.0f} | {1e3*m['step_time_s']:.1f} | {1e3*m['compute_s']:.1f} | {1e3*m['comm_exposed_s']:.2f} | {1e3*m['data_wait_s']:.2f} |\n")
    f.write(f"\nDDP with sync / without sync: **{summary['sync_over_nosync']:.3f}**; "
            f"{ranks} ranks vs 1 rank: {summary['speedup_vs_one_rank']:.2f}x (efficiency {summary['scaling_efficiency']:.2f}); "
            f"data wait {100*summary['data_wait_fraction']:.2f}% of the step.\n")
print(open(f"{out}/summary.md").read())
PY
