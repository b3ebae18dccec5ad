#!/usr/bin/env bash
# Stop the private Slurm cluster started by start.sh: cancel its jobs, then stop slurmd,
# slurmctld and munged through their pid files, and only when the process behind a pid still
# has the expected name (never by name-matching: other Slurm or munge instances may run here).
# With --hosts, the namespace cluster of start.sh --hosts=N: its slurmds, then whatever still
# runs inside its hosts, then the hosts themselves (namespaces, veths, the bridge).
# Idempotent: with nothing running it exits 0; it also clears what a crashed start left.
#
# Usage: scripts/local-slurm/stop.sh [--hosts [--keep-hosts]] [--purge]
#   --purge       also removes the base directory.
#   --keep-hosts  stops the daemons but leaves the namespace hosts (start.sh uses it to restart)
#   LOCKSTEP_SLURM_BASE    base directory used by start.sh          [/tmp/lockstep-slurm]
#   LOCKSTEP_CLUSTER_BASE  base directory used by start.sh --hosts  [/tmp/lockstep-cluster]
set -uo pipefail

PURGE=0
HOSTS=0
KEEP_HOSTS=0
for arg in "$@"; do
  case "$arg" in
    --purge) PURGE=1 ;;
    --hosts) HOSTS=1 ;;
    --keep-hosts) KEEP_HOSTS=1 ;;
    *) echo "usage: stop.sh [--hosts [--keep-hosts]] [--purge]" >&2; exit 2 ;;
  esac
done
if [ "$HOSTS" = 1 ]; then
  BASE=${LOCKSTEP_CLUSTER_BASE:-/tmp/lockstep-cluster}
  source "$(dirname "${BASH_SOURCE[0]}")/hosts.bash"
else
  BASE=${LOCKSTEP_SLURM_BASE:-/tmp/lockstep-slurm}
fi

log() { printf '[local-slurm] %s\n' "$*" >&2; }

alive() {
  kill -0 "$1" 2>/dev/null || return 1
  [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ] || return 1
  [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]
}

# stop PIDFILE NAME: SIGTERM, up to 10 s, then SIGKILL.
stop() {
  local pid
  [ -s "$1" ] || return 0
  pid=$(cat "$1" 2>/dev/null)
  if [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" "$2"; then
    log "stopping $2 (pid $pid)"
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do
      alive "$pid" "$2" || break
      sleep 0.1
    done
    if alive "$pid" "$2"; then
      log "$2 (pid $pid) ignored SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null
      sleep 0.2
    fi
  fi
  rm -f "$1"
}

# Jobs first, so no slurmstepd or task outlives slurmd.
if [ -f "$BASE/etc/slurm.conf" ] && [ -s "$BASE/run/slurmctld.pid" ] &&
  alive "$(cat "$BASE/run/slurmctld.pid")" slurmctld; then
  export SLURM_CONF=$BASE/etc/slurm.conf
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null)
  if [ -n "$jobs" ]; then
    log "cancelling jobs: $(echo $jobs)"
    timeout 10 scancel --full --quiet $jobs 2>/dev/null || true
    for _ in $(seq 50); do
      [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
fi

for pid_file in "$BASE"/run/slurmd.pid "$BASE"/run/slurmd-*.pid; do
  [ -e "$pid_file" ] && stop "$pid_file" slurmd
done
stop "$BASE/run/slurmctld.pid" slurmctld
stop "$BASE/munge/munged.pid" munged
if [ "$HOSTS" = 1 ] && [ "$KEEP_HOSTS" = 0 ]; then
  [ -n "$(hosts_listed)" ] && log "removing hosts $(hosts_listed | tr '\n' ' ')"
  hosts_down
fi

if [ "$PURGE" = 1 ]; then
  log "removing $BASE"
  rm -rf -- "$BASE"
fi
exit 0
