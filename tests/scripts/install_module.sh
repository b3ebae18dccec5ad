#!/usr/bin/env bash
# The Lmod modulefile as a cluster user meets it: install into a prefix, move the tree (the
# modulefile must find it from its own path), then in a fresh login shell `module use` its
# modulefiles folder, `module load lockstep` and run `lockstep-train --version` from PATH; check
# the variables the module sets (LOCKSTEP_ROOT, LOCKSTEP_SHARE, CMAKE_PREFIX_PATH), that
# `module unload` takes them back, and that the installed slurm/train.sbatch, run outside any
# clone with a stand-in srun, picks the module's lockstep-train.
# Usage: bash tests/scripts/install_module.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
BUILD=$(cd "${1:?usage: install_module.sh BUILD_DIR}" && pwd)
LMOD_INIT=/usr/share/lmod/lmod/init/bash
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -f "$LMOD_INIT" ] || { echo "SKIP: Lmod not installed (apt-get install lmod)"; exit 77; }
grep -q '^LOCKSTEP_GPU_CHECK_ONLY:BOOL=ON' "$BUILD/CMakeCache.txt" &&
  { echo "SKIP: a LOCKSTEP_GPU_CHECK_ONLY build installs no lockstep-train"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-module.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

cmake --install "$BUILD" --prefix "$WORK/installed" --component Runtime >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log"; fail "cmake --install failed"; }
mv "$WORK/installed" "$WORK/moved"
P=$WORK/moved
mkdir -p "$WORK/fakebin" "$WORK/submit"
printf '#!/bin/sh\necho "srun would run: $*"\n' >"$WORK/fakebin/srun"
chmod +x "$WORK/fakebin/srun"

# A fresh login shell with only what a user types; env -i so nothing of this shell leaks in.
env -i HOME="$WORK" PATH=/usr/bin:/bin TERM=dumb bash -lc "
  set -e
  source $LMOD_INIT
  module use $P/share/lockstep/modulefiles
  module load lockstep
  module list 2>&1
  echo \"which: \$(command -v lockstep-train)\"
  echo \"LOCKSTEP_ROOT=\$LOCKSTEP_ROOT\"
  echo \"LOCKSTEP_SHARE=\$LOCKSTEP_SHARE\"
  echo \"CMAKE_PREFIX_PATH=\$CMAKE_PREFIX_PATH\"
  lockstep-train --version
  cd $WORK/submit
  PATH=$WORK/fakebin:\$PATH SLURM_SUBMIT_DIR=$WORK/submit SLURM_JOB_ID=1 SLURM_NTASKS=2 \
    SLURM_JOB_NODELIST=node1 bash \$LOCKSTEP_SHARE/slurm/train.sbatch \$LOCKSTEP_SHARE/configs/fashion_mlp.ini
  module unload lockstep
  echo \"after unload: \$(command -v lockstep-train || echo none) root=\${LOCKSTEP_ROOT:-unset}\"
" >"$WORK/shell.log" 2>&1
rc=$?
cat "$WORK/shell.log"
[ "$rc" = 0 ] || fail "the login shell with module load lockstep failed ($rc)"
grep -qx "which: $P/bin/lockstep-train" "$WORK/shell.log" || fail "lockstep-train on PATH is not $P/bin's"
grep -qx "LOCKSTEP_ROOT=$P" "$WORK/shell.log" || fail "LOCKSTEP_ROOT is not the moved prefix $P"
grep -qx "LOCKSTEP_SHARE=$P/share/lockstep" "$WORK/shell.log" || fail "LOCKSTEP_SHARE is wrong"
grep -q "^CMAKE_PREFIX_PATH=$P" "$WORK/shell.log" || fail "CMAKE_PREFIX_PATH lacks $P"
grep -q '^lockstep [0-9]' "$WORK/shell.log" || fail "lockstep-train --version printed no version"
grep -q "srun would run: .* $P/bin/lockstep-train --config $P/share/lockstep/configs/fashion_mlp.ini" \
  "$WORK/shell.log" || fail "the installed train.sbatch did not pick the module's lockstep-train"
grep -qx "after unload: none root=unset" "$WORK/shell.log" || fail "module unload left lockstep behind"

# A copy of the modulefile away from its tree cannot know the prefix: it must say so.
mkdir -p "$WORK/elsewhere/lockstep"
cp "$P"/share/lockstep/modulefiles/lockstep/*.lua "$WORK/elsewhere/lockstep/"
env -i HOME="$WORK" PATH=/usr/bin:/bin TERM=dumb bash -lc "
  source $LMOD_INIT; module use $WORK/elsewhere; module load lockstep" >"$WORK/copy.log" 2>&1
tr -s ' \n' ' ' <"$WORK/copy.log" | grep -q "use the modulefile where lockstep installed it" ||
  { cat "$WORK/copy.log"; fail "a copied modulefile did not explain why it cannot load"; }
echo "PASS: module load lockstep from a moved prefix works in a fresh login shell"
