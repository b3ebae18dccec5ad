#!/usr/bin/env bash
# lockstep against PyTorch on the CPU, every cell in one interleaved run: four models x fp32/bf16
# x three layouts, lockstep vs PyTorch eager vs torch.compile (inductor), medians of REPS.
#   models   mlp (784-1024-1024-10, batch 256), cnn (configs/fashion_cnn.ini's, batch 128),
#            resnet18 (torchvision's ImageNet-stem ResNet-18 on 3x32x32, batch 64), gpt-mini
#            (4 layers, dim 256, vocab 256, 8 x 256 tokens); batches are per rank; on request
#            (MODELS=resnet50) torchvision's ResNet-50 on 3x224x224, 1000 classes, batch 16
#   layouts  1x1 and 1x2 (one process, 1 or 2 threads): `lockstep-bench mlp --model=SPEC` (gpt:
#            `lockstep-bench gpt --optimizer=adamw`) vs bench/torch_peer.py, one batch reused;
#            2x1 (2 ranks x 1 thread): `mpirun -np 2 lockstep-train` on shards (Fashion-MNIST;
#            random 3x32x32 CIFAR-format images; random bytes for gpt) vs PyTorch DDP over gloo
#            on one reused batch per rank (lockstep's figure includes its data loading)
#   optimizer SGD lr 0.01 momentum 0.9 (gpt-mini: AdamW, weight decay 0.1 on matrices), in the
#            timed step on both sides
#   peak RSS of the largest process of each run (lockstep's ranks, PyTorch's ranks), per cell.
# PyTorch's settings are bench/torch_peer.py's (threads capped, fused optimizers, autocast bf16,
# glibc malloc thresholds raised); MODES may add eager-cl and compile-cl: the convolutional models
# (cnn, resnet18, resnet50) in torch.channels_last, as lockstep's model.channels_last = auto runs
# them (PyTorch's default is NCHW); TORCH=pip (default, 2.15 from PyPI) or TORCH=debian (1.13,
# no torch.compile on the CPU worth measuring: MODES=eager), see bench/torch-peer-env.sh.
#   bench/vs-torch.sh                                   everything, REPS=3
#   MODELS="mlp gpt-mini" LAYOUTS="1x1 2x1" PRECISIONS=bf16 MODES=eager REPS=5 bench/vs-torch.sh
# On a shared machine: setsid bash -c 'echo -15 > /proc/self/autogroup; bench/vs-torch.sh'.
# Writes $OUT/runs.jsonl, summary.json and summary.md (default results/vs-torch).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
MODELS=${MODELS:-"mlp cnn resnet18 gpt-mini"}
PRECISIONS=${PRECISIONS:-"fp32 bf16"}
LAYOUTS=${LAYOUTS:-"1x1 1x2 2x1"}
MODES=${MODES:-"eager compile"}
REPS=${REPS:-3}
STEPS=${STEPS:-4}
OUT=${OUT:-results/vs-torch}
. bench/torch-peer-env.sh
export OMP_WAIT_POLICY=PASSIVE  # both sides' idle OpenMP workers sleep (the machine is shared)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x build/apps/lockstep-bench ] && [ -x build/apps/lockstep-train ] || scripts/build.sh
mkdir -p "$OUT"
: >"$OUT/runs.jsonl"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

CNN='conv(32,3,pad=1)-bn-relu-maxpool(2)-conv(64,3,pad=1)-bn-relu-maxpool(2)-flatten-dropout(0.25)-linear(128)-relu-linear(10)'
spec_of() { case $1 in mlp) echo mlp:1024,1024 ;; cnn) echo "$CNN" ;; *) echo "$1" ;; esac; }
input_of() { case $1 in resnet18) echo 3,32,32 ;; resnet50) echo 3,224,224 ;; *) echo 1,28,28 ;; esac; }
classes_of() { case $1 in resnet50) echo 1000 ;; *) echo 10 ;; esac; }
batch_of() { case $1 in mlp) echo 256 ;; cnn) echo 128 ;; resnet18) echo 64 ;; resnet50) echo 16 ;; gpt-mini) echo 8 ;; esac; }

# Shards for the 2-rank runs, made once.
FASHION=data/fashion-mnist
if [[ " $LAYOUTS " == *" 2x1 "* ]]; then
  compgen -G "$FASHION/train-*.h5" >/dev/null ||
    build/apps/lockstep-shard fashion-mnist --out="$FASHION" --shards=4 >/dev/null
  if [[ " $MODELS " == *" resnet18 "* ]] && ! compgen -G "$OUT/cifar/train-*.h5" >/dev/null; then
    python3 - "$OUT/cifar-bin" <<'PY'
