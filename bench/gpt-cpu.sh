#!/usr/bin/env bash
# lockstep vs PyTorch on the CPU for the same small GPT: forward + cross-entropy + backward
# tokens/s of `lockstep-bench gpt` and bench/gpt_torch.py (Debian's python3-torch), same model,
# batch, sequence length and threads, interleaved REPS times so drifting background load hits
# both alike. The ratio is of the medians; the load average is recorded before and after.
#   bench/gpt-cpu.sh                                   gpt-mini, batch 8 x 256, vocab 256, 2 threads
#   MODEL=gpt-tiny SEQ=128 VOCAB=50257 THREADS=1 REPS=5 bench/gpt-cpu.sh
# Writes results/gpt-cpu/runs.jsonl and summary.json; prints the summary.
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
PYTHON=${PYTHON:-/usr/bin/python3}
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
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "gpt-cpu: $PYTHON has no torch (apt-get install python3-torch)" >&2
  exit 77
fi
mkdir -p "$OUT"
: >"$OUT/runs.jsonl"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
args=(--batch="$BATCH" --seq="$SEQ" --vocab="$VOCAB" --threads="$THREADS" --steps="$STEPS" --reps=3)
for rep in $(seq 1 "$REPS"); do
  echo "gpt-cpu: repetition $rep/$REPS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  build/apps/lockstep-bench gpt --model="$MODEL" "${args[@]}" --out="$OUT/lockstep.json" 2>/dev/null
  "$PYTHON" bench/gpt_torch.py --model="$MODEL" "${args[@]}" >"$OUT/torch.json" 2>/dev/null
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
summary = {
    "model": first["config"]["model"], "parameters": first["config"]["parameters"],
    "batch": first["config"]["batch"], "seq": first["config"]["seq"],
    "vocab": first["config"]["vocab"], "threads": first["config"]["threads"],
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
