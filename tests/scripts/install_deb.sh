#!/usr/bin/env bash
# The Debian package as a site administrator uses it: `cpack -G DEB` from the build folder, then
# `apt-get install ./lockstep_<version>_<arch>.deb` into this machine, the installed
# /usr/bin/lockstep-train --version, a Fashion-MNIST subset sharded with the installed
# lockstep-shard, and 20 steps of the installed fashion config with 2 ranks; then the package is
# purged, so the machine is left as it was. Only the runtime package (lockstep) is installed:
# lockstep-dev would put headers in /usr/include, which a concurrent build could pick up.
# Checks the Depends fields name the Debian 12 runtime libraries and no CUDA library.
# Usage: bash tests/scripts/install_deb.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
BUILD=$(cd "${1:?usage: install_deb.sh BUILD_DIR}" && pwd)
FASHION=/usr/share/datasets/fashion-mnist
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "installs a package into /usr: needs root"
for tool in cpack dpkg dpkg-deb apt-get mpirun; do
  command -v "$tool" >/dev/null || skip "$tool not available"
done
[ -f "$BUILD/CPackConfig.cmake" ] || skip "$BUILD has no CPackConfig.cmake"
grep -q '^LOCKSTEP_SANITIZE:BOOL=ON' "$BUILD/CMakeCache.txt" &&
  { echo "SKIP: sanitized build: a package of sanitizer-instrumented programs (needing libasan) is not one to install; the regular build runs this test"; exit 77; }
grep -q '^LOCKSTEP_GPU_CHECK_ONLY:BOOL=ON' "$BUILD/CMakeCache.txt" &&
  skip "a LOCKSTEP_GPU_CHECK_ONLY build has no lockstep-train"
[ -f "$FASHION/train-images-idx3-ubyte.gz" ] || skip "$FASHION missing (apt-get install dataset-fashion-mnist)"
if dpkg-query -W -f='${Status}' lockstep 2>/dev/null | grep -q 'install ok installed'; then
  skip "a lockstep package is already installed here; not replacing it"
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-deb.XXXXXX")
installed=0
cleanup() {
  [ "$installed" = 1 ] && { dpkg --purge lockstep >/dev/null 2>&1 || echo "WARNING: dpkg --purge lockstep failed" >&2; }
  rm -rf "$WORK"
}
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE

# -B: the package and CPack's staging tree go to $WORK, not into the build folder.
cpack -G DEB --config "$BUILD/CPackConfig.cmake" -B "$WORK" >"$WORK/cpack.log" 2>&1 ||
  { cat "$WORK/cpack.log"; fail "cpack -G DEB failed"; }
debs=("$WORK"/lockstep_*.deb)
[ -f "${debs[0]}" ] || { ls "$WORK"; fail "cpack made no lockstep_*.deb"; }
ls "$WORK"/lockstep-dev_*.deb >/dev/null 2>&1 || fail "cpack made no lockstep-dev_*.deb"
deb=${debs[0]}
depends=$(dpkg-deb -f "$deb" Depends)
echo "$(basename "$deb"): Depends: $depends"
for pkg in libopenmpi3 openmpi-bin libhdf5-103-1 libboost-program-options1.74.0 libopenblas0 \
           libdnnl2 libicu72 zlib1g libgomp1; do
  grep -qw -- "$pkg" <<<"$depends" || fail "Depends lacks $pkg"
done
! grep -qi 'cuda\|cudnn\|nccl' <<<"$depends" || fail "Depends names a CUDA library: $depends"
dpkg-deb -c "$deb" | grep -q '\./usr/include/' && fail "the runtime package ships headers"
# Every shared library the programs need must come from a package in Depends (or be NVIDIA's).
dpkg-deb -x "$deb" "$WORK/root"
for prog in "$WORK"/root/usr/bin/lockstep-* "$WORK"/root/usr/lib/liblockstep_*.so*; do
  [ -f "$prog" ] && [ ! -L "$prog" ] || continue
  for so in $(readelf -d "$prog" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'); do
    case "$so" in libcu*|libnccl*|libcudnn*) continue ;; esac
    case "$so" in liblockstep_*) continue ;; esac  # shipped in this package (shared build)
    path=$(ldconfig -p | awk -v so="$so" '$1 == so && /x86-64/ { print $NF; exit }')
    # The path as dpkg registered it, else through symlinks (alternatives: libopenblas.so.0).
    owner=$([ -n "$path" ] && { dpkg -S "$path" 2>/dev/null || dpkg -S "$(readlink -f "$path")" 2>/dev/null; } |
            head -n1 | cut -d: -f1)
    [ -n "$owner" ] || { echo "note: cannot tell which package ships $so"; continue; }
    case "$owner" in libc6|libopenblas0-*) continue ;; esac  # libc6 by version; libopenblas0 picks a variant
    grep -qw -- "$owner" <<<"$depends" || fail "$(basename "$prog") needs $so from $owner, not in Depends"
  done
done

export DEBIAN_FRONTEND=noninteractive
installed=1
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "$deb" >"$WORK/apt.log" 2>&1 ||
  { cat "$WORK/apt.log"; fail "apt-get install $(basename "$deb") failed"; }
[ -x /usr/bin/lockstep-train ] || fail "the package installed no /usr/bin/lockstep-train"
version=$(cd / && /usr/bin/lockstep-train --version) || fail "/usr/bin/lockstep-train --version failed"
echo "$version"

cd "$WORK" || fail "no $WORK"
/usr/bin/lockstep-shard fashion-mnist --out="$WORK/data" --shards=2 --limit=2048 --test-limit=256 \
  >"$WORK/shard.log" 2>&1 || { cat "$WORK/shard.log"; fail "the installed lockstep-shard failed"; }
timeout -k 10 240 mpirun -np 2 --oversubscribe --bind-to none /usr/bin/lockstep-train \
  --config /usr/share/lockstep/configs/fashion_mlp.ini --data.train="$WORK/data/train" \
  --data.test="$WORK/data/test" --train.max_steps=20 --optim.warmup_steps=5 --train.threads=1 --log.every=5 \
  --log.metrics="$WORK/metrics.jsonl" >"$WORK/train.log" 2>&1
rc=$?
tail -n 5 "$WORK/train.log"
[ "$rc" = 0 ] || { cat "$WORK/train.log"; fail "the installed lockstep-train exited with $rc"; }
steps=$(grep -c '"step"' "$WORK/metrics.jsonl")
[ "$steps" -ge 2 ] || fail "no step records in the metrics file"

dpkg --purge lockstep >/dev/null 2>&1 || fail "dpkg --purge lockstep failed"
installed=0
[ ! -e /usr/bin/lockstep-train ] || fail "/usr/bin/lockstep-train is still there after dpkg --purge"
echo "PASS: $(basename "$deb") installed with apt-get, ran 20 steps with 2 ranks, purged"
