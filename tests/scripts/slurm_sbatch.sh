#!/usr/bin/env bash
# A real Slurm job end to end: start the project's private single-node cluster
# (scripts/local-slurm/start.sh), submit with sbatch a job that trains configs/ci_tiny.ini on a
# Fashion-MNIST subset with 2 ranks through `srun --mpi=pmix`, then the slurm/train.sbatch
# template the same way; check each job COMPLETED with ExitCode 0:0 and its metrics file shows
# learning. LOCKSTEP_SLURM_TEST_JOB=allreduce runs the MPI-only job instead (srun, and mpirun
# inside the allocation, where every rank sees SLURM_PROCID=0).
#
# Usage: bash tests/scripts/slurm_sbatch.sh BUILD_DIR      (CTest: script_slurm_sbatch)
# Exit: 0 pass, 1 fail, 77 skipped (reason printed: not root, Slurm not installed, or the
# daemons cannot start on this machine).
# LOCKSTEP_KEEP_SLURM=1 leaves the cluster running afterwards (it is stopped otherwise, unless
# it was already running before the test). LOCKSTEP_SLURM_TEST_JOB=allreduce|train picks the
# job (see job_* below).
set -uo pipefail

BUILD=$(cd "${1:?usage: slurm_sbatch.sh BUILD_DIR}" && pwd)
SOURCE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export LOCKSTEP_SLURM_BASE=${LOCKSTEP_SLURM_BASE:-/tmp/lockstep-slurm}
JOB_KIND=${LOCKSTEP_SLURM_TEST_JOB:-train}
JOB_TIMEOUT=${LOCKSTEP_SLURM_JOB_TIMEOUT:-240}
WORK=$BUILD/slurm-test
START=$SOURCE/scripts/local-slurm/start.sh
STOP=$SOURCE/scripts/local-slurm/stop.sh

