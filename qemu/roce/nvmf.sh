#!/usr/bin/env bash
# The NVMe-oF lab: NVMe over Fabrics on RDMA between Linux's nvme-rdma / nvmet-rdma (over
# rdma_rxe) and the bareverbs unikernel's storage appliance, with Debian's unmodified nvme-cli
# and fio, on the RoCE lab's segment (qemu/roce/lab.sh: QEMU's socket netdev on a multicast
# group of this host's loopback).
#
#   qemu/roce/nvmf.sh                  the baseline (Linux A -> Linux B), then the unikernel
#   BAREVERBS_NVMF_QEMU=path           the qemu-system-x86_64 (default: BAREVERBS_ROCE_QEMU, else
#                                      QEMU 10 from qemu/roce/modern-qemu.sh, else PATH's)
#   BAREVERBS_NVMF_ACCEL=tcg|kvm       the accelerator (default: TCG, the CI's)
#   BAREVERBS_NVMF_KERNEL=path         another unikernel image (default: cargo's release build)
#   BAREVERBS_NVMF_NIC=virtio          the appliance's NIC: virtio (virtio-net), igb (an 82576: QEMU
#                                      8.0 or later) or e1000e (an 82574); the Linux guests keep
#                                      virtio-net, and the efficiency lines name an Intel NIC
#   BAREVERBS_NVMF_RUNS=3              runs of each performance job on each target (0: none)
#   BAREVERBS_NVMF_SECS=4              seconds each performance run lasts
#   BAREVERBS_NVMF_MIB=64              the RAM namespaces' size in MiB (and the disk image's)
#   BAREVERBS_NVMF_TIMEOUT=1500        seconds for the whole lab
#   BAREVERBS_NVMF_COUNT=1             the counted runs (0: none, no efficiency lines)
#   BAREVERBS_NVMF_NVME=1              the NVMe part (0: none): the appliance's QEMU NVMe
#                                      controller with two namespaces, Linux B's own
#   BAREVERBS_NVMF_NVME_RUNS=3         runs of each performance job on the NVMe namespaces
#   BAREVERBS_NVMF_PROFILE=JOB         the counted unikernel's profile over JOB's window (a job of
#                                      the efficiency lines, e.g. nvme-randread-4k; none by
#                                      default): `nvmf profile JOB:` lines, its top 15 symbols
#   BAREVERBS_NVMF_CPUS=2              the appliance's CPUs in its uncounted runs (the steps; its
#                                      counted run, the efficiency lines, has one): with 2,
#                                      `-smp 2` under multi-threaded TCG, its RAM subsystems'
#                                      I/O queues spread over both, the others' on CPU 0
#   BAREVERBS_NVMF_SMP=2               instead of all that: the appliance (RAM only) with -smp 2
#                                      and -smp 1 under Linux A's `nvme connect -i 2`, its cores
#                                      line, efficiency and IOPS (qemu/roce/nvmf-smp.sh)
#
# Linux B (10.0.0.3) serves nvmet-rdma over configfs on brd RAM disks; Linux A (10.0.0.1) is
# the host: `nvme discover`, `nvme connect`, fio with --verify=crc32c, mkfs.ext4 / mount / write /
# unmount, disconnect / reconnect / checksums (the baseline, qemu/roce/nvmf-linux.sh). When the
# unikernel has the appliance (its kernel knows `bvnvmf=`), it is booted once the baseline is
# over (10.0.0.2, a raw disk image as its virtio-blk disk): it first connects as a host to
# Linux B, then serves its RAM and virtio-blk namespaces to Linux A, which runs the same steps
# against it. After the unikernel has powered off, the files Linux A wrote on the virtio-blk
# namespace are read back from the disk image on this host (debugfs). Last, the performance
# jobs alternate between both targets. Prints `nvmf <step>: PASS|FAIL|SKIP (…)` per step, a
# line per performance job, the time of each stage, and the verdict; the exit status is 0
# unless a step that is expected to work failed.
# The appliance lets in Linux A's host NQN alone (`bvnvmf.allow=`): `nvmf allow-list` is A's
# discover and connect with another one, refused.
# The NVMe part (below, `nvme_dev`): the appliance's QEMU NVMe controller with two namespaces,
# Linux B's nvmet-rdma on a QEMU NVMe disk of its own; `nvmf nvme <step>` per step against the
# appliance's NVMe subsystem, `nvmf nvme image` for namespace 2's files read back from its
# image after power-off, `nvmf nvme-<job>` performance and efficiency lines.
# Efficiency: the instruction counter of the RoCE lab (qemu/roce/icount.sh) counts every
# instruction of a target's vCPU (Linux B: kernel and user). Counted guests run slower, so
# after the performance jobs the lab powers the unikernel off, and boots a counted Linux B
# (same address) and a counted unikernel (RAM namespace only); Linux A runs each job once on
# each, between two marks (Linux B runs qemu/roce/mark.c on its console's word, the unikernel
# its marker on `mXXXX`; this script relays A's requests and acknowledges them once the
# counter has the mark). `nvmf <job> efficiency: unikernel X linux Y ratio r` is the window's
# instructions per I/O that fio reports.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
lab_dir=$repo/qemu/lab
cache=${BAREVERBS_LAB_CACHE:-$lab_dir/.cache}
mkdir -p "$cache"
t0=$(date +%s)
stage() { echo "[nvmf +$(( $(date +%s) - t0 ))s] $*"; }

