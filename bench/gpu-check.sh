#!/usr/bin/env bash
# One prepared GPU check for lockstep, for a single run on a GPU machine (written for an H200
# with the CUDA 13 toolkit incl. cuDNN and NCCL, CMake and ninja, no network and no MPI, HDF5 or
# Boost dev packages). It finishes in under 8 minutes:
#   1. configures a GPU-check-only build (-DLOCKSTEP_GPU_CHECK_ONLY=ON: core + ops with the CPU
#      and CUDA backends, tests/*/cuda, lockstep-bench gpu-step; no MPI/HDF5/Boost, no NCCL comm),
#   2. builds test_cuda and lockstep-bench,
#   3. runs test_cuda (every CUDA op against the CPU backend, a training sequence, allocator and
#      pinned-buffer checks),
#   4. times one training step of an MLP 784-1024-1024-10 (batch 256) and a small CNN (batch 128)
#      on the GPU, f32 and TF32, and on the CPU in the same run,
#   5. prints a short table last.
# The CPU reference still needs OpenBLAS (cblas.h) and oneDNN; GoogleTest may come from a source
# tree instead of libgtest-dev: pass it as GTEST_SRC=<dir> (a copy of Debian's /usr/src/googletest,
# 4 MB; e.g. carried into the repository as the ignored folder gpu-deps/googletest).
#
# Usage (repository root):  bench/gpu-check.sh [build-dir]       (default build-gpu-check)
# Logs and JSON go to $OUT when set (the device tool's return folder), else to <build-dir>/check.
# On a lent GPU machine: run `bash bench/gpu-check.sh /tmp/gpu-check` with timeout_s 560, so the
# build directory is not carried; add GTEST_SRC=... only if the first run says GoogleTest is missing.
set -uo pipefail

BUILD=${1:-build-gpu-check}
RESULTS=${OUT:-$BUILD/check}
mkdir -p "$RESULTS"
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 ))s"; }
say() { echo "== gpu-check [$(elapsed)] $*"; }
status_build=skipped status_tests=skipped status_bench=skipped tests_line="" bench_table=""

summary() {
  echo
  echo "================================ lockstep gpu-check summary ================================"
  echo "gpu:    ${GPU_NAME:-none}"
  echo "build:  $status_build      tests: $status_tests ${tests_line}      bench: $status_bench"
  [ -n "$bench_table" ] && echo "$bench_table"
  echo "total:  $(elapsed); logs and JSON in $RESULTS"
}
trap summary EXIT

# ---- prerequisites: say everything that is missing at once
missing=()
command -v nvidia-smi >/dev/null || missing+=("nvidia-smi (no GPU driver)")
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja)
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || missing+=("nvcc at $NVCC (set NVCC=)")
[ -f /usr/local/cuda/include/cudnn.h ] || missing+=("cuDNN headers (cudnn.h)")
[ -f /usr/local/cuda/include/nccl.h ] || missing+=("NCCL headers (nccl.h)")
any_exists() { for f in "$@"; do [ -e "$f" ] && return 0; done; return 1; }
any_exists /usr/include/cblas.h /usr/include/*/cblas.h /usr/include/*/openblas*/cblas.h ||
  missing+=("OpenBLAS dev (cblas.h) for the CPU reference")
any_exists /usr/include/oneapi/dnnl/dnnl.hpp /usr/local/include/oneapi/dnnl/dnnl.hpp ||
  missing+=("oneDNN dev (dnnl.hpp) for the CPU reference")
GTEST_ARGS=()
if [ -n "${GTEST_SRC:-}" ]; then
  GTEST_ARGS=(-DLOCKSTEP_GTEST_SOURCE_DIR="$(realpath "$GTEST_SRC")")
elif ! any_exists /usr/lib/*/cmake/GTest /usr/lib/cmake/GTest /usr/local/lib/cmake/GTest; then
  for dir in gpu-deps/googletest /usr/src/googletest; do
    [ -f "$dir/CMakeLists.txt" ] && GTEST_ARGS=(-DLOCKSTEP_GTEST_SOURCE_DIR="$(realpath "$dir")") && break
  done
  [ ${#GTEST_ARGS[@]} -eq 0 ] && missing+=("GoogleTest (libgtest-dev, or GTEST_SRC=<googletest source>)")
fi
if [ ${#missing[@]} -gt 0 ]; then
  printf 'gpu-check: missing prerequisites:\n'; printf '  - %s\n' "${missing[@]}"
  exit 2
fi
GPU_NAME=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
nvidia-smi -L | tee "$RESULTS/nvidia-smi.txt"
JOBS=$(nproc)

# ---- configure + build (sm_90 only: one architecture halves nvcc time)
say "configure ($BUILD)"
if ! timeout 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLOCKSTEP_GPU_CHECK_ONLY=ON -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES=90 \
    "${GTEST_ARGS[@]}" >"$RESULTS/configure.log" 2>&1; then
  status_build="FAILED (configure; see configure.log)"; tail -30 "$RESULTS/configure.log"; exit 1
fi
say "build with $JOBS jobs"
if ! timeout 300 ninja -C "$BUILD" -j"$JOBS" test_cuda lockstep-bench >"$RESULTS/build.log" 2>&1; then
  status_build="FAILED (see build.log)"; grep -E "error|FAILED" "$RESULTS/build.log" | head -30; exit 1
fi
status_build=ok
TEST_BIN=$(find "$BUILD" -name test_cuda -type f -perm -u+x | head -1)
BENCH_BIN=$(find "$BUILD" -name lockstep-bench -type f -perm -u+x | head -1)

# ---- tests: every op vs the CPU backend, on the GPU
say "test_cuda"
timeout 150 "$TEST_BIN" --gtest_output="json:$RESULTS/test_cuda.json" >"$RESULTS/test_cuda.log" 2>&1
rc=$?
tests_line=$(grep -E "^\[  (PASSED|FAILED|SKIPPED) +\]" "$RESULTS/test_cuda.log" | grep -v "\]  *[A-Z][A-Za-z]*\." | tr -s ' ' | paste -sd' ')
# Skips that need two GPUs are expected on a one-GPU machine; "no GPU answers" is not.
if [ $rc -eq 0 ] && ! grep -q "no GPU answers" "$RESULTS/test_cuda.log"; then
  status_tests=ok
elif [ $rc -eq 0 ]; then
  status_tests="NOT RUN: test_cuda saw no GPU"
else
  status_tests="FAILED (rc $rc)"
  grep -E "^\[  FAILED  \]|Failure|error" "$RESULTS/test_cuda.log" | head -40
fi

# ---- timing: one training step, GPU (f32, then TF32) and CPU in the same process
say "lockstep-bench gpu-step"
if timeout 120 "$BENCH_BIN" gpu-step --out="$RESULTS/gpu-step.json" 2>"$RESULTS/gpu-step.txt" &&
   timeout 60 "$BENCH_BIN" gpu-step --tf32=1 --cpu=0 --out="$RESULTS/gpu-step-tf32.json" \
     2>"$RESULTS/gpu-step-tf32.txt"; then
  status_bench=ok
else
  status_bench="FAILED (see gpu-step*.txt)"
fi
bench_table=$(cat "$RESULTS/gpu-step.txt" 2>/dev/null; grep cuda "$RESULTS/gpu-step-tf32.txt" 2>/dev/null)
[ "$status_tests" = ok ] && [ "$status_bench" = ok ]
