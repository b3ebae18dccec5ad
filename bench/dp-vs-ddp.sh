#!/usr/bin/env bash
# DataParallel (threads in one process) against DDP (one MPI rank per replica) on this machine:
# the same model, data and global batch; DP with 1..K replicas and DDP with 1..K ranks, plus DDP
# with K ranks and no gradient communication (--dist.sync=false, the upper bound). Every run is a
# fixed number of optimizer steps whose first WARMUP steps are not measured, repeated R times
# (the repetitions interleave the configurations so that a change in machine load hits all of
# them); the figures are medians. docs/DP-VS-DDP.md explains the output.
#
# Usage (repository root, after scripts/build.sh; builds and shards the data itself if needed):
#   bench/dp-vs-ddp.sh                 # MLP 784-1024-1024-10, batch 256, K=2, R=3
#   K=4 R=5 bench/dp-vs-ddp.sh         # more replicas/ranks (ranks oversubscribe the cores)
#   MODEL=cnn bench/dp-vs-ddp.sh       # configs/fashion_cnn.ini's CNN instead
# Settings (environment): K, R, STEPS (100), WARMUP (20), LOG_EVERY (10), BATCH (256),
#   THREADS (1: CPU threads per replica/rank, so N replicas use N cores, like N devices),
#   MODEL (mlp|cnn), DATA (data/fashion-mnist), OUT_DIR (results/dp-vs-ddp/<date>),
#   LOCKSTEP_BUILD_DIR (build), LOCKSTEP_BIN_DIR (the folder of lockstep-train; <build>/apps).
# Output in OUT_DIR: runs.jsonl (one line per run: configuration, command, load, exit code),
#   raw/<run>.jsonl (the trainer's metrics), raw/<run>.cpu.json (per-thread CPU time over the
#   measured steps), raw/<run>.log, machine.json, summary.json, table.md, dp-vs-ddp.png.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
K=${K:-2}
R=${R:-3}
STEPS=${STEPS:-100}
WARMUP=${WARMUP:-20}
LOG_EVERY=${LOG_EVERY:-10}
BATCH=${BATCH:-256}
THREADS=${THREADS:-1}
MODEL=${MODEL:-mlp}
DATA=${DATA:-data/fashion-mnist}
BUILD=${LOCKSTEP_BUILD_DIR:-$ROOT/build}
OUT_DIR=${OUT_DIR:-results/dp-vs-ddp/$(date +%Y-%m-%d_%H%M%S)}

die() { echo "dp-vs-ddp: $*" >&2; exit 2; }
case "$MODEL" in
  mlp) CONFIG=configs/fashion_mlp.ini SPEC="mlp:1024,1024" ;;
  cnn) CONFIG=configs/fashion_cnn.ini
       SPEC=$(sed -n 's/^spec *= *//p' "$CONFIG") ;;
  *) die "MODEL must be mlp or cnn, got '$MODEL'" ;;
esac
# The utilisation window runs from the record of step WARMUP to the last record before the
# final one, so it needs at least two measured intervals.
(( WARMUP % LOG_EVERY == 0 && STEPS % LOG_EVERY == 0 && STEPS >= WARMUP + 2 * LOG_EVERY )) ||
  die "STEPS ($STEPS) and WARMUP ($WARMUP) must be multiples of LOG_EVERY ($LOG_EVERY), STEPS >= WARMUP + 2 x LOG_EVERY"
command -v mpirun >/dev/null || die "mpirun not found (install Open MPI)"
command -v python3 >/dev/null || die "python3 not found"

# ---- build and data, only when missing
BIN_DIR=${LOCKSTEP_BIN_DIR:-$BUILD/apps}  # a folder of the programs instead (bench/gpu-check.sh's bundle)
TRAIN=$BIN_DIR/lockstep-train SHARD=$BIN_DIR/lockstep-shard
if [ ! -x "$TRAIN" ] || { [ ! -x "$SHARD" ] && ! compgen -G "$DATA/train-*.h5" >/dev/null; }; then
  echo "== building lockstep (scripts/build.sh)"
  LOCKSTEP_BUILD_DIR=$BUILD scripts/build.sh
fi
if ! compgen -G "$DATA/train-*.h5" >/dev/null; then
  echo "== sharding Fashion-MNIST into $DATA"
  "$SHARD" fashion-mnist --out="$DATA" --shards=4
fi

export OMP_WAIT_POLICY=PASSIVE  # no spinning thread pools between ranks that share cores
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none)

mkdir -p "$OUT_DIR/raw"
loadavg() { awk '{printf "[%s, %s, %s]", $1, $2, $3}' /proc/loadavg; }
CPU_MODEL=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
cat >"$OUT_DIR/machine.json" <<EOF
{"cpu_model": "$CPU_MODEL", "cores": $(nproc), "mem_total_kib": $(awk '/MemTotal/{print $2}' /proc/meminfo),
 "load_avg_start": $(loadavg), "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "host": "$(hostname)",
 "git_commit": "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)",
 "mpirun": "$(mpirun --version 2>/dev/null | head -1)",
 "sched_autogroup_enabled": $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo null)}
