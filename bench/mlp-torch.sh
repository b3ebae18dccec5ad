#!/usr/bin/env bash
# lockstep against PyTorch (TORCH=pip: 2.15, default; TORCH=debian: 1.13) on one process: training steps (forward, loss, backward,
# SGD with momentum) of the MLP 784-1024-1024-10 at batch 256 in fp32, at 1 and 2 threads,
# `lockstep-bench mlp` vs bench/precision_torch.py (the same model, batch and optimizer). Both are
# capped at the same threads (PyTorch's OpenMP and its OpenBLAS alike).
#
# Debian's PyTorch 1.13 runs its fp32 matmuls in Debian's OpenBLAS (2.15 from PyPI: MKL and oneDNN), which picks its kernels from the CPU model;
# on CPUs newer than OpenBLAS 0.3.21 (e.g. Emerald Rapids) it falls back to generic SSE3 kernels.
# So PyTorch is measured twice: as installed ("torch"), and, where the CPU has AVX512, with
# OPENBLAS_CORETYPE=SkylakeX ("torch_skx", OpenBLAS's AVX512 kernels, PyTorch at its best here).
# lockstep's own fp32 GEMM is oneDNN's sgemm where oneDNN has AVX2+ kernels (src/ops/cpu/
# cpu_sgemm.hpp); "lockstep_openblas" (LOCKSTEP_SGEMM=openblas) shows what it would be otherwise.
#
# Variants are interleaved (each once per repetition) so drifting load from other processes hits
# all alike; figures are medians over repetitions, wall time and CPU time per step (every thread
# of the process: comparable when other work shares the machine).
#   bench/mlp-torch.sh                       3 repetitions, threads 1 and 2
#   REPS=5 THREADS=2 bench/mlp-torch.sh
# On a shared machine: setsid bash -c 'echo -15 > /proc/self/autogroup; bench/mlp-torch.sh'.
# Writes results/mlp-torch/runs.jsonl, summary.json and summary.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
REPS=${REPS:-3}
THREADS=${THREADS:-"1 2"}
STEPS=${STEPS:-10}
BATCH=${BATCH:-256}
OUT=${OUT:-results/mlp-torch}
. bench/torch-peer-env.sh  # TORCH=pip (2.15, default) | debian (1.13); sets PYTHON
BENCH=build/apps/lockstep-bench
export OMP_WAIT_POLICY=PASSIVE  # both sides' OpenMP workers sleep instead of spinning
[ -x "$BENCH" ] || scripts/build.sh
AVX512=0
grep -qw avx512f /proc/cpuinfo && AVX512=1
mkdir -p "$OUT"
: >"$OUT/runs.jsonl"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
tmp="$OUT/tmp.json"

record() {  # record KIND THREADS < json
  "$PYTHON" -c 'import json, sys
r = json.load(sys.stdin)
r.update(kind=sys.argv[1], thr=int(sys.argv[2]), load=float(open("/proc/loadavg").read().split()[0]))
print(json.dumps(r))' "$@" >>"$OUT/runs.jsonl"
}
lockstep() {  # KIND THREADS [env...]
  local kind=$1 t=$2
  shift 2
  env "$@" "$BENCH" mlp --threads="$t" --batch="$BATCH" --reps=5 --steps="$STEPS" --out="$tmp" \
    2>/dev/null
  record "$kind" "$t" <"$tmp"
}
torch() {  # KIND THREADS [env...]
  local kind=$1 t=$2
  shift 2
  env "$@" "$PYTHON" bench/precision_torch.py mlp --threads "$t" --precision fp32 \
    --batch "$BATCH" --reps 5 --steps "$STEPS" | record "$kind" "$t"
}

for rep in $(seq 1 "$REPS"); do
  echo "mlp-torch: repetition $rep/$REPS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  for t in $THREADS; do
    lockstep lockstep "$t"
    torch torch "$t"
    [ "$AVX512" = 1 ] && torch torch_skx "$t" OPENBLAS_CORETYPE=SkylakeX
    lockstep lockstep_openblas "$t" LOCKSTEP_SGEMM=openblas
  done
