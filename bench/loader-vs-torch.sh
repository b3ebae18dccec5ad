#!/usr/bin/env bash
# The image loader against torchvision and DALI, per core (issue 27's loader target): decode +
# random-resized-crop + horizontal flip to SIZE x SIZE uint8, from the same JPEGs, interleaved
# REPS times.
#   lockstep     `lockstep-shard images --store=encoded --resize=SIZE` (the original JPEG bytes),
#                then `lockstep-bench loader --rrc=1 --flip=1 --decode-threads=1`: the loader
#                decodes each JPEG at the smallest DCT scale the crop allows (docs/IMAGES.md)
#   torchvision  ImageFolder + RandomResizedCrop + RandomHorizontalFlip + PILToTensor in a
#                DataLoader with num_workers=0, one thread (pillow-simd where installed)
#   dali         DALI's CPU pipeline, num_threads=1: readers.file, decoders.image_random_crop
#                (region-of-interest decoding), resize, flip
# Per core: images per CPU-second of the process over its timed epochs (every thread counted), so
# a loader that used two threads is not credited with their sum; wall images/s beside it. The
# peers time 3 epochs after a warm-up one; lockstep-bench loader reports its median epoch's CPU
# time (of 3; the first warms up). A lockstep-bench without that figure (an older BASELINE) is
# charged its whole process instead (getrusage: opening and startup included, an upper bound),
# and then lockstep's ratio to it compares whole processes on both sides.
# The photos: COUNT generated 500x375 quality-90 JPEGs (tests' make_test_images) in 2 classes,
# chroma at full resolution (SUBSAMP=444) or halved both ways (SUBSAMP=420, as most camera and web
# JPEGs).
#   bench/loader-vs-torch.sh                       COUNT=600 SIZE=224 REPS=7 SUBSAMP=444
# Seven repetitions (about 4 minutes): single repetitions on a shared VM spread by 2x.
# BASELINE=DIR (a build folder of another commit, e.g. main's) adds that lockstep-bench as the
# peer "baseline", on the same shards, interleaved with the rest: a before/after in one run.
# Peers come from bench/torch-peer-env.sh (TORCH=pip); `bench/install-torch-peer.sh images`
# adds DALI and pillow-simd to that environment. Writes results/loader-vs-torch/.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
COUNT=${COUNT:-600}
SIZE=${SIZE:-224}
REPS=${REPS:-7}
SUBSAMP=${SUBSAMP:-444}
OUT=${OUT:-results/loader-vs-torch}
. bench/torch-peer-env.sh
BASELINE=${BASELINE:-}
for t in build/apps/lockstep-shard build/apps/lockstep-bench build/tests/make_test_images \
  ${BASELINE:+$BASELINE/apps/lockstep-bench}; do
  [ -x "$t" ] || { echo "loader-vs-torch: no $t (build first)" >&2; exit 1; }
done
PEERS=torchvision
"$PYTHON" -c 'import nvidia.dali' 2>/dev/null && PEERS="$PEERS dali"
[ "$PEERS" = torchvision ] && echo "loader-vs-torch: no DALI in $PYTHON (bench/install-torch-peer.sh images)" >&2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-loader-vs-torch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT" "$WORK/photos/c0" "$WORK/photos/c1"
build/tests/make_test_images photos "$WORK/photos/c0" $((COUNT / 2)) "$SUBSAMP" >/dev/null
build/tests/make_test_images photos "$WORK/photos/c1" $((COUNT - COUNT / 2)) "$SUBSAMP" >/dev/null
build/apps/lockstep-shard images --root="$WORK/photos" --out="$WORK/set" --resize="$SIZE" \
  --store=encoded --threads=1 >"$OUT/convert.log"
: >"$OUT/runs.jsonl"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# cpu_of FILE CMD...: runs CMD (stdout to FILE), prints the CPU seconds its processes used.
cpu_of() {
  python3 -c 'import resource, subprocess, sys
with open(sys.argv[1], "w") as out:
    subprocess.run(sys.argv[2:], stdout=out, stderr=subprocess.STDOUT, check=True)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime + r.ru_stime)' "$@"
}
for rep in $(seq 1 "$REPS"); do
  echo "loader-vs-torch: repetition $rep/$REPS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  # lockstep: 3 epochs; the median epoch's wall rate and CPU time (the whole process's beside it).
  for peer in lockstep ${BASELINE:+baseline}; do
    build=build
    [ "$peer" = baseline ] && build=$BASELINE
    cpu=$(cpu_of "$OUT/$peer.log" "$build/apps/lockstep-bench" loader --data="$WORK/set/train" \
      --batch=32 --reps=3 --consume=0 --rrc=1 --flip=1 --decode-threads=1 --out="$OUT/$peer.json")
    python3 - "$OUT/$peer.json" "$cpu" "$COUNT" "$rep" "$peer" >>"$OUT/runs.jsonl" <<'PY'
