#!/usr/bin/env bash
# lockstep-bench resize times the resampler on random-resized crops with its AVX-512 code allowed
# and forbidden, and writes one JSON record: the sizes asked for, a positive time per crop for
# each, and same_bytes true (the run fails if the two paths differ). A bad --crops is refused
# with the flag named. (What the times are is the benchmark's business, not a test's.)
# Usage: bash tests/scripts/bench_resize.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
BUILD=$(cd "${1:?usage: bench_resize.sh BUILD_DIR}" && pwd)
BENCH=$BUILD/apps/lockstep-bench
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -x "$BENCH" ] || { echo "SKIP: $BENCH not built"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

out=$(timeout 120 "$BENCH" resize --crops=40 --side=64 --reps=2 --out="$tmp/resize.json" 2>&1) ||
  fail "resize failed: $out"
python3 - "$tmp/resize.json" <<'PY' || fail "resize wrote a bad record: $(cat "$tmp/resize.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["benchmark"] == "resize" and r["image"] == "generated", r
assert (r["height"], r["width"], r["crops"], r["side"], r["reps"]) == (375, 500, 40, 64, 2), r
for key in ("us_per_crop_min", "us_per_crop_median"):
    assert r[key]["avx512_allowed"] > 0 and r[key]["avx512_forbidden"] > 0, r
assert r["same_bytes"] is True, r
PY
out=$(timeout 20 "$BENCH" resize --crops=0 2>&1); rc=$?
[ $rc -ne 0 ] || fail "resize --crops=0 succeeded"
grep -q -- "--crops must be at least 1, got 0" <<<"$out" || fail "resize --crops=0: $out"
echo "ok"
