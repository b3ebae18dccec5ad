#!/usr/bin/env bash
# Resume with another world size: 2 ranks train to step 20 (epoch 1, batch 4 of 16), then one
# launch resumes that checkpoint with 1 rank and another with 4 ranks, both to step 40.
# Semantics (docs/CHECKPOINTS.md): train.global_batch stays fixed, so each rank's batch is
# global/W; the sampler permutation is recomputed from (seed, epoch) for the new W, and the
# position in the epoch is kept in samples (batch_in_epoch x global batch). With DDP's
# correctness contract (W ranks x batch b == 1 rank x batch W*b, to float rounding) the resumed
# runs must follow an uninterrupted run's loss curve to rounding, and the model must learn.
# Needs the trainer's checkpoint integration (skips with a reason until lockstep-train has it).
# Usage: bash tests/scripts/resume_world_size.sh BUILD_DIR    Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: resume_world_size.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
e2e_workdir resume-world
e2e_make_data
e2e_write_config
log=$WORK/log.txt
common=(--checkpoint.every_steps=10 --checkpoint.keep=10)

note "reference: 1 rank, 40 steps uninterrupted"
run_train 1 "$log" --checkpoint.dir="$WORK/ref" "${common[@]}" --train.max_steps=40 \
  --log.metrics="$WORK/ref.jsonl" || { show_log "$log"; fail "the reference run failed"; }

note "2 ranks to step 20"
run_train 2 "$log" --checkpoint.dir="$WORK/w2" "${common[@]}" --train.max_steps=20 ||
  { show_log "$log"; fail "the 2-rank run failed"; }
ckpt20=$WORK/w2/ckpt-00000020.h5
[ -f "$ckpt20" ] || fail "no step-20 checkpoint"
[ "$(header_field "$ckpt20" world_size)" = 2 ] || fail "$ckpt20 does not record world size 2"

# compare_losses FILE: steps 21..40 of FILE within 1e-3 relative of the reference's.
compare_losses() {
  local s ref got bad=0
  for s in 21 25 30 35 40; do
    ref=$(metric $s loss "$WORK/ref.jsonl")
    got=$(metric $s loss "$1")
    [ -n "$ref" ] && [ -n "$got" ] || { echo "no loss for step $s in $1"; return 1; }
    awk -v a="$ref" -v b="$got" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-3 * a) }' ||
      { echo "step $s: loss $got, reference $ref"; bad=1; }
  done
  return $bad
}

for np in 1 4; do
  note "resume the 2-rank checkpoint with $np rank(s) to step 40"
  dir=$WORK/resume$np
  mkdir -p "$dir" && cp "$ckpt20" "$dir/"
  run_train $np "$log" --checkpoint.dir="$dir" "${common[@]}" --train.max_steps=40 \
    --train.resume=auto --log.metrics="$WORK/resume$np.jsonl" ||
    { show_log "$log"; fail "resuming with $np rank(s) failed"; }
  final=$dir/ckpt-00000040.h5
  [ -f "$final" ] || fail "resuming with $np rank(s) wrote no step-40 checkpoint"
  [ "$(header_field "$final" world_size)" = $np ] || fail "$final does not record world size $np"
  [ "$(header_field "$final" epoch)" = "$(header_field "$WORK/ref/ckpt-00000040.h5" epoch)" ] ||
    fail "epoch at step 40 differs from the reference"
  [ "$(header_field "$final" batch_in_epoch)" = \
    "$(header_field "$WORK/ref/ckpt-00000040.h5" batch_in_epoch)" ] ||
    fail "batch_in_epoch at step 40 differs from the reference"
  compare_losses "$WORK/resume$np.jsonl" || fail "resumed with $np rank(s), the losses leave the reference curve"
  first=$(metric 1 loss "$WORK/ref.jsonl")
  last=$(metric 40 loss "$WORK/resume$np.jsonl")
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.8 * a) }' ||
    fail "resumed with $np rank(s), loss went from $first to $last: not learning"
  echo "resumed 2 -> $np ranks: loss $first (step 1) -> $last (step 40), on the reference curve"
done
echo "PASS: a 2-rank checkpoint resumes with 1 and 4 ranks and follows the uninterrupted run"
