#!/usr/bin/env bash
# The command lines of issue 31, run against the real binaries (the parsing itself is unit-tested
# in tests/train/test_config.cpp and test_generate.cpp; this checks what a user sees):
#  - lockstep-generate reads integers exactly: --seed=2^64-1 is not seed 0, 2^53+1 is not 2^53;
#    --tokens=inf, --seed=1e30 and --threads=100000 are errors naming the option, exit 2;
#  - a thread the system refuses (ulimit -v) is a message and exit 1, not an abort;
#  - lockstep-train --print-config round-trips a data.train holding '#' and blanks.
# Usage: bash tests/scripts/generate_cli.sh BUILD_DIR     Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: generate_cli.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
GENERATE=$BUILD/apps/lockstep-generate
[ -x "$GENERATE" ] || skip "$GENERATE not built"
e2e_workdir generate-cli
log=$WORK/log.txt

note "print-config round trip of values a bare INI value cannot hold"
"$TRAIN" --data.train="$WORK/runs/a#b" --checkpoint.dir=" ck " --print-config >"$WORK/p.ini" ||
  fail "--print-config failed"
"$TRAIN" --config "$WORK/p.ini" --print-config >"$WORK/p2.ini" 2>"$WORK/err.txt" ||
  fail "the printed config is refused: $(cat "$WORK/err.txt")"
diff <(tail -n +2 "$WORK/p.ini") <(tail -n +2 "$WORK/p2.ini") >&2 ||
  fail "--print-config, read back, is another config"
grep -qF "train = \"$WORK/runs/a#b\"" "$WORK/p2.ini" || fail "data.train is not quoted: $(cat "$WORK/p2.ini")"

note "a tiny GPT checkpoint (2 steps)"
e2e_make_text_shards 40 "$WORK/data"
timeout -k 10 "$RUN_TIMEOUT" "$TRAIN" --data.train="$WORK/data/train" --data.test= \
  --model.spec="gpt(layers=1,heads=2,dim=16,ctx=16)" --train.global_batch=4 --train.max_steps=2 \
  --train.threads=1 --train.eval=false --optim.name=adamw --optim.lr=0.01 \
  --checkpoint.dir="$WORK/ck" --checkpoint.every_steps=2 --log.progress=none >"$log" 2>&1 ||
  { show_log "$log"; fail "training the tiny GPT failed"; }
ckpt=$WORK/ck/ckpt-00000002.h5
[ -f "$ckpt" ] || fail "no checkpoint at step 2: $(ls "$WORK/ck")"

# gen OUT ARGS...: 24 tokens of text and ids into OUT (a file: the text may hold any byte).
gen() {
  local out=$1
  shift
  "$GENERATE" --checkpoint="$ckpt" --prompt="the king " --tokens=24 --ids "$@" >"$out" 2>>"$log" ||
    { show_log "$log"; fail "lockstep-generate $* failed"; }
}
note "seeds are read exactly"
gen "$WORK/s0" --seed=0
gen "$WORK/smax" --seed=18446744073709551615
gen "$WORK/s53" --seed=9007199254740992
gen "$WORK/s53p1" --seed=9007199254740993
! cmp -s "$WORK/s0" "$WORK/smax" || fail "--seed=18446744073709551615 printed seed 0's text"
! cmp -s "$WORK/s53" "$WORK/s53p1" || fail "--seed=2^53+1 printed 2^53's text"

# expect_error STATUS MESSAGE ARGS...: lockstep-generate exits STATUS and says MESSAGE.
expect_error() {
  local status=$1 message=$2 rc
  shift 2
  "$GENERATE" --checkpoint="$ckpt" --prompt="the king " "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"
  rc=$?
  [ "$rc" = "$status" ] || fail "$* exited $rc, not $status: $(cat "$WORK/out.txt" "$WORK/err.txt")"
  grep -qF -- "$message" "$WORK/err.txt" || fail "$* said: $(cat "$WORK/err.txt")"
  echo "$*: $(head -n1 "$WORK/err.txt")"
}
note "values that are not integers in range are command-line errors"
expect_error 2 "option --tokens: 'inf' is not an integer" --tokens=inf
expect_error 2 "option --tokens: '1e30' is not an integer" --tokens=1e30
expect_error 2 "option --seed: '1e30' is not an integer" --seed=1e30
expect_error 2 "option --seed: 'inf' is not an integer" --seed=inf
expect_error 2 "option --threads: 100000 is above the maximum 4096" --threads=100000

note "a thread the system refuses is an error, not an abort"
# 1 GiB of address space holds the program but not 4096 thread stacks (8 MiB each). A build whose
# runtime needs more (AddressSanitizer's shadow memory) cannot run under it at all: then skipped.
limited() { (ulimit -v 1048576 && "$GENERATE" --checkpoint="$ckpt" --prompt="the king " --tokens=2 "$@"); }
if limited --threads=1 >/dev/null 2>&1; then
  limited --threads=4096 >"$WORK/out.txt" 2>"$WORK/err.txt"
  rc=$?
  [ "$rc" = 1 ] || fail "--threads=4096 under ulimit -v exited $rc: $(cat "$WORK/err.txt")"
  grep -q "cannot start thread [0-9]* of 4096" "$WORK/err.txt" || fail "it said: $(cat "$WORK/err.txt")"
  echo "--threads=4096 under ulimit -v: $(cat "$WORK/err.txt")"
else
  note "skipped: lockstep-generate does not run in 1 GiB of address space here"
fi
echo "PASS: lockstep-generate reads its options exactly and fails with messages; print-config round-trips"
