#!/usr/bin/env bash
# log.trace: a Chrome trace of a step window, every rank merged onto rank 0's clock.
#  1. 2 ranks, rank 1's clock made 5 ms ahead and 2% fast (LOCKSTEP_TEST_TRACE_SKEW_NS and
#     LOCKSTEP_TEST_TRACE_DRIFT_PPM, the trace clock's test hook): the file is valid trace JSON,
#     each rank has its process track with data/compute/buckets/comm/optimizer/step thread
#     tracks, every event of a step lies in that step's span, a span per layer lies inside the
#     engine's forward and backward spans, each bucket's ready instant comes
#     before its allreduce, and the gradient allreduces end together on both ranks once merged
#     (a collective completes on every rank at about the same moment): median gap < 1 ms where
#     the unmerged clocks differ by > 5 ms;
#     lockstep-trace prints the window's ledger (a row per step, the link fitted to the bucket
#     allreduces) and draws a step as a PNG; a file that is not a trace is an error;
#     on the emulated GPU each rank also has the compute stream's spans (device compute);
#  2. bad input: a window outside the run (the key named), an unwritable path (before any step).
# Reads the JSON with Python's json module; the viewers (Perfetto's UI, chrome://tracing) read
# this format. Usage: bash tests/scripts/trace_timeline.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skip.
BUILD=$(cd "${1:?usage: trace_timeline.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash" || exit 1
e2e_require_trainer
e2e_workdir trace
e2e_fashion_subset 2048 500
# Rank 1 gets the skewed clock (the variables are read by lockstep-train itself).
cat >"$WORK/skewed.sh" <<EOF
#!/usr/bin/env bash
if [ "\${OMPI_COMM_WORLD_RANK:-0}" = 1 ]; then
  export LOCKSTEP_TEST_TRACE_SKEW_NS=5000000 LOCKSTEP_TEST_TRACE_DRIFT_PPM=20000
fi
exec "$BUILD/apps/lockstep-train" "\$@"
EOF
train() {
  timeout -k 10 300 mpirun -np 2 --oversubscribe --bind-to none bash "$WORK/skewed.sh" \
    --config "$SOURCE/configs/ci_tiny.ini" --data.train="$WORK/data/train" \
    --data.test="$WORK/data/test" --log.every=8 --log.progress=lines "$@"
}

# ---- 1. the merged trace
train --log.trace="$WORK/trace.json" --log.trace_steps=6:11 >"$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log"; fail "training with log.trace failed"; }
grep -q 'trace of steps 6-11 of 2 rank(s) written to' "$WORK/train.log" ||
  { cat "$WORK/train.log"; fail "no line naming the trace file"; }
python3 - "$WORK/trace.json" <<'EOF' || fail "the trace does not hold (above)"
import json, statistics, sys
d = json.load(open(sys.argv[1]))
ev, other = d["traceEvents"], d["otherData"]
assert other["ranks"] == 2 and other["steps"] == "6:11", other
assert 0 <= other["clock_residual_us"] < 1000, other
assert other["clock_offsets_us"][1] > 4000, f"rank 1's measured offset {other['clock_offsets_us']}"
tracks = {}
for e in ev:
    if e["ph"] == "M" and e["name"] == "thread_name":
        tracks[(e["pid"], e["tid"])] = e["args"]["name"]
for pid in (0, 1):
    names = {n for (p, _), n in tracks.items() if p == pid}
    for want in ("data", "compute", "buckets", "comm", "optimizer", "step"):
        assert want in names, f"rank {pid} has no {want} track: {names}"
spans = [e for e in ev if e["ph"] in ("X", "i")]
for e in spans:
    e["track"] = tracks[(e["pid"], e["tid"])]
    e["end"] = e["ts"] + e.get("dur", 0)
steps = {(e["pid"], e["args"]["step"]): e for e in spans if e["track"] == "step"}
assert sorted({s for _, s in steps}) == list(range(6, 12)), sorted(steps)
for e in spans:
    s = steps[(e["pid"], e["args"]["step"])]
    if e["track"] not in ("step", "comm"):  # comm: the thread may still finish a job after
        assert s["ts"] - 1 <= e["ts"] and e["end"] <= s["end"] + 1, f"{e} outside {s}"
# A span per layer inside the engine's forward and backward spans (per block for a GPT).
for pid in (0, 1):
    mine = [e for e in spans if e["pid"] == pid and e["track"] == "compute"]
    for phase in ("forward", "backward"):
        outer = [e for e in mine if e["name"] == phase]
        layers = [e for e in mine if e["name"].startswith(phase + " ")]
        assert layers and len(layers) % len(outer) == 0, f"rank {pid}: {len(layers)} {phase} layer spans"
        for l in layers:
            assert any(o["ts"] - 1 <= l["ts"] and l["end"] <= o["end"] + 1 for o in outer), \
                f"{l} outside every {phase} span"
