#!/usr/bin/env bash
# lockstep-bench pool runs an empty fork-join of the ops' thread pool and writes one JSON record:
# the thread count asked for, and for each idle gap before the fork-join (0, 20, 100 us) a median
# and a 90th percentile with median <= p90; a bad --threads is refused with the flag named. (What
# the times are is the benchmark's business, not a test's.)
# Usage: bash tests/scripts/bench_pool.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
BUILD=$(cd "${1:?usage: bench_pool.sh BUILD_DIR}" && pwd)
BENCH=$BUILD/apps/lockstep-bench
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -x "$BENCH" ] || { echo "SKIP: $BENCH not built"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for threads in 1 2 3; do
  out=$(timeout 60 "$BENCH" pool --threads=$threads --reps=50 --out="$tmp/pool.json" 2>&1) ||
    fail "pool --threads=$threads failed: $out"
  python3 - "$tmp/pool.json" "$threads" <<'PY' || fail "pool --threads=$threads wrote a bad record"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["benchmark"] == "pool" and r["threads"] == int(sys.argv[2]) and r["reps"] == 50, r
assert [x["gap_us"] for x in r["results"]] == [0, 20, 100], r
for x in r["results"]:
    assert 0 <= x["median_us"] <= x["p90_us"], x
PY
done
out=$(timeout 20 "$BENCH" pool --threads=0 2>&1); rc=$?
[ $rc -ne 0 ] || fail "pool --threads=0 succeeded"
grep -q -- "--threads must be at least 1, got 0" <<<"$out" || fail "pool --threads=0: $out"
echo "ok"
