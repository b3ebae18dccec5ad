#!/usr/bin/env bash
# checkpoint.async = true: the state is copied to host memory at the step and written by a
# background thread while training goes on (include/lockstep/train/state.hpp).
#   1. The files are the synchronous ones: the same steps, and each file's tensors_crc32 equal to
#      the synchronous run's at that step (1 rank, and ZeRO-1 on 2 ranks, whose optimizer state is
#      gathered at the step); and on the emulated GPU (train.device = emu), where the state is
#      copied from device memory the host cannot read, equal to the CPU's synchronous files.
#   2. A SIGKILL while a background write is in flight (a DIR/.tmp-* file exists) loses nothing
#      older: every checkpoint complete before the kill is still there and reads back, and
#      train.resume=auto continues from the newest and finishes.
#   3. A stop signal waits for the write: exit 3 with the stop's checkpoint complete.
# Usage: bash tests/scripts/checkpoint_async.sh BUILD_DIR    Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: checkpoint_async.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
help=$("$TRAIN" --help 2>/dev/null)  # captured: grep -q would end the pipe early (pipefail)
grep -q "checkpoint.async" <<<"$help" || skip "this lockstep-train has no checkpoint.async"
e2e_workdir checkpoint-async
e2e_make_data
e2e_write_config
log=$WORK/log.txt

# crcs DIR: "step:tensors_crc32" of every checkpoint in DIR, in step order.
crcs() {
  local f
  for f in $(ls "$1"/ckpt-*.h5 | sort); do
    echo "$(basename "$f" .h5 | sed 's/^ckpt-0*//'):$(header_field "$f" tensors_crc32)"
  done | tr '\n' ' '
}

note "1. asynchronous files equal the synchronous ones"
for case in "1-rank|1|" "zero1-2-ranks|2|--dist.zero=1 --optim.name=adamw --optim.lr=0.003"; do
  IFS='|' read -r name np args <<<"$case"
  read -r -a args <<<"$args"
  for mode in sync async; do
    run_train "$np" "$log" "${args[@]}" --checkpoint.dir="$WORK/$name-$mode" --checkpoint.every_steps=4 \
      --checkpoint.keep=100 --train.max_steps=20 --checkpoint.async=$([ $mode = async ] && echo true || echo false) \
      --log.metrics="$WORK/$name-$mode.jsonl" || { show_log "$log"; fail "$name $mode: the run failed"; }
  done
  a=$(crcs "$WORK/$name-sync")
  b=$(crcs "$WORK/$name-async")
  echo "$name: sync  $a"
  echo "$name: async $b"
  [ "$(echo "$a" | wc -w)" = 5 ] && [ "$a" = "$b" ] || fail "$name: the asynchronous checkpoints differ from the synchronous ones"
  [ "$(grep -c '"event": "checkpoint".*"async": true' "$WORK/$name-async.jsonl")" = 5 ] ||
    fail "$name: expected 5 checkpoint records marked async"
done

if grep -q "emu" <<<"$help"; then
  run_train 1 "$log" --train.device=emu --checkpoint.dir="$WORK/emu-async" --checkpoint.every_steps=4 \
    --checkpoint.keep=100 --train.max_steps=20 --checkpoint.async=true --log.metrics="$WORK/emu.jsonl" ||
    { show_log "$log"; fail "emu async: the run failed"; }
  a=$(crcs "$WORK/1-rank-sync")
  b=$(crcs "$WORK/emu-async")
  echo "emu: async $b"
  [ "$a" = "$b" ] || fail "emu: the asynchronous checkpoints differ from the CPU's synchronous ones"
else
  echo "emu: not run (this lockstep-train has no emulated device, -DLOCKSTEP_EMU=OFF)"
fi

