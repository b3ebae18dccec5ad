#!/usr/bin/env bash
# Start a private Slurm cluster for lockstep's tests: munged, slurmctld and slurmd, all as root,
# configured under one base directory (nothing written to /etc, no systemd, no cgroups).
# Idempotent: when the cluster is already up this only checks it (a changed config restarts the
# daemons). Afterwards every Slurm client command needs the generated config:
#     source "${LOCKSTEP_SLURM_BASE:-/tmp/lockstep-slurm}/env.sh"    # exports SLURM_CONF
#
# Two shapes:
#   start.sh              one node: this machine under its own hostname, on 127.0.0.1.
#   start.sh --hosts=N    N nodes node1..nodeN, each a network + UTS namespace with its own
#                         hostname, address and slurmd (scripts/local-slurm/hosts.bash); this
#                         machine is the head node (slurmctld, munged, sbatch, mpirun). Its
#                         env.sh also sets up mpirun across the hosts: a hostfile, the launch
#                         agent on-host.sh (no ssh), and Open MPI's TCP restricted to the
#                         cluster's subnet. Stop it with stop.sh --hosts; a failed start removes
#                         what it made, and a start after a crash first clears the leftovers.
#                         Base directory /tmp/lockstep-cluster, ports 16827/16828.
#
# Usage: scripts/local-slurm/start.sh [--hosts=N] [--status]
#   --status   exit 0 when the cluster is up and its nodes usable, 3 when not; start nothing.
# Exit codes: 0 up; 1 failed (logs named on stderr); 77 cannot run here (not root, packages
# missing and installing not allowed, no network namespaces): the reason is printed.
#
# Settings (environment):
#   LOCKSTEP_SLURM_BASE       base directory, one node                      [/tmp/lockstep-slurm]
#   LOCKSTEP_CLUSTER_BASE     base directory, --hosts                       [/tmp/lockstep-cluster]
#   LOCKSTEP_SLURM_CTLD_PORT  slurmctld port (not 6817, so a system Slurm is left alone) [16817]
#   LOCKSTEP_SLURM_SLURMD_PORT slurmd port                                 [16818]
#   LOCKSTEP_SLURM_INSTALL    1 = apt-get install missing packages          [0]
#   LOCKSTEP_SLURM_TIMEOUT    seconds to wait for the nodes to become usable [60]
#   LOCKSTEP_CLUSTER_SUBNET   --hosts: the cluster's /24, first three octets [10.213.0]
set -euo pipefail

HOSTS=0
STATUS=0
for arg in "$@"; do
  case "$arg" in
    --status) STATUS=1 ;;
    --hosts=*) HOSTS=${arg#--hosts=} ;;
    *) echo "usage: start.sh [--hosts=N] [--status]" >&2; exit 2 ;;
  esac
done
[[ "$HOSTS" =~ ^[0-9]+$ ]] && { [ "$HOSTS" = 0 ] || [ "$HOSTS" -ge 2 ]; } && [ "$HOSTS" -le 200 ] ||
  { echo "start.sh: --hosts=$HOSTS: give a number of hosts from 2 to 200" >&2; exit 2; }
HOST=$(hostname -s 2>/dev/null || hostname)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PACKAGES=(munge slurmctld slurmd slurm-client libpmix-dev openmpi-bin)
if [ "$HOSTS" = 0 ]; then
  BASE=${LOCKSTEP_SLURM_BASE:-/tmp/lockstep-slurm}
  CTLD_PORT=${LOCKSTEP_SLURM_CTLD_PORT:-16817}
  SLURMD_PORT=${LOCKSTEP_SLURM_SLURMD_PORT:-16818}
  NODES=("$HOST")
  CTLD_ADDR=127.0.0.1
else
  # Its own folder and ports, so the one-node cluster of other tests can run beside it.
  BASE=${LOCKSTEP_CLUSTER_BASE:-/tmp/lockstep-cluster}
  CTLD_PORT=${LOCKSTEP_SLURM_CTLD_PORT:-16827}
  SLURMD_PORT=${LOCKSTEP_SLURM_SLURMD_PORT:-16828}
  source "$HERE/hosts.bash"
  mapfile -t NODES < <(seq -f 'node%g' "$HOSTS")
  CTLD_ADDR=$HEAD_ADDR
  PACKAGES+=(iproute2 util-linux)
fi
TIMEOUT=${LOCKSTEP_SLURM_TIMEOUT:-60}

