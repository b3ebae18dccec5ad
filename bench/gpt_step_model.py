#!/usr/bin/env python3
"""A gpt2-124m training step on one GPU, kernel by kernel, as lockstep's CUDA path runs it today
(train.precision = bf16: bf16 GEMM inputs through cuBLASLt with the bias, c_fc's GELU, the bias
gradients and the GELU's backward in the GEMMs' epilogues and the first residual sum in ln_2's
pass; bf16 activations between a block's layers, written by the GEMMs and LayerNorms and read by
the next op, with the residual stream, its gradient and the head's input in f32; cuDNN's fused
bf16 attention, which train.attention = auto picks there, or with --attention=reference
lockstep's own attention kernels, reading bf16 and computing in f32; the LM head and loss fused
chunk by chunk over the vocabulary padded to 50304, or with --head=logits the f32 [B*T, V] logits
the loss worked in before): each kernel's FLOPs and bytes, and the time it needs at the ceilings
below. A prediction by counting, to hold against the first measured run (bench/gpu-check.sh,
lockstep-bench gpt --device=cuda:0): not a measurement. --activations=f32 counts the path before
bf16 activations (f32 between layers: each linear casting its input and output gradient to bf16,
casts around cuDNN's attention); --unfused the path before the fused layer ops as well (separate
bias, GELU, sum_rows and residual-add kernels).

Ceilings (H200). Two are readings PyTorch gave on the H200 machines this project may be lent
(not yet measured by lockstep): an 8192^3 bf16 matrix product at about 790 TFLOP/s and a
device-to-device copy at about 4.3 TB/s. Assumed from them: bf16 GEMMs at 600 TFLOP/s (K = 768
is short), 300 where V = 50257 leaves the LM head's operands misaligned; memory-bound kernels at
3.5 TB/s; the fp32 attention at 25 TFLOP/s (37% of the 67 TFLOP/s fp32 peak,
usual for a hand-written flash kernel on CUDA cores); cuDNN's fused bf16 attention at 250 TFLOP/s
forward and backward. That last is from FlashAttention-3's paper (Shah et al., 2024, H100 SXM5,
whose tensor-core rate the H200 shares), which measured cuDNN at head width 64 and 1k tokens at
about 258 TFLOP/s forward and 348 backward; the backward is taken lower since lockstep asks for
cuDNN's deterministic algorithm, which writes dP through a [B, heads, T, T] bf16 workspace
(counted in its bytes) instead of accumulating dQ atomically. sum_rows, whose grid was cols / 32 blocks
(24-96 on 132 SMs: 3.8 ms a step), now also splits the rows into slices of 256 (768-3072 blocks),
so it is counted as memory-bound like the rest, plus the slices' sums it writes and reads. A GEMM
with an epilogue is counted as the GEMM plus the epilogue's extra traffic (c_fc's GELU input
written as the aux matrix, read back by c_proj's input-gradient GEMM), at the same ceilings.
Weights are cast to bf16 once per step (the Context's reuse window), not once per GEMM; with bf16
activations the biases too (cuBLASLt's epilogue reads a bf16 output's bias in bf16). A backward
GEMM pair is counted as dX (reads dy and W, writes dX in the activations' type) and dW (reads dy
and x, writes the f32 gradient).

The fused head (nn::TiedLmHead::forward_loss) takes --chunk rows at a time (nn::loss_chunk_rows:
512 for GPT-2): per chunk the logits GEMM and dh read the bf16 table and the table's gradient is read and
written in f32, so each chunk moves about 0.46 GB besides its rows' own traffic; fewer, larger
chunks are faster, smaller ones hold less.

Usage: python3 bench/gpt_step_model.py [--batch=8] [--seq=1024] [--attention=cudnn|reference]
           [--activations=bf16|f32] [--residual=f32|bf16] [--unfused] [--head=fused|logits]
           [--chunk=512]   prints a Markdown table.
"""
import argparse

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--attention", choices=["cudnn", "reference"], default="cudnn")
p.add_argument("--activations", choices=["bf16", "f32"], default="bf16",
               help="f32: the path before bf16 activations (casts around the GEMMs and cuDNN)")
