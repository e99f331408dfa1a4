#!/bin/bash
# Runs inside Linux A of qemu/roce/nvmf-multipath.sh (chrooted into this machine's root by
# qemu/lab/init.sh): Linux's nvme-rdma over rdma_rxe and its native multipath against two
# appliances serving one namespace (appliance 1 at 10.0.0.2, appliance 2 at 10.0.0.4). Asks
# the outer script to act with `bvmp-step: kill|restart|ana` and prints
# `bvmp-result: multipath|failover|failback|ana PASS|FAIL (…)`.
set -u
kroot=$1
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^bvmp.$1=//p"; }
nqn=$(arg nqn)
disk_mib=$(arg disk)
kato=$(arg kato)
hostnqn=nqn.2026-11.io.bareverbs:lab-multipath hostid=0f000000-0000-4000-8000-0000000000a1
t0=$(date +%s)
# This machine's root is read-only here: scratch files go to TMPDIR (qemu/lab/init.sh).
tmp=${TMPDIR:-/run/tmp}
mkdir -p "$tmp"
say() { echo "bvmp[+$(( $(date +%s) - t0 ))s, up $(cut -d' ' -f1 /proc/uptime) s]: $*"; }
result() { echo "bvmp-result: $1 $2"; }
step() { echo "bvmp-step: $1"; }
# A failed step ends the run: the later steps' results are missing, which the outer script
# reports as failures.
# Before it, what the outer script shows of a failure: the paths' states and every line the
# kernel logged of nvme and rdma (the console shows only its errors).
fail() {
  result "$1" "FAIL ($2)"
  local c
  for c in /sys/class/nvme/nvme[0-9]*; do
    echo "bvmp-dmesg: ${c##*/} $(cat "$c/address" 2>/dev/null | tr '\n' ' ')state $(cat "$c/state" 2>/dev/null) at up $(cut -d' ' -f1 /proc/uptime) s"
  done
  dmesg | grep -a -E 'nvme|rdma' | sed 's/^/bvmp-dmesg: /'
  nvme disconnect-all >/dev/null 2>&1
  exit 1
}

