#!/usr/bin/env bash
# One run at a time per checkpoint.dir, end to end with real processes (docs/CHECKPOINTS.md, "The
# folder's lock"):
#   1. while a run trains, a second one on the same checkpoint.dir stops at once, naming the first
#      one's host and pid, and touches none of its files;
#   2. the first run killed with SIGKILL leaves its lock file behind (the kernel released the
#      flock): the next run takes it over, says so naming the dead pid, and resumes;
#   3. a run that ends cleanly leaves the lock file empty.
# Usage: bash tests/scripts/checkpoint_lock.sh BUILD_DIR    Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: checkpoint_lock.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
e2e_workdir checkpoint-lock
e2e_make_data
E2E_EPOCHS=100000 e2e_write_config
ck=$WORK/ck
log=$WORK/log.txt

note "first run: trains for long, checkpointing every 50 steps"
start_train_bg 1 "$log" --checkpoint.dir="$ck" --checkpoint.every_steps=50 --train.resume=auto \
  --log.metrics="$WORK/first.jsonl"
# Whatever happens below, the long run does not outlive the test (timeout passes TERM to mpirun).
trap 'kill -TERM "$TRAIN_JOB" 2>/dev/null; wait "$TRAIN_JOB" 2>/dev/null
      [ "${LOCKSTEP_KEEP_E2E:-0}" = 1 ] || rm -rf "$WORK"' EXIT
wait_for_checkpoint "$ck" 50 60 || { show_log "$log"; fail "the first run wrote no checkpoint"; }
holder=$(rank_pids | head -n1)
[ -n "$holder" ] || fail "no trainer process under mpirun $MPIRUN_PID"

note "second run on the same folder, while the first trains"
second=$WORK/second.txt
if run_train 1 "$second" --checkpoint.dir="$ck" --checkpoint.every_steps=50 --train.resume=auto \
  --train.max_steps=2; then
  show_log "$second"; fail "a second run on the same checkpoint.dir was let in"
fi
grep -q "is in use by another run (host $(hostname), pid $holder" "$second" ||
  { show_log "$second"; fail "the refusal does not name the first run (host $(hostname), pid $holder)"; }
grep -o "checkpoint.dir = [^ ]* is in use by another run ([^)]*)" "$second" | head -n1
kill -0 "$holder" 2>/dev/null || fail "the first run died while the second one was refused"
grep -q "^pid=$holder\$" "$ck/.lock" || { cat "$ck/.lock" >&2; fail "$ck/.lock does not name pid $holder"; }

note "the first run killed with SIGKILL"
kill -KILL "$holder"
wait_job 30 || fail "mpirun did not end after its rank was killed"
grep -q "^pid=$holder\$" "$ck/.lock" || fail "the killed run's lock file is gone or rewritten"
last=$(latest_step "$ck")
[ -n "$last" ] || fail "no checkpoint left by the killed run"

note "third run: takes the stale lock over and resumes from step $last"
third=$WORK/third.txt
run_train 1 "$third" --checkpoint.dir="$ck" --checkpoint.every_steps=50 --train.resume=auto \
  --train.max_steps=$((last + 2)) || { show_log "$third"; fail "the run after the killed one failed"; }
grep -q "took over the lock of checkpoint.dir = $ck left by host $(hostname), pid $holder" "$third" ||
  { show_log "$third"; fail "no note naming the stale lock's pid $holder"; }
grep -o "took over the lock [^(]*" "$third" | head -n1
grep -q "resumed from $ck/ckpt-0*$last.h5" "$third" || { show_log "$third"; fail "did not resume from step $last"; }
[ ! -s "$ck/.lock" ] || { cat "$ck/.lock" >&2; fail "a cleanly ended run left its name in the lock file"; }
echo "PASS: a second run is refused naming the holder; a killed run's lock is taken over"
