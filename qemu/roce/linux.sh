#!/bin/bash
# Runs inside a Linux guest of qemu/roce/lab.sh (chrooted into this machine's root by
# qemu/lab/init.sh): rdma_rxe on eth0, then Debian's unmodified programs for every case of
# qemu/roce/cases, in order, against the peer.
#   linux.sh KROOT      the rest from the kernel command line:
#   bvroce.role=a|b     a: runs the cases against Linux B (the baseline), then against the
#                       unikernel; b: Linux B, the baseline's other side
#   bvroce.ip=A.B.C.D   this guest's address (/24); its IPv6 one is fd00::D (/64)
#   bvroce.only=a,b     only these cases (lab.sh's BAREVERBS_ROCE_ONLY)
#   bvroce.cases=PATH   the case list (lab.sh's, default qemu/roce/cases next to this script)
#   bvroce.timeout=S    seconds a program may take, its retries included (default 100)
#   bvroce.mark=PATH    qemu/roce/mark.c's program: each perftest case of the phase runs between
#                       two marks for the instruction counter of lab.sh (code 00KK, then 01KK)
#   bvroce.bench=N      the throughput runs instead (b) or after the cases (a): N rounds of the
#                       `read` and `write` cases, each against Linux B and then the unikernel
set -u
kroot=$1
here=$(dirname "$0")
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^bvroce.$1=//p"; }
role=$(arg role) ip=$(arg ip) limit=$(arg timeout)
limit=${limit:-100}
a_ip=10.0.0.1 b_ip=10.0.0.3 uk_ip=10.0.0.2
t0=$(date +%s)
say() { echo "bvroce[$role +$(( $(date +%s) - t0 ))s]: $*"; }

# The 9p root's /dev is a fresh devtmpfs: bash's process substitution needs /dev/fd.
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
for m in rdma_rxe ib_uverbs rdma_ucm; do
  modprobe -d "$kroot" "$m" || { say "modprobe $m failed"; exit 1; }
done
ip link set lo up
ip link set eth0 mtu 1500 up
ip addr add "$ip/24" dev eth0
rdma link add rxe0 type rxe netdev eth0 || { say "rdma link add failed"; exit 1; }
IFS=. read -r o1 o2 o3 o4 <<<"$ip"
# The IPv6 cases' address: fd00::<the IPv4 address's last byte>/64 (no duplicate address
# detection on the lab's own segment: usable at once).
ip6=$(printf 'fd00::%x' "$o4")
ip -6 addr add "$ip6/64" dev eth0 nodad
# The RoCE v2 GID of an address, as sysfs writes it (eight groups of four hex digits).
gid_of() { # SYSFS-FORM -> the index, or nothing
  local n
  for _ in $(seq 1 50); do
    for n in $(seq 0 15); do
      [ "$(cat /sys/class/infiniband/rxe0/ports/1/gids/"$n" 2>/dev/null)" = "$1" ] || continue
      [ "$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/"$n" 2>/dev/null)" = "RoCE v2" ] &&
        { echo "$n"; return; }
    done
    sleep 0.2
  done
}
gid=$(gid_of "$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$o1" "$o2" "$o3" "$o4")")
[ -n "$gid" ] || { say "no RoCE v2 GID for $ip on rxe0"; exit 1; }
gid6=$(gid_of "$(printf 'fd00:0000:0000:0000:0000:0000:0000:%04x' "$o4")")
[ -n "$gid6" ] || { say "no RoCE v2 GID for $ip6 on rxe0"; exit 1; }
say "rxe0 up on eth0, $ip, RoCE v2 GID index $gid, $ip6 GID index $gid6, $(ibv_devinfo -d rxe0 | awk '/active_mtu/ {print "active MTU " $2; exit}')"

