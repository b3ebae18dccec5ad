#!/usr/bin/env bash
# lockstep vs PyTorch on the CPU for the same small GPT, same model, batch, sequence length and
# threads, interleaved REPS times so drifting background load hits both alike. The ratio is of
# the medians; the load average is recorded before and after. Two modes:
#  - one process (RANKS=1, the default): `lockstep-bench gpt` against bench/gpt_torch.py, forward
#    + cross-entropy + backward (OPTIMIZER=adamw adds the AdamW update to both);
#  - RANKS=N (N >= 2, or TRAIN=1 for one rank): the real training path, `mpirun -np N
#    lockstep-train` (DDP, AdamW, byte-level token shards of random text made here)
#    against `gpt_torch.py --ranks=N --optimizer=adamw` (PyTorch DDP, gloo). BATCH is per rank on
#    both sides (lockstep's train.global_batch = N x BATCH); lockstep's tokens/s is the median of
#    its logged intervals (samples/s x seq, the first interval dropped), PyTorch's the median of
#    its timed repetitions.
#   bench/gpt-cpu.sh                                   gpt-mini, batch 8 x 256, vocab 256, 2 threads
#   THREADS=1 OPTIMIZER=adamw bench/gpt-cpu.sh         1 thread, whole training step
#   RANKS=2 THREADS=1 bench/gpt-cpu.sh                 DDP, 2 ranks x 1 thread
#   MODEL=gpt-tiny SEQ=128 VOCAB=50257 THREADS=1 REPS=5 bench/gpt-cpu.sh
#   PRECISION=bf16 THREADS=1 bench/gpt-cpu.sh          lockstep train.precision = bf16 against
#                                                      torch.autocast('cpu', dtype=torch.bfloat16)
# Writes $OUT/runs.jsonl and summary.json (default results/gpt-cpu); prints the summary.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
MODEL=${MODEL:-gpt-mini}
BATCH=${BATCH:-8}
SEQ=${SEQ:-256}
VOCAB=${VOCAB:-256}
THREADS=${THREADS:-2}
REPS=${REPS:-3}
STEPS=${STEPS:-3}
RANKS=${RANKS:-1}
TRAIN=${TRAIN:-0}
OPTIMIZER=${OPTIMIZER:-none}
PRECISION=${PRECISION:-fp32}
case "$PRECISION" in fp32 | bf16) ;; *) echo "gpt-cpu: PRECISION must be fp32 or bf16, got '$PRECISION'" >&2; exit 2 ;; esac
[ "$RANKS" -gt 1 ] && TRAIN=1
[ "$TRAIN" = 1 ] && OPTIMIZER=adamw
. bench/torch-peer-env.sh  # TORCH=pip (2.15, default) | debian (1.13); sets PYTHON
OUT=${OUT:-results/gpt-cpu}
# Both sides' worker threads sleep when idle (the machine is shared; see docs/ARCHITECTURE.md).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# Both sides run their GEMMs in the same OpenBLAS. Debian's 0.3.21 does not know CPUs newer than
# it (this machine's Xeon, model 207) and falls back to its SSE3 "Prescott" kernels, ~3x slower
# than the AVX-512 ones: unless the caller chose, give both the AVX-512 kernels when the CPU has
# them. The core each side used is in its record (openblas_core for lockstep).
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=SkylakeX
fi
[ -x build/apps/lockstep-bench ] || scripts/build.sh
mkdir -p "$OUT"
: >"$OUT/runs.jsonl"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
args=(--batch="$BATCH" --seq="$SEQ" --vocab="$VOCAB" --threads="$THREADS" --steps="$STEPS" --reps=3
      --optimizer="$OPTIMIZER")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "$TRAIN" = 1 ]; then
  # Token shards of random bytes (vocabulary 256): the speed of a step does not depend on the text.
  [ "$VOCAB" = 256 ] || { echo "gpt-cpu: RANKS/TRAIN mode uses byte-level shards: VOCAB=256" >&2; exit 2; }
  head -c 4000000 /dev/urandom | base64 -w 76 >"$OUT/corpus.txt"
  build/apps/lockstep-shard text --input="$OUT/corpus.txt" --tokenizer=bytes --out="$OUT/data" \
    --name=train --shards="$RANKS" >"$OUT/shard.log" 2>&1 || { cat "$OUT/shard.log" >&2; exit 1; }
  train_steps=$((STEPS * 3 * 4 + 2 * STEPS))  # 12 logged intervals of STEPS steps after a warm-up
