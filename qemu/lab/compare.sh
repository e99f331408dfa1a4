#!/usr/bin/env bash
# Compares what the bareverbs unikernel and Linux's own vmw_pvrdma driver report for the same
# QEMU pvrdma device (both inner guests of the nested lab): device caps, port, CQ sizes, and
# the actual caps of QPs created with the same requests. Fails on any difference that is not
# explained below.
#
#   qemu/lab/compare.sh            run both lab scenarios (minutes: Linux boots under nested TCG)
#   qemu/lab/compare.sh --cached   compare the last runs' logs
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${BAREVERBS_LAB_CACHE:-$here/.cache}
if [ "${1:-}" != "--cached" ]; then
  "$here/lab.sh" >/dev/null
  "$here/lab.sh" --reference >/dev/null
fi
for f in unikernel reference; do
  [ -f "$cache/$f.log" ] || { echo "compare: no $f log; run without --cached"; exit 1; }
done
# The comparable lines, normalised:
# - QP numbers are the host's and differ from run to run: dropped;
# - the port's state differs by design: Linux's vmxnet3 driver brings the link up (ACTIVE), the
#   unikernel has no vmxnet3 driver (DOWN) — the device reports both faithfully: dropped;
# - the unikernel also prints pkey[0] and the PD handle: dropped;
# - UC: the unikernel refuses it before the device (QEMU would answer EIO), Linux's provider
#   has the device refuse it: both "refused".
# Not in these lines, by design: CQ room. Both create every QP whatever its CQ's size (the
# cap sets here fit either way, and the caps are the same). Linux's driver then checks only
# the work queue's ring when posting, so requests beyond what the CQ holds are posted and QEMU
# drops their CQEs silently; the unikernel's driver takes a CQ entry for each request of a
# queue whose depth did not fit its CQ and refuses the post that would overflow it
# (QueueFull { Cq }, nothing posted). Neither side overruns a CQ in the lab.
normalise() {
  tr -d '\r' < "$1" | grep -a -E '^(caps: |port 1: |PD [0-9]+, CQs of|CQs of|(RC|UD) QP( [0-9]+)?: asked|UC: )' |
    sed -E -e 's/^(RC|UD) QP [0-9]+:/\1 QP:/' \
           -e 's/state [A-Za-z]+, //' -e 's/, pkey\[0\] 0x[0-9a-f]+//' \
           -e 's/^PD [0-9]+, //' -e 's/^UC: .*(unsupported|refused).*/UC: refused/'
}
normalise "$cache/unikernel.log" > "$cache/unikernel.cmp"
normalise "$cache/reference.log" > "$cache/reference.cmp"
lines=$(wc -l < "$cache/reference.cmp")
if [ "$lines" -lt 10 ]; then
  echo "compare: FAIL — the reference reported only $lines comparable lines"; exit 1
fi
if diff -u "$cache/reference.cmp" "$cache/unikernel.cmp"; then
  echo "compare: the unikernel and Linux's vmw_pvrdma agree on all $lines lines" \
       "(caps, port, CQ sizes, QP caps for 4 cap sets x RC/UD, UC refused)"
else
  echo "compare: FAIL — differences above are not explained"; exit 1
fi
