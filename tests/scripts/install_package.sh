#!/usr/bin/env bash
# The installed tree as a library user sees it: `cmake --install` into a temporary prefix, then
# the out-of-tree example examples/custom_model (find_package(lockstep CONFIG)) configured and
# built against that prefix alone, and run with 2 MPI ranks. Checks that the programs and files
# landed where cmake/install.cmake says, that no installed text file names the build or source
# tree, that the installed lockstep-train runs (--version) after the tree is moved, and that the
# example learns (its last epoch's mean loss is below 60% of its first) with both ranks ending on
# the same parameters (DDP keeps replicas identical).
# Usage: bash tests/scripts/install_package.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
BUILD=$(cd "${1:?usage: install_package.sh BUILD_DIR}" && pwd)
SOURCE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed (apt-get install openmpi-bin)"; exit 77; }
grep -q '^LOCKSTEP_SANITIZE:BOOL=ON' "$BUILD/CMakeCache.txt" &&
  { echo "SKIP: sanitized build: its static libraries need the sanitizer runtime in every program that links them (the example does not); the regular build runs this test"; exit 77; }
grep -q '^LOCKSTEP_GPU_CHECK_ONLY:BOOL=ON' "$BUILD/CMakeCache.txt" &&
  { echo "SKIP: a LOCKSTEP_GPU_CHECK_ONLY build installs no lockstep-train"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-install.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE

cmake --install "$BUILD" --prefix "$WORK/first" >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log"; fail "cmake --install failed"; }
# Relocatable: everything below works from a prefix the build never knew.
mv "$WORK/first" "$WORK/prefix"
P=$WORK/prefix
for f in bin/lockstep-train bin/lockstep-shard bin/lockstep-bench include/lockstep/parallel/ddp.hpp \
         lib/cmake/lockstep/lockstepConfig.cmake lib/cmake/lockstep/lockstepConfigVersion.cmake \
         lib/cmake/lockstep/lockstepTargets.cmake share/lockstep/configs/fashion_mlp.ini \
         share/lockstep/slurm/train.sbatch share/lockstep/examples/custom_model/CMakeLists.txt \
         share/doc/lockstep/README.md share/doc/lockstep/ARCHITECTURE.md; do
  [ -e "$P/$f" ] || fail "cmake --install did not install $f"
done
ls "$P"/share/lockstep/modulefiles/lockstep/*.lua >/dev/null 2>&1 || fail "no Lmod modulefile installed"
[ -x "$P/share/lockstep/slurm/train.sbatch" ] || fail "the installed Slurm templates lost their mode"
if leaked=$(grep -rlI -e "$BUILD" -e "$SOURCE" "$P"); then
  fail "installed files name the build or source tree: $leaked"
fi
for prog in "$P"/bin/*; do
  rpath=$(readelf -d "$prog" | grep -E 'RPATH|RUNPATH' || true)
  if grep -q -e "$BUILD" -e "$SOURCE" <<<"$rpath"; then fail "$prog has a build-tree RPATH: $rpath"; fi
done
version=$(cd / && "$P/bin/lockstep-train" --version) || fail "installed lockstep-train --version failed"
echo "$version"
grep -q "^lockstep [0-9]" <<<"$version" || fail "--version does not start with 'lockstep <version>'"

# ---- a program of one's own against the prefix alone: only CMAKE_PREFIX_PATH points at lockstep.
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
CXX_LAUNCHER=(); command -v ccache >/dev/null && CXX_LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$P/share/lockstep/examples/custom_model" -B "$WORK/example" "${GEN[@]}" "${CXX_LAUNCHER[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$P" >"$WORK/configure.log" 2>&1 ||
  { cat "$WORK/configure.log"; fail "configuring the example against the installed package failed"; }
grep -q "$SOURCE/include\|$BUILD/layers" "$WORK/example/build.ninja" "$WORK/example/CMakeFiles"/*/flags.make 2>/dev/null &&
  fail "the example's include path reaches into lockstep's source or build tree"
cmake --build "$WORK/example" -j 2 >"$WORK/build.log" 2>&1 ||
  { cat "$WORK/build.log"; fail "building the example against the installed package failed"; }

(cd "$WORK" && timeout -k 10 180 mpirun -np 2 --oversubscribe --bind-to none \
  "$WORK/example/custom_model" "$WORK/data") >"$WORK/run.log" 2>&1
rc=$?
cat "$WORK/run.log"
[ "$rc" = 0 ] || fail "the example exited with $rc under mpirun -np 2"
first=$(sed -n 's/^epoch 1 mean loss \([0-9.]*\)$/\1/p' "$WORK/run.log")
last=$(sed -n 's/^epoch [0-9]* mean loss \([0-9.]*\)$/\1/p' "$WORK/run.log" | tail -n1)
[ -n "$first" ] && [ -n "$last" ] || fail "no epoch losses in the example's output"
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < 0.6 * f) }' ||
  fail "the example did not learn: mean loss $first (epoch 1) -> $last (last epoch)"
sums=$(sed -n 's/^rank [0-9]* parameter checksum \([0-9.]*\)$/\1/p' "$WORK/run.log" | sort -u)
[ "$(grep -c 'parameter checksum' "$WORK/run.log")" = 2 ] || fail "expected a checksum from each of 2 ranks"
[ "$(wc -l <<<"$sums")" = 1 ] || fail "the ranks' parameters differ after DDP training: $sums"
echo "PASS: installed to a moved prefix; example built against it; loss $first -> $last; ranks agree ($sums)"
