#!/usr/bin/env bash
# The RoCE lab: the bareverbs unikernel's software RoCEv2 against Linux's rdma_rxe, with
# Debian's unmodified ibverbs-utils, perftest and qperf programs, on one virtual Ethernet segment
# (QEMU's socket netdev on a multicast group of this host's loopback: no nesting, no bridge,
# no root network setup; it runs on any QEMU).
#
#   qemu/roce/lab.sh                 baseline (Linux A <-> Linux B), then Linux A <-> unikernel
#   qemu/roce/lab.sh --linux-only    the baseline alone
#   qemu/roce/lab.sh --matrix        the whole matrix: qemu/roce/cases, then qemu/roce/cases-matrix
#                                    (the cases CI leaves out for time); with --linux-only too
#   BAREVERBS_ROCE_CASES=path        another case list (instead of qemu/roce/cases)
#   BAREVERBS_ROCE_ONLY=read,write   only these cases (a debugging aid)
#   BAREVERBS_ROCE_ACCEL=tcg|kvm     the accelerator (default: KVM if QEMU can use it, else TCG)
#   BAREVERBS_ROCE_QEMU=path         another qemu-system-x86_64 for all three guests (default: PATH's;
#                                    the README shows QEMU 10 from Debian's bookworm-backports)
#   BAREVERBS_ROCE_KERNEL=path       another unikernel image (default: cargo's release build)
#   BAREVERBS_ROCE_NIC=virtio        the unikernel's NIC: virtio (virtio-net), igb (an 82576: QEMU
#                                    8.0 or later) or e1000e (an 82574); the Linux guests keep
#                                    virtio-net. The unikernel takes the NIC it finds and says which.
#                                    qemu/roce/nics.sh runs the lab on each.
#   BAREVERBS_ROCE_CASE_TIMEOUT=100  seconds a Linux program (with its retries) may take
#   BAREVERBS_ROCE_GRACE=15          seconds Linux A may go on after the unikernel exited
#   BAREVERBS_ROCE_TIMEOUT=1500      seconds for the whole lab
#   BAREVERBS_ROCE_BENCH=3           throughput runs per side and case (0: none)
#   BAREVERBS_ROCE_PROFILE=read      the counted case whose window the unikernel's profile covers
#                                    (read|write|atomic; none: no profile)
#
# Linux A (10.0.0.1) runs every case of qemu/roce/cases twice: against Linux B (10.0.0.3) and
# against the unikernel (10.0.0.2, booted once A's baseline is over). Both Linux guests are
# Debian's kernel over this machine's root (qemu/lab/guest.sh). Prints a line per case, the
# time of each stage, and the verdict; the exit status is 0 only if every case passed. With
# BAREVERBS_ROCE_PCAP=1 the unikernel's frames are recorded in $cache/roce.pcap (QEMU's
# filter-dump; tests/data/rxe/ holds a cut of such a recording).
#
# Efficiency: in that run, Linux B and the unikernel run under TCG with a plugin that counts
# every instruction of their vCPU (qemu/roce/icount.c, built here against QEMU 10.0's
# qemu-plugin.h); each marks the window of a perftest case (qemu/roce/mark.c on Linux B, the
# unikernel's own marker), and `roce efficiency <case>: unikernel X linux Y ratio r` gives
# the window's instructions per payload byte for `read` and `write`, where both play the same
# role (the responder of the READs, the requester of the WRITEs).
# Profile: the plugin also records, over one case's window of the unikernel (`read` unless
# BAREVERBS_ROCE_PROFILE says otherwise), the instructions of each translated block; the lab
# maps the blocks to the unikernel's symbols (nm) and prints `roce profile <case>:` lines, the
# top 15 symbols and their share of the window.
# Throughput: a plugin slows its guest, so the throughput comes from other runs, after the
# cases, with a fresh Linux B and a fresh unikernel, both uncounted: Linux A runs `read` and
# `write` against Linux B and the unikernel in turn (A B A B ..., BAREVERBS_ROCE_BENCH each),
# and `roce throughput <case>: unikernel X linux Y ratio r (median of N)` gives the medians of
# perftest's average bandwidth.
set -euo pipefail
mode=full matrix=
for a in "$@"; do
  case "$a" in
    --linux-only) mode=linux ;;
    --matrix) matrix=1 ;;
    *) echo "lab.sh: unknown argument $a (--linux-only, --matrix)" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
