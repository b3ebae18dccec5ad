# Shared by tests/scripts/multinode_*.sh (sourced after tests/scripts/e2e_lib.bash, not run:
# CTest runs only *.sh): the namespace cluster of scripts/local-slurm/start.sh --hosts=${MULTINODE_HOSTS:-2}, started
# for the test and stopped at its end, and a helper that submits a job and waits for it.

export LOCKSTEP_CLUSTER_BASE=${LOCKSTEP_CLUSTER_BASE:-/tmp/lockstep-cluster}
BASE=$LOCKSTEP_CLUSTER_BASE
source "$SOURCE/scripts/local-slurm/hosts.bash"
JOB_TIMEOUT=${LOCKSTEP_SLURM_JOB_TIMEOUT:-180}
# Progress lines carry the seconds since the test started: these tests are the slowest of the
# suite, and the log shows where their time goes.
MULTINODE_T0=$SECONDS
note() { echo "--- [$((SECONDS - MULTINODE_T0)) s] $*" >&2; }

# multinode_require: skips (77, with the reason) where the cluster cannot run.
multinode_require() {
  e2e_require_trainer
  [ "$(id -u)" -eq 0 ] || skip "needs root to make network namespaces and run the Slurm daemons"
  local tool why
  for tool in sbatch squeue scontrol scancel srun slurmctld slurmd munged h5diff; do
    command -v "$tool" >/dev/null ||
      skip "$tool not installed (Debian: slurmctld slurmd slurm-client munge hdf5-tools)"
  done
  why=$(hosts_possible)
  [ -z "$why" ] || skip "network namespaces are not possible here: $why"
}

# multinode_start: a work folder ($WORK) and the cluster, both removed at exit (the cluster
# only when this test started it, and not with LOCKSTEP_KEEP_CLUSTER=1).
multinode_start() {
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-multinode.XXXXXX")
  was_up=0
  bash "$SOURCE/scripts/local-slurm/start.sh" --hosts="${MULTINODE_HOSTS:-2}" --status && was_up=1
  trap multinode_cleanup EXIT
  if [ "$was_up" = 0 ]; then
    local t0=$SECONDS rc
    bash "$SOURCE/scripts/local-slurm/start.sh" --hosts="${MULTINODE_HOSTS:-2}"
    rc=$?
    [ "$rc" = 77 ] && skip "the namespace cluster cannot run here (reason above)"
    [ "$rc" = 0 ] || fail "scripts/local-slurm/start.sh --hosts=${MULTINODE_HOSTS:-2} failed (exit $rc)"
    note "cluster of ${MULTINODE_HOSTS:-2} namespace hosts up in $((SECONDS - t0)) s"
  fi
  source "$LOCKSTEP_CLUSTER_BASE/env.sh"
}

multinode_cleanup() {
  local job
  for job in ${JOBS:-}; do scancel "$job" 2>/dev/null; done
  if [ "$was_up" = 0 ] && [ "${LOCKSTEP_KEEP_CLUSTER:-0}" != 1 ]; then
    bash "$SOURCE/scripts/local-slurm/stop.sh" --hosts >/dev/null 2>&1
  fi
  [ "${LOCKSTEP_KEEP_E2E:-0}" = 1 ] && echo "keeping $WORK" >&2 || rm -rf "$WORK"
}

# job_field JOB KEY: a field of `scontrol show job` (finished jobs stay visible: MinJobAge).
job_field() { scontrol show job "$1" -o 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }

# submit_job NAME SBATCH-ARGS...: submits from the source folder; sets JOB and OUT (its log).
submit_job() {
  local name=$1
  shift
  OUT=$WORK/$name.out
  JOB=$(cd "$SOURCE" && LOCKSTEP_TRAIN=$TRAIN sbatch --parsable --job-name="lockstep-$name" \
    --time=10 --output="$OUT" "$@") || fail "sbatch refused $name"
  JOB=${JOB%%;*}
  JOBS="${JOBS:-} $JOB"
  echo "submitted $name as job $JOB"
}

# wait_job_end SECONDS: until $JOB leaves the queue; fails (showing its log) after SECONDS.
wait_job_end() {
  local deadline=$((SECONDS + $1))
  while [ -n "$(squeue -h -j "$JOB" 2>/dev/null)" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      scontrol show job "$JOB" -o
      cat "$OUT" 2>/dev/null
      fail "job $JOB still queued or running after $1 s"
    fi
    sleep 0.5
  done
}

# submit_and_wait NAME SBATCH-ARGS...: submits, waits, requires COMPLETED with ExitCode 0:0.
submit_and_wait() {
  submit_job "$@"
  wait_job_end "$JOB_TIMEOUT"
  local state code
  state=$(job_field "$JOB" JobState)
  code=$(job_field "$JOB" ExitCode)
  if [ "$state" != COMPLETED ] || [ "$code" != 0:0 ]; then
    cat "$OUT"
    fail "$1 (job $JOB) ended $state, ExitCode $code"
  fi
}

# write_requeue_wrapper FILE CHECKPOINT_DIR METRICS_PREFIX [ARGS...]: a lockstep-train wrapper for
# slurm/train-requeue.sbatch jobs (LOCKSTEP_TRAIN=FILE): the first start runs until stopped; a
# start that finds a checkpoint runs to the 4th multiple of 5 after it (16-20 more steps). Each
# start logs to METRICS_PREFIX-<SLURM_RESTART_COUNT>.jsonl, checkpoints every 5 steps, and gets ARGS.
write_requeue_wrapper() {
  local file=$1 ck=$2 metrics=$3
  shift 3
  cat >"$file" <<WRAP
#!/bin/bash
last=\$(ls "$ck"/ckpt-*.h5 2>/dev/null | sort | tail -n1)
extra=()
if [ -n "\$last" ]; then
  s=\$(basename "\$last" .h5 | sed 's/^ckpt-0*//; s/^\$/0/')
  extra=(--train.max_steps=\$(((s / 5 + 4) * 5)))
fi
exec "$TRAIN" "\$@" "\${extra[@]}" --log.metrics="$metrics-\${SLURM_RESTART_COUNT:-0}.jsonl" \
  --checkpoint.every_steps=5 --checkpoint.keep=3 --log.every=1 $*
WRAP
  chmod +x "$file"
}
