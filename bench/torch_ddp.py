"""Shared by the bench-only PyTorch DDP peers (bench/gpt_torch.py, bench/precision_torch.py):
N processes on this host (torch.multiprocessing), joined in a gloo process group that meets on a
free 127.0.0.1 port, the peer of `mpirun -np N` on one node. Each process runs fn(rank, *args)."""
import os
import socket


def spawn(fn, args, nprocs):
    import torch.multiprocessing as mp
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(fn, args, nprocs, port), nprocs=nprocs)


def _rank(rank, fn, args, nprocs, port):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=nprocs)
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()