lab_dir=$repo/qemu/lab
cache=${BAREVERBS_LAB_CACHE:-$lab_dir/.cache}
mkdir -p "$cache"
# The case list of this run, as both Linux guests read it (they see this machine's root).
cases_file=$cache/roce-cases.txt
cat "${BAREVERBS_ROCE_CASES:-$here/cases}" ${matrix:+"$here/cases-matrix"} > "$cases_file"
alog=$cache/roce-linux-a.log ulog=$cache/roce-unikernel.log
# shellcheck source=qemu/roce/verdict.sh
source "$here/verdict.sh"
t0=$(date +%s)
stage() { echo "[roce +$(( $(date +%s) - t0 ))s] $*"; }

# shellcheck source=qemu/lab/host.sh
source "$lab_dir/host.sh"
install_missing qemu-system-x86 busybox-static kmod rdma-core iproute2 cpio ibverbs-utils perftest rdmacm-utils qperf \
  gcc libglib2.0-dev pkg-config xz-utils
# shellcheck source=qemu/lab/guest.sh
source "$lab_dir/guest.sh"
uk_kernel=${BAREVERBS_ROCE_KERNEL:-$repo/target/release/bareverbs-lab-peers}
if [ "$mode" = full ] && [ -z "${BAREVERBS_ROCE_KERNEL:-}" ]; then
  stage "building the unikernel"
  (cd "$repo" && cargo build --release -p bareverbs-lab-peers 2>&1 | tail -1)
fi

# The unikernel's NIC, as QEMU names the device, and the tag of the lab's efficiency lines
# (none for virtio-net, the lines the README's figures are checked against).
nic=${BAREVERBS_ROCE_NIC:-virtio}
case "$nic" in
  virtio) uk_nic=virtio-net-pci nic_tag= ;;
  igb|e1000e) uk_nic=$nic nic_tag=" $nic" ;;
  *) echo "BAREVERBS_ROCE_NIC=$nic: not virtio, igb or e1000e" >&2; exit 2 ;;
esac
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
bench=${BAREVERBS_ROCE_BENCH:-3}
[ "$mode" = full ] || bench=0
# (Only `read` and `write` have throughput runs.)
[ -z "$only" ] || grep -q -w -E 'read|write' <<<"${only//,/ }" || bench=0

# --- the instruction counter -------------------------------------------------------------------
# (qemu/roce/icount.sh: build_counter, window_count; the NVMe-oF lab uses them too)
# shellcheck source=qemu/roce/icount.sh
source "$here/icount.sh"
b_count=$cache/roce-icount-linux-b.txt uk_count=$cache/roce-icount-unikernel.txt
uk_prof=$cache/roce-profile-unikernel.txt
rm -f "$b_count" "$uk_count" "$uk_prof"
# The case the profile covers, as its marks' low byte (as in `efficiency` below).
prof_case=${BAREVERBS_ROCE_PROFILE:-read} prof_kk=
case "$prof_case" in write) prof_kk=01 ;; read) prof_kk=02 ;; atomic) prof_kk=03 ;; *) prof_kk= ;; esac
counter_why="the baseline alone"
if [ "$mode" = full ]; then
  why=
  build_counter || { counter_why=$why; stage "no instruction counts: $why"; }
fi

