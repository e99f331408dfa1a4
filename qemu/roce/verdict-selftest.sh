#!/usr/bin/env bash
# The RoCE lab's bookkeeping, checked on the host without a guest: qemu/roce/verdict.sh (the
# labels, each case's results, the lines lab.sh prints) on a crafted case list and crafted logs
# of Linux A and the unikernel, and qemu/roce/programs.sh (the command linux.sh runs for each
# case) on every case of qemu/roce/cases and qemu/roce/cases-matrix. Each check is one the lab
# once got wrong or could: two cases of one program merged into one result, a failed case
# with an efficiency figure, a latency case running the previous case's command, latency
# printed as bandwidth, a case the unikernel refused taken for a pass or leaving the later
# cases without results. Prints `[roce-selftest] verdict: PASS (N checks)` or the first
# difference and FAIL.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
checks=0 failed=0
expect() { # WHAT EXPECTED ACTUAL
  checks=$((checks + 1))
  if [ "$2" != "$3" ]; then
    failed=$((failed + 1))
    printf '[roce-selftest] FAIL %s\n  expected: %s\n  got:      %s\n' "$1" "$2" "$3"
  fi
}

# --- verdict.sh on crafted logs ------------------------------------------------------------------
cases_file=$work/cases alog=$work/a.log ulog=$work/u.log
# shellcheck source=qemu/roce/verdict.sh
source "$here/verdict.sh"
cat > "$cases_file" <<'CASES'
# a comment
write -s 65536 -n 1000
read -s 65536 -n 1000
write -s 1048576 -n 20

ib_send_lat-server -s 2 -n 1000
ib_read_lat-client -s 2 -n 1000
ib_write_lat-client -R -s 2 -n 100
ib_write_bw-q2-server -q 2 -s 4096 -n 200
ib_write_bw-server -R -s 4096 -n 200
rping-client -S 64 -C 100 -V
mckey-client -m 239.192.0.2 -C 10 -S 100
CASES
cat > "$alog" <<'LOG'
bvroce[a +0s]: phase baseline (Linux B at 10.0.0.3)
bvroce-result linux-linux write: exit 0 | bytes 65536 iters 1000 BW-average-MB/s 50.10
bvroce-result linux-linux read: exit 0 | bytes 65536 iters 1000 BW-average-MB/s 40.00
bvroce-result linux-linux write#2: exit 1
bvroce-result linux-linux ib_send_lat-server: exit 0 | bytes 2 iters 1000 t_typical-us 120.50 t_avg-us 130.25
bvroce-result linux-linux ib_read_lat-client: exit 0 | bytes 2 iters 1000 t_typical-us 200.00 t_avg-us 210.00
bvroce-result linux-linux ib_write_lat-client: exit 0
bvroce-result linux-linux ib_write_bw-q2-server: exit 0 | bytes 4096 iters 200 BW-average-MB/s 30.00
bvroce-result linux-linux ib_write_bw-server: exit 0 | bytes 4096 iters 200 BW-average-MB/s 31.00
bvroce-result linux-linux rping-client: exit 0
bvroce[a +9s]: phase unikernel (at 10.0.0.2)
bvroce-result roce write: exit 0 | bytes 65536 iters 1000 BW-average-MB/s 60.00
bvroce-result roce read: exit 1
bvroce-result roce write#2: exit 0 | bytes 1048576 iters 20 BW-average-MB/s 80.00
bvroce-result roce ib_send_lat-server: exit 1
bvroce-result roce ib_read_lat-client: exit 0 | bytes 2 iters 1000 t_typical-us 90.00 t_avg-us 95.00
bvroce-result roce ib_write_lat-client: exit 0 | bytes 2 iters 100 t_typical-us 70.00 t_avg-us 71.00
bvroce-result roce ib_write_bw-q2-server: exit 0 | bytes 4096 iters 200 BW-average-MB/s 33.00
bvroce-result roce ib_write_bw-server: exit 0 | bytes 4096 iters 200 BW-average-MB/s 32.00
bvroce-result roce rping-client: exit 0
bvroce-result roce mckey-client: exit 0
LOG
cat > "$ulog" <<'LOG'
roce-uk write: ok 1000 RDMA WRITEs of 65536 bytes completed
roce-uk read: FAIL deadline (after 120000 ms)
roce-uk write: ok 20 RDMA WRITEs of 1048576 bytes completed
roce-uk ib_send_lat-server: REFUSED a program the peer does not speak; Linux's program: connected to and the connection reset
roce-uk ib_read_lat-client: ok answered
roce-uk ib_write_lat-client: ok answered
roce-uk ib_write_bw-q2-server: REFUSED options the peer does not take; Linux's program: connected to and the connection reset
roce-uk ib_write_bw-server: ok wrote
roce-uk rping-client: ok pinged
roce-uk mckey-client: ok 10 datagrams
LOG

