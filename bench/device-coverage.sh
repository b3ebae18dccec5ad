#!/usr/bin/env bash
# How much of the code that runs only for a non-CPU device does the test suite execute? Issue 25
# asked for the share of the lines of src/train, src/parallel and src/comm that run only for a device
# and that .ci/run executes (0% before the emulated GPU existed).
#
# A coverage build (gcc --coverage, build-cov/) runs the whole ctest suite twice:
#   A: with LOCKSTEP_EMU_DEVICES=0: no emulated device, as every CI run before it (device tests
#      skip), so A's lines are the ones the suite reaches on the CPU;
#   B: as .ci/run runs it (the emulated GPU on).
# Device-only lines that run: executed in B, not in A. Device-only lines that do not run: the
# executable lines B leaves unexecuted inside functions that only B entered (device-only
# functions), and every unexecuted line of src/comm/cuda (the NCCL home, which needs NCCL and a
# GPU). Share = run / (run + not run). A device-only branch inside a function the CPU also
# enters, and missed by B too, is not counted: the figure is an upper estimate in that respect.
# Usage: bench/device-coverage.sh [BUILD_DIR=build-cov]   (prints the table; writes
#   BUILD_DIR/device-coverage.json). Takes ~30 minutes on 2 cores.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(realpath -m "${1:-$ROOT/build-cov}")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS="--coverage -O0" \
    -DCMAKE_EXE_LINKER_FLAGS=--coverage >/dev/null
fi
cmake --build "$BUILD" -j "$(nproc)" >/dev/null

# collect NAME: runs gcov over the train, parallel and comm objects into $BUILD/coverage-NAME.json.
collect() {
  python3 "$ROOT/bench/device_coverage.py" collect "$BUILD" "$ROOT" "$BUILD/coverage-$1.json"
}
run_suite() {
  find "$BUILD" -name '*.gcda' -delete
  (cd "$BUILD" && ctest -j 2 --timeout 1200 >"$BUILD/coverage-$1.log" 2>&1) ||
    echo "device-coverage: some tests failed in run $1 (see $BUILD/coverage-$1.log)" >&2
  collect "$1"
}
LOCKSTEP_EMU_DEVICES=0 run_suite A
run_suite B
python3 "$ROOT/bench/device_coverage.py" report "$BUILD/coverage-A.json" "$BUILD/coverage-B.json" \
  "$BUILD/device-coverage.json"
