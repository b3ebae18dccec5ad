#!/usr/bin/env python3
"""The PyTorch peer of bench/vs-torch.sh (bench-only: PyTorch is never a lockstep dependency).

  torch_peer.py MODEL --threads T --precision fp32|bf16 [--mode eager|compile] [--ranks N]
                [--batch B] [--steps S] [--reps R] [--channels-last]

MODEL is one of the models lockstep-bench times, built the same way:
  mlp       784-1024-1024-10 (lockstep's mlp:1024,1024), input [B,1,28,28], batch 256
  cnn       configs/fashion_cnn.ini's net: conv(32,3,pad=1)-bn-relu-maxpool(2)-conv(64,3,pad=1)-
            bn-relu-maxpool(2)-flatten-dropout(0.25)-linear(128)-relu-linear(10), [B,1,28,28], 128
  resnet18  torchvision.models.resnet18(num_classes=10) (ImageNet stem) on [B,3,32,32], batch 64
  resnet50  torchvision.models.resnet50(num_classes=1000) on [B,3,224,224], batch 16
  gpt-mini  bench/gpt_torch.py's GPT-2 (4 layers, 4 heads, dim 256, vocab 256), 8 x 256 tokens
One step is zero_grad, forward, loss (cross-entropy), backward and the optimizer: SGD lr 0.01
momentum 0.9 (AdamW lr 3e-4, weight decay 0.1 on matrices, for gpt-mini, as
`lockstep-bench gpt --optimizer=adamw`), on one batch of random inputs reused every step, as
lockstep-bench does. The figure is the median over --reps of the mean step time of --steps steps,
after warm-up steps (which include torch.compile's compilation).

PyTorch's best CPU settings, each recorded in the JSON line:
  - threads: torch.set_num_threads(T) and OMP/MKL/OpenBLAS capped at T before torch loads;
  - bf16: torch.autocast('cpu', dtype=torch.bfloat16) around forward and loss (oneDNN bf16);
  - optimizers: the fused CPU kernels (SGD/AdamW fused=True) where the version has them, else
    foreach, else the loop;
  - malloc: glibc's mmap and trim thresholds raised to 1 GiB (TORCH_MALLOC=tuned, the default),
    so temporaries are not faulted in again each step (PyTorch's tuning guide gets the same from
    jemalloc/tcmalloc; see bench/precision_torch.py for the measured effect);
  - --channels-last (convolutional models): the model and its input in torch.channels_last
    (NHWC), the layout PyTorch's performance guide recommends for convolutions with oneDNN and
    cuDNN, and what lockstep's model.channels_last = auto runs them in;
  - --mode compile: torch.compile(model) with the default inductor backend (C++/OpenMP kernels;
    forward and backward through AOTAutograd; for --ranks > 1 the DDP-wrapped module is compiled,
    which DDPOptimizer splits at bucket boundaries); the optimizer runs eagerly (fused).
--ranks N (N >= 2): N processes (torch.multiprocessing, gloo on 127.0.0.1), each with --threads
threads and its own --batch, in DistributedDataParallel (default buckets); samples/s counts all
ranks' samples, timed on rank 0. Prints one JSON line.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_setup  # noqa: E402

torch_setup.prepare(default_threads=1)  # malloc thresholds, thread caps: before torch loads

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import gpt_torch  # noqa: E402  (the same GPT-2 as lockstep's gpt(...))

BATCH = {"mlp": 256, "cnn": 128, "resnet18": 64, "resnet50": 16, "gpt-mini": 8}
GPT_MINI = (4, 4, 256, 256, 256)  # layers, heads, dim, ctx, vocab (bench/gpt-cpu.sh's shape)
GPT_SEQ = 256


def build(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(),
                             nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)), "torch.nn"
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Dropout(0.25), nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
            nn.Linear(128, 10)), "torch.nn"
    if name in ("resnet18", "resnet50"):
        import torchvision
        model = getattr(torchvision.models, name)(num_classes=10 if name == "resnet18" else 1000)
        return model, f"torchvision {torchvision.__version__}"
    return gpt_torch.GPT(*GPT_MINI), "bench/gpt_torch.py"


def optimizer_for(name, model):
    """The fused CPU optimizer where this PyTorch has it, else foreach, else the loop."""
    if name == "gpt-mini":
        matrices = [p for p in model.parameters() if p.dim() >= 2]
        others = [p for p in model.parameters() if p.dim() < 2]
        groups = [{"params": matrices, "weight_decay": 0.1}, {"params": others,
                                                               "weight_decay": 0.0}]
        make = lambda **kw: torch.optim.AdamW(groups, lr=3e-4, **kw)  # noqa: E731
    else:
        make = lambda **kw: torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9,  # noqa
                                            **kw)
    for kind, kw in (("fused", {"fused": True}), ("foreach", {"foreach": True}), ("loop", {})):
        try:
            return make(**kw), kind
        except (RuntimeError, TypeError, ValueError):
            continue
    raise RuntimeError("no optimizer")


def run(rank, a):
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model, source = build(a.model)
    model.train()
    memory_format = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    opt, opt_kind = optimizer_for(a.model, model)
    net = model
    if a.ranks > 1:
        net = nn.parallel.DistributedDataParallel(model)
    if a.mode == "compile":
        net = torch.compile(net)
    g = torch.Generator().manual_seed(7 + rank)
    batch = a.batch or BATCH[a.model]
    if a.model == "gpt-mini":
        vocab = GPT_MINI[4]
        x = torch.randint(0, vocab, (batch, GPT_SEQ), generator=g)
        y = torch.randint(0, vocab, (batch, GPT_SEQ), generator=g)
        loss_of = lambda: net(x, y)  # noqa: E731  (the model computes its own loss)
    else:
        shape = {"resnet18": (batch, 3, 32, 32), "resnet50": (batch, 3, 224, 224)}.get(
            a.model, (batch, 1, 28, 28))
        x = (torch.rand(shape, generator=g) * 2 - 1).contiguous(memory_format=memory_format)
        y = torch.arange(batch) % (1000 if a.model == "resnet50" else 10)
        loss_fn = nn.CrossEntropyLoss()
        loss_of = lambda: loss_fn(net(x), y)  # noqa: E731
    bf16 = a.precision == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of()
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    for _ in range(a.warmup):  # allocations, oneDNN primitives, torch.compile's compilation
        step()
    warmup_s = time.perf_counter() - t0
    times, cpu = [], []
    for _ in range(a.reps):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(a.steps):
            loss = step()
        times.append((time.perf_counter() - t0) / a.steps)
        cpu.append((time.process_time() - c0) / a.steps)
    if rank != 0:
        return
    ms = statistics.median(times) * 1e3
    samples = a.ranks * batch
    out = {"bench": "torch_peer", "model": a.model, "model_source": source,
           "precision": a.precision, "mode": a.mode, "threads": a.threads, "ranks": a.ranks,
           "batch": batch, "step_ms": ms, "step_ms_per_rep": [t * 1e3 for t in times],
           "step_cpu_ms": statistics.median(cpu) * 1e3, "samples_per_s": samples / (ms / 1e3),
           "warmup_s": warmup_s, "final_loss": loss.item(), "torch": torch.__version__,
           "optimizer": opt_kind, "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
           "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
           "cpu_capability": torch.backends.cpu.get_cpu_capability()
           if hasattr(torch.backends, "cpu") else "?",
           "ddp": "DistributedDataParallel, gloo, default buckets" if a.ranks > 1 else "",
           "channels_last": a.channels_last}
    if a.mode == "compile":
        try:  # what dynamo compiled: graphs, and graph breaks (0 for a whole-model capture)
            from torch._dynamo.utils import counters
            out["compiled_graphs"] = int(counters["stats"]["unique_graphs"])
            out["graph_breaks"] = int(sum(counters["graph_break"].values()))
        except Exception as e:  # noqa: BLE001  (private API; the figure stands without it)
            out["compiled_graphs"] = f"unknown: {e}"
    if a.model == "gpt-mini":
        out["tokens_per_s"] = out["samples_per_s"] * GPT_SEQ
    print(json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=["mlp", "cnn", "resnet18", "resnet50", "gpt-mini"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--mode", choices=["eager", "compile"], default="eager")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--batch", type=int, default=0, help="per rank; 0: the model's default")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--channels-last", action="store_true",
                   help="model and input in torch.channels_last (convolutional models)")
    a = p.parse_args()
    if a.channels_last and a.model in ("mlp", "gpt-mini"):
        sys.exit(f"torch_peer.py: --channels-last is for convolutional models, not {a.model}")
    if a.mode == "compile" and not hasattr(torch, "compile"):
        sys.exit(f"torch_peer.py: torch.compile needs PyTorch 2.0 or later; this is "
                 f"{torch.__version__} (MODES=eager)")
    if a.ranks > 1:
        import torch_ddp
        torch_ddp.spawn(run, (a,), a.ranks)
    else:
        run(0, a)


if __name__ == "__main__":
    main()
