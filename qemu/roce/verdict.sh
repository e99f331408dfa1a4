# shellcheck shell=bash
# The RoCE lab's bookkeeping (qemu/roce/lab.sh), sourced: the cases' labels, each case's results
# in the logs, and the lines the lab prints for a case. qemu/roce/verdict-selftest.sh runs it
# on a crafted case list and crafted logs. Needs $cases_file (the case list), $alog (Linux A's
# log: `bvroce-result <phase> <label>: exit S | summary` lines from qemu/roce/linux.sh) and
# $ulog (the unikernel's: one `roce-uk <name>: ok|FAIL|REFUSED …` line per case, in order).
#
# A case's label is its name, and NAME#K for the K-th case of a name that has several: two
# `write` lines with other sizes are two results (`write`, `write#2`), never merged. linux.sh
# labels its results the same way; the unikernel prints the name only, so the K-th line of a
# name in its log is the K-th case of that name.

# The case lines (no comments, no blank lines).
case_lines() { grep -v -E '^[[:space:]]*(#|$)' "$cases_file" || true; }
# The labels of the cases whose names match ONLY-RE (all when empty), in order.
case_labels() { # [ONLY-RE]
  case_lines | awk '{print $1}' | { grep -x -E "${1:-.*}" || true; } |
    awk '{c[$1]++; print (c[$1] > 1 ? $1 "#" c[$1] : $1)}'
}
label_name() { echo "${1%%#*}"; }
label_k() { if [[ "$1" == *#* ]]; then echo "${1##*#}"; else echo 1; fi; }
# The case line ("NAME OPTIONS") of a label.
case_of() { # LABEL
  case_lines | awk -v n="$(label_name "$1")" -v k="$(label_k "$1")" '$1 == n && ++c == k {print; exit}'
}
# The payload bytes of a perftest case: -s × -n (perftest's defaults 65536 and 5000).
case_bytes() { # LABEL
  case_of "$1" | awk '{s = 65536; i = 5000
    for (k = 2; k < NF; k++) { if ($k == "-s") s = $(k + 1); if ($k == "-n") i = $(k + 1) }
    print s * i}'
}
# The rdma_cm programs' cases (connected through the CM, perftest's -R ones too, and mckey's
# multicast, joined through rdma_cm on Linux) are counted apart: `cm <label>`.
is_cm() { # LABEL
  local n
  n=$(label_name "$1")
  [[ "$n" == rping-* || "$n" == ucmatose-* || "$n" == udaddy-* || "$n" == cmtime-* ||
    "$n" == mckey-* || "$n" == rping6-* || "$n" == ucmatose6-* || "$n" == udaddy6-* || "$n" == cmtime6-* ]] &&
    return 0
  [[ "$n" == ib_*-* ]] && [[ " $(case_of "$1") " == *" -R "* ]]
}
# Linux A's result of a case in a phase (linux-linux, roce, bench-…): "exit S | summary", or
# another word for a case it did not run (`no program …`); empty when there is no line.
result() { # TAG
  { grep -a "^bvroce-result $1: " "$alog" || true; } | tail -1 | sed "s/^bvroce-result $1: //" | tr -d '\r'
}
# The unikernel's result of a case: its K-th line for the name ("ok …", "FAIL …", "REFUSED …").
uk_result() { # LABEL
  local n
  n=$(label_name "$1")
  { grep -a "^roce-uk $n: " "$ulog" 2>/dev/null || true; } | sed -n "$(label_k "$1")p" |
    sed "s/^roce-uk $n: //" | tr -d '\r'
}
# The line of a baseline case; status 0 when it passed.
baseline_line() { # LABEL
  local r
  r=$(result "linux-linux $1")
  case "$r" in
    "exit 0"*) echo "linux-linux $1: PASS ${r#exit 0 | }"; return 0 ;;
    *) echo "linux-linux $1: FAIL (${r:-no result})"; return 1 ;;
  esac
}
# The line of a case against the unikernel (`roce <label>: …`, or `cm <label>: …`); status 0
# when it passed. A case the unikernel refused is REFUSED, not passed.
uk_line() { # LABEL
  local n=$1 r u tag=roce
  r=$(result "roce $n") u=$(uk_result "$n")
  is_cm "$n" && tag=cm
  if [[ "$r" == "exit 0"* ]] && [[ "$u" == "ok "* ]]; then
    if [ "$tag" = cm ]; then
      echo "cm $n: PASS (${u#ok }; linux: exit 0)"
    else
      echo "roce $n: PASS (linux: ${r#exit 0 | }; unikernel: ${u#ok })"
    fi
    return 0
  fi
  if [[ "$u" == "REFUSED "* ]]; then
    echo "$tag $n: REFUSED (unikernel: ${u#REFUSED }; linux: ${r:-no result})"
  else
    echo "$tag $n: FAIL (linux: ${r:-no result}; unikernel: ${u:-no result})"
  fi
  return 1
}
# A latency program's round trip from Linux A's result: perftest's typical and average (us).
lat_of() { # RESULT -> "TYPICAL AVG", or nothing
  sed -n 's/^exit 0 | .* t_typical-us \([0-9.]*\) t_avg-us \([0-9.]*\).*/\1 \2/p' <<<"$1"
}
# `roce latency <label>: unikernel X us linux Y us`, for a latency program's case (ib_*_lat-*):
# the typical round trip perftest printed on Linux A, against the unikernel and against Linux
# B; n/a with the reason for a side without one (against the unikernel: unless its side of the
# case passed too).
latency_line() { # LABEL
  local n=$1 side r v why=() u=n/a l=n/a
  [[ "$(label_name "$n")" == ib_*_lat-* ]] || return 0
  for side in roce linux-linux; do
    r=$(result "$side $n")
    v=$(lat_of "$r")
    if [ -z "$r" ]; then
      why+=("$side: no result")
    elif [[ "$r" != "exit 0"* ]]; then
      why+=("$side: the case failed")
      v=
    elif [ -z "$v" ]; then
      why+=("$side: no latency row in Linux A's output")
    elif [ "$side" = roce ] && [[ "$(uk_result "$n")" != "ok "* ]]; then
      # Linux's figure counts only when the unikernel's side of the case passed too.
      why+=("roce: the unikernel's side did not pass")
      v=
    fi
    [ -n "$v" ] || continue
    [ "$side" = roce ] && u="${v%% *} us" || l="${v%% *} us"
  done
  if [ ${#why[@]} -gt 0 ]; then
    echo "roce latency $n: unikernel $u linux $l ($(printf '%s; ' "${why[@]}" | sed 's/; $//'))"
  else
    echo "roce latency $n: unikernel $u linux $l (typical, as perftest prints it)"
  fi
}
# `roce efficiency <label>[ <nic>]`: instructions per payload byte of the unikernel (U) and Linux
# B (L) over the case's window, BYTES of payload; n/a with the reason when either side of the
# case failed (FAILED: which; the window of a failed case measures no whole run) or a window
# lacks a mark.
efficiency_line() { # LABEL+TAG FAILED U L BYTES
  local n=$1 failed=$2 u=$3 l=$4 b=$5
  if [ -n "$failed" ]; then
    echo "roce efficiency $n: n/a (the case failed: $failed)"
  elif [ -n "$u" ] && [ -n "$l" ] && [ "$l" != 0 ] && [ -n "$b" ] && [ "$b" != 0 ]; then
    awk -v n="$n" -v u="$u" -v l="$l" -v b="$b" 'BEGIN {
      printf "roce efficiency %s: unikernel %.2f linux %.2f ratio %.2f (%.1fM and %.1fM instructions over %d bytes)\n",
        n, u / b, l / b, u / l, u / 1e6, l / 1e6, b }'
  else
    echo "roce efficiency $n: n/a (a window without both marks: unikernel ${u:--}, linux ${l:--})"
  fi
}