import os, random, sys
d = sys.argv[1]; os.makedirs(d, exist_ok=True); rng = random.Random(1)
for name, n in [(f"data_batch_{i}.bin", 1000) for i in range(1, 6)] + [("test_batch.bin", 100)]:
    with open(os.path.join(d, name), "wb") as f:
        for _ in range(n):
            f.write(bytes([rng.randrange(10)]) + rng.randbytes(3072))
PY
    build/apps/lockstep-shard cifar --source="$OUT/cifar-bin" --out="$OUT/cifar" --shards=2 >/dev/null
  fi
  if [[ " $MODELS " == *" resnet50 "* ]] && ! compgen -G "$OUT/photos224/train-*.h5" >/dev/null; then
    # 224x224 photos (tests' generated 500x375 JPEGs) listed with labels of 1000 classes, so the
    # model has ImageNet's 1000 outputs on both sides.
    [ -x build/tests/make_test_images ] || { echo "vs-torch: build the tests (make_test_images)" >&2; exit 1; }
    mkdir -p "$OUT/jpegs"
    build/tests/make_test_images photos "$OUT/jpegs" 256 >/dev/null
    # Paths in a --list are relative to the list file's folder.
    (cd "$OUT" && find jpegs -type f | sort | awk '{ print $0 "," (NR % 1000) }') >"$OUT/jpegs.list"
    build/apps/lockstep-shard images --list="$OUT/jpegs.list" --classes=1000 --out="$OUT/photos224" \
      --resize=224 --shards=2 >/dev/null
    rm -rf "$OUT/jpegs" "$OUT/jpegs.list"
  fi
  if [[ " $MODELS " == *" gpt-mini "* ]] && ! compgen -G "$OUT/tokens/train-*.h5" >/dev/null; then
    head -c 4000000 /dev/urandom | base64 -w 76 >"$OUT/corpus.txt"
    build/apps/lockstep-shard text --input="$OUT/corpus.txt" --tokenizer=bytes --out="$OUT/tokens" \
      --name=train --shards=2 >/dev/null
    rm -f "$OUT/corpus.txt"
  fi
fi

# run_rss FILE CMD...: runs CMD, stdout to FILE, stderr to FILE.err; prints the peak RSS (KiB) of
# its largest process, or minus the exit status when it failed.
run_rss() {
  python3 -c 'import resource, subprocess, sys
with open(sys.argv[1], "w") as out, open(sys.argv[1] + ".err", "w") as err:
    rc = subprocess.run(sys.argv[2:], stdout=out, stderr=err).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if rc == 0 else -abs(rc) or -1)' "$@"
}
# record MODEL PREC LAYOUT PEER REP RSS FILE: one line of runs.jsonl from a JSON result.
record() {
  python3 - "$@" >>"$OUT/runs.jsonl" <<'PY'
import json, statistics, sys
model, prec, layout, peer, rep, rss, path = sys.argv[1:]
r = {"model": model, "prec": prec, "layout": layout, "peer": peer, "rep": int(rep)}
text = open(path).read().strip()
if int(rss) <= 0 or not text:
    err = open(path + ".err", errors="replace").read().strip().splitlines() if \
        __import__("os").path.exists(path + ".err") else []
    err = [l for l in err if "Warning" not in l and l.strip()]
    r["error"] = f"exit status {-int(rss)}" + (f": {err[-1][:300]}" if err else "")
else:
    if path.endswith(".jsonl"):  # lockstep-train's metrics: median of intervals after the first
        recs = [json.loads(l) for l in text.splitlines()]
        sps = [x["samples_per_s"] for x in recs if "samples_per_s" in x and "step" in x][1:]
        r.update(samples_per_s=statistics.median(sps), intervals=sps)
    else:
        try:
            j = json.loads(text)  # lockstep-bench: one JSON document over several lines
        except json.JSONDecodeError:
            j = json.loads(text.splitlines()[-1])
        if "tokens_per_s" in j and "samples_per_s" not in j:
            j["samples_per_s"] = j["tokens_per_s"] / j["config"]["seq"]
        r["samples_per_s"] = j["samples_per_s"]
        for k in ("torch", "optimizer", "warmup_s", "model_source", "compiled_graphs",
                  "graph_breaks"):
            if k in j:
                r[k] = j[k]
        if "config" in j and "precision_info" in j["config"]:
            r["precision_info"] = j["config"]["precision_info"]
    r["peak_rss_mib"] = int(rss) / 1024
print(json.dumps(r))
PY
}

