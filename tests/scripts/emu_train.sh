#!/usr/bin/env bash
# lockstep-train on the emulated GPU (train.device = emu): every device code path of the trainer,
# the engines and the communicators runs here — input staging, device timers and counters, the
# stream communicator (NCCL's contract over MPI), DataParallel's stream ordering between devices —
# and must give bitwise the CPU's training, since the emulated device runs the CPU's kernels. The
# comparison is the checkpoint headers' tensors_crc32 (every parameter, buffer and optimizer-state
# byte, docs/CHECKPOINTS.md) after the same steps on cpu and on emu, for:
#   MLP 1 rank; DDP 2 ranks; ZeRO-1 2 ranks; dist.grad_dtype = bf16 2 ranks; DataParallel (MLP, CNN) over
#   2 emulated devices; a CNN (convolution, pooling, batch norm); GPT-tiny (embedding, attention,
#   layer norm, AdamW); train.precision = bf16 (an MLP, and a GPT with bf16 activations) where
#   the CPU computes in bf16;
# then, on emu alone: stop at step 8 and resume to 12 equals an uninterrupted run, a SIGUSR1 stops
# a 2-rank run with a checkpoint and kExitRequeue, and the steady-state step logs 0 device
# allocations and 0 pageable copies. Every task on the emulated device is delayed
# (LOCKSTEP_EMU_DELAY_US), so a missing wait reads stale data instead of passing by luck.
# Usage: bash tests/scripts/emu_train.sh BUILD_DIR     Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: emu_train.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
help=$("$TRAIN" --help 2>/dev/null)
grep -q "emu" <<<"$help" || skip "this lockstep-train has no emulated device"
# LOCKSTEP_EMU_DEVICES=0 (the baseline run of bench/device-coverage.sh): only the CPU runs, so that
# the baseline executes what this test executes on the CPU; then it reports itself skipped.
BASELINE=0
[ "${LOCKSTEP_EMU_DEVICES:-8}" != 0 ] || BASELINE=1
e2e_workdir emu-train
e2e_make_data
E2E_EPOCHS=2 e2e_write_config
log=$WORK/log.txt
export LOCKSTEP_EMU_DELAY_US=${LOCKSTEP_EMU_DELAY_US:-50}

# crc NP NAME STEPS ARGS...: trains NP ranks for STEPS steps with a final checkpoint in
# $WORK/NAME and prints its tensors_crc32.
crc() {
  local np=$1 name=$2 steps=$3
  shift 3
  run_train "$np" "$log" --checkpoint.dir="$WORK/$name" --checkpoint.every_steps="$steps" \
    --train.max_steps="$steps" --log.metrics="$WORK/$name.jsonl" "$@" ||
    { show_log "$log"; fail "$name: the run failed"; }
  local f
  f=$WORK/$name/ckpt-$(printf %08d "$steps").h5
  [ -f "$f" ] || { show_log "$log"; fail "$name: no step-$steps checkpoint"; }
  header_field "$f" tensors_crc32
}

# same NAME NP STEPS ARGS...: the run on emu must end with the CPU run's bytes.
same() {
  local name=$1 np=$2 steps=$3
  shift 3
  local a b
  a=$(crc "$np" "$name-cpu" "$steps" --train.device=cpu "$@") || exit 1
  [ "$BASELINE" = 0 ] || return 0
  b=$(crc "$np" "$name-emu" "$steps" --train.device=emu "$@") || exit 1
  echo "$name: cpu $a, emu $b"
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "$name: the emulated device's tensors differ from the CPU's"
}

same mlp 1 12
same ddp 2 12
same zero1 2 12 --dist.zero=1 --optim.name=adamw --optim.lr=0.003
same grad-bf16 2 12 --dist.grad_dtype=bf16
same dp-2-devices 1 12 --train.parallel=dp --train.replicas=2

note "a CNN: the same samples as 1x4x4 images"
for name in train test; do
  "$SHARD" csv --file="$WORK/data/$name.csv" --label-column=0 --shape=1,4,4 --classes=4 \
    --out="$WORK/img" --name="$name" --shards=2 >"$WORK/shard.log" 2>&1 ||
    { cat "$WORK/shard.log" >&2; fail "lockstep-shard csv failed for the images"; }
done
CNN=(--model.spec='conv(4,3,pad=1)-bn-relu-maxpool(2)-flatten-linear(4)'
  --data.train="$WORK/img/train" --data.test="$WORK/img/test")