skip() { echo "SKIP: $*" >&2; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "needs root to run munged, slurmctld and slurmd"
for tool in sbatch squeue scontrol srun slurmctld slurmd munged; do
  command -v "$tool" >/dev/null || skip "$tool not installed (Debian: slurmctld slurmd slurm-client munge)"
done

# ---- the cluster: started here, stopped at exit unless it was up before or KEEP is set.
was_up=0
bash "$START" --status && was_up=1
cleanup() {
  if [ "$was_up" = 0 ] && [ "${LOCKSTEP_KEEP_SLURM:-0}" != 1 ]; then
    bash "$STOP"
  fi
}
trap cleanup EXIT
if [ "$was_up" = 0 ]; then
  bash "$START"
  rc=$?
  [ "$rc" = 77 ] && skip "local Slurm cannot run here (see the reason above)"
  if [ "$rc" != 0 ]; then
    tail -n 15 "$LOCKSTEP_SLURM_BASE"/log/*.log 2>/dev/null
    skip "the Slurm daemons did not start on this machine (start.sh exit $rc; logs above)"
  fi
fi
source "$LOCKSTEP_SLURM_BASE/env.sh"

rm -rf "$WORK"
mkdir -p "$WORK"

# ---- jobs. Each job_* writes the batch script body (after the #SBATCH lines) to stdout and
# each check_* checks the finished job's output file ($1) and work directory.

# The job for now: an MPI program of ours under srun (PMIx), then under mpirun inside the
# allocation, where every rank sees SLURM_PROCID=0 and must take its rank from MPI instead.
job_allreduce() {
  local bench=$BUILD/apps/lockstep-bench tests=$BUILD/tests/test_mpi
  [ -x "$bench" ] || fail "$bench not built"
  [ -x "$tests" ] || fail "$tests not built"
  cat <<JOB
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "batch: job \$SLURM_JOB_ID, \$SLURM_NTASKS tasks on \$SLURM_JOB_NODELIST"
srun --mpi=pmix -n 2 "$bench" allreduce --quick --out="$WORK/allreduce.json"
srun --mpi=pmix -n 2 "$tests" --gtest_filter='MpiBootstrap.*:MpiHostHelpers.*'
mpirun -np 2 "$tests" --gtest_filter='MpiBootstrap.*'
JOB
}
check_allreduce() {
  local out=$1 ok=0
  for r in 0 1; do
    grep -q "^# rank $r/2 .*launcher=srun" "$out" || { echo "no line for rank $r under srun"; ok=1; }
  done
  grep -q '"results": \[' "$WORK/allreduce.json" 2>/dev/null || { echo "no allreduce.json"; ok=1; }
  # test_mpi ran twice (srun, then mpirun in the allocation); set -e ends the job on a failure.
  [ "$(grep -c 'PASSED  \]' "$out")" = 2 ] || { echo "test_mpi did not pass under srun and mpirun"; ok=1; }
  return $ok
}

# The training job: lockstep-train on a real Fashion-MNIST subset with 2 ranks through srun,
# checked through its metrics file (the run learned: test accuracy well above chance).
job_train() {
  local train=$BUILD/apps/lockstep-train config=$SOURCE/configs/ci_tiny.ini
  [ -x "$train" ] || fail "$train not built"
  cat <<JOB
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
srun --mpi=pmix -n 2 "$train" --config "$config" --data.train="$WORK/data/train" \
  --data.test="$WORK/data/test" --log.metrics="$WORK/train/metrics.jsonl"
JOB
}
# check_learned METRICS: a final record with test accuracy >= 0.65 (chance is 0.10).
check_learned() {
  local metrics=$1 acc
  [ -s "$metrics" ] || { echo "no metrics file $metrics"; return 1; }
  acc=$(grep '"event": "final"' "$metrics" | sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p')
  echo "metrics $metrics: final test accuracy ${acc:-none}"
  [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a >= 0.65) }'
}
check_train() {
  grep -q "ddp with 2 rank(s)" "$1" || { echo "the job did not train with 2 ranks"; return 1; }
  check_learned "$WORK/train/metrics.jsonl"
}

if [ "$JOB_KIND" = train ]; then
  FASHION=/usr/share/datasets/fashion-mnist
  [ -f "$FASHION/train-images-idx3-ubyte.gz" ] || skip "$FASHION missing (dataset-fashion-mnist)"
  "$BUILD/apps/lockstep-shard" fashion-mnist --out="$WORK/data" --shards=2 --limit=4096 \
    --test-limit=1000 >"$WORK/shard.log" 2>&1 || { cat "$WORK/shard.log"; fail "sharding failed"; }
fi

declare -F "job_$JOB_KIND" >/dev/null || fail "unknown LOCKSTEP_SLURM_TEST_JOB=$JOB_KIND"
body=$(job_$JOB_KIND) || exit $?
cat >"$WORK/job.sbatch" <<JOB
#!/bin/bash
#SBATCH --job-name=lockstep-ci-$JOB_KIND
#SBATCH --nodes=1
#SBATCH --ntasks=2
#SBATCH --time=10
set -euo pipefail
$body
JOB

# submit_and_wait NAME SBATCH-ARGS...: submits, waits, prints the output, checks COMPLETED 0:0
# and sets $out to the job's output file. No accounting database here: poll squeue until the
# job leaves the queue, then read its final state from scontrol (MinJobAge keeps it visible).
submit_and_wait() {
  local name=$1 job info state exit_code deadline
  shift
  job=$(sbatch --parsable --output="$WORK/$name-%j.out" "$@") || fail "sbatch refused $name"
  job=${job%%;*}
  echo "submitted $name as job $job"
  deadline=$((SECONDS + JOB_TIMEOUT))
  while [ -n "$(squeue -h -j "$job" 2>/dev/null)" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      scontrol show job "$job" -o
      scancel "$job"
      fail "$name (job $job) still queued or running after ${JOB_TIMEOUT}s"
    fi
    sleep 0.5
  done
  info=$(scontrol show job "$job" -o)
  state=$(tr ' ' '\n' <<<"$info" | sed -n 's/^JobState=//p')
  exit_code=$(tr ' ' '\n' <<<"$info" | sed -n 's/^ExitCode=//p')
  out=$WORK/$name-$job.out
  echo "$name (job $job): JobState=$state ExitCode=$exit_code"
  echo "----- $out"
  cat "$out" 2>/dev/null
  echo "-----"
  [ "$state" = COMPLETED ] || fail "$name (job $job) ended $state (ExitCode $exit_code)"
  [ "$exit_code" = 0:0 ] || fail "$name (job $job) ExitCode $exit_code"
}

submit_and_wait "$JOB_KIND" "$WORK/job.sbatch"
check_$JOB_KIND "$out" || fail "the $JOB_KIND job's output does not show what was expected"

# The single-node template itself, running the trainer as a user would:
# sbatch slurm/train.sbatch CONFIG OVERRIDES... The template defaults to build/apps/lockstep-train;
# LOCKSTEP_TRAIN (exported into the job by sbatch) points it at the build under test instead.
if [ "$JOB_KIND" = train ]; then
  (cd "$SOURCE" && export LOCKSTEP_TRAIN=$BUILD/apps/lockstep-train &&
    submit_and_wait template slurm/train.sbatch configs/ci_tiny.ini \
      --data.train="$WORK/data/train" --data.test="$WORK/data/test" \
      --log.metrics="$WORK/template/metrics.jsonl") || exit 1
  out=$(ls -t "$WORK"/template-*.out | head -n1)
  grep -q "2 ranks x 1 threads.*config configs/ci_tiny.ini" "$out" ||
    fail "slurm/train.sbatch did not report its ranks and arguments"
  check_learned "$WORK/template/metrics.jsonl" || fail "the template's training did not learn"
fi
# The installed template, as a user after `module load lockstep` submits it: from a folder that is
# not a clone, with LOCKSTEP_ROOT = the install prefix (what the module sets) and no LOCKSTEP_TRAIN.
if [ "$JOB_KIND" = train ]; then
  rm -rf "$WORK/prefix" "$WORK/user" && mkdir -p "$WORK/user"
  cmake --install "$BUILD" --prefix "$WORK/prefix" --component Runtime >/dev/null ||
    fail "cmake --install into $WORK/prefix failed"
  share=$WORK/prefix/share/lockstep
  (cd "$WORK/user" && unset LOCKSTEP_TRAIN && export LOCKSTEP_ROOT=$WORK/prefix &&
    submit_and_wait installed "$share/slurm/train.sbatch" "$share/configs/ci_tiny.ini" \
      --data.train="$WORK/data/train" --data.test="$WORK/data/test" \
      --log.metrics="$WORK/installed/metrics.jsonl") || exit 1
  out=$(ls -t "$WORK"/installed-*.out | head -n1)
  grep -qx "lockstep: running $WORK/prefix/bin/lockstep-train" "$out" ||
    fail "the installed train.sbatch did not run the installed lockstep-train"
  check_learned "$WORK/installed/metrics.jsonl" || fail "the installed template's training did not learn"
fi
echo "PASS: sbatch jobs completed; both ranks trained; slurm/train.sbatch runs, from the clone and installed"
