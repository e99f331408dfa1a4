#!/usr/bin/env bash
# The appliance's configuration, against Linux: what the kernel command line declares is what
# a Linux host finds, and a bad configuration is refused before anything is served.
#
#   qemu/roce/nvmf-config.sh
#   BAREVERBS_NVMF_QEMU=path           the qemu-system-x86_64 (as qemu/roce/nvmf.sh)
#   BAREVERBS_NVMF_ACCEL=tcg|kvm       the accelerator (default: TCG, the CI's)
#   BAREVERBS_APPLIANCE_KERNEL=path    another appliance image (default: cargo's release build)
#   BAREVERBS_NVMF_TIMEOUT=600         seconds for the whole lab
#
# 1. `nvmf config-refused`: the appliance booted with bad command lines (an unknown word, a
#    subsystem NQN declared twice, a namespace on a disk the machine does not have, RAM
#    namespaces larger than its memory): each must stop with QEMU's FAIL status and a console
#    line naming the word, without listening.
# 2. `nvmf config`: the appliance (10.0.0.2) declares two subsystems with three namespaces and
#    different allow lists (below); one Linux guest (10.0.0.1, rdma_rxe, nvme-cli) acts as two
#    hosts by their host NQNs (qemu/roce/nvmf-config-linux.sh): each host's discovery log lists
#    just the subsystem that lets it in, each namespace has its declared size and holds what was
#    written to it (and not what was written to another), the other subsystem refuses the
#    host. After power-off this host finds what Linux wrote to the disk namespace in the image.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
lab_dir=$repo/qemu/lab
cache=${BAREVERBS_LAB_CACHE:-$lab_dir/.cache}
mkdir -p "$cache"
t0=$(date +%s)
stage() { echo "[nvmf-config +$(( $(date +%s) - t0 ))s] $*"; }

# shellcheck source=qemu/lab/host.sh
source "$lab_dir/host.sh"
install_missing qemu-system-x86 busybox-static kmod rdma-core iproute2 cpio nvme-cli
# shellcheck source=qemu/lab/guest.sh
source "$lab_dir/guest.sh"

kernel=${BAREVERBS_APPLIANCE_KERNEL:-${CARGO_TARGET_DIR:-$repo/target}/release/bareverbs-appliance}
if [ -z "${BAREVERBS_APPLIANCE_KERNEL:-}" ]; then
  stage "building the appliance"
  (cd "$repo" && cargo build --release -p bareverbs-appliance 2>&1 | tail -1)
fi
port=$(( 20000 + ($$ + 11) % 20000 ))
seg="socket,mcast=230.0.0.1:$port,localaddr=127.0.0.1"
limit=${BAREVERBS_NVMF_TIMEOUT:-600}
qemu=${BAREVERBS_NVMF_QEMU:-${BAREVERBS_ROCE_QEMU:-}}
if [ -z "$qemu" ]; then
  qemu=$("$here/modern-qemu.sh") || { qemu=qemu-system-x86_64; stage "no modern QEMU to be had: the system's runs"; }
fi
accel=${BAREVERBS_NVMF_ACCEL:-tcg}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# The declared configuration (nvmf-config-linux.sh checks the same names and sizes).
one=nqn.2026-11.io.bareverbs:lab-one
two=nqn.2026-11.io.bareverbs:lab-two
host_a=nqn.2026-11.io.bareverbs:lab-a
host_b=nqn.2026-11.io.bareverbs:lab-b
disk_mib=24
config="bvnvmf=10.0.0.2/24 bvnvmf.subsys=$one bvnvmf.ns=ram:16M bvnvmf.ns=blk:0 bvnvmf.allow=$host_a bvnvmf.subsys=$two bvnvmf.ns=ram:8M bvnvmf.allow=$host_b"

# The appliance with COMMAND-LINE on DISK; its console to LOG, its input from a FIFO (`q`
# powers it off). Sets last_pid.
appliance() { # NAME LOG COMMAND-LINE DISK
  local in=$cache/nvmf-config-$1.in
  rm -f "$in"; mkfifo "$in"
  exec {fd}<>"$in"
  console_fd=$fd
  timeout "$limit" "$qemu" \
    -accel "$accel" -machine q35 -cpu max -m 512M -nodefaults -vga none -display none -no-reboot \
    -chardev "pipe,id=c0,path=$cache/nvmf-config-$1" -serial chardev:c0 \
    -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
    -netdev "$seg,id=nu" -device virtio-net-pci,netdev=nu,addr=0x3.0,mac=52:54:00:00:00:02,romfile= \
    -drive "file=$4,if=none,id=d0,format=raw" -device virtio-blk-pci,drive=d0,addr=0x4.0 \
    -kernel "$kernel" -append "$3" > "$cache/nvmf-config-$1.qemu" 2>&1 &
  pids+=($!)
  last_pid=$!
}
# QEMU's -chardev pipe reads PATH.in and writes PATH.out: the console's output goes to LOG.
console_reader() { # NAME LOG
  local out=$cache/nvmf-config-$1.out
  rm -f "$out"; mkfifo "$out"
  cat "$out" > "$2" &
  pids+=($!)
}