# One program of a case: run with a timeout; a client whose server is not listening yet is
# run again (until the case's deadline). Prints the exit status and the program's output.
# "Not listening yet" is what the programs print when their TCP connect to port 18515 fails:
# the pingpong programs "Couldn't connect to HOST:PORT", perftest "Unable to open file
# descriptor for socket connection" (then " Unable to init the socket connection"), rping
# "RDMA_CM_EVENT_REJECTED, error 8" and ucmatose "…REJECTED, error: 8" (the CM's "invalid
# service ID": nobody listens), udaddy "…UNREACHABLE" (its SIDR_REP's "no such service"), or
# an ADDR_ERROR (the peer's address did not resolve yet); perftest -R "Unexpected CM event
# bl blka 8" (its control connection REJECTED).
run() { # TAG CLIENT(0|1) PROGRAM ARGS...
  local tag=$1 client=$2 deadline=$(( $(date +%s) + limit )) out st tries=0
  shift 2
  while :; do
    tries=$((tries + 1))
    out=$(timeout $(( deadline - $(date +%s) > 1 ? deadline - $(date +%s) : 1 )) "$@" 2>&1); st=$?
    [ "$client" = 1 ] && [ "$st" != 0 ] && [ "$(date +%s)" -lt "$deadline" ] &&
      grep -qE "Couldn't connect to [0-9.]+:[0-9]+|Unable to open file descriptor for socket connection|RDMA_CM_EVENT_REJECTED, error:? 8|RDMA_CM_EVENT_ADDR_ERROR|udaddy: event: RDMA_CM_EVENT_UNREACHABLE|Unexpected CM event bl blka 8" <<<"$out" &&
      { sleep 0.5; continue; }
    break
  done
  [ "$tries" = 1 ] || echo "  [$tag] (run $tries times: the peer was not listening yet)"
  while IFS= read -r l; do echo "  [$tag] $l"; done <<<"$out"
  # The programs' own summary: pingpong's throughput line, perftest's result row.
  local sum
  sum=$(grep -E "bytes in .* seconds" <<<"$out" | head -1)
  [ -n "$sum" ] || sum=$(summary <<<"$out")
  # A failure leaves what rxe counted and what the kernel said (the CM drops a malformed
  # MAD without a word; its counters show what it took, sent and retried).
  if [ "$st" != 0 ]; then
    local d=/sys/class/infiniband/rxe0/ports/1
    echo "  [$tag] rxe counters: $(cd "$d/hw_counters" 2>/dev/null && grep -H . ./* 2>/dev/null | sed 's|^\./||' | grep -v ':0$' | tr '\n' ' ')"
    echo "  [$tag] cm rx: $(cd "$d/cm_rx_msgs" 2>/dev/null && grep -H . ./* 2>/dev/null | sed 's|^\./||' | grep -v ':0$' | tr '\n' ' ')"
    echo "  [$tag] cm tx: $(cd "$d/cm_tx_msgs" 2>/dev/null && grep -H . ./* 2>/dev/null | sed 's|^\./||' | grep -v ':0$' | tr '\n' ' ')"
    # The kernel's first warning or oops whole (which function, its call trace), then the
    # last lines.
    dmesg 2>/dev/null | grep -m1 -A30 -E "WARNING:|BUG:|Oops" | sed "s/^/  [$tag] dmesg: /"
    dmesg 2>/dev/null | tail -5 | sed "s/^/  [$tag] dmesg: /"
  fi
  echo "bvroce-result $tag: exit $st${sum:+ | $sum}"
}

# The program each case runs (program), perftest's summary row (summary), the case list
# (cases): qemu/roce/programs.sh, which qemu/roce/verdict-selftest.sh checks on the host.
# shellcheck source=qemu/roce/programs.sh
source "$here/programs.sh"

only=$(arg only | tr , ' ')
cases_file=$(arg cases)
cases_file=${cases_file:-$here/cases}

# perftest 4.5-0.17's -R client connects its data QP as soon as it has the server's first
# blank message, and after a REJ (nobody listening yet) it tries again with the CM IDs it has
# just destroyed, and crashes; a Linux server often listens only after that (the unikernel
# listens from the start). So between two Linux guests the client's CM messages (UDP 4791
# to QP 1: the BTH's destination QP at byte 32 of the IP packet) wait 300 ms on the way out.
cm_delay() { # on|off
  if [ "$1" = on ]; then
    modprobe -d "$kroot" -a sch_prio sch_netem cls_u32 || return 0
    tc qdisc add dev eth0 root handle 1: prio bands 3 priomap 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 &&
      tc qdisc add dev eth0 parent 1:3 handle 30: netem delay 300ms &&
      tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip protocol 17 0xff \
        match ip dport 4791 0xffff match u32 0x00000001 0x00ffffff at 32 flowid 1:3 ||
      say "cm_delay: tc failed"
  else
    tc qdisc del dev eth0 root 2>/dev/null || true
  fi
}

