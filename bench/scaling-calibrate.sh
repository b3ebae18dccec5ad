#!/usr/bin/env bash
# Calibrates the scaling model (docs/SCALING.md) on this machine and checks it against DDP runs:
#   1. shared memory: `lockstep-bench allreduce` at 2, 3 and 4 ranks on this host
#   2. TCP between namespace hosts (scripts/local-slurm/start.sh --hosts=2), unshaped and rate-
#      shaped with tbf (shape.sh --rate): 2 hosts x 1 rank (the link alone) and 2 hosts x 2 ranks
#      (flat and hierarchical, to check how the model composes the two links)
#   3. alpha and bandwidth fitted by least squares over sizes (`lockstep-bench scaling fit`)
#   4. DDP training steps (lockstep-train, MLP and CNN, global batch 256, 1 thread per rank): 1 rank,
#      2 and 4 ranks on this host, 2 hosts x 1 rank and 2 x 2 over the shaped link; each with
#      gradient sync and without (--dist.sync=false), interleaved
#   5. the model's predictions for those runs (`lockstep-bench scaling check`, `scaling allreduce`)
# Run it prioritised over other sessions, as docs/PERFORMANCE.md does:
#   setsid bash -c 'echo -15 > /proc/self/autogroup; bench/scaling-calibrate.sh'
# Environment: OUT [results/scaling], REPS [3], STEPS [60], MODELS ["mlp cnn"],
#   RATES (shaped link settings) ["none 1gbit"], SKIP_CLUSTER=1 (shared memory only),
#   CLUSTER_MODELS (DDP runs between hosts) ["mlp"], CLUSTER_WAIT (seconds to wait for another
#   session's namespace cluster to go away; the names are fixed) [1800],
#   AR_MAX (largest allreduce, bytes) [16777216], FIT_MIN (smallest fitted) [16384],
#   LOCKSTEP_BUILD_DIR [build].
# Needs root for the namespace cluster (it is skipped, with the reason, otherwise).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${LOCKSTEP_BUILD_DIR:-$ROOT/build}
OUT=${OUT:-$ROOT/results/scaling}
REPS=${REPS:-3}
STEPS=${STEPS:-60}
MODELS=${MODELS:-mlp cnn}
RATES=${RATES:-none 1gbit}
AR_MAX=${AR_MAX:-16777216}
# Fits start above lockstep's recursive-doubling range (<= 8 KiB), where the ring's equation holds.
FIT_MIN=${FIT_MIN:-16384}
CLUSTER_MODELS=${CLUSTER_MODELS:-mlp}
CLUSTER_WAIT=${CLUSTER_WAIT:-1800}
BENCH=$BUILD/apps/lockstep-bench
TRAIN=$BUILD/apps/lockstep-train
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
if [ ! -x "$BENCH" ] || [ ! -x "$TRAIN" ]; then
  echo "scaling-calibrate: build first ($BUILD)" >&2
  exit 1
fi
ls data/fashion-mnist/train-*-of-*.h5 >/dev/null 2>&1 ||
  "$BUILD/apps/lockstep-shard" fashion-mnist --out=data/fashion-mnist --shards=4
mkdir -p "$OUT"
log() { echo "scaling-calibrate: $* (load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M:%S) UTC)" | tee -a "$OUT/log.txt" >&2; }
: >"$OUT/log.txt"
log "start; $(nproc) cores; autogroup nice $(sed 's/.*nice //' /proc/self/autogroup 2>/dev/null)"

config_of() { echo "configs/fashion_$1.ini"; }
allreduce() {  # allreduce OUTFILE LAUNCH...   (the launcher and its arguments)
  local out=$1
  shift
  "$@" "$BENCH" allreduce --minbytes=4 --maxbytes="$AR_MAX" --step=4 --reps=5 --warmup=2 \
    --out="$out" 2>"${out%.json}.txt"
}
# ddp SETTING NAME RANKS SYNC MODEL LAUNCH...: one training run, its interval records tagged.
ddp() {
  local setting=$1 name=$2 np=$3 sync=$4 model=$5 metrics="$OUT/tmp-metrics.jsonl"
  shift 5
  "$@" "$TRAIN" --config "$(config_of "$model")" --train.global_batch=256 --train.threads=1 \
    --train.max_steps="$STEPS" --train.eval=false --optim.schedule=constant \
    --optim.warmup_steps=0 --log.every=10 --log.progress=none --dist.sync="$sync" \
    --log.metrics="$metrics" >/dev/null
  # Every interval record but the first (warm-up: allocation, first buckets).
  grep '"step_time_s"' "$metrics" | tail -n +2 |
    sed "s/^{/{\"setting\": \"$setting\", \"run\": \"$name\", \"ranks\": $np, /" >>"$OUT/runs-$model.jsonl"
}
# Launchers: NP then the command.
local_mpi() {
  local np=$1
  shift
  mpirun -np "$np" --oversubscribe --bind-to none "$@"
}

