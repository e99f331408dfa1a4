#!/usr/bin/env bash
# Boots the bareverbs storage appliance in plain QEMU: what `cargo appliance` runs (cargo's
# runner, qemu/runner.sh, calls this script with the kernel it built).
#
#   qemu/appliance.sh KERNEL [WORD...]
#
# Each WORD is added to the kernel command line (docs/appliance.md has them all), e.g.
# `cargo appliance -- bvnvmf.serve=10` serves for 10 s and then stops as on `q`.
#
# The disk: `appliance-disk.img` beside the kernel, i.e. under whichever target directory
# cargo built into (CARGO_TARGET_DIR or the workspace's), made when missing (64 MiB of zeros,
# BAREVERBS_APPLIANCE_DISK_MIB to change) and kept between runs; the appliance serves it as the
# virtio-blk subsystem's namespace, beside its RAM disk. BAREVERBS_APPLIANCE_DISK=path takes
# another image (raw).
#
# More devices: BAREVERBS_APPLIANCE_QEMU_ARGS is added to QEMU's arguments (split at spaces),
# e.g. an NVMe controller whose namespace `bvnvmf.ns=nvme:1` serves:
#   BAREVERBS_APPLIANCE_QEMU_ARGS="-drive file=nvme.img,if=none,id=nv0,format=raw
#     -device nvme,serial=bvnvme0,drive=nv0" cargo appliance -- bvnvmf.subsys=nqn.x:ssd bvnvmf.ns=nvme:1
#
# The network: a virtio-net NIC on QEMU's user network, isolated from the host's (restrict=on),
# at the appliance's default address 10.0.2.15. Linux hosts reach an appliance on a segment of
# their own: the NVMe-oF lab (qemu/roce/nvmf.sh) shows how.
#
# The console is this terminal: `s` prints the counters, `q` stops the appliance (it reports,
# flushes the disk and powers off); Ctrl-C ends QEMU at once.
# Status: 0 when the appliance powered off with PASS, 1 otherwise.
set -uo pipefail
kernel=$1; shift
[ "${1:-}" = "--" ] && shift
if ! command -v qemu-system-x86_64 >/dev/null; then
  echo "qemu-system-x86_64 not found: apt-get install qemu-system-x86" >&2
  exit 1
fi
disk=${BAREVERBS_APPLIANCE_DISK:-$(dirname "$kernel")/appliance-disk.img}
if [ ! -e "$disk" ]; then
  truncate -s "${BAREVERBS_APPLIANCE_DISK_MIB:-64}M" "$disk" || exit 1
  echo "[appliance.sh] made the disk image $disk"
fi
echo "[appliance.sh] disk $disk; console: s counters, q stop"
qemu-system-x86_64 \
  -machine q35 -m 512M -nodefaults -vga none -display none -no-reboot -serial stdio \
  -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
  -netdev user,id=n0,restrict=on \
  -device virtio-net-pci,netdev=n0,addr=0x3.0,mac=52:54:00:12:34:56,romfile= \
  -drive "file=$disk,if=none,id=d0,format=raw" -device virtio-blk-pci,drive=d0,addr=0x4.0 \
  ${BAREVERBS_APPLIANCE_QEMU_ARGS:-} \
  -kernel "$kernel" -append "$*"
status=$?
case $status in
  33) echo "[appliance.sh] verdict: PASS"; exit 0 ;;
  35) echo "[appliance.sh] verdict: FAIL"; exit 1 ;;
  *) echo "[appliance.sh] QEMU exited with $status"; exit 1 ;;
esac
