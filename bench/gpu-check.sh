#!/usr/bin/env bash
# The one prepared GPU check of lockstep, for a single run on a lent GPU machine (one H200, 16
# cores, CUDA 13 and PyTorch in python3, cuDNN and NCCL as pip wheels; no Open MPI, HDF5, Boost,
# OpenBLAS, oneDNN or GoogleTest, no network). Nothing is built there: it unpacks the bundle that
# bench/gpu-bundle.sh made here (programs, their libraries, Open MPI, data) and, in under 8
# minutes, each step under its own timeout so one hang cannot eat the run:
#   GPU, driver and clocks; every CUDA test (test_cuda: pass/fail/skip by name); compute-sanitizer
#   memcheck over the CUDA tests and racecheck over the reductions; a 1-rank NCCL smoke (test_mpi
#   under mpirun); lockstep-train, 200 steps of fashion_mlp and fashion_cnn on the GPU (fp32 and
#   bf16); lockstep-bench gpu-step (fp32, tf32, bf16) beside the same models in PyTorch
#   (bench/gpu_torch.py); GPT-2 124M in lockstep-bench gpt and bench/gpt_torch.py; and
#   bench/dp-vs-ddp.sh on the CPU with up to 8 replicas/ranks. A step whose tool or GPU is
#   missing is skipped with its reason; the others still run. A short table is printed last.
#
# On the device (repository root, gpu-bundle/ carried):   bash bench/gpu-check.sh
#   run(command="bash bench/gpu-check.sh", carry=["gpu-bundle"], timeout_s=560)
# Here, without a GPU (every step that can runs on the CPU, GPU steps skip visibly):
#   GPU_CHECK_DRY_RUN=1 OUT=/tmp/gc bash bench/gpu-check.sh
# Results in $OUT (default results/gpu-check/<time>): summary.txt, gpu-check.json, console.log,
# logs.tar.gz (every step's log, gtest JSON, metrics, dp-vs-ddp results): 4 files.
# Settings: GPU_BUNDLE (gpu-bundle/lockstep-gpu.tar.xz), BUDGET_S (480: the whole check),
#   TRAIN_STEPS (200), DP_K (8), GPU_CHECK_DRY_RUN (0).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-$ROOT/results/gpu-check/$(date +%Y-%m-%d_%H%M%S)}
DRY=${GPU_CHECK_DRY_RUN:-0}
BUDGET_S=${BUDGET_S:-480}
BUNDLE=${GPU_BUNDLE:-$ROOT/gpu-bundle/lockstep-gpu.tar.xz}
TRAIN_STEPS=${TRAIN_STEPS:-200}
DP_K=${DP_K:-8}
RESERVE=15  # seconds kept for the summary
export PYTHONUNBUFFERED=1 GTEST_COLOR=no
mkdir -p "$OUT"
W=$(mktemp -d /tmp/gpu-check.XXXXXX)
mkdir -p "$W/logs"

