#!/usr/bin/env bash
# The labs on each NIC the unikernel drives: the RoCE lab (qemu/roce/lab.sh) with the unikernel
# on virtio-net, igb and e1000e, and the NVMe-oF lab (qemu/roce/nvmf.sh) with the appliance on
# igb. The Linux guests keep virtio-net. Each run's output goes to $cache/nics-<lab>-<nic>.log;
# this prints its lab lines (cases that failed, efficiency, throughput, verdict), its time, and
# a summary; the exit status is 0 only if every run passed.
#
#   qemu/roce/nics.sh            the whole matrix: RoCE on virtio igb e1000e, NVMe-oF on igb
#   qemu/roce/nics.sh --ci       CI's subset: a few RoCE cases on igb and on e1000e (both roles,
#                                read and write counted), no throughput runs; the NVMe-oF lab's
#                                steps on igb, without its performance and counted runs
#   BAREVERBS_NICS_ROCE="igb e1000e"  the RoCE lab's NICs     BAREVERBS_NICS_NVMF="igb"  the NVMe-oF lab's
#
# Both labs need a QEMU with `-device igb` (8.0 or later): BAREVERBS_ROCE_QEMU, else QEMU 10 from
# qemu/roce/modern-qemu.sh; the other BAREVERBS_ROCE_* / BAREVERBS_NVMF_* settings pass through.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${BAREVERBS_LAB_CACHE:-$here/../lab/.cache}
mkdir -p "$cache"
roce_nics=${BAREVERBS_NICS_ROCE:-virtio igb e1000e}
nvmf_nics=${BAREVERBS_NICS_NVMF:-igb}
ci=
if [ "${1:-}" = --ci ]; then
  ci=1
  roce_nics=${BAREVERBS_NICS_ROCE:-igb e1000e}
  nvmf_nics=${BAREVERBS_NICS_NVMF:-igb}
  export BAREVERBS_NVMF_RUNS=${BAREVERBS_NVMF_RUNS:-0} BAREVERBS_NVMF_COUNT=${BAREVERBS_NVMF_COUNT:-0} \
    BAREVERBS_NVMF_NVME_RUNS=${BAREVERBS_NVMF_NVME_RUNS:-0}
fi
qemu=${BAREVERBS_ROCE_QEMU:-}
if [ -z "$qemu" ]; then
  qemu=$("$here/modern-qemu.sh") || { echo "[nics] verdict: FAIL (no QEMU with -device igb: qemu/roce/modern-qemu.sh could not provide one)"; exit 1; }
fi
"$qemu" -device help 2>/dev/null | grep -q '"igb"' ||
  { echo "[nics] verdict: FAIL ($qemu has no -device igb: QEMU 8.0 or later is needed)"; exit 1; }
export BAREVERBS_ROCE_QEMU=$qemu

# CI's cases: a client and a server of the verbs programs, the counted READ and WRITE (the
# efficiency lines), a CM pair; no throughput runs.
ci_cases=rc-server,rc-client,write,read,rping-server,rping-client
summary=() failed=0
run() { # LAB NIC COMMAND...
  local lab=$1 nic=$2 log=$cache/nics-$1-$2.log t0 st=0
  shift 2
  t0=$(date +%s)
  echo "[nics] $lab lab, unikernel on $nic (log: $log)"
  "$@" </dev/null > "$log" 2>&1 || st=$?
  grep -a -E "^(roce|cm|nvmf) [^ ]+.*: (FAIL|SKIP|REFUSED)|efficiency|throughput|verdict" "$log" | sed 's/^/  /' || true
  summary+=("$lab on $nic: $(grep -a -o 'verdict: [A-Z]*' "$log" | tail -1 | sed 's/verdict: //') in $(( $(date +%s) - t0 )) s")
  [ "$st" = 0 ] || failed=$((failed + 1))
}
for nic in $roce_nics; do
  if [ -n "$ci" ]; then
    run roce "$nic" env BAREVERBS_ROCE_NIC="$nic" BAREVERBS_ROCE_ONLY="$ci_cases" BAREVERBS_ROCE_BENCH=0 \
      "$here/lab.sh"
  else
    run roce "$nic" env BAREVERBS_ROCE_NIC="$nic" "$here/lab.sh"
  fi
done
# The NVMe-oF lab on an Intel NIC runs the appliance on one CPU (the lab's default, on
# virtio-net, is two): both are run in CI.
for nic in $nvmf_nics; do
  run nvmf "$nic" env BAREVERBS_NVMF_NIC="$nic" BAREVERBS_NVMF_CPUS="${BAREVERBS_NVMF_CPUS:-1}" "$here/nvmf.sh"
done
printf '[nics] %s\n' "${summary[@]}"
if [ "$failed" = 0 ]; then
  echo "[nics] verdict: PASS (${#summary[@]} runs)"
else
  echo "[nics] verdict: FAIL ($failed of ${#summary[@]} runs)"
  exit 1
fi
