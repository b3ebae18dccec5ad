#!/usr/bin/env bash
# The one prepared GPU check of lockstep, for a single run on a lent GPU machine (one H200, 16
# cores, CUDA 13 and PyTorch in python3, cuDNN and NCCL as pip wheels; no Open MPI, HDF5, Boost,
# OpenBLAS, oneDNN or GoogleTest, no network). Nothing is built there: it unpacks the bundle that
# bench/gpu-bundle.sh made here (programs, their libraries, Open MPI, data) and runs, in this
# order, each step under its own limit (seconds) inside the whole budget (BUDGET_S, 540 s), so a
# hang costs its step and not the run; what the budget no longer covers is recorded as SKIP
# "out of time", so the order is the priority:
#    gpu, bundle      nvidia-smi (30), unpacking (60)
#    smoke-*          lockstep-train, 20 steps on cuda:0 of the MLP, the CNN and GPT-tiny (40 each):
#                     the first thing a user runs; pass/fail with its first error line
#    attention        test_cuda's CudnnAttention.*: cuDNN's fused attention against lockstep's
#                     reference kernel at GPT-2's shapes, its errors beside their bounds (90; the
#                     test_cuda step below leaves these out when they ran here)
#    peak             the GPU's ceilings as PyTorch reaches them (bench/gpu_peak.py, 30), for MFU
#    gpt-*, torch-gpt-*  GPT-2 124M at 1024 tokens a sequence: lockstep-bench gpt bf16 at batch 8
#                     (train.attention = auto, which records the kernel it ran, and = reference for
#                     the ratio) and 16, fp32 at 8, bf16 at 8 with --recompute=block;
#                     bench/gpt_torch.py eager and --compile, bf16 at 8 and 16, eager fp32 at 8 (45
#                     each, 150 compiled): the figures the lease is for; the summary gives MFU,
#                     lockstep vs PyTorch and cuDNN's attention vs the reference kernels
#    test_cuda        every CUDA test, pass/fail/skip by name (90)
#    resnet, torch-resnet  ResNet-50 bf16 on 3x224x224, batch 64: lockstep-bench gpu-step against
#                     torchvision's in PyTorch (channels_last, autocast) (45, 60); lockstep in both
#                     of its layouts (model.channels_last = auto, i.e. NHWC, and off) (45 each)
#    memcheck, racecheck  compute-sanitizer on the named subsets below (90, 45); a sanitizer the
#                     sandbox refuses is SKIP with its reason, a finding is FAIL
#    nccl             test_mpi's NCCL tests on 1 rank, the watchdog among them (90)
#    train-*          lockstep-train, 200 steps of fashion_mlp and fashion_cnn, fp32 and bf16:
#                     ms/step, samples/s, GPU memory, sync/allocation counters (45 each)
#    gpu-step*, torch-step  lockstep-bench gpu-step fp32/tf32/bf16 and the same models in
#                     PyTorch (60, 30, 30, 60); gpu-step fails on a non-finite loss, and its fp32
#                     run on a loss (steps 1 and 2) that differs from the CPU's beside it
#    dp-vs-ddp        bench/dp-vs-ddp.sh on the CPU, up to 8 replicas/ranks (150): last, and
#                     alone, since it measures scaling (never beside the sanitizers)
# A step whose tool or GPU is missing is skipped with its reason; the others still run. A short
# table is printed last. Without a readable bundle it stops at once with a non-zero exit.
#
# On the device (repository root, gpu-bundle/ carried):   bash bench/gpu-check.sh
#   run(command="bash bench/gpu-check.sh", carry=["gpu-bundle"], timeout_s=560)
# Here, without a GPU (.ci/run does this on every submission):
#   GPU_CHECK_DRY_RUN=1 OUT=/tmp/gc bash bench/gpu-check.sh
# The dry run runs every step a CPU can: the smokes on the emulated GPU (train.device = emu: the
# configs, keys, bundled data and the trainer's device code paths are what rots; the GPU run
# differs only in the kernels), test_cuda with its GPU tests
# skipping, the sanitizer subsets checked against test_cuda's test list and the sanitizer triage
# checked on canned logs, the NCCL tests' CPU half, the CPU halves of the benchmarks (gpu-step's
# GPU half on the emulated GPU), dp-vs-ddp with 2; GPU steps SKIP with "no GPU".
# Results in $OUT (default results/gpu-check/<time>): summary.txt, gpu-check.json, console.log,
# logs.tar.gz (every step's log, gtest JSON, metrics, dp-vs-ddp results): 4 files.
# Settings: GPU_BUNDLE (gpu-bundle/lockstep-gpu.tar.xz), BUDGET_S (540: the whole check),
#   TRAIN_STEPS (200), DP_K (8), GPU_CHECK_DRY_RUN (0), MEMCHECK_TESTS and RACECHECK_TESTS
#   (gtest patterns, ':'-separated, instead of the subsets below), GPU_CHECK_ONLY (the steps to
#   run, space-separated, of: smoke attention gpt torch-gpt test_cuda resnet memcheck racecheck
#   nccl train gpu-step torch-step dp-vs-ddp; empty = all. A rerun after a fix takes the steps that
#   failed; the others are SKIP "not asked for"), TEST_CUDA_FILTER (a gtest filter for the test_cuda
#   step).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-$ROOT/results/gpu-check/$(date +%Y-%m-%d_%H%M%S)}
DRY=${GPU_CHECK_DRY_RUN:-0}
BUDGET_S=${BUDGET_S:-540}
BUNDLE=${GPU_BUNDLE:-$ROOT/gpu-bundle/lockstep-gpu.tar.xz}
TRAIN_STEPS=${TRAIN_STEPS:-200}
DP_K=${DP_K:-8}
RESERVE=15  # seconds kept for the summary
export PYTHONUNBUFFERED=1 GTEST_COLOR=no

# Without the bundle nothing of lockstep can run there: say so and stop, before any output
# could read as a check that passed.
if [ ! -f "$BUNDLE" ] || [ ! -r "$BUNDLE" ] || [ ! -s "$BUNDLE" ]; then
  echo "gpu-check: no readable bundle at $BUNDLE: make it here with bench/gpu-bundle.sh (after a" \
       "CUDA build) and carry gpu-bundle/ to the device (docs/PERFORMANCE.md, \"## GPU\")" >&2
  exit 2
fi

# compute-sanitizer's subsets of test_cuda. All of test_cuda under memcheck is not expected to
# fit its limit (issue 25's review): cuDNN's algorithm search (the convolution tests) tries every
# candidate, each instrumented, and the trainings run hundreds of steps. So memcheck takes lockstep's own kernels
# (cuBLAS and cuDNN are NVIDIA's to check), with the paths where an index comes from data (a label
# or token out of range), the flat optimizer buffers' padding, and the pinned staging copies;
# racecheck takes the kernels that share memory between threads: the block reductions
# (block_reduce.cuh: bias and batch-norm sums, the loss mean, sums of squares), layer norm's
# parameter partials and flash attention's tiles. Sized to fit, not yet timed on a GPU: a step
# that times out names the test it was in. Every name must exist in test_cuda: the dry run
# fails when one is renamed or gone.
MEMCHECK_SUBSET=(
  Ops.FillAndCopyBetweenDevicesAreExact Ops.ElementwiseOpsMatchCpu
  Ops.RowBiasAddsAndSumRowsAccumulates Ops.NormalizeInputMatchesCpuForBytesAndFloats
  Ops.PoolingMatchesCpu Ops.BatchNormTrainEvalAndBackwardMatchCpu
  Ops.SoftmaxCrossEntropyAndAccuracyMatchCpu Devices/DeviceResults.LabelOutsideTheClassesIsAnErrorByTheNextSynchronize/cuda
  Ops.ReductionsMatchCpu Ops.OptimizerUpdatesMatchCpu
  Flat.PaddingIsNeverReadOrWritten Flat.SumOfSquaresPerSlotMatchesTheCpuAndIsDeterministic
  Gpt.EmbeddingMatchesCpuAndItsBackwardIsDeterministic
  Devices/DeviceResults.TokenOutsideTheVocabularyIsReportedByTheNextSynchronize/cuda
  Gpt.LayerNormMatchesCpu Gpt.GeluTanhMatchesCpu Gpt.AttentionFlashAndNaiveMatchCpu
  Devices/InputStaging.EveryBatchArrivesIntactWithoutAllocationsPageableCopiesOrSyncs/cuda
)
RACECHECK_SUBSET=(
  Ops.RowBiasAddsAndSumRowsAccumulates Ops.BatchNormTrainEvalAndBackwardMatchCpu
  Ops.SoftmaxCrossEntropyAndAccuracyMatchCpu Ops.ReductionsMatchCpu
  Flat.SumOfSquaresPerSlotMatchesTheCpuAndIsDeterministic
  Gpt.LayerNormMatchesCpu Gpt.AttentionFlashAndNaiveMatchCpu
)
MEMCHECK_TESTS=${MEMCHECK_TESTS:-$(IFS=:; echo "${MEMCHECK_SUBSET[*]}")}
RACECHECK_TESTS=${RACECHECK_TESTS:-$(IFS=:; echo "${RACECHECK_SUBSET[*]}")}

