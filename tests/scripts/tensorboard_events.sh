#!/usr/bin/env bash
# log.tensorboard read back by TensorBoard's own reader (EventAccumulator, PyPI `tensorboard`):
#  1. a 2-rank Fashion-MNIST subset run: every train/loss, train/lr and eval/test_accuracy scalar
#     equals the metrics file's record of that step (to its 7 digits), train/grad_norm is there;
#  2. the same folder after a resume from an earlier checkpoint: each step appears once (the new
#     file's SessionLog START purges the first file's records from the resume step on) and the
#     folder holds two event files;
#  3. a log.tensorboard that cannot be a folder stops the run before training, naming the key.
# Installs nothing: it needs a Python with tensorboard, named by LOCKSTEP_PYTHON (.ci/run makes one
# in a virtual environment); without it the test skips, visibly. TensorBoard is never a dependency
# of lockstep itself.
# Usage: bash tests/scripts/tensorboard_events.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: tensorboard_events.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash" || exit 1
e2e_require_trainer
PY=${LOCKSTEP_PYTHON:-}
[ -n "$PY" ] || skip "LOCKSTEP_PYTHON is not set: point it at a Python with tensorboard"
"$PY" -c 'import tensorboard' 2>/dev/null || skip "$PY cannot import tensorboard (LOCKSTEP_PYTHON)"
e2e_workdir tb
e2e_fashion_subset 2048 500
train() {
  timeout -k 10 300 mpirun -np 2 --oversubscribe --bind-to none "$TRAIN" \
    --config "$SOURCE/configs/ci_tiny.ini" --data.train="$WORK/data/train" \
    --data.test="$WORK/data/test" --log.every=8 --log.progress=lines \
    --checkpoint.dir="$WORK/${CKPT:-ckpt}" --checkpoint.every_steps=32 --checkpoint.keep=10 "$@"
}

# ---- 1. a run's scalars equal its metrics records
train --log.metrics="$WORK/m.jsonl" --log.tensorboard="$WORK/tb" >"$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log"; fail "training with log.tensorboard failed"; }
grep -q '^time: compute ' "$WORK/train.log" || fail "no end-of-run time shares line"
cat >"$WORK/read.py" <<'EOF'
import json, math, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
folder, metrics, expect_files = sys.argv[1], sys.argv[2], int(sys.argv[3])
import os
files = [f for f in os.listdir(folder) if "tfevents" in f]
assert len(files) == expect_files, f"{len(files)} event files in {folder}, expected {expect_files}"
acc = EventAccumulator(folder, size_guidance={"scalars": 0})
acc.Reload()
tags = acc.Tags()["scalars"]
for tag in ("train/loss", "train/lr", "train/samples_per_s", "train/grad_norm",
            "train/comm_exposed_s", "eval/test_accuracy", "checkpoint/stall_s"):
    assert tag in tags, f"no {tag} among {tags}"
# The metrics file's last record of each step wins (a resumed run appends after a restart record).
want = {}
for line in open(metrics):
    r = json.loads(line)
    if "step" not in r or r.get("event") not in (None, "eval"):
        continue
    for k, v in r.items():
        if isinstance(v, (int, float)) and k not in ("step", "epoch") and v is not None:
            group = "train" if "event" not in r else r["event"]
            want[(f"{group}/{k}", r["step"])] = v
checked = 0
for tag in ("train/loss", "train/lr", "eval/test_accuracy"):
    events = acc.Scalars(tag)
    steps = [e.step for e in events]
    assert len(steps) == len(set(steps)), f"{tag}: a step appears twice: {steps}"
    for e in events:
        v = want.get((tag, e.step))
        assert v is not None, f"{tag} at step {e.step} is not in {metrics}"
        # The metrics file prints 7 significant digits; the event holds the float32.
        assert abs(e.value - v) <= 1e-6 * abs(v) + 1e-12, f"{tag} at step {e.step}: {e.value} != {v}"
        checked += 1
    assert steps == sorted(steps)
print(f"{checked} scalars equal the metrics records; last train/loss step "
      f"{acc.Scalars('train/loss')[-1].step}; tags {len(tags)}")
EOF
"$PY" "$WORK/read.py" "$WORK/tb" "$WORK/m.jsonl" 1 || fail "TensorBoard's reader disagrees (above)"

# ---- 2. resumed from step 64 into the same folder: each step once, two files
CKPT=ckpt2 train --log.metrics="$WORK/m.jsonl" --log.tensorboard="$WORK/tb" \
  --train.resume="$WORK/ckpt/ckpt-00000064.h5" >"$WORK/resume.log" 2>&1 ||
  { cat "$WORK/resume.log"; fail "resumed training failed"; }
"$PY" "$WORK/read.py" "$WORK/tb" "$WORK/m.jsonl" 2 || fail "after a resume (above)"

# ---- 3. an impossible folder: an error naming the key, before any step
echo x >"$WORK/file"
CKPT=ckpt3 train --log.tensorboard="$WORK/file/tb" >"$WORK/bad.log" 2>&1 &&
  fail "log.tensorboard under a file was accepted"
grep -q 'log.tensorboard' "$WORK/bad.log" || { cat "$WORK/bad.log"; fail "the error does not name log.tensorboard"; }
grep -q '^step ' "$WORK/bad.log" && fail "training started before the bad log.tensorboard was refused"
echo "PASS: TensorBoard reads lockstep's event files (a run, a resume, a bad folder)"
