#!/usr/bin/env bash
# A rank dies: under mpirun -np 2, rank processes train with a checkpoint every 5 steps; once
# step 10 is saved, one rank gets SIGKILL. The job must end, non-zero, within 60 s, with a
# message that says a rank died (mpirun's "exited on signal 9", or ours). Relaunching with
# --train.resume=auto must resume from the newest complete checkpoint (its first logged step
# is that step + 1) and finish.
# Needs the trainer's checkpoint integration (skips with a reason until lockstep-train has it).
# Usage: bash tests/scripts/fault_kill_rank.sh BUILD_DIR    Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: fault_kill_rank.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
e2e_workdir fault-kill
e2e_make_data
E2E_EPOCHS=100000 e2e_write_config  # runs until killed
log=$WORK/log.txt
ck=$WORK/ck
BOUND=${LOCKSTEP_FAULT_BOUND_S:-60}

start_train_bg 2 "$log" --checkpoint.dir="$ck" --checkpoint.every_steps=5 --checkpoint.keep=3 \
  --log.every=50
wait_for_checkpoint "$ck" 10 60 || { show_log "$log"; fail "no step-10 checkpoint within 60 s"; }
pids=($(rank_pids))
[ "${#pids[@]}" = 2 ] || fail "expected 2 rank processes under mpirun $MPIRUN_PID, found: ${pids[*]}"
victim=${pids[1]}
note "SIGKILL to rank process $victim (checkpoints so far up to step $(latest_step "$ck"))"
kill -KILL "$victim"
wait_job "$BOUND" || { show_log "$log"; fail "the job was still running ${BOUND}s after a rank died"; }
echo "job ended ${JOB_SECONDS}s after the kill with status $JOB_RC"
[ "$JOB_RC" != 0 ] || fail "the job exited 0 although a rank was killed"
grep -Eq "signal 9|Killed|rank .* (died|exited)" "$log" ||
  { show_log "$log"; fail "no message says that a rank died"; }
grep -E "signal 9|Killed|died|exited" "$log" | head -n 3

last=$(latest_step "$ck")
target=$((last + 10))
note "relaunch with --train.resume=auto (newest checkpoint: step $last) to step $target"
run_train 2 "$log" --checkpoint.dir="$ck" --checkpoint.every_steps=5 --checkpoint.keep=3 \
  --train.resume=auto --train.max_steps=$target --log.metrics="$WORK/resumed.jsonl" ||
  { show_log "$log"; fail "the relaunched job failed"; }
[ "$(first_step "$WORK/resumed.jsonl")" = $((last + 1)) ] ||
  fail "the relaunch started at step $(first_step "$WORK/resumed.jsonl"), not $((last + 1))"
[ -f "$(printf '%s/ckpt-%08d.h5' "$ck" $target)" ] || fail "no step-$target checkpoint after the relaunch"
ls "$ck" | grep -q '^\.tmp-' && fail "a temporary file survived in $ck"
echo "PASS: a killed rank ended the job in ${JOB_SECONDS}s; the relaunch resumed at step $((last + 1)) and finished"