p.add_argument("--residual", choices=["f32", "bf16"], default="f32",
               help="bf16: what a bf16 residual stream (llm.c's) would move instead, for comparison "
               "(lockstep keeps it f32: docs/GPT.md)")
p.add_argument("--unfused", action="store_true",
               help="the path before the fused layer ops (and before bf16 activations): separate "
               "bias, GELU and sum_rows kernels")
p.add_argument("--head", choices=["fused", "logits"], default="fused")
p.add_argument("--chunk", type=int, default=512)
a = p.parse_args()
B, T, C, L, V, H = a.batch, a.seq, 768, 12, 50257, 12
VP = (V + 127) // 128 * 128  # the padded vocabulary: 50304
N, d = B * T, C // H
P = 124_439_808  # parameters (the tied table counted once)
F4, B2 = 4, 2
GEMM, GEMM_MISALIGNED, BW, ATT, PEAK = 600e12, 300e12, 3.5e12, 25e12, 790e12
ATT_CUDNN = 250e12
FUSED = not a.unfused
ACT16 = FUSED and a.activations == "bf16"
A = B2 if ACT16 else F4  # bytes of an activation between a block's layers (and its gradient)
RS = B2 if ACT16 and a.residual == "bf16" else F4  # bytes of the residual stream and its gradient
rows = []  # name, launches per step, FLOPs each, bytes each, kind


def gemm(name, m, n, k, count, misaligned=False, extra_bytes=0, out_bytes=F4):
    rows.append((name, count, 2 * m * n * k, (m * k + k * n) * B2 + m * n * out_bytes + extra_bytes,
                 "gemm_mis" if misaligned else "gemm"))


def gemm_backward(name, n, k, count, extra_bytes=0):
    """dX [N, k] = dy [N, n] W [n, k] in the activations' type and dW [n, k] = dy^T x in f32, both
    from bf16 operands: one row of 2 launches, each counted at the pair's mean bytes."""
    dx = (N * n + n * k) * B2 + N * k * A
    dw = (N * n + N * k) * B2 + n * k * F4
    rows.append((name, count, 2 * N * n * k, (dx + dw) / 2 + extra_bytes, "gemm"))


def mem(name, nbytes, count, kind="mem"):
    rows.append((name, count, 0, nbytes, kind))


linear_in = [C, C, C, 4 * C]    # inputs of c_attn, attn c_proj, c_fc, mlp c_proj
linear_out = [3 * C, C, 4 * C, C]
mean_in, mean_out = sum(linear_in) / 4, sum(linear_out) / 4
mean_weight = sum(i * o for i, o in zip(linear_in, linear_out)) / 4
att_flops = 4 * B * H * (T * (T + 1) / 2) * d  # q.k and p.v over the causal prefix
aux = N * 4 * C * A  # c_fc's GELU input, [N, 4C]: written by its GEMM, read by c_proj's dX
act = "bf16" if ACT16 else "f32"
res = "bf16" if RS == B2 else "f32"
# forward, per block
if FUSED:
    mem(f"layernorm forward (ln_1: x {res} read, {act} written)", N * C * (RS + A) + 2 * N * F4, L)
    mem(f"residual add + ln_2 in one pass (x {res}, a {act} read; x1 {res}, ln_2(x1) {act} "
        "written)", N * C * (2 * RS + 2 * A) + 2 * N * F4, L)
else:
    mem("layernorm forward (ln_1, ln_2)", 2 * N * C * F4 + 2 * N * F4, 2 * L)
if not ACT16:
    mem("cast of a linear's input to bf16", N * mean_in * (F4 + B2), 4 * L)
if ACT16:
    mem("cast of a weight and its bias to bf16 (once a step: the reuse window)",
        (mean_weight + mean_out) * (F4 + B2), 4 * L)
else:
    mem("cast of a weight to bf16 (once a step: the reuse window)", mean_weight * (F4 + B2), 4 * L)
