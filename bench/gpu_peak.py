#!/usr/bin/env python3
"""The GPU's ceilings as PyTorch reaches them, for the MFU and bandwidth figures of
bench/gpu-check.sh: an 8192^3 bf16 matrix product (TFLOP/s; the mean of 10 products after 3
warm-ups, on random data) and a 1 GiB device-to-device copy (TB/s, counting the bytes read and
written). Prints one JSON record. Bench-only: lockstep never imports torch.

  python3 bench/gpu_peak.py [--device=cuda]
"""
import argparse
import json
import time

import torch

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--device", default="cuda")
a = ap.parse_args()
dev = torch.device(a.device)


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn, reps=10, warmup=3):
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps


n = 8192 if dev.type == "cuda" else 512  # --device=cpu: a check of this script, not a ceiling
x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
y = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
mm_s = timed(lambda: x @ y)
src = torch.empty(1 << (30 if dev.type == "cuda" else 24), dtype=torch.uint8, device=dev)
dst = torch.empty_like(src)
copy_s = timed(lambda: dst.copy_(src))
print(json.dumps({
    "benchmark": "gpu_peak", "torch": torch.__version__, "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "none (cpu)",
    "bf16_matmul_tflops": 2 * n ** 3 / mm_s / 1e12, "matmul": f"{n}x{n}x{n} bf16, random data",
    "copy_tb_per_s": 2 * src.numel() / copy_s / 1e12, "copy": f"{src.numel() >> 20} MiB device to device, read + written",
}))
