#!/bin/bash
# cmtime (rdma-core 44's librdmacm-utils) for qemu/roce/linux.sh, in a Linux guest:
#   cmtime.sh server IP [-c N]         cmtime's server bound to IP
#   cmtime.sh client PEER [-c N]       cmtime's client against PEER
# Both print cmtime's own output and exit 0 only if all N connections (100 by default) were
# made and ended:
# - cmtime's server never exits by itself and says nothing of what it served, so this runs it
#   until the device's CM counters (sysfs cm_tx_msgs, cm_rx_msgs) show N more REPs sent, N
#   more RTUs and DREQs taken and N more DREPs sent than before it started, then stops it.
# - cmtime's client exits 0 even when connections were rejected or failed (it prints an
#   `event: …, error: …` line for each): such a line is a failure here, so that linux.sh runs
#   the client again while the peer does not listen yet.
set -u
role=$1 addr=$2
shift 2
n=100
args=("$@")
while [ $# -gt 0 ]; do
  case "$1" in -c) n=$2; shift ;; esac
  shift
done
port=/sys/class/infiniband/rxe0/ports/1
count() { cat "$port/$1" 2>/dev/null || echo 0; }
snapshot() { echo "$(count cm_tx_msgs/rep) $(count cm_rx_msgs/rtu) $(count cm_rx_msgs/dreq) $(count cm_tx_msgs/drep)"; }
if [ "$role" = client ]; then
  out=$(cmtime -s "$addr" "${args[@]}" 2>&1)
  st=$?
  echo "$out"
  if [ "$st" = 0 ] && grep -qE "error|ERROR" <<<"$out"; then
    echo "cmtime.sh: connections failed (above)"
    exit 1
  fi
  exit "$st"
fi
read -r rep0 rtu0 dreq0 drep0 < <(snapshot)
cmtime -b "$addr" "${args[@]}" &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  read -r rep rtu dreq drep < <(snapshot)
  if [ $((drep - drep0)) -ge "$n" ] && [ $((rtu - rtu0)) -ge "$n" ]; then
    break
  fi
  sleep 0.2
done
alive=0
kill -0 "$pid" 2>/dev/null && alive=1
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
read -r rep rtu dreq drep < <(snapshot)
d_rep=$((rep - rep0)) d_rtu=$((rtu - rtu0)) d_dreq=$((dreq - dreq0)) d_drep=$((drep - drep0))
echo "cmtime server: $d_rep REPs sent, $d_rtu RTUs taken, $d_dreq DREQs taken, $d_drep DREPs sent (of $n connections)"
[ "$alive" = 1 ] && [ "$d_rep" -ge "$n" ] && [ "$d_rtu" -ge "$n" ] && [ "$d_dreq" -ge "$n" ] && [ "$d_drep" -ge "$n" ]
