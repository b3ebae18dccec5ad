#!/usr/bin/env bash
# Stop signals during training, GPTs above all. A SIGUSR1 or SIGTERM used to abort GPT runs with heap
# corruption inside oneDNN's JIT sgemm (its kernel points rsp into the heap, and the signal frame
# landed there; include/lockstep/train/signals.hpp). Here RUNS signalled runs of a small GPT
# (default 6, one per case; SIGNAL_GPT_RUNS=50 for the stress run recorded in docs/ROBUSTNESS.md)
# cycle through the cases below: engines (DDP, DataParallel on an MLP, ZeRO-1), precisions, both
# sgemm libraries, 1 and 2 ranks. Each run gets SIGUSR1 through mpirun at a random moment of training;
# every other run also gets a SIGTERM to its ranks 10-60 ms later (Slurm's SIGTERM after the
# warning). Each must exit with kExitRequeue (3), leave the stop's checkpoint, and a run resumed
# from it must end bitwise equal (tensors_crc32) to an uninterrupted run of the same case.
# Under .ci/run this also runs in the AddressSanitizer + UBSan build (scripts/test.sh --sanitize).
# Usage: bash tests/scripts/signal_gpt.sh BUILD_DIR    Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: signal_gpt.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
e2e_workdir signal-gpt
e2e_make_data
E2E_EPOCHS=100000 e2e_write_config
e2e_make_text_shards 200 "$WORK/text"
log=$WORK/log.txt
RUNS=${SIGNAL_GPT_RUNS:-6}
STEPS=80  # the uninterrupted length; the signal lands within the first steps
EXIT_REQUEUE=3
GPT=(--model.spec='gpt(layers=2,heads=2,dim=128,ctx=64)' --data.train="$WORK/text/train"
  --data.test= --train.global_batch=16 --optim.name=adamw --optim.lr=0.003 --log.every=1)

# DataParallel trains no GPT (token shards are DDP's): its case is an MLP wide enough for the
# same JIT sgemm kernels.
MLP=(--model.spec=mlp:1024,1024 --train.global_batch=256 --log.every=1)

# name|ranks|model|sgemm library (empty: the automatic choice)|arguments
CASES=("ddp-1|1|GPT||" "ddp-2|2|GPT||" "dp-2-replicas|1|MLP||--train.parallel=dp --train.replicas=2"
  "zero1-2|2|GPT||--dist.zero=1" "bf16-1|1|GPT||--train.precision=bf16"
  "openblas-2|2|GPT|openblas|")
if ! "$TRAIN" --config "$WORK/tiny.ini" "${GPT[@]}" --train.precision=bf16 --train.max_steps=1 \
  >"$WORK/bf16-probe.log" 2>&1; then
  echo "bf16-1: not run: $(tail -n1 "$WORK/bf16-probe.log")"
  unset 'CASES[4]'
  CASES=("${CASES[@]}")
fi

# final_crc NAME: tensors_crc32 of the step-STEPS checkpoint in $WORK/NAME.
final_crc() {
  local f
  f=$WORK/$1/ckpt-$(printf %08d $STEPS).h5
  [ -f "$f" ] || { show_log "$log"; fail "$1: no step-$STEPS checkpoint"; }
  header_field "$f" tensors_crc32
}

declare -A REFERENCE
for run in $(seq 0 $((RUNS - 1))); do
  IFS='|' read -r name ranks model sgemm args <<<"${CASES[$((run % ${#CASES[@]}))]}"
  read -r -a args <<<"$args"
  declare -n model_args=$model
  args=("${model_args[@]}" "${args[@]}")
  if [ -n "$sgemm" ]; then export LOCKSTEP_SGEMM=$sgemm; else unset LOCKSTEP_SGEMM; fi
  if [ -z "${REFERENCE[$name]:-}" ]; then
    run_train "$ranks" "$log" "${args[@]}" --checkpoint.dir="$WORK/$name-reference" \
      --checkpoint.every_steps=$STEPS --train.max_steps=$STEPS ||
      { show_log "$log"; fail "$name: the uninterrupted run failed"; }
    REFERENCE[$name]=$(final_crc "$name-reference")
  fi

  ck=$WORK/run-$run
  metrics=$WORK/run-$run.jsonl
  start_train_bg "$ranks" "$log" "${args[@]}" --checkpoint.dir="$ck" \
    --checkpoint.every_steps=100000000 --train.max_steps=$STEPS --log.metrics="$metrics"
  wait_for_training "$metrics" || { show_log "$log"; fail "run $run ($name): training did not start"; }
  sleep "0.$(printf %03d $((RANDOM % 200)))"
  kill -USR1 "$MPIRUN_PID"
  second=
  # Every other run, shifted each round of the cases, so that each case gets both.
  if [ $(((run + run / ${#CASES[@]}) % 2)) = 1 ]; then
    sleep "0.0$((RANDOM % 5 + 1))"
    for pid in $(rank_pids); do kill -TERM "$pid" 2>/dev/null; done
    second=" + SIGTERM"
  fi
  wait_job 60 || { show_log "$log"; fail "run $run ($name): still running 60 s after the signal"; }
  [ "$JOB_RC" = $EXIT_REQUEUE ] || { show_log "$log"
    fail "run $run ($name): exit status $JOB_RC after SIGUSR1$second, expected $EXIT_REQUEUE"; }
  stop=$(latest_step "$ck")
  [ -n "$stop" ] && [ "$stop" -lt $STEPS ] ||
    { show_log "$log"; fail "run $run ($name): no stop checkpoint before step $STEPS (found '$stop')"; }
  run_train "$ranks" "$log" "${args[@]}" --checkpoint.dir="$ck" \
    --checkpoint.every_steps=$STEPS --train.max_steps=$STEPS --train.resume=auto ||
    { show_log "$log"; fail "run $run ($name): the resumed run failed"; }
  crc=$(final_crc "run-$run")
  echo "run $run ($name): SIGUSR1$second -> exit $JOB_RC, checkpoint at step $stop," \
    "resumed to $STEPS: crc $crc (uninterrupted ${REFERENCE[$name]})"
  [ "$crc" = "${REFERENCE[$name]}" ] ||
    fail "run $run ($name): the resumed run differs from the uninterrupted one"
  rm -rf "$ck"
done
echo "PASS: $RUNS signalled GPT runs each stopped with status 3 and a checkpoint that resumes bitwise"