ONLY=${GPU_CHECK_ONLY:-}
for s in $ONLY; do
  case " smoke attention gpt torch-gpt test_cuda resnet memcheck racecheck nccl train gpu-step torch-step dp-vs-ddp " in
    *" $s "*) ;;
    *) echo "gpu-check: GPU_CHECK_ONLY names '$s', not a step of this check" >&2; exit 2 ;;
  esac
done

mkdir -p "$OUT"
W=$(mktemp -d /tmp/gpu-check.XXXXXX)
mkdir -p "$W/logs"
elapsed() { echo "$SECONDS"; }
record() {  # name status seconds detail
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\n'/ }" >>"$W/steps.tsv"
  printf '== [%3ss] %-22s %-8s %s\n' "$(elapsed)" "$1" "$2" "$4"
}
skip() { record "$1" SKIP 0 "$2"; }
wants() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }  # step: asked for?
asked() {  # step: true when GPU_CHECK_ONLY is empty or names it, else records the skip
  wants "$1" && return 0
  skip "$1" "not asked for (GPU_CHECK_ONLY=$ONLY)"
  return 1
}
# run_step name limit_s command...: output to logs/<name>.log; sets RC and DUR; 124 = timed out.
run_step() {
  local name=$1 limit=$2 left
  shift 2
  left=$((BUDGET_S - SECONDS - RESERVE))
  if ((left < 10)); then RC=125 DUR=0; return 125; fi
  ((limit > left)) && limit=$left
  local t0=$SECONDS
  echo "== [${SECONDS}s] $name: $* (limit ${limit}s)"
  timeout -k 10 "$limit" "$@" >"$W/logs/$name.log" 2>&1
  RC=$?
  DUR=$((SECONDS - t0))
  return $RC
}
# The status of the last run_step: ok, TIMEOUT, OUT-OF-TIME or FAIL (rc N).
status_of() {
  case $RC in
    0) echo ok ;;
    124 | 137) echo TIMEOUT ;;
    125) echo SKIP ;;
    *) echo "FAIL" ;;
  esac
}
why() {  # a one-line reason from the last run_step
  case $RC in
    0) echo "$1" ;;
    124 | 137) echo "timed out after ${DUR}s; $1" ;;
    125) echo "out of time (the check's budget is ${BUDGET_S}s)" ;;
    *) echo "rc $RC: $(grep -v '^\s*$' "$W/logs/$2.log" 2>/dev/null | grep -iE 'error|fail|cannot|what|unknown' | head -2 | cut -c1-200 | paste -sd' ')" ;;
  esac
}

unpack() {  # tar.xz, folder: with xz where the image has it, else with python3's lzma
  if command -v xz >/dev/null; then
    tar -C "$2" -xJf "$1"
  else
    python3 -c 'import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(sys.argv[2], **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))' "$1" "$2"
  fi
}
export -f unpack


# The first line of a log that reads as an error (else its last line), for a one-line verdict.
first_error() {
  local line
  line=$(grep -v '^\s*$' "$1" 2>/dev/null | grep -m1 -iE 'error|fail|terminate|what\(\)|cannot|abort|exception|not found|invalid')
  [ -n "$line" ] || line=$(grep -v '^\s*$' "$1" 2>/dev/null | tail -1)
  echo "${line:0:200}"
}

# compute-sanitizer's verdict on a log: "STATUS<TAB>detail". The sandbox may refuse the tool
# (gVisor: "Device not supported", then error 999 at the first allocation; no ptrace: the
# debugger API does not start), and then nothing was checked: SKIP with its reason, never FAIL.
# A hazard or a bad access is a finding, FAIL, whatever else the log says.
sanitizer_verdict() {  # log rc
  local log=$1 rc=$2 finding refusal
  finding=$(grep -m1 -E '^=+ +(Invalid __(global|shared|local)__|.*([Oo]ut of bounds|Out-of-range)|(Error|Warning): Race reported|(ERROR|WARNING): Potential [A-Z]{3} hazard|.*(Read|Write)-after-(Read|Write) hazard|Uninitialized __global__|Misaligned)' "$log")
  refusal=$(grep -m1 -iE 'Device not supported|Debugger API|ptrace|Operation not permitted|Internal Sanitizer Error|Unable to (find|load|open|attach)|injection library|terminated before first instrumented' "$log")
  if [ "$rc" = 0 ]; then
    printf 'ok\t'
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    printf 'TIMEOUT\tstopped in %s' "$(grep -E '^\[ RUN +\]' "$log" | tail -1 | awk '{print $NF}')"
  elif [ -n "$finding" ]; then
    printf 'FAIL\tfinding: %s' "${finding:0:160}"
  elif [ -n "$refusal" ]; then
    printf 'SKIP\tthe sandbox refused compute-sanitizer, nothing was checked: %s' "${refusal:0:160}"
  elif ! grep -qE '^\[ RUN +\]' "$log"; then
    printf 'SKIP\tcompute-sanitizer stopped before any test ran (rc %s): %s' "$rc" "$(first_error "$log" | cut -c1-160)"
  else
    printf 'FAIL\trc %s: %s' "$rc" "$(grep -m1 -E '^\[ +FAILED +\] [A-Z]' "$log" || first_error "$log")"
  fi
}
# The verdicts above on canned logs shaped like the tool's (dry run: no compute-sanitizer here),
# so the triage is checked on every submission and not first on a lent GPU.
sanitizer_triage_selftest() {
  local d=$W/triage got bad=""
  mkdir -p "$d"
  printf '========= Error: Device not supported\n[ RUN      ] Ops.ReductionsMatchCpu\n========= Program hit cudaErrorUnknown (error 999) due to "unknown error" on CUDA API call to cudaMalloc.\n[  FAILED  ] Ops.ReductionsMatchCpu (3 ms)\n========= ERROR SUMMARY: 1 error\n' >"$d/gvisor"
  printf '========= Error: Debugger API initialization failed\n' >"$d/ptrace"
  printf '========= COMPUTE-SANITIZER\n========= Error: Target application returned an error\n' >"$d/nostart"
  printf '[ RUN      ] Gpt.LayerNormMatchesCpu\n========= Invalid __global__ write of size 4 bytes\n=========     at layernorm_forward_kernel+0x2b0\n[       OK ] Gpt.LayerNormMatchesCpu (812 ms)\n========= ERROR SUMMARY: 1 error\n' >"$d/memfinding"
  printf '[ RUN      ] Ops.ReductionsMatchCpu\n========= Error: Race reported between Write access at sum_partials_kernel+0x90\n========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n' >"$d/race"
  printf '[ RUN      ] Ops.ReductionsMatchCpu\nexpected 1.0, got 2.0\n[  FAILED  ] Ops.ReductionsMatchCpu (4 ms)\n========= ERROR SUMMARY: 0 errors\n' >"$d/testfail"
  printf '[ RUN      ] Ops.ReductionsMatchCpu\n[       OK ] Ops.ReductionsMatchCpu (4 ms)\n========= ERROR SUMMARY: 0 errors\n' >"$d/clean"
  local c
  for c in gvisor:86:SKIP ptrace:1:SKIP nostart:1:SKIP memfinding:86:FAIL race:86:FAIL testfail:1:FAIL clean:0:ok; do
    IFS=: read -r name rc want <<<"$c"
    got=$(sanitizer_verdict "$d/$name" "$rc" | cut -f1)
    [ "$got" = "$want" ] || bad+=" $name gave $got, not $want;"
  done
  if [ -z "$bad" ]; then
    record sanitizer-triage ok 0 "canned logs: a refused sanitizer (gVisor, ptrace, no start) SKIPs, a finding or a failed test FAILs, a clean run passes"
  else
    record sanitizer-triage FAIL 0 "sanitizer_verdict is wrong on:$bad"
  fi
}

