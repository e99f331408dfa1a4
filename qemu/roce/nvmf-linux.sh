#!/bin/bash
# Runs inside a Linux guest of qemu/roce/nvmf.sh (chrooted into this machine's root by
# qemu/lab/init.sh): NVMe over Fabrics on RDMA between Linux's nvme-rdma/nvmet-rdma (over
# rdma_rxe) and, on Linux A, Debian's unmodified nvme-cli and fio.
#   nvmf-linux.sh KROOT        the rest from the kernel command line:
#   bvnvmf.role=a|b            a: the host (initiator) of every step; b: Linux's target
#   bvnvmf.ip=A.B.C.D          this guest's address (/24)
#   bvnvmf.uk=0|1              A: run the steps against the unikernel target too
#   bvnvmf.mib=64              the RAM namespaces' size (B's brd disks, the unikernel's RAM disk)
#   bvnvmf.perf=3              A: runs of each performance job on each target (0: none)
#   bvnvmf.secs=4              A: seconds each performance run lasts
#   bvnvmf.timeout=120         A: seconds to wait for a target to appear
#   bvnvmf.count=0|1           A: after the performance jobs, the counted runs (below)
#   bvnvmf.mark=PATH           B: the instruction counter's marker (qemu/roce/mark.c), run for
#                              each `mark CODE` line on the console (a counted Linux B)
#   bvnvmf.blocks=PATH         A: qemu/roce/blocks.c's writer and checker (`nvmf restart`)
#   bvnvmf.nvme=0|1            B: serve this guest's PCIe NVMe disk (/dev/nvme0n1) too;
#                              A: the steps and jobs on the unikernel's NVMe namespaces
#   bvnvmf.nvmeruns=3          A: runs of each performance job on the NVMe namespaces
#   bvnvmf.smp=2               A: the lab's two-core mode alone (qemu/roce/nvmf-smp.sh)
# Linux B serves two subsystems on brd RAM disks: one for Linux A (the baseline and the
# performance reference), one for the unikernel's host mode. Linux A prints a line
# `nvmf-result <side> <step>: PASS|FAIL (<what was checked>)` per step, `nvmf-perf <job> <side>
# <IOPS>` per performance run, and `nvmf-sum <file> <sha256>` for the files it leaves on the
# unikernel's virtio-blk namespace, which qemu/roce/nvmf.sh checks in the disk image
# (`nvmf-sum-nvme <file> <sha256>` for those on its NVMe namespace 2).
# The NVMe part (bvnvmf.nvme=1): Linux B serves a third subsystem on its QEMU NVMe disk (the
# kernel's PCIe `nvme` driver, /dev/nvme0n1); Linux A runs the steps against the unikernel's
# NVMe subsystem (namespace 1: restart, fio; namespace 2: ext4 across a reconnect) and the
# performance and counted jobs on namespace 1 of both, named nvme-<job>.
# Counted runs (bvnvmf.count=1): once the performance jobs are over, A prints `phase counted`
# and waits for a counted Linux B and a counted unikernel (booted by the lab under the
# instruction counter), then runs each job once on each, between two marks: it prints
# `nvmf-mark <side> <code>`, the lab has the target run that mark and answers `ack <code>` on
# A's console once the counter recorded it; A then prints `nvmf-count <job> <side> <I/Os>`.
set -u
kroot=$1
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^bvnvmf.$1=//p"; }
role=$(arg role) ip=$(arg ip) uk=$(arg uk) mib=$(arg mib) perf=$(arg perf) secs=$(arg secs)
limit=$(arg timeout) count=$(arg count) mark=$(arg mark) nvme=$(arg nvme) nvme_runs=$(arg nvmeruns)
mib=${mib:-64} perf=${perf:-3} secs=${secs:-4} limit=${limit:-120} uk=${uk:-0} count=${count:-0}
nvme=${nvme:-0} nvme_runs=${nvme_runs:-$perf}
b_ip=10.0.0.3 uk_ip=10.0.0.2
# The NQNs (lab.sh's and the unikernel's appliance use the same names).
nqn_linux=nqn.2026-11.io.bareverbs:linux-brd
nqn_for_uk=nqn.2026-11.io.bareverbs:linux-brd-uk
nqn_ram=nqn.2026-11.io.bareverbs:ram
nqn_blk=nqn.2026-11.io.bareverbs:virtio-blk
nqn_nvme=nqn.2026-11.io.bareverbs:nvme
nqn_linux_nvme=nqn.2026-11.io.bareverbs:linux-nvme
# Linux A's host NQN (the unikernel's allow list names it) and one no target lets in.
hostnqn=nqn.2026-11.io.bareverbs:lab-a
stranger=nqn.2026-11.io.bareverbs:lab-stranger
t0=$(date +%s)
say() { echo "bvnvmf[$role +$(( $(date +%s) - t0 ))s]: $*"; }

[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
mods=(rdma_rxe rdma_cm)
[ "$role" = b ] && mods+=(nvmet nvmet-rdma brd) || mods+=(nvme-fabrics nvme-rdma)
# Linux B's PCIe NVMe driver, for its QEMU NVMe disk.
[ "$role" = b ] && [ "$nvme" = 1 ] && mods+=(nvme)
for m in "${mods[@]}"; do
  case "$m" in
    brd) modprobe -d "$kroot" brd rd_nr=2 rd_size=$((mib * 1024)) ;;
    # The host registers no memory for a transfer of one contiguous piece (the PD's global
    # rkey instead): a send queue with fast registrations in it does not survive rxe's retry
    # on this kernel (docs/testing.md, "What the segment taught the lab").
    nvme-rdma) modprobe -d "$kroot" nvme-rdma register_always=N ;;
    *) modprobe -d "$kroot" "$m" ;;
  esac || { say "modprobe $m failed"; exit 1; }
