#!/usr/bin/env bash
# Boots the bareverbs unikernel in plain QEMU (TCG) and turns its verdict into an exit status.
#
#   qemu/boot.sh KERNEL [--require-device] [extra QEMU arguments...]
#
# The machine: q35, 256 MiB, serial on stdout, isa-debug-exit, a vmxnet3 at 00:10.0 (the
# function a PVRDMA pairs with), and a virtio-net at 00:03.0 on its own user network. Plain
# QEMU cannot realize -device pvrdma without a host RDMA device (see qemu/lab/ for that), so
# here the kernel shows the PCI probe, ARPs for the gateway 10.0.2.2 through the virtio-net
# NIC (the link self-test), and then runs bareverbs' software RoCEv2 device over that NIC.
# Status: 0 for PASS (and for "no device" unless --require-device), 1 otherwise.
#
#   BAREVERBS_NIC=virtio|igb|e1000e   the NIC at 00:03.0 (default virtio-net); the kernel takes
#                                     the NIC the machine has (igb, then e1000e, then virtio-net)
#                                     and says which (`nic: igb 8086:10c9 at 00:03.0, ...`)
#   BAREVERBS_QEMU=path               another qemu-system-x86_64 (igb needs QEMU 8.0 or later:
#                                     qemu/roce/modern-qemu.sh provides one)
set -uo pipefail
kernel=$1; shift
require=0
if [ "${1:-}" = "--require-device" ]; then require=1; shift; fi
qemu=${BAREVERBS_QEMU:-qemu-system-x86_64}
if ! command -v "$qemu" >/dev/null; then
  echo "$qemu not found: apt-get install qemu-system-x86" >&2
  exit 1
fi
case "${BAREVERBS_NIC:-virtio}" in
  virtio) nic=virtio-net-pci ;;
  igb|e1000e) nic=$BAREVERBS_NIC ;;
  *) echo "BAREVERBS_NIC=$BAREVERBS_NIC: not virtio, igb or e1000e" >&2; exit 1 ;;
esac
if ! "$qemu" -device help 2>/dev/null | grep -q "\"$nic\""; then
  echo "$qemu has no -device $nic (igb needs QEMU 8.0 or later: BAREVERBS_QEMU=\$(qemu/roce/modern-qemu.sh))" >&2
  exit 1
fi
timeout 60 "$qemu" \
  -machine q35 -m 256M -nodefaults -vga none -display none -no-reboot -serial stdio \
  -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
  -netdev user,id=n0,restrict=on \
  -device vmxnet3,netdev=n0,addr=0x10.0,multifunction=on,mac=52:54:00:12:34:57,romfile= \
  -netdev user,id=n1,restrict=on \
  -device "$nic",netdev=n1,addr=0x3.0,mac=52:54:00:12:34:56,romfile= \
  -kernel "$kernel" "$@"
status=$?
case $status in
  33) echo "[boot.sh] verdict: PASS"; exit 0 ;;
  35) echo "[boot.sh] verdict: FAIL"; exit 1 ;;
  37) echo "[boot.sh] verdict: no PVRDMA device"; exit $((require)) ;;
  124) echo "[boot.sh] verdict: timed out after 60 s"; exit 1 ;;
  *) echo "[boot.sh] verdict: QEMU exited with $status (crash or triple fault)"; exit 1 ;;
esac
