#!/usr/bin/env bash
# The cost of gradient communication in DDP, measured in one run on this machine:
#   - DDP throughput with gradient sync vs the same ranks with sync turned off (--dist.sync=false)
#   - 1 rank vs N ranks at the same global batch (scaling)
#   - the step split into compute (forward+backward, overlapped communication included),
#     exposed communication and data wait, from the trainer's metrics
#   - CPU time per step of every rank's threads (main = compute, lockstep-comm = the MPI
#     communication thread, lockstep-pool = op workers, the rest: data loader, MPI's own), over
#     the measured steps: unlike wall time it stays comparable when other work shares the machine
# Models: MODEL=mlp (784-1024-1024-10, configs/fashion_mlp.ini's) or MODEL=cnn
# (configs/fashion_cnn.ini's), global batch 256, 1 thread per rank.
#   bench/ddp-overhead.sh                    MLP, 2 ranks, 3 repetitions, 120 steps each
#   MODEL=cnn RANKS=2 REPS=5 STEPS=200 bench/ddp-overhead.sh
#   EXTRA="--dist.grad_dtype=bf16" bench/ddp-overhead.sh   extra trainer keys, for every run
#   TRACE=1 bench/ddp-overhead.sh   the sync runs also write a log.trace of their measured steps,
#     and lockstep-trace's ledger of exposed communication is set beside the measured step-time
#     difference between sync and no sync (the ledger's check, docs/METRICS.md)
# The variants are interleaved (sync, no sync, one rank, then again) so drifting background load
# hits each alike; figures are medians. On a shared machine give the run priority over other
# sessions (docs/PERFORMANCE.md): setsid bash -c 'echo -15 > /proc/self/autogroup; bench/...'.
# Writes $OUT (results/ddp-overhead[-cnn]): runs.jsonl, cpu/*.json, summary.json, summary.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
MODEL=${MODEL:-mlp}
RANKS=${RANKS:-2}
REPS=${REPS:-3}
STEPS=${STEPS:-120}
EVERY=${EVERY:-20}
BATCH=${BATCH:-256}
case "$MODEL" in
  mlp) CONFIG=configs/fashion_mlp.ini DEFAULT_OUT=results/ddp-overhead ;;
  cnn) CONFIG=configs/fashion_cnn.ini DEFAULT_OUT=results/ddp-overhead-cnn ;;
  *) echo "ddp-overhead: MODEL must be mlp or cnn, got '$MODEL'" >&2; exit 2 ;;
