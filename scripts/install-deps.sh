#!/usr/bin/env bash
# Installs the Debian 12 packages lockstep needs, only those missing (apt-get update first, once).
# Usage: scripts/install-deps.sh [--slurm]   (--slurm adds munge, slurmctld, slurmd, libpmix-dev)
#        scripts/install-deps.sh --fuzz      (adds clang 14 with libFuzzer and libomp, for bench/fuzz.sh)
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config libopenmpi-dev openmpi-bin libhdf5-dev
      libboost-program-options-dev libopenblas-dev libdnnl-dev ocl-icd-opencl-dev opencl-headers
      libgtest-dev dataset-fashion-mnist gnuplot-nox)
[ "${1:-}" = "--slurm" ] && PKGS+=(munge slurmctld slurmd slurm-client libpmix-dev)
[ "${1:-}" = "--fuzz" ] && PKGS+=(clang-14 libclang-rt-14-dev libomp-14-dev)
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
