#!/usr/bin/env bash
# Two appliances, one namespace, Linux's own multipath between them (docs/appliance.md, "Two
# appliances, one namespace"). A stage of its own: the NVMe-oF lab's other scripts are not run.
#
#   qemu/roce/nvmf-multipath.sh
#   BAREVERBS_NVMF_QEMU=path           the qemu-system-x86_64 (as qemu/roce/nvmf.sh)
#   BAREVERBS_NVMF_ACCEL=tcg|kvm       the accelerator (default: TCG, the CI's)
#   BAREVERBS_APPLIANCE_KERNEL=path    another appliance image (default: cargo's release build)
#   BAREVERBS_NVMF_TIMEOUT=900         seconds for the whole lab
#   BAREVERBS_LAB_CACHE=dir            the lab's cache (default qemu/lab/.cache)
#   BAREVERBS_NVMF_MP_KATO=2           Linux's keep-alive timeout for both paths (seconds; its
#                                      nvme-rdma notices a dead path about two of them later)
#
# Appliance 1 (10.0.0.2, controller IDs 1-32767, group 1 optimized) and appliance 2 (10.0.0.4,
# 32768-65519, group 1 non-optimized) boot on one disk image, shared through QEMU's share-rw
# with image locking off; each names the other as its peer. Linux A (10.0.0.1, rdma_rxe,
# Debian's nvme-cli and fio; qemu/roce/nvmf-multipath-linux.sh) then:
# 1. `nvmf multipath`: `nvme connect-all` against appliance 1 alone; one subsystem with two
#    live paths and one block device.
# 2. `nvmf failover`: fio writes and verifies (crc32c) while this script kills appliance 1's
#    QEMU with SIGKILL; no I/O error, every block verified, the longest completion latency
#    fio saw is the stall.
# 3. `nvmf failback`: appliance 1 boots again on the same image; Linux's path to it comes back
#    live by itself (its reconnect), and I/O goes through it again (the optimized path).
# 4. `nvmf ana`: on the consoles, appliance 1's group becomes non-optimized and appliance 2's
#    optimized; Linux's `nvme ana-log` and sysfs `ana_state` follow without a reconnect, and I/O
#    moves to appliance 2.
# Linux prints `bvmp-step: NAME` lines when it wants this script to act (kill, restart, ana)
# and waits for what follows; its results come back as `bvmp-result: NAME PASS|FAIL (…)`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
lab_dir=$repo/qemu/lab
cache=${BAREVERBS_LAB_CACHE:-$lab_dir/.cache}
mkdir -p "$cache"
t0=$(date +%s)
stage() { echo "[nvmf-multipath +$(( $(date +%s) - t0 ))s] $*"; }

# shellcheck source=qemu/lab/host.sh
source "$lab_dir/host.sh"
install_missing qemu-system-x86 busybox-static kmod rdma-core iproute2 cpio nvme-cli fio
# shellcheck source=qemu/lab/guest.sh
source "$lab_dir/guest.sh"

kernel=${BAREVERBS_APPLIANCE_KERNEL:-${CARGO_TARGET_DIR:-$repo/target}/release/bareverbs-appliance}
if [ -z "${BAREVERBS_APPLIANCE_KERNEL:-}" ]; then
  stage "building the appliance"
  (cd "$repo" && cargo build --release -p bareverbs-appliance 2>&1 | tail -1)
fi
port=$(( 20000 + ($$ + 17) % 20000 ))
seg="socket,mcast=230.0.0.1:$port,localaddr=127.0.0.1"
limit=${BAREVERBS_NVMF_TIMEOUT:-900}
qemu=${BAREVERBS_NVMF_QEMU:-${BAREVERBS_ROCE_QEMU:-}}
if [ -z "$qemu" ]; then
  qemu=$("$here/modern-qemu.sh") || { qemu=qemu-system-x86_64; stage "no modern QEMU to be had: the system's runs"; }
fi
accel=${BAREVERBS_NVMF_ACCEL:-tcg}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

nqn=nqn.2026-11.io.bareverbs:lab-shared
nguid=62617265766572627300000000000001
disk_mib=256
img=$cache/nvmf-multipath-disk.img
rm -f "$img"; truncate -s "${disk_mib}M" "$img"
words="bvnvmf.subsys=$nqn bvnvmf.ns=blk:0 bvnvmf.nguid=$nguid"
line1="bvnvmf=10.0.0.2/24 bvnvmf.cntlid=1-32767 bvnvmf.portid=1 bvnvmf.peer=10.0.0.4:4420:2 $words"
line2="bvnvmf=10.0.0.4/24 bvnvmf.cntlid=32768-65519 bvnvmf.portid=2 bvnvmf.peer=10.0.0.2:4420:1 $words bvnvmf.ana=1:non-optimized"

