#!/usr/bin/env bash
# Stop requests: a 2-rank run is sent (a) SIGUSR1 through mpirun, which forwards it to every rank,
# and (b) SIGTERM to one rank only (as a scheduler or an administrator might). In both cases every
# rank must stop at the same step boundary (the trainer combines the flag across ranks; a rank
# that stopped alone would leave the other blocked in a collective), a checkpoint of that step
# must exist, the exit status must be kExitRequeue (3, include/lockstep/train/signals.hpp), and a
# relaunch with --train.resume=auto must continue from the following step and finish.
# Periodic checkpoints are off (every_steps is huge), so the checkpoint is the stop's own.
# Needs the trainer's checkpoint integration (skips with a reason until lockstep-train has it).
# Usage: bash tests/scripts/fault_signal.sh BUILD_DIR    Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: fault_signal.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
e2e_workdir fault-signal
e2e_make_data
E2E_EPOCHS=100000 e2e_write_config  # runs until signalled
log=$WORK/log.txt
EXIT_REQUEUE=3

for case in usr1-mpirun term-rank; do
  ck=$WORK/$case
  metrics=$WORK/$case.jsonl
  start_train_bg 2 "$log" --checkpoint.dir="$ck" --checkpoint.every_steps=100000000 \
    --log.every=20 --log.metrics="$metrics" --log.rank_prefix=true
  wait_for_training "$metrics" || { show_log "$log"; fail "$case: training did not start"; }
  if [ $case = usr1-mpirun ]; then
    note "$case: SIGUSR1 to mpirun $MPIRUN_PID"
    kill -USR1 "$MPIRUN_PID"
  else
    pids=($(rank_pids))
    [ "${#pids[@]}" = 2 ] || fail "expected 2 rank processes, found: ${pids[*]}"
    note "$case: SIGTERM to rank process ${pids[1]} only"
    kill -TERM "${pids[1]}"
  fi
  wait_job 60 || { show_log "$log"; fail "$case: still running 60 s after the signal"; }
  [ "$JOB_RC" = $EXIT_REQUEUE ] ||
    { show_log "$log"; fail "$case: exit status $JOB_RC, expected $EXIT_REQUEUE (kExitRequeue)"; }
  stop=$(latest_step "$ck")
  [ -n "$stop" ] && [ "$stop" -gt 0 ] || { show_log "$log"; fail "$case: no checkpoint after the stop"; }
  [ "$(ls "$ck" | grep -c '^ckpt-')" = 1 ] || fail "$case: expected exactly the stop's checkpoint in $ck"
  grep "rank" "$log" | grep -i "stop" | tail -n 2
  echo "$case: exit $JOB_RC after ${JOB_SECONDS}s, checkpoint at step $stop"

  target=$((stop + 10))
  run_train 2 "$log" --checkpoint.dir="$ck" --checkpoint.every_steps=1 --checkpoint.keep=2 \
    --train.resume=auto --train.max_steps=$target --log.metrics="$WORK/$case-resumed.jsonl" ||
    { show_log "$log"; fail "$case: the resumed run failed"; }
  [ "$(first_step "$WORK/$case-resumed.jsonl")" = $((stop + 1)) ] ||
    fail "$case: resumed at step $(first_step "$WORK/$case-resumed.jsonl"), not $((stop + 1))"
  [ "$(latest_step "$ck")" = $target ] || fail "$case: resumed run did not reach step $target"
done
echo "PASS: SIGUSR1 via mpirun and SIGTERM to one rank both stop all ranks with a checkpoint and status 3"
