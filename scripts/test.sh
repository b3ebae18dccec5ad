#!/usr/bin/env bash
# The test command of the README: installs what is missing (as root), builds, runs every test.
#   scripts/test.sh              unit, MPI (2 and 4 ranks) and script tests, incl. a real sbatch job
#   scripts/test.sh --sanitize   the same suite under AddressSanitizer + UBSan (build-asan/, CPU-only)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
"$ROOT/scripts/install-deps.sh" --slurm
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "${1:-}" = "--sanitize" ]; then
  shift
  export LOCKSTEP_BUILD_DIR=$ROOT/build-asan
  "$ROOT/scripts/build.sh" -DLOCKSTEP_SANITIZE=ON -DLOCKSTEP_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
  # Open MPI's own allocations are reported as leaks; we check memory errors, not MPI's leaks.
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
else
  "$ROOT/scripts/build.sh"
fi
cd "${LOCKSTEP_BUILD_DIR:-$ROOT/build}"
ctest --output-on-failure -j 2 "$@"
