#!/usr/bin/env bash
# Flat vs hierarchical vs raw MPI_Allreduce on the namespace cluster (2 hosts x 2 ranks by
# default), with the inter-host links unshaped and shaped by scripts/local-slurm/shape.sh:
# `lockstep-bench allreduce` under srun for bucket sizes 1-64 MiB, its nccl-tests-style table
# and JSON kept per link setting, with the load average before and after each run.
#
# Usage: bench/multinode-allreduce.sh [OUT_DIR]        (default results/multinode-allreduce)
#   LOCKSTEP_BUILD_DIR   build folder                         [build]
#   MN_RATES             link settings, "none" = unshaped     ["none 10gbit 1gbit"]
#   MN_NODES / MN_PER_NODE                                    [2 / 2]
#   MN_REPS / MN_WARMUP  lockstep-bench --reps / --warmup     [5 / 1]
# The cluster is started if it is not up, and stopped again at the end in that case.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${LOCKSTEP_BUILD_DIR:-$ROOT/build}
OUT=${1:-$ROOT/results/multinode-allreduce}
RATES=${MN_RATES:-none 10gbit 1gbit}
NODES=${MN_NODES:-2}
PER_NODE=${MN_PER_NODE:-2}
BENCH=$BUILD/apps/lockstep-bench
[ -x "$BENCH" ] || { echo "build lockstep-bench first ($BENCH)" >&2; exit 1; }
mkdir -p "$OUT"

started=0
if ! bash "$ROOT/scripts/local-slurm/start.sh" --hosts="$NODES" --status; then
  bash "$ROOT/scripts/local-slurm/start.sh" --hosts="$NODES"
  started=1
fi
cleanup() {
  bash "$ROOT/scripts/local-slurm/shape.sh" --off >/dev/null 2>&1 || true
  [ "$started" = 1 ] && bash "$ROOT/scripts/local-slurm/stop.sh" --hosts
  return 0
}
trap cleanup EXIT
source "${LOCKSTEP_CLUSTER_BASE:-/tmp/lockstep-cluster}/env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

for rate in $RATES; do
  if [ "$rate" = none ]; then
    bash "$ROOT/scripts/local-slurm/shape.sh" --off
  else
    bash "$ROOT/scripts/local-slurm/shape.sh" --rate="$rate"
  fi
  cmd=(srun -N"$NODES" --ntasks-per-node="$PER_NODE" "$BENCH" allreduce --minbytes=1048576
    --maxbytes=67108864 --step=2 --reps="${MN_REPS:-5}" --warmup="${MN_WARMUP:-1}"
    --out="$OUT/$rate.json")
  {
    echo "# link: $rate; command: ${cmd[*]}"
    echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores); $(date -Is)"
  } >"$OUT/$rate.txt"
  "${cmd[@]}" 2>>"$OUT/$rate.txt"
  echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg); $(date -Is)" >>"$OUT/$rate.txt"
  cat "$OUT/$rate.txt"
done
