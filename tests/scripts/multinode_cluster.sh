#!/usr/bin/env bash
# Several hosts, tested for real: the project's namespace cluster (scripts/local-slurm/start.sh
# --hosts=2: two network + UTS namespaces node1 and node2, each with its own slurmd) runs
#   1. srun -N2 --ntasks-per-node=2 and mpirun --hostfile (launch agent on-host.sh, no ssh):
#      every rank sees its host's name, 2 nodes, and local ranks 0..1 on each host;
#   2. the MPI tests of the hierarchical allreduce on the real 2-host layout, 2+2 and 2+1;
#   3. slurm/train-cpu-multinode.sbatch, 2 hosts x 2 ranks (hierarchical allreduce, and flat):
#      its exported parameters equal 1 rank's with the same global batch to 2e-5 (the DDP
#      tolerance argued in tests/parallel/mpi/test_ddp.cpp), and differ by > 1e-3 without averaging;
#   4. bad input, named by host: a host that is not there (on-host.sh, an mpirun hostfile), a
#      host whose link is down, GPUs asked for on hosts without one (uneven ranks per node are
#      supported: 2+1 in step 2);
#   5. a start after a crashed start, and a stop that leaves no namespace, link or process.
# Usage: bash tests/scripts/multinode_cluster.sh BUILD_DIR    Exit: 0 pass, 1 fail, 77 skipped.
# LOCKSTEP_KEEP_CLUSTER=1 leaves the cluster up (it is stopped otherwise, unless it was up).
BUILD=$(cd "${1:?usage: multinode_cluster.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash" || exit 1
source "$(dirname "${BASH_SOURCE[0]}")/multinode_lib.bash" || exit 1
multinode_require
multinode_start
T0=$SECONDS
BENCH=$BUILD/apps/lockstep-bench
TESTS=$BUILD/tests/test_mpi
[ -x "$BENCH" ] && [ -x "$TESTS" ] || fail "lockstep-bench or test_mpi not built in $BUILD"

# ---- 1. node and local-rank detection under srun and under mpirun across the hosts.
# check_ranks LOG N PER_HOST: lockstep-bench's "# rank R/N (local L/K on HOST, H nodes" lines.
check_ranks() {
  local log=$1 n=$2 per=$3 lines host r
  lines=$(grep -E "^# rank [0-9]+/$n \(local [0-9]+/$per on node[12], 2 nodes" "$log")
  [ "$(wc -l <<<"$lines")" = "$n" ] || { cat "$log"; echo "expected $n rank lines, 2 nodes"; return 1; }
  for host in node1 node2; do
    r=$(grep "on $host," <<<"$lines" | sed 's/.*(local \([0-9]*\)\/.*/\1/' | sort | tr '\n' ' ')
    [ "$r" = "$(seq -s ' ' 0 $((per - 1))) " ] || { echo "$host has local ranks '$r'"; return 1; }
  done
}
# rx_bytes HOST: bytes HOST received over its link (counted at its switch port).
rx_bytes() { ip -n "$SWITCH_NS" -s link show "lsk-$1" | awk '/TX:/ { getline; print $1 }'; }
note "srun -N2 --ntasks-per-node=2: hosts, nodes and local ranks; 4 MiB allreduces cross the link"
before=$(rx_bytes node2)
timeout 180 srun -N2 --ntasks-per-node=2 "$BENCH" allreduce --quick --minbytes=4194304 \
  --maxbytes=4194304 >"$WORK/srun.log" 2>&1 || { cat "$WORK/srun.log"; fail "srun across 2 hosts failed"; }
check_ranks "$WORK/srun.log" 4 2 || fail "srun: wrong node or local-rank detection"
# ~40 allreduces of 4 MiB (warm-up, reps, 4 variants): far more than 32 MiB must reach node2
# over its veth. Were the hosts one shared-memory node to Open MPI, only its launch traffic would.
moved=$(($(rx_bytes node2) - before))
echo "node2 received $moved bytes over its link"
[ "$moved" -gt $((32 << 20)) ] || fail "only $moved bytes crossed node2's link: MPI did not use TCP between the hosts"
grep -q 'hierarchical over 2 nodes: node1 (ranks 0-1), node2 (ranks 2-3)' "$WORK/srun.log" ||
  fail "srun: the detected layout is not node1 (ranks 0-1), node2 (ranks 2-3)"

note "mpirun --hostfile across the hosts (launch agent on-host.sh)"
# One size, 2 calls per measurement: on a loaded machine a small allreduce of 4 oversubscribed
# ranks can take tens of ms, and the bench's default 200 calls per size would take minutes.
timeout 180 mpirun --hostfile "$LOCKSTEP_CLUSTER_HOSTFILE" -np 4 --map-by node --bind-to none \
  "$BENCH" allreduce --quick --minbytes=4096 --maxbytes=4096 --target-bytes=8192 \
  >"$WORK/mpirun.log" 2>&1 ||
  { cat "$WORK/mpirun.log"; fail "mpirun across 2 hosts failed"; }
check_ranks "$WORK/mpirun.log" 4 2 || fail "mpirun: wrong node or local-rank detection"
# --map-by node deals ranks round-robin: the layout is interleaved.
grep -q 'hierarchical over 2 nodes: node1 (ranks 0,2), node2 (ranks 1,3)' "$WORK/mpirun.log" ||
  fail "mpirun --map-by node: expected node1 (ranks 0,2), node2 (ranks 1,3)"

# ---- 2. the hierarchical allreduce's MPI tests on the real layout (2+2, then uneven 2+1).
# 2+2 runs the tests of the real layout (the sweep over simulated layouts already runs in
# mpi_np4, and takes half a minute of 4 oversubscribed ranks here); 2+1 runs them all.
real_layout='HierarchicalAllreduce.Detected*:HierarchicalAllreduce.Refuses*:HierarchicalAllreduce.Ddp*'
real_layout+=':HierarchicalAllreduce.LargeBucket*:HostChecks.*'
for shape in "-N2 --ntasks-per-node=2" "-N2 -n3"; do
  filter=$real_layout
  [ "$shape" = "-N2 -n3" ] && filter='HierarchicalAllreduce.*:HostChecks.*'
  note "test_mpi $filter under srun $shape"
  timeout 300 srun $shape "$TESTS" --gtest_filter="$filter" \
    >"$WORK/test_mpi.log" 2>&1 || { cat "$WORK/test_mpi.log"; fail "test_mpi under srun $shape failed"; }
  grep -q 'PASSED' "$WORK/test_mpi.log" || { cat "$WORK/test_mpi.log"; fail "test_mpi did not pass"; }
  grep -q 'RefusesANodeSpanningHostsThatShareNoMemory' "$WORK/test_mpi.log" &&
    ! grep -q 'SKIPPED.*RefusesANodeSpanning' "$WORK/test_mpi.log" ||
    fail "the cross-host layout test did not run on 2 hosts"
done

# ---- 3. DDP over 2 hosts x 2 ranks == 1 rank with the same global batch.
e2e_make_data
e2e_write_config
common=(--train.max_steps=16 --log.every=4)
note "reference: 1 rank, global batch 32"
run_train 1 "$WORK/ref.log" "${common[@]}" --checkpoint.export="$WORK/ref.h5" ||
  { show_log "$WORK/ref.log"; fail "the 1-rank reference failed"; }
for algorithm in hierarchical flat; do
  note "sbatch slurm/train-cpu-multinode.sbatch -N2 --ntasks-per-node=2, dist.algorithm=$algorithm"
  submit_and_wait "ddp-$algorithm" -N2 --ntasks-per-node=2 --cpus-per-task=1 \
    "$SOURCE/slurm/train-cpu-multinode.sbatch" "$WORK/tiny.ini" "${common[@]}" \
    --dist.algorithm=$algorithm --checkpoint.export="$WORK/ddp-$algorithm.h5"
  grep -q "gradient allreduce $algorithm over 2 nodes: node1 (ranks 0-1), node2 (ranks 2-3)" "$OUT" ||
    fail "dist.algorithm=$algorithm: the job did not use the $algorithm allreduce over node1 and node2"
  h5diff -d 2e-5 "$WORK/ref.h5" "$WORK/ddp-$algorithm.h5" /parameters >"$WORK/h5diff.txt" 2>&1 ||
    { head -20 "$WORK/h5diff.txt"; fail "2 hosts x 2 ranks ($algorithm) differ from 1 rank by more than 2e-5"; }
done
note "without gradient averaging the same job must land elsewhere (the comparison can fail)"
submit_and_wait ddp-nosync -N2 --ntasks-per-node=2 --cpus-per-task=1 \
  "$SOURCE/slurm/train-cpu-multinode.sbatch" "$WORK/tiny.ini" "${common[@]}" --dist.sync=false \
  --checkpoint.export="$WORK/ddp-nosync.h5"
if h5diff -d 1e-3 "$WORK/ref.h5" "$WORK/ddp-nosync.h5" /parameters >/dev/null 2>&1; then
  fail "unsynchronised replicas match the reference: the comparison cannot tell"
fi

# ---- 4. bad input, named by host.
note "a host that is not in the cluster"
msg=$(bash "$SOURCE/scripts/local-slurm/on-host.sh" node7 true 2>&1)
rc=$?
[ "$rc" = 255 ] && grep -q 'host node7: not a host of the cluster' <<<"$msg" ||
  fail "on-host.sh node7: exit $rc, '$msg' (want 255 and a message naming node7)"
printf 'node1 slots=2\nnode7 slots=2\n' >"$WORK/bad-hostfile"
timeout 60 mpirun --hostfile "$WORK/bad-hostfile" -np 4 --bind-to none "$BENCH" allreduce --quick \
  --minbytes=4096 --maxbytes=4096 --target-bytes=8192 \
  >"$WORK/bad-mpirun.log" 2>&1 && fail "mpirun with an unknown host succeeded"
grep -q 'host node7' "$WORK/bad-mpirun.log" ||
  { cat "$WORK/bad-mpirun.log"; fail "mpirun with an unknown host: no message naming node7"; }
note "a host whose link is down"
ip -n "$(host_ns node2)" link set eth0 down
timeout 60 mpirun --hostfile "$LOCKSTEP_CLUSTER_HOSTFILE" -np 4 --bind-to none "$BENCH" allreduce \
  --quick --minbytes=4096 --maxbytes=4096 --target-bytes=8192 >"$WORK/down-mpirun.log" 2>&1 && { ip -n "$(host_ns node2)" link set eth0 up; fail "mpirun to an unreachable host succeeded"; }
ip -n "$(host_ns node2)" link set eth0 up
grep -q 'host node2: its network link is down' "$WORK/down-mpirun.log" ||
  { cat "$WORK/down-mpirun.log"; fail "mpirun to an unreachable host: no message naming node2"; }

note "GPUs asked for on hosts without one: the error names the host"
timeout 60 srun -N2 --ntasks-per-node=1 "$TRAIN" --config "$WORK/tiny.ini" --train.device=cuda \
  >"$WORK/gpu.log" 2>&1 && fail "train.device=cuda on CPU-only hosts succeeded"
grep -Eq 'no GPU is available to rank [01] on host node[12]' "$WORK/gpu.log" ||
  { cat "$WORK/gpu.log"; fail "train.device=cuda on CPU-only hosts: no error naming the host"; }

# ---- 5. a start killed half-way, then a start that must clear it, then a clean stop.
note "a start killed half-way leaves leftovers; the next start clears them"
bash "$SOURCE/scripts/local-slurm/stop.sh" --hosts >/dev/null 2>&1
bash "$SOURCE/scripts/local-slurm/start.sh" --hosts=2 >/dev/null 2>&1 &
sleep 0.7
kill -9 $! 2>/dev/null
wait $! 2>/dev/null
bash "$SOURCE/scripts/local-slurm/start.sh" --hosts=2 || fail "start after a crashed start failed"
timeout 60 srun -N2 --ntasks-per-node=1 hostname >"$WORK/after.log" 2>&1 &&
  [ "$(sort "$WORK/after.log" | tr '\n' ' ')" = "node1 node2 " ] ||
  { cat "$WORK/after.log"; fail "srun after the restart did not reach node1 and node2"; }
bash "$SOURCE/scripts/local-slurm/stop.sh" --hosts || fail "stop.sh --hosts failed"
left=$(ip netns list | grep -c "^$CLUSTER_PREFIX-")
[ "$left" = 0 ] || fail "stop left $left namespaces: $(ip netns list | grep "^$CLUSTER_PREFIX-")"
ip link show "$HEAD_LINK" >/dev/null 2>&1 && fail "stop left the head link $HEAD_LINK"
if [ "$was_up" = 1 ] || [ "${LOCKSTEP_KEEP_CLUSTER:-0}" = 1 ]; then
  bash "$SOURCE/scripts/local-slurm/start.sh" --hosts=2 >/dev/null 2>&1  # as it was before
fi
was_up=1  # nothing left for the exit trap to stop
echo "PASS: 2 namespace hosts: srun and mpirun see 2 nodes with local ranks 0-1; hierarchical" \
  "allreduce tests pass on 2+2 and 2+1; 2x2 DDP (hierarchical and flat) equals 1 rank to 2e-5;" \
  "bad hosts named; restart after a crash; clean stop ($((SECONDS - T0)) s)"