# --- the guests --------------------------------------------------------------------------------
# A counted guest (COUNT: the counter's output file) runs under TCG with the plugin, whatever
# the accelerator of the others.
accel_of() { # COUNT -> sets acc[]
  acc=(-accel "$accel")
  [ -n "$1" ] && acc=(-accel tcg -plugin "$counter,out=$1")
  return 0
}
linux() { # NAME ROLE IP MAC EXTRA-KERNEL-ARGUMENTS [COUNT]
  local log="$cache/roce-linux-$1.log" extra=$5 count=${6:-}
  [ -n "$count" ] && extra+=" bvroce.mark=$counter_mark"
  accel_of "$count"
  : > "$log"
  timeout "$limit" "$qemu" \
    "${acc[@]}" -machine q35 -cpu max -smp 1 -m 1024 -nographic -no-reboot \
    -kernel "$cache/kroot/boot/vmlinuz-$kver" -initrd "$cache/initramfs.cpio.gz" \
    -append "console=ttyS0 panic=-1 quiet bvlab.kroot=$cache/kroot bvlab.inner=$here/linux.sh bvroce.role=$2 bvroce.ip=$3 bvroce.only=${only:-} bvroce.cases=$cases_file bvroce.timeout=${BAREVERBS_ROCE_CASE_TIMEOUT:-100}$extra" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -netdev "$seg,id=n0" -device virtio-net-pci,netdev=n0,mac="$4",romfile= \
    > "$log" 2>&1 &
  pids+=($!)
  last_pid=$!
}
# The cases as the unikernel takes them (`,` for spaces, `+` between cases); with `first`,
# only the first case of each name (the throughput runs' `read` and `write`).
uk_cases() { # [CASE-NAMES-RE] [first]
  case_lines | { grep -E "^(${only_re:-.*})( |$)" || true; } | { grep -E "^(${1:-.*})( |$)" || true; } |
    awk -v first="${2:-}" 'first == "" || !seen[$1]++' | sed 's/ *$//; s/ \+/,/g' | paste -sd+
}
# The list goes in a fw_cfg file, not on the command line: QEMU's PVH boot takes 4 KiB of
# command line at most, and the whole matrix's list is longer (docs/testing.md).
unikernel() { # LOG CASES [COUNT]
  local log=$1 dump=() list=${1%.log}.cases
  printf '%s\n' "$2" > "$list"
  accel_of "${3:-}"
  [ -n "${3:-}" ] && [ -n "$prof_kk" ] && acc[-1]+=",prof=$uk_prof,from=00$prof_kk,to=01$prof_kk"
  [ -n "${BAREVERBS_ROCE_PCAP:-}" ] && [ -z "${uk_pid:-}" ] &&
    dump=(-object "filter-dump,id=dump0,netdev=nu,file=$cache/roce.pcap")
  : > "$log"
  # -cpu max, as the Linux guests: QEMU's default model (qemu64) has no PCLMULQDQ, and the
  # driver's ICRC folds with it wherever CPUID shows it (else slice-by-16, 6x the work).
  # TCG's max model has it (KVM's is the host's).
  timeout "$limit" "$qemu" \
    "${acc[@]}" -machine q35 -cpu max -m 256M -nodefaults -vga none -display none -no-reboot \
    -serial "file:$log" -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
    -netdev "$seg,id=nu" -device "$uk_nic",netdev=nu,addr=0x3.0,mac=52:54:00:00:00:02,romfile= \
    "${dump[@]}" \
    -kernel "$uk_kernel" \
    -fw_cfg "name=opt/bareverbs/roce-cases,file=$list" \
    -append "bvroce=10.0.0.2/24 bvroce.ip6=fd00::2 bvroce.peer=10.0.0.1 bvroce.cases.fw_cfg=opt/bareverbs/roce-cases" \
    > "${log%.log}.qemu" 2>&1 &
  pids+=($!)
  last_pid=$!
}
# A unikernel that has exited: its status (33 PASS, 35 FAIL) in `reaped`.
reap() { # PID WHICH
  wait "$1" && reaped=0 || reaped=$?
  stage "$2 exited (status $reaped: 33 PASS, 35 FAIL)"
}
# The unikernel may still be waiting for a peer that is gone: a grace period, then stop it.
stop_unikernel() { # PID WHICH
  for _ in $(seq 1 $(( grace * 2 ))); do kill -0 "$1" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$1" 2>/dev/null; then
    stage "stopping $2: still running ${grace} s after Linux A"
    kill "$1" 2>/dev/null || true
    wait "$1" || true
    reaped="none: stopped by the lab"
  else
    reap "$1" "$2"
  fi
}