# ---- 1. shared memory: allreduce, then DDP on this host
for np in 2 3 4; do
  log "allreduce, shared memory, $np ranks"
  allreduce "$OUT/shm-np$np.json" local_mpi "$np"
done
for model in $MODELS; do : >"$OUT/runs-$model.jsonl"; done
for rep in $(seq 1 "$REPS"); do
  for model in $MODELS; do
    log "DDP $model, repetition $rep/$REPS, this host"
    ddp shm one_rank 1 true "$model" local_mpi 1
    for np in 2 4; do  # interleaved, so drifting load hits every variant alike
      ddp shm ddp_sync "$np" true "$model" local_mpi "$np"
      ddp shm ddp_nosync "$np" false "$model" local_mpi "$np"
    done
  done
done

# ---- 2. the namespace cluster (kept up only for this part: other sessions' tests use it too)
cluster=0
if [ "${SKIP_CLUSTER:-0}" != 1 ]; then
  # The cluster's names and ports are fixed: wait while another session's cluster is up.
  waited=0
  while ip netns list 2>/dev/null | grep -qE '^lockstep-' && [ "$waited" -lt "$CLUSTER_WAIT" ]; do
    [ "$waited" = 0 ] && log "a namespace cluster is up (another session's?): waiting up to ${CLUSTER_WAIT}s"
    sleep 10
    waited=$((waited + 10))
  done
  if ip netns list 2>/dev/null | grep -qE '^lockstep-'; then
    log "a namespace cluster is still up after ${CLUSTER_WAIT}s: TCP parts skipped"
  else
    set +e
    bash scripts/local-slurm/start.sh --hosts=2 >"$OUT/cluster-start.txt" 2>&1
    rc=$?
    set -e
    if [ $rc = 0 ]; then
      cluster=1
    else
      log "namespace cluster not started (exit $rc): $(tail -n1 "$OUT/cluster-start.txt"); TCP parts skipped"
    fi
  fi
fi
cleanup() {
  if [ "$cluster" = 1 ]; then
    bash scripts/local-slurm/shape.sh --off >/dev/null 2>&1 || true
    bash scripts/local-slurm/stop.sh --hosts >/dev/null 2>&1 || true
    cluster=0
  fi
  rm -f "$OUT/tmp-metrics.jsonl"
}
trap cleanup EXIT
if [ "$cluster" = 1 ]; then
  # shellcheck disable=SC1091
  source "${LOCKSTEP_CLUSTER_BASE:-/tmp/lockstep-cluster}/env.sh"
  # NP ranks over the 2 hosts, consecutive ranks on a host (so that a ring crosses the network
  # once per host, as on a real cluster; round-robin would cross it on every hop).
  hosts_mpi() {
    local np=$1
    shift
    mpirun --hostfile "$LOCKSTEP_CLUSTER_HOSTFILE" -np "$np" --map-by "ppr:$((np / 2)):node" \
      --bind-to none "$@"
  }
  shape() {
    if [ "$1" = none ]; then bash scripts/local-slurm/shape.sh --off >/dev/null
    else bash scripts/local-slurm/shape.sh --rate="$1" >/dev/null; fi
  }
  for rate in $RATES; do
    shape "$rate"
    log "allreduce, 2 hosts x 1 rank, link $rate"
    allreduce "$OUT/tcp-$rate-2x1.json" hosts_mpi 2
    log "allreduce, 2 hosts x 2 ranks, link $rate"
    allreduce "$OUT/tcp-$rate-2x2.json" hosts_mpi 4
  done
  for rep in $(seq 1 "$REPS"); do
    for model in $CLUSTER_MODELS; do
      for rate in $RATES; do
        shape "$rate"
        log "DDP $model, repetition $rep/$REPS, 2 hosts, link $rate"
        ddp "tcp-$rate-2x1" one_rank 1 true "$model" local_mpi 1
        for np in 2 4; do
          ddp "tcp-$rate-2x$((np / 2))" ddp_sync "$np" true "$model" hosts_mpi "$np"
          ddp "tcp-$rate-2x$((np / 2))" ddp_nosync "$np" false "$model" hosts_mpi "$np"
        done
      done
    done
  done
  cleanup
  # A 2 x 2 setting shares its one-rank baseline with the 2 x 1 one of the same link.
  for model in $CLUSTER_MODELS; do
    f=$OUT/runs-$model.jsonl
    grep '"run": "one_rank"' "$f" | grep '"setting": "tcp-' | sed 's/-2x1"/-2x2"/' >"$f.tmp"
    cat "$f.tmp" >>"$f"
    rm -f "$f.tmp"
  done
  cluster_done=1
