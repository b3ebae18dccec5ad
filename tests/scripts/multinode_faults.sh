#!/usr/bin/env bash
# Failures across hosts, on the namespace cluster (scripts/local-slurm/start.sh --hosts=2):
#   1. a host dies (every process in node2's namespaces killed: orted or slurmd and slurmstepd,
#      and the ranks) in the middle of a 2 hosts x 2 ranks training job, under mpirun and under
#      sbatch: the job must end (mpirun within 120 s, Slurm within 90 s), not hang, and its log
#      must name node2;
#   2. a 2 hosts x 2 ranks slurm/train-requeue.sbatch job (hierarchical allreduce, as the
#      killed job above), signalled as at its time limit,
#      checkpoints, requeues itself, and its second start resumes on both hosts from the
#      checkpoint (first step = stop step + 1) and completes.
# Usage: bash tests/scripts/multinode_faults.sh BUILD_DIR    Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: multinode_faults.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash" || exit 1
source "$(dirname "${BASH_SOURCE[0]}")/multinode_lib.bash" || exit 1
multinode_require
multinode_start
T0=$SECONDS
e2e_make_data
E2E_EPOCHS=100000 e2e_write_config

# metric_step FILE: the latest training step in a metrics file (empty when none).
metric_step() { grep '"loss"' "$1" 2>/dev/null | tail -n1 | sed -n 's/.*"step": \([0-9]*\).*/\1/p'; }

