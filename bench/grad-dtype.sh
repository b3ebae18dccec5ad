#!/usr/bin/env bash
# What dist.grad_dtype = bf16 buys where the link between ranks is the bottleneck: DDP training
# of fashion_mlp (784-1024-1024-10, 1.86 M parameters, 7.1 MiB of f32 gradients a step) with one
# rank on each of 2 hosts of the namespace cluster (scripts/local-slurm/start.sh --hosts=2), so
# every allreduce crosses the hosts' veth link, unshaped and shaped to each rate in RATES. fp32
# and bf16 gradients alternate within each repetition (so drifting load hits both alike);
# figures are medians of the metrics' interval records after the first (warm-up).
#   bench/grad-dtype.sh                              RATES="none 1gbit", 3 repetitions, 100 steps
#   RATES="none 10gbit 1gbit 500mbit" REPS=5 bench/grad-dtype.sh
# Writes results/grad-dtype/runs.jsonl and summary.md. Starts the cluster if it is not up and
# stops it again at the end in that case. Needs root (network namespaces), like the cluster.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${LOCKSTEP_BUILD_DIR:-$ROOT/build}
RATES=${RATES:-"none 1gbit"}
REPS=${REPS:-3}
STEPS=${STEPS:-100}
EVERY=${EVERY:-20}
BATCH=${BATCH:-256}
OUT=${OUT:-results/grad-dtype}
(( STEPS >= 3 * EVERY )) || { echo "grad-dtype: STEPS must be at least 3 x EVERY" >&2; exit 2; }
[ -x "$BUILD/apps/lockstep-train" ] || { echo "grad-dtype: build first ($BUILD)" >&2; exit 1; }
ls data/fashion-mnist/train-*-of-*.h5 >/dev/null 2>&1 ||
  "$BUILD/apps/lockstep-shard" fashion-mnist --out=data/fashion-mnist --shards=4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE

started=0
if ! bash scripts/local-slurm/start.sh --hosts=2 --status >/dev/null 2>&1; then
  bash scripts/local-slurm/start.sh --hosts=2
  started=1
fi
cleanup() {
  bash scripts/local-slurm/shape.sh --off >/dev/null 2>&1 || true
  [ "$started" = 1 ] && bash scripts/local-slurm/stop.sh --hosts
  return 0
}
trap cleanup EXIT
source "${LOCKSTEP_CLUSTER_BASE:-/tmp/lockstep-cluster}/env.sh"

mkdir -p "$OUT"
: >"$OUT/runs.jsonl"
metrics="$OUT/tmp-metrics.jsonl"
for rate in $RATES; do
  if [ "$rate" = none ]; then
    bash scripts/local-slurm/shape.sh --off >/dev/null
  else
    bash scripts/local-slurm/shape.sh --rate="$rate" >/dev/null
  fi
  for rep in $(seq 1 "$REPS"); do
    for dtype in fp32 bf16; do
      echo "grad-dtype: link $rate, $dtype gradients, repetition $rep/$REPS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
      rm -f "$metrics"
      # --map-by node: rank 0 on node1, rank 1 on node2 (the data is on the shared file system).
      mpirun --hostfile "$LOCKSTEP_CLUSTER_HOSTFILE" -np 2 --map-by node --bind-to none \
        "$BUILD/apps/lockstep-train" --config configs/fashion_mlp.ini --train.global_batch="$BATCH" \
        --train.threads=1 --train.max_steps="$STEPS" --train.eval=false \
        --optim.schedule=constant --optim.warmup_steps=0 --log.every="$EVERY" \
        --log.progress=none --dist.grad_dtype="$dtype" --log.metrics="$metrics" \
        --checkpoint.dir= >/dev/null
      grep '"samples_per_s"' "$metrics" | grep '"step"' | tail -n +2 |
        sed "s|^{|{\"rate\": \"$rate\", \"dtype\": \"$dtype\", \"rep\": $rep, |" >>"$OUT/runs.jsonl"
    done
  done
done
rm -f "$metrics"

python3 - "$OUT" "$RATES" "$BATCH" <<'PY'
import json, os, statistics, subprocess, sys, time
out, rates, batch = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
def med(rate, dtype, key):
    v = [r[key] for r in runs if r["rate"] == rate and r["dtype"] == dtype]
    return statistics.median(v) if v else float("nan")
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True,
                     text=True).stdout.strip()
rows = []
with open(f"{out}/summary.md", "w") as f:
    f.write(f"fashion_mlp DDP, 2 hosts x 1 rank x 1 thread, global batch {batch}; {cpu}, "
            f"{os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M')}\n\n")
    f.write("| link | gradients | samples/s | step ms | exposed comm ms | bf16 / fp32 samples/s |\n"
            "| --- | --- | --- | --- | --- | --- |\n")
    for rate in rates:
        base = med(rate, "fp32", "samples_per_s")
        for dtype in ("fp32", "bf16"):
            sps = med(rate, dtype, "samples_per_s")
            ratio = f"**{sps / base:.2f}**" if dtype == "bf16" else ""
            f.write(f"| {rate} | {dtype} | {sps:.0f} | {1e3 * med(rate, dtype, 'step_time_s'):.1f} | "
                    f"{1e3 * med(rate, dtype, 'comm_exposed_s'):.1f} | {ratio} |\n")
print(open(f"{out}/summary.md").read())
PY