blog=$cache/roce-linux-b.log b2log=$cache/roce-linux-b2.log
u2log=$cache/roce-unikernel-bench.log
# Nothing of an earlier run may be read as this one's: the unikernels' logs stay empty
# unless they boot.
rm -f "$ulog" "$cache/roce-unikernel.qemu" "$u2log" "$cache/roce-unikernel-bench.qemu" "$b2log"
bench_arg=
[ "$bench" -gt 0 ] && bench_arg=" bvroce.bench=$bench"
stage "booting Linux A (10.0.0.1) and Linux B (10.0.0.3), ${accel^^}${counter:+ (Linux B: TCG, counted)}, $("$qemu" --version | head -1), on mcast group port $port"
linux a a 10.0.0.1 52:54:00:00:00:01 "$bench_arg"
a_pid=$last_pid
linux b b 10.0.0.3 52:54:00:00:00:03 "" "${counter:+$b_count}"
b_pid=$last_pid
# Linux A runs all phases by itself; this loop boots the others when A (or the guest before
# them at the same address) is ready for them, and stops waiting for a side whose peer is
# gone: a guest that stopped early leaves the cases it did not get to without a result
# (FAIL), instead of A's 100 s per case.
#   A's baseline over          -> the unikernel (counted)
#   Linux B's side done, gone  -> Linux B for the throughput runs (same address)
#   the unikernel gone         -> the unikernel for the throughput runs (same address)
grace=${BAREVERBS_ROCE_GRACE:-15}
uk_pid='' uk_status='' uk_end='' b_end='' stopped=''
b2_pid='' b2_end='' uk2_pid='' uk2_status='' uk2_end=''
deadline=$(( t0 + limit ))
while kill -0 "$a_pid" 2>/dev/null; do
  now=$(date +%s)
  if [ "$now" -ge "$deadline" ]; then
    stopped="the lab's timeout (${limit} s)"; break
  fi
  if [ -z "$uk_pid" ] && grep -a -q "phase unikernel" "$alog"; then
    stage "baseline over"
    [ "$mode" = linux ] && break
    stage "booting the unikernel (10.0.0.2) on $uk_nic${counter:+, TCG, counted}"
    unikernel "$ulog" "$(uk_cases)" "${counter:+$uk_count}"
    uk_pid=$last_pid
  fi
  # Linux B gone while A is still in its baseline (B's side ends with "baseline side done").
  if [ -z "$b_end" ] && ! kill -0 "$b_pid" 2>/dev/null; then
    b_end=$now
    grep -a -q "baseline side done" "$blog" || stage "Linux B stopped before its side of the baseline was over"
  fi
  if [ -z "$uk_pid" ] && [ -n "$b_end" ] && [ $(( now - b_end )) -ge "$grace" ] &&
     ! grep -a -q "phase unikernel" "$alog"; then
    stopped="Linux A still in the baseline ${grace} s after Linux B stopped"; break
  fi
  if [ "$bench" -gt 0 ] && [ -z "$b2_pid" ] && [ -n "$b_end" ] && grep -a -q "baseline side done" "$blog"; then
    stage "booting Linux B again for the throughput runs, $bench rounds, ${accel^^}"
    linux b2 b 10.0.0.3 52:54:00:00:00:03 "$bench_arg"
    b2_pid=$last_pid
  fi
  if [ -n "$b2_pid" ] && [ -z "$b2_end" ] && ! kill -0 "$b2_pid" 2>/dev/null; then
    b2_end=$now
    grep -a -q "bench side done" "$b2log" || stage "Linux B stopped before its throughput runs were over"
  fi
  if [ -n "$b2_end" ] && [ $(( now - b2_end )) -ge "$grace" ] && ! grep -a -q "bench side done" "$b2log"; then
    stopped="Linux B stopped before its throughput runs were over"; break
  fi
  if [ -n "$uk_pid" ] && [ -z "$uk_end" ] && ! kill -0 "$uk_pid" 2>/dev/null; then
    uk_end=$now
    reap "$uk_pid" "the unikernel"
    uk_status=$reaped
    if [ "$bench" -gt 0 ]; then
      stage "booting the unikernel again for the throughput runs, ${accel^^}"
      unikernel "$u2log" "$(for _ in $(seq 1 "$bench"); do uk_cases 'read|write' first; done | paste -sd+)"
      uk2_pid=$last_pid
    fi
  fi
  if [ -n "$uk2_pid" ] && [ -z "$uk2_end" ] && ! kill -0 "$uk2_pid" 2>/dev/null; then
    uk2_end=$now
    reap "$uk2_pid" "the unikernel of the throughput runs"
    uk2_status=$reaped
  fi
  last_end=$uk_end
  [ "$bench" -gt 0 ] && last_end=$uk2_end
  if [ -n "$last_end" ] && [ $(( now - last_end )) -ge "$grace" ]; then
    stopped="Linux A still running ${grace} s after the unikernel exited"; break
  fi
  sleep 0.5
done
if [ -n "$stopped" ]; then
  stage "stopping: $stopped"
else
  stage "Linux A done"
fi
if [ -n "$uk_pid" ] && [ -z "$uk_end" ]; then
  stop_unikernel "$uk_pid" "the unikernel"
  uk_status=$reaped
fi
if [ -n "$uk2_pid" ] && [ -z "$uk2_end" ]; then
  stop_unikernel "$uk2_pid" "the unikernel of the throughput runs"
  uk2_status=$reaped
fi
cleanup