# The instruction counter's window of a perftest case (qemu/roce/icount.c): code 00KK opens it,
# 01KK closes it; KK as the unikernel numbers the cases (write 1, read 2, atomic 3).
mark=$(arg mark)
window() { # 0|1 LABEL (a program's first case only: `write`, not `write#2`)
  local k
  [ -n "$mark" ] || return 0
  case "$2" in write) k=01 ;; read) k=02 ;; atomic) k=03 ;; *) return 0 ;; esac
  "$mark" "0$1$k" || say "mark 0$1$k failed"
}

# The cases the baseline does not run (qemu/roce/cases' `#@ no-baseline` line).
nobase=" $(sed -n 's/^#@ no-baseline //p' "$cases_file" | tr '\n' ' ') "
phase() { # SIDE(a|other) PREFIX PEER_IP: every case against the peer, results "PREFIX label"
  local label name opts delay
  while read -r label name opts; do
    [ "$2" != roce ] && [[ "$nobase" == *" $name "* ]] && continue
    read -r -a opt <<<"$opts"
    program "$1" "$name" "$3" "${opt[@]}"
    if [ ${#cmd[@]} = 0 ]; then
      echo "bvroce-result $2 $label: no program (linux.sh knows no command for $name)"
      continue
    fi
    delay=0
    [ "$2" != roce ] && [ "$client" = 1 ] && [[ "$name" == ib_*-* ]] && [[ " $opts " == *" -R "* ]] && delay=1
    # mckey's sender sends once, 3 s after its join: 2 s more for the receiver (started at
    # about the same time on the other side) to have joined and attached first.
    [[ "$name" == mckey-* ]] && [ "$client" = 1 ] && sleep 2
    # ucmatose and udaddy with several connections (-c, over IPv4 or IPv6): a client run whose requests straddle
    # the moment Linux B's server starts listening has some rejected and exits; a request of
    # that run the server takes after ("failure accepting: Invalid argument") ends the server,
    # and every later run is rejected. The same head start for the server makes that unlikely.
    [ "$2" != roce ] && [ "$client" = 1 ] &&
      [[ "$name" == ucmatose-* || "$name" == udaddy-* || "$name" == ucmatose6-* || "$name" == udaddy6-* ]] &&
      [[ " $opts " == *" -c "* ]] && delay=1
    window 0 "$label"
    [ "$delay" = 1 ] && cm_delay on
    run "$2 $label" "$client" "${cmd[@]}"
    [ "$delay" = 1 ] && cm_delay off
    window 1 "$label"
  done < <(cases)
}

# The throughput runs: N rounds of `read` and `write`; Linux A runs each against Linux B, then
# against the unikernel (results "bench-linux CASE I", "bench-roce CASE I"). Linux B and the
# unikernel are both up, so Linux A's server (for `write`) would take whichever client comes
# first: against Linux B it listens on another port than the unikernel's 18515.
bench=$(arg bench)
bench_port=18516
# Linux B boots for these as soon as its baseline side is over, while Linux A still runs every
# case against the unikernel: B's first program (the `write` client) waits for A's whole phase,
# not for one case, so it may retry for four times a case's time (a retry only while A is not
# listening yet; the lab's own timeout bounds it all).
bench() { # SIDE(a|other)
  local i label name opts first=1
  for i in $(seq 1 "$bench"); do
    while read -r label name opts; do
      [ "$label" = read ] || [ "$label" = write ] || continue
      read -r -a opt <<<"$opts"
      if [ "$1" = a ]; then
        program a "$name" "$b_ip" "${opt[@]}" -p "$bench_port"
        run "bench-linux $name $i" "$client" "${cmd[@]}"
        program a "$name" "$uk_ip" "${opt[@]}"
        run "bench-roce $name $i" "$client" "${cmd[@]}"
      else
        program other "$name" "$a_ip" "${opt[@]}" -p "$bench_port"
        if [ "$first" = 1 ]; then
          limit=$(( limit * 4 )) run "bench-b $name $i" "$client" "${cmd[@]}"
        else
          run "bench-b $name $i" "$client" "${cmd[@]}"
        fi
      fi
      first=0
    done < <(cases)
  done
}

if [ "$role" = b ]; then
  if [ "${bench:-0}" -gt 0 ]; then
    bench other
    say "bench side done"
    exit 0
  fi
  phase other b "$a_ip"
  say "baseline side done"
  exit 0
fi

say "phase baseline (Linux B at $b_ip)"
phase a linux-linux "$b_ip"
say "phase unikernel (at $uk_ip)"
phase a roce "$uk_ip"
if [ "${bench:-0}" -gt 0 ]; then
  say "phase bench ($bench rounds)"
  bench a
fi
say "done"
