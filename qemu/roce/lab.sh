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
#   BAREVERBS_ROCE_QEMU=path         another qemu-system-x86_64 for all three guests (default: PATH's;
#                                    the README shows QEMU 10 from Debian's bookworm-backports)
#   BAREVERBS_ROCE_KERNEL=path       another unikernel image (default: cargo's release build)
#   BAREVERBS_ROCE_CASE_TIMEOUT=100  seconds a Linux program (with its retries) may take
#   BAREVERBS_ROCE_GRACE=15          seconds Linux A may go on after the unikernel exited
#   BAREVERBS_ROCE_TIMEOUT=1500      seconds for the whole lab
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

# shellcheck source=qemu/lab/host.sh
source "$lab_dir/host.sh"
install_missing qemu-system-x86 busybox-static kmod rdma-core iproute2 cpio ibverbs-utils perftest rdmacm-utils
# shellcheck source=qemu/lab/guest.sh
source "$lab_dir/guest.sh"
uk_kernel=${BAREVERBS_ROCE_KERNEL:-$repo/target/release/bareverbs-unikernel}
if [ "$mode" = full ] && [ -z "${BAREVERBS_ROCE_KERNEL:-}" ]; then
  stage "building the unikernel"
  (cd "$repo" && cargo build --release -p bareverbs-unikernel 2>&1 | tail -1)
fi

