#!/usr/bin/env bash
# Exact resume: 2 ranks train 30 steps in one go; 2 ranks train 20 steps, stop, and a second
# launch resumes from the step-20 checkpoint (--train.resume=auto) to step 30. The two step-30
# checkpoints must hold bitwise-identical tensors (parameters, buffers, optimizer state): their
# headers' tensors_crc32 hash every tensor byte (docs/CHECKPOINTS.md). Step 20 lies in epoch 1,
# so the resumed run must restore the epoch, the sampler position and the momentum buffers.
# Needs the trainer's checkpoint integration (skips with a reason until lockstep-train has it).
# Usage: bash tests/scripts/resume_exact.sh BUILD_DIR     Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: resume_exact.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
e2e_workdir resume-exact
e2e_make_data
e2e_write_config
log=$WORK/log.txt

note "uninterrupted: 30 steps"
run_train 2 "$log" --checkpoint.dir="$WORK/full" --checkpoint.every_steps=10 \
  --checkpoint.keep=10 --train.max_steps=30 --log.metrics="$WORK/full.jsonl" ||
  { show_log "$log"; fail "the uninterrupted run failed"; }

note "interrupted: 20 steps, then resume to 30"
run_train 2 "$log" --checkpoint.dir="$WORK/split" --checkpoint.every_steps=10 \
  --checkpoint.keep=10 --train.max_steps=20 --log.metrics="$WORK/split-a.jsonl" ||
  { show_log "$log"; fail "the first half failed"; }
[ "$(latest_step "$WORK/split")" = 20 ] || fail "the first half left no step-20 checkpoint"
run_train 2 "$log" --checkpoint.dir="$WORK/split" --checkpoint.every_steps=10 \
  --checkpoint.keep=10 --train.max_steps=30 --train.resume=auto \
  --log.metrics="$WORK/split-b.jsonl" || { show_log "$log"; fail "the resumed run failed"; }

full=$WORK/full/ckpt-00000030.h5
split=$WORK/split/ckpt-00000030.h5
for f in "$full" "$split"; do
  [ -f "$f" ] || { show_log "$log"; fail "missing $f"; }
  [ "$(header_field "$f" step)" = 30 ] || fail "$f: header step is not 30"
done
a=$(header_field "$full" tensors_crc32)
b=$(header_field "$split" tensors_crc32)
mid=$(header_field "$WORK/split/ckpt-00000020.h5" tensors_crc32)
echo "tensors_crc32 at step 30: uninterrupted $a, resumed $b (step 20: $mid)"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "the resumed run's step-30 tensors differ from the uninterrupted run's"
[ "$a" != "$mid" ] || fail "steps 21..30 changed nothing: the comparison would prove nothing"
for key in epoch batch_in_epoch; do
  [ "$(header_field "$full" $key)" = "$(header_field "$split" $key)" ] ||
    fail "$key differs at step 30: $(header_field "$full" $key) vs $(header_field "$split" $key)"
done
# The resumed run's first logged loss (step 21) equals the uninterrupted run's, digit for digit.
l_full=$(metric 21 loss "$WORK/full.jsonl")
l_split=$(metric 21 loss "$WORK/split-b.jsonl")
echo "loss at step 21: uninterrupted $l_full, resumed $l_split"
[ -n "$l_full" ] && [ "$l_full" = "$l_split" ] || fail "step-21 losses differ"
echo "PASS: resume from step 20 reproduces the uninterrupted step-30 state bitwise"