# ---- 1. a host dies mid-job: under mpirun (its daemon on node2 dies with the ranks), then
# under Slurm (slurmd and slurmstepd die too; slurmctld notices within SlurmdTimeout = 10 s).
# ended_by_node2 LOG: the run's log names the dead host.
ended_by_node2() { grep -q 'node2' "$1" || { cat "$1"; fail "the log does not name the dead host node2"; }; }
# await_step FILE STEP SECONDS PID_OR_JOB: until FILE's training records reach STEP.
await_step() {
  local deadline=$((SECONDS + $3))
  until [ -n "$(metric_step "$1")" ] && [ "$(metric_step "$1")" -ge "$2" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "training did not reach step $2 within $3 s"
    sleep 0.2
  done
}

note "mpirun --hostfile, 2 hosts x 2 ranks; then every process on node2 is killed"
timeout -k 5 120 mpirun --hostfile "$LOCKSTEP_CLUSTER_HOSTFILE" -np 4 --bind-to none "$TRAIN" \
  --config "$WORK/tiny.ini" --log.every=1 --log.progress=lines --log.metrics="$WORK/killed-mpirun.jsonl" \
  >"$WORK/killed-mpirun.log" 2>&1 &
run=$!
await_step "$WORK/killed-mpirun.jsonl" 5 60
kill_host node2 KILL
killed_at=$SECONDS
note "killed node2 at step $(metric_step "$WORK/killed-mpirun.jsonl")"
wait $run
rc=$?
mpirun_took=$((SECONDS - killed_at))
echo "mpirun exited $rc, $mpirun_took s after node2 died; its last lines:"
tail -n 12 "$WORK/killed-mpirun.log"
[ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$rc" != 137 ] ||
  fail "mpirun ended with status $rc (0: did not notice; 124/137: hung until the timeout)"
ended_by_node2 "$WORK/killed-mpirun.log"
bash "$SOURCE/scripts/local-slurm/start.sh" --hosts=2 >/dev/null 2>&1 || fail "could not bring node2 back"

note "sbatch, 2 hosts x 2 ranks; then every process on node2 is killed"
# --no-requeue: by default Slurm requeues a job whose node failed (right for users, but here the
# test wants to see it end).
submit_job killed-host --no-requeue -N2 --ntasks-per-node=2 --cpus-per-task=1 \
  "$SOURCE/slurm/train-cpu-multinode.sbatch" "$WORK/tiny.ini" --log.every=1 \
  --dist.algorithm=hierarchical --log.metrics="$WORK/killed.jsonl"
await_step "$WORK/killed.jsonl" 5 90
kill_host node2 KILL
killed_at=$SECONDS
note "killed node2 at step $(metric_step "$WORK/killed.jsonl")"
# The job is over once it leaves PENDING/RUNNING: it stays COMPLETING until the dead node
# answers again, as on a real cluster.
deadline=$((SECONDS + 90))
while [[ "$(job_field "$JOB" JobState)" =~ ^(PENDING|RUNNING|CONFIGURING)$ ]]; do
  [ "$SECONDS" -lt "$deadline" ] || { cat "$OUT"; fail "the job still runs 90 s after node2 died"; }
  sleep 0.5
done
slurm_took=$((SECONDS - killed_at))
echo "job $JOB: $(job_field "$JOB" JobState) (Reason $(job_field "$JOB" Reason)), $slurm_took s after node2 died; its last lines:"
tail -n 8 "$OUT"
ended_by_node2 "$OUT"
# The cluster heals for the next job: start.sh restarts node2's slurmd and resumes the node.
bash "$SOURCE/scripts/local-slurm/start.sh" --hosts=2 || fail "could not bring node2 back"
deadline=$((SECONDS + 60))
until [ -z "$(squeue -h -j "$JOB" 2>/dev/null)" ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "job $JOB did not leave the queue after node2 came back"
  sleep 0.5
done

# ---- 2. a requeued 2-host job resumes from its checkpoint.
ck=$WORK/ck
write_requeue_wrapper "$WORK/train-wrapper.sh" "$ck" "$WORK/requeue"
note "slurm/train-requeue.sbatch on 2 hosts x 2 ranks"
TRAIN=$WORK/train-wrapper.sh LOCKSTEP_CHECKPOINT_DIR=$ck submit_job requeue -N2 \
  --ntasks-per-node=2 --open-mode=append "$SOURCE/slurm/train-requeue.sbatch" "$WORK/tiny.ini" \
  --dist.algorithm=hierarchical
deadline=$((SECONDS + 90))
until [ -n "$(latest_step "$ck")" ] && [ "$(latest_step "$ck")" -ge 10 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { cat "$OUT"; fail "no step-10 checkpoint within 90 s"; }
  [ -n "$(squeue -h -j "$JOB")" ] || { cat "$OUT"; fail "the job ended before step 10"; }
  sleep 0.2
done
scancel --signal=USR1 --batch "$JOB" || fail "scancel --signal=USR1 --batch failed"
deadline=$((SECONDS + 60))
until [ "$(job_field "$JOB" Restarts)" = 1 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { cat "$OUT"; fail "job not requeued within 60 s of the signal"; }
  [ -n "$(squeue -h -j "$JOB")" ] || { cat "$OUT"; fail "the job ended instead of requeuing"; }
  sleep 0.5
done
stop=$(latest_step "$ck")
# Release it once the first start's steps are gone from both hosts (see fault_slurm_requeue.sh:
# the new step reuses the id JOB.0, and a PMIx socket still being torn down fails its launch).
until [ "$(sinfo -h -N -o '%T' | sort -u | tr '\n' ' ')" = "idle " ] &&
  [ -z "$(host_pids node1 | xargs -r -I{} cat /proc/{}/cmdline 2>/dev/null | tr '\0' ' ' | grep "slurmstepd: \[$JOB\.")" ] &&
  [ -z "$(host_pids node2 | xargs -r -I{} cat /proc/{}/cmdline 2>/dev/null | tr '\0' ' ' | grep "slurmstepd: \[$JOB\.")" ]; do
  [ "$SECONDS" -lt "$deadline" ] || { cat "$OUT"; fail "the first start's steps did not end"; }
  sleep 0.5
done
sleep 1
note "requeued after a stop at step $stop; releasing it"
scontrol update JobId="$JOB" StartTime=now || fail "could not release the requeued job"
wait_job_end 120
state=$(job_field "$JOB" JobState)
code=$(job_field "$JOB" ExitCode)
echo "----- $OUT"
cat "$OUT"
echo "-----"
[ "$state" = COMPLETED ] && [ "$code" = 0:0 ] || fail "job $JOB ended $state, ExitCode $code"
[ "$(grep -c 'lockstep-requeue: job .* start' "$OUT")" = 2 ] || fail "expected two starts"
grep -q "start 2 on node\[1-2\]" "$OUT" || fail "the second start did not run on node[1-2]"
[ "$(first_step "$WORK/requeue-1.jsonl")" = $((stop + 1)) ] ||
  fail "the second start began at step $(first_step "$WORK/requeue-1.jsonl"), not $((stop + 1))"
grep -q 'ddp with 4 rank' "$OUT" || fail "the resumed run did not train with 4 ranks"
[ "$(grep -c 'gradient allreduce hierarchical over 2 nodes' "$OUT")" = 2 ] ||
  fail "both starts should use the hierarchical allreduce over 2 nodes"
[ "$(latest_step "$ck")" = $(((stop / 5 + 4) * 5)) ] || fail "the second start did not finish"
echo "PASS: a dead host ends the job with node2 named (mpirun in $mpirun_took s, Slurm in" \
  "$slurm_took s); a 2-host job requeued at" \
  "step $stop resumed at step $((stop + 1)) and completed ($((SECONDS - T0)) s)"