same cnn 2 8 "${CNN[@]}"
# DataParallel copies the master's batch-norm statistics to the replicas too.
same dp-cnn 1 6 "${CNN[@]}" --train.parallel=dp --train.replicas=2

note "GPT-tiny-sized: bytes of a small generated corpus"
e2e_make_text_shards 60 "$WORK/text"
GPT=(--model.spec='gpt(layers=1,heads=2,dim=32,ctx=32)' --data.train="$WORK/text/train"
  --data.test="$WORK/text/val" --train.global_batch=8 --optim.name=adamw --optim.lr=0.003
  --optim.weight_decay=0.1 --optim.decay=matrices --optim.clip_norm=1.0)
same gpt 2 8 "${GPT[@]}"
# Activation recompute lets a block's buffers go and takes them again each step: on a device
# that must come from the allocator's cache (the steady-state check below reads this run too).
same gpt-block 2 8 "${GPT[@]}" --train.recompute=block

if "$TRAIN" --config "$WORK/tiny.ini" --train.precision=bf16 --print-config >/dev/null 2>&1 &&
  run_train 1 "$log" --train.precision=bf16 --train.max_steps=1; then
  same bf16 1 8 --train.precision=bf16
  # A GPT's blocks pass bf16 activations: the device's bf16 kernels are the CPU's too.
  same gpt-bf16 2 8 "${GPT[@]}" --train.precision=bf16
else
  echo "bf16: skipped: this CPU has neither AMX nor AVX512-BF16 (lockstep-train refuses bf16)"
fi

[ "$BASELINE" = 0 ] || skip "LOCKSTEP_EMU_DEVICES=0: the CPU runs only (a coverage baseline)"

note "exact resume on emu: 8 steps, stop, resume to 12, against 12 in one go"
full=$(crc 2 resume-full 12 --train.device=emu) || exit 1
run_train 2 "$log" --train.device=emu --checkpoint.dir="$WORK/resume-split" \
  --checkpoint.every_steps=8 --train.max_steps=8 || { show_log "$log"; fail "first half failed"; }
split=$(crc 2 resume-split 12 --train.device=emu --train.resume=auto) || exit 1
echo "resume: uninterrupted $full, resumed $split"
[ -n "$full" ] && [ "$full" = "$split" ] || fail "the resumed emu run differs from the uninterrupted one"

note "steady state on emu: no host syncs, no device allocations, no pageable copies"
python3 - "$WORK/ddp-emu.jsonl" "$WORK/gpt-block-emu.jsonl" <<'PY' ||
import json, sys
for path in sys.argv[1:]:
    records = [json.loads(l) for l in open(path) if '"loss"' in l and '"event"' not in l]
    steady = records[3:]
    assert steady, f"too few log records in {path}"
    # The record's own reads (losses, deferred gradient checks) come after its counters are taken.
    keys = ("host_syncs_per_step", "device_mallocs_per_step", "pageable_copies_per_step")
    bad = [(r["step"],) + tuple(r[k] for k in keys) for r in steady if any(r[k] != 0 for k in keys)]
    print(path.split("/")[-1], "steady steps", [r["step"] for r in steady], "host_syncs_per_step",
          sorted({r["host_syncs_per_step"] for r in steady}), "device_mallocs_per_step",
          sorted({r["device_mallocs_per_step"] for r in steady}))
    assert not bad, (path, bad)
PY
  fail "the emu run's steady state allocates or copies"

note "a stop signal on emu: SIGUSR1 through mpirun"
EXIT_REQUEUE=3
E2E_EPOCHS=100000 e2e_write_config
ck=$WORK/stop
start_train_bg 2 "$log" --train.device=emu --checkpoint.dir="$ck" --checkpoint.every_steps=100000000 \
  --log.every=20 --log.metrics="$WORK/stop.jsonl"
wait_for_training "$WORK/stop.jsonl" || { show_log "$log"; fail "stop: training did not start"; }
kill -USR1 "$MPIRUN_PID"
wait_job 60 || { show_log "$log"; fail "stop: still running 60 s after the signal"; }
[ "$JOB_RC" = $EXIT_REQUEUE ] || { show_log "$log"; fail "stop: exit status $JOB_RC, expected $EXIT_REQUEUE"; }
stop=$(latest_step "$ck")
[ -n "$stop" ] && [ "$stop" -gt 0 ] || { show_log "$log"; fail "stop: no checkpoint after the stop"; }
echo "stop: exit $JOB_RC, checkpoint at step $stop"
echo "PASS: the trainer on the emulated device trains bitwise as on the CPU"