main() {
  echo "== lockstep gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname), budget ${BUDGET_S}s, dry run: $DRY"
  echo "   work folder $W, results $OUT"

  # ---- GPU, driver, clocks
  HAVE_GPU=0
  if [ "$DRY" = 1 ]; then
    skip gpu "dry run (GPU_CHECK_DRY_RUN=1): GPU steps skip"
  elif ! command -v nvidia-smi >/dev/null; then
    skip gpu "nvidia-smi not found: no GPU driver"
  elif run_step nvidia-smi 30 nvidia-smi -q -d CLOCK; then
    HAVE_GPU=1
    GPU_LINE=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader 2>&1 | head -1)
    nvidia-smi >>"$W/logs/nvidia-smi.log" 2>&1
    record gpu ok "$DUR" "$GPU_LINE (name, driver, memory, SM clock, max SM clock, memory clock)"
  else
    record gpu FAIL "$DUR" "$(why "" nvidia-smi)"
  fi
  gpu_only() {  # step name: true with a GPU, else records the skip
    ((HAVE_GPU)) && return 0
    skip "$1" "no GPU${2:+ ($2)}"
    return 1
  }

  # ---- the bundle (its absence stopped the script above)
  HAVE_BUNDLE=0
  if run_step bundle 60 bash -c 'unpack "$1" "$2"' _ "$BUNDLE" "$W" && [ -f "$W/lockstep-gpu/env.sh" ]; then
    # shellcheck disable=SC1091
    source "$W/lockstep-gpu/env.sh"
    cp "$LOCKSTEP_BUNDLE/MANIFEST.txt" "$W/logs/bundle-manifest.txt"
    local need have
    need=$(sed -n 's/.*glibc >= \([0-9.]*\).*/\1/p' "$LOCKSTEP_BUNDLE/MANIFEST.txt" | head -1)
    have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
    if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
      record bundle FAIL "$DUR" "this machine's glibc $have is older than the $need the bundle needs: make it on an older distribution"
    else
      HAVE_BUNDLE=1
      record bundle ok "$DUR" "$(sed -n 2p "$LOCKSTEP_BUNDLE/MANIFEST.txt"); glibc $have (needs $need)"
    fi
  else
    record bundle FAIL "$DUR" "cannot unpack $BUNDLE ($(grep -m1 . "$W/logs/bundle.log" | cut -c1-160)): make it again with bench/gpu-bundle.sh"
  fi
  bundle_only() {  # step: true with a bundle and the step asked for, else records the skip
    ((HAVE_BUNDLE)) || { skip "$1" "no bundle"; return 1; }
    asked "$1"
  }

  # ---- the device's cuBLAS(Lt), cuDNN and NCCL (lockstep opens them lazily), and libcuda
  local dirs=() so d sp
  local sites
  # python3's path: its site-packages, a venv's, PYTHONPATH (wheels carried to /tmp/site).
  sites=$(python3 -c 'import sys; print("\n".join(p for p in sys.path if p))' 2>/dev/null)
  # libnvrtc: cuDNN's fused attention compiles its kernels at run time (libcudnn_graph opens it).
  for so in libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 libnvrtc.so.13; do
    local found=""
    for d in ${CUDA_TOOLKIT_LIB_DIRS:-/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib}; do
      [ -e "$d/$so" ] && found=$d && break
    done
    if [ -z "$found" ]; then
      while read -r sp; do
        [ -n "$sp" ] || continue
        for d in "$sp"/nvidia/*/lib "$sp"/nvidia/*/lib64; do
          [ -e "$d/$so" ] && found=$d && break 2
        done
      done <<<"$sites"
    fi
    if [ -n "$found" ]; then
      [[ " ${dirs[*]} " == *" $found "* ]] || dirs+=("$found")
      echo "   $so: $found"
      if [ "$so" = libcudnn.so.9 ]; then
        # libcudnn.so.9 is a shim that opens these beside it ($ORIGIN): the graph API, the
        # heuristics and both engine libraries are what the fused attention runs on.
        local sub missing=""
        for sub in graph heuristic engines_precompiled engines_runtime_compiled; do
          [ -e "$found/libcudnn_$sub.so.9" ] || missing+=" libcudnn_$sub.so.9"
        done
        CUDNN_LIBS_NOTE=${missing:+missing beside libcudnn.so.9:$missing}
        echo "   cuDNN's sub-libraries: ${CUDNN_LIBS_NOTE:-all four beside it}"
      fi
    else
      echo "   $so: not found (the steps that need it will fail naming it)"
    fi
  done
  LOCKSTEP_CUDA_LIB_DIRS=$(IFS=:; echo "${dirs[*]}")
  export LOCKSTEP_CUDA_LIB_DIRS
  if [[ $(ldconfig -p 2>/dev/null) != *libcuda.so.1* ]]; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/local/cuda/compat; do
      if [ -e "$d/libcuda.so.1" ]; then export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; fi
    done
  fi
  # The bundle's libstdc++ (this build machine's GCC) goes first only where the device's is older:
  # a newer one serves lockstep too, and the device's own tools (compute-sanitizer) may need it.
  if ((HAVE_BUNDLE)); then
    local sys_cxx ours_v sys_v
    sys_cxx=$(ldconfig -p 2>/dev/null | sed -n 's/.*libstdc++\.so\.6 (libc6,x86-64) => //p' | head -1)
    if [ -n "$sys_cxx" ] && [ -e "$LOCKSTEP_BUNDLE/lib/libstdc++.so.6" ]; then
      ours_v=$(grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$LOCKSTEP_BUNDLE/lib/libstdc++.so.6" | sort -uV | tail -1)
      sys_v=$(grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$sys_cxx" | sort -uV | tail -1)
      if [ "$(printf '%s\n%s\n' "$ours_v" "$sys_v" | sort -V | tail -1)" = "$sys_v" ] && [ "$ours_v" != "$sys_v" ]; then
        mkdir -p "$LOCKSTEP_BUNDLE/lib-unused"
        mv "$LOCKSTEP_BUNDLE"/lib/libstdc++.so.6 "$LOCKSTEP_BUNDLE"/lib/libgcc_s.so.1 "$LOCKSTEP_BUNDLE/lib-unused/" 2>/dev/null
        echo "   libstdc++: the device's ($sys_v, $sys_cxx) rather than the bundle's ($ours_v)"
      else
        echo "   libstdc++: the bundle's ($ours_v; the device has ${sys_v:-none})"
      fi
    fi
  fi
  local torch_v
  torch_v=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)

  # ---- 1. the trainer smoke: 20 steps of each kind of model, on cuda:0 (on the emulated GPU in a
  # dry run, where the configs, their keys, the bundled data and the trainer's device code paths
  # are checked: what the GPU run needs too)
  if bundle_only smoke; then
    local m cfg where=cuda:0 sdev=(--train.device=cuda --train.gpu=0) sdata
    ((HAVE_GPU)) || { where=emu:0; sdev=(--train.device=emu); }
    for m in mlp cnn gpt-tiny; do
      case $m in
        mlp | cnn) cfg=configs/fashion_$m.ini
          sdata=(--data.train="$LOCKSTEP_BUNDLE_DATA/train" --data.test="$LOCKSTEP_BUNDLE_DATA/test") ;;
        gpt-tiny) cfg=configs/gpt_tiny.ini
          sdata=(--data.train="${LOCKSTEP_BUNDLE_TEXT:-}/train" --data.test="${LOCKSTEP_BUNDLE_TEXT:-}/val") ;;
      esac
      if [ $m = gpt-tiny ] && ! ls "${LOCKSTEP_BUNDLE_TEXT:-/nonexistent}"/train-*.h5 >/dev/null 2>&1; then
        record smoke-$m FAIL 0 "the bundle has no GPT token shards (made before they were packed): make it again with bench/gpu-bundle.sh"
        continue
      fi
      # The config as a user runs it, cut to 20 steps (its warm-up with it); checkpoints into the
      # work folder, where the configs ask for them, so the copy back from the device runs too.
      run_step smoke-$m 40 lockstep-train --config "$cfg" "${sdata[@]}" "${sdev[@]}" \
        --train.max_steps=20 --optim.warmup_steps=5 --train.eval=false --log.every=5 \
        --log.progress=none --checkpoint.dir="$W/smoke-$m-ckpt" --log.metrics="$W/logs/smoke-$m.jsonl"
      local detail
      if [ "$RC" = 0 ]; then
        # Exit 0 is not enough: the run must have logged its steps and a finite final loss.
        if detail=$(smoke_figures "$W/logs/smoke-$m.jsonl"); then
          record smoke-$m ok "$DUR" "20 steps on $where: $detail"
        else
          RC=1
          record smoke-$m FAIL "$DUR" "exit 0 on $where, but $detail"
        fi
      elif [ "$RC" = 125 ]; then
        record smoke-$m SKIP 0 "$(why "" smoke-$m)"
      else
        record smoke-$m "$(status_of)" "$DUR" "on $where: $(first_error "$W/logs/smoke-$m.log")"
      fi
    done
  fi

  # ---- 1b. cuDNN's fused attention against lockstep's reference kernel (test_cuda's
  # CudnnAttention.*): before the bf16 GPT figures, which run on it under train.attention = auto.
  # The tests print their measured errors beside the bounds; the gpt2 shape's go in the detail.
  if bundle_only attention; then
    ATTENTION_RAN=1
    run_step attention 90 test_cuda --gtest_filter='CudnnAttention.*' \
      --gtest_output="json:$W/logs/test_cuda_attention.json"
    local ast adetail part
    ast=$(status_of)
    adetail="$(gtest_counts "$W/logs/test_cuda_attention.json")"
    for part in "$(grep -m1 -o 'cuDNN [0-9.]* fused[^;]*' "$W/logs/attention.log" | cut -c1-60)" \
                "$(grep -m1 -o 'B 4 T 1024.*' "$W/logs/attention.log" | cut -c1-150)"; do
      [ -n "$part" ] && adetail+="; $part"
    done
    ((HAVE_GPU)) || adetail+=" (no GPU: they skip)"
    if ((HAVE_GPU)) && grep -q "no cuDNN frontend" "$W/logs/attention.log"; then
      ast=FAIL adetail="the bundle's test_cuda was built without the cuDNN frontend" \
        adetail+=" (scripts/install-deps.sh --cudnn-frontend, rebuild, bench/gpu-bundle.sh)"
    elif ((HAVE_GPU)) && grep -q "no GPU answers" "$W/logs/attention.log"; then
      ast=FAIL adetail="$adetail; the tests saw no GPU"
    fi
    [ "$RC" = 0 ] || adetail="$(why "" attention); $adetail"
    record attention "$ast" "$DUR" "$adetail"
  fi

  # ---- 2. GPT-2 124M at 1024 tokens a sequence, in lockstep and in PyTorch eager and compiled:
  # the lease's figures, early. First the GPU's ceilings as PyTorch reaches them (an 8192^3 bf16
  # product, a device copy), against which the summary gives each run's MFU.
  if ((HAVE_GPU)) && [ -n "$torch_v" ] && { wants gpt || wants torch-gpt; }; then
    run_step peak 30 python3 bench/gpu_peak.py
    grep '^{' "$W/logs/peak.log" >"$W/logs/peak.json" 2>/dev/null
    record peak "$(status_of)" "$DUR" "$(why "$(python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(f"bf16 {d[\"bf16_matmul_tflops\"]:.0f} TFLOP/s, copy {d[\"copy_tb_per_s\"]:.2f} TB/s")' "$W/logs/peak.json" 2>/dev/null)" peak)"
  fi
  if bundle_only gpt; then
    local spec p b rc name
    if ((HAVE_GPU)); then
      # precision:batch[:recompute[:attention]]: train.attention = auto (cuDNN's under bf16) but
      # for one run of lockstep's reference kernels beside it, for the ratio; block recompute's
      # memory beside none's at batch 8
      local att
      for spec in bf16:8 bf16:8::reference bf16:16 fp32:8 bf16:8:block; do
        IFS=: read -r p b rc att <<<"$spec"
        name=gpt-$p-b$b${rc:+-$rc}${att:+-$att}
        run_step "$name" 45 lockstep-bench gpt --model=gpt2-124m --device=cuda:0 --batch="$b" \
          --seq=1024 --vocab=50257 --steps=3 --reps=3 --precision="$p" ${rc:+--recompute=$rc} \
          --attention="${att:-auto}" --out="$W/logs/$name.json"
        record "$name" "$(status_of)" "$DUR" "$(why "$(gpt_figures "$W/logs/$name.json")" "$name")"
      done
    else
      run_step gpt-fp32 45 lockstep-bench gpt --model=gpt-mini --device=cpu --batch=2 --seq=64 \
        --vocab=256 --threads="$(nproc)" --steps=1 --reps=3 --out="$W/logs/gpt-fp32.json"
      record gpt-fp32 "$(status_of)" "$DUR" "$(why "lockstep gpt-mini on the CPU (no GPU): $(gpt_figures "$W/logs/gpt-fp32.json")" gpt-fp32)"
    fi
  fi
  if [ -z "$torch_v" ]; then
    skip torch-gpt "python3 has no torch"
  elif asked torch-gpt && gpu_only torch-gpt; then
    local mode limit flags
    # mode:precision:batch; torch.compile's warm-up step compiles (its time is compile_s)
    for spec in eager:bf16:8 compile:bf16:8 eager:bf16:16 compile:bf16:16 eager:fp32:8; do
      IFS=: read -r mode p b <<<"$spec"
      name=torch-gpt-$mode-$p-b$b limit=45 flags=()
      [ "$mode" = compile ] && limit=150 flags=(--compile)
      run_step "$name" $limit python3 bench/gpt_torch.py --model=gpt2-124m --batch="$b" \
        --seq=1024 --device=cuda --dtype="$p" --steps=3 --reps=3 "${flags[@]}"
      grep '^{' "$W/logs/$name.log" >"$W/logs/$name.json" 2>/dev/null
      record "$name" "$(status_of)" "$DUR" "$(why "PyTorch $torch_v: $(gpt_figures "$W/logs/$name.json")" "$name")"
    done
  fi

  # ---- 3. every CUDA test, by name
  if bundle_only test_cuda; then
    # cuDNN's attention tests ran in their own step (graph builds are not cheap): not twice.
    local cuda_filter=${TEST_CUDA_FILTER:-}
    [ -z "$cuda_filter" ] && ((${ATTENTION_RAN:-0})) && cuda_filter='-CudnnAttention.*'
    run_step test_cuda 90 test_cuda ${cuda_filter:+--gtest_filter="$cuda_filter"} \
      --gtest_output="json:$W/logs/test_cuda.json"
    local st
    st=$(status_of)
    local counts
    counts=$(gtest_counts "$W/logs/test_cuda.json")
    if [ "$st" = ok ] && ((HAVE_GPU)) && grep -q "no GPU answers\|sees no GPU" "$W/logs/test_cuda.log"; then
      st=FAIL counts="$counts; the tests saw no GPU"
    fi
    [ "$RC" = 0 ] || counts="$(why "" test_cuda); $counts"
    record test_cuda "$st" "$DUR" "$counts"
  fi

  # ---- 3b. ResNet-50 bf16 on 3x224x224 (issue 27): lockstep-bench gpu-step against PyTorch's
  # torchvision ResNet-50 under autocast bf16 in channels_last (bench/gpu_torch.py), batch 64,
  # input copied from the host each step on both sides; images/s and the ratio in the summary.
  if bundle_only resnet; then
    if ((HAVE_GPU)); then
      run_step resnet 45 lockstep-bench gpu-step --models=resnet50 --precision=bf16 --cpu=0 \
        --resnet50-batch=64 --reps=10 --warmup=3 --out="$W/logs/resnet.json"
      record resnet "$(status_of)" "$DUR" "$(why "lockstep ResNet-50 bf16 b64: $(step_figures "$W/logs/resnet.json")" resnet)"
      # The same in NCHW, for the ratio that decides model.channels_last = auto on a GPU.
      run_step resnet-nchw 45 lockstep-bench gpu-step --models=resnet50 --precision=bf16 --cpu=0 \
        --resnet50-batch=64 --reps=10 --warmup=3 --channels-last=off --out="$W/logs/resnet-nchw.json"
      record resnet-nchw "$(status_of)" "$DUR" "$(why "lockstep ResNet-50 bf16 b64, NCHW (model.channels_last = off): $(step_figures "$W/logs/resnet-nchw.json")" resnet-nchw)"
    else
      run_step resnet 45 lockstep-bench gpu-step --models=resnet50 --gpu=0 --resnet50-batch=1 \
        --reps=3 --warmup=0 --cpu-threads="$(nproc)" --out="$W/logs/resnet.json"
      record resnet "$(status_of)" "$DUR" "$(why "CPU half only (no GPU), batch 1: $(step_figures "$W/logs/resnet.json")" resnet)"
    fi
  fi
  if [ -z "$torch_v" ]; then
    skip torch-resnet "python3 has no torch"
  elif asked resnet && gpu_only torch-resnet; then
    run_step torch-resnet 60 python3 bench/gpu_torch.py --device=cuda --models=resnet50-224 \
      --precisions=bf16 --resnet50-batch=64 --reps=10 --warmup=3
    grep '^{' "$W/logs/torch-resnet.log" >"$W/logs/torch-resnet.jsonl" 2>/dev/null
    record torch-resnet "$(status_of)" "$DUR" "$(why "PyTorch $torch_v channels_last autocast bf16 b64: $(step_figures "$W/logs/torch-resnet.jsonl")" torch-resnet)"
  fi

  # ---- 4. compute-sanitizer on the named subsets; alone, before the figures that time anything
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
  if ((HAVE_BUNDLE)); then  # cheap, and what memcheck/racecheck rely on: always
    # Every pattern of the subsets must match a test of test_cuda: a renamed test would otherwise
    # leave the sanitizer checking nothing while reporting ok.
    local all pat missing="" n_mem=0 n_race=0 t
    all=$(test_cuda --gtest_list_tests 2>/dev/null | awk '/^[^ ]/ {s=$1} /^  / {print s $1}')
    for pat in ${MEMCHECK_TESTS//:/ } ${RACECHECK_TESTS//:/ }; do
      local hit=0
      while read -r t; do
        # shellcheck disable=SC2053  # a gtest pattern: * and ? are globs
        [[ $t == $pat ]] && hit=1 && break
      done <<<"$all"
      ((hit)) || missing+=" $pat"
    done
    n_mem=$(tr ':' '\n' <<<"$MEMCHECK_TESTS" | grep -c .)
    n_race=$(tr ':' '\n' <<<"$RACECHECK_TESTS" | grep -c .)
    if [ -n "$all" ] && [ -z "$missing" ]; then
      record sanitizer-subsets ok 0 "memcheck $n_mem, racecheck $n_race named tests, each in test_cuda"
    else
      record sanitizer-subsets FAIL 0 "not in test_cuda's list:${missing:- (no list)}: update MEMCHECK_SUBSET/RACECHECK_SUBSET in bench/gpu-check.sh"
    fi
  fi
  ((HAVE_GPU)) || sanitizer_triage_selftest
  if ! ((HAVE_BUNDLE)); then
    skip memcheck "no bundle"; skip racecheck "no bundle"
  elif [ -n "$ONLY" ] && [[ " $ONLY " != *" memcheck "* && " $ONLY " != *" racecheck "* ]]; then
    skip memcheck "not asked for (GPU_CHECK_ONLY=$ONLY)"; skip racecheck "not asked for (GPU_CHECK_ONLY=$ONLY)"
  elif ! ((HAVE_GPU)); then
    skip memcheck "no GPU"; skip racecheck "no GPU"
  elif [ -z "$sanitizer" ]; then
    skip memcheck "compute-sanitizer not found"; skip racecheck "compute-sanitizer not found"
  else
    local tool filter limit verdict vdetail
    for tool in memcheck racecheck; do
      asked $tool || continue
      if [ $tool = memcheck ]; then filter=$MEMCHECK_TESTS limit=90
      else filter=$RACECHECK_TESTS limit=45; fi
      run_step $tool $limit "$sanitizer" --tool $tool --error-exitcode 86 --print-limit 30 \
        --target-processes all "$LOCKSTEP_BUNDLE/bin/test_cuda" --gtest_filter="$filter"
      local log=$W/logs/$tool.log
      if [ "$RC" = 125 ]; then record $tool SKIP 0 "$(why "" $tool)"; continue; fi
      verdict=$(sanitizer_verdict "$log" "$RC")
      vdetail=${verdict#*$'\t'}
      record $tool "${verdict%%$'\t'*}" "$DUR" "${vdetail:+$vdetail; }$(grep -cE '^\[ +OK \]' "$log") of $(tr ':' '\n' <<<"$filter" | grep -c .) named tests ok, $(grep -cE '^\[ +FAILED +\] [A-Z]' "$log") failed, $(grep -cE '^\[ +SKIPPED +\] [A-Z]' "$log") skipped; $(grep -oE '(ERROR|RACECHECK) SUMMARY: .*' "$log" | tail -1)"
    done
  fi

  # ---- 5. NCCL on one rank: the communicator's collectives, and its watchdog where a test has one
  if bundle_only nccl; then
    # GpuSelection.* need 2 ranks and no GPU: bench/gpu-bundle.sh runs them here.
    local watchdog_tests filter="NcclBootstrap.*:NcclCommunicator.*"
    watchdog_tests=$(test_mpi --gtest_list_tests 2>/dev/null | awk '/^[^ ]/ {s=$1} /^  / {print s $1}' | grep -iE 'nccl.*(watchdog|timeout)|(watchdog|timeout).*nccl' | paste -sd:)
    [ -n "$watchdog_tests" ] && filter="$filter:$watchdog_tests"
    LOCKSTEP_TEST_WATCHDOG_S=80 run_step nccl 90 mpirun -np 1 test_mpi --gtest_filter="$filter" \
      --gtest_output="json:$W/logs/test_mpi_nccl.json"
    record nccl "$(status_of)" "$DUR" "$(why "" nccl) $(gtest_counts "$W/logs/test_mpi_nccl.json")"
    if [ -z "$watchdog_tests" ]; then
      skip nccl-watchdog "test_mpi has no test of the NCCL watchdog firing (no Nccl*Watchdog*/Nccl*Timeout* test)"
    elif ! ((HAVE_GPU)); then
      skip nccl-watchdog "no GPU ($watchdog_tests skip)"
    else
      record nccl-watchdog "$(gtest_status "$W/logs/test_mpi_nccl.json" "$watchdog_tests")" 0 "$watchdog_tests"
    fi
  fi

  # ---- 6. lockstep-train: 200 steps of fashion_mlp and fashion_cnn on one GPU, with figures
  if bundle_only train; then
    local model prec steps=$TRAIN_STEPS device=cuda precs="fp32 bf16" every=20
    if ! ((HAVE_GPU)); then device=cpu steps=40 precs=fp32 every=10; fi
    for model in mlp cnn; do
      for prec in $precs; do
        local name=train-$model-$prec
        memwatch_start
        run_step "$name" 45 lockstep-train --config "configs/fashion_$model.ini" \
          --data.train="$LOCKSTEP_BUNDLE_DATA/train" --data.test="$LOCKSTEP_BUNDLE_DATA/test" \
          --train.device="$device" --train.precision="$prec" --train.max_steps="$steps" \
          --train.eval=false --log.every="$every" --log.progress=none \
          --optim.schedule=constant --optim.warmup_steps=0 --checkpoint.dir= \
          --log.metrics="$W/logs/$name.jsonl"
        memwatch_stop "$name"
        record "$name" "$(status_of)" "$DUR" "$(why "$(train_figures "$name" "$device" "$((steps / 4))")" "$name")"
      done
    done
  fi

  # ---- 7. lockstep-bench gpu-step and the same models in PyTorch
  if bundle_only gpu-step; then
    if ((HAVE_GPU)); then
      run_step gpu-step 60 lockstep-bench gpu-step --cpu-threads="$(nproc)" --out="$W/logs/gpu-step.json"
      record gpu-step "$(status_of)" "$DUR" "$(why "fp32 GPU and CPU" gpu-step)"
      local p
      for p in tf32 bf16; do
        run_step "gpu-step-$p" 30 lockstep-bench gpu-step --precision="$p" --cpu=0 --out="$W/logs/gpu-step-$p.json"
        record "gpu-step-$p" "$(status_of)" "$DUR" "$(why "$p GPU" "gpu-step-$p")"
      done
    else
      # The GPU half on the emulated GPU: the device path, the loss read-back and its comparison
      # with the CPU's (gpu-step fails on a loss that is not finite or differs) run as on a GPU.
      run_step gpu-step 60 lockstep-bench gpu-step --device=emu --reps=3 --warmup=1 --cpu-threads="$(nproc)" --out="$W/logs/gpu-step.json"
      record gpu-step "$(status_of)" "$DUR" "$(why "emulated GPU and CPU (no GPU): losses agree" gpu-step)"
    fi
  fi
  if [ -z "$torch_v" ]; then
    skip torch-step "python3 has no torch"
  elif ! asked torch-step; then
    :
  elif ((HAVE_GPU)); then
    run_step torch-step 60 python3 bench/gpu_torch.py --device=cuda
    cp "$W/logs/torch-step.log" "$W/logs/torch-step.jsonl"
    record torch-step "$(status_of)" "$DUR" "$(why "PyTorch $torch_v: fp32, tf32, bf16" torch-step)"
  else
    run_step torch-step 60 python3 bench/gpu_torch.py --device=cpu --precisions=fp32 --reps=3 --warmup=1
    cp "$W/logs/torch-step.log" "$W/logs/torch-step.jsonl"
    record torch-step "$(status_of)" "$DUR" "$(why "PyTorch $torch_v on the CPU (no GPU)" torch-step)"
  fi

  # ---- 8. DP against DDP on the CPU, up to DP_K replicas/ranks (bundled mpirun): last and alone,
  # after the sanitizers, since it measures how the cores scale
  if bundle_only dp-vs-ddp; then
    local k=$DP_K dsteps=60
    ((HAVE_GPU)) || k=2 dsteps=40
    K=$k R=1 STEPS=$dsteps WARMUP=20 LOG_EVERY=10 LOCKSTEP_BIN_DIR="$LOCKSTEP_BUNDLE/bin" \
      DATA="$LOCKSTEP_BUNDLE_DATA" OUT_DIR="$W/dp-vs-ddp" run_step dp-vs-ddp 150 bash bench/dp-vs-ddp.sh
    record dp-vs-ddp "$(status_of)" "$DUR" "$(why "K=$k, $dsteps steps, R=1; table in summary" dp-vs-ddp)"
  fi

  report
}

# ---- helpers that read results (python3 is on the device and here)
gtest_counts() {  # gtest JSON -> "N passed, N failed, N skipped"
  python3 - "$1" <<'EOF' 2>/dev/null || echo "no gtest JSON"
import json, sys
d = json.load(open(sys.argv[1]))
c = {"passed": 0, "failed": 0, "skipped": 0}
for s in d["testsuites"]:
    for t in s["testsuite"]:
        if t.get("failures"): c["failed"] += 1
        elif t.get("result") == "SKIPPED": c["skipped"] += 1
        else: c["passed"] += 1
print(", ".join(f"{v} {k}" for k, v in c.items()))
EOF
}
gtest_status() {  # gtest JSON, ':'-separated names -> ok / FAIL / SKIP
  python3 - "$1" "$2" <<'EOF' 2>/dev/null || echo FAIL
import json, sys
d = json.load(open(sys.argv[1])); want = set(sys.argv[2].split(":")); got = []
for s in d["testsuites"]:
    for t in s["testsuite"]:
        if s["name"] + "." + t["name"] in want:
            got.append("FAIL" if t.get("failures") else "SKIP" if t.get("result") == "SKIPPED" else "ok")
print("FAIL" if "FAIL" in got or not got else "SKIP" if "SKIP" in got else "ok")
EOF
}
step_figures() {  # gpu-step JSON or gpu_torch.py JSONL -> "N images/s (M ms/step[, loss A -> B])"
  python3 - "$1" <<'PY' 2>/dev/null || echo "no figures"
import json, sys
text = open(sys.argv[1]).read().strip()
try:
    rows = json.loads(text)["results"]
except (json.JSONDecodeError, KeyError):
    rows = [json.loads(l) for l in text.splitlines() if l.startswith("{")]
def loss(r):  # gpu-step's loss of the first and of the last step (null: not finite)
    if "loss_step1" not in r: return ""
    f = lambda v: "non-finite" if v is None else f"{v:.4f}"
    return f", loss {f(r['loss_step1'])} -> {f(r['last_loss'])}"
print("; ".join(f"{r['samples_per_s']:.0f} images/s ({r['median_ms']:.1f} ms/step{loss(r)})" for r in rows))
PY
}
gpt_figures() {  # a GPT benchmark's JSON (lockstep-bench gpt or gpt_torch.py) -> one line
  python3 - "$1" <<'PY' 2>/dev/null || echo "no figures"
import json, sys
d = json.load(open(sys.argv[1]))
peak = d.get("peak_bytes", d.get("peak_memory_bytes"))
out = f"{d['step_ms']:.2f} ms/step, {d['tokens_per_s']:.0f} tokens/s"
if peak: out += f", peak memory {peak / 2**30:.2f} GiB"
if d.get("activation_peak_bytes"): out += f" (activations {d['activation_peak_bytes'] / 2**30:.2f})"
if d.get("compile_s"): out += f", compile {d['compile_s']:.0f} s"
if d.get("attention_kernel"): out += f", attention {d['attention_kernel']}"
print(out)
PY
}
smoke_figures() {  # metrics JSONL -> "loss A -> B, N samples/s"; fails without a finite final loss
  python3 - "$1" <<'PY' 2>&1
import json, math, sys
try:
    recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except Exception as e:
    print(f"its metrics do not read ({e})"); sys.exit(1)
steps = [r for r in recs if "loss" in r and "step" in r]
final = next((r for r in recs if r.get("event") == "final"), None)
if final is None or not steps:
    print(f"no final record or no step records in {sys.argv[1]}"); sys.exit(1)
last = final.get("train_loss")
if not isinstance(last, (int, float)) or not math.isfinite(last):
    print(f"the final loss is {last}"); sys.exit(1)
print(f"loss {steps[0]['loss']:.4f} (step {steps[0]['step']}) -> {last:.4f}, "
      f"{final.get('samples_per_s', 0):.0f} samples/s over the run")
PY
}
memwatch_start() {
  MEMWATCH=""
  ((HAVE_GPU)) || return 0
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$W/logs/mem.tmp" 2>/dev/null &
  MEMWATCH=$!
}
memwatch_stop() {
  [ -n "$MEMWATCH" ] || return 0
  kill "$MEMWATCH" 2>/dev/null; wait "$MEMWATCH" 2>/dev/null
  sort -n "$W/logs/mem.tmp" | tail -1 >"$W/logs/$1.gpu-mem-mib"
  rm -f "$W/logs/mem.tmp"
}
train_figures() {  # name device skip-steps -> "ms/step, samples/s, ..." (and figures.jsonl)
  python3 - "$W/logs/$1.jsonl" "$1" "$2" "$3" "$W/logs/$1.gpu-mem-mib" "$W/figures.jsonl" <<'EOF' 2>/dev/null || echo "no metrics"
import json, os, statistics, sys
path, name, device, skip, mem, figs = sys.argv[1:7]
recs = [json.loads(l) for l in open(path) if l.strip()]
steps = [r for r in recs if "step_time_s" in r and r.get("step", 0) > int(skip)]
final = next((r for r in recs if r.get("event") == "final"), {})
f = {"name": name, "device": device}
if steps:
    f["ms_per_step"] = statistics.median(r["step_time_s"] for r in steps) * 1e3
    f["samples_per_s"] = statistics.median(r["samples_per_s"] for r in steps)
    f["compute_ms"] = statistics.median(r.get("compute_s", 0) for r in steps) * 1e3
for r in [final] + steps[-1:]:
    for k, v in r.items():
        if any(w in k for w in ("gpu", "sync", "host_reads", "malloc", "pageable", "device_mem", "cuda")):
            f[k] = v
if os.path.exists(mem) and open(mem).read().strip():
    f["nvidia_smi_peak_mib"] = int(float(open(mem).read().split()[0]))
f["final_loss"] = final.get("train_loss")
open(figs, "a").write(json.dumps(f) + "\n")
parts = [f"{f['ms_per_step']:.2f} ms/step, {f['samples_per_s']:.0f} samples/s (median after step {skip})"] if steps else ["no step records"]
parts += [f"{k} {v}" for k, v in f.items() if k not in ("name", "device", "ms_per_step", "samples_per_s", "compute_ms", "final_loss")]
print("; ".join(parts))
EOF
}

report() {
  echo "== [${SECONDS}s] report"
  [ -d "$W/dp-vs-ddp" ] && cp "$W/dp-vs-ddp/table.md" "$W/logs/dp-vs-ddp-table.md" 2>/dev/null
  python3 - "$W" "$OUT" "$DRY" "${GPU_LINE:-none}" "$SECONDS" <<'EOF'
import glob, json, os, sys
w, out, dry, gpu, secs = sys.argv[1:6]
steps = []
for line in open(os.path.join(w, "steps.tsv")):
    name, status, s, detail = (line.rstrip("\n").split("\t") + [""] * 4)[:4]
    steps.append({"step": name, "status": status, "seconds": int(s or 0), "detail": detail.strip()})
def load(p):
    try: return json.load(open(p))
    except Exception: return None
def jsonl(p):
    try: return [json.loads(l) for l in open(p) if l.strip().startswith("{")]
    except Exception: return []
def skip_reasons(log):  # gtest prints a skip's message only in its text output
    why, cur, take = {}, None, False
    try: lines = open(log, errors="replace").read().splitlines()
    except Exception: return why
    for l in lines:
        if l.startswith("[ RUN      ] "): cur, take = l.split()[-1], False
        elif l.endswith(": Skipped"): take = True
        elif take and cur:
            why[cur] = why.get(cur, "") + ((" " if cur in why else "") + l.strip())
            take = False
    return why
LOG_OF = {"test_cuda": "test_cuda.log", "test_mpi_nccl": "nccl.log", "test_cuda_attention": "attention.log"}
tests = {}
for p in glob.glob(os.path.join(w, "logs", "test_*.json")):
    d = load(p)
    if not d: continue
    reasons = skip_reasons(os.path.join(w, "logs", LOG_OF.get(os.path.basename(p)[:-5], "")))
    rows = []
    for s in d["testsuites"]:
        for t in s["testsuite"]:
            r = "FAIL" if t.get("failures") else "SKIP" if t.get("result") == "SKIPPED" else "ok"
            e = {"name": s["name"] + "." + t["name"], "result": r, "ms": t.get("time")}
            if r == "SKIP": e["why"] = reasons.get(e["name"], "")[:300]
            if r == "FAIL": e["failures"] = [f.get("failure", "")[:400] for f in t["failures"]]
            rows.append(e)
    tests[os.path.basename(p)[:-5]] = rows
bench = {"train": jsonl(os.path.join(w, "figures.jsonl")), "lockstep_gpu_step": [],
         "torch_step": jsonl(os.path.join(w, "logs", "torch-step.jsonl")) +
                       jsonl(os.path.join(w, "logs", "torch-resnet.jsonl")), "gpt": {}}
for p in sorted(glob.glob(os.path.join(w, "logs", "gpu-step*.json"))) + [os.path.join(w, "logs", f) for f in ("resnet.json", "resnet-nchw.json")]:
    d = load(p)
    if d: bench["lockstep_gpu_step"] += [dict(r, precision=d.get("precision")) for r in d["results"]]
for p in sorted(glob.glob(os.path.join(w, "logs", "*gpt-*.json"))):
    d = load(p) or (jsonl(p) or [None])[0]
    if d: bench["gpt"][os.path.basename(p)[:-5]] = {k: d.get(k) for k in ("step_ms", "tokens_per_s", "gflops", "train_gflop_per_step", "precision_info", "attention_kernel", "attention_detail", "peak_bytes", "activation_peak_bytes", "peak_memory_bytes", "compile_s", "torch", "config") if k in d}
bench["peak"] = load(os.path.join(w, "logs", "peak.json"))
dp = load(os.path.join(w, "dp-vs-ddp", "summary.json"))
import datetime
doc = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "dry_run": dry == "1",
       "gpu": gpu, "seconds": int(secs), "steps": steps, "tests": tests, "bench": bench, "dp_vs_ddp": dp}
json.dump(doc, open(os.path.join(out, "gpu-check.json"), "w"), indent=1)

L = []
L.append(f"lockstep gpu-check {doc['date']}  gpu: {gpu}  dry run: {dry == '1'}  {secs}s")
bad = [s for s in steps if s["status"] not in ("ok", "SKIP")]
L.append(f"steps: {sum(s['status'] == 'ok' for s in steps)} ok, {len(bad)} failed/timed out, {sum(s['status'] == 'SKIP' for s in steps)} skipped")
for name, rows in tests.items():
    fails = [r["name"] for r in rows if r["result"] == "FAIL"]
    skips = [r["name"] for r in rows if r["result"] == "SKIP"]
    L.append(f"{name}: {sum(r['result'] == 'ok' for r in rows)} passed, {len(fails)} failed, {len(skips)} skipped")
    if fails: L.append("  failed: " + " ".join(fails))
    by_why = {}
    for r in rows:
        if r["result"] == "SKIP": by_why.setdefault(r.get("why") or "(no message)", []).append(r["name"])
    for why, names in by_why.items():
        L.append(f"  skipped ({len(names)}), {why[:160]}: " + " ".join(names[:12]) + (" ..." if len(names) > 12 else ""))
tbl = os.path.join(w, "logs", "dp-vs-ddp-table.md")
if os.path.exists(tbl):
    L.append("")
    L.append("dp-vs-ddp (CPU):")
    for l in open(tbl):  # the throughput table; the time split and memory are in logs.tar.gz
        if l.startswith("Time split"): break
        L.append("  " + l.rstrip())
L.append("")
L.append(f"{'step':22} {'status':8} {'s':>4}  detail")
for s in steps:
    L.append(f"{s['step']:22} {s['status']:8} {s['seconds']:4d}  {s['detail'][:150]}")
L.append("")
L.append(f"{'what':34} {'precision':9} {'batch':>6} {'ms/step':>9} {'samples/s':>11}  note")
for f in bench["train"]:
    if "ms_per_step" in f:
        model, prec = f["name"].split("-")[1:3]
        note = [f"GPU peak {f['nvidia_smi_peak_mib']} MiB"] if f.get("nvidia_smi_peak_mib") else []
        note += [f"{k} {v}" for k, v in f.items() if "sync" in k or "host_reads" in k or "malloc" in k or "pageable" in k or "gpu_mem" in k]
        L.append(f"{'lockstep-train ' + model + ' (' + f['device'] + ')':34} {prec:9} {'':>6} {f['ms_per_step']:9.3f} {f['samples_per_s']:11.0f}  {'; '.join(note)}")
# One training step of gpu-step's models, lockstep and PyTorch side by side.
side = []
for r in bench["lockstep_gpu_step"]:
    prec = "cpu" if r["device"].startswith("cpu") else r["precision"]
    layout = " nchw" if r.get("channels_last") is False and r["model"].startswith("resnet") else ""
    loss = f"; loss {r['loss_step1']:.4f} -> {r['last_loss']:.4f}" if r.get("loss_step1") is not None and r.get("last_loss") is not None else ""
    side.append((r["model"], prec, 0, f"{'lockstep gpu-step ' + r['model'].split('-')[0] + layout:34} {prec:9} {r['batch']:6d} {r['median_ms']:9.3f} {r['samples_per_s']:11.0f}  {r['device']}{loss}"))
for r in bench["torch_step"]:
    side.append((r["model"], r["precision"], 1, f"{'torch ' + r['torch'].split('+')[0] + ' step ' + r['model'].split('-')[0]:34} {r['precision']:9} {r['batch']:6d} {r['median_ms']:9.3f} {r['samples_per_s']:11.0f}  {r['device']}"))
L += [x[3] for x in sorted(side)]
# ResNet-50 bf16 (issue 27's GPU target: at least 1.0x PyTorch's AMP in channels_last).
ours = [r for r in bench["lockstep_gpu_step"] if r["model"].startswith("resnet50") and "cuda" in r["device"]]
nchw = [r for r in ours if r.get("channels_last") is False]
ours = [r for r in ours if r.get("channels_last") is not False]
if ours and nchw:
    L.append(f"ResNet-50 bf16 b{ours[0]['batch']}: lockstep channels-last {ours[0]['samples_per_s']:.0f} images/s, "
             f"NCHW {nchw[0]['samples_per_s']:.0f}: {ours[0]['samples_per_s'] / nchw[0]['samples_per_s']:.2f}x")
theirs = [r for r in bench["torch_step"] if r["model"].startswith("resnet50")]
if ours and theirs:
    L.append(f"ResNet-50 bf16 b{ours[0]['batch']}: lockstep {ours[0]['samples_per_s']:.0f} images/s, PyTorch "
             f"{theirs[0]['samples_per_s']:.0f} (channels_last={theirs[0].get('channels_last')}): "
             f"{ours[0]['samples_per_s'] / theirs[0]['samples_per_s']:.2f}x")
# GPT-2: tokens/s, MFU against the bf16 product PyTorch reached here (the same FLOP count for
# both: lockstep's, 3 x the forward's multiply-adds with attention over the causal prefix), peak
# memory, and lockstep against PyTorch at the same precision and batch.
pk = (bench.get("peak") or {}).get("bf16_matmul_tflops")
if bench.get("peak"):
    L.append("")
    L.append(f"GPU ceilings (PyTorch): bf16 product {pk:.0f} TFLOP/s, copy {bench['peak']['copy_tb_per_s']:.2f} TB/s")
per_token = {}
for k, g in bench["gpt"].items():
    c = g.get("config", {})
    if g.get("train_gflop_per_step") and c.get("batch") and c.get("seq"):
        per_token[(c.get("model"), c["seq"])] = g["train_gflop_per_step"] * 1e9 / (c["batch"] * c["seq"])
def prec(g):
    c = g.get("config", {})
    return c.get("precision") or c.get("dtype") or ""
if bench["gpt"]:
    L.append("")
    L.append(f"{'GPT run':34} {'precision':9} {'batch':>6} {'ms/step':>9} {'tokens/s':>11} {'MFU':>6} {'peak GiB':>9}  vs PyTorch eager / compiled")
for k, g in bench["gpt"].items():
    c = g.get("config", {})
    ft = per_token.get((c.get("model"), c.get("seq")))
    mfu = f"{g['tokens_per_s'] * ft / (pk * 1e12):6.1%}" if ft and pk and g.get("tokens_per_s") else f"{'':>6}"
    peak = g.get("peak_bytes") or g.get("peak_memory_bytes")
    note = ""
    if not k.startswith("torch"):
        for mode in ("eager", "compile"):
            t = next((t for n, t in bench["gpt"].items() if n.startswith("torch-gpt-" + mode)
                      and prec(t) == prec(g) and t.get("config", {}).get("batch") == c.get("batch")), None)
            note += (" / " if note else "") + (f"{g['tokens_per_s'] / t['tokens_per_s']:.2f}x" if t and t.get("tokens_per_s") else "-")
        if c.get("recompute") and c.get("recompute") != "none": note += f" (recompute {c['recompute']})"
        if g.get("attention_kernel"): note += f" [attention {g['attention_kernel']}]"
    else:
        note = "torch " + str(g.get("torch", "")) + (f", compile {g['compile_s']:.0f} s" if g.get("compile_s") else "")
    L.append(f"{k:34} {prec(g):9} {str(c.get('batch', '')):>6} {g.get('step_ms', 0):9.2f} {g.get('tokens_per_s', 0):11.0f} {mfu} {(peak or 0) / 2**30:9.2f}  {note}")
# cuDNN's fused attention against lockstep's own kernels: the same bf16 run at batch 8 with
# train.attention = auto (which records the kernel it ran) and = reference; the difference of the
# step times is the attention kernels' difference, all else being equal.
a, r = bench["gpt"].get("gpt-bf16-b8"), bench["gpt"].get("gpt-bf16-b8-reference")
if a and r and a.get("step_ms") and r.get("step_ms"):
    L.append("")
    L.append(f"attention, bf16 batch 8: {a.get('attention_kernel', '?')} {a['step_ms']:.2f} ms/step, "
             f"reference {r['step_ms']:.2f}: the step {r['step_ms'] / a['step_ms']:.2f}x faster, "
             f"{r['step_ms'] - a['step_ms']:.2f} ms saved")
    if a.get("attention_detail"): L.append("  " + a["attention_detail"][:200])
text = "\n".join(L) + "\n"
open(os.path.join(out, "summary.txt"), "w").write(text)
print("\n================================ lockstep gpu-check summary ================================")
print(text)
EOF
  local parts=(logs)
  [ -d "$W/dp-vs-ddp" ] && parts+=(dp-vs-ddp)
  tar -C "$W" -czf "$OUT/logs.tar.gz" "${parts[@]}" 2>/dev/null
  echo "results: $OUT (summary.txt, gpu-check.json, console.log, logs.tar.gz)"
}

main 2>&1 | tee "$OUT/console.log"
failed=$(awk -F'\t' '$2 != "ok" && $2 != "SKIP"' "$W/steps.tsv" 2>/dev/null | wc -l)
rm -rf "$W"
[ "$failed" -eq 0 ]
