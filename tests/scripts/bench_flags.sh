#!/usr/bin/env bash
# lockstep-bench refuses a flag its benchmark does not read (a misspelled --rep=9 would otherwise
# run the default repetitions and report them as asked) and a stray positional argument, before
# running anything, with exit status 2 and the flags it takes.
# Usage: bash tests/scripts/bench_flags.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
BUILD=$(cd "${1:?usage: bench_flags.sh BUILD_DIR}" && pwd)
BENCH=$BUILD/apps/lockstep-bench
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -x "$BENCH" ] || { echo "SKIP: $BENCH not built"; exit 77; }

out=$(timeout 20 "$BENCH" ops --threads=1 --rep=3 2>&1); rc=$?
[ $rc -eq 2 ] || fail "ops --rep=3: exit $rc, expected 2: $out"
grep -q "unknown flag --rep (it takes: --min-ms --only --out --precision --reps --threads)" <<<"$out" ||
  fail "ops --rep=3 did not name the flag and the known ones: $out"
out=$(timeout 20 "$BENCH" mlp 256 2>&1); rc=$?
[ $rc -eq 2 ] || fail "mlp 256: exit $rc, expected 2: $out"
grep -q "unexpected argument '256'" <<<"$out" || fail "mlp 256: $out"
# Every declared flag is accepted (a cheap run: the flags are checked before the benchmark).
out=$(timeout 60 "$BENCH" mlp --threads=1 --batch=8 --model=mlp:8 --steps=1 --reps=5 \
  --out=/dev/null 2>&1) || fail "mlp with declared flags failed: $out"
echo "ok"
