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
# Peer mode's IPv4 addresses on eth0: the Linux programs' and the unikernel's.
linux_ip=10.0.2.15
peer_ip=10.0.2.16
here=$(dirname "$0")

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
  # Peer mode: Debian's unmodified ibv_*_pingpong on rxe0 talk to the unikernel. Both sides'
  # GIDs are IPv4-mapped: the Linux programs' address, and the unikernel's (which must sit in
  # rxe0's table at index >= 1 too, as every GID the guest binds).
  ip addr add "$linux_ip/24" dev eth0
  ip addr add "$peer_ip/24" dev eth0
  gid_of() { # sysfs text of ::ffff:A.B.C.D
    printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' $(tr . ' ' <<<"$1")
  }
  linux_gid=
  for i in $(seq 1 50); do
    for n in $(seq 0 15); do
      [ "$(cat /sys/class/infiniband/rxe0/ports/1/gids/$n 2>/dev/null)" = "$(gid_of "$linux_ip")" ] || continue
      [ "$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$n 2>/dev/null)" = "RoCE v2" ] && linux_gid=$n
    done
    [ -n "$linux_gid" ] && (cd /sys/class/infiniband/rxe0/ports/1/gids && cat $(seq 0 15)) 2>/dev/null |
      grep -q "$(gid_of "$peer_ip")" && break
    sleep 0.2
  done
  [ -n "$linux_gid" ] || { echo "bvlab: no RoCE v2 GID for $linux_ip on rxe0"; exit 1; }
  stage "IPv4 GIDs: $linux_ip (Linux programs) at rxe0 index $linux_gid; $peer_ip (unikernel)"
  for g in 2 3 4 5; do echo "  GID[$g] $(cat /sys/class/infiniband/rxe0/ports/1/gids/$g 2>/dev/null)"; done
  stage "inner QEMU: vmxnet3 + pvrdma (ibdev rxe0) + the bareverbs unikernel, console bridged"
  sock=/run/bv-console.sock
  rm -f "$sock"
  # bvirq: the demo's waits halt the CPU until the device's MSI-X interrupt (peer mode polls).
  guest=(-m 256M -kernel "$kernel" -append "bvpeer=$peer_ip bvirq"
         -chardev "socket,id=con,path=$sock,server=on" -serial chardev:con)
  mem=256M
else
  stage "inner QEMU: vmxnet3 + pvrdma (ibdev rxe0) + Linux with vmw_pvrdma (reference)"
  guest=(-m 512M -kernel "$kernel" -initrd "$initrd" -append "console=ttyS0 panic=-1 quiet"
         -serial stdio)
  mem=512M
fi
timeout 900 qemu-system-x86_64 \
  -machine q35 -nodefaults -vga none -display none -no-reboot \
  -object memory-backend-ram,id=mb1,size=$mem,share=on -numa node,memdev=mb1 \
  -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
  -netdev user,id=n1,restrict=on \
  -device vmxnet3,netdev=n1,addr=0x10.0,multifunction=on,mac=$inner_mac,romfile= \
  -chardev socket,path=/var/run/rdmacm-mux-rxe0-1,id=mads \
  -device pvrdma,addr=0x10.1,ibdev=rxe0,netdev=eth0,mad-chardev=mads \
  "${guest[@]}" 2> /run/inner-qemu.err &
qemu=$!
if [ "$initrd" = none ]; then
  # QEMU waits for the bridge (server=on) before it runs the guest: no output is lost.
  cases=()
  while IFS= read -r l; do
    case "$l" in '' | '#'*) ;; *) cases+=("$l") ;; esac
  done < "$here/peer-cases"
  /usr/bin/python3 "$here/bridge.py" "$sock" "$linux_gid" "${cases[@]}"
fi
wait $qemu
status=$?
stage "inner QEMU exited"
# QEMU's messages, repeats counted: it logs "rdma: CQ is full" for every CQE once the
# CQ-notification ring (1024 entries), which a polling driver never drains, is full.
uniq -c /run/inner-qemu.err | while read -r n l; do echo "bvlab: inner QEMU stderr (${n}x): $l"; done
echo "bvlab: inner status $status"