esac
SPEC=${SPEC:-$(sed -n 's/^spec *= *//p' "$CONFIG")}
OUT=${OUT:-$DEFAULT_OUT}
(( STEPS >= 3 * EVERY )) || { echo "ddp-overhead: STEPS must be at least 3 x EVERY" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
[ -x build/apps/lockstep-train ] || scripts/build.sh
ls data/fashion-mnist/train-*-of-*.h5 >/dev/null 2>&1 ||
  build/apps/lockstep-shard fashion-mnist --out=data/fashion-mnist --shards=4
mkdir -p "$OUT/cpu"
: >"$OUT/runs.jsonl"
rm -rf "$OUT/trace"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

run() {  # run NAME RANKS SYNC REP
  local name=$1 np=$2 sync=$3 rep=$4 metrics="$OUT/tmp-metrics.jsonl" load
  local cpu="$OUT/cpu/$1-r$4.json" trace=()
  if [ "${TRACE:-0}" = 1 ] && [ "$name" = ddp_sync ]; then
    mkdir -p "$OUT/trace"
    trace=(--log.trace="$OUT/trace/r$rep.json" --log.trace_steps=$((EVERY + 1)):$((STEPS - 1)))
  fi
  load=$(cut -d' ' -f1 /proc/loadavg)
  rm -f "$metrics"
  # The CPU window runs from the first interval record (after warm-up) to the last but one.
  python3 bench/dp_vs_ddp.py watch --metrics "$metrics" --from-step "$EVERY" --to-step "$STEPS" \
    --out "$cpu" -- \
    mpirun -np "$np" --oversubscribe --bind-to none build/apps/lockstep-train \
    --config "$CONFIG" --model.spec="$SPEC" --train.global_batch="$BATCH" \
    --train.threads=1 --train.max_steps="$STEPS" --train.eval=false --optim.schedule=constant \
    --optim.warmup_steps=0 --log.every="$EVERY" --log.progress=none --dist.sync="$sync" \
    --log.metrics="$metrics" "${trace[@]}" ${EXTRA:-} >/dev/null
  # Every interval record but the first (warm-up: allocation, page faults, first buckets).
  grep '"samples_per_s"' "$metrics" | grep '"step"' | tail -n +2 |
    sed "s|^{|{\"run\": \"$name\", \"ranks\": $np, \"rep\": $rep, \"load\": $load, \"cpu\": \"$cpu\", |" \
      >>"$OUT/runs.jsonl"
}

for rep in $(seq 1 "$REPS"); do
  echo "ddp-overhead: $MODEL repetition $rep/$REPS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  # Interleaved, so drifting background load hits every variant alike.
  run "ddp_sync" "$RANKS" true "$rep"
  run "ddp_nosync" "$RANKS" false "$rep"
  run "one_rank" 1 true "$rep"
done
rm -f "$OUT/tmp-metrics.jsonl"
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$OUT" "$RANKS" "$load_start" "$load_end" "$SPEC" "$BATCH" "$MODEL" "${EXTRA:-}" <<'PY'
import glob, json, statistics, sys, subprocess, os, time
out, ranks, load, load_end, spec, batch, model, extra = sys.argv[1:9]
ranks, batch = int(ranks), int(batch)
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
names = ("ddp_sync", "ddp_nosync", "one_rank")
def med(name, key):
    v = [r[key] for r in runs if r["run"] == name]
    return statistics.median(v) if v else float("nan")
keys = ["samples_per_s", "step_time_s", "compute_s", "comm_exposed_s", "data_wait_s"]
s = {n: {k: med(n, k) for k in keys} for n in names}

# CPU ms per step and rank, by thread role, medians over the repetitions.
def role(t):
    if t["main"]: return "main"
    if t["name"] == "lockstep-comm": return "comm"
    if t["name"] == "lockstep-pool": return "pool"
    return "other"
for n in names:
    per_rep = []
    for path in sorted({r["cpu"] for r in runs if r["run"] == n}):
        c = json.load(open(path))
        if not c.get("complete"): continue
        steps = c["window_steps"][1] - c["window_steps"][0]
        if steps <= 0: continue
        split = {"main": 0.0, "comm": 0.0, "pool": 0.0, "other": 0.0}
        for p in c["processes"]:
            for t in p["threads"]:
                split[role(t)] += t["cpu_s"]
        nproc = len(c["processes"])
        # per rank and step, and the cores the job had (CPU seconds per wall second)
        per_rep.append({**{k: 1e3 * v / steps / nproc for k, v in split.items()},
                        "cores_used": sum(split.values()) / c["wall_s"]})
    if per_rep:
        s[n]["cpu_ms_per_rank_step"] = {k: statistics.median(r[k] for r in per_rep)
                                        for k in ("main", "comm", "pool", "other")}
        s[n]["cpu_ms_per_rank_step"]["total"] = statistics.median(
            sum(r[k] for k in ("main", "comm", "pool", "other")) for r in per_rep)
        s[n]["cores_used"] = statistics.median(r["cores_used"] for r in per_rep)

# The ratio within each repetition (sync and no-sync ran back to back), then its median.
def rep_ratio(a, b):
    v = []
    for rep in sorted({r["rep"] for r in runs}):
        x = [r["samples_per_s"] for r in runs if r["run"] == a and r["rep"] == rep]
        y = [r["samples_per_s"] for r in runs if r["run"] == b and r["rep"] == rep]
        if x and y: v.append(statistics.median(x) / statistics.median(y))
    return v
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
info = subprocess.run(["build/apps/lockstep-bench", "ops", "--only=none", "--reps=5"],
                      capture_output=True, text=True).stderr.split("precision ")[-1].split(" (median")[0].strip()
summary = {
    "machine": {"cpu": cpu, "cores": os.cpu_count(), "load_at_start": load, "load_at_end": load_end,
                "date": time.strftime("%Y-%m-%d %H:%M"), "kernels": info},
    "model": model, "spec": spec, "global_batch": batch, "ranks": ranks, "threads_per_rank": 1,
    "extra_args": extra,
    "medians": s,
    "sync_over_nosync": s["ddp_sync"]["samples_per_s"] / s["ddp_nosync"]["samples_per_s"],
    "sync_over_nosync_per_rep": rep_ratio("ddp_sync", "ddp_nosync"),
    "speedup_vs_one_rank": s["ddp_sync"]["samples_per_s"] / s["one_rank"]["samples_per_s"],
    "scaling_efficiency": s["ddp_sync"]["samples_per_s"] / (ranks * s["one_rank"]["samples_per_s"]),
    "data_wait_fraction": s["ddp_sync"]["data_wait_s"] / s["ddp_sync"]["step_time_s"],
}
if "cpu_ms_per_rank_step" in s["ddp_sync"] and "cpu_ms_per_rank_step" in s["ddp_nosync"]:
    summary["cpu_nosync_over_sync"] = (s["ddp_nosync"]["cpu_ms_per_rank_step"]["total"] /
                                       s["ddp_sync"]["cpu_ms_per_rank_step"]["total"])
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
with open(f"{out}/summary.md", "w") as f:
    f.write(f"DDP overhead, {model} ({spec}), global batch {batch}, 1 thread per rank"
            f"{', ' + extra if extra else ''}; {cpu}, "
            f"{os.cpu_count()} cores; {info}; load {load} at start, {load_end} at end\n\n")
    f.write("| run | ranks | samples/s | step ms | compute ms | exposed comm ms | data wait ms "
            "| CPU ms per rank-step: main / comm / pool / other = total | cores used |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
    for n, r in (("ddp_sync", ranks), ("ddp_nosync", ranks), ("one_rank", 1)):
        m = s[n]
        c = m.get("cpu_ms_per_rank_step")
        cs = (f"{c['main']:.1f} / {c['comm']:.2f} / {c['pool']:.2f} / {c['other']:.2f} = "
              f"{c['total']:.1f}") if c else "?"
        f.write(f"| {n} | {r} | {m['samples_per_s']:.0f} | {1e3*m['step_time_s']:.1f} | "
                f"{1e3*m['compute_s']:.1f} | {1e3*m['comm_exposed_s']:.2f} | "
                f"{1e3*m['data_wait_s']:.2f} | {cs} | {m.get('cores_used', float('nan')):.2f} |\n")
    f.write(f"\nDDP with sync / without sync: **{summary['sync_over_nosync']:.3f}** (per repetition: "
            f"{', '.join(f'{x:.3f}' for x in summary['sync_over_nosync_per_rep'])})")
    if "cpu_nosync_over_sync" in summary:
        f.write(f"; in CPU time per step, no sync / sync: **{summary['cpu_nosync_over_sync']:.3f}**")
    f.write(f"; {ranks} ranks vs 1 rank: {summary['speedup_vs_one_rank']:.2f}x "
            f"(efficiency {summary['scaling_efficiency']:.2f}); "
            f"data wait {100*summary['data_wait_fraction']:.2f}% of the step.\n")
# TRACE=1: the ledger's exposed communication (mean per step over the traced window of each sync
# run) against the step time sync costs over no sync, both medians over the repetitions.
traces = sorted(glob.glob(f"{out}/trace/r*.json"))
if traces:
    exposed = []
    for t in traces:
        ledger = subprocess.run(["build/apps/lockstep-trace", t], capture_output=True, text=True,
                                check=True).stdout
        line = next(l for l in ledger.splitlines() if l.startswith("mean: step"))
        exposed.append(float(line.split("exposed communication ")[1].split(" ms")[0]) / 1e3)
    ledger_s = statistics.median(exposed)
    diff_s = s["ddp_sync"]["step_time_s"] - s["ddp_nosync"]["step_time_s"]
    summary["ledger_exposed_s"] = ledger_s
    summary["sync_minus_nosync_step_s"] = diff_s
    json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
    with open(f"{out}/summary.md", "a") as f:
        f.write(f"\nlockstep-trace ledger, exposed communication per step: {1e3*ledger_s:.3f} ms "
                f"(median of {len(traces)} traced sync runs: "
                f"{', '.join(f'{1e3*x:.3f}' for x in exposed)}); step time with sync minus "
                f"without: {1e3*diff_s:.3f} ms; ledger / difference = "
                f"**{ledger_s/diff_s if diff_s else float('nan'):.3f}**.\n")
print(open(f"{out}/summary.md").read())
PY
