#!/usr/bin/env bash
# Memory per rank of fashion_mlp DDP (configs/fashion_mlp.ini, MLP 784-1024-1024-10, Fashion-MNIST
# u8 shards held in memory), with data.node_shared = off (one copy of the data per rank) and on
# (one copy per node, in shared memory), measured in one go:
#   - peak RSS per rank (VmHWM: every page the rank ever touched, shared pages counted in full)
#   - PSS per rank at the end (shared pages divided between the ranks that map them)
#   - the largest mappings of one rank near the end of its run (from /proc/PID/smaps)
#   bench/rss.sh                           2 ranks, 400 steps, build/
#   BUILD=build-cpu RANKS=4 STEPS=800 bench/rss.sh
# A binary built with CUDA links only the CUDA runtime and opens cuBLAS(Lt), cuDNN and NCCL on
# first GPU use (src/ops/cuda/dynload.hpp); the summary says whether a rank of this CPU run mapped
# any of them. BUILD=build-cpu for a -DLOCKSTEP_CUDA=OFF binary. Writes results/rss/summary.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build}
RANKS=${RANKS:-2}
STEPS=${STEPS:-400}
OUT=${OUT:-results/rss}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
[ -x "$BUILD/apps/lockstep-train" ] || { echo "rss.sh: no $BUILD/apps/lockstep-train" >&2; exit 1; }
ls data/fashion-mnist/train-*-of-*.h5 >/dev/null 2>&1 ||
  "$BUILD/apps/lockstep-shard" fashion-mnist --out=data/fashion-mnist --shards=4
mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"
{
  echo "# bench/rss.sh: fashion_mlp DDP, $RANKS ranks, $STEPS steps, $BUILD"
  echo
  echo "$(date -u +%FT%TZ); uptime at start: $(uptime)"
  needed=$(ldd "$BUILD/apps/lockstep-train")  # whole, not piped into grep -q (pipefail: SIGPIPE)
  echo "binary built with CUDA: $(grep -q libcudart <<<"$needed" && echo yes || echo no)"
  echo "binary links cuBLAS/cuDNN/NCCL: $(grep -qE 'cublas|cudnn|nccl' <<<"$needed" && echo yes || echo no)"
  echo
} >"$SUMMARY"

# Copies every rank's smaps once a second while the job runs; the last copy is what is left.
watch_smaps() {  # watch_smaps MPIRUN_PID DIR
  local job=$1 dir=$2
  mkdir -p "$dir"
  while kill -0 "$job" 2>/dev/null; do
    for pid in $(pgrep -P "$job" -f lockstep-train 2>/dev/null); do
      cat "/proc/$pid/smaps" >"$dir/smaps.$pid.tmp" 2>/dev/null && mv "$dir/smaps.$pid.tmp" "$dir/smaps.$pid"
    done
    sleep 1
  done
}

for mode in off on; do
  metrics="$OUT/metrics-$mode.jsonl"
  rm -f "$metrics"
  rm -rf "$OUT/smaps-$mode"
  mpirun -np "$RANKS" --oversubscribe --bind-to none "$BUILD/apps/lockstep-train" \
    --config configs/fashion_mlp.ini --train.max_steps="$STEPS" \
    --data.node_shared="$mode" --log.progress=none --log.metrics="$metrics" \
    >"$OUT/log-$mode.txt" 2>&1 &
  job=$!
  watch_smaps "$job" "$OUT/smaps-$mode" &
  watcher=$!
  wait "$job"
  wait "$watcher" || true
  python3 - "$metrics" "$mode" "$OUT/smaps-$mode" >>"$SUMMARY" <<'EOF'
import collections, glob, json, sys
metrics, mode, smaps_dir = sys.argv[1:]
final = [json.loads(l) for l in open(metrics) if '"event": "final"' in l or '"event":"final"' in l][-1]
mib = lambda b: b / 2**20
rss = [mib(b) for b in final["rank_peak_rss_bytes"]]
pss = [mib(b) for b in final["rank_pss_bytes"]]
print(f"## data.node_shared = {mode}\n")
print("| rank | peak RSS (VmHWM) MiB | PSS at end MiB |\n| --- | --- | --- |")
for r, (a, b) in enumerate(zip(rss, pss)):
    print(f"| {r} | {a:.1f} | {b:.1f} |")
print(f"| max | {max(rss):.1f} | {max(pss):.1f} |\n")
files = sorted(glob.glob(smaps_dir + "/smaps.*"))
if files:
    # The last rank's last snapshot (a reader of the shared copy when sharing is on).
    by = collections.Counter()
    name = ""
    for line in open(files[-1]):
        f = line.split()
        if "-" in f[0] and len(f) >= 5 and ":" not in f[0]:
            name = f[5] if len(f) > 5 else "[anonymous]"
            name = name.split("/")[-1]
        elif f[0] in ("Rss:",):
            by[name] += int(f[1])
    print("largest mappings of one rank near its end (Rss, MiB):\n")
    for n, kb in by.most_common(8):
        print(f"- {n}: {kb / 1024:.1f}")
    cuda = sorted(n for n in by if any(k in n for k in ("cublas", "cudnn", "nccl")))
    print(f"\ncuBLAS/cuDNN/NCCL mapped by this rank: {', '.join(cuda) if cuda else 'none'}")
    print()
EOF
done
echo "uptime at end: $(uptime)" >>"$SUMMARY"
cat "$SUMMARY"