expect "labels: a name's second case is its own result" \
  "write read write#2 ib_send_lat-server ib_read_lat-client ib_write_lat-client ib_write_bw-q2-server ib_write_bw-server rping-client mckey-client" \
  "$(case_labels | paste -sd' ')"
expect "labels under a filter" "write write#2" "$(case_labels 'write' | paste -sd' ')"
expect "a label's case line" "write -s 1048576 -n 20" "$(case_of 'write#2')"
expect "a label's payload bytes" "65536000 20971520" "$(case_bytes write) $(case_bytes 'write#2')"
expect "the unikernel's K-th line of a name" "ok 20 RDMA WRITEs of 1048576 bytes completed" "$(uk_result 'write#2')"
expect "a case without a unikernel line" "" "$(uk_result 'write#3')"
expect "cm: rdma_cm names and -R cases, not perftest without -R" "ib_write_lat-client ib_write_bw-server rping-client mckey-client" \
  "$(for n in $(case_labels); do if is_cm "$n"; then echo "$n"; fi; done | paste -sd' ')"
expect "baseline: the second write failed, the first passed" \
  "linux-linux write: PASS bytes 65536 iters 1000 BW-average-MB/s 50.10|linux-linux write#2: FAIL (exit 1)" \
  "$(baseline_line write || true)|$(baseline_line 'write#2' || true)"
expect "roce: each write its own result" \
  "roce write: PASS (linux: bytes 65536 iters 1000 BW-average-MB/s 60.00; unikernel: 1000 RDMA WRITEs of 65536 bytes completed)|roce write#2: PASS (linux: bytes 1048576 iters 20 BW-average-MB/s 80.00; unikernel: 20 RDMA WRITEs of 1048576 bytes completed)" \
  "$(uk_line write)|$(uk_line 'write#2')"
st=0; line=$(uk_line ib_send_lat-server) || st=$?
expect "a refused case is REFUSED and not a pass" \
  "1 roce ib_send_lat-server: REFUSED (unikernel: a program the peer does not speak; Linux's program: connected to and the connection reset; linux: exit 1)" \
  "$st $line"
expect "the case after a refused one has its result" \
  "roce ib_read_lat-client: PASS (linux: bytes 2 iters 1000 t_typical-us 90.00 t_avg-us 95.00; unikernel: answered)" \
  "$(uk_line ib_read_lat-client)"
expect "a refused perftest case without -R" \
  "roce ib_write_bw-q2-server: REFUSED (unikernel: options the peer does not take; Linux's program: connected to and the connection reset; linux: exit 0 | bytes 4096 iters 200 BW-average-MB/s 33.00)" \
  "$(uk_line ib_write_bw-q2-server || true)"
expect "a failed case" "roce read: FAIL (linux: exit 1; unikernel: FAIL deadline (after 120000 ms))" "$(uk_line read || true)"
expect "a cm case" "cm rping-client: PASS (pinged; linux: exit 0)" "$(uk_line rping-client)"
expect "mckey is a cm case" "cm mckey-client: PASS (10 datagrams; linux: exit 0)" "$(uk_line mckey-client)"
expect "latency under a latency label" \
  "roce latency ib_read_lat-client: unikernel 90.00 us linux 200.00 us (typical, as perftest prints it)" \
  "$(latency_line ib_read_lat-client)"
