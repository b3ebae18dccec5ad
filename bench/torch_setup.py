"""The prologue every bench-only PyTorch peer runs before `import torch` (bench/torch_peer.py,
precision_torch.py, gpt_torch.py): PyTorch's best CPU settings that must be in place before it
loads.

- glibc's malloc: the mmap and trim thresholds raised to 1 GiB (TORCH_MALLOC=tuned, the
  default; TORCH_MALLOC=default leaves glibc as it is). Otherwise PyTorch frees its large CPU
  temporaries back to the kernel every step and faults them in again: on the AMD EPYC Zen 5 VM
  (2026-12-02) that was three quarters of Debian's PyTorch 1.13 autocast bf16 step (41-64 ms at 1
  thread; 12 ms with the thresholds raised), the effect PyTorch's CPU tuning guide gets from
  jemalloc or tcmalloc. glibc reads its tunables once, at process start, so the process starts
  again with GLIBC_TUNABLES set.
- threads: OMP_NUM_THREADS, MKL_NUM_THREADS and OPENBLAS_NUM_THREADS set to --threads (unless
  the caller set them): torch.set_num_threads covers PyTorch's OpenMP pool, not the OpenBLAS
  Debian's build calls for fp32 matmuls, which starts one thread per core when it loads.
"""
import os
import sys

TUNED_MALLOC = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824"


def threads_from_argv(default):
    for i, arg in enumerate(sys.argv[1:], 1):
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
        if arg == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
    return str(default)


def prepare(default_threads=1):
    malloc = os.environ.get("TORCH_MALLOC", "tuned")
    if malloc not in ("tuned", "default"):
        sys.exit(f"{os.path.basename(sys.argv[0])}: TORCH_MALLOC={malloc!r}: use 'tuned' or "
                 "'default'")
    if malloc == "tuned" and "GLIBC_TUNABLES" not in os.environ:
        os.environ["GLIBC_TUNABLES"] = TUNED_MALLOC
        os.execv(sys.executable, [sys.executable] + sys.argv)
    threads = threads_from_argv(default_threads)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, threads)
