# Sourced by start.sh, stop.sh, on-host.sh and shape.sh (not run): the "hosts" of the local
# multi-node cluster. Each host is a Linux network namespace (its own interfaces, addresses and
# ports) plus a UTS namespace (its own hostname), both kept alive by bind mounts, so a process
# entered into them (on-host.sh) looks and talks like a process on another machine, while the
# file system, /dev/shm and the CPUs stay shared. All hosts hang off one bridge that lives in a
# namespace of its own ("the switch"); the root namespace joins it as the head node (slurmctld,
# munged, the user's sbatch/mpirun) through one veth. Nothing is routed anywhere else: the only
# addresses in play are the subnet below, on interfaces this file creates.
#
#   host i (1..N):  name node$i, namespace lockstep-node$i, address $SUBNET.$((10 + i)), eth0
#   switch:         namespace lockstep-switch, bridge br0, ports lsk-node$i and lsk-head
#   head:           the root namespace, address $SUBNET.1 on lsk-head
#
# Callers set BASE (the cluster's folder) before sourcing. Settings (environment):
#   LOCKSTEP_CLUSTER_SUBNET   first three octets of the cluster's /24   [10.213.0]
#   LOCKSTEP_CLUSTER_PREFIX   namespace name prefix                      [lockstep]

CLUSTER_SUBNET=${LOCKSTEP_CLUSTER_SUBNET:-10.213.0}
CLUSTER_PREFIX=${LOCKSTEP_CLUSTER_PREFIX:-lockstep}
SWITCH_NS=$CLUSTER_PREFIX-switch
HEAD_LINK=lsk-head
HEAD_ADDR=$CLUSTER_SUBNET.1
HOSTS_FILE=$BASE/hosts.list  # one host name a line, written when the hosts are up

host_ns() { echo "$CLUSTER_PREFIX-$1"; }
host_uts() { echo "$BASE/ns/$1.uts"; }
host_index() { [[ "$1" =~ ^node([0-9]+)$ ]] && echo "${BASH_REMATCH[1]}"; }
host_addr() { echo "$CLUSTER_SUBNET.$((10 + $(host_index "$1")))"; }
hosts_listed() { if [ -s "$HOSTS_FILE" ]; then cat "$HOSTS_FILE"; fi; }

# hosts_possible: empty when namespaces can be made here, else the reason (for exit 77).
hosts_possible() {
  [ "$(id -u)" -eq 0 ] || { echo "creating network namespaces needs root"; return; }
  command -v ip >/dev/null || { echo "ip (iproute2) not installed"; return; }
  command -v nsenter >/dev/null && command -v unshare >/dev/null ||
    { echo "nsenter/unshare (util-linux) not installed"; return; }
  local probe=$CLUSTER_PREFIX-probe$$ err
  if ! err=$(ip netns add "$probe" 2>&1); then
    echo "ip netns add fails here: $err"
    return
  fi
  if ! err=$(ip link add lsk-probe$$ netns "$probe" type veth peer name p1 netns "$probe" 2>&1); then
    ip netns del "$probe" 2>/dev/null
    echo "veth pairs cannot be created here: $err"
    return
  fi
  ip netns del "$probe" 2>/dev/null
}

# on_host HOST CMD...: runs CMD inside HOST's network and UTS namespaces.
on_host() {
  local host=$1
  shift
  nsenter --net="/run/netns/$(host_ns "$host")" --uts="$(host_uts "$host")" -- "$@"
}

# host_pids HOST: the processes inside HOST's network namespace (so only processes that
# entered this cluster's namespaces are ever listed).
host_pids() {
  [ -e "/run/netns/$(host_ns "$1")" ] || return 0
  ip netns pids "$(host_ns "$1")" 2>/dev/null
}

# kill_host HOST [SIGNAL]: signals every process on HOST (a host "crashing").
kill_host() {
  local pids
  pids=$(host_pids "$1")
  [ -n "$pids" ] && kill -"${2:-KILL}" $pids 2>/dev/null
  return 0
}

# hosts_down: removes every host and the switch this cluster made (also the leftovers of a run
# that crashed: it looks for the namespaces by name, not only for those in hosts.list). Kills
# the processes still inside the hosts first; a namespace with processes would live on.
hosts_down() {
  local ns host
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$CLUSTER_PREFIX-node[0-9]*$"); do
    host=${ns#"$CLUSTER_PREFIX"-}
    if [ -n "$(host_pids "$host")" ]; then
      kill_host "$host" TERM
      for _ in $(seq 20); do [ -z "$(host_pids "$host")" ] && break; sleep 0.1; done
      kill_host "$host" KILL
    fi
    ip netns del "$ns" 2>/dev/null
    # Shared-memory segments of ranks killed on this host (a crash test) are never unlinked by
    # their owners; Open MPI names them after the host, so these are this cluster's own.
    rm -f /dev/shm/vader_segment."$host".*
  done
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$SWITCH_NS" && ip netns del "$SWITCH_NS"
  ip link del "$HEAD_LINK" 2>/dev/null  # usually gone with its peer in the switch already
  local f
  for f in "$BASE"/ns/*.uts; do
    [ -e "$f" ] || continue
    umount "$f" 2>/dev/null
    rm -f "$f"
  done
  rm -f "$HOSTS_FILE"
  return 0
}

# hosts_up N: creates hosts node1..nodeN, the switch and the head link (after removing what a
# previous run left). Returns non-zero, with the reason on stderr, when a step fails.
hosts_up() {
  local n=$1 i host ns
  hosts_down
  mkdir -p "$BASE/ns"
  ip netns add "$SWITCH_NS" || return 1
  ip -n "$SWITCH_NS" link add br0 type bridge || return 1
  ip -n "$SWITCH_NS" link set br0 up || return 1
  ip link add "$HEAD_LINK" type veth peer name head netns "$SWITCH_NS" || return 1
  ip -n "$SWITCH_NS" link set head master br0 up || return 1
  ip addr add "$HEAD_ADDR/24" dev "$HEAD_LINK" || return 1
  ip link set "$HEAD_LINK" up || return 1
  for i in $(seq "$n"); do
    host=node$i
    ns=$(host_ns "$host")
    ip netns add "$ns" || return 1
    ip link add "lsk-$host" netns "$SWITCH_NS" type veth peer name eth0 netns "$ns" || return 1
    ip -n "$SWITCH_NS" link set "lsk-$host" master br0 up || return 1
    ip -n "$ns" link set lo up || return 1
    ip -n "$ns" addr add "$(host_addr "$host")/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    : >"$(host_uts "$host")"
    unshare --uts="$(host_uts "$host")" hostname "$host" || return 1
  done
  seq -f 'node%g' "$n" >"$HOSTS_FILE"
}

# host_reachable HOST: the head reaches HOST's address and HOST reaches the head (TCP connect
# to a closed port answers at once with a refusal when the path works; a dead path times out).
host_reachable() {
  local there back
  there=$(timeout 2 bash -c "exec 3<>/dev/tcp/$(host_addr "$1")/9" 2>&1)
  back=$(on_host "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$HEAD_ADDR/9" 2>&1)
  [[ "$there" == *refused* && "$back" == *refused* ]]
}