fi
lockstep_run() {
  if [ "$TRAIN" != 1 ]; then
    build/apps/lockstep-bench gpt --model="$MODEL" "${args[@]}" --precision="$PRECISION" \
      --out="$OUT/lockstep.json" 2>/dev/null
    return
  fi
  rm -f "$OUT/train.jsonl"
  mpirun -np "$RANKS" --oversubscribe --bind-to none build/apps/lockstep-train \
    --data.train="$OUT/data/train" --model.spec="$MODEL" --data.context="$SEQ" \
    --train.global_batch=$((RANKS * BATCH)) --train.threads="$THREADS" --train.eval=false \
    --train.precision="$PRECISION" \
    --train.max_steps="$train_steps" --optim.name=adamw --optim.lr=3e-4 --optim.weight_decay=0.1 \
    --optim.decay=matrices --optim.schedule=constant --log.every="$STEPS" --log.progress=none \
    --log.metrics="$OUT/train.jsonl" >"$OUT/train.log" 2>&1 || { cat "$OUT/train.log" >&2; exit 1; }
  python3 - "$OUT/train.jsonl" "$SEQ" "$MODEL" "$RANKS" "$THREADS" "$BATCH" >"$OUT/lockstep.json" <<'PY'
import json, statistics, sys
path, seq, model, ranks, threads, batch = sys.argv[1:]
recs = [json.loads(l) for l in open(path)]
steps = [r for r in recs if "samples_per_s" in r and "step" in r][1:]  # first interval: warm-up
tps = [r["samples_per_s"] * int(seq) for r in steps]
print(json.dumps({"benchmark": "gpt", "tokens_per_s": statistics.median(tps),
                  "tokens_per_s_intervals": tps, "openblas_core": None,
                  "config": {"model": model, "ranks": int(ranks), "threads": int(threads),
                             "batch": int(batch), "seq": int(seq), "vocab": 256,
                             "parameters": None, "path": "lockstep-train (mpirun)"}}))
PY
}
for rep in $(seq 1 "$REPS"); do
  echo "gpt-cpu: repetition $rep/$REPS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  lockstep_run
  "$PYTHON" bench/gpt_torch.py --model="$MODEL" "${args[@]}" --ranks="$RANKS" --dtype="$PRECISION" \
    >"$OUT/torch.json" 2>/dev/null
  python3 -c 'import json,sys; [print(json.dumps(json.load(open(f)))) for f in sys.argv[1:]]' \
    "$OUT/lockstep.json" "$OUT/torch.json" >>"$OUT/runs.jsonl"
done
rm -f "$OUT/lockstep.json" "$OUT/torch.json"
python3 - "$OUT" "$load_start" <<'PY'
import json, statistics, sys
out, load_start = sys.argv[1], sys.argv[2]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
ls = [r["tokens_per_s"] for r in runs if r["benchmark"] == "gpt"]
pt = [r["tokens_per_s"] for r in runs if r["benchmark"] == "gpt_torch"]
first = next(r for r in runs if r["benchmark"] == "gpt")
peer = next(r for r in runs if r["benchmark"] == "gpt_torch")
summary = {
    "model": first["config"]["model"], "parameters": peer["config"]["parameters"],
    "batch_per_rank": first["config"]["batch"], "seq": first["config"]["seq"],
    "vocab": first["config"]["vocab"], "threads": first["config"]["threads"],
    "ranks": peer["config"]["ranks"], "optimizer": peer["config"]["optimizer"],
    "precision": peer["config"]["dtype"],
    "lockstep_path": first["config"].get("path", "lockstep-bench gpt"),
    "lockstep_tokens_per_s": ls, "torch_tokens_per_s": pt,
    "lockstep_median": statistics.median(ls), "torch_median": statistics.median(pt),
    "ratio": statistics.median(ls) / statistics.median(pt),
    "torch": next(r["torch"] for r in runs if r["benchmark"] == "gpt_torch"),
    "openblas_core": first.get("openblas_core"),
    "load_start": load_start, "load_end": " ".join(open("/proc/loadavg").read().split()[:3]),
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
