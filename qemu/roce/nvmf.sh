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
#   BAREVERBS_NVMF_RUNS=3              runs of each performance job on each target (0: none)
#   BAREVERBS_NVMF_SECS=4              seconds each performance run lasts
#   BAREVERBS_NVMF_MIB=64              the RAM namespaces' size in MiB (and the disk image's)
#   BAREVERBS_NVMF_TIMEOUT=600         seconds for the whole lab
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
install_missing qemu-system-x86 busybox-static kmod rdma-core iproute2 cpio nvme-cli fio e2fsprogs
# shellcheck source=qemu/lab/guest.sh
source "$lab_dir/guest.sh"

uk_kernel=${BAREVERBS_NVMF_KERNEL:-$repo/target/release/bareverbs-unikernel}
if [ -z "${BAREVERBS_NVMF_KERNEL:-}" ]; then
  stage "building the unikernel"
  (cd "$repo" && cargo build --release -p bareverbs-unikernel 2>&1 | tail -1)
fi
# The appliance is there when the kernel knows its command-line word.
appliance=0
grep -a -q "bvnvmf=" "$uk_kernel" 2>/dev/null && appliance=1

port=$(( 20000 + ($$ + 7) % 20000 ))
seg="socket,mcast=230.0.0.1:$port,localaddr=127.0.0.1"
limit=${BAREVERBS_NVMF_TIMEOUT:-600}
qemu=${BAREVERBS_NVMF_QEMU:-${BAREVERBS_ROCE_QEMU:-}}
if [ -z "$qemu" ]; then
  qemu=$("$here/modern-qemu.sh") || { qemu=qemu-system-x86_64; stage "no modern QEMU to be had: the system's runs"; }
fi
accel=${BAREVERBS_NVMF_ACCEL:-tcg}
runs=${BAREVERBS_NVMF_RUNS:-3}
secs=${BAREVERBS_NVMF_SECS:-4}
mib=${BAREVERBS_NVMF_MIB:-64}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
linux() { # NAME ROLE IP MAC
  timeout "$limit" "$qemu" \
    -accel "$accel" -machine q35 -cpu max -smp 1 -m 1024 -nographic -no-reboot \
    -kernel "$cache/kroot/boot/vmlinuz-$kver" -initrd "$cache/initramfs.cpio.gz" \
    -append "console=ttyS0 panic=-1 quiet bvlab.kroot=$cache/kroot bvlab.inner=$here/nvmf-linux.sh bvnvmf.role=$2 bvnvmf.ip=$3 bvnvmf.uk=$appliance bvnvmf.mib=$mib bvnvmf.perf=$runs bvnvmf.secs=$secs" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -netdev "$seg,id=n0" -device virtio-net-pci,netdev=n0,mac="$4",romfile=,rx_queue_size=1024 \
    > "$cache/nvmf-linux-$1.log" 2>&1 &
  pids+=($!)
}

# The virtio-blk boot check first (`bvblk`: examples/unikernel/src/disk_check.rs): the kernel
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
boot=$(blk_boot)
stage "the virtio-blk boot check: ${boot%% *}"

alog=$cache/nvmf-linux-a.log blog=$cache/nvmf-linux-b.log ulog=$cache/nvmf-unikernel.log
img=$cache/nvmf-disk.img
rm -f "$ulog" "$cache/nvmf-unikernel.qemu" "$img" "$cache"/nvmf-console.{in,out}
stage "booting Linux A (10.0.0.1) and Linux B (10.0.0.3), ${accel^^}, $("$qemu" --version | head -1), on mcast group port $port"
linux a a 10.0.0.1 52:54:00:00:00:01
a_pid=${pids[0]}
linux b b 10.0.0.3 52:54:00:00:00:03
b_pid=${pids[1]}
uk_pid='' uk_status='' stopped='' reader=''
deadline=$(( t0 + limit ))
while kill -0 "$a_pid" 2>/dev/null; do
  if [ "$(date +%s)" -ge "$deadline" ]; then stopped="the lab's timeout (${limit} s)"; break; fi
  if ! kill -0 "$b_pid" 2>/dev/null; then stopped="Linux B stopped"; break; fi
  if [ "$appliance" = 1 ] && [ -z "$uk_pid" ] && grep -a -q "phase unikernel" "$alog"; then
    stage "baseline over; booting the unikernel (10.0.0.2) with a ${mib} MiB raw disk image"
    truncate -s "${mib}M" "$img"
    # The console: output to the log, input from a FIFO (the lab's `q` powers the appliance off).
    mkfifo "$cache/nvmf-console.in" "$cache/nvmf-console.out"
    cat "$cache/nvmf-console.out" > "$ulog" &
    reader=$!
    exec 7<>"$cache/nvmf-console.in"
    timeout "$limit" "$qemu" \
      -accel "$accel" -machine q35 -cpu max -m 512M -nodefaults -vga none -display none -no-reboot \
      -serial "pipe:$cache/nvmf-console" -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
      -netdev "$seg,id=nu" -device virtio-net-pci,netdev=nu,addr=0x3.0,mac=52:54:00:00:00:02,romfile= \
      -drive "file=$img,if=none,id=d0,format=raw" -device virtio-blk-pci,drive=d0,addr=0x4.0 \
      -kernel "$uk_kernel" \
      -append "bvnvmf=10.0.0.2/24 bvnvmf.host=10.0.0.3 bvnvmf.mib=$mib" \
      > "$cache/nvmf-unikernel.qemu" 2>&1 &
    uk_pid=$!
    pids+=("$uk_pid")
  fi
  sleep 0.5