note "2. SIGKILL during a background write"
# A model large enough (2 x 1024^2 parameters + Adam state: ~25 MB a file) that the write takes
# long enough to be caught; a checkpoint every step.
E2E_EPOCHS=100000 e2e_write_config
# The kill must land inside a write: the partial DIR/.tmp-* file must still be there afterwards
# (a write that finished between the look and the kill proves nothing; then try again).
for attempt in 1 2 3 4 5; do
  ck=$WORK/killed-$attempt
  start_train_bg 1 "$log" --model.spec=mlp:1024,1024 --optim.name=adamw --optim.lr=0.001 \
    --checkpoint.dir="$ck" --checkpoint.every_steps=1 --checkpoint.keep=1000 --checkpoint.async=true \
    --log.metrics="$WORK/killed.jsonl"
  wait_for_checkpoint "$ck" 3 60 || { show_log "$log"; fail "no step-3 checkpoint within 60 s"; }
  before=
  for _ in $(seq 2000); do
    if ls "$ck"/.tmp-* >/dev/null 2>&1; then
      before=$(ls "$ck" | grep '^ckpt-' | sort)
      pkill -KILL -P "$MPIRUN_PID" -x lockstep-train
      break
    fi
    sleep 0.002
  done
  [ -n "$before" ] || { show_log "$log"; fail "never saw a background write in flight"; }
  wait_job 30 || fail "the killed run did not end"
  ls "$ck"/.tmp-* >/dev/null 2>&1 && break
  note "attempt $attempt: the write finished before the kill; again"
done
ls "$ck"/.tmp-* >/dev/null 2>&1 || fail "5 attempts, and no kill landed inside a write"
after=$(ls "$ck" | grep '^ckpt-' | sort)
missing=$(comm -23 <(echo "$before") <(echo "$after"))
[ -z "$missing" ] || fail "checkpoints complete before the kill are gone: $missing"
for f in $after; do
  "$TRAIN" --config "$WORK/tiny.ini" --model.spec=mlp:1024,1024 --optim.name=adamw --eval-only \
    --train.resume="$ck/$f" >>"$log" 2>&1 || { show_log "$log"; fail "$f does not read back"; }
done
newest=$(latest_step "$ck")
echo "killed inside a write (attempt $attempt): $(ls "$ck"/.tmp-* | wc -l) partial .tmp-* file;" \
  "the $(echo "$after" | wc -l) checkpoints complete before it all read back, the newest at step $newest"
target=$((newest + 3))
run_train 1 "$log" --model.spec=mlp:1024,1024 --optim.name=adamw --optim.lr=0.001 \
  --checkpoint.dir="$ck" --checkpoint.every_steps=1 --checkpoint.keep=1000 --checkpoint.async=true \
  --train.resume=auto --train.max_steps=$target --log.metrics="$WORK/resumed.jsonl" ||
  { show_log "$log"; fail "the resumed run failed"; }
[ "$(first_step "$WORK/resumed.jsonl")" = $((newest + 1)) ] ||
  fail "resumed at step $(first_step "$WORK/resumed.jsonl"), not $((newest + 1))"
[ "$(latest_step "$ck")" = $target ] || fail "the resumed run did not reach step $target"
ls "$ck"/.tmp-* >/dev/null 2>&1 && fail "the partial .tmp-* file of the killed write was not cleared"

note "3. a stop signal waits for the background write"
ck=$WORK/stopped
start_train_bg 1 "$log" --model.spec=mlp:1024,1024 --optim.name=adamw --optim.lr=0.001 \
  --checkpoint.dir="$ck" --checkpoint.every_steps=1 --checkpoint.keep=2 --checkpoint.async=true \
  --log.metrics="$WORK/stopped.jsonl"
wait_for_checkpoint "$ck" 2 60 || { show_log "$log"; fail "no step-2 checkpoint within 60 s"; }
kill -USR1 "$MPIRUN_PID"
wait_job 60 || fail "still running 60 s after SIGUSR1"
[ "$JOB_RC" = 3 ] || { show_log "$log"; fail "exit status $JOB_RC after SIGUSR1, expected 3"; }
stop=$(grep -o "stopping at step [0-9]*" "$log" | tail -n1 | grep -o "[0-9]*$")
[ "$(latest_step "$ck")" = "$stop" ] || fail "the stop's checkpoint (step $stop) is not the newest file"
run_train 1 "$log" --model.spec=mlp:1024,1024 --optim.name=adamw --optim.lr=0.001 \
  --checkpoint.dir="$ck" --train.resume=auto --train.max_steps=$((stop + 1)) --checkpoint.every_steps=1 \
  --log.metrics="$WORK/stopped-resumed.jsonl" || { show_log "$log"; fail "resuming the stop's checkpoint failed"; }
echo "stopped at step $stop with exit 3; its checkpoint resumes"
echo "PASS: asynchronous checkpoints equal synchronous ones, survive a SIGKILL mid-write, and a stop waits for them"
