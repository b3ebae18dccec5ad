#!/usr/bin/env bash
# Packs what the GPU check (bench/gpu-check.sh) needs on a lent GPU machine that has CUDA's
# driver, toolkit and PyTorch but no Open MPI, HDF5, Boost, OpenBLAS, oneDNN or GoogleTest, and
# no network: the programs of a CUDA build made here, every shared library they load except
# glibc's own and the driver's libcuda, a relocatable Open MPI (mpirun, orted, its plugins and
# help files), Fashion-MNIST shards and GPT-tiny's byte-level token shards (the Book of Genesis)
# made here, and a manifest. cuBLAS(Lt), cuDNN and NCCL are
# not packed (cuBLASLt alone is 541 MB): lockstep opens them on first GPU use, and the device
# finds them in its toolkit or in PyTorch's nvidia-* wheels. Nor can cuDNN's fused attention
# travel: libcudnn.so.9 is a shim over sub-libraries it opens beside it, and what the attention
# runs on (libcudnn_graph, _heuristic, _engines_precompiled, _engines_runtime_compiled, with NVRTC
# for the runtime-compiled kernels) is 450 MB, 244 MB even at xz -1 (9.19, measured 2026-12-06;
# the precompiled engines alone 177 MB), against 64 MiB for everything that travels. So the
# manifest names them, and gpu-check.sh finds them (and says which are missing) on the device.
#
# Then it checks the bundle as the device will see it: unpacked into a fresh folder, every ELF
# must resolve every library from the bundle alone (or glibc, or libcuda), and a CPU smoke runs
# from it with a clean environment (mpirun -np 2 and a singleton lockstep-train on the bundled
# data, test_cuda with its GPU tests skipping, the NCCL bootstrap tests under mpirun).
#
# Usage (repository root):  bench/gpu-bundle.sh [BUILD]     (default $LOCKSTEP_BUILD_DIR or build)
#   makes gpu-bundle/lockstep-gpu.tar.xz (ignored); carry "gpu-bundle" to the device and run
#   `bash bench/gpu-check.sh` there (docs/PERFORMANCE.md, "## GPU").
# Settings: DATA_LIMIT (16384 training samples), DATA_TEST_LIMIT (2000), XZ_LEVEL (6; .ci/run
#   uses 1: the check is the same, only packing is faster and the file larger),
#   WITH_SHARD=1 (pack lockstep-shard too), SKIP_SMOKE=1 (the library check only),
#   CHECK_ONLY=1 (check the bundle made before, without packing it again).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(realpath "${1:-${LOCKSTEP_BUILD_DIR:-$ROOT/build}}")
DEST=$ROOT/gpu-bundle
NAME=lockstep-gpu
DATA_LIMIT=${DATA_LIMIT:-16384}
DATA_TEST_LIMIT=${DATA_TEST_LIMIT:-2000}
XZ_LEVEL=${XZ_LEVEL:-6}
LIMIT_BYTES=$((64 * 1024 * 1024))

die() { echo "gpu-bundle: $*" >&2; exit 1; }
say() { echo "== gpu-bundle: $*"; }

# ---- what goes in: programs of the build, and Open MPI's launcher from this machine
# lockstep-shard only with WITH_SHARD=1: the data is sharded here, and its ICU (for the GPT-2
# tokenizer) alone is 31 MB.
PROGRAMS=(apps/lockstep-train apps/lockstep-bench tests/test_cuda tests/test_mpi)
[ "${WITH_SHARD:-0}" = 1 ] && PROGRAMS+=(apps/lockstep-shard)
for p in "${PROGRAMS[@]}"; do
  [ -x "$BUILD/$p" ] || die "$BUILD/$p is missing: build first (scripts/build.sh with CUDA)"
done
[[ $(ldd "$BUILD/apps/lockstep-train") == *libcudart.so* ]] ||
  die "$BUILD/apps/lockstep-train does not link libcudart: $BUILD is not a CUDA build"
