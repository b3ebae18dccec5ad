#!/usr/bin/env bash
# slurm/train-requeue.sbatch end to end on the project's local single-node Slurm
# (scripts/local-slurm/): a 2-task job trains with a checkpoint every 5 steps; once step 10 is
# saved the test sends SIGUSR1 to the batch shell only (`scancel --signal=USR1 --batch`, exactly
# what `--signal=B:USR1@120` does before the time limit, without waiting minutes for a real one).
# The script must forward it through srun to the ranks, which checkpoint and exit 3; the script
# requeues the job; the second start resumes (--train.resume=auto) and finishes: the job ends
# COMPLETED, ExitCode 0:0, Restarts=1, and its second run starts at the stop step + 1.
# Slurm holds a requeued job for about 2 minutes (EligibleTime); the test releases it at once
# with `scontrol update StartTime=now` once the first start's job steps are gone.
# A wrapper around lockstep-train (made here) lets a start that resumes run only 16-20 more steps
# while the first start runs until signalled, with the same job arguments.
# Needs the trainer's checkpoint integration (skips with a reason until lockstep-train has it).
# Usage: bash tests/scripts/fault_slurm_requeue.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: fault_slurm_requeue.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
[ "$(id -u)" -eq 0 ] || skip "needs root to run the local Slurm daemons"
for tool in sbatch squeue scontrol scancel srun slurmctld slurmd munged; do
  command -v "$tool" >/dev/null || skip "$tool not installed"
done
export LOCKSTEP_SLURM_BASE=${LOCKSTEP_SLURM_BASE:-/tmp/lockstep-slurm}
START=$SOURCE/scripts/local-slurm/start.sh
STOP=$SOURCE/scripts/local-slurm/stop.sh
[ -f "$START" ] || skip "$START missing"

e2e_workdir fault-slurm
was_up=0
bash "$START" --status >/dev/null 2>&1 && was_up=1
job=
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null
  if [ "$was_up" = 0 ] && [ "${LOCKSTEP_KEEP_SLURM:-0}" != 1 ]; then bash "$STOP" >/dev/null 2>&1; fi
  [ "${LOCKSTEP_KEEP_E2E:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
if [ "$was_up" = 0 ]; then
  bash "$START"
  rc=$?
  [ "$rc" = 0 ] || skip "the local Slurm cluster did not start here (start.sh exit $rc)"
fi
source "$LOCKSTEP_SLURM_BASE/env.sh"

e2e_make_data
E2E_EPOCHS=100000 e2e_write_config
ck=$WORK/ck
# The wrapper: every task computes the same limit from the newest checkpoint before MPI starts.
cat >"$WORK/train-wrapper.sh" <<WRAP
#!/bin/bash
last=\$(ls "$ck"/ckpt-*.h5 2>/dev/null | sort | tail -n1)
extra=()
if [ -n "\$last" ]; then
  s=\$(basename "\$last" .h5 | sed 's/^ckpt-0*//; s/^\$/0/')
  extra=(--train.max_steps=\$(((s / 5 + 4) * 5)))  # a multiple of every_steps: a checkpoint ends it
fi
exec "$TRAIN" "\$@" "\${extra[@]}" --log.metrics="$WORK/metrics-\${SLURM_RESTART_COUNT:-0}.jsonl" \
  --checkpoint.every_steps=5 --checkpoint.keep=3
WRAP
chmod +x "$WORK/train-wrapper.sh"

out=$WORK/job.out
job=$(LOCKSTEP_TRAIN=$WORK/train-wrapper.sh LOCKSTEP_CHECKPOINT_DIR=$ck sbatch --parsable \
  --job-name=lockstep-requeue-test --ntasks=2 --time=10 --output="$out" \
  "$SOURCE/slurm/train-requeue.sbatch" "$WORK/tiny.ini") || fail "sbatch refused the job"
job=${job%%;*}
echo "submitted job $job"

field() { scontrol show job "$job" -o 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p"; }
deadline=$((SECONDS + 90))
until [ -n "$(latest_step "$ck")" ] && [ "$(latest_step "$ck")" -ge 10 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { cat "$out"; fail "no step-10 checkpoint within 90 s"; }
  [ -n "$(squeue -h -j "$job")" ] || { cat "$out"; fail "the job ended before step 10"; }
  sleep 0.2
done
note "SIGUSR1 to the batch shell of job $job (checkpoints up to step $(latest_step "$ck"))"
scancel --signal=USR1 --batch "$job" || fail "scancel --signal=USR1 --batch failed"

# Wait for the requeue (Restarts=1), release it, then wait for the job to finish.
deadline=$((SECONDS + 60))
until [ "$(field Restarts)" = 1 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { cat "$out"; fail "job not requeued within 60 s of the signal"; }
  [ -n "$(squeue -h -j "$job")" ] || { cat "$out"; fail "the job ended instead of requeuing"; }
  sleep 0.5
done
stop=$(latest_step "$ck")
# Release it only once the first start's slurmstepd processes are gone: the new start's step has
# the same id (JOB.0), and while the old one still tears down its PMIx socket the new one fails
# ("aborted before step completely launched"). Slurm's own ~2 minute hold normally covers this.
until [ "$(sinfo -h -N -o '%T' | head -n1)" = idle ] && ! pgrep -f "slurmstepd: \[$job\." >/dev/null; do
  [ "$SECONDS" -lt "$deadline" ] || { cat "$out"; fail "the first start's step did not end after the requeue"; }
  sleep 0.5
done
sleep 1
note "requeued after a stop at step $stop; releasing it now"
scontrol update JobId="$job" StartTime=now || fail "could not release the requeued job"
deadline=$((SECONDS + 120))
while [ -n "$(squeue -h -j "$job")" ]; do
  [ "$SECONDS" -lt "$deadline" ] || { cat "$out"; fail "the requeued job did not finish in 120 s"; }
  sleep 0.5
done
state=$(field JobState)
code=$(field ExitCode)
echo "----- $out"
cat "$out"
echo "-----"
[ "$state" = COMPLETED ] && [ "$code" = 0:0 ] || fail "job $job ended $state, ExitCode $code"
grep -q "requeuing job $job" "$out" || fail "the batch script did not requeue on status 3"
[ "$(grep -c 'lockstep-requeue: job .* start' "$out")" = 2 ] || fail "expected two starts in $out"
[ "$(first_step "$WORK/metrics-1.jsonl")" = $((stop + 1)) ] ||
  fail "the second start began at step $(first_step "$WORK/metrics-1.jsonl"), not $((stop + 1))"
target=$(((stop / 5 + 4) * 5))
[ "$(latest_step "$ck")" = $target ] || fail "the second start did not reach step $target"
job_done=$job
job=
echo "PASS: job $job_done stopped on SIGUSR1 at step $stop, requeued itself and finished at step $target"