expect "latency of a failed side is n/a, with why" \
  "roce latency ib_send_lat-server: unikernel n/a linux 120.50 us (roce: the case failed)" \
  "$(latency_line ib_send_lat-server)"
expect "latency without a row is n/a, with why" \
  "roce latency ib_write_lat-client: unikernel 70.00 us linux n/a (linux-linux: no latency row in Linux A's output)" \
  "$(latency_line ib_write_lat-client)"
expect "no latency line for a bandwidth case" "" "$(latency_line write)"
echo "bvroce-result roce ib_write_lat-client#2: exit 0 | bytes 2 iters 100 t_typical-us 60.00 t_avg-us 61.00" >> "$alog"
echo "bvroce-result linux-linux ib_write_lat-client#2: exit 0 | bytes 2 iters 100 t_typical-us 50.00 t_avg-us 51.00" >> "$alog"
echo "ib_write_lat-client -s 2 -n 100" >> "$cases_file"
echo "roce-uk ib_write_lat-client: FAIL TCP exchange: connection closed by the peer (Read)" >> "$ulog"
expect "no unikernel latency when its side failed, whatever Linux printed" \
  "roce latency ib_write_lat-client#2: unikernel n/a linux 50.00 us (roce: the unikernel's side did not pass)" \
  "$(latency_line 'ib_write_lat-client#2')"
sed -i '$d' "$cases_file"
expect "efficiency of a failed case is n/a, with why" \
  "roce efficiency read: n/a (the case failed: roce)" "$(efficiency_line read roce 5000000 6000000 65536000)"
expect "efficiency of a passed case" \
  "roce efficiency write: unikernel 0.10 linux 0.20 ratio 0.50 (6.6M and 13.1M instructions over 65536000 bytes)" \
  "$(efficiency_line write '' 6553600 13107200 65536000)"
expect "efficiency without both marks" \
  "roce efficiency write: n/a (a window without both marks: unikernel 6553600, linux -)" \
  "$(efficiency_line write '' 6553600 '' 65536000)"

# --- programs.sh: the command of every case ------------------------------------------------------
gid=1 gid6=3 ip=10.0.0.1 only=
# shellcheck source=qemu/roce/programs.sh
source "$here/programs.sh"
expect "linux.sh's labels are verdict.sh's" "$(case_labels | paste -sd' ')" \
  "$(cases | awk '{print $1}' | paste -sd' ')"