# shellcheck source=qemu/lab/host.sh
source "$lab_dir/host.sh"
install_missing qemu-system-x86 busybox-static kmod rdma-core iproute2 cpio nvme-cli fio e2fsprogs \
  gcc libglib2.0-dev pkg-config xz-utils
# shellcheck source=qemu/lab/guest.sh
source "$lab_dir/guest.sh"

uk_kernel=${BAREVERBS_NVMF_KERNEL:-$repo/target/release/bareverbs-appliance}
if [ -z "${BAREVERBS_NVMF_KERNEL:-}" ]; then
  stage "building the unikernel"
  (cd "$repo" && cargo build --release -p bareverbs-appliance 2>&1 | tail -1)
fi
# The appliance's NIC as QEMU names the device, and the tag of the efficiency lines (none for
# virtio-net, the lines the README's figures are checked against).
nic=${BAREVERBS_NVMF_NIC:-virtio}
case "$nic" in
  virtio) uk_nic=virtio-net-pci nic_tag= ;;
  igb|e1000e) uk_nic=$nic nic_tag=" $nic" ;;
  *) echo "BAREVERBS_NVMF_NIC=$nic: not virtio, igb or e1000e" >&2; exit 2 ;;
esac
# The appliance is there when the kernel knows its command-line word.
appliance=0
grep -a -q "bvnvmf=" "$uk_kernel" 2>/dev/null && appliance=1

port=$(( 20000 + ($$ + 7) % 20000 ))
seg="socket,mcast=230.0.0.1:$port,localaddr=127.0.0.1"
limit=${BAREVERBS_NVMF_TIMEOUT:-1500}
qemu=${BAREVERBS_NVMF_QEMU:-${BAREVERBS_ROCE_QEMU:-}}
if [ -z "$qemu" ]; then
  qemu=$("$here/modern-qemu.sh") || { qemu=qemu-system-x86_64; stage "no modern QEMU to be had: the system's runs"; }
fi
accel=${BAREVERBS_NVMF_ACCEL:-tcg}
runs=${BAREVERBS_NVMF_RUNS:-3}
secs=${BAREVERBS_NVMF_SECS:-4}
mib=${BAREVERBS_NVMF_MIB:-64}
# Linux A's host NQN, the one the appliance lets in (nvmf-linux.sh's).
hostnqn=nqn.2026-11.io.bareverbs:lab-a
# The NVMe part: the appliance serves namespaces 1 and 2 of a QEMU NVMe controller (`-device
# nvme` with two `-device nvme-ns`, a raw image of $mib MiB each) in a subsystem of their own,
# beside its RAM and virtio-blk subsystems; Linux B serves namespace 1 of a QEMU NVMe controller
# of its own (its /dev/nvme0n1) through nvmet-rdma, the baseline. On by default when the
# appliance's kernel knows NVMe namespaces (`nvme:NSID` in its configuration's grammar).
nvme=${BAREVERBS_NVMF_NVME:-1}
uk_cpus=${BAREVERBS_NVMF_CPUS:-2}
case "$uk_cpus" in 1|2|3|4) ;; *) echo "BAREVERBS_NVMF_CPUS=$uk_cpus: 1 to 4" >&2; exit 2 ;; esac
nvme_runs=${BAREVERBS_NVMF_NVME_RUNS:-$runs}
[ "$appliance" = 1 ] && grep -a -q "nvme:C/NSID" "$uk_kernel" 2>/dev/null || nvme=0
[ "$nvme" = 1 ] || nvme_runs=0
nqn_ram=nqn.2026-11.io.bareverbs:ram nqn_blk=nqn.2026-11.io.bareverbs:virtio-blk
nqn_nvme=nqn.2026-11.io.bareverbs:nvme
nvme_img1=$cache/nvmf-nvme-ns1.img nvme_img2=$cache/nvmf-nvme-ns2.img
b_nvme_img=$cache/nvmf-linux-b-nvme.img
# The appliance's command line after its address: the built-in configuration (RAM, and the
# virtio-blk disk when it has one) without the NVMe part; with it, the same subsystems declared
# (RAM, virtio-blk when DISK) and the NVMe subsystem with namespaces NSIDS.
uk_config() { # DISK(0|1) NSIDS
  if [ "$nvme" = 0 ]; then
    echo " bvnvmf.mib=$mib bvnvmf.allow=$hostnqn"
    return
  fi
  local c=" bvnvmf.subsys=$nqn_ram bvnvmf.ns=ram:${mib}M bvnvmf.allow=$hostnqn" n
  [ "$1" = 1 ] && c+=" bvnvmf.subsys=$nqn_blk bvnvmf.ns=blk:0 bvnvmf.allow=$hostnqn"
  c+=" bvnvmf.subsys=$nqn_nvme"
  for n in $2; do c+=" bvnvmf.ns=nvme:$n"; done
  echo "$c bvnvmf.allow=$hostnqn"
}
# QEMU's arguments of an NVMe controller (at ADDR; empty: QEMU's choice) with one namespace
# per image, NSID 1 up.
nvme_dev() { # ID ADDR SERIAL IMAGE...
  local id=$1 addr=$2 serial=$3 n=0 img a=()
  shift 3
  a=(-device "nvme,id=$id,serial=$serial${addr:+,addr=$addr}")
  for img in "$@"; do
    n=$((n + 1))
    a+=(-drive "file=$img,if=none,id=$id-d$n,format=raw" -device "nvme-ns,drive=$id-d$n,bus=$id,nsid=$n")
  done
  printf '%s\n' "${a[@]}"
}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# The instruction counter (qemu/roce/icount.sh: build_counter, window_count).
# shellcheck source=qemu/roce/icount.sh
source "$here/icount.sh"
b_count=$cache/nvmf-icount-linux-b.txt uk_count=$cache/nvmf-icount-unikernel.txt
# The profiled job's window: its marks' low byte, the job's place among the efficiency lines.
uk_prof=$cache/nvmf-profile-unikernel.txt prof_job=${BAREVERBS_NVMF_PROFILE:-} prof_kk=
case "$prof_job" in
  '') ;;
  randread-4k) prof_kk=01 ;; randwrite-4k) prof_kk=02 ;; seqread-128k) prof_kk=03 ;;
  nvme-randread-4k) prof_kk=04 ;; nvme-randwrite-4k) prof_kk=05 ;; nvme-seqread-128k) prof_kk=06 ;;
  *) echo "BAREVERBS_NVMF_PROFILE=$prof_job: not a job of the efficiency lines" >&2; exit 2 ;;