# Appliance N (1 or 2) with its command line, console input on a FIFO (fd in uk_fd[N]), output
# to LOG; its QEMU's own pid (not timeout's) in uk_pid[N].
declare -A uk_fd uk_pid
appliance() { # N LOG COMMAND-LINE
  local name=nvmf-multipath-uk$1 mac=52:54:00:00:00:0$(( $1 * 2 ))
  rm -f "$cache/$name.in" "$cache/$name.out" "$cache/$name.pid"
  mkfifo "$cache/$name.in" "$cache/$name.out"
  cat "$cache/$name.out" >> "$2" &
  pids+=($!)
  exec {fd}<>"$cache/$name.in"
  uk_fd[$1]=$fd
  timeout "$limit" "$qemu" \
    -accel "$accel" -machine q35 -cpu max -m 512M -nodefaults -vga none -display none -no-reboot \
    -chardev "pipe,id=c0,path=$cache/$name" -serial chardev:c0 -pidfile "$cache/$name.pid" \
    -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
    -netdev "$seg,id=nu" -device "virtio-net-pci,netdev=nu,addr=0x3.0,mac=$mac,romfile=" \
    -drive "file=$img,if=none,id=d0,format=raw,file.locking=off" \
    -device virtio-blk-pci,drive=d0,addr=0x4.0,share-rw=on \
    -kernel "$kernel" -append "$3" >> "$cache/$name.qemu" 2>&1 &
  pids+=($!)
  # Not a job of this shell's: the SIGKILL below is meant, and not worth a line of its own.
  disown "$!"
  for _ in $(seq 1 50); do [ -s "$cache/$name.pid" ] && break; sleep 0.1; done
  uk_pid[$1]=$(cat "$cache/$name.pid" 2>/dev/null || echo 0)
}

log1=$cache/nvmf-multipath-uk1.log log2=$cache/nvmf-multipath-uk2.log alog=$cache/nvmf-multipath-linux.log
rm -f "$log1" "$log2" "$alog" "$cache"/nvmf-multipath-uk?.qemu
stage "booting appliance 1 (10.0.0.2): $line1"
appliance 1 "$log1" "$line1"
stage "booting appliance 2 (10.0.0.4): $line2"
appliance 2 "$log2" "$line2"
stage "booting Linux A (10.0.0.1), ${accel^^}, on mcast group port $port"
timeout "$limit" "$qemu" \
  -accel "$accel" -machine q35 -cpu max -smp 1 -m 1024 -nographic -no-reboot \
  -kernel "$cache/kroot/boot/vmlinuz-$kver" -initrd "$cache/initramfs.cpio.gz" \
  -append "console=ttyS0 panic=-1 quiet bvlab.kroot=$cache/kroot bvlab.inner=$here/nvmf-multipath-linux.sh bvmp.nqn=$nqn bvmp.disk=$disk_mib bvmp.kato=${BAREVERBS_NVMF_MP_KATO:-2}" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -netdev "$seg,id=n0" -device virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01,romfile=,rx_queue_size=1024 \
  < /dev/null > "$alog" 2>&1 &
a_pid=$!
pids+=("$a_pid")

# Linux's requests, each acted on once.
done_steps=" "
killed_at= restarted_at=
while kill -0 "$a_pid" 2>/dev/null; do
  for s in $({ grep -a -o 'bvmp-step: [a-z-]*' "$alog" 2>/dev/null || true; } | awk '{print $2}'); do
    case "$done_steps" in *" $s "*) continue ;; esac
    done_steps+="$s "
    case "$s" in
      kill)
        stage "SIGKILL to appliance 1's QEMU (pid ${uk_pid[1]})"
        kill -KILL "${uk_pid[1]}" 2>/dev/null || true
        killed_at=$(date +%s) ;;
      restart)
        stage "booting appliance 1 again on the same image"
        echo "--- booted again ---" >> "$log1"
        appliance 1 "$log1" "$line1"
        restarted_at=$(date +%s) ;;
      ana)
        stage "consoles: appliance 1's group 1 non-optimized, appliance 2's optimized"
        printf 'a1n' >&"${uk_fd[1]}" || true
        printf 'a1o' >&"${uk_fd[2]}" || true ;;
    esac
  done
  sleep 0.5
done
wait "$a_pid" || true
stage "Linux done; powering the appliances off"
for n in 1 2; do printf 'q\n' >&"${uk_fd[$n]}" || true; done
for _ in $(seq 1 60); do
  kill -0 "${uk_pid[1]}" 2>/dev/null || kill -0 "${uk_pid[2]}" 2>/dev/null || break
  sleep 0.5
done
sleep 0.5
cleanup

why=()
for name in multipath failover failback ana; do
  r=$({ grep -a "^bvmp-result: $name " "$alog" || true; } | tail -1 | sed "s/^bvmp-result: $name //" | tr -d '\r')
  [ -n "$r" ] || r="FAIL (no result from Linux; its last lines: $(tail -3 "$alog" | tr -d '\r' | tr '\n' ' '))"
  echo "nvmf $name: $r"
  [[ "$r" == PASS* ]] || why+=("$name")
done
for n in 1 2; do
  l=log$n
  echo "  appliance $n said: $(grep -a -E 'nvmf: ANA|target: ok|FAIL|panic' "${!l}" | tail -4 | tr -d '\r' | tr '\n' ' ')"
done
# A failure's evidence: every controller an appliance lost and why, and Linux's kernel log of
# nvme and rdma (from the Linux script's fail()).
if [ ${#why[@]} -gt 0 ]; then
  for n in 1 2; do
    l=log$n
    grep -a -E 'lost: |--- booted again' "${!l}" | tr -d '\r' | sed "s/^/  appliance $n: /"
  done
  grep -a '^bvmp-dmesg: ' "$alog" | tr -d '\r' | sed 's/^bvmp-dmesg: /  Linux A: /'
fi
[ -n "$killed_at" ] && [ -n "$restarted_at" ] && stage "appliance 1 was down $(( restarted_at - killed_at )) s"
stage "done"
[ ${#why[@]} -eq 0 ]
