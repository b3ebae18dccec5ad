#!/usr/bin/env bash
# Activation recompute (train.recompute = none | gelu | block): what it saves and what it costs.
# For each model, `lockstep-bench gpt --recompute=MODE` runs the same forward + loss + backward
# steps in one process per mode and reports the allocator's activation peak (every activation,
# the loss's buffers and the layers' reused buffers; parameters and gradients excluded) and the
# step time; the three modes of a model are interleaved REPS times (load drifts alike), and the
# figures are medians. The loss's buffer does not depend on the mode, so the blocks' share is
# given too: (mode - loss buffer) / (none - loss buffer). The loss buffer is the fused loss's
# chunk of logits over the padded vocabulary, min(chunk, B*T) x Vp x 4 bytes (the bench reports
# the chunk: nn::loss_chunk_rows, 512 rows for GPT-2), and its f64 row losses, B*T x 8 (Vp = V
# rounded up to a multiple of 128); with LOSS=logits
# (lockstep-bench gpt --loss=logits, the path before the fused loss) the [B*T, V] f32 logits.
# Target (issue 26): block <= 40% of none.
#   bench/recompute.sh                             gpt-mini (batch 8 x 256, vocab 256) and
#                                                  gpt2-124m (batch 1 x 1024, vocab 50257)
#   MODELS="gpt-mini:8:256:256" REPS=5 bench/recompute.sh     model:batch:seq:vocab, space-separated
#   DEVICE=cuda:0 MODELS="gpt2-124m:8:1024:50257" PRECISION=bf16 bench/recompute.sh
# Settings: THREADS (2), STEPS (1 per repetition), REPS (3), DEVICE (cpu), PRECISION (fp32),
#   LOSS (fused), OUT (results/recompute). Writes $OUT/runs.jsonl and $OUT/summary.txt; prints the summary.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${LOCKSTEP_BUILD_DIR:-$ROOT/build}
BENCH=$BUILD/apps/lockstep-bench
MODELS=${MODELS:-gpt-mini:8:256:256 gpt2-124m:1:1024:50257}
THREADS=${THREADS:-2}
STEPS=${STEPS:-1}
REPS=${REPS:-3}
DEVICE=${DEVICE:-cpu}
PRECISION=${PRECISION:-fp32}
LOSS=${LOSS:-fused}
OUT=${OUT:-$ROOT/results/recompute}
[ -x "$BENCH" ] || { echo "recompute.sh: $BENCH is missing: build first (scripts/build.sh)" >&2; exit 1; }
mkdir -p "$OUT"
: >"$OUT/runs.jsonl"

for m in $MODELS; do
  IFS=: read -r model batch seq vocab <<<"$m"
  for ((r = 1; r <= REPS; r++)); do
    for mode in none gelu block; do
      "$BENCH" gpt --model="$model" --batch="$batch" --seq="$seq" --vocab="$vocab" \
        --threads="$THREADS" --device="$DEVICE" --precision="$PRECISION" --steps="$STEPS" --reps=3 \
        --recompute="$mode" --loss="$LOSS" --out="$OUT/one.json" 2>"$OUT/one.log" ||
        { cat "$OUT/one.log" >&2; exit 1; }
      python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["rep"] = int(sys.argv[2]); print(json.dumps(d))' \
        "$OUT/one.json" "$r" >>"$OUT/runs.jsonl"
      grep '^gpt ' "$OUT/one.log" | cut -c1-160
    done
  done
done
rm -f "$OUT/one.json" "$OUT/one.log"

python3 - "$OUT/runs.jsonl" "$(uname -n)" "$(nproc)" <<'EOF' | tee "$OUT/summary.txt"
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
mach = runs[0].get("machine", {})
print(f"activation recompute on {runs[0]['config']['device']}, {runs[0]['precision_info']}; "
      f"{mach.get('cpu', '?')}, host {sys.argv[2]}, {sys.argv[3]} cores, {mach.get('date', '?')}; "
      f"medians of {max(r['rep'] for r in runs)} repetitions")
print(f"{'model':<12} {'batch x seq':>11} {'vocab':>6} {'mode':<6} {'ms/step':>9} {'x none':>7} "
      f"{'act. peak MiB':>13} {'of none':>8} {'blocks':>7} {'loss MiB':>9} {'loss':>9}")
models = []
for r in runs:
    key = (r["config"]["model"], r["config"]["batch"], r["config"]["seq"], r["config"]["vocab"])
    if key not in models: models.append(key)
for key in models:
    rows = {m: [r for r in runs if (r["config"]["model"], r["config"]["batch"], r["config"]["seq"],
                                    r["config"]["vocab"]) == key and r["config"]["recompute"] == m]
            for m in ("none", "gelu", "block")}
    model, b, t, v = key
    chunk = rows["none"][0]["config"].get("loss_chunk", -1)
    if chunk < 0:  # --loss=logits: the [B*T, V] logits, in which the loss works
        loss_bytes = b * t * v * 4
    else:  # the fused loss: a chunk of logits over the padded vocabulary, and the row losses
        loss_bytes = min(chunk or b * t, b * t) * (-(-v // 128) * 128) * 4 + b * t * 8
    ms = {m: statistics.median(x["step_ms"] for x in rows[m]) for m in rows}
    peak = {m: statistics.median(x["activation_peak_bytes"] for x in rows[m]) for m in rows}
    losses = {m: {x["loss"] for x in rows[m]} for m in rows}
    for m in ("none", "gelu", "block"):
        blocks = (peak[m] - loss_bytes) / (peak["none"] - loss_bytes) if peak["none"] > loss_bytes else float("nan")
        print(f"{model:<12} {f'{b} x {t}':>11} {v:>6} {m:<6} {ms[m]:>9.2f} {ms[m] / ms['none']:>6.2f}x "
              f"{peak[m] / 2**20:>13.1f} {peak[m] / peak['none']:>7.1%} {blocks:>7.1%} "
              f"{loss_bytes / 2**20:>9.1f} {', '.join(f'{l:.6g}' for l in sorted(losses[m])):>9}")
    if len(losses["none"] | losses["gelu"] | losses["block"]) != 1:
        print(f"  {model}: the modes' losses differ: recompute changed the arithmetic")
print("'of none': the activation peak against recompute = none; 'blocks': the same less the loss's "
      "buffer ('loss MiB'), which recompute does not touch. The loss column is the last "
      "step's loss of every run: one value per model when the modes compute the same.")
EOF
