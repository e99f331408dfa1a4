#!/usr/bin/env bash
# The nested lab: QEMU's real pvrdma device, with the bareverbs unikernel as its guest.
#
#   qemu/lab/lab.sh              build what is missing (cached), boot, print the verdict
#   qemu/lab/lab.sh --reference  the same device with Linux's own vmw_pvrdma driver as the inner
#                                guest (built out of tree from Debian's linux-source), printing
#                                what it reports in the unikernel's format (see compare.sh)
#
# QEMU 7.2's pvrdma realizes only over a host RDMA device, which this machine's kernel lacks.
# So an outer QEMU (TCG) boots Debian's own kernel with a busybox initramfs that mounts this
# machine's root read-only over 9p and chroots into it; there qemu/lab/inner.sh loads rdma_rxe
# on the outer eth0, starts QEMU's rdmacm-mux (built from Debian's qemu source package), and runs
# the inner QEMU with vmxnet3 + pvrdma and our kernel. Every stage is timed; the exit status is
# the kernel's verdict (0 PASS). Anything that cannot be built fails loudly.
set -euo pipefail
mode=unikernel
[ "${1:-}" = "--reference" ] && mode=reference
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${BAREVERBS_LAB_CACHE:-$here/.cache}
mkdir -p "$cache"
t0=$(date +%s)
stage() { echo "[lab +$(( $(date +%s) - t0 ))s] $*"; }

# --- host packages -------------------------------------------------------------------------
# shellcheck source=qemu/lab/host.sh
source "$here/host.sh"
install_missing qemu-system-x86 busybox-static kmod libibumad-dev libibverbs-dev libglib2.0-dev \
  rdma-core iproute2 pkg-config cpio ibverbs-utils python3

# --- the outer guest: Debian's kernel and the 9p initramfs (qemu/lab/guest.sh) -------------
lab_dir=$here
# shellcheck source=qemu/lab/guest.sh
source "$here/guest.sh"

# --- rdmacm-mux, from Debian's qemu 7.2 source package ----------------------------------------
if [ ! -x "$cache/rdmacm-mux" ]; then
  stage "building rdmacm-mux from Debian's qemu source package"
  src=/etc/apt/sources.list.d/bareverbs-lab-src.sources
  if ! apt-cache showsrc qemu >/dev/null 2>&1 || [ -z "$(apt-cache showsrc qemu 2>/dev/null)" ]; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$src"
    apt-get update -qq
  fi
  work="$cache/qemu-src"
  rm -rf "$work" && mkdir -p "$work/shim/qemu"
  (cd "$work" && apt-get source --download-only qemu >/dev/null)
  tar -C "$work" -xJf "$work"/qemu_*.orig.tar.xz --wildcards '*/contrib/rdmacm-mux/*'
  mux=$(dirname "$(find "$work" -path '*contrib/rdmacm-mux/main.c')")
  # QEMU's osdep.h only gathers system headers and a few macros for this tool.
  cat > "$work/shim/qemu/osdep.h" <<'H'
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdbool.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <fcntl.h>
#include <getopt.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <glib.h>
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
H
  gcc -O2 -w -I"$work/shim" -I"$mux" -o "$cache/rdmacm-mux" "$mux/main.c" \
    $(pkg-config --cflags --libs glib-2.0) -libumad -libverbs -lpthread
  rm -rf "$work"
fi

# --- the inner guest: the unikernel, or Linux with its own vmw_pvrdma (--reference) -----------
if [ "$mode" = unikernel ]; then
  stage "building the unikernel"
  (cd "$repo" && cargo build --release -p bareverbs-lab-peers 2>&1 | tail -1)
  inner_kernel="$repo/target/release/bareverbs-lab-peers"
  inner_initrd=none