# --- the verdict -------------------------------------------------------------------------------
# (qemu/roce/verdict.sh: the labels, each case's results and lines; || true: a missing line is
# a result too, not a reason for set -e to end the script.)
bw() { sed -n 's/.*BW-average-MB\/s \([0-9.]*\).*/\1/p' <<<"$1"; }
tail_of() { echo "[roce] $1's log ($2) ends:"; tail -"${3:-15}" "$2" 2>/dev/null | tr -d '\r' | sed 's/^/  /'; }
names=$(case_labels "$only_re")
total=$(wc -w <<<"$names")
why=()
[ -n "$stopped" ] && why+=("stopped: $stopped")
a_end="phase unikernel"
[ "$mode" = full ] && a_end="]: done"
[ -z "$stopped" ] && ! grep -a -q -F "$a_end" "$alog" && why+=("Linux A ended before its cases did")
ll_pass=0
# Cases the baseline does not run (the cases file's `#@ no-baseline` line says why).
nobase=" $(sed -n 's/^#@ no-baseline //p' "$cases_file" | tr '\n' ' ') "
ll_total=0
# Each case's failures by side (the efficiency lines say them).
declare -A failed_ll=() failed_uk=()
for n in $names; do
  if [[ "$nobase" == *" $(label_name "$n") "* ]]; then
    echo "linux-linux $n: NOT RUN (baseline: Linux's rxe against itself does not finish it on this segment; qemu/roce/cases)"
    continue
  fi
  ll_total=$((ll_total + 1))
  if baseline_line "$n"; then ll_pass=$((ll_pass + 1)); else failed_ll[$n]=1; fi
