#!/usr/bin/env bash
# lockstep-train --doctor, the preflight check (include/lockstep/train/doctor.hpp), under mpirun
# with 2 ranks: a healthy job passes (exit 0, one line per rank, "no errors"); then one fault at a
# time on rank 1 only, each of which must fail the check (non-zero) with its own error naming rank
# 1 and what is wrong:
#   another config on rank 1 (MPMD: --train.epochs differs);
#   the data missing on rank 1's "host" (rank 1 in a mount namespace where the data folder is an
#   empty tmpfs);
#   a tiny /dev/shm on rank 1 (a 1 MiB tmpfs in its mount namespace, as in a container);
#   NCCL_SOCKET_IFNAME naming an interface rank 1's host does not have.
# The mount-namespace cases need root and unshare(1); they are reported as not run otherwise.
# Usage: bash tests/scripts/doctor.sh BUILD_DIR    Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: doctor.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
help=$("$TRAIN" --help 2>/dev/null)  # captured: grep -q would end the pipe early (pipefail)
grep -q -- "--doctor" <<<"$help" || skip "this lockstep-train has no --doctor"
e2e_workdir doctor
e2e_make_data
e2e_write_config
out=$WORK/out.txt
HOST=$(hostname)  # expanded once: a $(...) in expect_error's arguments would reset $?
MPI=(timeout -k 5 120 mpirun --oversubscribe --bind-to none)
DOCTOR=("$TRAIN" --doctor --config "$WORK/tiny.ini" --checkpoint.dir="$WORK/ck")

# expect_error NAME PATTERN: the last check failed and printed PATTERN (an ERE).
expect_error() {
  local rc=$?
  [ "$rc" != 0 ] || { cat "$out"; fail "$1: the doctor passed a broken job"; }
  grep -Eq "$2" "$out" || { cat "$out"; fail "$1: no error matching: $2"; }
  echo "$1: exit $rc; $(grep -E "$2" "$out" | head -n1 | cut -c1-200)"
}

"${MPI[@]}" -np 2 "${DOCTOR[@]}" >"$out" 2>&1 || { cat "$out"; fail "the healthy job failed the check"; }
grep -q "^lockstep doctor: no errors$" "$out" || { cat "$out"; fail "no 'no errors' line"; }
[ "$(grep -c "^  rank [01]: $HOST pid [0-9]*, local [01]/2, /dev/shm" "$out")" = 2 ] ||
  { cat "$out"; fail "expected one line per rank"; }
grep "^  rank\|^lockstep doctor" "$out"

"${MPI[@]}" -np 1 "${DOCTOR[@]}" : -np 1 "${DOCTOR[@]}" --train.epochs=7 >"$out" 2>&1
expect_error "another config on rank 1" \
  "^error: config differs between ranks: train.epochs: rank 0 has '4', rank 1 has '7'"

"${MPI[@]}" -np 1 "${DOCTOR[@]}" : -np 1 env NCCL_SOCKET_IFNAME=nosuch0 "${DOCTOR[@]}" >"$out" 2>&1
expect_error "NCCL_SOCKET_IFNAME on rank 1" \
  "^error: rank 1 \($HOST\): NCCL_SOCKET_IFNAME=nosuch0 names interface 'nosuch0', which this host does not have"

if [ "$(id -u)" = 0 ] && unshare -m --propagation private true 2>/dev/null; then
  "${MPI[@]}" -np 1 "${DOCTOR[@]}" : -np 1 unshare -m --propagation private sh -c \
    "mount -t tmpfs tmpfs '$WORK/data' && exec $(printf '%q ' "${DOCTOR[@]}")" >"$out" 2>&1
  expect_error "data missing on rank 1's host" \
    "^error: rank 1 \($HOST\): data.train cannot be read there: .*$WORK/data/train"
  "${MPI[@]}" -np 1 "${DOCTOR[@]}" : -np 1 unshare -m --propagation private sh -c \
    "mount -t tmpfs -o size=1m tmpfs /dev/shm && exec $(printf '%q ' "${DOCTOR[@]}")" >"$out" 2>&1
  expect_error "a 1 MiB /dev/shm on rank 1" \
    "^error: rank 1 \($HOST\): /dev/shm has 1\.0 MiB free of 1\.0 MiB, but 2 rank\(s\) on this node need at least 128\.0 MiB"
else
  echo "data missing on one host, tiny /dev/shm: not run (need root and unshare -m)"
fi
echo "PASS: the doctor passes a healthy 2-rank job and names each injected fault on rank 1"