lockstep_run() {  # MODEL PREC LAYOUT REP
  local m=$1 p=$2 l=$3 rep=$4 t=${3#1x} b rss
  b=$(batch_of "$m")
  if [ "$l" = 2x1 ]; then
    local data=$FASHION/train extra=() steps=$((STEPS * 5)) gb=$((2 * b))
    case $m in
      resnet18) data=$OUT/cifar/train ;;
      resnet50) data=$OUT/photos224/train ;;
      gpt-mini) data=$OUT/tokens/train extra=(--data.context=256 --optim.name=adamw --optim.lr=3e-4
        --optim.weight_decay=0.1 --optim.decay=matrices) ;;
    esac
    [ "$m" = gpt-mini ] || extra+=(--optim.lr=0.01 --optim.momentum=0.9 --optim.weight_decay=0)
    rm -f "$OUT/train.jsonl"
    rss=$(run_rss "$OUT/train.log" mpirun -np 2 --oversubscribe --bind-to none \
      build/apps/lockstep-train --data.train="$data" --model.spec="$(spec_of "$m")" \
      --train.global_batch="$gb" --train.threads=1 --train.precision="$p" --train.eval=false \
      --train.max_steps="$steps" --optim.schedule=constant --optim.warmup_steps=0 "${extra[@]}" \
      --log.every="$STEPS" --log.progress=none --log.metrics="$OUT/train.jsonl")
    [ -f "$OUT/train.jsonl" ] || : >"$OUT/train.jsonl"
    record "$m" "$p" "$l" lockstep "$rep" "$rss" "$OUT/train.jsonl"
  elif [ "$m" = gpt-mini ]; then
    rss=$(run_rss "$OUT/one.json" build/apps/lockstep-bench gpt --model=gpt-mini --batch="$b" \
      --seq=256 --vocab=256 --threads="$t" --optimizer=adamw --precision="$p" --reps=3 \
      --steps="$STEPS" --out=/dev/stdout)
    record "$m" "$p" "$l" lockstep "$rep" "$rss" "$OUT/one.json"
  else
    rss=$(run_rss "$OUT/one.json" build/apps/lockstep-bench mlp --model="$(spec_of "$m")" \
      --input="$(input_of "$m")" --classes="$(classes_of "$m")" --batch="$b" --threads="$t" --precision="$p" --reps=5 \
      --steps="$STEPS" --phases=0 --out=/dev/stdout)
    record "$m" "$p" "$l" lockstep "$rep" "$rss" "$OUT/one.json"
  fi
}
torch_run() {  # MODEL PREC LAYOUT MODE REP
  local m=$1 p=$2 l=$3 mode=$4 rep=$5 ranks=1 t=${3#1x} rss cl=()
  [ "$l" = 2x1 ] && ranks=2 t=1
  if [ "${mode%-cl}" != "$mode" ]; then  # eager-cl, compile-cl: channels_last, conv models only
    case $m in cnn | resnet*) cl=(--channels-last) ;; *) return 0 ;; esac
  fi
  rss=$(run_rss "$OUT/one.json" "$PYTHON" bench/torch_peer.py "$m" --threads "$t" --precision "$p" \
    --mode "${mode%-cl}" "${cl[@]}" --ranks "$ranks" --steps "$STEPS" --reps 3 --warmup 3)
  record "$m" "$p" "$l" "torch-$mode" "$rep" "$rss" "$OUT/one.json"
}

for rep in $(seq 1 "$REPS"); do
  for m in $MODELS; do
    for p in $PRECISIONS; do
      for l in $LAYOUTS; do
        echo "vs-torch: repetition $rep/$REPS $m $p $l (load $(cut -d' ' -f1 /proc/loadavg))" >&2
        lockstep_run "$m" "$p" "$l" "$rep"
        for mode in $MODES; do torch_run "$m" "$p" "$l" "$mode" "$rep"; done
      done
    done
  done