if FUSED:
    for name, k, n, epi in [("c_attn", C, 3 * C, "BIAS"), ("attn c_proj", C, C, "BIAS"),
                            ("c_fc", C, 4 * C, "GELU_AUX_BIAS"), ("mlp c_proj", 4 * C, C, "BIAS")]:
        gemm(f"GEMM forward, {name} [N,{k}]x[{k},{n}] + {epi} epilogue, {act} out"
             + (" (GELU input kept)" if name == "c_fc" else ""), N, n, k, L,
             extra_bytes=aux if name == "c_fc" else 0, out_bytes=A)
else:
    for name, k, n in [("c_attn", C, 3 * C), ("attn c_proj", C, C), ("c_fc", C, 4 * C),
                       ("mlp c_proj", 4 * C, C)]:
        gemm(f"GEMM forward, {name} [N,{k}]x[{k},{n}]", N, n, k, L)
    mem("bias add", 2 * N * mean_out * F4, 4 * L)
if a.attention == "reference":
    rows.append((f"attention forward (own flash kernel, {act} in and out, f32 arithmetic)", L,
                 att_flops, (N * 3 * C + N * C) * A + B * H * T * F4, "att"))
else:
    if not ACT16:
        mem("casts around cuDNN's attention forward (qkv to bf16, out to f32)",
            (N * 3 * C + N * C) * (F4 + B2), L)
    rows.append(("attention forward (cuDNN fused flash, bf16)", L, att_flops,
                 (N * 3 * C + N * C) * B2 + B * H * T * F4, "att_cudnn"))
if FUSED:
    mem(f"residual add (block output: x1 {res} + m {act})", N * C * (2 * RS + A), L)
else:
    mem("residual add", 3 * N * C * F4, 2 * L)
    mem("GELU forward", 2 * N * 4 * C * F4, L)
# backward, per block
if FUSED:
    for name, k, n, epi in [("c_attn", C, 3 * C, ""), ("attn c_proj", C, C, ""),
                            ("c_fc", C, 4 * C, ""), ("mlp c_proj", 4 * C, C, ", DGELU on dX")]:
        gemm_backward(f"GEMM backward dX ({act}) and dW, {name} (BGRADB on dW{epi})", n, k,
                      2 * L, extra_bytes=aux / 2 if name == "mlp c_proj" else 0)
else:
    for name, k, n in [("c_attn", C, 3 * C), ("attn c_proj", C, C), ("c_fc", C, 4 * C),
                       ("mlp c_proj", 4 * C, C)]:
        gemm_backward(f"GEMM backward dX and dW, {name}", n, k, 2 * L)
if not ACT16:
    mem("cast of a linear's dy to bf16", N * mean_out * (F4 + B2), 4 * L)
elif RS == F4:  # the projections' dy is the f32 residual gradient; the others' is bf16 already
    mem("cast of the residual gradient to bf16 (attn and mlp c_proj's dy)", N * C * (F4 + B2),
        2 * L)
