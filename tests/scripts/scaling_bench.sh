#!/usr/bin/env bash
# lockstep-bench scaling end to end (the arithmetic itself is tested in tests/parallel):
#   - `fit` reads a `lockstep-bench allreduce` JSON file and recovers the alpha and bandwidth the
#     file's times were made from;
#   - `predict` wires its flags into the model: its 2-rank step for the MLP equals the equations
#     of docs/SCALING.md evaluated here, independently, from `profile`'s buckets;
#   - bad input is an error naming the flag, the preset or the layout.
# Usage: bash tests/scripts/scaling_bench.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
BUILD=$(cd "${1:?usage: scaling_bench.sh BUILD_DIR}" && pwd)
BENCH=$BUILD/apps/lockstep-bench
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v python3 >/dev/null || { echo "SKIP: python3 is missing"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-scaling.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# ---- fit: times of a 4-rank ring with alpha = 20 us and B = 2 GB/s, +-2% alternating.
python3 - "$WORK/allreduce.json" <<'PY' || fail "could not write the synthetic allreduce file"
import sys
p, alpha, B = 4, 20e-6, 2e9
with open(sys.argv[1], "w") as f:
    f.write('{"benchmark": "allreduce", "ranks": 4, "nodes": 1, "layout": "1 node", "load_avg": "0 0 0", "results": [')
    n, i = 16384, 0
    while n <= 16 << 20:
        t = (2 * (p - 1) * alpha + 2 * (p - 1) / p * n / B) * (1.02 if i % 2 else 0.98)
        f.write(('' if i == 0 else ',') + f'\n  {{"bytes": {n}, "count": {n // 4}, "sync_us": {t * 1e6}, "async_us": {t * 1e6}, "mpi_us": {t * 1e6}}}')
        n, i = n * 4, i + 1
    f.write('\n]}\n')
PY
"$BENCH" scaling fit --runs="$WORK/allreduce.json" --columns=sync --out="$WORK/fit.json" \
  2>"$WORK/fit.txt" || { cat "$WORK/fit.txt"; fail "scaling fit failed"; }
cat "$WORK/fit.txt"
python3 - "$WORK/fit.json" <<'PY' || fail "the fit did not recover alpha = 20 us and B = 2 GB/s"
import json, sys
f = json.load(open(sys.argv[1]))["fits"][0]
print(f"fitted alpha {f['alpha_us']:.2f} us, B {f['gbs']:.4f} GB/s, rms {f['rms_relative']:.4f}")
assert abs(f["alpha_us"] / 20 - 1) < 0.1 and abs(f["gbs"] / 2 - 1) < 0.05, f
assert f["ranks"] == 4 and f["points"] == 6 and 0.01 < f["rms_relative"] < 0.03, f
PY

# ---- predict against the equations, for the MLP on 2 ranks of one node.
"$BENCH" scaling profile --spec=mlp:1024,1024 --out="$WORK/profile.json" 2>/dev/null ||
  fail "scaling profile failed"
"$BENCH" scaling predict --spec=mlp:1024,1024 --step-ms=30 --other-ms=2 --ranks=2 \
  --ranks-per-node=2 --intra-alpha-us=10 --intra-gbs=1 --algorithm=ring \
  --out="$WORK/predict.json" 2>"$WORK/predict.txt" || { cat "$WORK/predict.txt"; fail "scaling predict failed"; }
cat "$WORK/predict.txt"
python3 - "$WORK/profile.json" "$WORK/predict.json" <<'PY' || fail "predict disagrees with the equations"
import json, sys
buckets = json.load(open(sys.argv[1]))["buckets"]
d = json.load(open(sys.argv[2]))
r = d["results"][0]
f, b, o = d["forward_s"], d["backward_s"], d["other_s"]
assert abs(f + b - 0.030) < 1e-9 and abs(o - 0.002) < 1e-12, (f, b, o)
# Ring over p = 2: 2 alpha + n / B; the FIFO starts bucket k at max(ready, end of k-1).
end = 0.0
for k in buckets:
    start = max(k["ready"] * b, end)
    end = start + 2 * 10e-6 + k["bytes"] / 1e9
exposed = max(0.0, end - b)
step = f + b + exposed + o
print(f"equations: step {step * 1e3:.4f} ms, exposed {exposed * 1e3:.4f} ms; "
      f"predict: {r['step_s'] * 1e3:.4f} ms, {r['exposed_s'] * 1e3:.4f} ms")
assert abs(r["step_s"] - step) < 1e-9 and abs(r["exposed_s"] - exposed) < 1e-9
assert abs(r["efficiency"] - (f + b + o) / step) < 1e-9
assert len(buckets) == 2 and buckets[1]["ready"] == 1, buckets
PY

# ---- check: the measured rows are the medians of the runs file, per run and rank count.
python3 - "$WORK/runs.jsonl" <<'PY' || fail "could not write the synthetic runs file"
import json, sys
with open(sys.argv[1], "w") as f:
    for run, ranks, steps in (("one_rank", 1, [0.10, 0.12, 0.11]), ("ddp_sync", 2, [0.07, 0.06, 0.09]),
                              ("ddp_nosync", 2, [0.055, 0.05, 0.06])):
        for t in steps:
            f.write(json.dumps({"setting": "x", "run": run, "ranks": ranks, "step": 10, "step_time_s": t,
                                "compute_s": 0.8 * t, "comm_exposed_s": 0.1 * t if run == "ddp_sync" else 0.0,
                                "data_wait_s": 0.0}) + "\n")
    f.write(json.dumps({"setting": "other", "run": "one_rank", "ranks": 1, "step_time_s": 9.0,
                        "compute_s": 1.0, "comm_exposed_s": 0.0, "data_wait_s": 0.0}) + "\n")
PY
"$BENCH" scaling check --spec=mlp:64 --global-batch=8 --runs="$WORK/runs.jsonl" --setting=x \
  --intra-alpha-us=10 --intra-gbs=1 --reps=3 --out="$WORK/check.json" 2>"$WORK/check.txt" ||
  { cat "$WORK/check.txt"; fail "scaling check failed"; }
cat "$WORK/check.txt"
python3 - "$WORK/check.json" <<'PY' || fail "check's measured rows are not the medians of the runs"
import json, sys
rows = {(r["ranks"], r["source"]): r for r in json.load(open(sys.argv[1]))["rows"]}
one, sync, nosync = rows[(1, "measured")], rows[(2, "measured")], rows[(2, "nosync")]
assert abs(one["step_s"] - 0.11) < 1e-12 and abs(sync["step_s"] - 0.07) < 1e-12, (one, sync)
assert abs(sync["exposed_s"] - 0.007) < 1e-12 and abs(nosync["step_s"] - 0.055) < 1e-12, (sync, nosync)
assert abs(sync["efficiency"] - 0.11 / (2 * 0.07)) < 1e-9, sync  # JSON keeps 10 digits
for key in ((1, "model"), (2, "model"), (2, "model+nosync")):
    assert rows[key]["step_s"] > 0 and rows[key]["exposed_s"] >= 0, rows[key]
PY

# ---- bad input
expect_error() {  # description, expected text, arguments...
  local what=$1 expected=$2
  shift 2
  if "$BENCH" scaling "$@" >"$WORK/err.out" 2>&1; then fail "$what: accepted"; fi
  grep -q -- "$expected" "$WORK/err.out" || { cat "$WORK/err.out"; fail "$what: no '$expected' in the error"; }
  echo "ok: $what -> $(grep -m1 error "$WORK/err.out")"
}
expect_error "unknown link preset" "unknown link preset 'infiniband'" predict --spec=mlp:64 \
  --step-ms=1 --inter=infiniband
expect_error "ranks that do not fill nodes" "12 ranks do not fill nodes of 8" predict \
  --spec=mlp:64 --step-ms=1 --ranks=12 --ranks-per-node=8
expect_error "no compute time" "no compute time" predict --spec=mlp:64
expect_error "no model" "no model" predict --step-ms=1
expect_error "unknown reference model" "unknown reference model 'resnet18'" predict \
  --reference=resnet18 --step-ms=1
expect_error "not an allreduce file" "not a lockstep-bench allreduce JSON file" fit \
  --runs="$WORK/profile.json"
expect_error "a sample shape that is not positive integers" "'28x28' is not a positive integer" \
  profile --spec=mlp:64 --sample-shape=1,28x28
expect_error "unknown mode" "unknown mode 'plot'" plot
echo "PASS"
