#!/usr/bin/env bash
# Start a private single-node Slurm cluster for lockstep's tests: munged, slurmctld and slurmd,
# all as root, configured under one base directory (nothing written to /etc, no systemd, no
# cgroups). Idempotent: when the cluster is already up this only checks it (a changed config
# restarts the daemons). Afterwards every Slurm client command needs the generated config:
#     source "${LOCKSTEP_SLURM_BASE:-/tmp/lockstep-slurm}/env.sh"    # exports SLURM_CONF
#
# Usage: scripts/local-slurm/start.sh [--status]
#   --status   exit 0 when the cluster is up and its node usable, 3 when not; start nothing.
# Exit codes: 0 up; 1 failed (logs named on stderr); 77 cannot run here (not root, packages
# missing and installing not allowed): the reason is printed.
#
# Settings (environment):
#   LOCKSTEP_SLURM_BASE       base directory                                [/tmp/lockstep-slurm]
#   LOCKSTEP_SLURM_CTLD_PORT  slurmctld port (not 6817, so a system Slurm is left alone) [16817]
#   LOCKSTEP_SLURM_SLURMD_PORT slurmd port                                 [16818]
#   LOCKSTEP_SLURM_INSTALL    1 = apt-get install missing packages          [0]
#   LOCKSTEP_SLURM_TIMEOUT    seconds to wait for the node to become usable [60]
set -euo pipefail

BASE=${LOCKSTEP_SLURM_BASE:-/tmp/lockstep-slurm}
CTLD_PORT=${LOCKSTEP_SLURM_CTLD_PORT:-16817}
SLURMD_PORT=${LOCKSTEP_SLURM_SLURMD_PORT:-16818}
TIMEOUT=${LOCKSTEP_SLURM_TIMEOUT:-60}
HOST=$(hostname -s 2>/dev/null || hostname)
NODE=$HOST
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PACKAGES=(munge slurmctld slurmd slurm-client libpmix-dev openmpi-bin)

log() { printf '[local-slurm] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
cannot_run() { log "cannot run here: $*"; exit 77; }

CONF=$BASE/etc/slurm.conf
MUNGE_SOCKET=$BASE/munge/munge.socket
MUNGE_KEY=$BASE/munge-key/munge.key
MUNGE_PID=$BASE/munge/munged.pid
CTLD_PID=$BASE/run/slurmctld.pid
SLURMD_PID=$BASE/run/slurmd.pid
export SLURM_CONF=$CONF

# running PIDFILE NAME: the pid in PIDFILE is alive, is NAME, and is not a zombie (a killed
# daemon not yet reaped still answers kill -0).
running() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]
}
node_state() { timeout 10 sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -n1; }
node_usable() { [[ "$(node_state)" =~ ^(idle|mixed|allocated|completing)$ ]]; }
cluster_up() {
  running "$MUNGE_PID" munged && running "$CTLD_PID" slurmctld && running "$SLURMD_PID" slurmd &&
    node_usable
}
# wait_until SECONDS COMMAND...: polls every 0.2 s.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

if [ "${1:-}" = --status ]; then
  [ -f "$CONF" ] && cluster_up && exit 0
  exit 3
fi

[ "$(id -u)" -eq 0 ] || cannot_run "must be root (munged, slurmctld and slurmd run as root)"

# ---- packages: installed only when allowed, since tests must not change the machine unasked.
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  [ "${LOCKSTEP_SLURM_INSTALL:-0}" = 1 ] ||
    cannot_run "missing packages: ${missing[*]} (install them, or set LOCKSTEP_SLURM_INSTALL=1)"
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Slurm's mpi/pmix plugin dlopen()s the unversioned libpmix.so, which only libpmix-dev ships;
# without it every srun --mpi=pmix fails at launch.
compgen -G "/usr/lib/*/pmix2/lib/libpmix.so" >/dev/null ||
  cannot_run "libpmix.so not found (install libpmix-dev): srun --mpi=pmix would fail"

# ---- configuration
mkdir -p "$BASE"/{etc,state,spool,log,run,munge,munge-key}
chmod 755 "$BASE" "$BASE/munge"  # munged refuses a socket directory others can write to
chmod 700 "$BASE/munge-key"

# Hardware as slurmd sees it; memory declared at 90% so the node is never drained for having
# less than configured.
hardware=$(slurmd -C 2>/dev/null | head -n1)
cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$hardware")
cpus=${cpus:-$(nproc)}
topology=$(grep -o 'Boards=[0-9]* SocketsPerBoard=[0-9]* CoresPerSocket=[0-9]* ThreadsPerCore=[0-9]*' \
  <<<"$hardware" || true)