ORTERUN=$(readlink -f "$(command -v mpirun)") || die "mpirun not found (install openmpi-bin)"
ORTED=$(readlink -f "$(command -v orted)") || die "orted not found (install openmpi-bin)"
OMPI_PKGLIBDIR=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p')
OMPI_PKGDATADIR=$(ompi_info --path pkgdatadir --parsable 2>/dev/null | sed -n 's/^path:pkgdatadir://p')
[ -d "$OMPI_PKGLIBDIR" ] && [ -d "$OMPI_PKGDATADIR" ] ||
  die "cannot find Open MPI's plugin and help folders (ompi_info --path all)"
# Open MPI 4 uses an external PMIx with plugins of its own (Debian: .../pmix2/lib/pmix).
PMIX_LIB=$(ldconfig -p | sed -n 's/.*libpmix\.so\.2 .*=> //p' | head -1)
PMIX_PREFIX_HERE=$( [ -n "$PMIX_LIB" ] && dirname "$(dirname "$(readlink -f "$PMIX_LIB")")" || true)

# Libraries the device has, or must come from its driver: never packed.
ALLOWED='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libutil\.so|libresolv\.so|libanl\.so|libmvec\.so|libcuda\.so|libnvidia-)'
# Plugins that would pull in network fabrics (InfiniBand, UCX, OFI, PSM) or CUDA-aware MPI:
# one machine needs shared memory and TCP only.
UNWANTED_DEPS='lib(ibverbs|rdmacm|ucp|ucs|uct|ucm|fabric|psm|psm2|mlx5|nl-|cuda\.so|jvm|slurm|pmi\.so|pmi2)'
# Never packed even if linked: 100s of MB each, opened lazily from the device's CUDA install
# (NVRTC by cuDNN itself, for its runtime-compiled attention kernels).
FORBIDDEN='^lib(cublas|cublasLt|cudnn|nccl|nvrtc)'

STAGE=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bundle.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
B=$STAGE/$NAME
mkdir -p "$B"/{bin,libexec,lib,hwloc-plugins,ompi/lib,ompi/share/openmpi,ompi/etc,pmix/lib/pmix,pmix/share/pmix,data}

declare -A PACKED=()  # soname -> source path
# The libraries an ELF needs (soname and resolved path, one pair a line), as this machine's
# loader resolves them; fails on any that are not found.
deps_of() {
  ldd "$1" 2>&1 | awk -v f="$1" '
    /=> not found/ { print "gpu-bundle: " f " needs " $1 ", not found here" > "/dev/stderr"; bad = 1; next }
    /=>/ && $3 ~ /^\// { print $1, $3 }
    END { exit bad }'
}
pack_deps() {  # ELF...
  local f so path list
  for f in "$@"; do
    list=$(deps_of "$f") || die "$f has unresolved libraries here"
    while read -r so path; do
      [ -n "$so" ] || continue
      [[ $so =~ $ALLOWED ]] && continue
      [[ $so =~ $FORBIDDEN ]] && die "$f links $so directly; lockstep must open it lazily (src/ops/cuda/dynload.cpp)"
      [ -n "${PACKED[$so]:-}" ] && continue
      PACKED[$so]=$path
      cp -L "$path" "$B/lib/$so"
    done <<<"$list"
  done
}
# A wrapper in bin/ per program: the bundle's libraries first, for that program only (python3
# and the CUDA tools on the device keep their own libstdc++), then the device's CUDA libraries.
wrap() {  # name real-file-in-libexec
  cat >"$B/bin/$1" <<EOF
#!/bin/sh
# lockstep GPU bundle: libexec/$2 with the bundle's libraries first (made by bench/gpu-bundle.sh)
b=\$(cd "\$(dirname "\$0")/.." && pwd)
LD_LIBRARY_PATH="\$b/lib\${LOCKSTEP_CUDA_LIB_DIRS:+:\$LOCKSTEP_CUDA_LIB_DIRS}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "\$b/libexec/$2" "\$@"
EOF
  chmod +x "$B/bin/$1"
}

