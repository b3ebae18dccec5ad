#!/usr/bin/env bash
# The scaling model's predictions in docs/SCALING.md, and its plot (docs/img/scaling.png):
#   1. the published settings it is checked against (Horovod's 512-GPU benchmark, PyTorch DDP's
#      benchmark), with their step times and links
#   2. gpt2-124m on H100 nodes (NVLink 4; InfiniBand NDR x 8 or 100 GbE x 1 per node)
#   3. the shipped models (configs/fashion_*.ini) as CPU ranks, 2 per node like this machine:
#      compute measured here, the shared-memory link fitted here, 100 GbE between nodes
# Reads the calibration of bench/scaling-calibrate.sh (CAL, for the shared-memory link and the
# optimizer time); run that first. Writes OUT/*.json, *.txt, scaling.dat.
#   setsid bash -c 'echo -15 > /proc/self/autogroup; bench/scaling-predict.sh'
# Environment: CAL [results/scaling], OUT [CAL/predict], PLOT [docs/img/scaling.png],
#   LOCKSTEP_BUILD_DIR [build].
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BENCH=${LOCKSTEP_BUILD_DIR:-$ROOT/build}/apps/lockstep-bench
CAL=${CAL:-$ROOT/results/scaling}
OUT=${OUT:-$CAL/predict}
PLOT=${PLOT:-$ROOT/docs/img/scaling.png}
export OMP_WAIT_POLICY=PASSIVE
[ -x "$BENCH" ] || { echo "scaling-predict: build first ($BENCH)" >&2; exit 1; }
[ -f "$CAL/fit-shm.json" ] || { echo "scaling-predict: no $CAL/fit-shm.json: run bench/scaling-calibrate.sh" >&2; exit 1; }
mkdir -p "$OUT"
echo "scaling-predict: start (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
predict() {  # predict NAME ARGS...
  local name=$1
  shift
  "$BENCH" scaling predict "$@" --out="$OUT/$name.json" 2>"$OUT/$name.txt"
}
GPUS=8,16,32,64,128,256,512,1024

# ---- 1. published settings
# Horovod (docs/benchmarks.rst): 128 servers x 4 Pascal GPUs, RoCE-capable 25 Gbit/s, batch 64
# per GPU, tf_cnn_benchmarks; Tensor Fusion's 64 MB buffer as the bucket. One-GPU step times:
# TensorFlow's DGX-1 P100 table, batch 64 (ResNet-101 interpolated, see docs/SCALING.md).
HOROVOD=("--ranks=4,8,16,32,64,128,256,512" --ranks-per-node=4 --intra=pcie3 --inter=25gbe-roce
  --bucket-mb=64 --first-bucket-mb=64 --algorithm=ring)
predict horovod-inception3 --reference=inception3 --step-ms=450.7 "${HOROVOD[@]}"
predict horovod-resnet101 --reference=resnet101 --step-ms=495 "${HOROVOD[@]}"
predict horovod-vgg16 --reference=vgg16 --step-ms=415.6 "${HOROVOD[@]}"
# The same with 80% of the line rate (2.5 GB/s), what NCCL reaches over such links.
predict horovod-inception3-80 --reference=inception3 --step-ms=450.7 "${HOROVOD[@]}" --inter-gbs=2.5
predict horovod-resnet101-80 --reference=resnet101 --step-ms=495 "${HOROVOD[@]}" --inter-gbs=2.5
predict horovod-vgg16-80 --reference=vgg16 --step-ms=415.6 "${HOROVOD[@]}" --inter-gbs=2.5
# PyTorch's DDP benchmark (benchmarks/distributed/ddp/README.md): DGX machines, 8 V100 with
# NVLink, 4 x 100 Gb InfiniBand per machine, batch 32, 25 MB buckets; 1-GPU step without DDP.
PYTORCH=("--ranks=1,2,4,8,16,32,64,128,256" --ranks-per-node=8 --intra=nvlink-v100 --inter=ib-edr
  --nics=4 --algorithm=ring)
