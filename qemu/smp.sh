#!/usr/bin/env bash
# The SMP bring-up's boot checks (docs/smp.md): the example kernel booted in plain QEMU with
# 1, 2 and 4 CPUs, under TCG and multi-threaded TCG, must start every CPU, count each one's
# idle halts and pass; a CPU withheld its start-up IPIs must be left out while the others
# start; a stack overflow on CPU 1 must stop at its guard page; and the appliance must boot
# and serve with 2 CPUs, its second CPU serving I/O queues (qemu/percore.sh). Builds both kernels (release) first.
#
#   qemu/smp.sh
#
# Status: 0 when every check holds, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p bareverbs-unikernel -p bareverbs-appliance || exit 1
dir=${CARGO_TARGET_DIR:-target}/release
kernel=$dir/bareverbs-unikernel
fails=0
t_all=$(date +%s)

# check NAME EXPECT(pass|fail) QEMU-ARGS -- PATTERN...: boots the example, prints its lines
# about the CPUs, and checks the verdict and that each pattern matches a line.
check() {
  local name=$1 want=$2 args=() out st=0 t0 p ok=1
  shift 2
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift
  t0=$(date +%s.%N)
  out=$(qemu/boot.sh "$kernel" "${args[@]}" 2>&1 | tr -d "\r") || st=$?
  grep -E "^smp:|FAIL|verdict" <<<"$out" | sed 's/^/    /'
  if [ "$want" = pass ] && [ "$st" -ne 0 ]; then ok=0; fi
  if [ "$want" = fail ] && ! grep -q "verdict: FAIL" <<<"$out"; then ok=0; fi
  for p in "$@"; do
    grep -Eq "$p" <<<"$out" || { echo "    missing: $p"; ok=0; }
  done
  if [ $ok -eq 1 ]; then
    printf '  ok   %s (%.1f s)\n' "$name" "$(echo "$(date +%s.%N) - $t0" | bc)"
  else
    echo "$out" | tail -30 | sed 's/^/    | /'
    printf '  FAIL %s\n' "$name"
    fails=$((fails + 1))
  fi
}

halts2='^smp: idle halts: cpu 0 \(apic 0\) [1-9][0-9]* cpu 1 \(apic 1\) [1-9][0-9]*$'
halts4='^smp: idle halts: cpu 0 \(apic 0\) [1-9][0-9]* cpu 1 \(apic 1\) [1-9][0-9]* cpu 2 \(apic 2\) [1-9][0-9]* cpu 3 \(apic 3\) [1-9][0-9]*$'

check "-smp 1" pass -smp 1 -- '^smp: 1 cpus started \(apic ids 0\), 0 left out$'
check "-smp 2, TCG" pass -smp 2 -- '^smp: 2 cpus started \(apic ids 0 1\), 0 left out$' "$halts2"
check "-smp 2, multi-threaded TCG" pass -smp 2 -accel tcg,thread=multi -- \
  '^smp: 2 cpus started \(apic ids 0 1\), 0 left out$' "$halts2"
check "-smp 4, multi-threaded TCG" pass -smp 4 -accel tcg,thread=multi -- \
  '^smp: 4 cpus started \(apic ids 0 1 2 3\), 0 left out$' "$halts4"
check "-smp 4, CPU 2 never sent its start-up IPIs" pass -smp 4 -append bvsmp.silent=2 -- \
  '^smp: 3 cpus started \(apic ids 0 1 3\), 1 left out \(apic ids 2\)$'
check "-smp 2, CPU 1 overflows its stack" fail -smp 2 -append bvsmp.overflow -- \
  "^bareverbs: FAIL stack overflow: cpu 1's guard page hit at 0x[0-9a-f]+ by 0x[0-9a-f]+, on cpu 1$"

# The appliance with 2 CPUs (multi-threaded TCG): every CPU started, served 2 s, passed.
t0=$(date +%s.%N)
out=$(BAREVERBS_APPLIANCE_QEMU_ARGS="-smp 2 -accel tcg,thread=multi" \
  timeout 90 qemu/appliance.sh "$dir/bareverbs-appliance" bvnvmf.serve=2 </dev/null 2>&1 | tr -d "\r")
st=$?
grep -E "^smp:|FAIL|verdict" <<<"$out" | sed 's/^/    /'
if [ $st -eq 0 ] && grep -q '^smp: 2 cpus started (apic ids 0 1), 0 left out$' <<<"$out" &&
  grep -Eq "$halts2" <<<"$out"; then
  printf '  ok   the appliance, -smp 2, multi-threaded TCG (%.1f s)\n' "$(echo "$(date +%s.%N) - $t0" | bc)"
else
  echo "$out" | tail -30 | sed 's/^/    | /'
  echo "  FAIL the appliance, -smp 2"
  fails=$((fails + 1))
fi

# The appliance's poll groups: a second CPU serves I/O queues (qemu/percore.sh).
qemu/percore.sh || fails=$((fails + 1))

echo "smp checks: $((8 - fails)) of 8 passed in $(($(date +%s) - t_all)) s"
[ $fails -eq 0 ]