else
  if [ ! -f "$cache/vmw_pvrdma.ko" ]; then
    stage "building Linux's vmw_pvrdma out of tree (Debian's config leaves it off)"
    for p in "linux-headers-$kver" linux-source-6.1; do
      dpkg -s "$p" >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$p" >/dev/null
    done
    work="$cache/pvrdma-src"
    rm -rf "$work" && mkdir -p "$work"
    tar -C "$work" -xJf /usr/src/linux-source-6.1.tar.xz --wildcards '*/drivers/infiniband/hw/vmw_pvrdma/*'
    dir=$(dirname "$(find "$work" -name pvrdma_main.c)")
    make -s -C "/usr/src/linux-headers-$kver" M="$dir" CONFIG_INFINIBAND_VMWARE_PVRDMA=m modules >/dev/null 2>&1
    cp "$dir/vmw_pvrdma.ko" "$cache/vmw_pvrdma.ko"
    rm -rf "$work"
  fi
  if [ ! -x "$cache/refqp" ] || [ "$here/refqp.c" -nt "$cache/refqp" ]; then
    stage "building refqp (libibverbs)"
    gcc -O2 -Wall -o "$cache/refqp" "$here/refqp.c" -libverbs
  fi
  if [ ! -f "$cache/ref-initramfs.cpio.gz" ] || [ "$here/ref-init.sh" -nt "$cache/ref-initramfs.cpio.gz" ]; then
    stage "building the reference guest's initramfs"
    ir="$cache/ref-initramfs"
    rm -rf "$ir" && mkdir -p "$ir"/{bin,proc,sys,dev,modules,etc/libibverbs.d,lib64,usr/lib/x86_64-linux-gnu/libibverbs}
    cp /bin/busybox "$ir/bin/busybox"
    order=()
    for m in kernel/drivers/net/vmxnet3/vmxnet3.ko kernel/drivers/infiniband/core/ib_uverbs.ko; do add "$m"; done
    for m in "${order[@]}"; do cp "$kmods/$m" "$ir/modules/"; basename "$m" >> "$ir/modules/order"; done
    cp "$cache/vmw_pvrdma.ko" "$ir/modules/"
    echo vmw_pvrdma.ko >> "$ir/modules/order"
    cp "$cache/refqp" "$ir/bin/refqp"
    prov=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/libvmw_pvrdma-rdmav*.so)
    cp "$prov" "$ir/usr/lib/x86_64-linux-gnu/libibverbs/"
    cp /etc/libibverbs.d/vmw_pvrdma.driver "$ir/etc/libibverbs.d/" 2>/dev/null || true
    for lib in $( (ldd "$cache/refqp"; ldd "$prov") | awk '/=> \// {print $3} /ld-linux/ {print $1}' | sort -u); do
      mkdir -p "$ir$(dirname "$lib")"
      cp -L "$lib" "$ir$lib"
    done
    cp "$here/ref-init.sh" "$ir/init"
    chmod +x "$ir/init"
    (cd "$ir" && find . | cpio -o -H newc 2>/dev/null | gzip -1) > "$cache/ref-initramfs.tmp"
    mv "$cache/ref-initramfs.tmp" "$cache/ref-initramfs.cpio.gz"
  fi
  inner_kernel="$cache/kroot/boot/vmlinuz-$kver"
  inner_initrd="$cache/ref-initramfs.cpio.gz"
fi

# --- boot ---------------------------------------------------------------------------------------
stage "booting the outer guest (TCG)"
log="$cache/$mode.log"
set +e
timeout "${BAREVERBS_LAB_TIMEOUT:-900}" qemu-system-x86_64 \
  -machine q35 -cpu max -smp 2 -m 2048 -nographic -no-reboot \
  -kernel "$cache/kroot/boot/vmlinuz-$kver" -initrd "$cache/initramfs.cpio.gz" \
  -append "console=ttyS0 panic=-1 quiet bvlab.kver=$kver bvlab.kroot=$cache/kroot bvlab.inner=$here/inner.sh bvlab.mux=$cache/rdmacm-mux bvlab.kernel=$inner_kernel bvlab.initrd=$inner_initrd" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -netdev user,id=n0 -device virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56 \
  2>&1 | tee "$log"