only=${BAREVERBS_ROCE_ONLY:-}
only_re=${only//,/|}
# The segment: a multicast group on loopback, a fresh port per run.
port=$(( 20000 + $$ % 20000 ))
seg="socket,mcast=230.0.0.1:$port,localaddr=127.0.0.1"
limit=${BAREVERBS_ROCE_TIMEOUT:-1500}
qemu=${BAREVERBS_ROCE_QEMU:-qemu-system-x86_64}
# KVM when it runs these guests, else TCG (BAREVERBS_ROCE_ACCEL=tcg|kvm forces one). Opening
# /dev/kvm is not enough: PVM's kvm (module kvm_pvm) opens fine but runs only PVM-aware guests
# (Debian's kernel hangs in early boot, the unikernel dies in its first SSE instruction). So
# the probe boots Debian's kernel with no root: under a working KVM it panics within seconds.
kvm_usable() { # sets why on failure
  local out
  [ -c /dev/kvm ] || { why="no /dev/kvm"; return 1; }
  [ -d /sys/module/kvm_pvm ] && { why="/dev/kvm is kvm_pvm's, which runs only PVM-aware guests"; return 1; }
  out=$(timeout 15 "$qemu" -accel kvm -machine q35 -cpu max -m 256 -nodefaults \
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
  timeout "$limit" "$qemu" \
    -accel "$accel" -machine q35 -cpu max -smp 1 -m 1024 -nographic -no-reboot \
    -kernel "$cache/kroot/boot/vmlinuz-$kver" -initrd "$cache/initramfs.cpio.gz" \
    -append "console=ttyS0 panic=-1 quiet bvlab.kroot=$cache/kroot bvlab.inner=$here/linux.sh bvroce.role=$2 bvroce.ip=$3 bvroce.only=${only:-} bvroce.timeout=${BAREVERBS_ROCE_CASE_TIMEOUT:-100}" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -netdev "$seg,id=n0" -device virtio-net-pci,netdev=n0,mac="$4",romfile= \
    > "$log" 2>&1 &
  pids+=($!)
}

alog=$cache/roce-linux-a.log blog=$cache/roce-linux-b.log ulog=$cache/roce-unikernel.log
# Nothing of an earlier run may be read as this one's: the unikernel's log stays empty
# unless it boots.
rm -f "$ulog" "$cache/roce-unikernel.qemu"
stage "booting Linux A (10.0.0.1) and Linux B (10.0.0.3), ${accel^^}, $("$qemu" --version | head -1), on mcast group port $port"
linux a a 10.0.0.1 52:54:00:00:00:01
a_pid=${pids[0]}
linux b b 10.0.0.3 52:54:00:00:00:03
b_pid=${pids[1]}
# Linux A runs both phases by itself; this loop boots the unikernel when A says its baseline
# is over, and stops waiting for a side whose peer is gone: a guest that stopped early leaves
# the cases it did not get to without a result (FAIL), instead of A's 100 s per case.
grace=${BAREVERBS_ROCE_GRACE:-15}
uk_pid='' uk_status='' uk_end='' b_end='' stopped=''
deadline=$(( t0 + limit ))
while kill -0 "$a_pid" 2>/dev/null; do
  now=$(date +%s)
  if [ "$now" -ge "$deadline" ]; then
    stopped="the lab's timeout (${limit} s)"; break
  fi
  if [ -z "$uk_pid" ] && grep -a -q "phase unikernel" "$alog"; then
    stage "baseline over"
    [ "$mode" = linux ] && break
    cases=$(grep -v -E '^(#|$)' "$here/cases" | grep -E "^(${only_re:-.*}) " | sed 's/ *$//; s/ \+/,/g' | paste -sd+)
    stage "booting the unikernel (10.0.0.2)"
    dump=()
    [ -n "${BAREVERBS_ROCE_PCAP:-}" ] && dump=(-object "filter-dump,id=dump0,netdev=nu,file=$cache/roce.pcap")
    : > "$ulog"
    # -cpu max, as the Linux guests: QEMU's default model (qemu64) has no PCLMULQDQ, and the
    # driver's ICRC folds with it wherever CPUID shows it (else slice-by-16, 6x the work).
    # TCG's max model has it (KVM's is the host's).
    timeout "$limit" "$qemu" \
      -accel "$accel" -machine q35 -cpu max -m 256M -nodefaults -vga none -display none -no-reboot \
      -serial "file:$ulog" -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
      -netdev "$seg,id=nu" -device virtio-net-pci,netdev=nu,addr=0x3.0,mac=52:54:00:00:00:02,romfile= \
      "${dump[@]}" \
      -kernel "$uk_kernel" \
      -append "bvroce=10.0.0.2/24 bvroce.peer=10.0.0.1 bvroce.cases=$cases" \
      > "$cache/roce-unikernel.qemu" 2>&1 &
    uk_pid=$!
    pids+=("$uk_pid")
  fi
  # Linux B gone while A is still in its baseline (B's side ends with "baseline side done").
  if [ -z "$uk_pid" ] && [ -z "$b_end" ] && ! kill -0 "$b_pid" 2>/dev/null; then
    b_end=$now
    grep -a -q "baseline side done" "$blog" || stage "Linux B stopped before its side of the baseline was over"
  fi
  if [ -z "$uk_pid" ] && [ -n "$b_end" ] && [ $(( now - b_end )) -ge "$grace" ] &&
     ! grep -a -q "phase unikernel" "$alog"; then
    stopped="Linux A still in the baseline ${grace} s after Linux B stopped"; break
  fi
  if [ -n "$uk_pid" ] && [ -z "$uk_end" ] && ! kill -0 "$uk_pid" 2>/dev/null; then
    uk_end=$now
    wait "$uk_pid" && uk_status=0 || uk_status=$?
    stage "the unikernel exited (status $uk_status: 33 PASS, 35 FAIL)"
  fi
  if [ -n "$uk_end" ] && [ $(( now - uk_end )) -ge "$grace" ]; then
    stopped="Linux A still running ${grace} s after the unikernel exited"; break
  fi
  sleep 0.5
done
if [ -n "$stopped" ]; then
  stage "stopping: $stopped"
else
  stage "Linux A done"
fi
# The unikernel may still be waiting for a peer that is gone: a grace period, then stop it.
if [ -n "$uk_pid" ] && [ -z "$uk_end" ]; then
  for _ in $(seq 1 $(( grace * 2 ))); do kill -0 "$uk_pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$uk_pid" 2>/dev/null; then
    stage "stopping the unikernel: still running ${grace} s after Linux A"
    kill "$uk_pid" 2>/dev/null || true
    wait "$uk_pid" || true
    uk_status="none: stopped by the lab"
  else
    wait "$uk_pid" && uk_status=0 || uk_status=$?
    stage "the unikernel exited (status $uk_status: 33 PASS, 35 FAIL)"
  fi
fi
cleanup

# --- the verdict -------------------------------------------------------------------------------
# (|| true: a missing line is a result too, not a reason for set -e to end the script.)
result() { { grep -a "^bvroce-result $1: " "$alog" || true; } | tail -1 | sed "s/^bvroce-result $1: //" | tr -d '\r'; }
bw() { sed -n 's/.*BW-average-MB\/s \([0-9.]*\).*/\1/p' <<<"$1"; }
tail_of() { echo "[roce] $1's log ($2) ends:"; tail -"${3:-15}" "$2" 2>/dev/null | tr -d '\r' | sed 's/^/  /'; }
names=$(grep -v -E '^(#|$)' "$here/cases" | awk '{print $1}' | grep -x -E "${only_re:-.*}")
total=$(wc -w <<<"$names")
why=()
[ -n "$stopped" ] && why+=("stopped: $stopped")
a_end="phase unikernel"
[ "$mode" = full ] && a_end="]: done"
[ -z "$stopped" ] && ! grep -a -q -F "$a_end" "$alog" && why+=("Linux A ended before its cases did")
ll_pass=0
for n in $names; do
  r=$(result "linux-linux $n")
  case "$r" in "exit 0"*) echo "linux-linux $n: PASS ${r#exit 0 | }"; ll_pass=$((ll_pass + 1)) ;;
    *) echo "linux-linux $n: FAIL (${r:-no result})" ;; esac
