#!/usr/bin/env bash
# ZeRO-1 checkpoints with the real launcher: 2 ranks with dist.zero = 1 (SGD momentum and AdamW,
# small buckets so every bucket is split unevenly) train to step 20; that checkpoint resumes with
# 4 ranks and dist.zero = 1 (each rank takes another shard of the whole state) and with 1 rank
# and dist.zero = 0, both to step 40, and must follow an uninterrupted 1-rank dist.zero = 0 run's
# loss curve to rounding (1e-3 relative: the ranks add gradients in other orders). A state lost
# or misplaced in the gather or the resume would leave the curve at once.
# Usage: bash tests/scripts/resume_zero.sh BUILD_DIR    Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: resume_zero.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
e2e_workdir resume-zero
e2e_make_data
e2e_write_config
log=$WORK/log.txt

# compare_losses REF FILE: steps 21..40 of FILE within 1e-3 relative of REF's.
compare_losses() {
  local s ref got bad=0
  for s in 21 25 30 35 40; do
    ref=$(metric $s loss "$1")
    got=$(metric $s loss "$2")
    [ -n "$ref" ] && [ -n "$got" ] || { echo "no loss for step $s in $2"; return 1; }
    awk -v a="$ref" -v b="$got" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-3 * a) }' ||
      { echo "step $s: loss $got, reference $ref"; bad=1; }
  done
  return $bad
}

for opt in sgd adamw; do
  common=(--checkpoint.every_steps=10 --checkpoint.keep=10 --optim.name=$opt
          --dist.bucket_mb=0.001 --dist.first_bucket_mb=0.0005)
  [ $opt = adamw ] && common+=(--optim.lr=0.003)
  note "$opt reference: 1 rank, dist.zero = 0, 40 steps uninterrupted"
  run_train 1 "$log" --checkpoint.dir="$WORK/$opt-ref" "${common[@]}" --train.max_steps=40 \
    --log.metrics="$WORK/$opt-ref.jsonl" || { show_log "$log"; fail "the reference run failed"; }

  note "$opt: 2 ranks with dist.zero = 1 to step 20"
  run_train 2 "$log" --checkpoint.dir="$WORK/$opt-w2" "${common[@]}" --train.max_steps=20 \
    --dist.zero=1 || { show_log "$log"; fail "the 2-rank ZeRO-1 run failed"; }
  ckpt20=$WORK/$opt-w2/ckpt-00000020.h5
  [ -f "$ckpt20" ] || fail "no step-20 checkpoint"

  for resume in "4 1" "1 0"; do
    set -- $resume
    np=$1 zero=$2
    note "$opt: resume it with $np rank(s), dist.zero = $zero, to step 40"
    dir=$WORK/$opt-resume$np
    mkdir -p "$dir" && cp "$ckpt20" "$dir/"
    run_train $np "$log" --checkpoint.dir="$dir" "${common[@]}" --train.max_steps=40 \
      --dist.zero=$zero --train.resume=auto --log.metrics="$WORK/$opt-resume$np.jsonl" ||
      { show_log "$log"; fail "$opt: resuming with $np rank(s), dist.zero = $zero failed"; }
    [ -f "$dir/ckpt-00000040.h5" ] || fail "$opt: resuming with $np rank(s) wrote no step-40 checkpoint"
    compare_losses "$WORK/$opt-ref.jsonl" "$WORK/$opt-resume$np.jsonl" ||
      fail "$opt: resumed with $np rank(s), dist.zero = $zero, the losses leave the reference curve"
    echo "$opt: 2 ranks ZeRO-1 -> $np rank(s) dist.zero = $zero: loss at step 40" \
      "$(metric 40 loss "$WORK/$opt-resume$np.jsonl") (reference $(metric 40 loss "$WORK/$opt-ref.jsonl"))"
  done
done
echo "PASS: a 2-rank ZeRO-1 checkpoint resumes with 4 ranks (ZeRO-1) and 1 rank (plain) on the reference curve"