[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
for m in rdma_rxe rdma_cm nvme-fabrics; do modprobe -d "$kroot" "$m" || fail multipath "modprobe $m"; done
# As in nvmf-linux.sh: no fast registrations on the send queue (docs/testing.md).
modprobe -d "$kroot" nvme-rdma register_always=N || fail multipath "modprobe nvme-rdma"
ip link set lo up
ip link set eth0 mtu 1500 up
ip addr add 10.0.0.1/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 || fail multipath "rdma link add"
# fio's buffers in huge pages, so that each 64 KiB I/O is one contiguous piece: with
# register_always=N nvme-rdma then describes it with the PD's global key and puts no memory
# registration on the send queue. Debian 6.1's rxe stops a queue whose retry walks over a
# registration (`rxe_reg_fast_mr: … not free`; the host times its commands out 30 s later and
# reconnects: docs/testing.md, sections 9 and 11). A lab setting, as register_always=N is.
echo 8 > /proc/sys/vm/nr_hugepages
huge=$(awk '/^HugePages_Total/ {print $2}' /proc/meminfo)
[ "${huge:-0}" -ge 1 ] || fail multipath "no huge pages for fio's buffers ($huge)"
fio_mem="--iomem=shmhuge --hugepage-size=2m"
say "rxe0 up on eth0; native multipath: $(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null)"

subsys() { # the subsystem's sysfs directory
  local s
  for s in /sys/class/nvme-subsystem/nvme-subsys*; do
    [ "$(cat "$s/subsysnqn" 2>/dev/null)" = "$nqn" ] && { echo "$s"; return 0; }
  done
  return 1
}
ctrl_of() { # ADDRESS: the controller (nvmeN) of the path to it
  local s c
  s=$(subsys) || return 1
  for c in "$s"/nvme[0-9]*; do
    c=${c##*/}
    [[ "$c" =~ ^nvme[0-9]+$ ]] || continue
    grep -q "traddr=$1," "/sys/class/nvme/$c/address" 2>/dev/null && { echo "$c"; return 0; }
  done
  return 1
}
state_of() { cat "/sys/class/nvme/$1/state" 2>/dev/null || echo gone; }
ana_of() { local p; for p in /sys/class/nvme/"$1"/nvme*c*n1; do cat "$p/ana_state" 2>/dev/null; return; done; echo none; }
live_paths() { local s; s=$(subsys) || { echo 0; return; }; grep -l '^live$' "$s"/nvme[0-9]*/state 2>/dev/null | wc -l; }
# (nvme-cli's JSON gives the counters as strings.)
writes_through() { nvme smart-log "/dev/$1" -o json 2>/dev/null | jq -r '(.host_write_commands // 0) | tonumber'; }
# Reads and writes through the controller (its host's, as the appliance's SMART log counts them).
ios_through() { nvme smart-log "/dev/$1" -o json 2>/dev/null | jq -r '((.host_read_commands // 0) | tonumber) + ((.host_write_commands // 0) | tonumber)'; }
wait_for() { # SECONDS COMMAND…: until the command succeeds
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@"; do [ "$(date +%s)" -ge "$deadline" ] && return 1; sleep 0.5; done
}
# The write commands a path's SMART log counts (what its appliance counted for this host over
# its life, the controllers it lost included), into $count: waits for the path to be live
# (bounded: a reconnect is 10 s away at most) and ends STEP when it is not, or has no log.
count=0
count_writes() { # STEP CTRL
  local deadline=$(( $(date +%s) + 30 )) v
  while :; do
    if [ "$(state_of "$2")" = live ]; then
      v=$(writes_through "$2")
      [[ "$v" =~ ^[0-9]+$ ]] && { count=$v; return 0; }
    fi
    [ "$(date +%s)" -ge "$deadline" ] && break
    sleep 0.5
  done
  fail "$1" "no SMART log from $2 ($(cat "/sys/class/nvme/$2/address" 2>/dev/null | tr '\n' ' ')state $(state_of "$2")) within 30 s"
}
both_live() { [ "$(state_of "$c1")/$(state_of "$c2")" = live/live ]; }
# Controllers Linux made so far (a reconnect makes one).
made() { dmesg | grep -c "new ctrl"; }

# --- 1. connect-all against appliance 1: both paths, one device --------------------------------
two_live() { [ "$(live_paths)" = 2 ]; }
deadline=$(( $(date +%s) + 240 ))
until two_live; do
  timeout 90 nvme connect-all -t rdma -a 10.0.0.2 -s 4420 --hostnqn="$hostnqn" --hostid="$hostid" \
    --keep-alive-tmo="$kato" >/dev/null 2>&1
  wait_for 10 two_live && break
  [ "$(date +%s)" -ge "$deadline" ] && fail multipath "$(live_paths) live paths after 240 s of nvme connect-all: $(nvme list-subsys 2>&1 | tr '\n' ' ')"
done
c1=$(ctrl_of 10.0.0.2) || fail multipath "no path to 10.0.0.2"
c2=$(ctrl_of 10.0.0.4) || fail multipath "no path to 10.0.0.4"
s=$(subsys)
devs=$(ls /dev | grep -E '^nvme[0-9]+n1$' | tr '\n' ' ')
ndev=$(wc -w <<<"$devs")
[ "$ndev" = 1 ] || fail multipath "$ndev block devices ($devs), one wanted"
dev=/dev/${devs% }
id1=$(cat "/sys/class/nvme/$c1/cntlid") id2=$(cat "/sys/class/nvme/$c2/cntlid")
[ "$id1" != "$id2" ] || fail multipath "both controllers have ID $id1"
mib=$(( $(blockdev --getsize64 "$dev") / 1048576 ))
[ "$mib" = "$disk_mib" ] || fail multipath "$dev is $mib MiB, $disk_mib wanted"
a1=$(ana_of "$c1") a2=$(ana_of "$c2")
say "$(nvme list-subsys 2>&1 | tr '\n' ' ')"
[ "$a1/$a2" = "optimized/non-optimized" ] || fail multipath "ANA states $a1/$a2, optimized/non-optimized wanted"
kato=$(cat "/sys/class/nvme/$c1/kato" 2>/dev/null || echo "$kato")
result multipath "PASS (nvme connect-all against 10.0.0.2 alone: subsystem ${s##*/} with 2 live paths, $c1 to 10.0.0.2 (controller ID $id1, $a1) and $c2 to 10.0.0.4 (controller ID $id2, $a2); one block device $dev of $mib MiB; iopolicy $(cat "$s/iopolicy"); keep-alive $kato s)"

# --- 2. failover: appliance 1 killed in the middle of fio -------------------------------------
# fio writes 192 MiB and verifies each 64 blocks it wrote as it goes (and all at the end): reads
# and writes both cross the kill.
out=$tmp/bvmp-fio.json
fio_mib=192 blocks=$(( 192 * 16 ))
# shellcheck disable=SC2086
fio --name=failover --filename="$dev" --direct=1 --ioengine=libaio --iodepth=4 --rw=write $fio_mem \
  --bs=64k --size=${fio_mib}M --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_backlog=64 \
  --randrepeat=0 --output-format=json > "$out" 2>$tmp/bvmp-fio.err &
fio_pid=$!
sleep 4
kill -0 "$fio_pid" 2>/dev/null || fail failover "fio ended within 4 s, before the kill: $(tail -2 $tmp/bvmp-fio.err | tr '\n' ' ')"
w_before=$(ios_through "$c2")
step kill
tk=$(date +%s)
up_kill=$(cut -d' ' -f1 /proc/uptime)
wait_for 120 sh -c "[ \"\$(cat /sys/class/nvme/$c1/state 2>/dev/null)\" != live ]" || fail failover "the path to the killed appliance stays live"
down_after=$(( $(date +%s) - tk ))
alive_at_kill=yes
wait "$fio_pid"; st=$?
err=$(jq -r '.jobs[0].error' "$out" 2>/dev/null)
wmax=$(jq -r '.jobs[0].write.clat_ns.max' "$out" 2>/dev/null)
rmax=$(jq -r '.jobs[0].read.clat_ns.max' "$out" 2>/dev/null)
wios=$(jq -r '.jobs[0].write.total_ios' "$out" 2>/dev/null)
rios=$(jq -r '.jobs[0].read.total_ios' "$out" 2>/dev/null)
w_after=$(ios_through "$c2")
stall_ms=$(( ( (wmax > rmax ? wmax : rmax) ) / 1000000 ))
say "fio exit $st error $err; writes $wios (max ${wmax} ns) reads $rios (max ${rmax} ns); path 1 down after $down_after s; commands through appliance 2: $w_before -> $w_after"
[ "$st" = 0 ] && [ "$err" = 0 ] || fail failover "fio exit $st, error $err: $(tail -3 $tmp/bvmp-fio.err | tr '\n' ' ')"
[ "$wios" = "$blocks" ] && [ "$rios" -ge "$blocks" ] || fail failover "fio wrote $wios and verified $rios of $blocks blocks of 64 KiB"
[ "$w_after" -gt "$w_before" ] || fail failover "no I/O went through appliance 2 after the kill"
limit_ms=$(( (kato + 5) * 1000 ))
stall=$(awk -v m="$stall_ms" 'BEGIN { printf "%.1f", m / 1000 }')
# What Linux's nvme-rdma did meanwhile, with its clock (the kill at $up_kill s).
say "kill at uptime $up_kill s; $(dmesg | grep -a -E 'nvme|rdma' | tail -8 | tr '\n' ' ')"
if [ "$stall_ms" -gt "$limit_ms" ]; then
  # Reported, and the later steps still run.
  result failover "FAIL (longest stall $stall s, above the keep-alive timeout + 5 s ($(( kato + 5 )) s); otherwise: fio exit 0, no I/O error, $wios written and $rios verified, the path to 10.0.0.2 left live after $down_after s, $(( w_after - w_before )) reads and writes through appliance 2)"
else
result failover "PASS (SIGKILL to appliance 1 mid-fio (fio running $alive_at_kill); fio --verify=crc32c $fio_mib MiB in 64 KiB writes at depth 4, each 64 verified as it went: exit 0, no I/O error, $wios written and $rios verified; the path to 10.0.0.2 left live after $down_after s; $(( w_after - w_before )) reads and writes through appliance 2 meanwhile; stall ${stall} s (the longest completion), limit $(( kato + 5 )) s)"
fi

# --- 3. failback: appliance 1 boots again, its path comes back by itself ----------------------
step restart
tr0=$(date +%s)
wait_for 300 sh -c "[ \"\$(cat /sys/class/nvme/$c1/state 2>/dev/null)\" = live ]" || fail failback "the path to 10.0.0.2 is $(state_of "$c1") 300 s after the restart"
back_s=$(( $(date +%s) - tr0 ))
wait_for 30 sh -c "[ \"\$(cat /sys/class/nvme/$c1/nvme*c*n1/ana_state 2>/dev/null)\" = optimized ]" || fail failback "the path to 10.0.0.2 is live but $(ana_of "$c1")"
# Both paths live before measuring (the other path may still be recovering from the kill).
wait_for 60 both_live || fail failback "paths $c1/$c2 $(state_of "$c1")/$(state_of "$c2") 60 s after the path to 10.0.0.2 came back"
id1b=$(cat "/sys/class/nvme/$c1/cntlid")
made0=$(made)
count_writes failback "$c1"; b1=$count
count_writes failback "$c2"; b2=$count
# shellcheck disable=SC2086
fio --name=failback --filename="$dev" --direct=1 --ioengine=libaio --iodepth=4 --rw=write $fio_mem \
  --bs=64k --size=4M --offset=192M --verify=crc32c --do_verify=1 --verify_fatal=1 \
  --output-format=json > "$out" 2>$tmp/bvmp-fio.err || fail failback "fio after failback: $(tail -2 $tmp/bvmp-fio.err | tr '\n' ' ')"
count_writes failback "$c1"; e1=$count
count_writes failback "$c2"; e2=$count
remade=$(( $(made) - made0 ))
say "after failback: writes through appliance 1 $b1 -> $e1, appliance 2 $b2 -> $e2; controllers made meanwhile $remade"
[ $(( e1 - b1 )) -ge 64 ] || fail failback "$(( e1 - b1 )) of 64 writes went through appliance 1 (the optimized path), $(( e2 - b2 )) through appliance 2; $remade controllers made meanwhile"
[ "$remade" = 0 ] || fail failback "$remade controllers made while fio ran (a path reconnected)"
result failback "PASS (appliance 1 booted again on the same image; its path $c1 live again after $back_s s by Linux's own reconnect (controller ID $id1b), ANA optimized; fio 4 MiB --verify=crc32c: $(( e1 - b1 )) writes through appliance 1, $(( e2 - b2 )) through appliance 2; no path reconnected meanwhile)"

# --- 4. ANA: the states changed on the appliances' consoles -----------------------------------
wait_for 60 both_live || fail ana "paths $c1/$c2 $(state_of "$c1")/$(state_of "$c2") before the change"
news_before=$(made)
step ana
ta=$(date +%s)
swapped() { [ "$(ana_of "$c1")/$(ana_of "$c2")" = "non-optimized/optimized" ]; }
wait_for 120 swapped || fail ana "sysfs ana_state $(ana_of "$c1")/$(ana_of "$c2") 120 s after the consoles' change, non-optimized/optimized wanted"
seen_s=$(( $(date +%s) - ta ))
log1=$(nvme ana-log "/dev/$c1" 2>&1) log2=$(nvme ana-log "/dev/$c2" 2>&1)
st1=$(awk -F: '/^state/ {gsub(/[ \t]/, "", $2); print $2}' <<<"$log1" | tail -1)
st2=$(awk -F: '/^state/ {gsub(/[ \t]/, "", $2); print $2}' <<<"$log2" | tail -1)
chg1=$(awk -F: '/^chgcnt/ {gsub(/[ \t]/, "", $2); print $2; exit}' <<<"$log1")
[ "$st1/$st2" = "non-optimized/optimized" ] || fail ana "nvme ana-log says $st1/$st2: $(tr '\n' ' ' <<<"$log1")"
news_after=$(made)
[ "$news_after" = "$news_before" ] || fail ana "$(( news_after - news_before )) controllers created meanwhile (a reconnect)"
[ "$(cat "/sys/class/nvme/$c1/cntlid")/$(cat "/sys/class/nvme/$c2/cntlid")" = "$id1b/$id2" ] || fail ana "a controller ID changed"
count_writes ana "$c1"; b1=$count
count_writes ana "$c2"; b2=$count
# shellcheck disable=SC2086
fio --name=ana --filename="$dev" --direct=1 --ioengine=libaio --iodepth=4 --rw=write $fio_mem \
  --bs=64k --size=4M --offset=200M --verify=crc32c --do_verify=1 --verify_fatal=1 \
  --output-format=json > "$out" 2>$tmp/bvmp-fio.err || fail ana "fio after the change: $(tail -2 $tmp/bvmp-fio.err | tr '\n' ' ')"
count_writes ana "$c1"; e1=$count
count_writes ana "$c2"; e2=$count
[ "$(made)" = "$news_before" ] || fail ana "$(( $(made) - news_before )) controllers made while fio ran (a reconnect)"
[ $(( e2 - b2 )) -ge 64 ] || fail ana "$(( e2 - b2 )) of 64 writes went through appliance 2 (now optimized), $(( e1 - b1 )) through appliance 1"
result ana "PASS (the consoles' change seen by Linux after $seen_s s without a reconnect (controller IDs $id1b and $id2 kept, no new controller): sysfs ana_state non-optimized for $c1, optimized for $c2; nvme ana-log $st1 (change count $chg1) and $st2; fio 4 MiB --verify=crc32c: $(( e2 - b2 )) writes through appliance 2, $(( e1 - b1 )) through appliance 1)"
nvme disconnect -n "$nqn" >/dev/null 2>&1
say "done"