done
rm -f "$OUT/one.json" "$OUT/one.json.err" "$OUT/train.jsonl" "$OUT/train.log" "$OUT/train.log.err"
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$OUT" "$load_start" "$load_end" "$TORCH_PEER" <<'PY'
import json, os, re, statistics, sys, time
out, load_start, load_end, peer = sys.argv[1:5]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
cpu = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read()).group(1)
cells, order = {}, []
for r in runs:
    key = (r["model"], r["prec"], r["layout"])
    if key not in cells:
        cells[key] = {}
        order.append(key)
    cells[key].setdefault(r["peer"], []).append(r)
def med(rs, k):
    v = [r[k] for r in rs if k in r]
    return statistics.median(v) if v else None
def per_rep_ratio(a, b):  # lockstep / peer within each repetition, then the median
    x = {r["rep"]: r["samples_per_s"] for r in a if "samples_per_s" in r}
    y = {r["rep"]: r["samples_per_s"] for r in b if "samples_per_s" in r}
    v = [x[k] / y[k] for k in x if k in y]
    return (statistics.median(v), v) if v else (None, [])
summary = {"machine": {"cpu": cpu, "cores": os.cpu_count(), "load_start": load_start,
                       "load_end": load_end, "date": time.strftime("%Y-%m-%d %H:%M")},
           "peer": peer, "cells": []}
for key in order:
    c = cells[key]
    ls = c.get("lockstep", [])
    row = {"model": key[0], "precision": key[1], "layout": key[2],
           "lockstep_samples_per_s": med(ls, "samples_per_s"),
           "lockstep_peak_rss_mib": med(ls, "peak_rss_mib"),
           "lockstep_errors": [r["error"] for r in ls if "error" in r]}
    for peer_kind in [k for k in c if k != "lockstep"]:
        rs = c[peer_kind]
        ratio, per = per_rep_ratio(ls, rs)
        row[peer_kind] = {"samples_per_s": med(rs, "samples_per_s"),
                          "peak_rss_mib": med(rs, "peak_rss_mib"), "ratio": ratio,
                          "ratio_per_rep": per, "errors": [r["error"] for r in rs if "error" in r]}
    summary["cells"].append(row)
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
def f(x, fmt="{:.0f}"):
    return "-" if x is None else fmt.format(x)
modes = [k for k in ("torch-eager", "torch-eager-cl", "torch-compile", "torch-compile-cl")
         if any(k in r for r in summary["cells"])]
with open(f"{out}/summary.md", "w") as o:
    o.write(f"lockstep vs {peer}, {cpu}, {os.cpu_count()} cores, {summary['machine']['date']}; "
            f"load {load_start} at start, {load_end} at end; medians of "
            f"{max(r['rep'] for r in runs)} interleaved repetitions. samples/s (gpt-mini: "
            f"sequences of 256 tokens/s); ratio = lockstep / PyTorch, median of per-repetition "
            f"ratios; peak RSS of the largest process (MiB).\n\n")
    ratios = [r[m]["ratio"] for r in summary["cells"] for m in modes
              if r.get(m, {}).get("ratio") is not None]
    o.write(f"lockstep ahead (ratio >= 1.00) in {sum(x >= 1.0 for x in ratios)} of {len(ratios)} "
            f"comparisons; lowest {min(ratios):.2f}.\n\n" if ratios else "")
    o.write("| model | prec | layout | lockstep | " + " | ".join(
        f"{m} | lockstep / {m.replace('torch-', '')}" for m in modes) +
        " | RSS lockstep / " + " / ".join(m.replace("torch-", "") for m in modes) + " |\n")
    o.write("|" + " --- |" * (4 + 2 * len(modes) + 1) + "\n")
    for r in summary["cells"]:
        cols = []
        for m in modes:
            x = r.get(m, {})
            fails = x.get("errors", [])
            cols += [(f(x.get("samples_per_s"), "{:.1f}") if x.get("samples_per_s") else "failed") +
                     (f" ({len(fails)} run(s) failed: {fails[0]})" if fails else ""),
                     "**" + f(x.get("ratio"), "{:.2f}") + "**"]
        rss = " / ".join([f(r["lockstep_peak_rss_mib"])] + [f(r.get(m, {}).get("peak_rss_mib"))
                                                            for m in modes])
        o.write(f"| {r['model']} | {r['precision']} | {r['layout']} | "
                f"{f(r['lockstep_samples_per_s'], '{:.1f}')} | " + " | ".join(cols) +
                f" | {rss} |\n")
print(open(f"{out}/summary.md").read())
PY
