#!/usr/bin/env python3
"""PyTorch side of bench/precision.sh (bench-only; Debian's python3-torch 1.13).

  precision_torch.py mlp --threads T --precision fp32|bf16 [--batch 256] [--steps 10] [--reps 5]
      Training steps of the MLP 784-1024-1024-10 (the model of `lockstep-bench mlp`: same
      widths, batch, SGD lr 0.01 momentum 0.9, random inputs in [-1, 1), labels i % 10). bf16 is
      torch.autocast('cpu', dtype=torch.bfloat16) around forward and loss, PyTorch's own
      mixed-precision recipe: bf16 matmuls on oneDNN, fp32 weights and optimizer.
      --ranks N (N >= 2) trains data-parallel: N processes (torch.multiprocessing, gloo on
      127.0.0.1), each with --threads threads and its own --batch, the model wrapped in
      DistributedDataParallel (default buckets): the peer of `mpirun -np N lockstep-train`.
      samples/s counts all ranks' samples, timed on rank 0 (every step ends in the gradient
      allreduce, so the ranks move together).
  precision_torch.py matmul --threads T --precision fp32|bf16
      A 1024^3 matmul, for the GFLOP/s next to `lockstep-bench ops`.

Each prints one JSON line: the median over --reps of the mean step (or call) time.

PyTorch gets glibc's malloc tuned and its threads capped before it loads (bench/torch_setup.py;
the JSON line records the malloc setting).
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_setup  # noqa: E402

torch_setup.prepare(default_threads=1)  # malloc thresholds, thread caps: before torch loads

import torch  # noqa: E402


def mlp(args, rank=0):
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(784, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if args.ranks > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    torch.manual_seed(1 + rank)  # each rank its own inputs
    x = torch.rand(args.batch, 1, 28, 28) * 2 - 1
    y = torch.arange(args.batch) % 10
    bf16 = args.precision == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):  # warm-up: allocations, oneDNN primitive creation
        step()
    times, cpu = [], []
    for _ in range(args.reps):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            loss = step()
        times.append((time.perf_counter() - t0) / args.steps)
        cpu.append((time.process_time() - c0) / args.steps)  # every thread of the process
    ms = statistics.median(times) * 1e3
    return {"bench": "torch-mlp", "precision": args.precision, "threads": args.threads,
            "ranks": args.ranks, "batch": args.batch, "step_ms": ms,
            "step_ms_per_rep": [t * 1e3 for t in times],
            "step_cpu_ms": statistics.median(cpu) * 1e3,
            "samples_per_s": args.ranks * args.batch / (ms / 1e3), "final_loss": float(loss),
            "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE", ""),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}


def matmul(args):
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    a = (torch.rand(1024, 1024) * 2 - 1).to(dtype)
    b = (torch.rand(1024, 1024) * 2 - 1).to(dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(args.reps):
        n = 10
        t0 = time.perf_counter()
        for _ in range(n):
            a @ b
        times.append((time.perf_counter() - t0) / n)
    s = statistics.median(times)
    return {"bench": "torch-matmul-1024", "precision": args.precision, "threads": args.threads,
            "ms": s * 1e3, "gflops": 2 * 1024 ** 3 / s * 1e-9}


def mlp_rank(rank, args):
    torch.set_num_threads(args.threads)
    out = mlp(args, rank)
    if rank == 0:
        out["torch"] = torch.__version__
        out["ddp"] = "DistributedDataParallel, gloo, default buckets"
        print(json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["mlp", "matmul"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ranks", type=int, default=1, help="DDP processes (mlp only; gloo)")
    args = p.parse_args()
    if args.ranks > 1:
        if args.what != "mlp":
            p.error("--ranks > 1 is for mlp")
        import torch_ddp
        torch_ddp.spawn(mlp_rank, (args,), args.ranks)
        return
    torch.set_num_threads(args.threads)
    out = mlp(args) if args.what == "mlp" else matmul(args)
    out["torch"] = torch.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