import json, sys
bench, cpu, count, rep, peer = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
mode = json.load(open(bench))["modes"][-1]  # on demand
# The whole process: it opens the set and runs 3 epochs (--reps=3), every one timed.
process = cpu / (3 * count) * 1e3
epochs = mode.get("cpu_ms_per_sample_median")
print(json.dumps({"peer": peer, "rep": rep, "images_per_s": mode["samples_per_s_median"],
                  "cpu_ms_per_image": epochs if epochs is not None else process,
                  "cpu_scope": "epochs" if epochs is not None else "process",
                  "process_cpu_ms_per_image": process}))
PY
  done
  for peer in $PEERS; do
    "$PYTHON" bench/loader_torch.py "$peer" --root="$WORK/photos" --size="$SIZE" --batch=32 \
      --epochs=3 2>"$OUT/$peer.log" | python3 -c 'import json, sys
r = json.load(sys.stdin); r["rep"] = int(sys.argv[1]); print(json.dumps(r))' "$rep" >>"$OUT/runs.jsonl"
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$OUT" "$COUNT" "$SIZE" "$load_start" "$load_end" "$SUBSAMP" <<'PY'
import json, os, re, statistics, sys, time
out, count, size, load_start, load_end, subsamp = sys.argv[1:]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
peers = [p for p in ("lockstep", "baseline", "torchvision", "dali")
         if any(r["peer"] == p for r in runs)]
cpu = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read()).group(1)
def med(p, k):
    return statistics.median(r[k] for r in runs if r["peer"] == p)
versions = {k: v for r in runs for k, v in r.items()
            if k in ("torch", "torchvision", "pil", "dali")}
s = {"machine": {"cpu": cpu, "cores": os.cpu_count(), "load_start": load_start,
                 "load_end": load_end, "date": time.strftime("%Y-%m-%d %H:%M")},
     "images": int(count), "subsampling": subsamp, "size": int(size), "versions": versions,
     "peers": {p: {"images_per_s": med(p, "images_per_s"),
                   "cpu_ms_per_image": med(p, "cpu_ms_per_image"),
                   "images_per_cpu_s": 1000 / med(p, "cpu_ms_per_image")} for p in peers}}
for p in peers:
    scopes = {r.get("cpu_scope", "epochs") for r in runs if r["peer"] == p}
    s["peers"][p]["cpu_scope"] = scopes.pop() if len(scopes) == 1 else "mixed"
    if p in ("lockstep", "baseline"):
        s["peers"][p]["process_cpu_ms_per_image"] = med(p, "process_cpu_ms_per_image")
for p in peers[1:]:
    # Like for like: a baseline charged its whole process is compared with lockstep's.
    key = "process_cpu_ms_per_image" if s["peers"][p]["cpu_scope"] == "process" else "cpu_ms_per_image"
    s[f"lockstep_over_{p}_per_core"] = s["peers"][p][key] / s["peers"]["lockstep"][key]
    # The same ratio within each repetition (its runs were minutes apart, not the whole run),
    # then the median: less at the mercy of the load changing between repetitions.
    by_rep = {r["rep"]: r for r in runs if r["peer"] == p}
    s[f"lockstep_over_{p}_per_core_by_repetition"] = statistics.median(
        by_rep[r["rep"]][key] / r[key] for r in runs
        if r["peer"] == "lockstep" and r["rep"] in by_rep)
json.dump(s, open(f"{out}/summary.json", "w"), indent=1)
with open(f"{out}/summary.md", "w") as f:
    f.write(f"Decode + random-resized-crop + flip to {size}x{size}, {count} 500x375 {subsamp} JPEGs, "
            f"{cpu}, {os.cpu_count()} cores, {s['machine']['date']}; load {load_start} -> "
            f"{load_end}; medians of {max(r['rep'] for r in runs)} interleaved repetitions; "
            f"{', '.join(f'{k} {v}' for k, v in versions.items())}.\n\n"
            "| loader | images/s (wall) | CPU ms/image | images per core-second | lockstep / it, per core |\n"
            "| --- | --- | --- | --- | --- |\n")
    for p in peers:
        x = s["peers"][p]
        ratio = "" if p == "lockstep" else f"**{s[f'lockstep_over_{p}_per_core']:.2f}**"
        whole = f" ({x['process_cpu_ms_per_image']:.2f} whole process)" if p in ("lockstep", "baseline") else ""
        f.write(f"| {p} | {x['images_per_s']:.0f} | {x['cpu_ms_per_image']:.2f}{whole} | "
                f"{x['images_per_cpu_s']:.0f} | {ratio} |\n")
    f.write("\nlockstep / it, median of the repetitions' own ratios: " + ", ".join(
        f"{p} {s[f'lockstep_over_{p}_per_core_by_repetition']:.2f}" for p in peers[1:]) + ".\n")
    if "baseline" in peers and s["peers"]["baseline"]["cpu_scope"] == "process":
        f.write("\nThe baseline's lockstep-bench reports no per-epoch CPU time: its figure is its "
                "whole process's, and lockstep / baseline compares whole processes.\n")
print(open(f"{out}/summary.md").read())
PY