# --- 1. bad configurations, refused before anything is served -------------------------------
img=$cache/nvmf-config-disk.img
rm -f "$img"; truncate -s "${disk_mib}M" "$img"
bad=(
  "unknown word|bvnvmf.namespace=ram:1M|bvnvmf=10.0.0.2/24 bvnvmf.subsys=$one bvnvmf.namespace=ram:1M"
  "duplicate NQN|bvnvmf.subsys=$one|bvnvmf=10.0.0.2/24 bvnvmf.subsys=$one bvnvmf.ns=ram:1M bvnvmf.subsys=$one bvnvmf.ns=ram:1M"
  "missing disk|bvnvmf.ns=blk:1|bvnvmf=10.0.0.2/24 bvnvmf.subsys=$one bvnvmf.ns=blk:1"
  "RAM beyond memory|bvnvmf.ns=ram:1G|bvnvmf=10.0.0.2/24 bvnvmf.subsys=$one bvnvmf.ns=ram:1G"
)
refused=() failed=()
k=0
for b in "${bad[@]}"; do
  IFS='|' read -r what word line <<<"$b"
  k=$((k + 1))
  log=$cache/nvmf-config-bad-$k.log
  console_reader "bad-$k" "$log"
  appliance "bad-$k" "$log" "$line" "$img"
  st=0
  wait "$last_pid" || st=$?
  sleep 0.5
  said=$({ grep -a "config refused" "$log" || true; } | head -1 | tr -d '\r')
  if [ "$st" = 35 ] && [[ "$said" == *"\`$word\`"* ]] && ! grep -a -q "nvmf: target on" "$log"; then
    refused+=("$what: '${said#*config refused: }'")
  else
    failed+=("$what: QEMU status $st (35 wanted), console: '$(tail -1 "$log" 2>/dev/null | tr -d '\r')'")
  fi
done
if [ ${#failed[@]} = 0 ]; then
  r1="PASS (${#refused[@]} bad command lines stopped before serving, QEMU status 35, each naming its word: $(IFS=';'; echo "${refused[*]}" | sed 's/;/; /g'))"
else
  r1="FAIL ($(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g'))"
fi
echo "nvmf config-refused: $r1"
stage "bad configurations done"

# --- 2. the declared configuration, against Linux ----------------------------------------------
rm -f "$img"; truncate -s "${disk_mib}M" "$img"
ulog=$cache/nvmf-config-appliance.log alog=$cache/nvmf-config-linux.log
stage "booting the appliance (10.0.0.2): $config"
console_reader appliance "$ulog"
appliance appliance "$ulog" "$config" "$img"
uk_pid=$last_pid uk_fd=$console_fd
stage "booting Linux (10.0.0.1), ${accel^^}, on mcast group port $port"
timeout "$limit" "$qemu" \
  -accel "$accel" -machine q35 -cpu max -smp 1 -m 1024 -nographic -no-reboot \
  -kernel "$cache/kroot/boot/vmlinuz-$kver" -initrd "$cache/initramfs.cpio.gz" \
  -append "console=ttyS0 panic=-1 quiet bvlab.kroot=$cache/kroot bvlab.inner=$here/nvmf-config-linux.sh bvcfg.disk=$disk_mib" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -netdev "$seg,id=n0" -device virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01,romfile=,rx_queue_size=1024 \
  < /dev/null > "$alog" 2>&1 &
a_pid=$!
pids+=("$a_pid")
wait "$a_pid" || true
stage "Linux done; powering the appliance off"
printf 'q\n' >&"$uk_fd" || true
uk_status=none
for _ in $(seq 1 60); do kill -0 "$uk_pid" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$uk_pid" 2>/dev/null; then kill "$uk_pid" 2>/dev/null || true; else wait "$uk_pid" && uk_status=0 || uk_status=$?; fi
sleep 0.5
cleanup

res=$({ grep -a "^nvmf-config-result: " "$alog" || true; } | tail -1 | sed 's/^nvmf-config-result: //' | tr -d '\r')
# What Linux wrote on the disk namespace (lab-one's namespace 2): 1 MiB of the pattern
# "lab-one ns2 block N" padded with dots to 512 bytes, from sector 2048.
pattern() { awk -v tag="$1" -v first="$2" -v n="$3" 'BEGIN { for (s = first; s < first + n; s++) { l = sprintf("%s block %08d\n", tag, s); printf "%s", l; for (i = length(l); i < 512; i++) printf "." } }'; }
if [[ "$res" != PASS* ]]; then
  r2="FAIL (${res:-no result from Linux}; the appliance said: $(grep -a -E 'nvmf: |FAIL' "$ulog" | tail -3 | tr -d '\r' | tr '\n' ' '))"
elif [ "$uk_status" != 33 ]; then
  r2="FAIL (the appliance's QEMU status $uk_status after q, 33 wanted)"
elif ! cmp -s <(dd if="$img" bs=512 skip=2048 count=2048 2>/dev/null) <(pattern "lab-one ns2" 2048 2048); then
  r2="FAIL (the disk image does not hold what Linux wrote to $one's namespace 2)"
else
  r2="PASS (${res#PASS (}"
  r2="${r2%)}; after power-off this host found namespace 2's blocks in the disk image)"
fi
echo "nvmf config: $r2"
stage "done"
[[ "$r1" == PASS* ]] && [[ "$r2" == PASS* ]]
