#!/usr/bin/env bash
# A rank stops making progress: under mpirun -np 2, lockstep-train runs with dist.timeout_s=8;
# once training is under way one rank gets SIGSTOP (as a stuck file system or a debugger would
# leave it). The job must end, non-zero, within timeout + 10 s, and the live rank must say which
# rank did not arrive at which collective and training step, on which host and process (and a
# "suspect hosts:" line for a requeue script). While it waits, the live rank must
# not spin: its CPU use over the wait is measured and must stay under 10% of one core.
# HUNG_RANK_ARGS (words) are added to the training command line: fault_hung_rank_hierarchical.sh
# runs the same with the gradients in the hierarchical allreduce.
# Usage: bash tests/scripts/fault_hung_rank.sh BUILD_DIR    Exit: 0 pass, 1 fail, 77 skipped.
BUILD=$(cd "${1:?usage: fault_hung_rank.sh BUILD_DIR}" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.bash"
e2e_require_trainer
help=$("$TRAIN" --help 2>/dev/null)
grep -q "dist.timeout_s" <<<"$help" || skip "this lockstep-train has no dist.timeout_s"
e2e_workdir fault-hung
e2e_make_data
E2E_EPOCHS=100000 e2e_write_config  # runs until the timeout ends it
log=$WORK/log.txt
ck=$WORK/ck
TIMEOUT_S=8
BOUND=$((TIMEOUT_S + 10))

victim=
cleanup_victim() { [ -n "$victim" ] && kill -KILL "$victim" 2>/dev/null; }
trap 'cleanup_victim; [ "${LOCKSTEP_KEEP_E2E:-0}" = 1 ] || rm -rf "$WORK"' EXIT

# Checkpoints only to see that training runs (the first one is written at step 5).
start_train_bg 2 "$log" --dist.timeout_s=$TIMEOUT_S --checkpoint.dir="$ck" \
  --checkpoint.every_steps=5 --checkpoint.keep=1 --log.every=1000 ${HUNG_RANK_ARGS:-}
wait_for_checkpoint "$ck" 5 60 || { show_log "$log"; fail "no step-5 checkpoint within 60 s"; }
pids=($(rank_pids))
[ "${#pids[@]}" = 2 ] || fail "expected 2 rank processes under mpirun $MPIRUN_PID, found: ${pids[*]}"
rank_of() { tr '\0' '\n' <"/proc/$1/environ" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p'; }
victim=${pids[1]}
survivor=${pids[0]}
victim_rank=$(rank_of "$victim")
survivor_rank=$(rank_of "$survivor")
[ -n "$victim_rank" ] && [ -n "$survivor_rank" ] || fail "cannot read the ranks of $victim and $survivor"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
note "SIGSTOP to rank $victim_rank (pid $victim); rank $survivor_rank (pid $survivor) waits"
stop_time=$SECONDS
kill -STOP "$victim"
# CPU of the waiting rank over most of the timeout (it enters its wait within milliseconds).
sleep 1
t0=$(cpu_ticks "$survivor") || fail "rank $survivor_rank ended before its timeout"
window=$((TIMEOUT_S - 3))
sleep "$window"
t1=$(cpu_ticks "$survivor") || fail "rank $survivor_rank ended before its timeout"
hz=$(getconf CLK_TCK)
cpu_percent=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v w="$window" 'BEGIN { printf "%.1f", 100 * d / hz / w }')
echo "CPU of the waiting rank over ${window} s of its wait: ${cpu_percent}% of one core ($((t1 - t0)) ticks at ${hz}/s; load: $(cut -d' ' -f1-3 /proc/loadavg))"

wait_job $((BOUND - (SECONDS - stop_time))) ||
  { show_log "$log"; fail "the job was still running ${BOUND}s after rank $victim_rank stopped"; }
elapsed=$((SECONDS - stop_time))
echo "job ended ${elapsed}s after the SIGSTOP (timeout ${TIMEOUT_S}s) with status $JOB_RC"
[ "$JOB_RC" != 0 ] || fail "the job exited 0 although a rank stopped"
grep "^rank $survivor_rank: " "$log" | head -n 4
pattern="^rank $survivor_rank: error: collective #[0-9]+ [a-z_ ]+\(.*\) at training step [0-9]+ did not complete within dist.timeout_s = $TIMEOUT_S s; rank $victim_rank did not arrive"
grep -Eq "$pattern" "$log" ||
  { show_log "$log"; fail "no report naming rank $victim_rank, the collective and the step"; }
host=$(hostname)
grep -Eq "^rank $survivor_rank:   rank $victim_rank \($host, pid $victim\): no answer within" "$log" ||
  { show_log "$log"; fail "the report does not say that rank $victim_rank ($host, pid $victim) did not answer"; }
grep -q "^rank $survivor_rank:   suspect hosts: $host (of rank $victim_rank)$" "$log" ||
  { show_log "$log"; fail "the report does not list $host as the suspect host"; }
awk -v c="$cpu_percent" 'BEGIN { exit !(c < 10) }' ||
  fail "the waiting rank used ${cpu_percent}% of a core while it waited (spinning?)"
echo "PASS: rank $victim_rank stopped; the job ended ${elapsed}s later naming it; the waiting rank used ${cpu_percent}% CPU"
