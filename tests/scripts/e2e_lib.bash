# Shared by tests/scripts/resume_*.sh and fault_*.sh (sourced, not run): a tiny synthetic data set,
# a tiny config, and helpers to launch lockstep-train under mpirun and read checkpoint headers.
# Callers set BUILD (the build dir) first. Exit 77 = skipped, with the reason printed.

set -uo pipefail
SOURCE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TRAIN=$BUILD/apps/lockstep-train
SHARD=$BUILD/apps/lockstep-shard
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
# Every run in these tests must end; anything slower than this is a hang.
RUN_TIMEOUT=${LOCKSTEP_E2E_RUN_TIMEOUT:-120}

skip() { echo "SKIP: $*" >&2; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
note() { echo "--- $*" >&2; }

e2e_require_trainer() {
  [ -x "$TRAIN" ] || skip "$TRAIN not built (the trainer is not on this branch yet)"
  [ -x "$SHARD" ] || skip "$SHARD not built"
  command -v mpirun >/dev/null || skip "mpirun not installed"
  # Captured first: grep -q would close the pipe early, and pipefail would turn SIGPIPE into "no".
  local help
  help=$("$TRAIN" --help 2>/dev/null)
  grep -q "checkpoint.dir" <<<"$help" || skip "this lockstep-train has no checkpoint.* options yet"
}

# WORK: a fresh folder, removed at exit unless LOCKSTEP_KEEP_E2E=1.
e2e_workdir() {
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-$1.XXXXXX")
  if [ "${LOCKSTEP_KEEP_E2E:-0}" != 1 ]; then
    trap 'rm -rf "$WORK"' EXIT
  else
    echo "keeping $WORK" >&2
  fi
}

# Synthetic data, learnable but not trivially (losses stay well above 0 over the tests' steps, so
# comparisons of losses mean something): 4 classes, 16 features = centroid + wide noise; 512 training
# and 128 test samples from a fixed awk seed, sharded in 2 files each.
e2e_make_data() {
  mkdir -p "$WORK/data"
  local split n seed
  for split in train:512:11 test:128:12; do
    IFS=: read -r name n seed <<<"$split"
    awk -v n="$n" -v seed="$seed" 'BEGIN {
      srand(seed);
      for (i = 0; i < n; i++) {
        c = i % 4; line = c;
        for (f = 0; f < 16; f++) {
          centre = (f % 4 == c) ? 1.0 : 0.0;
          line = line "," sprintf("%.4f", centre + (rand() - 0.5) * 5.0);
        }
        print line;
      }
    }' >"$WORK/data/$name.csv"
    "$SHARD" csv --file="$WORK/data/$name.csv" --label-column=0 --shape=16 --classes=4 \
      --out="$WORK/data" --name="$name" --shards=2 >"$WORK/shard.log" 2>&1 ||
      { cat "$WORK/shard.log" >&2; fail "lockstep-shard csv failed for $name"; }
  done
}

# Real data: a subset of Debian's Fashion-MNIST (LIMIT training and TEST_LIMIT test images) as
# $WORK/data/train-* and test-*, 2 shards each. Skips without the package.
e2e_fashion_subset() {
  local fashion=/usr/share/datasets/fashion-mnist
  [ -f "$fashion/train-images-idx3-ubyte.gz" ] ||
    skip "$fashion missing (apt-get install dataset-fashion-mnist)"
  "$SHARD" fashion-mnist --out="$WORK/data" --shards=2 --limit="$1" --test-limit="$2" \
    >"$WORK/shard.log" 2>&1 || { cat "$WORK/shard.log" >&2; fail "lockstep-shard fashion-mnist failed"; }
}

# The config: 512 samples / global batch 32 = 16 steps per epoch. Constant LR after a short
# warm-up, because train.max_steps also sets the length of decaying schedules, and the tests cut
# runs with it: a run cut at step s must be the first s steps of the long run.
e2e_write_config() {
  cat >"$WORK/tiny.ini" <<INI
[data]
train = $WORK/data/train
test = $WORK/data/test

[model]
spec = mlp:32

[train]
epochs = ${E2E_EPOCHS:-4}
global_batch = 32
seed = 5
threads = 1
eval = false

[optim]
name = sgd
lr = 0.05
momentum = 0.9
schedule = constant
warmup_steps = 3

[log]
every = 1
progress = lines
INI
}

# run_train NP LOGFILE ARGS...: lockstep-train under mpirun with NP ranks; returns its status.
run_train() {
  local np=$1 log=$2
  shift 2
  echo "+ mpirun -np $np lockstep-train --config $WORK/tiny.ini $*" >>"$log"
  timeout -k 10 "$RUN_TIMEOUT" mpirun -np "$np" --oversubscribe --bind-to none \
    "$TRAIN" --config "$WORK/tiny.ini" "$@" >>"$log" 2>&1
}

# header_field FILE KEY: a field of a checkpoint's text header (docs/CHECKPOINTS.md).
header_field() { head -c 512 "$1" | tr -d '\0' | sed -n "s/^$2=//p"; }