log() { printf '[local-slurm] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
cannot_run() { log "cannot run here: $*"; exit 77; }

CONF=$BASE/etc/slurm.conf
MUNGE_SOCKET=$BASE/munge/munge.socket
MUNGE_KEY=$BASE/munge-key/munge.key
MUNGE_PID=$BASE/munge/munged.pid
CTLD_PID=$BASE/run/slurmctld.pid
export SLURM_CONF=$CONF
# One slurmd per node: pid and log files by node name (slurm.conf's %n).
slurmd_pid() { if [ "$HOSTS" = 0 ]; then echo "$BASE/run/slurmd.pid"; else echo "$BASE/run/slurmd-$1.pid"; fi; }

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
node_state() { timeout 10 sinfo -h -N -n "$1" -o '%T' 2>/dev/null | head -n1; }
node_usable() { [[ "$(node_state "$1")" =~ ^(idle|mixed|allocated|completing)$ ]]; }
cluster_up() {
  local node
  running "$MUNGE_PID" munged && running "$CTLD_PID" slurmctld || return 1
  for node in "${NODES[@]}"; do
    running "$(slurmd_pid "$node")" slurmd && node_usable "$node" || return 1
    if [ "$HOSTS" != 0 ]; then host_reachable "$node" || return 1; fi
  done
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

if [ "$STATUS" = 1 ]; then
  [ -f "$CONF" ] && cluster_up && exit 0
  exit 3
fi

[ "$(id -u)" -eq 0 ] || cannot_run "must be root (munged, slurmctld and slurmd run as root)"
if [ "$HOSTS" != 0 ]; then
  why=$(hosts_possible)
  [ -z "$why" ] || cannot_run "no namespace hosts here: $why"
fi

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

# ---- the hosts (--hosts): namespaces first, since slurmd runs inside them. A failed start
# removes everything it made (stop.sh --hosts), so no namespace or daemon is left behind.
if [ "$HOSTS" != 0 ]; then
  trap 'rc=$?; if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
          log "start failed: removing the cluster"; bash "$HERE/stop.sh" --hosts; fi' EXIT
  mkdir -p "$BASE/run"
  have=$(hosts_listed | tr '\n' ' ')
  want=$(printf '%s ' "${NODES[@]}")
  healthy=1
  [ "$have" = "$want" ] || healthy=0
  for node in "${NODES[@]}"; do
    [ "$healthy" = 1 ] && [ -e "/run/netns/$(host_ns "$node")" ] && host_reachable "$node" || healthy=0
  done
  if [ "$healthy" = 0 ]; then
    # Whatever a previous run left (a crash, another --hosts count) goes first.
    bash "$HERE/stop.sh" --hosts
    log "creating hosts ${NODES[*]} on $CLUSTER_SUBNET.0/24 (head $HOST at $HEAD_ADDR)"
    hosts_up "$HOSTS" || die "could not create the namespace hosts (see above)"
    for node in "${NODES[@]}"; do
      host_reachable "$node" || die "host $node ($(host_addr "$node")) cannot be reached from the head"
    done
  fi
fi

# ---- configuration
mkdir -p "$BASE"/{etc,state,spool,log,run,munge,munge-key}
chmod 755 "$BASE" "$BASE/munge"  # munged refuses a socket directory others can write to
chmod 700 "$BASE/munge-key"

# Hardware as slurmd sees it; memory declared at 90% so the node is never drained for having
# less than configured. Every namespace host sees the whole machine: its CPUs are shared.
hardware=$(slurmd -C 2>/dev/null | head -n1)
cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$hardware")
cpus=${cpus:-$(nproc)}
topology=$(grep -o 'Boards=[0-9]* SocketsPerBoard=[0-9]* CoresPerSocket=[0-9]* ThreadsPerCore=[0-9]*' \
  <<<"$hardware" || true)
memory=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$hardware")
memory=$(((${memory:-1024} * 9) / 10))

if [ "$HOSTS" = 0 ]; then
  shape="a private single-node test cluster"
  node_lines="NodeName=${HOST} NodeHostname=${HOST} NodeAddr=127.0.0.1 CPUs=${cpus} ${topology} RealMemory=${memory} State=UNKNOWN"
  # A down node is noticed after SlurmdTimeout; one node has nobody to notice it anyway.
  slurmd_timeout=60
  tmp_fs="TmpFS=/tmp"
  pid_file=$BASE/run/slurmd.pid
  slurmd_log=$BASE/log/slurmd.log
else
  shape="a private cluster of $HOSTS namespace hosts (scripts/local-slurm/hosts.bash)"
  node_lines=
  for node in "${NODES[@]}"; do
    node_lines+="NodeName=${node} NodeHostname=${node} NodeAddr=$(host_addr "$node") CPUs=${cpus} ${topology} RealMemory=${memory} State=UNKNOWN"$'\n'
  done
  node_lines=${node_lines%$'\n'}
  # A crashed host must end its jobs within seconds, not the default 5 minutes; the pings all
  # stay on this machine, so 10 s only misses a slurmd that is really gone.
  slurmd_timeout=10
  # Each host's "local" temporary folder: Slurm's PMIx plugin makes per-step folders under
  # TmpFS (spmix_appdir_UID_JOB.STEP), and the hosts share /tmp, so with the default the
  # second host of a step fails to launch ("Cannot create directory ...: File exists").
  tmp_fs="TmpFS=$BASE/tmp/%n"
  for node in "${NODES[@]}"; do mkdir -p "$BASE/tmp/$node"; done
  pid_file=$BASE/run/slurmd-%n.pid
  slurmd_log=$BASE/log/slurmd-%n.log
fi

config=$(cat <<CONF
# Written by lockstep's scripts/local-slurm/start.sh: ${shape}.
ClusterName=lockstep
SlurmctldHost=${HOST}(${CTLD_ADDR})
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
SlurmdPidFile=${pid_file}
SlurmctldLogFile=${BASE}/log/slurmctld.log
SlurmdLogFile=${slurmd_log}
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
SlurmdTimeout=${slurmd_timeout}
${tmp_fs}
${node_lines}
PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP
CONF
)
slurmd_running() {
  local node
  for node in "${NODES[@]}"; do running "$(slurmd_pid "$node")" slurmd && return 0; done
  return 1
}
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$config" ]; then
  if running "$CTLD_PID" slurmctld || slurmd_running; then
    log "configuration changed: restarting the daemons"
    if [ "$HOSTS" = 0 ]; then
      LOCKSTEP_SLURM_BASE=$BASE bash "$HERE/stop.sh"
    else
      LOCKSTEP_CLUSTER_BASE=$BASE bash "$HERE/stop.sh" --hosts --keep-hosts
    fi
  fi
  printf '%s\n' "$config" >"$CONF"
fi
{
  printf 'export SLURM_CONF=%q\n' "$CONF"
  if [ "$HOSTS" != 0 ]; then
    # mpirun across the hosts: `mpirun --hostfile "$LOCKSTEP_CLUSTER_HOSTFILE" -np N ...`
    # starts its daemons through on-host.sh (enters the host's namespaces; no ssh), and Open
    # MPI's TCP (its out-of-band channel and the tcp BTL between hosts) stays on the cluster's
    # subnet. Inside a host, ranks use shared memory as on any node.
    printf 'export LOCKSTEP_CLUSTER_BASE=%q\n' "$BASE"
    printf 'export LOCKSTEP_CLUSTER_HOSTFILE=%q\n' "$BASE/hostfile"
    printf 'export OMPI_MCA_plm_rsh_agent=%q\n' "$HERE/on-host.sh"
    printf 'export OMPI_MCA_oob_tcp_if_include=%q\n' "$CLUSTER_SUBNET.0/24"
    printf 'export OMPI_MCA_btl_tcp_if_include=%q\n' "$CLUSTER_SUBNET.0/24"
  fi
} >"$BASE/env.sh"
if [ "$HOSTS" != 0 ]; then
  for node in "${NODES[@]}"; do echo "$node slots=$cpus"; done >"$BASE/hostfile"
fi

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

# ---- slurmctld, then one slurmd per node (both daemonise and write their pid files); on the
# namespace hosts each slurmd starts inside its host, so its jobs' tasks live there too.
if ! running "$CTLD_PID" slurmctld; then
  log "starting slurmctld on port $CTLD_PORT"
  slurmctld -f "$CONF" || die "slurmctld did not start; see $BASE/log/slurmctld.log"
  wait_until 20 running "$CTLD_PID" slurmctld ||
    die "slurmctld did not start; see $BASE/log/slurmctld.log"
fi
wait_until 30 eval 'timeout 5 scontrol ping >/dev/null 2>&1' ||
  die "slurmctld does not answer; see $BASE/log/slurmctld.log"
for node in "${NODES[@]}"; do
  running "$(slurmd_pid "$node")" slurmd && continue
  node_log=${slurmd_log//%n/$node}
  log "starting slurmd for node $node on port $SLURMD_PORT"
  if [ "$HOSTS" = 0 ]; then
    slurmd -f "$CONF" -N "$node" || die "slurmd did not start; see $node_log"
  else
    on_host "$node" slurmd -f "$CONF" -N "$node" || die "slurmd of host $node did not start; see $node_log"
  fi
  wait_until 20 running "$(slurmd_pid "$node")" slurmd || die "slurmd of $node did not start; see $node_log"
done

deadline=$((SECONDS + TIMEOUT))
for node in "${NODES[@]}"; do
  until node_usable "$node"; do
    state=$(node_state "$node")
    case "$state" in
      down* | drain* | fail*) timeout 10 scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$BASE/log/slurmctld.log" "${slurmd_log//%n/$node}" >&2 || true
      die "node $node not usable after ${TIMEOUT}s (state: ${state:-unknown})"
    fi
    sleep 0.5
  done
done
log "up: $(printf '%s ' "${NODES[@]}")($(node_state "${NODES[0]}")), $cpus CPUs each; clients: source $BASE/env.sh"
