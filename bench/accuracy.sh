#!/usr/bin/env bash
# Fashion-MNIST test accuracy of the shipped configs, trained to the end with DDP (a benchmark,
# not a CI test: minutes per config). Targets (published references: MLPs ~0.88-0.89, small CNNs
# 0.91-0.93): fashion_mlp >= 0.89, fashion_cnn >= 0.91.
#   bench/accuracy.sh                     both configs, 2 ranks
#   RANKS=4 CONFIGS="fashion_cnn" bench/accuracy.sh
# Writes results/accuracy/<config>.jsonl (metrics) and results/accuracy/summary.md; exits 1 when a
# target is missed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
RANKS=${RANKS:-2}
CONFIGS=${CONFIGS:-"fashion_mlp fashion_cnn"}
OUT=${OUT:-results/accuracy}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
[ -x build/apps/lockstep-train ] || scripts/build.sh
ls data/fashion-mnist/train-*-of-*.h5 >/dev/null 2>&1 ||
  build/apps/lockstep-shard fashion-mnist --out=data/fashion-mnist --shards=4
mkdir -p "$OUT"
declare -A target=([fashion_mlp]=0.89 [fashion_cnn]=0.91)
{
  echo "# Fashion-MNIST accuracy ($(date -u +%Y-%m-%d), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $RANKS ranks)"
  echo
  echo "| config | model | epochs | global batch | wall time | samples/s | test accuracy | target |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$OUT/summary.md"
status=0
for c in $CONFIGS; do
  echo "accuracy: training configs/$c.ini with $RANKS ranks (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  mpirun -np "$RANKS" --oversubscribe --bind-to none build/apps/lockstep-train \
    --config "configs/$c.ini" --log.metrics="$OUT/$c.jsonl" --log.progress=lines "$@" 2>&1 |
    grep -E "^(lockstep|epoch|done)" >&2
  final=$(grep '"event": "final"' "$OUT/$c.jsonl")
  field() { sed -n "s/.*\"$1\": \([^,}]*\).*/\1/p" <<<"$final"; }
  acc=$(field test_accuracy)
  spec=$(sed -n 's/^spec *= *//p' "configs/$c.ini")
  epochs=$(field epochs)
  batch=$(sed -n 's/^global_batch *= *//p' "configs/$c.ini")
  wall=$(awk -v s="$(field wall_s)" 'BEGIN { printf "%dm%02ds", s / 60, s % 60 }')
  sps=$(awk -v s="$(field samples_per_s)" 'BEGIN { printf "%.0f", s }')
  t=${target[$c]:-0}
  ok=$(awk -v a="$acc" -v t="$t" 'BEGIN { print (a >= t) ? "met" : "MISSED" }')
  [ "$ok" = met ] || status=1
  echo "| $c | \`$spec\` | $epochs | $batch | $wall | $sps | $acc | >= $t ($ok) |" >>"$OUT/summary.md"
done
cat "$OUT/summary.md"
exit $status