for list in "$here/cases" "$here/cases-matrix"; do
  cases_file=$list
  while read -r label name opts; do
    read -r -a opt <<<"$opts"
    for side in a other; do
      cmd=(stale)
      program "$side" "$name" 10.0.0.9 "${opt[@]}"
      want=
      case "$name" in
        rc-* | rc6-*) want=ibv_rc_pingpong ;; ud-* | ud6-*) want=ibv_ud_pingpong ;;
        write) want=ib_write_bw ;; read) want=ib_read_bw ;; atomic) want=ib_atomic_bw ;;
        cmtime-* | cmtime6-* | qperf-*) want=bash ;;
        rping6-* | ucmatose6-* | udaddy6-*) want=${name%%6-*} ;;
        *) want=${name%%-*} ;;
      esac
      expect "$(basename "$list") $label ($side): its own program" "$want" "${cmd[0]:-none}"
      # The IPv6 cases run with the IPv6 GID's index, the others with the IPv4-mapped one's.
      case "$name" in rping-* | ucmatose-* | udaddy-* | cmtime-* | mckey-* | rping6-* | ucmatose6-* | udaddy6-* | cmtime6-* | qperf-*) ;; *)
        g=1
        case "$name" in rc6-* | ud6-* | *-v6-*) g=3 ;; esac
        expect "$(basename "$list") $label ($side): its GID index" "1" \
          "$([[ " ${cmd[*]} " == *" -g $g "* || " ${cmd[*]} " == *" -x $g "* ]] && echo 1 || echo 0)" ;;
      esac
      # qperf's server takes no options (its client sends them in its request); its client
      # runs the case's test against the peer.
      if [[ "$name" == qperf-* ]]; then
        t=${name#qperf-}
        if { [ "$side" = a ] && [[ "$name" == *-server ]]; } ||
          { [ "$side" = other ] && [[ "$name" == *-client ]]; }; then
          expect "$(basename "$list") $label ($side): qperf's server" \
            "bash $here/qperf.sh server" "${cmd[*]}"
        else
          expect "$(basename "$list") $label ($side): qperf's test and options" \
            "bash $here/qperf.sh client 10.0.0.9 ${t%%-*} $opts" "${cmd[*]}"
        fi
        continue
      fi
      # The options of the case, all of them, in order.
      expect "$(basename "$list") $label ($side): its options" "1" \
        "$([[ " ${cmd[*]} " == *" ${opts} "* ]] && echo 1 || echo 0)"
    done
  done < <(cases)
done
# The rdma_cm programs' IPv6 cases: each side by its IPv6 address fd00::D, the IPv4 twin's
# program and roles.
for c in "rping6-server|rping -s -a fd00::1 -C 1|rping -c -a fd00::1 -C 1" \
  "rping6-client|rping -c -a fd00::9 -C 1|rping -s -a fd00::3 -C 1" \
  "ucmatose6-server|ucmatose -C 1 -b fd00::1|ucmatose -C 1 -s fd00::1" \
  "ucmatose6-client|ucmatose -C 1 -s fd00::9|ucmatose -C 1 -b fd00::3" \
  "udaddy6-server|udaddy -C 1 -b fd00::1|udaddy -C 1 -s fd00::1" \
  "udaddy6-client|udaddy -C 1 -s fd00::9|udaddy -C 1 -b fd00::3" \
  "cmtime6-server|bash $here/cmtime.sh server fd00::1 -C 1|bash $here/cmtime.sh client fd00::1 -C 1" \
  "cmtime6-client|bash $here/cmtime.sh client fd00::9 -C 1|bash $here/cmtime.sh server fd00::3 -C 1"; do
  IFS="|" read -r name on_a on_other <<<"$c"
  program a "$name" 10.0.0.9 -C 1
  expect "$name (a): by IPv6 address" "$on_a" "${cmd[*]}"
  ip=10.0.0.3 program other "$name" 10.0.0.1 -C 1
  expect "$name (other): by IPv6 address" "$on_other" "${cmd[*]}"
done
expect "an IPv6 case is a cm case" "1" "$(is_cm rping6-client && echo 1 || echo 0)"
expect "cmtime over IPv6 is a cm case" "1" "$(is_cm cmtime6-server && echo 1 || echo 0)"
cmd=(ib_write_bw -d rxe0)
program a no_such_program 10.0.0.9 -s 2
expect "a name without a program: no command, not the previous case's" "0" "${#cmd[@]}"
expect "perftest's latency row" "bytes 2 iters 1000 t_typical-us 5.95 t_avg-us 6.13" "$(summary <<'OUT'
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
 2       1000          5.12           40.31        5.95               6.13           1.20            9.10                   40.31
---------------------------------------------------------------------------------------
OUT
)"
expect "perftest's bandwidth row" "bytes 65536 iters 1000 BW-average-MB/s 48.51" "$(summary <<'OUT'
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      1000             50.02              48.51                0.000776
OUT
)"
expect "qperf's bandwidth line" "qperf bw 24.5 MB/sec" "$(summary <<'OUT'
rc_bw:
    bw  =  24.5 MB/sec
OUT
)"
expect "qperf's latency line" "qperf latency 169 us" "$(summary <<'OUT'
rc_lat:
    latency  =  169 us
OUT
)"
program a qperf-rc_rdma_write_bw-4k-client 10.0.0.9 -cm1 -m 4096
expect "a word between qperf's test and the role" \
  "bash $here/qperf.sh client 10.0.0.9 rc_rdma_write_bw -cm1 -m 4096" "${cmd[*]}"

if [ "$failed" = 0 ]; then
  echo "[roce-selftest] verdict: PASS ($checks checks)"
else
  echo "[roce-selftest] verdict: FAIL ($failed of $checks checks)"
  exit 1
fi
