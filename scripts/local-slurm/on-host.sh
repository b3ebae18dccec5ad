#!/usr/bin/env bash
# Run a command on a host of the namespace cluster (start.sh --hosts=N): enters the host's
# network and UTS namespaces, so the command sees the host's hostname, interfaces and address.
# This is also Open MPI's launch agent for mpirun across the hosts (env.sh sets
# OMPI_MCA_plm_rsh_agent to this file), used the way ssh would be: ORTE calls
# `on-host.sh HOST 'orted ...'` with a command line meant for a shell, so, like ssh, the words
# after HOST are joined and run by bash. The environment passes through unchanged (the hosts
# share this machine's file system).
#
# Usage: scripts/local-slurm/on-host.sh HOST COMMAND [ARGS...]
#   LOCKSTEP_CLUSTER_BASE   the cluster's base directory  [/tmp/lockstep-cluster]
# Exit: the command's status; 255 (as ssh) when HOST is not a host of the cluster or cannot
# be reached, with a message naming it.
set -uo pipefail
BASE=${LOCKSTEP_CLUSTER_BASE:-/tmp/lockstep-cluster}
source "$(dirname "${BASH_SOURCE[0]}")/hosts.bash"

unreachable() { echo "on-host.sh: host $HOST_NAME: $*" >&2; exit 255; }
[ $# -ge 2 ] || { echo "usage: on-host.sh HOST COMMAND [ARGS...]" >&2; exit 2; }
HOST_NAME=$1
shift
# Open MPI may pass a fully qualified or user@ form; the hosts are plain node names.
HOST_NAME=${HOST_NAME#*@}
HOST_NAME=${HOST_NAME%%.*}
[ -n "$(host_index "$HOST_NAME")" ] && grep -qx "$HOST_NAME" "$HOSTS_FILE" 2>/dev/null ||
  unreachable "not a host of the cluster in $BASE (hosts: $(hosts_listed | tr '\n' ' ')); start it with scripts/local-slurm/start.sh --hosts=N"
[ -e "/run/netns/$(host_ns "$HOST_NAME")" ] && [ -e "$(host_uts "$HOST_NAME")" ] ||
  unreachable "its namespaces are gone (the host was removed or crashed)"
[ "$(on_host "$HOST_NAME" ip -br link show eth0 2>/dev/null | awk '{print $2}')" = UP ] ||
  unreachable "its network link is down (no route to $(host_addr "$HOST_NAME"))"
exec nsenter --net="/run/netns/$(host_ns "$HOST_NAME")" --uts="$(host_uts "$HOST_NAME")" -- bash -c "$*"