EOF
SETTINGS="{\"model\": \"$MODEL\", \"model_spec\": \"$SPEC\", \"config\": \"$CONFIG\", \"global_batch\": $BATCH, \"threads\": $THREADS, \"steps\": $STEPS, \"warmup_steps\": $WARMUP, \"log_every\": $LOG_EVERY, \"reps\": $R, \"k\": $K}"
echo "== dp-vs-ddp: $OUT_DIR  (load average $(loadavg), $(nproc) cores, model $MODEL, K=$K, R=$R)"

COMMON=(--config "$CONFIG" --model.spec="$SPEC" --data.train="$DATA/train" --data.test="$DATA/test"
        --train.global_batch="$BATCH" --train.max_steps="$STEPS" --train.eval=false
        --train.threads="$THREADS" --log.every="$LOG_EVERY" --log.progress=none
        --optim.schedule=constant --optim.warmup_steps=0)  # speed does not depend on the lr

# DDP needs the global batch divisible by the ranks; N that do not divide it are left out for
# both modes, so that every row compares the same per-replica batch.
configs=() nmax=1
for ((n = 1; n <= K; n++)); do
  if (( BATCH % n )); then echo "dp-vs-ddp: N=$n left out: BATCH $BATCH is not a multiple of it" >&2; continue; fi
  configs+=("dp $n" "ddp $n") nmax=$n
done
if (( nmax > 1 )); then configs+=("ddp-nosync $nmax"); fi

: >"$OUT_DIR/runs.jsonl"
total=$(( R * ${#configs[@]} )) count=0
for ((rep = 1; rep <= R; rep++)); do
  for c in "${configs[@]}"; do
    read -r mode n <<<"$c"
    name=$mode-n$n-r$rep
    metrics=raw/$name.jsonl
    case $mode in
      dp) cmd=("$TRAIN" "${COMMON[@]}" --train.parallel=dp --train.replicas="$n") ;;
      ddp) cmd=("${MPIRUN[@]}" -np "$n" "$TRAIN" "${COMMON[@]}" --train.parallel=ddp) ;;
      ddp-nosync) cmd=("${MPIRUN[@]}" -np "$n" "$TRAIN" "${COMMON[@]}" --train.parallel=ddp
                       --dist.sync=false) ;;
    esac
    cmd+=(--log.metrics="$OUT_DIR/$metrics")
    rm -f "$OUT_DIR/$metrics"
    count=$((count + 1))
    before=$(loadavg)
    t0=$(date +%s.%N)
    set +e
    python3 bench/dp_vs_ddp.py watch --metrics "$OUT_DIR/$metrics" --from-step "$WARMUP" \
      --to-step "$STEPS" --out "$OUT_DIR/raw/$name.cpu.json" -- "${cmd[@]}" \
      >"$OUT_DIR/raw/$name.log" 2>&1
    rc=$?
    set -e
    wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}')
    sps=$(sed -n 's/.*"event": *"final".*"samples_per_s": *\([0-9.e+]*\).*/\1/p' \
      "$OUT_DIR/$metrics" 2>/dev/null | head -1 || true)
    printf '  [%2d/%d] %-10s N=%d rep %d: exit %d, %6.1f s, %s samples/s (whole run), load %s\n' \
      "$count" "$total" "$mode" "$n" "$rep" "$rc" "$wall" "${sps:-?}" "$before"
    [ "$rc" -eq 0 ] || { echo "    failed; last lines of raw/$name.log:"; tail -5 "$OUT_DIR/raw/$name.log" | sed 's/^/    /'; }
    cmd_json=$(printf '%s\n' "${cmd[@]}" | python3 -c 'import json,sys; print(json.dumps(" ".join(sys.stdin.read().split("\n")).strip()))')
    echo "{\"mode\": \"$mode\", \"n\": $n, \"rep\": $rep, \"exit_code\": $rc, \"wall_s\": $wall, \"load_before\": $before, \"load_after\": $(loadavg), \"metrics\": \"$metrics\", \"cpu\": \"raw/$name.cpu.json\", \"global_batch\": $BATCH, \"warmup_steps\": $WARMUP, \"command\": $cmd_json, \"settings\": $SETTINGS}" >>"$OUT_DIR/runs.jsonl"
  done
done

# ---- summary, table, plot
python3 - "$OUT_DIR/machine.json" "$(loadavg)" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); m["load_avg_end"] = json.loads(sys.argv[2])
json.dump(m, open(sys.argv[1], "w"))
EOF
echo
python3 bench/dp_vs_ddp.py summarize "$OUT_DIR" || die "no run succeeded; see $OUT_DIR/raw/*.log"
if command -v gnuplot >/dev/null; then
  LOAD1=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["load_avg_start"][0])' "$OUT_DIR/machine.json")
  gnuplot -e "dir='$OUT_DIR'; k=$nmax; title='$MODEL, batch $BATCH, $THREADS thread(s) per replica/rank, $(nproc) cores, load avg $LOAD1 at start'" \
    bench/dp-vs-ddp.gp && echo "plot: $OUT_DIR/dp-vs-ddp.png"
else
  echo "gnuplot not found: no plot (the data is in $OUT_DIR/throughput.dat and split.dat)"
fi
echo "results: $OUT_DIR"
failed=$(grep -c '"exit_code": [^0]' "$OUT_DIR/runs.jsonl" || true)
[ "$failed" -eq 0 ] || { echo "dp-vs-ddp: $failed run(s) failed (left out of the summary)" >&2; exit 1; }