grads = {0: [], 1: []}
for pid in (0, 1):
    mine = sorted((e for e in spans if e["pid"] == pid), key=lambda e: e["ts"])
    ready = [e for e in mine if e["track"] == "buckets"]
    coll = [e for e in mine if e["track"] == "comm" and e["name"].startswith("allreduce(f32[")]
    assert len(ready) == len(coll) > 0, (len(ready), len(coll))
    for r, c in zip(ready, coll):
        assert r["ts"] <= c["ts"] + 1, f"bucket ready at {r['ts']} after its allreduce {c['ts']}"
    grads[pid] = coll
gaps = [abs(a["end"] - b["end"]) for a, b in zip(grads[0], grads[1])]
gap = statistics.median(gaps)
print(f"{len(spans)} events; {len(gaps)} gradient allreduces end {gap:.0f} us apart (median) "
      f"after merging; clock offset of rank 1 {other['clock_offsets_us'][1]:.0f} us, "
      f"residual {other['clock_residual_us']} us")
assert gap < 1000, f"the merged ranks' allreduces end {gap} us apart"
EOF

# ---- lockstep-trace: the ledger of the window and a PNG of its middle step
"$BUILD/apps/lockstep-trace" "$WORK/trace.json" --png="$WORK/step.png" >"$WORK/ledger.txt" 2>&1 ||
  { cat "$WORK/ledger.txt"; fail "lockstep-trace failed"; }
cat "$WORK/ledger.txt"
for step in 6 7 8 9 10 11; do
  grep -qE "^ +$step +[0-9.]+ " "$WORK/ledger.txt" || fail "the ledger has no row for step $step"
done
grep -q '^mean: step ' "$WORK/ledger.txt" || fail "the ledger has no mean line"
grep -qE '(fitted to|from) 12 gradient collectives' "$WORK/ledger.txt" || fail "the link was not fitted to the window's 12 bucket allreduces (6 steps x 2 ranks)"
[ "$(head -c 4 "$WORK/step.png" | od -An -c | tr -d ' ')" = '211PNG' ] || fail "step.png is not a PNG"
"$BUILD/apps/lockstep-trace" "$WORK/train.log" >"$WORK/notrace.txt" 2>&1 && fail "a log file was read as a trace"
grep -q 'not a trace' "$WORK/notrace.txt" || { cat "$WORK/notrace.txt"; fail "no 'not a trace' error"; }

# ---- on the emulated GPU: the compute stream's own spans (the host only queues)
train --train.device=emu --log.trace="$WORK/emu.json" --log.trace_steps=6:7 >"$WORK/emu.log" 2>&1 ||
  { cat "$WORK/emu.log"; fail "training on emu with log.trace failed"; }
python3 - "$WORK/emu.json" <<'EOF' || fail "the emulated GPU's trace does not hold (above)"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
for pid in (0, 1):
    dev = [e for e in ev if e["ph"] == "X" and tracks.get((e["pid"], e["tid"])) == "device compute" and e["pid"] == pid]
    names = sorted({e["name"] for e in dev})
    assert names == ["backward", "forward", "wait for gradients"], f"rank {pid}: {names}"
    assert len(dev) == 6 and all(e["dur"] >= 0 for e in dev), dev
print("device compute spans on both ranks:", len(dev), "each")
EOF
"$BUILD/apps/lockstep-trace" "$WORK/emu.json" >"$WORK/emu-ledger.txt" 2>&1 || { cat "$WORK/emu-ledger.txt"; fail "lockstep-trace failed on the emu trace"; }

# ---- 2. bad input
train --log.trace="$WORK/t2.json" --log.trace_steps=5000:5001 >"$WORK/bad1.log" 2>&1 &&
  fail "a window beyond the run was accepted"
grep -q 'log.trace_steps = 5000:5001' "$WORK/bad1.log" || { cat "$WORK/bad1.log"; fail "the error does not name log.trace_steps"; }
train --log.trace="$WORK/t2.json" --log.trace_steps=9:3 >"$WORK/bad2.log" 2>&1 &&
  fail "a window 9:3 was accepted"
grep -q 'log.trace_steps' "$WORK/bad2.log" || { cat "$WORK/bad2.log"; fail "9:3: the error does not name log.trace_steps"; }
train --log.trace="$WORK/no/such/dir/t.json" >"$WORK/bad3.log" 2>&1 &&
  fail "an unwritable log.trace was accepted"
grep -q 'log.trace = ' "$WORK/bad3.log" || { cat "$WORK/bad3.log"; fail "the error does not name log.trace"; }
grep -q '^step ' "$WORK/bad3.log" && fail "training started before the bad log.trace was refused"
echo "PASS: log.trace merges 2 ranks onto one clock; bad windows and paths are refused"