if not FUSED:
    mem("bias gradient, sum_rows (slices of 256 rows, then their sum)",
        N * mean_out * F4 + 2 * (N // 256) * mean_out * F4, 4 * L)
if a.attention == "reference":
    rows.append((f"attention backward (own kernels, {act} in and out; P recomputed)", L,
                 2.5 * att_flops, (N * 3 * C * 2 + N * C * 2) * A, "att"))
else:
    if not ACT16:
        mem("casts around cuDNN's attention backward (qkv, out, dout to bf16; dqkv to f32)",
            (2 * N * 3 * C + 2 * N * C) * (F4 + B2), L)
    rows.append(("attention backward (cuDNN fused flash, bf16, deterministic: dP workspace)", L,
                 2.5 * att_flops,
                 (2 * N * 3 * C + 2 * N * C) * B2 + B * H * T * F4 + 2 * B * H * T * T * B2,
                 "att_cudnn"))
if not FUSED:
    mem("GELU backward", 3 * N * 4 * C * F4, L)
mem(f"layernorm backward dX + residual (x, residual gradient {res}, dy {act} read; dx {res})",
    N * C * (3 * RS + A), 2 * L)
mem("layernorm parameter partials and their sum", N * C * (RS + A), 2 * L)
# embedding, head, loss, optimizer
mem("embedding forward (wte and wpe gather)", 3 * N * C * F4, 1)
mem("final layernorm forward and backward", 6 * N * C * F4, 1)
if a.head == "logits":
    mem("casts for the LM head (ln_f output for forward and dW; wte once a step)",
        2 * N * C * (F4 + B2) + V * C * (F4 + B2), 1)
    gemm("GEMM LM head forward [N,768]x[768,50257] (misaligned)", N, V, C, 1, misaligned=True)
    mem("softmax cross-entropy forward (logits -> probabilities, loss)", 2 * N * V * F4, 1)
    mem("softmax cross-entropy backward (probabilities -> dlogits)", 2 * N * V * F4, 1)
    mem("cast of dlogits to bf16", N * V * (F4 + B2), 1)
    gemm("GEMM LM head backward dX and dW (misaligned)", N, V, C, 2, misaligned=True)
else:
    R = min(a.chunk or N, N)
    chunks = -(-N // R)
    mem("casts for the LM head (ln_f output once; wte once, the step's reused copy)",
        N * C * (F4 + B2) + VP * C * (F4 + B2), 1)
    gemm(f"GEMM LM head forward, a chunk [{R},768]x[768,{VP}]", R, VP, C, chunks)
    mem("fused softmax cross-entropy of a chunk (logits -> dlogits in place, row losses)",
        2 * R * VP * F4 + R * 8, chunks)
    mem("cast of a chunk's dlogits to bf16 (once, for both GEMMs)", R * VP * (F4 + B2), chunks)
    rows.append((f"GEMM table gradient += dlogits^T h, a chunk (f32 gradient read and written)",
                 chunks, 2 * VP * C * R, (VP * R + R * C) * B2 + 2 * VP * C * F4, "gemm"))
    gemm(f"GEMM dh = dlogits[:, :V] wte[:V], a chunk (gemm_leading)", R, C, V, chunks)
    mem("mean of the row losses", N * 8, 1)
mem("embedding backward (token scatter, position gradients)", 3 * N * C * F4, 1)
mem("zero_grad (one fill of the flat gradients)", P * F4, 1)
mem("gradient sum of squares (the deferred check)", P * F4, 1)
mem("fused AdamW (p, g, m, v read; p, m, v written)", 7 * P * F4, 1)

total_t = total_f = total_b = 0.0
print("| kernel | launches | GFLOP | GB moved | predicted ms |")
print("|---|---:|---:|---:|---:|")
for name, count, flops, nbytes, kind in rows:
    if kind == "gemm":
        t = max(flops / GEMM, nbytes / BW)
    elif kind == "gemm_mis":
        t = max(flops / GEMM_MISALIGNED, nbytes / BW)
    elif kind == "att":
        t = max(flops / ATT, nbytes / BW)
    elif kind == "att_cudnn":
        t = max(flops / ATT_CUDNN, nbytes / BW)
    else:
        t = nbytes / BW
    total_t += t * count
    total_f += flops * count
    total_b += nbytes * count
    print(f"| {name} | {count} | {flops * count / 1e9:.0f} | {nbytes * count / 1e9:.2f} | "
          f"{t * count * 1e3:.2f} |")
print(f"| **step** | | **{total_f / 1e9:.0f}** | **{total_b / 1e9:.1f}** | **{total_t * 1e3:.1f}** |")
# MFU counts the model's FLOPs: the padded vocabulary's extra columns are work, not model.
model_f = total_f - (6 * N * (VP - V) * C if a.head == "fused" else 0)
print(f"\nB = {B}, T = {T}: {N / total_t:,.0f} tokens/s, MFU {model_f / (total_t * PEAK):.1%} of "
      f"the measured {PEAK / 1e12:.0f} TFLOP/s bf16 peak")
