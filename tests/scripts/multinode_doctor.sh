#!/usr/bin/env bash
# lockstep-train --doctor across hosts, on the namespace cluster (2 hosts x 2 ranks, mpirun
# --hostfile): a healthy job passes with one line per rank on node1 and node2 and the warning that
# MPI between the nodes runs over TCP; then one fault at a time on node2's ranks only, each of
# which must fail the check naming node2 and what is wrong:
#   a link down: both hosts have an interface fast0 (a veth pair) and the job names it in
#     NCCL_SOCKET_IFNAME; on node2 it is down;
#   a host with a tiny /dev/shm (node2's ranks in a mount namespace with a 1 MiB tmpfs there);
#   the data missing on node2 (its ranks see an empty tmpfs over the data folder);
#   node2's ranks started with another config (MPMD: --train.epochs differs).
# Usage: bash tests/scripts/multinode_doctor.sh BUILD_DIR    Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: multinode_doctor.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash" || exit 1
source "$(dirname "${BASH_SOURCE[0]}")/multinode_lib.bash" || exit 1
multinode_require
help=$("$TRAIN" --help 2>/dev/null)  # captured: grep -q would end the pipe early (pipefail)
grep -q -- "--doctor" <<<"$help" || skip "this lockstep-train has no --doctor"
multinode_start
e2e_make_data
e2e_write_config
out=$WORK/out.txt
MPI=(timeout -k 5 120 mpirun --hostfile "$LOCKSTEP_CLUSTER_HOSTFILE" --bind-to none)
DOCTOR=("$TRAIN" --doctor --config "$WORK/tiny.ini" --checkpoint.dir="$WORK/ck")
# expect_error NAME PATTERN: the last check failed and printed PATTERN (an ERE); nothing names node1.
expect_error() {
  local rc=$?
  [ "$rc" != 0 ] || { cat "$out"; fail "$1: the doctor passed a broken job"; }
  grep -Eq "$2" "$out" || { cat "$out"; fail "$1: no error matching: $2"; }
  ! grep -q "^error: rank [01] (node1)" "$out" || { cat "$out"; fail "$1: an error names node1"; }
  echo "$1: exit $rc; $(grep -E "$2" "$out" | head -n1 | cut -c1-220)"
}

note "a healthy job, 2 hosts x 2 ranks"
"${MPI[@]}" -np 4 "${DOCTOR[@]}" >"$out" 2>&1 || { cat "$out"; fail "the healthy job failed the check"; }
grep "^  rank\|^lockstep doctor\|^warning" "$out"
grep -q "^lockstep doctor: 4 rank(s) on 2 node(s)$" "$out" || fail "expected 4 ranks on 2 nodes"
[ "$(grep -c "^  rank [0-3]: node[12] pid" "$out")" = 4 ] || fail "expected one line per rank"
grep -q "^warning: MPI between the 2 nodes runs over TCP: no InfiniBand/RoCE device" "$out" ||
  fail "no warning that MPI runs over TCP between the nodes"
grep -q "^lockstep doctor: no errors$" "$out" || fail "no 'no errors' line"

note "a link down on node2 (fast0, named in NCCL_SOCKET_IFNAME)"
for host in node1 node2; do
  on_host "$host" ip link add fast0 type veth peer name fast0p && on_host "$host" ip link set fast0p up &&
    on_host "$host" ip addr add 10.99.0.$((${host#node} + 10))/24 dev fast0 && on_host "$host" ip link set fast0 up ||
    fail "cannot add an interface fast0 on $host"
done
on_host node2 ip link set fast0 down
"${MPI[@]}" -x NCCL_SOCKET_IFNAME=fast0 -np 4 "${DOCTOR[@]}" >"$out" 2>&1
expect_error "link down" \
  "^error: rank [23] \(node2\): NCCL_SOCKET_IFNAME=fast0 names interface 'fast0', which is down on this host"
for host in node1 node2; do on_host "$host" ip link del fast0; done

note "a tiny /dev/shm on node2"
"${MPI[@]}" -np 2 --host node1:2 "${DOCTOR[@]}" : -np 2 --host node2:2 unshare -m --propagation private \
  sh -c "mount -t tmpfs -o size=1m tmpfs /dev/shm && exec $(printf '%q ' "${DOCTOR[@]}")" >"$out" 2>&1
expect_error "tiny /dev/shm" \
  "^error: rank [23] \(node2\): /dev/shm has 1\.0 MiB free of 1\.0 MiB, but 2 rank\(s\) on this node need at least 128\.0 MiB"

note "the data missing on node2"
"${MPI[@]}" -np 2 --host node1:2 "${DOCTOR[@]}" : -np 2 --host node2:2 unshare -m --propagation private \
  sh -c "mount -t tmpfs tmpfs '$WORK/data' && exec $(printf '%q ' "${DOCTOR[@]}")" >"$out" 2>&1
expect_error "data missing" "^error: rank [23] \(node2\): data.train cannot be read there: .*$WORK/data/train"

note "node2's ranks with another config"
"${MPI[@]}" -np 2 --host node1:2 "${DOCTOR[@]}" : -np 2 --host node2:2 "${DOCTOR[@]}" --train.epochs=7 >"$out" 2>&1
expect_error "another config" "^error: config differs between ranks: train.epochs: rank 0 has '4', rank 2 has '7'"
echo "PASS: the doctor passes a healthy 2-host job and names node2 for each fault injected there"
