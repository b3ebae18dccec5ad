#!/usr/bin/env python3
"""The PyTorch peer of `lockstep-bench gpu-step` (bench-only: PyTorch is not a test dependency).

Times one training step of the same two models as gpu-step, in PyTorch eager:
  mlp-784-1024-1024-10, batch 256, and
  cnn-2conv-28x28: conv(32,3,pad=1)-bn-relu-maxpool(2)-conv(64,3,pad=1)-bn-relu-maxpool(2)-
                   flatten-linear(10), batch 128,
and on request (--models=resnet50-224) torchvision's ResNet-50, 1000 classes, on 3x224x224,
batch --resnet50-batch (64), in channels_last memory format (PyTorch's fastest for convolutions
on tensor cores; --channels-last=0 turns it off),
each step as gpu-step runs it: the batch copied from (pageable) host memory, zero_grad, forward,
softmax cross-entropy, backward, SGD (lr 0.01, momentum 0.9, weight decay 5e-4). Precisions:
fp32 (TF32 off), tf32 (TF32 matmuls and convolutions) and bf16 (torch.autocast). Each figure is
the median over --reps steps after --warmup, each step timed with CUDA events (wall clock on a
CPU).

  python3 bench/gpu_torch.py                       # cuda, fp32 tf32 bf16
  python3 bench/gpu_torch.py --device=cpu --reps=5 --precisions=fp32
  python3 bench/gpu_torch.py --models=resnet50-224 --precisions=bf16 --reps=20 --warmup=5
Prints one JSON record per model and precision (stdout) and a table (stderr).
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn


def mlp():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 10))


def resnet50():
    import torchvision  # only this model needs it
    return torchvision.models.resnet50(num_classes=1000)


MODELS = {"mlp-784-1024-1024-10": (mlp, (784,), 256), "cnn-2conv-28x28": (cnn, (1, 28, 28), 128)}
OPTIONAL = {"resnet50-224": (resnet50, (3, 224, 224), 64)}
CHANNELS_LAST = True


def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def time_model(name, precision, device, warmup, reps):
    build, sample, batch = {**MODELS, **OPTIONAL}[name]
    torch.manual_seed(1)
    model = build().to(device)
    images = len(sample) == 3 and sample[0] == 3
    if images and CHANNELS_LAST:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x_host = torch.rand((batch,) + sample)
    y_host = torch.arange(batch) % 10
    set_tf32(precision == "tf32")
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                              enabled=precision == "bf16")
    cuda = device.type == "cuda"

    def step():
        x = x_host.to(device)
        if images and CHANNELS_LAST:
            x = x.contiguous(memory_format=torch.channels_last)
        y = y_host.to(device)
        opt.zero_grad(set_to_none=False)
        with autocast:
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    ms = []
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            ms.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            step()
            ms.append((time.perf_counter() - t0) * 1e3)
    median = statistics.median(ms)
    return {"bench": "gpu_torch", "model": name, "precision": precision, "device": str(device),
            "batch": batch, "median_ms": median, "min_ms": min(ms),
            "samples_per_s": 1000.0 * batch / median,
            "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
            "torch": torch.__version__, "reps": reps, "warmup": warmup,
            "channels_last": bool(images and CHANNELS_LAST)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precisions", default="fp32,tf32,bf16")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    ap.add_argument("--resnet50-batch", type=int, default=64)
    ap.add_argument("--channels-last", type=int, default=1)
    a = ap.parse_args()
    global CHANNELS_LAST
    CHANNELS_LAST = a.channels_last != 0
    OPTIONAL["resnet50-224"] = (resnet50, (3, 224, 224), a.resnet50_batch)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_torch: --device=cuda but torch.cuda.is_available() is False")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none"
    rows = []
    for name in a.models.split(","):
        for precision in a.precisions.split(","):
            r = time_model(name, precision, device, a.warmup, a.reps)
            r["gpu"] = gpu
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(f"\nPyTorch {torch.__version__} on {gpu if gpu != 'none' else 'cpu'}", file=sys.stderr)
    print(f"{'model':22} {'precision':9} {'batch':>6} {'median ms':>10} {'samples/s':>12}",
          file=sys.stderr)
    for r in rows:
        print(f"{r['model']:22} {r['precision']:9} {r['batch']:6d} {r['median_ms']:10.3f} "
              f"{r['samples_per_s']:12.0f}", file=sys.stderr)


if __name__ == "__main__":
    main()
