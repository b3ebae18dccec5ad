#!/usr/bin/env python3
"""The PyTorch peer of `lockstep-bench gpt` (bench-only: PyTorch is not a test dependency).

Builds the same GPT-2 as lockstep's gpt(layers, heads, dim, ctx, vocab): token + position
embedding, pre-LN blocks (fused qkv projection, causal attention, GELU-tanh MLP), final
LayerNorm and an LM head tied to the token table; GPT-2/llm.c initialisation. One step is
zero_grad, forward, cross-entropy over all batch * seq positions and backward, exactly as the
lockstep benchmark times it; --optimizer=adamw adds torch.optim.AdamW (lr 3e-4, weight decay
0.1 on matrices only, as `lockstep-bench gpt --optimizer=adamw`). The result is the median over
--reps of the mean step time over --steps steps, after one warm-up step.

--ranks=N trains data-parallel: N processes (torch.multiprocessing, gloo, 127.0.0.1), each with
--threads threads and its own --batch of sequences, wrapped in DistributedDataParallel (default
buckets), the peer of `mpirun -np N lockstep-train`; tokens/s counts all ranks' tokens, timed
on rank 0 (every step ends in the gradient allreduce, so the ranks move together).

Attention is what each PyTorch version offers eagerly: F.scaled_dot_product_attention
(is_causal) where it exists (2.x; on a GPU its flash/memory-efficient kernels), otherwise
(1.13, Debian's) the explicit masked softmax of nanoGPT/minGPT.

  python3 bench/gpt_torch.py --model=gpt-mini --batch=8 --seq=256 --vocab=256 --threads=2
  python3 bench/gpt_torch.py --layers=12 --heads=12 --dim=768 --ctx=1024 --vocab=50257 \
      --batch=8 --seq=1024 --device=cuda --dtype=bf16
Prints one JSON record (stdout) and a summary line (stderr).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_setup  # noqa: E402

# glibc's malloc thresholds and the thread caps (OpenMP, MKL, Debian's OpenBLAS), before torch
# loads: bench/torch_setup.py.
torch_setup.prepare(default_threads=2)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

PRESETS = {  # as src/nn/model.cpp's kGptPresets; vocab None: from --vocab
    "gpt2-124m": (12, 12, 768, 1024, 50257),
    "gpt2-350m": (24, 16, 1024, 1024, 50257),
    "gpt-mini": (4, 4, 256, 256, None),
    "gpt-tiny": (2, 2, 128, 128, None),
}


class Block(nn.Module):
    def __init__(self, dim, heads, ctx):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim)
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.attn_proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp_proj = nn.Linear(4 * dim, dim)
        self.sdpa = hasattr(F, "scaled_dot_product_attention")
        if not self.sdpa:  # a plain attribute, not a buffer: gloo cannot broadcast bool (DDP)
            self.mask = torch.tril(torch.ones(ctx, ctx, dtype=torch.bool))

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, heads, dim, ctx, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, ctx) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))
            elif name == "wpe.weight":
                nn.init.normal_(p, 0.0, 0.01)
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt-mini", help="a preset, or 'custom' with the sizes")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--dim", type=int)
    ap.add_argument("--ctx", type=int)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: autocast (GPU runs)")
    ap.add_argument("--optimizer", default="none", choices=["none", "adamw"])
    ap.add_argument("--ranks", type=int, default=1, help="DDP processes (CPU, gloo)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (inductor, default mode); the warm-up step "
                         "compiles, and its time is recorded as compile_s")
    a = ap.parse_args()
    if a.compile and a.ranks > 1:
        ap.error("--compile is for one process (--ranks=1)")
    layers, heads, dim, ctx, vocab = PRESETS.get(a.model, (None,) * 5)
    layers, heads, dim = a.layers or layers, a.heads or heads, a.dim or dim
    ctx = a.ctx or ctx or a.seq
    vocab = vocab or a.vocab
    if None in (layers, heads, dim):
        ap.error("give a preset (--model) or --layers, --heads and --dim")
    if a.seq > ctx:
        ap.error(f"--seq {a.seq} is longer than the model's ctx {ctx}")

    if a.ranks > 1:
        if a.device != "cpu":
            ap.error("--ranks > 1 is the CPU DDP peer: --device=cpu")
        import torch_ddp
        torch_ddp.spawn(run, (a, (layers, heads, dim, ctx, vocab)), a.ranks)
    else:
        run(0, a, (layers, heads, dim, ctx, vocab))


def run(rank, a, sizes):
    layers, heads, dim, ctx, vocab = sizes
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    device = torch.device(a.device)
    model = GPT(layers, heads, dim, ctx, vocab).to(device)
    params = sum(p.numel() for p in model.parameters())  # the tied table once
    net = model
    if a.ranks > 1:
        net = nn.parallel.DistributedDataParallel(model)
    if a.compile:
        net = torch.compile(model)
    optimizer = None
    if a.optimizer == "adamw":
        matrices = [p for p in model.parameters() if p.dim() >= 2]
        others = [p for p in model.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1},
                                       {"params": others, "weight_decay": 0.0}], lr=3e-4)
    g = torch.Generator().manual_seed(7 + rank)
    x = torch.randint(0, vocab, (a.batch, a.seq), generator=g).to(device)
    y = torch.randint(0, vocab, (a.batch, a.seq), generator=g).to(device)
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16)
                if a.dtype == "bf16" else None)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step():
        model.zero_grad(set_to_none=False)
        if autocast is not None:
            with autocast:
                loss = net(x, y)
        else:
            loss = net(x, y)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        return loss

    t_first = time.perf_counter()
    loss = step()
    sync()
    compile_s = time.perf_counter() - t_first
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        sync()
        times.append((time.perf_counter() - t0) / a.steps)
    if rank != 0:
        return
    step_s = statistics.median(times)
    tokens = a.batch * a.seq * a.ranks
    record = {
        "benchmark": "gpt_torch", "torch": torch.__version__,
        "load_average": " ".join(open("/proc/loadavg").read().split()[:3]),
        "config": {"model": a.model, "layers": layers, "heads": heads, "dim": dim, "ctx": ctx,
                   "vocab": vocab, "batch": a.batch, "seq": a.seq, "threads": a.threads,
                   "device": a.device, "dtype": a.dtype, "steps_per_rep": a.steps,
                   "optimizer": a.optimizer, "ranks": a.ranks, "compile": a.compile,
                   "reps": a.reps, "parameters": params,
                   "attention": "sdpa" if hasattr(F, "scaled_dot_product_attention")
                   else "masked-softmax"},
        "step_ms_per_rep": [t * 1e3 for t in times],
        "step_ms": step_s * 1e3, "tokens_per_s": tokens / step_s, "loss": float(loss),
    }
    if a.compile:
        record["compile_s"] = compile_s
    if device.type == "cuda":
        record["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    print(json.dumps(record))
    print(f"torch {torch.__version__} gpt {a.model} ({params} parameters) batch {a.batch} x seq "
          f"{a.seq}, vocab {vocab}, {a.device}, {a.ranks} rank(s) x {a.threads} thread(s), "
          f"optimizer {a.optimizer}{', compiled' if a.compile else ''}: {step_s * 1e3:.2f} ms/step, "
          f"{tokens / step_s:.0f} tokens/s (load {record['load_average']})", file=sys.stderr)


if __name__ == "__main__":
    main()
