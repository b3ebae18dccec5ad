#!/usr/bin/env bash
# Configures and builds lockstep into build/ (or $LOCKSTEP_BUILD_DIR). Extra args go to CMake.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${LOCKSTEP_BUILD_DIR:-$ROOT/build}
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
elif [ $# -gt 0 ]; then
  cmake -S "$ROOT" -B "$BUILD" "$@" >/dev/null
fi
cmake --build "$BUILD" -j "$(nproc)"
