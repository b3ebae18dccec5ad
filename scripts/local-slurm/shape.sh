#!/usr/bin/env bash
# Shape the links of the namespace cluster (start.sh --hosts=N) like a real network: every
# host's link gets RATE in each direction (a token bucket on the host's eth0 for what it sends,
# and on its switch port for what it receives), and, where the kernel has netem, DELAY one way.
# Traffic inside a host (shared memory) is not touched. Shaping stays until --off or stop.sh.
#
# Usage: scripts/local-slurm/shape.sh --rate=RATE [--delay=DELAY]    e.g. --rate=1gbit --delay=100us
#        scripts/local-slurm/shape.sh --off | --show
#   RATE and DELAY in tc's units (10gbit, 1gbit, 500mbit; 20us, 100us).
# Exit: 0 done; 1 failed; 3 netem missing for --delay (nothing changed; the reason printed).
#   LOCKSTEP_CLUSTER_BASE   the cluster's base directory  [/tmp/lockstep-cluster]
set -euo pipefail
BASE=${LOCKSTEP_CLUSTER_BASE:-/tmp/lockstep-cluster}
source "$(dirname "${BASH_SOURCE[0]}")/hosts.bash"

RATE= DELAY= MODE=shape
for arg in "$@"; do
  case "$arg" in
    --rate=*) RATE=${arg#--rate=} ;;
    --delay=*) DELAY=${arg#--delay=} ;;
    --off) MODE=off ;;
    --show) MODE=show ;;
    *) echo "usage: shape.sh --rate=RATE [--delay=DELAY] | --off | --show" >&2; exit 2 ;;
  esac
done
mapfile -t HOSTS < <(hosts_listed)
[ "${#HOSTS[@]}" -gt 0 ] || { echo "shape.sh: no namespace cluster in $BASE (start.sh --hosts=N)" >&2; exit 1; }

# tc_rate_bits RATE: bits per second of a tc rate (10gbit, 1gbit, 500mbit, 64kbit, or bits).
tc_rate_bits() {
  [[ "$1" =~ ^([0-9]+)(gbit|mbit|kbit|bit)?$ ]] || return 1
  case "${BASH_REMATCH[2]}" in
    gbit) echo $((BASH_REMATCH[1] * 1000000000)) ;;
    mbit) echo $((BASH_REMATCH[1] * 1000000)) ;;
    kbit) echo $((BASH_REMATCH[1] * 1000)) ;;
    *) echo "${BASH_REMATCH[1]}" ;;
  esac
}

# Both ends of host H's link: (namespace, device).
links() { echo "$(host_ns "$1") eth0"; echo "$SWITCH_NS lsk-$1"; }

if [ "$MODE" = show ]; then
  for h in "${HOSTS[@]}"; do
    links "$h" | while read -r ns dev; do echo "$ns $dev: $(ip netns exec "$ns" tc qdisc show dev "$dev" | head -n1)"; done
  done
  exit 0
fi
if [ "$MODE" = off ]; then
  for h in "${HOSTS[@]}"; do
    links "$h" | while read -r ns dev; do ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true; done
  done
  echo "shape.sh: links of ${HOSTS[*]} unshaped"
  exit 0
fi
[ -n "$RATE" ] || { echo "shape.sh: give --rate=RATE (e.g. 1gbit)" >&2; exit 2; }
if [ -n "$DELAY" ]; then
  # Probe: a netem qdisc on the switch's bridge (carries no shaped traffic), removed at once.
  if ! err=$(ip netns exec "$SWITCH_NS" tc qdisc add dev br0 root netem delay "$DELAY" 2>&1); then
    echo "shape.sh: cannot add $DELAY of latency: this kernel has no netem qdisc ($err;" \
      "CONFIG_NET_SCH_NETEM is off). Shape the rate alone: --rate=$RATE" >&2
    exit 3
  fi
  ip netns exec "$SWITCH_NS" tc qdisc del dev br0 root
fi

# Token bucket: a burst of 1 ms at RATE (at least one 64 KiB GSO packet, which the veths send
# whole), and a queue of up to 20 ms before packets drop, as a switch buffer would hold.
rate_bps=$(tc_rate_bits "$RATE") || { echo "shape.sh: cannot read rate $RATE (use e.g. 1gbit, 500mbit)" >&2; exit 2; }
burst=$((rate_bps / 8 / 1000))
[ "$burst" -ge 131072 ] || burst=131072
for h in "${HOSTS[@]}"; do
  links "$h" | while read -r ns dev; do
    ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
    if [ -n "$DELAY" ]; then
      ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$DELAY"
      ip netns exec "$ns" tc qdisc add dev "$dev" parent 1: handle 2: tbf rate "$RATE" burst "$burst" latency 20ms
    else
      ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$RATE" burst "$burst" latency 20ms
    fi
  done
done
echo "shape.sh: links of ${HOSTS[*]} shaped to $RATE${DELAY:+, $DELAY one way} (burst $burst bytes)"