memory=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$hardware")
memory=$(((${memory:-1024} * 9) / 10))

config=$(cat <<CONF
# Written by lockstep's scripts/local-slurm/start.sh: a private single-node test cluster.
ClusterName=lockstep
SlurmctldHost=${HOST}(127.0.0.1)
SlurmctldPort=${CTLD_PORT}
SlurmdPort=${SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${MUNGE_SOCKET}
StateSaveLocation=${BASE}/state
SlurmdSpoolDir=${BASE}/spool/slurmd-%n
SlurmctldPidFile=${CTLD_PID}
SlurmdPidFile=${SLURMD_PID}
SlurmctldLogFile=${BASE}/log/slurmctld.log
SlurmdLogFile=${BASE}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
# No cgroups (containers, CI runners): track processes through /proc, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Debian's Open MPI talks to srun only through PMIx (it has no PMI-2 client).
MpiDefault=pmix
ReturnToService=2
# Reject jobs that can never fit this node instead of leaving them pending forever.
EnforcePartLimits=ALL
# No accounting database: keep finished jobs visible to 'scontrol show job' for 10 minutes.
MinJobAge=600
SlurmdTimeout=60
NodeName=${NODE} NodeHostname=${HOST} NodeAddr=127.0.0.1 CPUs=${cpus} ${topology} RealMemory=${memory} State=UNKNOWN
PartitionName=debug Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP
CONF
)
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$config" ]; then
  if running "$CTLD_PID" slurmctld || running "$SLURMD_PID" slurmd; then
    log "configuration changed: restarting the daemons"
    LOCKSTEP_SLURM_BASE=$BASE bash "$HERE/stop.sh"
  fi
  printf '%s\n' "$config" >"$CONF"
fi
printf 'export SLURM_CONF=%q\n' "$CONF" >"$BASE/env.sh"

# ---- munged (a private instance on its own socket and key)
[ -s "$MUNGE_KEY" ] || mungekey --create --keyfile="$MUNGE_KEY" >/dev/null
chmod 600 "$MUNGE_KEY"
if ! running "$MUNGE_PID" munged; then
  log "starting munged"
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
  munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_KEY" --pid-file="$MUNGE_PID" \
    --log-file="$BASE/log/munged.log" --seed-file="$BASE/munge/munged.seed" ||
    die "munged did not start; see $BASE/log/munged.log"
  wait_until 15 running "$MUNGE_PID" munged || die "munged did not start; see $BASE/log/munged.log"
fi
munge -n --socket="$MUNGE_SOCKET" | unmunge --socket="$MUNGE_SOCKET" >/dev/null ||
  die "munge credential round trip failed; see $BASE/log/munged.log"

# ---- slurmctld, then slurmd (both daemonise and write their pid files)
if ! running "$CTLD_PID" slurmctld; then
  log "starting slurmctld on port $CTLD_PORT"
  slurmctld -f "$CONF" || die "slurmctld did not start; see $BASE/log/slurmctld.log"
  wait_until 20 running "$CTLD_PID" slurmctld ||
    die "slurmctld did not start; see $BASE/log/slurmctld.log"
fi
wait_until 30 eval 'timeout 5 scontrol ping >/dev/null 2>&1' ||
  die "slurmctld does not answer; see $BASE/log/slurmctld.log"
if ! running "$SLURMD_PID" slurmd; then
  log "starting slurmd for node $NODE on port $SLURMD_PORT"
  slurmd -f "$CONF" -N "$NODE" || die "slurmd did not start; see $BASE/log/slurmd.log"
  wait_until 20 running "$SLURMD_PID" slurmd || die "slurmd did not start; see $BASE/log/slurmd.log"
fi

deadline=$((SECONDS + TIMEOUT))
until node_usable; do
  state=$(node_state)
  case "$state" in
    down* | drain* | fail*) timeout 10 scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  if [ "$SECONDS" -ge "$deadline" ]; then
    tail -n 20 "$BASE/log/slurmctld.log" "$BASE/log/slurmd.log" >&2 || true
    die "node $NODE not usable after ${TIMEOUT}s (state: ${state:-unknown})"
  fi
  sleep 0.5
done
log "up: node $NODE is $(node_state), $cpus CPUs; clients: source $BASE/env.sh"