elapsed() { echo "$SECONDS"; }
record() {  # name status seconds detail
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\n'/ }" >>"$W/steps.tsv"
  printf '== [%3ss] %-22s %-8s %s\n' "$(elapsed)" "$1" "$2" "$4"
}
skip() { record "$1" SKIP 0 "$2"; }
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
    *) echo "rc $RC: $(grep -v '^\s*$' "$W/logs/$2.log" 2>/dev/null | grep -iE 'error|fail|cannot|what' | head -2 | cut -c1-200 | paste -sd' ')" ;;
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

  # ---- the bundle
  HAVE_BUNDLE=0
  if [ ! -f "$BUNDLE" ]; then
    skip bundle "$BUNDLE not found: make it with bench/gpu-bundle.sh and carry gpu-bundle/"
  elif run_step bundle 90 bash -c 'unpack "$1" "$2"' _ "$BUNDLE" "$W" && [ -f "$W/lockstep-gpu/env.sh" ]; then
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
    record bundle FAIL "$DUR" "$(why "" bundle)"
  fi
  bundle_only() {
    ((HAVE_BUNDLE)) && return 0
    skip "$1" "no bundle"
    return 1
  }

  # ---- the device's cuBLAS(Lt), cuDNN and NCCL (lockstep opens them lazily), and libcuda
  local dirs=() so d sp
  local sites
  # python3's path: its site-packages, a venv's, PYTHONPATH (wheels carried to /tmp/site).
  sites=$(python3 -c 'import sys; print("\n".join(p for p in sys.path if p))' 2>/dev/null)
  for so in libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
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

  # ---- every CUDA test, by name
  if bundle_only test_cuda; then
    run_step test_cuda 120 test_cuda --gtest_output="json:$W/logs/test_cuda.json"
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

  # ---- DP against DDP on the CPU, up to DP_K replicas/ranks (bundled mpirun). With a GPU it
  # runs beside the sanitizer steps (they need one or two of the 16 cores and time nothing).
  local sanitizer dp_bg=""
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
  dp_vs_ddp() {
    local k=$DP_K steps=60
    ((HAVE_GPU)) || k=2 steps=40
    K=$k R=1 STEPS=$steps WARMUP=20 LOG_EVERY=10 LOCKSTEP_BIN_DIR="$LOCKSTEP_BUNDLE/bin" \
      DATA="$LOCKSTEP_BUNDLE_DATA" OUT_DIR="$W/dp-vs-ddp" run_step dp-vs-ddp 200 bash bench/dp-vs-ddp.sh
    echo "$RC $DUR K=$k, $steps steps, R=1${1:+, $1}" >"$W/dp-vs-ddp.rc"
  }
  dp_record() {
    read -r RC DUR note <"$W/dp-vs-ddp.rc" 2>/dev/null || { RC=1 DUR=0 note="no result"; }
    record dp-vs-ddp "$(status_of)" "$DUR" "$(why "$note; table in summary" dp-vs-ddp)"
  }
  if ((HAVE_BUNDLE && HAVE_GPU)) && [ -n "$sanitizer" ]; then
    dp_vs_ddp "beside the sanitizer runs" &
    dp_bg=$!
  fi

  # ---- compute-sanitizer: memcheck over the CUDA tests, racecheck over the reductions
  if ! ((HAVE_BUNDLE)); then
    skip memcheck "no bundle"; skip racecheck "no bundle"
  elif ! ((HAVE_GPU)); then
    skip memcheck "no GPU"; skip racecheck "no GPU"
  elif [ -z "$sanitizer" ]; then
    skip memcheck "compute-sanitizer not found"; skip racecheck "compute-sanitizer not found"
  else
    local tool filter limit
    for tool in memcheck racecheck; do
      if [ $tool = memcheck ]; then filter=${MEMCHECK_FILTER:-*} limit=100
      else filter=${RACECHECK_FILTER:-*Reduc*:*Softmax*:*Norm*:*Loss*:*SumOfSquares*} limit=60; fi
      run_step $tool $limit "$sanitizer" --tool $tool --error-exitcode 86 --print-limit 30 \
        --target-processes all "$LOCKSTEP_BUNDLE/bin/test_cuda" --gtest_filter="$filter"
      local log=$W/logs/$tool.log
      record $tool "$(status_of)" "$DUR" "$(why "" $tool) filter $filter: $(grep -cE '^\[ +OK \]' "$log") tests ok, $(grep -cE '^\[ +FAILED +\] [A-Z]' "$log") failed, $(grep -cE '^\[ +SKIPPED +\] [A-Z]' "$log") skipped; $(grep -oE '(ERROR|RACECHECK) SUMMARY: .*' "$log" | tail -1)$([ "$RC" = 124 ] && echo "; stopped in $(grep -E '^\[ RUN +\]' "$log" | tail -1 | awk '{print $NF}')")"
    done
  fi
  if [ -n "$dp_bg" ]; then
    wait "$dp_bg"
    dp_record
  fi

  # ---- NCCL on one rank: the communicator's collectives, and its watchdog where a test has one
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

  # ---- lockstep-train: 200 steps of fashion_mlp and fashion_cnn on one GPU
  if bundle_only train; then
    local model prec steps=$TRAIN_STEPS device=cuda precs="fp32 bf16" every=20
    if ! ((HAVE_GPU)); then device=cpu steps=40 precs=fp32 every=10; fi
    for model in mlp cnn; do
      for prec in $precs; do
        local name=train-$model-$prec
        memwatch_start
        run_step "$name" 120 lockstep-train --config "configs/fashion_$model.ini" \
          --data.train="$LOCKSTEP_BUNDLE_DATA/train" --data.test="$LOCKSTEP_BUNDLE_DATA/test" \
          --train.device="$device" --train.precision="$prec" --train.max_steps="$steps" \
          --train.eval=false --log.every="$every" --log.progress=none \
          --optim.schedule=constant --optim.warmup_steps=0 \
          --log.metrics="$W/logs/$name.jsonl"
        memwatch_stop "$name"
        record "$name" "$(status_of)" "$DUR" "$(why "$(train_figures "$name" "$device" "$((steps / 4))")" "$name")"
      done
    done
  fi

  # ---- lockstep-bench gpu-step and the same models in PyTorch
  if bundle_only gpu-step; then
    if ((HAVE_GPU)); then
      run_step gpu-step 120 lockstep-bench gpu-step --cpu-threads="$(nproc)" --out="$W/logs/gpu-step.json"
      record gpu-step "$(status_of)" "$DUR" "$(why "fp32 GPU and CPU" gpu-step)"
      local p
      for p in tf32 bf16; do
        run_step "gpu-step-$p" 60 lockstep-bench gpu-step --precision="$p" --cpu=0 --out="$W/logs/gpu-step-$p.json"
        record "gpu-step-$p" "$(status_of)" "$DUR" "$(why "$p GPU" "gpu-step-$p")"
      done
    else
      run_step gpu-step 120 lockstep-bench gpu-step --gpu=0 --reps=3 --warmup=1 --cpu-threads="$(nproc)" --out="$W/logs/gpu-step.json"
      record gpu-step "$(status_of)" "$DUR" "$(why "CPU half only (no GPU)" gpu-step)"
    fi
  fi
  local torch_v
  torch_v=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)
  if [ -z "$torch_v" ]; then
    skip torch-step "python3 has no torch"
  elif ((HAVE_GPU)); then
    run_step torch-step 120 python3 bench/gpu_torch.py --device=cuda
    cp "$W/logs/torch-step.log" "$W/logs/torch-step.jsonl"
    record torch-step "$(status_of)" "$DUR" "$(why "PyTorch $torch_v: fp32, tf32, bf16" torch-step)"
  else
    run_step torch-step 120 python3 bench/gpu_torch.py --device=cpu --precisions=fp32 --reps=3 --warmup=1
    cp "$W/logs/torch-step.log" "$W/logs/torch-step.jsonl"
    record torch-step "$(status_of)" "$DUR" "$(why "PyTorch $torch_v on the CPU (no GPU)" torch-step)"
  fi

  # ---- GPT-2 124M, batch 8 x 1024, in lockstep and PyTorch
  if bundle_only gpt; then
    local gpt_precs="" p
    [[ $(lockstep-bench --help 2>&1 | grep -A1 '^  gpt ') == *--precision* ]] && gpt_precs="fp32 bf16"
    if ((HAVE_GPU)); then
      for p in ${gpt_precs:-fp32}; do
        run_step "gpt-$p" 90 lockstep-bench gpt --model=gpt2-124m --device=cuda:0 --batch=8 --seq=1024 \
          --vocab=50257 --steps=3 --reps=3 ${gpt_precs:+--precision=$p} --out="$W/logs/gpt-$p.json"
        record "gpt-$p" "$(status_of)" "$DUR" "$(why "lockstep gpt2-124m ${gpt_precs:+$p}${gpt_precs:-(no --precision flag: default precision)}" "gpt-$p")"
      done
    else
      run_step gpt-fp32 60 lockstep-bench gpt --model=gpt-mini --device=cpu --batch=2 --seq=64 \
        --vocab=256 --threads="$(nproc)" --steps=1 --reps=3 --out="$W/logs/gpt-fp32.json"
      record gpt-fp32 "$(status_of)" "$DUR" "$(why "lockstep gpt-mini on the CPU (no GPU)" gpt-fp32)"
    fi
  fi
  if [ -z "$torch_v" ]; then
    skip torch-gpt "python3 has no torch"
  elif gpu_only torch-gpt; then
    for p in bf16 fp32; do
      run_step "torch-gpt-$p" 90 python3 bench/gpt_torch.py --model=gpt2-124m --batch=8 --seq=1024 \
        --device=cuda --dtype="$p" --steps=3 --reps=3
      grep '^{' "$W/logs/torch-gpt-$p.log" >"$W/logs/torch-gpt-$p.json" 2>/dev/null
      record "torch-gpt-$p" "$(status_of)" "$DUR" "$(why "PyTorch $torch_v gpt2-124m $p" "torch-gpt-$p")"
    done
  fi

  # ---- DP against DDP, here when it did not run beside the sanitizer
  if [ -z "$dp_bg" ] && bundle_only dp-vs-ddp; then
    dp_vs_ddp
    dp_record
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
LOG_OF = {"test_cuda": "test_cuda.log", "test_mpi_nccl": "nccl.log"}
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
         "torch_step": jsonl(os.path.join(w, "logs", "torch-step.jsonl")), "gpt": {}}
