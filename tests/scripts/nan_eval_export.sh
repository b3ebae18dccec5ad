#!/usr/bin/env bash
# The rest of the run-survival contract, end to end on tiny synthetic data with 2 ranks:
#   1. a non-finite loss stops the run with a message naming the step (train.nan_policy = stop);
#   2. with train.nan_policy = skip the run finishes and reports the skipped steps;
#   3. --eval-only with a checkpoint reproduces the training run's final test accuracy, and
#      checkpoint.export writes a plain HDF5 file (checked by its HDF5 signature and size).
# A learning rate of 1e30 makes the first update overflow, so the next step's loss is not finite.
# Usage: bash tests/scripts/nan_eval_export.sh BUILD_DIR    Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: nan_eval_export.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
e2e_workdir nan-eval-export
e2e_make_data
e2e_write_config
log=$WORK/log.txt

note "nan_policy = stop"
if run_train 2 "$log" --optim.lr=1e30 --optim.warmup_steps=0 --train.max_steps=20; then
  show_log "$log"; fail "a run with an overflowing learning rate did not stop"
fi
grep -q "non-finite loss or gradient at step [0-9]" "$log" || { show_log "$log"; fail "no message naming the step"; }
grep -o "non-finite loss or gradient at step [0-9]*" "$log" | head -n1

note "nan_policy = skip"
: >"$log"
run_train 2 "$log" --optim.lr=1e30 --optim.warmup_steps=0 --train.max_steps=20 \
  --train.nan_policy=skip --log.metrics="$WORK/skip.jsonl" || { show_log "$log"; fail "the skip run failed"; }
skipped=$(grep '"event": "final"' "$WORK/skip.jsonl" | sed -n 's/.*"skipped_steps": \([0-9]*\).*/\1/p')
echo "skipped steps: $skipped"
[ -n "$skipped" ] && [ "$skipped" -gt 0 ] || fail "no skipped steps reported"

note "train with a checkpoint, then --eval-only with it, and export"
: >"$log"
run_train 2 "$log" --train.eval=true --train.max_steps=32 --checkpoint.dir="$WORK/ck" \
  --log.metrics="$WORK/train.jsonl" || { show_log "$log"; fail "training failed"; }
trained=$(grep '"event": "final"' "$WORK/train.jsonl" | sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p')
run_train 2 "$log" --eval-only --train.resume=auto --checkpoint.dir="$WORK/ck" \
  --checkpoint.export="$WORK/params.h5" --log.metrics="$WORK/eval.jsonl" || { show_log "$log"; fail "--eval-only failed"; }
evaluated=$(grep '"event": "final"' "$WORK/eval.jsonl" | sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p')
echo "test accuracy: after training $trained, --eval-only from the checkpoint $evaluated"
[ -n "$trained" ] && [ "$trained" = "$evaluated" ] || fail "--eval-only gave $evaluated, training ended at $trained"
[ -s "$WORK/params.h5" ] || fail "no export written"
# HDF5 files start with \x89HDF\r\n\x1a\n (possibly after a user block; exports have none).
[ "$(head -c 4 "$WORK/params.h5" | tail -c 3)" = HDF ] || fail "the export is not an HDF5 file"
echo "PASS: NaN stop and skip, --eval-only and export behave as documented"