done
[ "$ll_pass" = "$total" ] || why+=("linux-linux $ll_pass/$total")
lin_bw=$(bw "$(result "linux-linux read")")
ratio=
# The rdma_cm programs' cases (connected through the CM, perftest's -R ones too) are counted
# apart: `cm <case>`.
is_cm() { [[ "$1" == rping-* || "$1" == ucmatose-* || "$1" == udaddy-* || "$1" == ib_*_bw-* ]]; }
cm_total=0
for n in $names; do is_cm "$n" && cm_total=$((cm_total + 1)); done
if [ "$mode" = full ]; then
  uk_pass=0 cm_pass=0
  for n in $names; do
    r=$(result "roce $n")
    u=$({ grep -a "^roce-uk $n: " "$ulog" 2>/dev/null || true; } | head -1 | sed "s/^roce-uk $n: //" | tr -d '\r')
    tag=roce
    is_cm "$n" && tag=cm
    if [[ "$r" == "exit 0"* ]] && [[ "$u" == "ok "* ]]; then
      if [ "$tag" = cm ]; then
        echo "cm $n: PASS (${u#ok }; linux: exit 0)"; cm_pass=$((cm_pass + 1))
      else
        echo "roce $n: PASS (linux: ${r#exit 0 | }; unikernel: ${u#ok })"; uk_pass=$((uk_pass + 1))
      fi
    else
      echo "$tag $n: FAIL (linux: ${r:-no result}; unikernel: ${u:-no result})"
    fi
  done
  [ "$uk_pass" = $((total - cm_total)) ] || why+=("roce $uk_pass/$((total - cm_total))")
  [ "$cm_pass" = "$cm_total" ] || why+=("cm $cm_pass/$cm_total")
  uk_bw=$(bw "$(result "roce read")")
  if [ -n "$uk_bw" ] && [ -n "$lin_bw" ]; then
    ratio=$(awk -v u="$uk_bw" -v l="$lin_bw" 'BEGIN {printf "%.2f", (l > 0 ? u / l : 0)}')
    echo "roce throughput: unikernel $uk_bw linux $lin_bw ratio $ratio"
  else
    echo "roce throughput: unikernel ${uk_bw:--} linux ${lin_bw:--} ratio -"
  fi
  if ! grep -a -q "bareverbs: PASS" "$ulog" 2>/dev/null; then
    why+=("the unikernel did not print bareverbs: PASS (QEMU status ${uk_status:-none})")
    tail_of "the unikernel" "$ulog" 10
    [ -s "$cache/roce-unikernel.qemu" ] && tail_of "the unikernel's QEMU" "$cache/roce-unikernel.qemu" 5
  fi
fi
if [ ${#why[@]} -gt 0 ]; then
  [ "$ll_pass" = "$total" ] || tail_of "Linux B" "$blog"
  tail_of "Linux A" "$alog"
fi
stage "done"
if [ ${#why[@]} -eq 0 ]; then
  if [ "$mode" = full ]; then
    echo "[roce] verdict: PASS (linux-linux $ll_pass/$total, roce $uk_pass/$((total - cm_total)), cm $cm_pass/$cm_total, read ratio ${ratio:--}, $accel)"
  else
    echo "[roce] verdict: PASS (linux-linux $ll_pass/$total, $accel)"
  fi
  exit 0
fi
msg=$(printf '%s; ' "${why[@]}")
echo "[roce] verdict: FAIL (${msg%; })"
exit 1