done
rm -f "$tmp"
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

"$PYTHON" - "$OUT" "$load_start" "$load_end" <<'PY'
import json, os, re, statistics, sys, time
out, load_start, load_end = sys.argv[1:4]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
kinds = [k for k in ("lockstep", "torch", "torch_skx", "lockstep_openblas")
         if any(r["kind"] == k for r in runs)]
threads = sorted({r["thr"] for r in runs})
def med(kind, thr, key):
    v = [r[key] for r in runs if r["kind"] == kind and r["thr"] == thr and key in r]
    return statistics.median(v) if v else float("nan")
def ratio_per_rep(a, b, thr):
    # runs alternate a, b, ...: the i-th of each kind ran in the same repetition
    x = [r["samples_per_s"] for r in runs if r["kind"] == a and r["thr"] == thr]
    y = [r["samples_per_s"] for r in runs if r["kind"] == b and r["thr"] == thr]
    return [p / q for p, q in zip(x, y)]
cpu = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read()).group(1)
info = next((r["config"]["precision_info"] for r in runs if r["kind"] == "lockstep"), "?")
s = {"machine": {"cpu": cpu, "cores": os.cpu_count(), "lockstep_fp32": info,
                 "load_start": load_start, "load_end": load_end,
                 "date": time.strftime("%Y-%m-%d %H:%M")},
     "repetitions": len([r for r in runs if r["kind"] == "lockstep" and r["thr"] == threads[0]]),
     "threads": {}}
for t in threads:
    row = {k: {"samples_per_s": med(k, t, "samples_per_s"), "step_ms": med(k, t, "step_ms"),
               "step_cpu_ms": med(k, t, "step_cpu_ms")} for k in kinds}
    row["lockstep_over_torch"] = statistics.median(ratio_per_rep("lockstep", "torch", t))
    if "torch_skx" in kinds:
        row["lockstep_over_torch_skx"] = statistics.median(ratio_per_rep("lockstep", "torch_skx", t))
        row["lockstep_over_torch_skx_per_rep"] = ratio_per_rep("lockstep", "torch_skx", t)
        row["cpu_torch_skx_over_lockstep"] = (row["torch_skx"]["step_cpu_ms"] /
                                              row["lockstep"]["step_cpu_ms"])
    s["threads"][str(t)] = row
json.dump(s, open(f"{out}/summary.json", "w"), indent=2)
names = {"lockstep": "lockstep", "torch": "PyTorch (OpenBLAS as installed)",
         "torch_skx": "PyTorch, OPENBLAS_CORETYPE=SkylakeX", "lockstep_openblas":
         "lockstep, LOCKSTEP_SGEMM=openblas"}
with open(f"{out}/summary.md", "w") as f:
    f.write(f"MLP 784-1024-1024-10, batch 256, fp32, one process; {cpu}, {os.cpu_count()} cores; "
            f"lockstep {info}; load {load_start} at start, {load_end} at end; "
            f"{s['repetitions']} interleaved repetitions, medians.\n\n")
    f.write("| threads | " + " | ".join(names[k] for k in kinds) + " | lockstep / PyTorch | "
            "lockstep / PyTorch SkylakeX |\n| --- |" + " --- |" * (len(kinds) + 2) + "\n")
    for t in threads:
        row = s["threads"][str(t)]
        cells = [f"{row[k]['samples_per_s']:.0f}/s ({row[k]['step_ms']:.1f} ms, CPU "
                 f"{row[k]['step_cpu_ms']:.1f} ms)" for k in kinds]
        skx = (f"**{row['lockstep_over_torch_skx']:.2f}** (per rep: "
               f"{', '.join(f'{x:.2f}' for x in row['lockstep_over_torch_skx_per_rep'])})"
               if "torch_skx" in kinds else "-")
        f.write(f"| {t} | " + " | ".join(cells) +
                f" | **{row['lockstep_over_torch']:.2f}** | {skx} |\n")
print(open(f"{out}/summary.md").read())
PY