done
if [ -n "$stopped" ]; then stage "stopping: $stopped"; else stage "Linux A done"; fi
# The appliance powers off on `q` at its console; then the disk image is complete.
if [ -n "$uk_pid" ]; then
  echo q >&7 || true
  for _ in $(seq 1 60); do kill -0 "$uk_pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$uk_pid" 2>/dev/null; then
    stage "stopping the unikernel: still running 30 s after its console's q"
    kill "$uk_pid" 2>/dev/null || true
    wait "$uk_pid" || true
    uk_status="none: stopped by the lab"
  else
    wait "$uk_pid" && uk_status=0 || uk_status=$?
    stage "the unikernel exited (status $uk_status: 33 powered off on request, 35 FAIL)"
  fi
  exec 7>&-
  [ -n "$reader" ] && { kill "$reader" 2>/dev/null || true; }
fi
cleanup

# --- the verdict -------------------------------------------------------------------------------
# Steps that do not work yet: printed as SKIP with the reason (and what this run said), not
# counted. Empty once everything works.
declare -A pending=()
[ "$appliance" = 1 ] || for s in discover connect fio-rand4k fio-seq128k mkfs reconnect virtio-blk host; do
  pending[$s]="the unikernel has no NVMe-oF appliance yet (its kernel does not know bvnvmf=)"
done
grep -a -q "nvmf-uk host: " "$uk_kernel" ||
  pending[host]="the appliance has no host mode yet (its kernel never prints nvmf-uk host)"
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
for s in discover connect fio-rand4k fio-seq128k mkfs reconnect; do
  report "$s" "$(res "unikernel $s")"
done

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
h=$({ grep -a "^nvmf-uk host: " "$ulog" 2>/dev/null || true; } | tail -1 | sed 's/^nvmf-uk host: //' | tr -d '\r')
case "$h" in ok*) h="PASS (${h#ok }; Linux B's nvmet-rdma, brd)" ;; ?*) h="FAIL ($h)" ;; esac
report host "$h"

# Performance: the median of each job's runs on each side.
median() { sort -n | awk '{v[NR] = $1} END {if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%d\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
for job in randread-4k randwrite-4k seqread-128k; do
  vals() { { grep -a "^nvmf-perf $job $1 [0-9]" "$alog" || true; } | tr -d '\r' | awk '{print $4}'; }
  nl=$(vals linux | grep -c . || true) nu=$(vals unikernel | grep -c . || true)
  ml=$(vals linux | median) mu=$(vals unikernel | median)
  if [ -n "$ml" ] && [ -n "$mu" ]; then
    ratio=$(awk -v u="$mu" -v l="$ml" 'BEGIN {printf "%.2f", (l > 0 ? u / l : 0)}')
    n=$(( nl < nu ? nl : nu ))
    echo "nvmf $job: unikernel $mu linux $ml ratio $ratio (median of $n)"
  elif [ -n "$ml" ]; then
    echo "nvmf $job: SKIP (no unikernel target to measure; linux $ml IOPS, median of $nl)"
  else
    echo "nvmf $job: SKIP (no measurement: runs ${runs})"
  fi
done

tail_of() { echo "[nvmf] $1's log ($2) ends:"; tail -"${3:-15}" "$2" 2>/dev/null | tr -d '\r' | sed 's/^/  /'; }
[ -n "$stopped" ] && why+=("stopped: $stopped")
if [ ${#why[@]} -gt 0 ]; then
  tail_of "Linux B" "$blog"
  tail_of "Linux A" "$alog" 25
  [ -s "$ulog" ] && tail_of "the unikernel" "$ulog"
fi
stage "done"
skipped=
[ ${#pending[@]} -gt 0 ] && skipped=", ${#pending[@]} unikernel steps pending"
if [ ${#why[@]} -eq 0 ]; then
  echo "[nvmf] verdict: PASS ($accel$skipped)"
  exit 0
fi
msg=$(printf '%s; ' "${why[@]}")
echo "[nvmf] verdict: FAIL (${msg%; })"
exit 1
