#!/bin/bash
# Runs inside the outer guest (chrooted into this machine's root): rxe on eth0, the MAD
# multiplexer, and the inner QEMU with QEMU's real pvrdma and the bareverbs unikernel.
#   inner.sh KROOT RDMACM_MUX KERNEL INITRD     (INITRD "none": the unikernel)
set -u
kroot=$1 mux=$2 kernel=$3 initrd=${4:-none}
t0=$(date +%s)
stage() { echo "bvlab +$(( $(date +%s) - t0 ))s: $*"; }
# The inner vmxnet3's MAC: its link-local GID must sit in rxe's table at index >= 1 (QEMU
# treats backend index 0 as a failure), so it is added to eth0 next to eth0's own.
inner_mac=52:54:00:12:34:57
inner_ll=fe80::5054:ff:fe12:3457

stage "loading rdma_rxe, ib_uverbs, ib_umad"
for m in rdma_rxe ib_uverbs ib_umad; do
  modprobe -d "$kroot" "$m" || { echo "bvlab: modprobe $m failed"; exit 1; }
done
ip link set lo up
ip link set eth0 up
rdma link add rxe0 type rxe netdev eth0 || { echo "bvlab: rdma link add failed"; exit 1; }
ip -6 addr add "$inner_ll/64" dev eth0 nodad
for i in $(seq 1 50); do
  grep -q "fe80:0000:0000:0000:5054:00ff:fe12:3457" /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null && break
  sleep 0.2
done
stage "rxe0 up; GIDs:"
for g in 0 1 2 3; do echo "  GID[$g] $(cat /sys/class/infiniband/rxe0/ports/1/gids/$g 2>/dev/null)"; done

stage "starting rdmacm-mux"
"$mux" -d rxe0 -p 1 &
for i in $(seq 1 50); do [ -S /var/run/rdmacm-mux-rxe0-1 ] && break; sleep 0.2; done
[ -S /var/run/rdmacm-mux-rxe0-1 ] || { echo "bvlab: rdmacm-mux did not start"; exit 1; }

if [ "$initrd" = none ]; then
  stage "inner QEMU: vmxnet3 + pvrdma (ibdev rxe0) + the bareverbs unikernel"
  guest=(-m 256M -kernel "$kernel")
  mem=256M
else
  stage "inner QEMU: vmxnet3 + pvrdma (ibdev rxe0) + Linux with vmw_pvrdma (reference)"
  guest=(-m 512M -kernel "$kernel" -initrd "$initrd" -append "console=ttyS0 panic=-1 quiet")
  mem=512M
fi
timeout 900 qemu-system-x86_64 \
  -machine q35 -nodefaults -vga none -display none -no-reboot -serial stdio \
  -object memory-backend-ram,id=mb1,size=$mem,share=on -numa node,memdev=mb1 \
  -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
  -netdev user,id=n1,restrict=on \
  -device vmxnet3,netdev=n1,addr=0x10.0,multifunction=on,mac=$inner_mac,romfile= \
  -chardev socket,path=/var/run/rdmacm-mux-rxe0-1,id=mads \
  -device pvrdma,addr=0x10.1,ibdev=rxe0,netdev=eth0,mad-chardev=mads \
  "${guest[@]}"
status=$?
stage "inner QEMU exited"
echo "bvlab: inner status $status"
