# Sourced by the bench scripts that run PyTorch as the peer: sets PYTHON to the interpreter of the
# chosen PyTorch, installing it when missing. Bench-only: lockstep and its tests never need it.
#   TORCH=pip     (default) PyTorch 2.15 and torchvision 0.29 from PyPI in a virtual environment
#                 under ~/.cache/lockstep/bench-venv (bench/install-torch-peer.sh makes it)
#   TORCH=debian  Debian 12's python3-torch 1.13 and python3-torchvision 0.14 in the system
#                 interpreter (apt-get)
#   PYTHON=...    any interpreter that imports torch (overrides TORCH)
# TORCH_PEER is left holding a one-line description for the summaries.
TORCH=${TORCH:-pip}
if [ -n "${PYTHON:-}" ]; then
  :
elif [ "$TORCH" = pip ]; then
  PYTHON=${LOCKSTEP_BENCH_VENV:-$HOME/.cache/lockstep/bench-venv}/bin/python
  "$PYTHON" -c 'import torch, torchvision' 2>/dev/null || bash "$(dirname "${BASH_SOURCE[0]}")/install-torch-peer.sh" pip
elif [ "$TORCH" = debian ]; then
  PYTHON=/usr/bin/python3
  "$PYTHON" -c 'import torch, torchvision' 2>/dev/null || bash "$(dirname "${BASH_SOURCE[0]}")/install-torch-peer.sh" debian
else
  echo "TORCH must be pip or debian, got '$TORCH'" >&2
  exit 2
fi
"$PYTHON" -c 'import torch' 2>/dev/null || { echo "$PYTHON cannot import torch" >&2; exit 77; }
TORCH_PEER=$("$PYTHON" -c 'import torch
cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "?")()
print("PyTorch", torch.__version__, "(" + cap + ")")' 2>/dev/null)
export PYTHON TORCH TORCH_PEER
