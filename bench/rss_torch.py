#!/usr/bin/python3
"""The PyTorch peer of bench/rss.sh (bench-only; Debian's python3-torch, not a test dependency).

Peak RSS per rank of PyTorch DDP on lockstep's fashion_mlp: MLP 784-1024-1024-10, SGD (lr 0.05,
momentum 0.9, weight decay 1e-4), global batch 128, 2 ranks x 1 thread, gloo, Fashion-MNIST read
from Debian's idx files. The images are kept as u8 and normalised per batch (what lockstep does),
or with --float as one float32 tensor (what torchvision's ToTensor() pipeline amounts to).

  /usr/bin/python3 bench/rss_torch.py [--ranks 2] [--steps 400] [--float]

Prints one line per rank: its peak RSS (ru_maxrss, the same VmHWM lockstep reports) in MiB.
"""
import argparse
import gzip
import os
import resource

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DATA = "/usr/share/datasets/fashion-mnist"


def idx(name, offset):
    with gzip.open(os.path.join(DATA, name), "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def rank_main(rank, args, out):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29571")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(1)
    x = torch.from_numpy(idx("train-images-idx3-ubyte.gz", 16).copy()).view(-1, 784)
    y = torch.from_numpy(idx("train-labels-idx1-ubyte.gz", 8).copy()).long()
    if args.float:
        x = x.float().div_(255.0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    # fashion_mlp.ini's linear warm-up over 200 steps (its cosine decay is irrelevant to memory)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 200))
    local = 128 // args.ranks
    g = torch.Generator().manual_seed(1)
    perm = torch.randperm(x.shape[0], generator=g)
    for step in range(args.steps):
        i = perm[(step * 128 + rank * local) % (x.shape[0] - 128):][:local]
        xb = x[i].float()
        if not args.float:
            xb = xb / 255.0
            xb = (xb - xb.mean()) / (xb.std() + 1e-6)
        loss = torch.nn.functional.cross_entropy(ddp(xb), y[i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    out.put((rank, peak, float(loss)))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--float", action="store_true")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args, out)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    rows = sorted(out.get() for _ in procs)
    for p in procs:
        p.join()
    data = "float32 copy" if args.float else "u8, normalised per batch"
    print(f"PyTorch {torch.__version__} DDP (gloo), {args.ranks} ranks x 1 thread, {args.steps} "
          f"steps, data {data}")
    for rank, peak, loss in rows:
        print(f"rank {rank}: peak RSS {peak:.1f} MiB (last loss {loss:.3f})")
    print(f"max: {max(r[1] for r in rows):.1f} MiB")


if __name__ == "__main__":
    main()