done
ip link set lo up
ip link set eth0 mtu 1500 up
ip addr add "$ip/24" dev eth0
rdma link add rxe0 type rxe netdev eth0 || { say "rdma link add failed"; exit 1; }
say "rxe0 up on eth0, $ip"

# --- Linux B: nvmet-rdma over configfs ---------------------------------------------------------
if [ "$role" = b ]; then
  cfg=/sys/kernel/config
  mountpoint -q $cfg || mount -t configfs none $cfg || { say "cannot mount configfs"; exit 1; }
  n=$cfg/nvmet
  subsystem() { # NQN DEVICE
    mkdir "$n/subsystems/$1" &&
    echo 1 > "$n/subsystems/$1/attr_allow_any_host" &&
    mkdir "$n/subsystems/$1/namespaces/1" &&
    echo -n "$2" > "$n/subsystems/$1/namespaces/1/device_path" &&
    echo 1 > "$n/subsystems/$1/namespaces/1/enable"
  }
  subsystem "$nqn_linux" /dev/ram0 && subsystem "$nqn_for_uk" /dev/ram1 &&
  mkdir "$n/ports/1" &&
  echo ipv4 > "$n/ports/1/addr_adrfam" && echo rdma > "$n/ports/1/addr_trtype" &&
  echo 4420 > "$n/ports/1/addr_trsvcid" && echo "$ip" > "$n/ports/1/addr_traddr" &&
  ln -s "$n/subsystems/$nqn_linux" "$n/ports/1/subsystems/$nqn_linux" &&
  ln -s "$n/subsystems/$nqn_for_uk" "$n/ports/1/subsystems/$nqn_for_uk" ||
    { say "nvmet configuration failed"; dmesg | tail -5; exit 1; }
  say "target ready: $nqn_linux on /dev/ram0, $nqn_for_uk on /dev/ram1 ($mib MiB each), $ip:4420"
  if [ "$nvme" = 1 ]; then
    # The PCIe driver probes the controller asynchronously: its disk appears within seconds.
    for _ in $(seq 1 150); do [ -b /dev/nvme0n1 ] && break; sleep 0.2; done
    if [ -b /dev/nvme0n1 ] && subsystem "$nqn_linux_nvme" /dev/nvme0n1 &&
       ln -s "$n/subsystems/$nqn_linux_nvme" "$n/ports/1/subsystems/$nqn_linux_nvme"; then
      say "target ready: $nqn_linux_nvme on /dev/nvme0n1 ($(cat /sys/block/nvme0n1/device/model 2>/dev/null | sed 's/ *$//'), $(( $(blockdev --getsize64 /dev/nvme0n1) / 1048576 )) MiB)"
    else
      say "no NVMe subsystem: /dev/nvme0n1 $([ -b /dev/nvme0n1 ] && echo "there, nvmet refused it" || echo missing)"
      dmesg | grep -i nvme | tail -5
    fi
  fi
  # Serve until the lab stops this guest; what nvmet says on the way is in this log.
  dmesg -w -l err,warn,notice,info 2>/dev/null | grep --line-buffered -E 'nvmet' | sed 's/^/  [dmesg] /' &
  if [ -n "$mark" ]; then
    # Counted: the lab's marks arrive on the console; nothing else runs here (every process
    # would count).
    while :; do
      read -r w code < /dev/console || { sleep 1; continue; }
      [ "$w" = mark ] && "$mark" "$code"
    done
  fi
  last=
  while :; do
    sleep 20
    c=$(cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep -H . ./* | sed 's|^\./||' | grep -v ':0$' | tr '\n' ' ')
    [ "$c" = "$last" ] || echo "  [rxe +$(( $(date +%s) - t0 ))s] $c"
    last=$c
  done
fi

# --- Linux A: the host ---------------------------------------------------------------------------
result() { echo "nvmf-result $1: $2"; }
# The block device of the connected subsystem NQN's namespace NSID, once it has appeared: the
# multipath head under the subsystem (nvmeXnY; a controller that says it may share its
# namespaces, as nvmet's does) or the controller's own disk (one that does not).
device() { # NQN NSID
  local s d
  for _ in $(seq 1 100); do
    for s in /sys/class/nvme-subsystem/nvme-subsys* /sys/class/nvme/nvme*; do
      [ "$(cat "$s/subsysnqn" 2>/dev/null)" = "$1" ] || continue
      for d in "$s"/nvme*n"$2"; do
        [ -e "$d" ] && [ -b "/dev/${d##*/}" ] && { echo "/dev/${d##*/}"; return 0; }
      done
    done
    sleep 0.2
  done
  return 1
}
mib_of() { echo $(( $(blockdev --getsize64 "$1") / 1048576 )); }
discover() { # SIDE IP NQN: nvme discover until it lists NQN (the target may still be booting)
  local deadline=$(( $(date +%s) + limit )) out tries=0
  while :; do
    tries=$((tries + 1))
    out=$(timeout 60 nvme discover -t rdma -a "$2" -s 4420 --hostnqn="$hostnqn" 2>&1)
    grep -q "subnqn: *$3\$" <<<"$out" && break
    [ "$(date +%s)" -ge "$deadline" ] && {
      sed 's/^/  /' <<<"$out" | tail -20
      result "$1 discover" "FAIL (no subsystem $3 in nvme discover's log page from $2 after $tries tries, ${limit} s)"
      return 1; }
    sleep 1
  done
  sed 's/^/  /' <<<"$out"
  result "$1 discover" "PASS (nvme discover -t rdma -a $2 -s 4420: $(grep -c '^=====Discovery Log Entry' <<<"$out") entries, $3 among them, trtype $(awk '/^trtype:/ {print $2; exit}' <<<"$out"), $tries tries)"
}
connect() { # SIDE IP NQN NSID STEP: sets dev
  local out step=${5:-connect}
  dev=
  out=$(timeout 90 nvme connect -t rdma -a "$2" -s 4420 -n "$3" --hostnqn="$hostnqn" 2>&1) ||
    { sed 's/^/  /' <<<"$out"; result "$1 $step" "FAIL (nvme connect -n $3: $(tail -1 <<<"$out"))"; return 1; }
  dev=$(device "$3" "$4") || { result "$1 $step" "FAIL (connected, but no namespace $4 of $3 appeared)"; return 1; }
  [ "$step" = reconnect ] ||
    result "$1 $step" "PASS (nvme connect -t rdma -n $3: $dev, $(mib_of "$dev") MiB, model '$(nvme id-ctrl "$dev" 2>/dev/null | awk -F': ' '/^mn / {gsub(/ +$/, "", $2); print $2}')')"
  return 0
}
# A fio job that writes then reads back and verifies every block (crc32c). Queue depth 4: at 16,
# a 128 KiB job has 2 MiB of RDMA READs in flight from one target, whose bursts overflow the
# segment's sockets under TCG (rxe then retries after its ACK timeout: 5 writes a second).
fio_verify() { # SIDE STEP DEV RW BS SIZE
  local out st
  out=$(timeout 300 fio --name="$2" --filename="$3" --direct=1 --ioengine=libaio --iodepth=4 \
          --rw="$4" --bs="$5" --size="$6" --verify=crc32c --do_verify=1 --verify_fatal=1 \
          --randrepeat=0 --group_reporting --minimal 2>&1); st=$?
  local w r e
  # terse v3: 5 the error, 8 read IOPS, 49 write IOPS.
  e=$(awk -F';' 'NF > 50 {print $5; exit}' <<<"$out")
  w=$(awk -F';' 'NF > 50 {print $49; exit}' <<<"$out")
  r=$(awk -F';' 'NF > 50 {print $8; exit}' <<<"$out")
  if [ "$st" = 0 ] && [ "$e" = 0 ]; then
    result "$1 $2" "PASS (fio $4 bs=$5 size=$6 iodepth 4, --verify=crc32c: written and read back, every block checked; write $w IOPS, verify $r IOPS)"
  else
    sed 's/^/  /' <<<"$out" | tail -15
    result "$1 $2" "FAIL (fio $4 bs=$5 size=$6 --verify=crc32c: exit $st)"
    return 1
  fi
}
mnt=/run/tmp/mnt
files=(small:1 medium:2 large:4) # name:MiB
mkfs_write() { # SIDE DEV: ext4, mount, write files, remember their checksums, unmount
  mkdir -p "$mnt"
  mkfs.ext4 -q -F "$2" >/dev/null 2>&1 || { result "$1 mkfs" "FAIL (mkfs.ext4 $2)"; return 1; }
  mount "$2" "$mnt" || { result "$1 mkfs" "FAIL (mount $2)"; return 1; }
  local f total=0
  for f in "${files[@]}"; do
    head -c $(( ${f#*:} * 1048576 )) /dev/urandom > "$mnt/${f%:*}" && total=$((total + ${f#*:})) ||
      { umount "$mnt"; result "$1 mkfs" "FAIL (writing $mnt/${f%:*})"; return 1; }
  done
  (cd "$mnt" && sha256sum "${files[@]%:*}") > "/run/tmp/sums-$1"
  # A copy, for where a file differs if the checksums after the reconnect do not match.
  rm -rf "/run/tmp/copy-$1" && mkdir -p "/run/tmp/copy-$1" && (cd "$mnt" && cp "${files[@]%:*}" "/run/tmp/copy-$1/")
  sync
  umount "$mnt" || { result "$1 mkfs" "FAIL (umount)"; return 1; }
  result "$1 mkfs" "PASS (mkfs.ext4 on $2, mounted, ${#files[@]} files of $total MiB written, unmounted)"
}
# Where the files of SIDE differ from the copies mkfs_write kept: per file, the bytes that
# differ, the first and last offset, in how many 4 KiB blocks, and how many of the bad bytes
# read as zero (a block never written reads as zeroes; a block of another write does not).
differs() { # SIDE
  local f
  for f in "${files[@]%:*}"; do
    [ -f "/run/tmp/copy-$1/$f" ] || continue
    cmp -l "/run/tmp/copy-$1/$f" "$mnt/$f" 2>&1 | awk -v f="$f" '
      $1 ~ /^[0-9]+$/ {n++; o = $1 - 1; if (n == 1) first = o; last = o; b[int(o / 4096)] = 1; if ($3 == 0) z++}
      /EOF/ {eof = 1}
      END {if (n == 0 && !eof) exit; nb = 0; for (k in b) nb++
           printf "%s: %d bytes differ (offsets %d..%d, %d blocks of 4 KiB, %d read as zero)%s; ", f, n, first, last, nb, z + 0, eof ? ", short" : ""}'
  done
}
reconnect() { # SIDE IP NQN NSID: disconnect, connect again, mount, check the checksums
  local out
  out=$(nvme disconnect -n "$3" 2>&1) || { result "$1 reconnect" "FAIL (nvme disconnect: $out)"; return 1; }
  for _ in $(seq 1 50); do [ -b "$dev" ] || break; sleep 0.2; done
  [ -b "$dev" ] && { result "$1 reconnect" "FAIL ($dev still there after nvme disconnect)"; return 1; }
  local gone=$dev
  connect "$1" "$2" "$3" "$4" reconnect || return 1
  mount "$dev" "$mnt" || { result "$1 reconnect" "FAIL (mount $dev after the reconnect)"; return 1; }
  out=$(cd "$mnt" && sha256sum -c "/run/tmp/sums-$1" 2>&1); local st=$?
  local where=
  [ "$st" = 0 ] || where=$(differs "$1")
  umount "$mnt"
  [ "$st" = 0 ] || { sed 's/^/  /' <<<"$out"; result "$1 reconnect" "FAIL (checksums after the reconnect: ${where:-no copy to compare})"; return 1; }
  result "$1 reconnect" "PASS (nvme disconnect: $gone gone; connect again: $dev, mounted, sha256 of ${#files[@]} files as written)"
}
# The SMART / Health log's counters of DEV's controller: data units read and written
# (thousands of 512-byte units), host read and write commands.
smart() { # DEV -> "DUR DUW HRC HWC"
  nvme smart-log "$1" -o json 2>/dev/null | tr -d ' ,"' | awk -F: '
    $1 == "data_units_read" {r = $2} $1 == "data_units_written" {w = $2}
    $1 == "host_read_commands" {hr = $2} $1 == "host_write_commands" {hw = $2}
    END {if (r == "" || w == "" || hr == "" || hw == "") exit 1; print r, w, hr, hw}'
}
# (The reads may be fewer: fio reads a random job back in offset order, its verify list
# sorted, and the block layer may merge neighbouring reads: a run had 2087 read commands.
# At least 128, 16 MiB in 128 KiB.)
# `nvme smart-log` over the connection the two fio jobs of `steps` used, before and after
# them: the target's counters moved by what fio did. Each job writes 8 MiB and reads it back
# (randwrite 4k: 2048 writes and 2048 reads; write 128k: 64 of each, more when the target's
# transfer limit splits them); 16 MiB each way is 32.77 thousands of 512-byte units, so the
# data units move by 32 to 34 (rounded up at both ends; a read or two of the kernel's own, a
# partition scan, may add one).
smart_check() { # SIDE BEFORE AFTER
  local b a
  read -r -a b <<<"$2"; read -r -a a <<<"$3"
  local dr=$((a[0] - b[0])) dw=$((a[1] - b[1])) hr=$((a[2] - b[2])) hw=$((a[3] - b[3]))
  local what="data units read +$dr written +$dw, host read commands +$hr write commands +$hw (before: $2; after: $3)"
  if [ "$dw" -ge 32 ] && [ "$dw" -le 34 ] && [ "$dr" -ge 32 ] && [ "$dr" -le 35 ] &&
     [ "$hw" -ge 2112 ] && [ "$hw" -le $((2048 + 64 * 32)) ] && [ "$hr" -ge 128 ] && [ "$hr" -le $((2048 + 64 * 32 + 64)) ]; then
    result "$1 smart-log" "PASS (nvme smart-log on the controller fio used: $what; fio wrote 16 MiB in 2048 + 64 writes and read it back)"
  else
    result "$1 smart-log" "FAIL (nvme smart-log: $what; fio wrote and read 16 MiB in 2048 + 64 commands each way)"
  fi
}
# The steps on one target: discover, connect, fio, mkfs, reconnect (the device stays connected).
steps() { # SIDE IP NQN
  local before after
  discover "$1" "$2" "$3" || return 1
  connect "$1" "$2" "$3" 1 || return 1
  before=$(smart "$dev") || before=
  fio_verify "$1" fio-rand4k "$dev" randwrite 4k 8M
  fio_verify "$1" fio-seq128k "$dev" write 128k 8M
  if [ "$1" = unikernel ]; then
    if after=$(smart "$dev") && [ -n "$before" ]; then
      smart_check "$1" "$before" "$after"
    else
      result "$1 smart-log" "FAIL (nvme smart-log $dev gave no counters: before '${before}', after '${after:-}')"
    fi
  fi
  mkfs_write "$1" "$dev" && reconnect "$1" "$2" "$3" 1
}

# The unikernel's allow list (bvnvmf.allow= names $hostnqn alone): another host NQN finds no
# subsystem in the discovery log, and its connect to a subsystem this guest is not connected
# to (nvme-cli would refuse a second connection itself) is refused by the target: the
# kernel logs Connect's status, invalid host ("Connect for subsystem … is not allowed").
allow_list() { # NQN (not connected)
  local out n st log
  out=$(timeout 60 nvme discover -t rdma -a "$uk_ip" -s 4420 --hostnqn="$stranger" 2>&1)
  n=$(grep -c '^=====Discovery Log Entry' <<<"$out")
  out=$(timeout 90 nvme connect -t rdma -a "$uk_ip" -s 4420 -n "$1" --hostnqn="$stranger" 2>&1); st=$?
  log=$(dmesg | grep -a "is not allowed, hostnqn: $stranger" | tail -1 | sed 's/^\[[^]]*\] //')
  if [ "$st" != 0 ] && [ "$n" = 0 ] && [ -n "$log" ]; then
    result "unikernel allow-list" "PASS (hostnqn $stranger: no entry in its discovery log; nvme connect -n $1 refused by the target: '$log'; $hostnqn connected)"
  else
    sed 's/^/  /' <<<"$out" | tail -5
    result "unikernel allow-list" "FAIL (hostnqn $stranger: $n discovery log entries, nvme connect exit $st, ${log:-no Connect Invalid Host in the kernel log})"
    nvme disconnect -n "$1" >/dev/null 2>&1
  fi
}

# The lab's `ack WHAT` on this console, within SECONDS.
wait_ack() { # WHAT SECONDS
  local w c deadline=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    read -r -t 5 w c < /dev/console || continue
    [ "$w" = ack ] && [ "$c" = "$1" ] && return 0
  done
  say "no ack for $1 in $2 s"
  return 1
}

# `nvmf restart`: the appliance killed in the middle of a write and booted again on the same
# disk. Linux A connects to its virtio-blk namespace with no controller-loss timeout and a
# reconnect every second; fio writes 8 MiB with crc32c checksums and fsyncs (job 1); the
# next 8 MiB are written with generation 1 of qemu/roce/blocks.c's records and synced, then
# generation 2 goes over them in 4 KiB writes (job 2), and after its first MiB this guest asks
# the lab (`nvmf-restart kill`) to SIGKILL the appliance's QEMU and boot it again at the same
# address; its `ack killed` starts the clock. Job 2's writer is killed too (what it had not
# handed to the kernel never goes; what it had is sent again once the controller is back).
# The host reconnects by itself; then fio reads job 1 back (--verify_only: every block's
# checksum and offset), and every sector of job 2's range must hold generation 1 or 2 of
# itself, nothing else.
blocks=$(arg blocks)
restart() { # NQN [SIDE]
  local out ctrl c st t_ack t_lost= t_live= wpid v side=${2:-unikernel}
  local gen_first=$((8 * 2048)) gen_count=$((8 * 2048)) # sectors of 512 bytes: 8 MiB at 8 MiB
  [ -x "$blocks" ] || { result "$side restart" "FAIL (no generation writer: bvnvmf.blocks=$blocks)"; return 1; }
  out=$(timeout 90 nvme connect -t rdma -a "$uk_ip" -s 4420 -n "$1" --hostnqn="$hostnqn"           --ctrl-loss-tmo=-1 --reconnect-delay=1 2>&1) ||
    { sed 's/^/  /' <<<"$out"; result "$side restart" "FAIL (nvme connect --ctrl-loss-tmo=-1 -n $1: $(tail -1 <<<"$out"))"; return 1; }
  dev=$(device "$1" 1) || { result "$side restart" "FAIL (connected, but no namespace 1 of $1 appeared)"; return 1; }
  ctrl=
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$1" ] && [ -n "$(cat "$c/address" 2>/dev/null)" ] && ctrl=$c
  done
  [ -n "$ctrl" ] || { result "$side restart" "FAIL (no controller of $1 in /sys/class/nvme)"; return 1; }
  local job1=(fio --name=restart-job1 --filename="$dev" --direct=1 --ioengine=libaio --iodepth=4
              --rw=write --bs=64k --offset=0 --size=8M --verify=crc32c --verify_fatal=1 --minimal)
  out=$(timeout 300 "${job1[@]}" --do_verify=1 --end_fsync=1 2>&1) ||
    { sed 's/^/  /' <<<"$out" | tail -5; result "$side restart" "FAIL (job 1, fio write --verify=crc32c --end_fsync=1 failed before the kill)"; return 1; }
  out=$(timeout 300 "$blocks" write "$dev" "$gen_first" "$gen_count" 1 65536 2>&1) ||
    { result "$side restart" "FAIL (generation 1 of job 2's range: $(tail -1 <<<"$out"))"; return 1; }
  "$blocks" write "$dev" "$gen_first" "$gen_count" 2 4096 > /run/tmp/job2.log 2>&1 &
  wpid=$!
  for _ in $(seq 1 600); do grep -q '^written' /run/tmp/job2.log && break; kill -0 "$wpid" 2>/dev/null || break; sleep 0.1; done
  if ! kill -0 "$wpid" 2>/dev/null; then
    result "$side restart" "FAIL (job 2 ended before the kill: $(tail -1 /run/tmp/job2.log))"; return 1
  fi
  echo "nvmf-restart kill"
  wait_ack killed 120 || { kill -KILL "$wpid"; result "$side restart" "FAIL (the lab did not kill the appliance)"; return 1; }
  t_ack=$(date +%s%N)
  kill -KILL "$wpid" 2>/dev/null
  # The controller's state: it leaves `live` when the host sees the target gone, and comes
  # back to it once the host has reconnected (no nvme connect here).
  for _ in $(seq 1 3000); do
    st=$(cat "$ctrl/state" 2>/dev/null)
    [ -z "$t_lost" ] && [ "$st" != live ] && t_lost=$(date +%s%N)
    [ -n "$t_lost" ] && [ "$st" = live ] && { t_live=$(date +%s%N); break; }
    sleep 0.1
  done
  wait "$wpid" 2>/dev/null
  [ -n "$t_live" ] || { result "$side restart" "FAIL (the controller did not come back by itself in 300 s: state ${st:-none}, ${t_lost:+left live}${t_lost:-never left live})"; return 1; }
  local secs lost_after
  secs=$(awk -v a="$t_ack" -v b="$t_live" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
  lost_after=$(awk -v a="$t_ack" -v b="$t_lost" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
  out=$(timeout 300 "${job1[@]}" --verify_only 2>&1); v=$?
  local e kb
  e=$(awk -F';' 'NF > 50 {print $5; exit}' <<<"$out") kb=$(awk -F';' 'NF > 50 {print $6; exit}' <<<"$out")
  if [ "$v" != 0 ] || [ "$e" != 0 ] || [ "$kb" != 8192 ]; then
    sed 's/^/  /' <<<"$out" | tail -8
    result "$side restart" "FAIL (job 1 read back after the restart: fio --verify_only exit $v, error ${e:-none}, ${kb:-no} KiB verified of 8192)"
    return 1
  fi
  out=$(timeout 300 "$blocks" check "$dev" "$gen_first" "$gen_count" 1 2 2>&1) ||
    { result "$side restart" "FAIL (job 2's range unread: $out)"; return 1; }
  local old new other
  read -r _ old _ new _ other _ <<<"$out"
  if [ "$other" = 0 ] && [ $((old + new)) = "$gen_count" ]; then
    result "$side restart" "PASS (appliance SIGKILLed in the middle of a write, booted again on its disk image; Linux A reconnected by itself ${secs} s after the kill (--ctrl-loss-tmo=-1 --reconnect-delay=1; the loss seen after ${lost_after} s); job 1, 8 MiB written with fio --verify=crc32c and fsynced: every block read back intact; job 2's 8 MiB: $new sectors new, $old old, 0 of anything else; the writer had reported $(tail -1 /run/tmp/job2.log | tr -dc 0-9) sectors when killed)"
  else
    result "$side restart" "FAIL (job 2's range after the restart: $out; old or new wanted, every one of $gen_count sectors)"
    return 1
  fi
}

# --- BAREVERBS_NVMF_SMP=2 (qemu/roce/nvmf-smp.sh): this guest has two CPUs ---------------------
# The appliance with two vCPUs (smp2), then with one (smp1), then (counted) Linux B with two:
# connect with two I/O queues, the
# jobs with two fio jobs each (one per queue: blk-mq maps each CPU to a queue), three counted
# randread runs, run k between the marks 000k and 010k (`nvmf-count randread-4k TAG IOS k`;
# the lab takes the median); on smp2 first a write with verify, and the appliance's cores
# line read by the lab while connected.
smp_jobs() { # TAG DEV
  local i j name rw bs depth kb
  for i in $(seq 1 "$perf"); do
    for j in "randread-4k randread" "randwrite-4k randwrite"; do
      read -r name rw <<<"$j"
      echo "nvmf-perf $name $1 $(timeout $((secs + 60)) fio --name="$name" --filename="$2" --direct=1 \
        --ioengine=libaio --iodepth=32 --numjobs=2 --rw="$rw" --bs=4k --time_based --runtime="$secs" \
        --ramp_time=1 --norandommap --randrepeat=0 --group_reporting --minimal 2>/dev/null |
        awk -F';' -v rw="$rw" 'NF > 50 {print (rw ~ /write/ ? $49 : $8); exit}')"
    done
  done
  [ "$count" = 1 ] || return 0
  local k
  for k in 1 2 3; do
    echo "nvmf-mark unikernel 000$k"
    wait_ack "000$k" 30 || return 1
    kb=$(timeout $((secs + 60)) fio --name=randread-4k --filename="$2" --direct=1 --ioengine=libaio \
      --iodepth=32 --numjobs=2 --rw=randread --bs=4k --time_based --runtime="$secs" --norandommap \
      --randrepeat=0 --group_reporting --minimal 2>/dev/null | awk -F';' 'NF > 50 {print $6; exit}')
    echo "nvmf-mark unikernel 010$k"
    wait_ack "010$k" 30 || return 1
    echo "nvmf-count randread-4k $1 $(( ${kb:-0} / 4 )) $k"
  done
}
smp_connect() { # TAG [IP NQN]: sets dev (the appliance's RAM subsystem by default)
  local out ip=${2:-$uk_ip} nqn=${3:-$nqn_ram}
  dev=
  out=$(timeout 90 nvme connect -t rdma -a "$ip" -s 4420 -n "$nqn" --hostnqn="$hostnqn" -i 2 2>&1) ||
    { sed 's/^/  /' <<<"$out"; result "$1 connect" "FAIL (nvme connect -i 2 -n $nqn: $(tail -1 <<<"$out"))"; return 1; }
  dev=$(device "$nqn" 1) || { result "$1 connect" "FAIL (connected, but no namespace 1 of $nqn appeared)"; return 1; }
  result "$1 connect" "PASS (nvme connect -t rdma -i 2 -n $nqn: $dev, $(mib_of "$dev") MiB; the kernel: '$(dmesg | grep -a -o 'creating [0-9]* I/O queues' | tail -1)', $(nproc) CPUs)"
}
if [ "$(arg smp)" = 2 ]; then
  say "phase smp2 (the appliance at $uk_ip on two vCPUs)"
  if discover smp2 "$uk_ip" "$nqn_ram" && smp_connect smp2; then
    out=$(timeout 300 fio --name=smp2-verify --filename="$dev" --direct=1 --ioengine=libaio --iodepth=4 \
      --numjobs=2 --size=8M --offset_increment=8M --rw=randwrite --bs=4k --verify=crc32c --do_verify=1 \
      --verify_fatal=1 --randrepeat=0 --group_reporting --minimal 2>&1); st=$?
    e=$(awk -F';' 'NF > 50 {print $5; exit}' <<<"$out")
    if [ "$st" = 0 ] && [ "$e" = 0 ]; then
      result "smp2 fio-rand4k" "PASS (fio randwrite bs=4k --numjobs=2, 8 MiB each at offsets 0 and 8 MiB, iodepth 4, --verify=crc32c: written and read back, every block checked; write $(awk -F';' 'NF > 50 {print $49; exit}' <<<"$out") IOPS)"
    else
      sed 's/^/  /' <<<"$out" | tail -15
      result "smp2 fio-rand4k" "FAIL (fio randwrite --numjobs=2 --verify=crc32c: exit $st, error ${e:-none})"
    fi
    smp_jobs smp2 "$dev"
    echo "nvmf-smp-cores"
    wait_ack cores 60
    nvme disconnect -n "$nqn_ram" >/dev/null 2>&1
  fi
  echo "nvmf-smp-next"
  say "phase smp1 (the appliance again, one vCPU)"
  if wait_ack next 120 && discover smp1 "$uk_ip" "$nqn_ram" && smp_connect smp1; then
    smp_jobs smp1 "$dev"
    nvme disconnect -n "$nqn_ram" >/dev/null 2>&1
  fi
  # Counted: Linux B with two vCPUs, nvmet-rdma on a RAM disk, the same connect and jobs
  # (the 2-core figure's baseline).
  if [ "$count" = 1 ]; then
    echo "nvmf-smp-linux"
    say "phase smp linux (Linux B at $b_ip on two vCPUs, counted)"
    if wait_ack linux 120 && discover smp-linux "$b_ip" "$nqn_linux" && smp_connect smp-linux "$b_ip" "$nqn_linux"; then
      smp_jobs linux "$dev"
      nvme disconnect -n "$nqn_linux" >/dev/null 2>&1
    fi
  fi
  dmesg | grep -E 'nvme|rdma|rxe' | tail -20 | sed 's/^/  [dmesg] /'
  say "done"
  exit 0
fi

say "phase baseline (Linux B at $b_ip)"
steps linux-linux "$b_ip" "$nqn_linux"
linux_dev=$dev
uk_dev=
if [ "$uk" = 1 ]; then
  say "phase unikernel (at $uk_ip)"
  if steps unikernel "$uk_ip" "$nqn_ram"; then
    uk_dev=$dev
  fi
  allow_list "$nqn_blk"
  restart "$nqn_blk"
  nvme disconnect -n "$nqn_blk" >/dev/null 2>&1
  # The virtio-blk namespace: the files stay on the unikernel's disk image, checked by the lab
  # from the host once the unikernel has powered off.
  if connect virtio-blk "$uk_ip" "$nqn_blk" 1 virtio-blk-connect; then
    if mkfs_write virtio-blk "$dev" && reconnect virtio-blk "$uk_ip" "$nqn_blk" 1; then
      (cd /run/tmp && while read -r sum f; do echo "nvmf-sum $f $sum"; done < sums-virtio-blk)
    fi
    nvme disconnect -n "$nqn_blk" >/dev/null 2>&1
  fi
  # The NVMe namespaces (the unikernel's QEMU NVMe controller): the restart on namespace 1,
  # then discover, connect, fio with verify on namespace 1, ext4 across a reconnect on
  # namespace 2, whose files the lab reads back from its image after the power-off.
  if [ "$nvme" = 1 ]; then
    say "phase nvme (the unikernel's NVMe subsystem $nqn_nvme)"
    restart "$nqn_nvme" nvme
    nvme disconnect -n "$nqn_nvme" >/dev/null 2>&1
    if discover nvme "$uk_ip" "$nqn_nvme" && connect nvme "$uk_ip" "$nqn_nvme" 1; then
      fio_verify nvme fio-rand4k "$dev" randwrite 4k 8M
      fio_verify nvme fio-seq128k "$dev" write 128k 8M
      if dev=$(device "$nqn_nvme" 2); then
        if mkfs_write nvme "$dev" && reconnect nvme "$uk_ip" "$nqn_nvme" 2; then
          (cd /run/tmp && while read -r sum f; do echo "nvmf-sum-nvme $f $sum"; done < sums-nvme)
        fi
      else
        result "nvme mkfs" "FAIL (no namespace 2 of $nqn_nvme appeared)"
      fi
      uk_nvme_dev=$(device "$nqn_nvme" 1) || uk_nvme_dev=
    fi
  fi
fi

# --- performance: each job alternately on the unikernel's target and on Linux B's --------------
jobs=("randread-4k randread 4k 32" "randwrite-4k randwrite 4k 32" "seqread-128k read 128k 8")
# Linux B's NVMe subsystem, the NVMe jobs' baseline (connected here, after the unikernel's steps).
linux_nvme_dev=
if [ "$nvme" = 1 ] && connect linux-nvme "$b_ip" "$nqn_linux_nvme" 1; then linux_nvme_dev=$dev; fi
perf_run() { # JOB RW BS DEPTH DEV -> IOPS
  timeout $((secs + 60)) fio --name="$1" --filename="$5" --direct=1 --ioengine=libaio --iodepth="$4" \
    --rw="$2" --bs="$3" --time_based --runtime="$secs" --ramp_time=1 --norandommap \
    --randrepeat=0 --group_reporting --minimal 2>/dev/null |
    awk -F';' -v rw="$2" 'NF > 50 {print (rw ~ /write/ ? $49 : $8); exit}'
}
rxe_counts() { # this side's rxe counters of retries, sequence errors and duplicates
  (cd /sys/class/infiniband/rxe0/ports/1/hw_counters 2>/dev/null && grep -H . ./* | sed 's|^\./||' |
    grep -v ':0$' | grep -E 'retry|seq|duplicate|rnr|ack' | tr '\n' ' ')
}
if [ "$perf" -gt 0 ] && [ -n "$linux_dev" ] && [ -b "$linux_dev" ]; then
  say "phase performance ($perf runs of ${secs} s per job and target)"
  for i in $(seq 1 "$perf"); do
    for j in "${jobs[@]}"; do
      read -r name rw bs depth <<<"$j"
      if [ -n "$uk_dev" ] && [ -b "$uk_dev" ]; then
        echo "nvmf-perf $name unikernel $(perf_run "$name" "$rw" "$bs" "$depth" "$uk_dev")"
        # rxe's counters after each run (what the loss on the segment cost, and which side's
        # retransmissions paid for it), to tell a slow run's cause.
        echo "nvmf-rxe $name unikernel $i: $(rxe_counts)"
      fi
      echo "nvmf-perf $name linux $(perf_run "$name" "$rw" "$bs" "$depth" "$linux_dev")"
      echo "nvmf-rxe $name linux $i: $(rxe_counts)"
    done
  done
fi
# The same jobs on the NVMe namespaces: the unikernel's namespace 1 and Linux B's /dev/nvme0n1.
if [ "$nvme_runs" -gt 0 ] && [ -n "${uk_nvme_dev:-}" ] && [ -b "$uk_nvme_dev" ] && [ -n "$linux_nvme_dev" ] && [ -b "$linux_nvme_dev" ]; then
  say "phase nvme-performance ($nvme_runs runs of ${secs} s per job and target)"
  for i in $(seq 1 "$nvme_runs"); do
    for j in "${jobs[@]}"; do
      read -r name rw bs depth <<<"$j"
      echo "nvmf-perf nvme-$name unikernel $(perf_run "$name" "$rw" "$bs" "$depth" "$uk_nvme_dev")"
      echo "nvmf-rxe nvme-$name unikernel $i: $(rxe_counts)"
      echo "nvmf-perf nvme-$name linux $(perf_run "$name" "$rw" "$bs" "$depth" "$linux_nvme_dev")"
      echo "nvmf-rxe nvme-$name linux $i: $(rxe_counts)"
    done
  done
fi
nvme disconnect-all >/dev/null 2>&1

# --- counted runs: each job once on each target, between the instruction counter's marks ------
# A mark: ask the lab (`nvmf-mark SIDE CODE` on this console), wait for its `ack CODE`.
mark() { # SIDE CODE
  echo "nvmf-mark $1 $2"
  wait_ack "$2" 30
}
count_run() { # JOB RW BS DEPTH DEV SIDE KK -> prints nvmf-count JOB SIDE IOS
  local kb ios
  mark "$6" "00$7" || return 1
  kb=$(timeout $((secs + 60)) fio --name="$1" --filename="$5" --direct=1 --ioengine=libaio --iodepth="$4" \
    --rw="$2" --bs="$3" --time_based --runtime="$secs" --norandommap \
    --randrepeat=0 --group_reporting --minimal 2>/dev/null |
    awk -F';' -v rw="$2" 'NF > 50 {print (rw ~ /write/ ? $47 : $6); exit}')
  mark "$6" "01$7" || return 1
  ios=$(( ${kb:-0} * 1024 / $(numfmt --from=iec "${3^^}") ))
  echo "nvmf-count $1 $6 $ios"
}
if [ "$count" = 1 ] && [ "$uk" = 1 ]; then
  say "phase counted (a counted Linux B and unikernel, one run of ${secs} s per job and target)"
  # The lab acknowledges once the targets of the runs above are gone and the counted ones
  # are booting (the discovery below waits for them).
  if wait_ack counted 120 && discover counted-linux "$b_ip" "$nqn_linux" && connect counted-linux "$b_ip" "$nqn_linux" 1; then
    c_linux=$dev
    if discover counted-unikernel "$uk_ip" "$nqn_ram" && connect counted-unikernel "$uk_ip" "$nqn_ram" 1; then
      c_uk=$dev
      k=0
      for j in "${jobs[@]}"; do
        read -r name rw bs depth <<<"$j"
        k=$((k + 1))
        count_run "$name" "$rw" "$bs" "$depth" "$c_uk" unikernel "0$k"
        count_run "$name" "$rw" "$bs" "$depth" "$c_linux" linux "0$k"
      done
      # The NVMe jobs (windows 04 to 06): the counted unikernel's NVMe namespace 1, the
      # counted Linux B's /dev/nvme0n1.
      if [ "$nvme" = 1 ] && connect counted-nvme "$uk_ip" "$nqn_nvme" 1; then
        c_uk_nvme=$dev
        if connect counted-linux-nvme "$b_ip" "$nqn_linux_nvme" 1; then
          c_linux_nvme=$dev
          for j in "${jobs[@]}"; do
            read -r name rw bs depth <<<"$j"
            k=$((k + 1))
            count_run "nvme-$name" "$rw" "$bs" "$depth" "$c_uk_nvme" unikernel "0$k"
            count_run "nvme-$name" "$rw" "$bs" "$depth" "$c_linux_nvme" linux "0$k"
          done
        fi
      fi
    fi
  fi
  nvme disconnect-all >/dev/null 2>&1
fi
counters() { # rxe's counters that are not zero
  (cd /sys/class/infiniband/rxe0/ports/1/hw_counters 2>/dev/null && grep -H . ./* | sed 's|^\./||' | grep -v ':0$' | tr '\n' ' ')
}
echo "  [rxe] $(counters)"
# What the kernel's NVMe and RDMA layers said on the way (timeouts, resets, reconnects).
# A queue's timed-out commands come one line each: they are told as a count, so that what
# came before them (rxe's own complaints) stays in view.
dmesg | grep -E 'nvme|rdma|rxe' | awk '/I\/O [0-9]+ QID [0-9]+ timeout/ {n++; next}
  n {print "(" n " lines: I/O ... timeout)"; n = 0} {print} END {if (n) print "(" n " lines: I/O ... timeout)"}' |
  tail -60 | sed 's/^/  [dmesg] /'
say "done"