esac
rm -f "$b_count" "$uk_count" "$uk_prof"
counter_why="BAREVERBS_NVMF_COUNT=0"
if [ "${BAREVERBS_NVMF_COUNT:-1}" = 1 ] && [ "$appliance" = 1 ]; then
  why=
  build_counter || { counter_why=$why; stage "no instruction counts: $why"; }
elif [ "$appliance" = 0 ]; then
  counter_why="no unikernel target"
fi
count_arg=0
[ -n "$counter" ] && count_arg=1
# `nvmf restart`'s writer and checker of generations, for Linux A (qemu/roce/blocks.c).
blocks=$cache/blocks
gcc -O2 -Wall -Wextra -Werror -o "$blocks" "$here/blocks.c" || blocks=

# A guest's console input: a FIFO held open on a descriptor (console_fd[NAME]).
declare -A console_fd=()
console_in() { # NAME -> the FIFO's path; opens it
  local f=$cache/nvmf-console-$1.in fd
  rm -f "$f"; mkfifo "$f"
  exec {fd}<>"$f"
  console_fd[$1]=$fd
  echo "$f"
}
say_to() { # NAME LINE: a line to a guest's console
  [ -n "${console_fd[$1]:-}" ] && printf '%s\n' "$2" >&"${console_fd[$1]}"
}
linux() { # NAME ROLE IP MAC [EXTRA-KERNEL-ARGUMENTS] [COUNT]
  local acc=(-accel "$accel") extra=${5:-} disk=()
  [ -n "${6:-}" ] && acc=(-accel tcg -plugin "$counter,out=$6")
  # Linux B's NVMe controller (its /dev/nvme0n1), the NVMe part's baseline.
  [ "$2" = b ] && [ "$nvme" = 1 ] && mapfile -t disk < <(nvme_dev nvb "" bvlinuxb "$b_nvme_img")
  console_in "$1" > /dev/null
  timeout "$limit" "$qemu" \
    "${acc[@]}" -machine q35 -cpu max -smp 1 -m 1024 -nographic -no-reboot \
    -kernel "$cache/kroot/boot/vmlinuz-$kver" -initrd "$cache/initramfs.cpio.gz" \
    -append "console=ttyS0 panic=-1 quiet bvlab.kroot=$cache/kroot bvlab.inner=$here/nvmf-linux.sh bvnvmf.role=$2 bvnvmf.ip=$3 bvnvmf.uk=$appliance bvnvmf.mib=$mib bvnvmf.perf=$runs bvnvmf.secs=$secs bvnvmf.nvme=$nvme bvnvmf.nvmeruns=$nvme_runs$extra" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -netdev "$seg,id=n0" -device virtio-net-pci,netdev=n0,mac="$4",romfile=,rx_queue_size=1024 \
    "${disk[@]}" \
    < "$cache/nvmf-console-$1.in" > "$cache/nvmf-linux-$1.log" 2>&1 &
  pids+=($!)
  last_pid=$!
}
# The appliance (10.0.0.2): its console's output to LOG, its input from a FIFO (the lab's `q`
# powers it off, `mXXXX` runs a mark); with a disk image, the virtio-blk namespace; with NVMe
# images, an NVMe controller with a namespace on each.
unikernel() { # NAME LOG EXTRA-KERNEL-ARGUMENTS [DISK] [COUNT] [NVME-IMAGE...]
  local acc=(-accel "$accel" -smp "$uk_cpus") drive=() out=$cache/nvmf-console-$1.out nv=()
  [ "$uk_cpus" -gt 1 ] && [ "$accel" = tcg ] && acc=(-accel tcg,thread=multi -smp "$uk_cpus")
  [ -n "${4:-}" ] && drive=(-drive "file=$4,if=none,id=d0,format=raw,cache=none" -device virtio-blk-pci,drive=d0,addr=0x4.0)
  [ $# -gt 5 ] && mapfile -t nv < <(nvme_dev nvu 0x5.0 bvnvme0 "${@:6}")
  [ -n "${5:-}" ] && acc=(-accel tcg -plugin "$counter,out=$5")
  [ -n "${5:-}" ] && [ -n "$prof_kk" ] && acc[-1]+=",prof=$uk_prof,from=00$prof_kk,to=01$prof_kk"
  rm -f "$out"; mkfifo "$out"
  console_in "$1" > /dev/null
  cat "$out" > "$2" &
  readers+=($!)
  timeout "$limit" "$qemu" \
    "${acc[@]}" -machine q35 -cpu max -m 512M -nodefaults -vga none -display none -no-reboot \
    -serial "pipe:$cache/nvmf-console-$1" -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
    -netdev "$seg,id=nu" -device "$uk_nic",netdev=nu,addr=0x3.0,mac=52:54:00:00:00:02,romfile= \
    "${drive[@]}" "${nv[@]}" -kernel "$uk_kernel" \
    -append "bvnvmf=10.0.0.2/24$3" \
    > "$cache/nvmf-$1.qemu" 2>&1 &
  pids+=($!)
  last_pid=$!
}
readers=()
# Powers a unikernel off (`q` on its console); sets uk_exit: its QEMU status.
power_off() { # NAME PID
  say_to "$1" q || true
  for _ in $(seq 1 60); do kill -0 "$2" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$2" 2>/dev/null; then
    stage "stopping the $1: still running 30 s after its console's q"
    kill "$2" 2>/dev/null || true
    wait "$2" || true
    uk_exit="none: stopped by the lab"
  else
    wait "$2" && uk_exit=0 || uk_exit=$?
    stage "the $1 exited (status $uk_exit: 33 powered off on request, 35 FAIL)"
  fi
}

# The virtio-blk boot check first (`bvblk`: appliance/src/disk_check.rs): the kernel
# writes a pattern through its virtio-blk driver, reads it back, flushes and powers off; this
# host then finds the pattern in the raw image (sector s: "bareverbs virtio-blk sector s" in
# 8 digits and a newline, padded with dots to 512 bytes, for s in 8..327).
blk_boot() {
  local img=$cache/nvmf-blk-check.img log=$cache/nvmf-blk-check.log st=0 line
  rm -f "$img"; truncate -s 8M "$img"
  timeout 120 "$qemu" -accel "$accel" -machine q35 -cpu max -m 256M -nodefaults -vga none \
    -display none -no-reboot -serial "file:$log" -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
    -drive "file=$img,if=none,id=d0,format=raw" -device virtio-blk-pci,drive=d0,addr=0x4.0 \
    -kernel "$uk_kernel" -append bvblk > "$cache/nvmf-blk-check.qemu" 2>&1 || st=$?
  line=$({ grep -a "^virtio-blk: " "$log" || true; } | tr -d '\r')
  if [ "$st" != 33 ] || [ -z "$line" ]; then
    echo "FAIL (QEMU status $st, 33 wanted; the kernel said: $(tail -1 "$log" 2>/dev/null | tr -d '\r'))"
  elif ! cmp -s <(dd if="$img" bs=512 skip=8 count=320 2>/dev/null) \
         <(awk 'BEGIN { for (s = 8; s < 328; s++) { l = sprintf("bareverbs virtio-blk sector %08d\n", s); printf "%s", l; for (i = length(l); i < 512; i++) printf "." } }'); then
    echo "FAIL (the image after power-off does not hold the pattern the kernel wrote)"
  elif [ -n "$(dd if="$img" bs=512 count=8 2>/dev/null | tr -d '\0')" ]; then
    echo "FAIL (the image's first 8 sectors are not zero: a write landed in the wrong place)"
  else
    echo "PASS (${line#virtio-blk: }; after power-off this host found the 320 sectors in the raw image, sectors 0-7 untouched)"
  fi
}
# BAREVERBS_NVMF_SMP=2: the appliance on two vCPUs and on one, RAM only, under Linux A's
# `nvme connect -i 2` (qemu/roce/nvmf-smp.sh, which ends the lab); none of the steps below.
if [ "${BAREVERBS_NVMF_SMP:-1}" = 2 ]; then
  # shellcheck source=qemu/roce/nvmf-smp.sh
  source "$here/nvmf-smp.sh"
fi
boot=$(blk_boot)
stage "the virtio-blk boot check: ${boot%% *}"

alog=$cache/nvmf-linux-a.log blog=$cache/nvmf-linux-b.log ulog=$cache/nvmf-unikernel.log
# The appliance booted again by `nvmf restart` (same disk image and address): its log, and
# the name and log of the appliance that runs now.
rlog=$cache/nvmf-unikernel-restarted.log uk_name=unikernel ulast=$ulog
clog=$cache/nvmf-unikernel-counted.log
img=$cache/nvmf-disk.img
rm -f "$ulog" "$rlog" "$clog" "$cache"/nvmf-unikernel*.qemu "$cache"/nvmf-unikernel-restarted*.log "$img" "$cache"/nvmf-console*
rm -f "$nvme_img1" "$nvme_img2" "$b_nvme_img"
if [ "$nvme" = 1 ]; then
  truncate -s "${mib}M" "$nvme_img1" "$nvme_img2" "$b_nvme_img"
  stage "the NVMe part: the appliance's NVMe controller with 2 namespaces of $mib MiB, Linux B's with 1 (raw images; $nvme_runs performance runs per job)"
fi
stage "booting Linux A (10.0.0.1) and Linux B (10.0.0.3), ${accel^^}, $("$qemu" --version | head -1), on mcast group port $port"
linux a a 10.0.0.1 52:54:00:00:00:01 " bvnvmf.count=$count_arg bvnvmf.blocks=$blocks"
a_pid=$last_pid
linux b b 10.0.0.3 52:54:00:00:00:03
b_pid=$last_pid
uk_pid='' uk_status='' stopped='' cuk_pid='' cuk_status='' counted='' relayed=0 restarted=0
# Linux A's phases, each told once with the time it began.
declare -A phase_seen=()
uk_nvme=()
[ "$nvme" = 1 ] && uk_nvme=("$nvme_img1" "$nvme_img2")
waiting=() # marks relayed to a target, not yet acknowledged to A: "SIDE CODE"
deadline=$(( t0 + limit ))
while kill -0 "$a_pid" 2>/dev/null; do
  if [ "$(date +%s)" -ge "$deadline" ]; then stopped="the lab's timeout (${limit} s)"; break; fi
  if ! kill -0 "$b_pid" 2>/dev/null; then stopped="Linux B stopped"; break; fi
  if [ "$appliance" = 1 ] && [ -z "$uk_pid" ] && grep -a -q "phase unikernel" "$alog"; then
    stage "baseline over; booting the unikernel (10.0.0.2) with a ${mib} MiB raw disk image${uk_nvme[*]:+ and its NVMe controller}"
    truncate -s "${mib}M" "$img"
    unikernel unikernel "$ulog" " bvnvmf.host=10.0.0.3$(uk_config 1 "1 2")" "$img" "" "${uk_nvme[@]}"
    uk_pid=$last_pid
  fi
  for p in $({ grep -a -o "\]: phase [a-z-]*" "$alog" 2>/dev/null || true; } | awk '{print $3}'); do
    [ -n "${phase_seen[$p]:-}" ] && continue
    phase_seen[$p]=1
    stage "Linux A: phase $p"
  done
  # `nvmf restart`: Linux A asks for the appliance's QEMU to be killed (SIGKILL: no flush, no
  # goodbye to the host) in the middle of its write; it is booted again at once, on the same
  # disk images, at the same address, with the same command line (once for the virtio-blk
  # namespace, once more for the NVMe namespace).
  if [ -n "$uk_pid" ] && [ "$restarted" -lt "$(grep -a -c "^nvmf-restart kill" "$alog")" ]; then
    restarted=$((restarted + 1))
    # Its counters first (`s`: what each core served, for the `nvmf cpus` line), then the
    # kill; the writer goes on meanwhile.
    say_to "$uk_name" s || true
    sleep 0.5
    # The QEMU is the child of its `timeout` (uk_pid).
    for c in $(pgrep -P "$uk_pid"); do kill -KILL "$c" 2>/dev/null || true; done
    wait "$uk_pid" 2>/dev/null || true
    say_to a "ack killed"
    stage "the appliance's QEMU killed (SIGKILL) in the middle of Linux A's write ($restarted); booting it again on the same disk images"
    uk_name=unikernel-restarted ulast=$rlog
    [ "$restarted" -gt 1 ] && uk_name=unikernel-restarted-$restarted ulast=$cache/nvmf-unikernel-restarted-$restarted.log
    unikernel "$uk_name" "$ulast" " bvnvmf.host=10.0.0.3$(uk_config 1 "1 2")" "$img" "" "${uk_nvme[@]}"
    uk_pid=$last_pid
  fi
  # The counted runs: the unikernel powered off (its disk image is then complete), Linux B
  # booted again counted, and a counted unikernel.
  if [ -n "$counter" ] && [ -z "$counted" ] && grep -a -q "phase counted" "$alog"; then
    counted=1
    if [ -n "$uk_pid" ]; then power_off "$uk_name" "$uk_pid"; uk_status=$uk_exit; fi
    kill "$b_pid" 2>/dev/null || true
    wait "$b_pid" 2>/dev/null || true
    stage "booting a counted Linux B and a counted unikernel (TCG, the instruction counter)"
    linux b-counted b 10.0.0.3 52:54:00:00:00:03 " bvnvmf.mark=$counter_mark" "$b_count"
    b_pid=$last_pid
    # (With the NVMe part: its controller with namespace 1 alone, the one the jobs use.)
    if [ "$nvme" = 1 ]; then
      unikernel unikernel-counted "$clog" "$(uk_config 0 1)" "" "$uk_count" "$nvme_img1"
    else
      unikernel unikernel-counted "$clog" "$(uk_config 0 "")" "" "$uk_count"
    fi
    cuk_pid=$last_pid
    say_to a "ack counted"
  fi
  # A's mark requests: to the target's console; acknowledged once the counter has the mark.
  if [ -n "$counted" ]; then
    mapfile -t reqs < <({ grep -a "^nvmf-mark " "$alog" || true; } | tr -d '\r')
    while [ "$relayed" -lt ${#reqs[@]} ]; do
      read -r _ side code <<<"${reqs[$relayed]}"
      relayed=$((relayed + 1))
      case "$side" in
        linux) say_to b-counted "mark $code" ;;
        unikernel) say_to unikernel-counted "m$code" ;;
      esac
      waiting+=("$side $code")
    done
    left=()
    for w in "${waiting[@]}"; do
      read -r side code <<<"$w"
      f=$b_count
      [ "$side" = unikernel ] && f=$uk_count
      if grep -q "^mark $code " "$f" 2>/dev/null; then say_to a "ack $code"; else left+=("$w"); fi
    done
    waiting=("${left[@]}")
  fi
  sleep 0.3
done
if [ -n "$stopped" ]; then stage "stopping: $stopped"; else stage "Linux A done"; fi
# The appliance powers off on `q` at its console; then the disk image is complete.
if [ -n "$uk_pid" ] && [ -z "$uk_status" ]; then power_off "$uk_name" "$uk_pid"; uk_status=$uk_exit; fi
if [ -n "$cuk_pid" ]; then power_off unikernel-counted "$cuk_pid"; cuk_status=$uk_exit; fi
# The consoles' readers end with their QEMU (end of file); a few seconds to drain.
for r in "${readers[@]}"; do
  for _ in $(seq 1 10); do kill -0 "$r" 2>/dev/null || break; sleep 0.5; done
  kill "$r" 2>/dev/null || true
done
cleanup

# --- the verdict -------------------------------------------------------------------------------
# Steps that do not work yet: printed as SKIP with the reason (and what this run said), not
# counted. Empty once everything works.
declare -A pending=()
[ "$appliance" = 1 ] || for s in discover connect fio-rand4k fio-seq128k smart-log mkfs reconnect allow-list restart virtio-blk host; do
  pending[$s]="the unikernel has no NVMe-oF appliance yet (its kernel does not know bvnvmf=)"
done
grep -a -q "nvmf-uk host: " "$uk_kernel" ||
  pending[host]="the appliance has no host mode yet (its kernel never prints nvmf-uk host)"
nvme_steps=(restart discover connect fio-rand4k fio-seq128k mkfs reconnect)
why=()
res() { { grep -a "^nvmf-result $1: " "$alog" || true; } | tail -1 | sed "s/^nvmf-result $1: //" | tr -d '\r'; }
report() { # NAME RESULT ("PASS (…)" / "FAIL (…)" / "")
  local name=$1 r=$2
  if [ -n "${pending[$name]:-}" ] && [[ "$r" != PASS* ]]; then
    echo "nvmf $name: SKIP (${pending[$name]}${r:+; this run: $r})"
  elif [[ "$r" == PASS* ]]; then
    echo "nvmf $name: $r"
  else
    echo "nvmf $name: ${r:-FAIL (no result)}"
    why+=("$name")
  fi
}
echo "nvmf virtio-blk-boot: $boot"
[[ "$boot" == PASS* ]] || why+=("virtio-blk-boot")
for s in discover connect fio-rand4k fio-seq128k mkfs reconnect; do
  r=$(res "linux-linux $s")
  echo "nvmf linux-linux $s: ${r:-FAIL (no result)}"
  [[ "$r" == PASS* ]] || why+=("linux-linux $s")
done
for s in discover connect fio-rand4k fio-seq128k smart-log mkfs reconnect allow-list restart; do
  report "$s" "$(res "unikernel $s")"
done
# The NVMe part: Linux B's nvmet-rdma on its own NVMe disk (the baseline's connection), then
# the steps against the appliance's NVMe subsystem (namespace 1: fio, restart; namespace 2:
# ext4 across a reconnect).
if [ "$nvme" = 1 ]; then
  r=$(res "linux-nvme connect")
  echo "nvmf linux-nvme connect: ${r:-FAIL (no result)}"
  [[ "$r" == PASS* ]] || why+=("linux-nvme connect")
  for s in "${nvme_steps[@]}"; do report "nvme $s" "$(res "nvme $s")"; done
fi

# virtio-blk: the namespace's steps on Linux A, then the files in the image, read on this host.
blk=
for s in virtio-blk-connect mkfs reconnect; do
  r=$(res "virtio-blk $s")
  [[ "$r" == PASS* ]] || { blk="FAIL (virtio-blk namespace, $s: ${r:-no result})"; break; }
done
if [ -z "$blk" ]; then
  sums=$({ grep -a "^nvmf-sum " "$alog" || true; } | tr -d '\r')
  n=0 bad=()
  while read -r _ f sum; do
    [ -n "$f" ] || continue
    got=$(debugfs -R "cat /$f" "$img" 2>/dev/null | sha256sum | cut -d' ' -f1)
    [ "$got" = "$sum" ] && n=$((n + 1)) || bad+=("$f")
  done <<<"$sums"
  if [ "$n" -gt 0 ] && [ ${#bad[@]} -eq 0 ]; then
    blk="PASS (ext4 made, written and checked after a reconnect over NVMe/RDMA; after the unikernel's power-off (QEMU status ${uk_status:-none}) this host read the $n files from the raw image with debugfs: sha256 as written)"
  else
    blk="FAIL (the disk image after power-off: $n files as written, wrong or missing: ${bad[*]:-all})"
  fi
fi
report virtio-blk "$blk"
# The NVMe namespace 2's files, read on this host from its image after the power-off.
if [ "$nvme" = 1 ]; then
  nv=
  for s in mkfs reconnect; do
    r=$(res "nvme $s")
    [[ "$r" == PASS* ]] || { nv="FAIL (NVMe namespace 2, $s: ${r:-no result})"; break; }
  done
  if [ -z "$nv" ]; then
    sums=$({ grep -a "^nvmf-sum-nvme " "$alog" || true; } | tr -d '\r')
    n=0 bad=()
    while read -r _ f sum; do
      [ -n "$f" ] || continue
      got=$(debugfs -R "cat /$f" "$nvme_img2" 2>/dev/null | sha256sum | cut -d' ' -f1)
      [ "$got" = "$sum" ] && n=$((n + 1)) || bad+=("$f")
    done <<<"$sums"
    if [ "$n" -gt 0 ] && [ ${#bad[@]} -eq 0 ]; then
      nv="PASS (after the unikernel's power-off (QEMU status ${uk_status:-none}) this host read the $n files Linux A wrote on NVMe namespace 2 from its raw image with debugfs: sha256 as written)"
    else
      nv="FAIL (NVMe namespace 2's image after power-off: $n files as written, wrong or missing: ${bad[*]:-all})"
    fi
  fi
  report "nvme image" "$nv"
fi
h=$({ grep -a "^nvmf-uk host: " "$ulog" 2>/dev/null || true; } | tail -1 | sed 's/^nvmf-uk host: //' | tr -d '\r')
case "$h" in ok*) h="PASS (${h#ok }; Linux B's nvmet-rdma, brd)" ;; ?*) h="FAIL ($h)" ;; esac
report host "$h"

# Performance: each job's runs on each side, in order, then their medians. A random-read run
# of the appliance's below half its median fails the lab (a rate that falls at random is a
# defect, whatever the median says); for the other jobs such a run is noted.
median() { sort -n | awk '{v[NR] = $1} END {if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%d\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
perf_jobs=(randread-4k randwrite-4k seqread-128k)
[ "$nvme" = 1 ] && perf_jobs+=(nvme-randread-4k nvme-randwrite-4k nvme-seqread-128k)
for job in "${perf_jobs[@]}"; do
  vals() { { grep -a "^nvmf-perf $job $1 [0-9]" "$alog" || true; } | tr -d '\r' | awk '{print $4}'; }
  nl=$(vals linux | grep -c . || true) nu=$(vals unikernel | grep -c . || true)
  ml=$(vals linux | median) mu=$(vals unikernel | median)
  if [ "$nl" -gt 0 ] || [ "$nu" -gt 0 ]; then
    echo "nvmf $job runs: unikernel $(vals unikernel | paste -sd' ') linux $(vals linux | paste -sd' ')"
  fi
  if [ -n "$mu" ]; then
    slow=$(vals unikernel | sort -n | head -1)
    if awk -v s="$slow" -v m="$mu" 'BEGIN {exit !(s * 2 < m)}'; then
      # Random reads fail the lab; the other jobs' slow runs are shown (the first sequential
      # run is slower on both targets).
      if [ "$job" = randread-4k ]; then
        echo "nvmf $job: FAIL (the appliance's slowest run, $slow IOPS, is below half its median, $mu)"
        why+=("$job: a run below half the median")
      else
        echo "nvmf $job: NOTE (the appliance's slowest run, $slow IOPS, is below half its median, $mu)"
      fi
    fi
  fi
  if [ -n "$ml" ] && [ -n "$mu" ]; then
    ratio=$(awk -v u="$mu" -v l="$ml" 'BEGIN {printf "%.2f", (l > 0 ? u / l : 0)}')
    n=$(( nl < nu ? nl : nu ))
    echo "nvmf $job: unikernel $mu linux $ml ratio $ratio (median of $n)"
  elif [ -n "$ml" ]; then
    echo "nvmf $job: SKIP (no unikernel target to measure; linux $ml IOPS, median of $nl)"
  else
    echo "nvmf $job: SKIP (no measurement: runs ${runs}, NVMe runs ${nvme_runs})"
  fi
done

# What each side's transport counted over the timed runs: Linux A's rxe after each run (on
# either target), the appliance's last line of its own counts.
{ grep -a "^nvmf-rxe " "$alog" || true; } | tr -d '\r' | sed 's/^nvmf-rxe /nvmf rxe counters (Linux A) after /'
t=$({ grep -a "^nvmf-uk transport " "$ulast" 2>/dev/null || true; } | tail -1 | tr -d '\r')
[ -n "$t" ] && echo "nvmf transport (the appliance) ${t#nvmf-uk transport }"

# --- the NVMe namespaces' copies ---------------------------------------------------------------
# The appliance counts the bytes its CPU copies between the target's RDMA buffers and the NVMe
# controllers' namespaces, per read or write asked of them, and prints
# `nvmf-uk nvme copies: X bytes per I/O (N I/Os, B bytes copied)` with its counters. Of every
# boot's log (the first, and those after the restarts) the line with the most I/Os is
# reported as `nvmf nvme copies: …`. The lab fails when no boot printed one, when no NVMe I/O
# was counted, or when any boot copied a byte.
nvme_copies() {
  local lines best
  lines=$({ cat "$ulog" "$rlog" "$cache"/nvmf-unikernel-restarted-*.log 2>/dev/null || true; } |
    { grep -a "nvmf-uk nvme copies: [0-9]* bytes per I/O ([0-9]* I/Os, [0-9]* bytes copied)" || true; } |
    tr -d '\r' | sed 's/.*nvmf-uk nvme copies: //')
  if [ -z "$lines" ]; then
    echo "nvmf nvme copies: FAIL (NOT REPORTED: no \`nvmf-uk nvme copies:\` line in the appliance's logs)"
    why+=("nvme copies not reported")
    return
  fi
  # Fields: X bytes per I/O (N I/Os, B bytes copied) -> $1 X, $5 "(N", $7 B.
  best=$(awk '{ n = substr($5, 2) + 0; if (n >= m) { m = n; l = $0 } } END { print l }' <<<"$lines")
  local n copied
  n=$(awk '{ print substr($5, 2) + 0 }' <<<"$best")
  copied=$(awk '{ s += $7 } END { print s + 0 }' <<<"$lines")
  if [ "$n" -eq 0 ]; then
    echo "nvmf nvme copies: FAIL (no NVMe I/O counted: $best)"
    why+=("nvme copies: no I/O counted")
  elif [ "$copied" -gt 0 ]; then
    echo "nvmf nvme copies: $best: FAIL ($copied bytes copied over the appliance's boots)"
    why+=("nvme copies: $copied bytes copied")
  else
    echo "nvmf nvme copies: $best"
  fi
}
[ "$nvme" = 1 ] && nvme_copies

# Efficiency: each job's window (marks 00KK..01KK) of the counted targets, per I/O fio reports.
k=0
for job in "${perf_jobs[@]}"; do
  k=$((k + 1))
  if [ -z "$counter" ]; then
    echo "nvmf $job efficiency$nic_tag: SKIP (no instruction counter: $counter_why)"
    continue
  fi
  ios() { { grep -a "^nvmf-count $job $1 [0-9]" "$alog" || true; } | tr -d '\r' | awk '{print $4; exit}'; }
  iu=$(ios unikernel) il=$(ios linux)
  u=$(window_count "$uk_count" "0$k") l=$(window_count "$b_count" "0$k")
  if [ -n "$u" ] && [ -n "$l" ] && [ "${iu:-0}" -gt 0 ] && [ "${il:-0}" -gt 0 ]; then
    awk -v j="$job" -v t="$nic_tag" -v u="$u" -v l="$l" -v iu="$iu" -v il="$il" 'BEGIN {
      printf "nvmf %s efficiency%s: unikernel %.0f linux %.0f ratio %.2f (instructions per I/O: %.1fM over %d I/Os, %.1fM over %d)\n",
        j, t, u / iu, l / il, (u / iu) / (l / il), u / 1e6, iu, l / 1e6, il }'
  else
    echo "nvmf $job efficiency$nic_tag: FAIL (windows: unikernel ${u:--} instructions, ${iu:--} I/Os; linux ${l:--}, ${il:--})"
    why+=("$job efficiency")
  fi
done

# `nvmf profile <job>:` the counted unikernel's top 15 symbols over the profiled window (each
# translated block's instructions given to the symbol at or below its first address, as the
# RoCE lab's profile does).
if [ -n "$prof_kk" ] && [ -s "$uk_prof" ] && command -v nm > /dev/null; then
  { nm -C -n --defined-only "$uk_kernel" 2>/dev/null |
      awk '$2 ~ /^[tTwW]$/ {a = $1; $1 = ""; $2 = ""; sub(/^ +/, ""); print "S", a, $0}'
    awk '{print "P", $1, $2}' "$uk_prof"; } |
    LC_ALL=C sort -k2,2 -k1,1r | awk '$1 == "S" {s = $0; sub(/^S [0-9a-f]+ /, "", s); next}
      {by[s == "" ? "?" : s] += $3} END {for (k in by) print by[k], k}' |
    sort -rn | awk -v job="$prof_job" '{n[NR] = $1; t += $1; $1 = ""; sub(/^ /, ""); name[NR] = $0}
      END {if (t == 0) exit
        printf "nvmf profile %s: %.1fM instructions in the unikernel'"'"'s window, top symbols:\n", job, t / 1e6
        for (i = 1; i <= NR && i <= 15; i++) printf "nvmf profile %s: %5.1f%% %s\n", job, 100 * n[i] / t, substr(name[i], 1, 110)}'
elif [ -n "$prof_kk" ]; then
  echo "nvmf profile $prof_job: - (no profile written, or no nm)"
fi

# The appliance's CPUs in its uncounted runs: its `nvmf: cores:` line (printed when it has
# more than one), and what each core served by its end (`nvmf-uk cores:`, when a poll group
# served a queue). With BAREVERBS_NVMF_CPUS above 1, a first boot without the line is a failure.
if [ "$appliance" = 1 ] && [ -s "$ulog" ]; then
  cores_line=$({ grep -a -m1 '^nvmf: cores:' "$ulog" || true; } | tr -d '\r')
  # Each boot's last counters: the first two asked for (`s`) just before the restart steps
  # killed them, the last at its power-off (this run's logs only).
  boots=("$ulog")
  for f in "$rlog" "$cache/nvmf-unikernel-restarted-2.log"; do [ "$f" -nt "$ulog" ] && boots+=("$f"); done
  served=
  for f in "${boots[@]}"; do
    l=$({ grep -a '^nvmf-uk cores:' "$f" 2>/dev/null || true; } | tail -1 | tr -d '\r')
    [ -n "$l" ] && served+="${served:+; }${f##*/nvmf-}: ${l#nvmf-uk cores: }"
  done
  if [ "$uk_cpus" -gt 1 ] && [ -z "$cores_line" ]; then
    echo "nvmf cpus: FAIL (-smp $uk_cpus, but the appliance printed no 'nvmf: cores:' line)"
    why+=("cpus")
  elif [ "$uk_cpus" -gt 1 ]; then
    echo "nvmf cpus: PASS (-smp $uk_cpus: ${cores_line#nvmf: }${served:+; served, per boot: $served})"
  fi
fi

tail_of() { echo "[nvmf] $1's log ($2) ends:"; tail -"${3:-15}" "$2" 2>/dev/null | tr -d '\r' | sed 's/^/  /'; }
[ -n "$stopped" ] && why+=("stopped: $stopped")
if [ ${#why[@]} -gt 0 ]; then
  tail_of "Linux B" "$blog"
  tail_of "Linux A" "$alog" 25
  [ -s "$ulog" ] && tail_of "the unikernel" "$ulog"
  [ -s "$rlog" ] && tail_of "the unikernel booted again" "$rlog"
  [ -s "$cache/nvmf-unikernel-restarted-2.log" ] && tail_of "the unikernel booted again (NVMe restart)" "$cache/nvmf-unikernel-restarted-2.log"
  [ -s "$clog" ] && tail_of "the counted unikernel" "$clog"
fi
stage "done"
skipped=
[ ${#pending[@]} -gt 0 ] && skipped=", ${#pending[@]} unikernel steps pending"
if [ ${#why[@]} -eq 0 ]; then
  echo "[nvmf] verdict: PASS ($accel, appliance on $nic, -smp $uk_cpus$skipped)"
  exit 0
fi
msg=$(printf '%s; ' "${why[@]}")
echo "[nvmf] verdict: FAIL (${msg%; })"
exit 1