done
[ "$ll_pass" = "$ll_total" ] || why+=("linux-linux $ll_pass/$ll_total")
ratio=
# `roce efficiency <case>`: instructions per payload byte of Linux B and of the unikernel in the
# same role, over the case's window (read: the responder; write: the requester); n/a when the
# case failed on either side.
efficiency() {
  local n kk f
  for n in read write; do
    grep -q -x "$n" <<<"$names" || continue
    if [ -z "$counter" ]; then
      echo "roce efficiency $n$nic_tag: unikernel - linux - ratio - (no instruction counter: $counter_why)"
      continue
    fi
    [ "$n" = write ] && kk=01 || kk=02
    f=
    [ -n "${failed_ll[$n]:-}" ] && f="linux-linux"
    [ -n "${failed_uk[$n]:-}" ] && f="${f:+$f and }roce"
    efficiency_line "$n$nic_tag" "$f" "$(window_count "$uk_count" "$kk")" \
      "$(window_count "$b_count" "$kk")" "$(case_bytes "$n")"
  done
}
# `roce profile <case>:` the unikernel's top 15 symbols over the profiled window (the blocks'
# first addresses, each given to the symbol at or below it in the unikernel's ELF).
profile() {
  [ -n "$prof_kk" ] && [ -s "$uk_prof" ] || return 0
  command -v nm > /dev/null || { echo "roce profile $prof_case: - (no nm)"; return 0; }
  # (Both address columns are 16 hex digits, so a text sort orders them; at one address the
  # symbol, tagged S, comes before the blocks, tagged P.)
  { nm -C -n --defined-only "$uk_kernel" 2>/dev/null |
      awk '$2 ~ /^[tTwW]$/ {a = $1; $1 = ""; $2 = ""; sub(/^ +/, ""); print "S", a, $0}'
    awk '{print "P", $1, $2}' "$uk_prof"; } |
    LC_ALL=C sort -k2,2 -k1,1r | awk '$1 == "S" {s = $0; sub(/^S [0-9a-f]+ /, "", s); next}
      {by[s == "" ? "?" : s] += $3} END {for (k in by) print by[k], k}' |
    sort -rn | awk -v case="$prof_case" '{n[NR] = $1; t += $1; $1 = ""; sub(/^ /, ""); name[NR] = $0}
      END {if (t == 0) exit
        printf "roce profile %s: %.1fM instructions in the unikernel'"'"'s window, top symbols:\n", case, t / 1e6
        for (i = 1; i <= NR && i <= 15; i++) printf "roce profile %s: %5.1f%% %s\n", case, 100 * n[i] / t, substr(name[i], 1, 110)}'
}
median() { sort -n | awk '{v[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2];
  else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# `roce throughput <case>`: the medians of the throughput runs' average bandwidth (MB/s).
bench_pass=0 bench_total=0 bench_cases=0
throughput() {
  local n i side r bws lin uk nl nu
  for n in read write; do
    grep -q -x "$n" <<<"$names" || continue
    bench_cases=$((bench_cases + 1))
    [ "$bench" -gt 0 ] || continue
    for side in linux roce; do
      bws=()
      for i in $(seq 1 "$bench"); do
        bench_total=$((bench_total + 1))
        r=$(result "bench-$side $n $i")
        case "$r" in "exit 0"*) bench_pass=$((bench_pass + 1)); bws+=("$(bw "$r")") ;;
          *) echo "bench $side $n $i: FAIL (${r:-no result})" ;; esac
      done
      [ "$side" = linux ] && { lin=$(printf '%s\n' "${bws[@]}" | { grep . || true; } | median); nl=${#bws[@]}; }
      [ "$side" = roce ] && { uk=$(printf '%s\n' "${bws[@]}" | { grep . || true; } | median); nu=${#bws[@]}; }
    done
    r=-
    [ "$lin" != - ] && [ "$uk" != - ] && r=$(awk -v u="$uk" -v l="$lin" 'BEGIN {printf "%.2f", (l > 0 ? u / l : 0)}')
    [ "$n" = read ] && ratio=$r
    echo "roce throughput $n$nic_tag: unikernel $uk linux $lin ratio $r (median of $([ "$nl" = "$nu" ] && echo "$nl" || echo "$nu and $nl"))"
  done
  [ "$bench_pass" = "$bench_total" ] || why+=("throughput runs $bench_pass/$bench_total")
}
# The rdma_cm programs' cases (connected through the CM, perftest's -R ones too) are counted
# apart: `cm <case>` (verdict.sh's is_cm).
cm_total=0
for n in $names; do is_cm "$n" && cm_total=$((cm_total + 1)); done
if [ "$mode" = full ]; then
  uk_pass=0 cm_pass=0 refused=0
  for n in $names; do
    if uk_line "$n"; then
      if is_cm "$n"; then cm_pass=$((cm_pass + 1)); else uk_pass=$((uk_pass + 1)); fi
    else
      failed_uk[$n]=1
      [[ "$(uk_result "$n")" == "REFUSED "* ]] && refused=$((refused + 1))
    fi
  done
  for n in $names; do latency_line "$n"; done
  [ "$uk_pass" = $((total - cm_total)) ] || why+=("roce $uk_pass/$((total - cm_total))")
  [ "$cm_pass" = "$cm_total" ] || why+=("cm $cm_pass/$cm_total")
  [ "$refused" = 0 ] || why+=("$refused refused by the unikernel")
  efficiency
  profile
  throughput
  if ! grep -a -q "bareverbs: PASS" "$ulog" 2>/dev/null; then
    why+=("the unikernel did not print bareverbs: PASS (QEMU status ${uk_status:-none})")
    tail_of "the unikernel" "$ulog" 10
    [ -s "$cache/roce-unikernel.qemu" ] && tail_of "the unikernel's QEMU" "$cache/roce-unikernel.qemu" 5
  fi
  if [ "$bench" -gt 0 ] && [ "$bench_cases" -gt 0 ] && ! grep -a -q "bareverbs: PASS" "$u2log" 2>/dev/null; then
    why+=("the unikernel of the throughput runs did not print bareverbs: PASS (QEMU status ${uk2_status:-none})")
    tail_of "the unikernel of the throughput runs" "$u2log" 10
  fi
fi
if [ ${#why[@]} -gt 0 ]; then
  [ "$ll_pass" = "$ll_total" ] || tail_of "Linux B" "$blog"
  tail_of "Linux A" "$alog"
fi
stage "done"
if [ ${#why[@]} -eq 0 ]; then
  if [ "$mode" = full ]; then
    echo "[roce] verdict: PASS (linux-linux $ll_pass/$ll_total$([ "$ll_total" = "$total" ] || echo " of $total, $((total - ll_total)) not run"), roce $uk_pass/$((total - cm_total)), cm $cm_pass/$cm_total, throughput runs $bench_pass/$bench_total, read ratio ${ratio:--}, $accel, unikernel on $nic)"
  else
    echo "[roce] verdict: PASS (linux-linux $ll_pass/$ll_total$([ "$ll_total" = "$total" ] || echo " of $total, $((total - ll_total)) not run"), $accel)"
  fi
  exit 0
fi
msg=$(printf '%s; ' "${why[@]}")
echo "[roce] verdict: FAIL (${msg%; })"
exit 1
