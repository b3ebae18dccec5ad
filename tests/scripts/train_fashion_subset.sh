#!/usr/bin/env bash
# Real data, real launcher: shards a Fashion-MNIST subset (4096 train / 1000 test images from
# Debian's dataset-fashion-mnist), trains configs/ci_tiny.ini with 2 MPI ranks, and checks that it
# learned: test accuracy well above chance (0.10) and the loss falling, read from the metrics file.
# The full-accuracy figures are a benchmark (bench/accuracy.sh), not this test.
# Usage: bash tests/scripts/train_fashion_subset.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
BUILD=$(cd "${1:?usage: train_fashion_subset.sh BUILD_DIR}" && pwd)
SOURCE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
FASHION=/usr/share/datasets/fashion-mnist
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -f "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: $FASHION missing (apt-get install dataset-fashion-mnist)"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-subset.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE

"$BUILD/apps/lockstep-shard" fashion-mnist --out="$WORK/data" --shards=2 --limit=4096 \
  --test-limit=1000 >"$WORK/shard.log" 2>&1 || { cat "$WORK/shard.log"; fail "sharding failed"; }
timeout -k 10 300 mpirun -np 2 --oversubscribe --bind-to none "$BUILD/apps/lockstep-train" \
  --config "$SOURCE/configs/ci_tiny.ini" --data.train="$WORK/data/train" \
  --data.test="$WORK/data/test" --log.metrics="$WORK/metrics.jsonl" >"$WORK/train.log" 2>&1
rc=$?
cat "$WORK/train.log"
[ "$rc" = 0 ] || fail "lockstep-train exited with $rc"
final=$(grep '"event": "final"' "$WORK/metrics.jsonl")
[ -n "$final" ] || fail "no final record in the metrics file"
acc=$(sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p' <<<"$final")
first=$(grep '"loss"' "$WORK/metrics.jsonl" | grep '"step"' | head -n1 | sed -n 's/.*"loss": \([0-9.e+-]*\).*/\1/p')
last=$(grep '"loss"' "$WORK/metrics.jsonl" | grep '"step"' | tail -n1 | sed -n 's/.*"loss": \([0-9.e+-]*\).*/\1/p')
echo "test accuracy $acc; training loss $first (first interval) -> $last (last)"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.65) }' || fail "test accuracy $acc is not well above chance (0.10): expected >= 0.65"
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < 0.7 * f) }' || fail "the loss did not fall: $first -> $last"
echo "PASS: 2 ranks learned Fashion-MNIST (subset): test accuracy $acc"