if [ "${CHECK_ONLY:-0}" != 1 ]; then
say "programs from $BUILD"
for p in "${PROGRAMS[@]}"; do
  cp "$BUILD/$p" "$B/libexec/"
  wrap "$(basename "$p")" "$(basename "$p")"
done
cp "$ORTERUN" "$B/libexec/orterun"
cp "$ORTED" "$B/libexec/orted"
for n in mpirun mpiexec orterun; do wrap "$n" orterun; done
wrap orted orted
pack_deps "$B"/libexec/*

say "Open MPI plugins from $OMPI_PKGLIBDIR"
kept=0 left=0 left_out=""
for plugin in "$OMPI_PKGLIBDIR"/*.so; do
  # (whole outputs captured: grep -q would end a pipeline early, a failure under pipefail)
  if ! deps=$(deps_of "$plugin" 2>/dev/null) || [[ $deps =~ $UNWANTED_DEPS ]]; then
    left=$((left + 1)) left_out+=" $(basename "$plugin" .so)"; continue
  fi
  cp "$plugin" "$B/ompi/lib/"
  pack_deps "$plugin"
  kept=$((kept + 1))
done
echo "   $kept plugins kept, $left left out (network fabrics, CUDA-aware MPI, unresolved here):$left_out"
cp -r "$OMPI_PKGDATADIR"/. "$B/ompi/share/openmpi/"
rm -f "$B"/ompi/share/openmpi/*wrapper-data.txt "$B"/ompi/share/openmpi/*.supp
if [ -n "$PMIX_PREFIX_HERE" ] && [ -d "$PMIX_PREFIX_HERE/lib/pmix" ]; then
  for plugin in "$PMIX_PREFIX_HERE"/lib/pmix/*.so; do
    if ! deps=$(deps_of "$plugin" 2>/dev/null) || [[ $deps =~ $UNWANTED_DEPS ]]; then continue; fi
    cp "$plugin" "$B/pmix/lib/pmix/"
    pack_deps "$plugin"
  done
  cp -r "$PMIX_PREFIX_HERE"/share/pmix/. "$B/pmix/share/pmix/" 2>/dev/null || true
fi
# Open MPI's defaults for a single shared machine, as a root user in a container.
cat >"$B/ompi/etc/openmpi-mca-params.conf" <<'EOF'
# lockstep GPU bundle: one machine, shared memory and TCP; no CMA (ptrace is refused in sandboxes)
btl_vader_single_copy_mechanism = none
rmaps_base_oversubscribe = 1
EOF

# ---- the environment the device script sources
cat >"$B/env.sh" <<'EOF'
# Source me (bash): the bundle's programs on PATH and Open MPI relocated into the bundle.
# LOCKSTEP_CUDA_LIB_DIRS (':'-separated) names the device's folders of cuBLAS, cuDNN and NCCL;
# the bin/ wrappers put them after the bundle's libraries.
LOCKSTEP_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LOCKSTEP_BUNDLE
export PATH="$LOCKSTEP_BUNDLE/bin:$PATH"
export OPAL_PREFIX="$LOCKSTEP_BUNDLE/ompi" OPAL_EXEC_PREFIX="$LOCKSTEP_BUNDLE/ompi"
export OPAL_BINDIR="$LOCKSTEP_BUNDLE/bin" OPAL_LIBDIR="$LOCKSTEP_BUNDLE/lib"
export OPAL_PKGLIBDIR="$LOCKSTEP_BUNDLE/ompi/lib" OPAL_PKGDATADIR="$LOCKSTEP_BUNDLE/ompi/share/openmpi"
export OPAL_DATADIR="$LOCKSTEP_BUNDLE/ompi/share" OPAL_DATAROOTDIR="$LOCKSTEP_BUNDLE/ompi/share"
export OPAL_SYSCONFDIR="$LOCKSTEP_BUNDLE/ompi/etc"
export PMIX_PREFIX="$LOCKSTEP_BUNDLE/pmix" PMIX_LIBDIR="$LOCKSTEP_BUNDLE/lib"
export PMIX_PKGLIBDIR="$LOCKSTEP_BUNDLE/pmix/lib/pmix" PMIX_PKGDATADIR="$LOCKSTEP_BUNDLE/pmix/share/pmix"
export PMIX_MCA_mca_base_component_path="$LOCKSTEP_BUNDLE/pmix/lib/pmix"
export OMPI_MCA_mca_base_component_path="$LOCKSTEP_BUNDLE/ompi/lib"
export OMPI_MCA_ess_singleton_isolated=1  # a singleton needs no orted
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_WAIT_POLICY=PASSIVE
export HWLOC_PLUGINS_PATH="$LOCKSTEP_BUNDLE/hwloc-plugins"  # none: the machine's own would pull in X11, libxml2
export LOCKSTEP_BUNDLE_DATA="$LOCKSTEP_BUNDLE/data/fashion-mnist"
export LOCKSTEP_BUNDLE_TEXT="$LOCKSTEP_BUNDLE/data/genesis"  # train-*.h5, val-*.h5: bytes tokenizer
EOF

# ---- data: Fashion-MNIST shards, made here so the device needs no HDF5 tools
say "Fashion-MNIST shards (first $DATA_LIMIT training and $DATA_TEST_LIMIT test samples, 8 shards)"
"$BUILD/apps/lockstep-shard" fashion-mnist --out="$B/data/fashion-mnist" \
  --shards=8 --limit="$DATA_LIMIT" --test-limit="$DATA_TEST_LIMIT" >"$STAGE/shard.log" 2>&1 ||
  { cat "$STAGE/shard.log"; die "lockstep-shard fashion-mnist failed (is /usr/share/datasets/fashion-mnist there?)"; }

# GPT-tiny's tokens (configs/gpt_tiny.ini, bytes tokenizer): the Book of Genesis from bible-kjv,
# the corpus of scripts/make-text-data.sh, one document per chapter: 197 KB, about 45 training
# steps of gpt-tiny's 32 x 128 tokens, enough for a smoke of 20; the whole Bible is 22 times more.
say "GPT-tiny token shards (Genesis, bytes tokenizer)"
command -v bible >/dev/null ||
  die "the 'bible' program is missing: scripts/install-deps.sh (apt-get install bible-kjv)"
bible -f Gen1:1-Gen50:26 </dev/null | awk '
  { chapter = $1; sub(/:[0-9]+$/, "", chapter)
    if (NR > 1 && chapter != previous) print ""
    previous = chapter; sub(/^[^ ]+ /, ""); print }' >"$STAGE/genesis.txt"
[ "$(grep -c '^$' "$STAGE/genesis.txt")" = 49 ] || die "expected Genesis' 50 chapters from 'bible -f'"
"$BUILD/apps/lockstep-shard" text --input="$STAGE/genesis.txt" --documents=paragraph \
  --tokenizer=bytes --out="$B/data/genesis" --name=train --shards=2 --val-fraction=0.05 \
  --val-name=val --val-shards=1 >"$STAGE/shard-text.log" 2>&1 ||
  { cat "$STAGE/shard-text.log"; die "lockstep-shard text failed"; }

# ---- manifest
GLIBC_NEEDED=$(find "$B" -type f \( -path '*/libexec/*' -o -name '*.so*' \) -exec objdump -T {} + 2>/dev/null |
  grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
{
  echo "lockstep GPU bundle, made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) by bench/gpu-bundle.sh"
  echo "source: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
       "build: $BUILD (its checkout at $(git -C "$BUILD" rev-parse --short HEAD 2>/dev/null || echo "?") when packed)"
  echo "needs on the device: glibc >= ${GLIBC_NEEDED#GLIBC_} (here $(ldd --version | head -1 | awk '{print $NF}')), the NVIDIA driver's libcuda,"
  echo "  cuBLAS/cuBLASLt 13, cuDNN 9 and NCCL 2 found via LOCKSTEP_CUDA_LIB_DIRS (bench/gpu-check.sh finds them);"
  echo "  for cuDNN's fused attention (train.attention), cuDNN's sub-libraries beside libcudnn.so.9"
  echo "  (libcudnn_graph, _heuristic, _engines_precompiled, _engines_runtime_compiled) and NVRTC 13"
  fe=$(sed -n 's/^LOCKSTEP_CUDNN_FRONTEND_INCLUDE_DIR:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
  echo "cuDNN frontend (fused attention) compiled in: $([[ -n $fe && $fe != *NOTFOUND ]] && echo "yes, $fe" ||
    echo "no (scripts/install-deps.sh --cudnn-frontend, then build again)")"
  echo "open mpi: $(mpirun --version 2>/dev/null | head -1)"
  echo
  echo "# bytes  sha256-prefix  path  <- source"
  (cd "$B" && find . -type f | sort | while read -r f; do
    src=""
    case $f in ./lib/*) src=${PACKED[$(basename "$f")]:-} ;; esac
    printf '%10d  %.16s  %s%s\n' "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-16)" "${f#./}" "${src:+  <- $src}"
  done)
} >"$B/MANIFEST.txt"

# ---- pack
mkdir -p "$DEST"
say "compressing (xz -$XZ_LEVEL)"
tar -C "$STAGE" -cf - "$NAME" | xz -T0 -"$XZ_LEVEL" >"$DEST/$NAME.tar.xz.part"
mv "$DEST/$NAME.tar.xz.part" "$DEST/$NAME.tar.xz"
cp "$B/MANIFEST.txt" "$DEST/MANIFEST.txt"
fi  # CHECK_ONLY
[ -f "$DEST/$NAME.tar.xz" ] || die "$DEST/$NAME.tar.xz is missing"
size=$(stat -c %s "$DEST/$NAME.tar.xz")
unpacked=$(xz -dc "$DEST/$NAME.tar.xz" | wc -c)
repo=$(git -C "$ROOT" ls-files -z | (cd "$ROOT" && xargs -0 du -cb 2>/dev/null) | tail -1 | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
echo "   $DEST/$NAME.tar.xz: $(mib "$size") MiB (unpacked $(mib "$unpacked") MiB, $(grep -c '  lib/' "$DEST/MANIFEST.txt")" \
     "libraries); repository $(mib "$repo") MiB; 64 MiB may travel in all"
(( size + repo < LIMIT_BYTES * 9 / 10 )) ||
  die "bundle ($size bytes) + repository ($repo bytes) is over 90% of the 64 MiB that travels"

# ---- check: unpacked elsewhere, resolved from the bundle alone
X=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bundle-check.XXXXXX")
trap 'rm -rf "$STAGE" "$X"' EXIT
tar -C "$X" -xJf "$DEST/$NAME.tar.xz"
XB=$X/$NAME
say "check: every ELF in $XB resolves from the bundle alone"
bad=0 nelf=0
while IFS= read -r -d '' f; do
  [ "$(head -c4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  nelf=$((nelf + 1))
  while read -r so arrow path _; do
    if [ "$arrow" != "=>" ]; then continue; fi
    if [ "$path" = "not" ]; then echo "   FAIL ${f#"$X"/}: $so not found" >&2; bad=1; continue; fi
    case $path in "$XB"/*) continue ;; esac
    [[ $so =~ $ALLOWED ]] && continue
    echo "   FAIL ${f#"$X"/}: $so resolves outside the bundle, to $path" >&2; bad=1
  done < <(env -i LD_LIBRARY_PATH="$XB/lib" /usr/bin/ldd "$f" 2>&1)
done < <(find "$XB" -type f -print0)
(( bad == 0 )) || die "some libraries resolve outside the bundle (above)"
echo "   $nelf ELF files: every library in the bundle, glibc or libcuda"

if [ "${SKIP_SMOKE:-0}" = 1 ]; then say "smoke skipped (SKIP_SMOKE=1)"; exit 0; fi
# ---- CPU smoke from the unpacked bundle with a clean environment
say "check: CPU smoke from the bundle (env -i, PATH=/usr/bin:/bin)"
smoke() {  # label, then a bash command run with only the bundle's env.sh
  local label=$1; shift
  local t0=$SECONDS
  if env -i PATH=/usr/bin:/bin HOME="$X" TMPDIR="${TMPDIR:-/tmp}" \
       bash -c "source '$XB/env.sh' && cd '$ROOT' && $*" >"$X/smoke.log" 2>&1; then
    echo "   ok   $label ($((SECONDS - t0)) s): $(grep -v '^\s*$' "$X/smoke.log" | tail -1 | cut -c1-120)"
  else
    echo "   FAIL $label; last lines of its output:" >&2
    tail -15 "$X/smoke.log" | sed 's/^/     /' >&2
    die "smoke '$label' failed from the unpacked bundle ($XB)"
  fi
}
TRAIN_ARGS="--config configs/ci_tiny.ini --data.train=\$LOCKSTEP_BUNDLE_DATA/train \
  --data.test=\$LOCKSTEP_BUNDLE_DATA/test --train.max_steps=40 --train.eval=false --log.progress=none \
  --train.device=cpu"
smoke "mpirun -np 2 lockstep-train (ci_tiny, 40 steps)" \
  "[ \"\$(command -v mpirun)\" = '$XB/bin/mpirun' ] && mpirun -np 2 lockstep-train $TRAIN_ARGS \
   --log.metrics=$X/np2.jsonl && grep -q '\"event\": *\"final\"' $X/np2.jsonl"
smoke "singleton lockstep-train (ci_tiny, 40 steps, no mpirun)" \
  "lockstep-train $TRAIN_ARGS --log.metrics=$X/np1.jsonl && grep -q '\"event\": *\"final\"' $X/np1.jsonl"
# Every library mpirun and its ranks load, dlopen'ed plugins too, must come from the bundle: this
# machine has the same Open MPI installed, so a wrong path would pass the runs above unnoticed.
# One LD_DEBUG file per process (LD_DEBUG_OUTPUT.PID): in one shared stream the processes' lines
# interleave mid-path, and a torn path reads as a library outside the bundle.
smoke "libraries loaded at run time (LD_DEBUG=files, mpirun -np 2) all in the bundle" \
  "LD_DEBUG=files LD_DEBUG_OUTPUT=$X/lddebug mpirun -np 2 -x LD_DEBUG -x LD_DEBUG_OUTPUT \
     lockstep-train $TRAIN_ARGS >$X/lddebug.log 2>&1 || { tail $X/lddebug.log; exit 1; }
   ls $X/lddebug.[0-9]* >/dev/null 2>&1 || { echo 'LD_DEBUG wrote no per-process files'; exit 1; }
   outside=\$(cat $X/lddebug.[0-9]* | grep -o 'calling init: /[^ ]*' | awk '{print \$3}' | sort -u |
     grep -v '^$XB/' | grep -Ev '/(libc|libm|libdl|libpthread|librt|libutil|libresolv|ld-linux-x86-64|libnss_[a-z]+)\.so')
   n=\$(cat $X/lddebug.[0-9]* | grep -o 'calling init: /[^ ]*' | sort -u | wc -l)
   [ -z \"\$outside\" ] && echo \"\$n libraries, none outside\" || { echo \"outside the bundle: \$outside\"; exit 1; }"
smoke "test_cuda (GPU tests skip without a GPU)" "test_cuda --gtest_brief=1"
# AbortJob.*: a rank spawns a test of its own binary as an MPI singleton, as the NCCL watchdog
# test does on the device.
smoke "mpirun -np 2 test_mpi (NCCL bootstrap, GPU selection, a singleton child)" \
  "mpirun -np 2 test_mpi --gtest_filter='NcclBootstrap.*:GpuSelection.*:NcclCommunicator.*:AbortJob.*' --gtest_brief=1"
smoke "lockstep-bench gpu-step --gpu=0 (CPU half)" \
  "lockstep-bench gpu-step --gpu=0 --reps=3 --warmup=1 --cpu-threads=1"
say "bundle ok: $DEST/$NAME.tar.xz"
