#!/usr/bin/env bash
# The RoCE lab: the bareverbs unikernel's software RoCEv2 against Linux's rdma_rxe, with
# Debian's unmodified ibverbs-utils and perftest programs, on one virtual Ethernet segment
# (QEMU's socket netdev on a multicast group of this host's loopback: no nesting, no bridge,
# no root network setup; it runs on any QEMU).
#
#   qemu/roce/lab.sh                 baseline (Linux A <-> Linux B), then Linux A <-> unikernel
#   qemu/roce/lab.sh --linux-only    the baseline alone
#   BAREVERBS_ROCE_ONLY=read,write   only these cases (a debugging aid)
#   BAREVERBS_ROCE_ACCEL=tcg|kvm     the accelerator (default: KVM if QEMU can use it, else TCG)
#
# Linux A (10.0.0.1) runs every case of qemu/roce/cases twice: against Linux B (10.0.0.3) and
# against the unikernel (10.0.0.2, booted once A's baseline is over). Both Linux guests are
# Debian's kernel over this machine's root (qemu/lab/guest.sh). Prints a line per case and
# `roce throughput: unikernel X linux Y ratio r` (ib_read_bw's average, A as the client), the
# time of each stage, and the verdict; the exit status is 0 only if every case passed. With
# BAREVERBS_ROCE_PCAP=1 the unikernel's frames are recorded in $cache/roce.pcap (QEMU's
# filter-dump; tests/data/rxe/ holds a cut of such a recording).
set -euo pipefail
mode=full
[ "${1:-}" = "--linux-only" ] && mode=linux
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
lab_dir=$repo/qemu/lab
cache=${BAREVERBS_LAB_CACHE:-$lab_dir/.cache}
mkdir -p "$cache"
t0=$(date +%s)
stage() { echo "[roce +$(( $(date +%s) - t0 ))s] $*"; }

need=()
for p in qemu-system-x86 busybox-static kmod rdma-core iproute2 cpio ibverbs-utils perftest; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  stage "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# shellcheck source=qemu/lab/guest.sh
source "$lab_dir/guest.sh"
if [ "$mode" = full ]; then
  stage "building the unikernel"
  (cd "$repo" && cargo build --release -p bareverbs-unikernel 2>&1 | tail -1)
fi

