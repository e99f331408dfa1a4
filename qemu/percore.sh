#!/usr/bin/env bash
# The appliance's poll groups on a second CPU (docs/percore.md, docs/appliance.md): two
# appliances on a segment of their own (QEMU's socket netdev over 127.0.0.1). B serves a RAM
# subsystem with `-smp 2` (multi-threaded TCG); A, with one CPU, connects to it in host mode
# (two I/O queues, the pieces it writes and reads alternating between them), checks what it
# read, and powers off; then B is told `q` on its console and reports. B's I/O queues must be
# one on each core and each core must have served commands: its `nvmf-uk cores:` line.
#
#   qemu/percore.sh            (builds the appliance, release)
#
# Status: 0 when both pass and B's line holds, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p bareverbs-appliance || exit 1
kernel=${CARGO_TARGET_DIR:-target}/release/bareverbs-appliance
nqn=nqn.2026-11.io.bareverbs:linux-brd-uk
port=$((20000 + $$ % 20000))
tmp=$(mktemp -d)
trap 'kill $pid_b 2>/dev/null; exec 3>&-; rm -rf "$tmp"' EXIT
mkfifo "$tmp/b.in"
exec 3<>"$tmp/b.in"
run() { # NAME NETDEV MAC CPUS APPEND
  qemu-system-x86_64 -machine q35 -m 512M -nodefaults -vga none -display none -no-reboot \
    -serial stdio -device isa-debug-exit,iobase=0xf4,iosize=0x04 -smp "$4" -accel tcg,thread=multi \
    -netdev "socket,id=n0,$2" -device "virtio-net-pci,netdev=n0,addr=0x3.0,mac=$3,romfile=" \
    -kernel "$kernel" -append "$5"
}
t0=$(date +%s)
run b "listen=127.0.0.1:$port" 52:54:00:12:34:02 2 \
  "bvnvmf=10.9.0.2/24 bvnvmf.subsys=$nqn bvnvmf.ns=ram:1M bvnvmf.serve=600" \
  <&3 >"$tmp/b.out" 2>&1 &
pid_b=$!
sleep 2
timeout 300 bash -c "$(declare -f run); kernel=$kernel; run a connect=127.0.0.1:$port 52:54:00:12:34:01 1 \
  'bvnvmf=10.9.0.1/24 bvnvmf.host=10.9.0.2 bvnvmf.serve=1'" </dev/null >"$tmp/a.out" 2>&1
st_a=$?
printf q >&3
st_b=0
wait $pid_b || st_b=$?
a=$(tr -d '\r' <"$tmp/a.out")
b=$(tr -d '\r' <"$tmp/b.out")
grep -E "^nvmf-uk host:|FAIL" <<<"$a" | sed 's/^/    A: /'
grep -E "^smp:|^nvmf: cores|^nvmf: poll groups|^nvmf-uk cores:|FAIL" <<<"$b" | sed 's/^/    B: /'
ok=1
[ $st_a -eq 33 ] || { echo "    A ended with $st_a"; ok=0; }
[ $st_b -eq 33 ] || { echo "    B ended with $st_b"; ok=0; }
grep -q "^nvmf-uk host: ok connected to $nqn" <<<"$a" || ok=0
line=$(grep -E '^nvmf-uk cores: 2 cores, I/O queues [0-9]+\+[0-9]+, commands [0-9]+\+[0-9]+$' <<<"$b" | tail -1)
# Both cores served commands (the queues, counted live, are 0+0 after A's disconnect).
if [[ $line =~ commands\ ([0-9]+)\+([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -gt 0 ] &&
  [ "${BASH_REMATCH[2]}" -gt 0 ]; then :; else
  echo "    B's cores line: '${line}'"
  ok=0
fi
if [ $ok -eq 1 ]; then
  echo "  ok   poll groups: appliance B -smp 2 served A's two I/O queues on both cores ($(($(date +%s) - t0)) s)"
  exit 0
fi
echo "$a" | tail -15 | sed 's/^/    A| /'
echo "$b" | tail -25 | sed 's/^/    B| /'
echo "  FAIL poll groups on two cores"
exit 1