for p in sorted(glob.glob(os.path.join(w, "logs", "gpu-step*.json"))):
    d = load(p)
    if d: bench["lockstep_gpu_step"] += [dict(r, precision=d.get("precision")) for r in d["results"]]
for p in sorted(glob.glob(os.path.join(w, "logs", "*gpt-*.json"))):
    d = load(p) or (jsonl(p) or [None])[0]
    if d: bench["gpt"][os.path.basename(p)[:-5]] = {k: d.get(k) for k in ("step_ms", "tokens_per_s", "gflops", "precision_info", "peak_memory_bytes", "config") if k in d}
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
    prec = r["precision"] if "cuda" in r["device"] else "cpu"
    side.append((r["model"], prec, 0, f"{'lockstep gpu-step ' + r['model'].split('-')[0]:34} {prec:9} {r['batch']:6d} {r['median_ms']:9.3f} {r['samples_per_s']:11.0f}  {r['device']}"))
for r in bench["torch_step"]:
    side.append((r["model"], r["precision"], 1, f"{'torch ' + r['torch'].split('+')[0] + ' step ' + r['model'].split('-')[0]:34} {r['precision']:9} {r['batch']:6d} {r['median_ms']:9.3f} {r['samples_per_s']:11.0f}  {r['device']}"))
L += [x[3] for x in sorted(side)]
for k, g in bench["gpt"].items():
    c = g.get("config", {})
    L.append(f"{k + ' ' + str(c.get('model', '')):34} {k.split('-')[-1]:9} {str(c.get('batch', '')):>6} {g.get('step_ms', 0):9.2f} {g.get('tokens_per_s', 0):11.0f}  tokens/s; {g.get('precision_info', '')}")
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