only=${BAREVERBS_ROCE_ONLY:-}
only_re=${only//,/|}
# The segment: a multicast group on loopback, a fresh port per run.
port=$(( 20000 + $$ % 20000 ))
seg="socket,mcast=230.0.0.1:$port,localaddr=127.0.0.1"
limit=${BAREVERBS_ROCE_TIMEOUT:-1500}
# KVM when it runs these guests, else TCG (BAREVERBS_ROCE_ACCEL=tcg|kvm forces one). Opening
# /dev/kvm is not enough: PVM's kvm (module kvm_pvm) opens fine but runs only PVM-aware guests
# (Debian's kernel hangs in early boot, the unikernel dies in its first SSE instruction). So
# the probe boots Debian's kernel with no root: under a working KVM it panics within seconds.
kvm_usable() { # sets why on failure
  local out
  [ -c /dev/kvm ] || { why="no /dev/kvm"; return 1; }
  [ -d /sys/module/kvm_pvm ] && { why="/dev/kvm is kvm_pvm's, which runs only PVM-aware guests"; return 1; }
  out=$(timeout 15 qemu-system-x86_64 -accel kvm -machine q35 -cpu max -m 256 -nodefaults \
          -display none -serial stdio -no-reboot -kernel "$cache/kroot/boot/vmlinuz-$kver" \
          -append "console=ttyS0 panic=-1 loglevel=1" 2>&1)
  grep -q "Kernel panic" <<<"$out" && return 0
  why="Debian's kernel did not boot to its no-root panic under it in 15 s ($(tail -1 <<<"$out" | tr -d '\r' | cut -c1-100))"
  return 1
}
accel=${BAREVERBS_ROCE_ACCEL:-}
if [ -z "$accel" ]; then
  why=
  if kvm_usable; then accel=kvm; else accel=tcg; stage "TCG: KVM is not usable here: $why"; fi
fi
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
linux() { # NAME ROLE IP MAC
  local log="$cache/roce-linux-$1.log"
  : > "$log"
  timeout "$limit" qemu-system-x86_64 \
    -accel "$accel" -machine q35 -cpu max -smp 1 -m 1024 -nographic -no-reboot \
    -kernel "$cache/kroot/boot/vmlinuz-$kver" -initrd "$cache/initramfs.cpio.gz" \
    -append "console=ttyS0 panic=-1 quiet bvlab.kroot=$cache/kroot bvlab.inner=$here/linux.sh bvroce.role=$2 bvroce.ip=$3 bvroce.only=${only:-}" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -netdev "$seg,id=n0" -device virtio-net-pci,netdev=n0,mac="$4" \
    > "$log" 2>&1 &
  pids+=($!)
}

stage "booting Linux A (10.0.0.1) and Linux B (10.0.0.3), ${accel^^}, on mcast group port $port"
linux a a 10.0.0.1 52:54:00:00:00:01
a_pid=${pids[0]}
linux b b 10.0.0.3 52:54:00:00:00:03
alog=$cache/roce-linux-a.log
uk_pid=
while kill -0 "$a_pid" 2>/dev/null; do
  if [ -z "$uk_pid" ] && grep -a -q "phase unikernel" "$alog"; then
    stage "baseline over"
    [ "$mode" = linux ] && break
    cases=$(grep -v -E '^(#|$)' "$here/cases" | grep -E "^(${only_re:-.*}) " | sed 's/ *$//; s/ \+/,/g' | paste -sd+)
    stage "booting the unikernel (10.0.0.2)"
    dump=()
    [ -n "${BAREVERBS_ROCE_PCAP:-}" ] && dump=(-object "filter-dump,id=dump0,netdev=nu,file=$cache/roce.pcap")
    timeout "$limit" qemu-system-x86_64 \
      -accel "$accel" -machine q35 -m 256M -nodefaults -vga none -display none -no-reboot \
      -serial "file:$cache/roce-unikernel.log" -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
      -netdev "$seg,id=nu" -device virtio-net-pci,netdev=nu,addr=0x3.0,mac=52:54:00:00:00:02,romfile= \
      "${dump[@]}" \
      -kernel "$repo/target/release/bareverbs-unikernel" \
      -append "bvroce=10.0.0.2/24 bvroce.peer=10.0.0.1 bvroce.cases=$cases" \
      > "$cache/roce-unikernel.qemu" 2>&1 &
    uk_pid=$!
    pids+=("$uk_pid")
  fi
  sleep 1
done
stage "Linux A done"
[ -n "$uk_pid" ] && { wait "$uk_pid" 2>/dev/null || true; }
cleanup

# --- the verdict -------------------------------------------------------------------------------
fail=0
result() { grep -a "^bvroce-result $1: " "$alog" | tail -1 | sed "s/^bvroce-result $1: //" | tr -d '\r'; }
bw() { sed -n 's/.*BW-average-MB\/s \([0-9.]*\).*/\1/p' <<<"$1"; }
names=$(grep -v -E '^(#|$)' "$here/cases" | awk '{print $1}' | grep -x -E "${only_re:-.*}")
for n in $names; do
  r=$(result "linux-linux $n")
  case "$r" in "exit 0"*) echo "linux-linux $n: PASS ${r#exit 0 | }" ;;
    *) echo "linux-linux $n: FAIL (${r:-no result})"; fail=1 ;; esac
done
lin_bw=$(bw "$(result "linux-linux read")")
if [ "$mode" = full ]; then
  ulog=$cache/roce-unikernel.log
  for n in $names; do
    r=$(result "roce $n")
    u=$(grep -a "^roce-uk $n: " "$ulog" 2>/dev/null | head -1 | sed "s/^roce-uk $n: //" | tr -d '\r')
    if [[ "$r" == "exit 0"* ]] && [[ "$u" == "ok "* ]]; then
      echo "roce $n: PASS (linux: ${r#exit 0 | }; unikernel: ${u#ok })"
    else
      echo "roce $n: FAIL (linux: ${r:-no result}; unikernel: ${u:-no result})"; fail=1
    fi
  done
  uk_bw=$(bw "$(result "roce read")")
  if [ -n "$uk_bw" ] && [ -n "$lin_bw" ]; then
    echo "roce throughput: unikernel $uk_bw linux $lin_bw ratio $(awk -v u="$uk_bw" -v l="$lin_bw" 'BEGIN {printf "%.2f", (l > 0 ? u / l : 0)}')"
  else
    echo "roce throughput: unikernel ${uk_bw:--} linux ${lin_bw:--} ratio -"
  fi
  grep -a -q "bareverbs: PASS" "$ulog" 2>/dev/null || { echo "[roce] the unikernel did not pass:"; tail -5 "$ulog" 2>/dev/null | sed 's/^/  /'; fail=1; }
fi
if [ "$fail" = 1 ]; then
  echo "[roce] Linux A's log ends:"; tail -15 "$alog" | sed 's/^/  /'
fi
stage "done"
if [ "$fail" = 0 ]; then echo "[roce] verdict: PASS"; exit 0; fi
echo "[roce] verdict: FAIL"; exit 1