predict pytorch-resnet50 --reference=resnet50 --step-ms=97 "${PYTORCH[@]}"
predict pytorch-resnet101 --reference=resnet101 --step-ms=162 "${PYTORCH[@]}"

# ---- 2. gpt2-124m on H100 nodes: 64 sequences of 1024 tokens per GPU, 45% of 989 TFLOP/s
GPT=(--spec=gpt2-124m --tflops=989 --mfu=0.45 --batch=64 --ranks="$GPUS" --ranks-per-node=8
  --intra=nvlink4)
predict gpt2-ndr "${GPT[@]}" --inter=ib-ndr --nics=8
predict gpt2-100gbe "${GPT[@]}" --inter=100gbe --nics=1

# ---- 3. the shipped models as CPU ranks
shm() {  # the shared-memory link fitted at 2 ranks: alpha_us or gbs
  python3 -c "import json,sys; f=[x for x in json.load(open('$CAL/fit-shm.json'))['fits'] if x['file'].endswith('shm-np2.json') and x['column']=='sync']; print(f[0]['$1'])"
}
other_ms() {  # the one-rank runs' time outside forward, backward and data: the optimizer step
  python3 - "$CAL/runs-$1.jsonl" <<'PY'
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"one_rank"' in l and '"setting": "shm"' in l]
print(1e3 * statistics.median(x["step_time_s"] - x["compute_s"] - x["comm_exposed_s"] - x["data_wait_s"] for x in r))
PY
}
for model in mlp cnn; do
  # Batch 64 per rank: the shipped configs' global batch 128 on 2 ranks, kept per rank.
  CPU=(--config="configs/fashion_$model.ini" --measure --batch=64 --threads=1
    --ranks="2,4,$GPUS" --ranks-per-node=2 --intra-alpha-us="$(shm alpha_us)"
    --intra-gbs="$(shm gbs)" --other-ms="$(other_ms "$model")")
  predict "$model-100gbe" "${CPU[@]}" --inter=100gbe
done

# ---- tables and the plot
python3 - "$OUT" <<'PY'
import json, glob, os, sys
out = sys.argv[1]
with open(f"{out}/scaling.dat", "w") as dat, open(f"{out}/tables.md", "w") as md:
    for path in sorted(glob.glob(f"{out}/*.json")):
        name = os.path.basename(path)[:-5]
        d = json.load(open(path))
        for algo in ("ring", "hierarchical"):
            rows = [r for r in d["results"] if r["algorithm"] == algo]
            if not rows:
                continue
            dat.write(f"# {name} {algo}\n")
            for r in rows:
                dat.write(f"{r['ranks']} {r['efficiency']:.4f} {1e3*r['step_s']:.3f} {1e3*r['exposed_s']:.3f}\n")
            dat.write("\n\n")
            md.write(f"\n{name}, {algo} ({d['model']}, {d['parameters']/1e6:.1f} M parameters, "
                     f"{d['buckets']} buckets; {d['compute']}; forward {1e3*d['forward_s']:.1f} ms, "
                     f"backward {1e3*d['backward_s']:.1f} ms, other {1e3*d['other_s']:.1f} ms; "
                     f"intra {d['intra']['alpha_us']:.2f} us {d['intra']['gbs']:.3f} GB/s, inter "
                     f"{d['inter']['alpha_us']:.2f} us {d['inter']['gbs']:.3f} GB/s per node, "
                     f"{d['ranks_per_node']} per node)\n\n")
            md.write("| ranks | step ms | allreduce ms | exposed ms | efficiency |\n| ---: | ---: | ---: | ---: | ---: |\n")
            for r in rows:
                md.write(f"| {r['ranks']} | {1e3*r['step_s']:.1f} | {1e3*r['comm_s']:.1f} | "
                         f"{1e3*r['exposed_s']:.2f} | {r['efficiency']:.3f} |\n")
print(open(f"{out}/tables.md").read())
PY
gnuplot -e "dat='$OUT/scaling.dat'; png='$PLOT'" bench/scaling.gp
echo "scaling-predict: done (load $(cut -d' ' -f1-3 /proc/loadavg)); plot $PLOT" >&2
