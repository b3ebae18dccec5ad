#!/usr/bin/env bash
# Installs the PyTorch that the bench scripts measure lockstep against (bench-only; lockstep, its
# build and its tests never use it).
#   bench/install-torch-peer.sh pip      torch 2.15.0 + torchvision 0.29.2 from PyPI into a virtual
#                                        environment, ~/.cache/lockstep/bench-venv (or
#                                        $LOCKSTEP_BENCH_VENV); about 5.5 GB (PyPI's wheel is the
#                                        CUDA build; its CPU kernels are the same)
#   bench/install-torch-peer.sh debian   Debian 12's python3-torch 1.13 and python3-torchvision
#                                        0.14 (ResNet-18's peer; apt-get, as root)
#   bench/install-torch-peer.sh images   adds the image-loader peers to the pip environment:
#                                        NVIDIA DALI 2.4 (nvidia-dali-cuda120, its CPU pipeline
#                                        runs without a GPU; about 0.4 GB) and pillow-simd in
#                                        place of Pillow, built from PyPI's source with AVX2
#                                        (needs libjpeg-dev, zlib1g-dev and a C compiler)
# torch.compile (inductor) needs a C++ compiler at run time: g++ from build-essential.
set -euo pipefail
what=${1:-pip}
case "$what" in
  pip)
    venv=${LOCKSTEP_BENCH_VENV:-$HOME/.cache/lockstep/bench-venv}
    if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
      [ "$(id -u)" = 0 ] || { echo "install-torch-peer: needs python3-venv (apt-get as root)" >&2; exit 1; }
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    fi
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "torch==2.15.0" "torchvision==0.29.2"
    "$venv/bin/python" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)'
    ;;
  debian)
    [ "$(id -u)" = 0 ] || { echo "install-torch-peer: apt-get needs root" >&2; exit 1; }
    apt-get update -qq && apt-get install -y -qq python3-torch python3-torchvision >/dev/null
    /usr/bin/python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)'
    ;;
  images)
    venv=${LOCKSTEP_BENCH_VENV:-$HOME/.cache/lockstep/bench-venv}
    [ -x "$venv/bin/python" ] || bash "$0" pip
    if ! dpkg -s libjpeg-dev zlib1g-dev >/dev/null 2>&1; then
      [ "$(id -u)" = 0 ] || { echo "install-torch-peer: needs libjpeg-dev zlib1g-dev (apt-get as root)" >&2; exit 1; }
      apt-get update -qq && apt-get install -y -qq libjpeg-dev zlib1g-dev >/dev/null
    fi
    "$venv/bin/python" -m pip install -q "nvidia-dali-cuda120==2.4.0"
    if ! "$venv/bin/python" -c 'import PIL, sys; sys.exit("post" not in PIL.__version__)' 2>/dev/null; then
      "$venv/bin/python" -m pip uninstall -y -q pillow
      CC="cc -mavx2" "$venv/bin/python" -m pip install -q --no-binary pillow-simd "pillow-simd==12.1.1.post0"
    fi
    "$venv/bin/python" -c 'import PIL, nvidia.dali; print("pillow-simd", PIL.__version__, "dali", nvidia.dali.__version__)'
    ;;
  *) echo "usage: bench/install-torch-peer.sh pip|debian|images" >&2; exit 2 ;;
esac
command -v g++ >/dev/null || echo "install-torch-peer: no g++: torch.compile (inductor) will fail" >&2