fi

# ---- 3. fits
shm_files=$OUT/shm-np2.json,$OUT/shm-np3.json,$OUT/shm-np4.json
"$BENCH" scaling fit --runs="$shm_files" --min-bytes="$FIT_MIN" --out="$OUT/fit-shm.json" 2>"$OUT/fit-shm.txt"
if [ "${cluster_done:-0}" = 1 ]; then
  tcp_files=$(for r in $RATES; do printf '%s,' "$OUT/tcp-$r-2x1.json"; done)
  "$BENCH" scaling fit --runs="${tcp_files%,}" --min-bytes="$FIT_MIN" --out="$OUT/fit-tcp.json" 2>"$OUT/fit-tcp.txt"
fi
# fitted FILE COLUMN FIELD: a fitted value (alpha_us or gbs) from a fit JSON.
fitted() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
fits = json.load(open(sys.argv[1]))["fits"]
f = [x for x in fits if x["file"].endswith(sys.argv[2]) and x["column"] == "sync"]
print(f[0][sys.argv[3]])
PY
}

# ---- 5. the model against the runs (a failed check is logged, the others still run)
log "model checks"
try() { "$@" || log "failed: ${*:2:3} ... (its output: the .txt beside its --out)"; }
shm_link() {  # the shared-memory link fitted at NP ranks
  echo "--intra-alpha-us=$(fitted "$OUT/fit-shm.json" "shm-np$1.json" alpha_us)" \
    "--intra-gbs=$(fitted "$OUT/fit-shm.json" "shm-np$1.json" gbs)"
}
for model in $MODELS; do
  for np in 2 4; do
    # One shared-memory fit per rank count: the check at NP ranks uses the link fitted at NP.
    # shellcheck disable=SC2046
    try "$BENCH" scaling check --config="$(config_of "$model")" --global-batch=256 \
      --runs="$OUT/runs-$model.jsonl" --setting=shm --only-ranks="1,$np" $(shm_link "$np") \
      --out="$OUT/check-$model-shm-np$np.json" 2>"$OUT/check-$model-shm-np$np.txt"
  done
  if [ "${cluster_done:-0}" = 1 ] && [[ " $CLUSTER_MODELS " == *" $model "* ]]; then
    for rate in $RATES; do
      inter="--inter-alpha-us=$(fitted "$OUT/fit-tcp.json" "tcp-$rate-2x1.json" alpha_us) --inter-gbs=$(fitted "$OUT/fit-tcp.json" "tcp-$rate-2x1.json" gbs)"
      # shellcheck disable=SC2086,SC2046
      try "$BENCH" scaling check --config="$(config_of "$model")" --global-batch=256 \
        --runs="$OUT/runs-$model.jsonl" --setting="tcp-$rate-2x1" --ranks-per-node=1 $inter \
        --out="$OUT/check-$model-tcp-$rate-2x1.json" 2>"$OUT/check-$model-tcp-$rate-2x1.txt"
      # shellcheck disable=SC2086,SC2046
      try "$BENCH" scaling check --config="$(config_of "$model")" --global-batch=256 \
        --runs="$OUT/runs-$model.jsonl" --setting="tcp-$rate-2x2" --ranks-per-node=2 $inter \
        $(shm_link 2) --out="$OUT/check-$model-tcp-$rate-2x2.json" 2>"$OUT/check-$model-tcp-$rate-2x2.txt"
    done
  fi
done
if [ "${cluster_done:-0}" = 1 ]; then
  for rate in $RATES; do
    inter="--inter-alpha-us=$(fitted "$OUT/fit-tcp.json" "tcp-$rate-2x1.json" alpha_us) --inter-gbs=$(fitted "$OUT/fit-tcp.json" "tcp-$rate-2x1.json" gbs)"
    # shellcheck disable=SC2086,SC2046
    try "$BENCH" scaling allreduce --runs="$OUT/tcp-$rate-2x2.json" --ranks-per-node=2 $(shm_link 2) \
      $inter --out="$OUT/allreduce-tcp-$rate-2x2.json" 2>"$OUT/allreduce-tcp-$rate-2x2.txt"
  done
fi
log "done"
cat "$OUT"/fit-*.txt "$OUT"/check-*.txt "$OUT"/allreduce-*.txt 2>/dev/null