set -e
stage "done"
if [ "$mode" = reference ]; then
  grep -a -q "reference: done" "$log" || { echo "[lab] reference: FAIL (Linux's driver did not report)"; exit 1; }
  echo "[lab] reference: done (the report is in $log)"
  exit 0
fi
verdict=$(grep -a -o 'bvlab: inner status [0-9]*' "$log" | tail -1 | awk '{print $4}')
# The caps the unikernel read must be the device's: QEMU's defaults clamped by rxe, as
# docs/pvrdma.md §3.1 derives them (and as Linux's own driver reads them: compare.sh).
expected=(
  "caps: max_qp 1024 max_qp_wr 10467 max_sge 4 max_cq 2048 max_cqe 28672 max_mr 1024 max_pd 1024"
  "caps: max_srq 512 max_srq_wr 12288 max_srq_sge 4 max_ah 64 gid_tbl_len 255 max_pkeys 1 ports 1"
)
if [ "$verdict" = 33 ]; then
  for line in "${expected[@]}"; do
    grep -a -q -F "$line" "$log" || { echo "[lab] verdict: FAIL (caps differ from the device's: want '$line')"; exit 1; }
  done
fi
# Interrupts (the kernel runs with `bvirq`): the demo's waits halted the CPU until QEMU's CQ
# interrupt, none ended by the timer's rescue, and the interrupt entry counted CQ vectors.
irq_fail=
if [ "$verdict" = 33 ]; then
  irq_line=$(grep -a -o 'interrupts: command [0-9]*, async [0-9]*, cq [0-9]*' "$log" | tail -1)
  wait_line=$(grep -a -o 'waits: halted [0-9]*, spun [0-9]*' "$log" | tail -1)
  echo "[lab] $irq_line; $wait_line"
  cq=$(awk '{print $NF}' <<<"$irq_line")
  read -r halted spun < <(awk '{gsub(",", ""); print $3, $5}' <<<"$wait_line")
  if [ -z "$irq_line" ] || [ -z "$wait_line" ]; then
    irq_fail="the kernel printed no interrupt or wait counts"
  elif [ "$cq" -eq 0 ] || [ "$halted" -eq 0 ]; then
    irq_fail="no CQ interrupt ended a halt (cq $cq, halted $halted)"
  elif [ "$spun" -ne 0 ]; then
    irq_fail="$spun wait(s) ended without their interrupt"
  fi
fi
[ -z "$irq_fail" ] || { echo "[lab] verdict: FAIL (interrupts: $irq_fail)"; exit 1; }
# Peer mode: each case of peer-cases, in order, as the bridge judged it (the Linux program's
# exit code 0 and its own summary, the unikernel's checks of every message).
peer_fail=0
mapfile -t results < <(grep -a "^linux-peer " "$log" | tr -d '\r' || true)
i=0
while IFS= read -r spec; do
  case "$spec" in '' | '#'*) continue ;; esac
  name=${spec%% *}
  line=${results[$i]:-}
  i=$((i + 1))
  case "$line" in "linux-peer $name: "*) ;; *) line="linux-peer $name: FAIL (no result)" ;; esac
  echo "$line   [${spec#"$name"}]"
  case "$line" in *": PASS "*) ;; *) peer_fail=1 ;; esac
done < "$here/peer-cases"
if [ "$verdict" = 33 ] && [ "$peer_fail" = 1 ]; then
  echo "[lab] verdict: FAIL (a linux-peer case failed)"; exit 1
fi
case "$verdict" in
  33) echo "[lab] verdict: PASS (bareverbs on QEMU's real pvrdma; caps as the device reports; waits end by MSI-X interrupts; talks to Linux's ibverbs programs)"; exit 0 ;;
  35) echo "[lab] verdict: FAIL (the unikernel said so)"; exit 1 ;;
  37) echo "[lab] verdict: FAIL (the unikernel saw no PVRDMA: the device did not realize)"; exit 1 ;;
  "") echo "[lab] verdict: FAIL (no verdict: the lab did not get to run the unikernel)"; exit 1 ;;
  *) echo "[lab] verdict: FAIL (inner QEMU status $verdict)"; exit 1 ;;
esac