# latest_step DIR: the highest step among DIR/ckpt-*.h5 file names (empty when none).
latest_step() {
  local f
  f=$(ls "$1"/ckpt-*.h5 2>/dev/null | sort | tail -n1)
  [ -n "$f" ] && basename "$f" .h5 | sed 's/^ckpt-0*//; s/^$/0/'
}

# metric STEP KEY METRICS_FILE: the value of KEY in the record of STEP (training records only).
metric() {
  grep "\"step\": $1," "$3" | grep '"loss"' | head -n1 | sed -n "s/.*\"$2\": \([^,}]*\).*/\1/p"
}

# show_log FILE: the last lines of a run's log, for failure messages.
show_log() { echo "----- $1 (tail)" >&2; tail -n 25 "$1" >&2; echo "-----" >&2; }

# start_train_bg NP LOGFILE ARGS...: like run_train, in the background; sets TRAIN_JOB (the
# `timeout` wrapper's pid) and MPIRUN_PID.
start_train_bg() {
  local np=$1 log=$2 i
  shift 2
  echo "+ mpirun -np $np lockstep-train --config $WORK/tiny.ini $* (background)" >>"$log"
  timeout -k 10 "$RUN_TIMEOUT" mpirun -np "$np" --oversubscribe --bind-to none \
    "$TRAIN" --config "$WORK/tiny.ini" "$@" >>"$log" 2>&1 &
  TRAIN_JOB=$!
  MPIRUN_PID=
  for i in $(seq 50); do
    MPIRUN_PID=$(pgrep -P "$TRAIN_JOB" -x mpirun | head -n1)
    [ -n "$MPIRUN_PID" ] && break
    sleep 0.1
  done
  [ -n "$MPIRUN_PID" ] || fail "mpirun did not start"
}

# rank_pids: the lockstep-train processes mpirun started (on one node, its direct children).
rank_pids() { pgrep -P "$MPIRUN_PID" -x lockstep-train; }

# wait_for_checkpoint DIR MIN_STEP SECONDS: until DIR has a checkpoint of step >= MIN_STEP.
wait_for_checkpoint() {
  local deadline=$((SECONDS + $3)) s
  while [ "$SECONDS" -lt "$deadline" ]; do
    s=$(latest_step "$1")
    [ -n "$s" ] && [ "$s" -ge "$2" ] && return 0
    kill -0 "$TRAIN_JOB" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# wait_job SECONDS: waits for the background run; sets JOB_RC and JOB_SECONDS. On timeout the run
# is ended (through its timeout wrapper) and JOB_RC is empty.
wait_job() {
  local start=$SECONDS deadline=$((SECONDS + $1))
  while kill -0 "$TRAIN_JOB" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      kill -TERM "$TRAIN_JOB" 2>/dev/null
      wait "$TRAIN_JOB" 2>/dev/null
      JOB_RC=
      JOB_SECONDS=$((SECONDS - start))
      return 1
    fi
    sleep 0.1
  done
  wait "$TRAIN_JOB"
  JOB_RC=$?
  JOB_SECONDS=$((SECONDS - start))
}

# first_step METRICS: the first training step recorded in a metrics file.
first_step() { grep '"loss"' "$1" | head -n1 | sed -n 's/.*"step": \([0-9]*\).*/\1/p'; }

# e2e_make_text_shards PARAGRAPHS OUT: a tiny corpus of varied sentences (PARAGRAPHS paragraphs of
# 4, from a fixed awk seed) in $WORK/corpus.txt, sharded with the bytes tokenizer into OUT/train and
# OUT/val (10% held out, 2 shards).
e2e_make_text_shards() {
  awk -v paragraphs="$1" 'BEGIN {
    srand(7);
    split("the a one every some", det); split("king shepherd river city stone lamp", noun);
    split("saw built carried blessed found kept", verb);
    for (p = 0; p < paragraphs; p++) {
      for (s = 0; s < 4; s++)
        printf "%s %s %s %s %s. ", det[int(rand() * 5) + 1], noun[int(rand() * 6) + 1],
          verb[int(rand() * 6) + 1], det[int(rand() * 5) + 1], noun[int(rand() * 6) + 1];
      printf "\n\n";
    }
  }' >"$WORK/corpus.txt"
  "$SHARD" text --input="$WORK/corpus.txt" --tokenizer=bytes --out="$2" --name=train \
    --shards=2 --val-fraction=0.1 --documents=paragraph >"$WORK/shard.log" 2>&1 ||
    { cat "$WORK/shard.log" >&2; fail "lockstep-shard text failed"; }
}

# wait_for_training METRICS: until the background run (start_train_bg) has logged a training
# record, so that a signal lands mid-training; returns non-zero when it never does.
wait_for_training() {
  local i
  for i in $(seq 600); do
    grep -q '"loss"' "$1" 2>/dev/null && return 0
    kill -0 "$TRAIN_JOB" 2>/dev/null || break
    sleep 0.1
  done
  grep -q '"loss"' "$1" 2>/dev/null
}
