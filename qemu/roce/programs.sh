# shellcheck shell=bash
# The Linux side's programs of the RoCE lab, sourced by qemu/roce/linux.sh in the Linux guests
# (and by qemu/roce/verdict-selftest.sh on the host): the command of each case, perftest's
# summary row, the case list with its labels. Needs $gid (the GID index of the guest's
# IPv4-mapped RoCE v2 GID), $gid6 (its IPv6 one's, for the cases rc6-*, ud6-* and perftest's
# *-v6-*), $ip (its address), $only (case names, space-separated; empty:
# all) and $cases_file. The rdma_cm programs' IPv6 cases (rping6-*, ucmatose6-*, udaddy6-*,
# cmtime6-*) name each side by its IPv6 address, fd00::D (D the last byte of its IPv4 address,
# as linux.sh gives it; the unikernel's fd00::2).

# perftest's result row, labelled by its header: a bandwidth program's average (its 4th
# column, "BW average[MB/sec]"), a latency program's typical and average round trip (the
# columns under "t_typical[usec]" and "t_avg[usec]"; perftest's latency is half of it for
# ib_send_lat and ib_write_lat, as it prints it). qperf's: its first result line (`bw  =
# 12.3 MB/sec`, `latency  =  45.6 us`) as `qperf bw 12.3 MB/sec`.
summary() {
  awk '/^ *(bw|latency|msg_rate) += / { print "qperf " $1 " " $3 " " $4; exit }
    /#bytes/ { h = 1; lat = 0
      for (i = 1; i <= NF; i++) { if ($i ~ /^t_typical/) lat = i; if ($i ~ /^t_avg/) avg = i }
      next }
    h && NF >= 4 && $1 ~ /^[0-9]+$/ {
      if (lat) print "bytes " $1 " iters " $2 " t_typical-us " $lat " t_avg-us " $avg
      else print "bytes " $1 " iters " $2 " BW-average-MB/s " $4
      exit }'
}

# The program each side runs for a case: Linux A's role is the case's name.
program() { # SIDE(a|other) CASE PEER_IP OPTIONS...  -> sets cmd[] and client
  local side=$1 name=$2 peer=$3
  shift 3
  local server=1 g=$gid me=$ip
  cmd=()
  # The rdma_cm programs' IPv6 cases: both addresses IPv6, the program's name without the 6.
  case "$name" in
    rping6-* | ucmatose6-* | udaddy6-* | cmtime6-*)
      me=$(printf 'fd00::%x' "${ip##*.}") peer=$(printf 'fd00::%x' "${peer##*.}")
      name=${name/6-/-} ;;
  esac
  case "$name" in rc6-* | ud6-* | *-v6-*) g=$gid6 ;; esac
  case "$name" in
    rc-server | ud-server | write | *-server) [ "$side" = a ] && server=1 || server=0 ;;
    *) [ "$side" = a ] && server=0 || server=1 ;;
  esac
  case "$name" in
    rc-* | rc6-*) cmd=(ibv_rc_pingpong -d rxe0 -g "$g" "$@") ;;
    ud-* | ud6-*) cmd=(ibv_ud_pingpong -d rxe0 -g "$g" "$@") ;;
    write) cmd=(ib_write_bw -d rxe0 -x "$gid" "$@") ;;
    read) cmd=(ib_read_bw -d rxe0 -x "$gid" "$@") ;;
    atomic) cmd=(ib_atomic_bw -d rxe0 -x "$gid" "$@") ;;
    # perftest's programs by name (a word between the program and the role tells cases of
    # one program apart): bandwidth and latency, with -R rdma_cm for the control channel and
    # the data QP (the GID only names the one the program prints as its own).
    ib_send_bw-* | ib_write_bw-* | ib_read_bw-* | ib_atomic_bw-* | \
    ib_send_lat-* | ib_write_lat-* | ib_read_lat-* | ib_atomic_lat-*)
      cmd=("${name%%-*}" -d rxe0 -x "$g" "$@") ;;
    # rdma_cm finds the device and the GID from the addresses.
    rping-*) [ "$server" = 1 ] && cmd=(rping -s -a "$me" "$@") || cmd=(rping -c -a "$peer" "$@") ;;
    ucmatose-* | udaddy-*)
      cmd=("${name%%-*}" "$@")
      [ "$server" = 1 ] && cmd+=(-b "$me") || cmd+=(-s "$peer") ;;
    # cmtime through qemu/roce/cmtime.sh: its server never exits by itself, its client exits
    # 0 even with connections refused (the script says what both did).
    cmtime-*)
      [ "$server" = 1 ] && cmd=(bash "$here/cmtime.sh" server "$me" "$@") ||
        cmd=(bash "$here/cmtime.sh" client "$peer" "$@") ;;
    # mckey: both sides join the group of -m from their own address; the client sends (-s),
    # the server receives (mckey's own words for its roles).
    mckey-*)
      cmd=(mckey)
      [ "$server" = 1 ] || cmd+=(-s)
      cmd+=("$@" -b "$ip") ;;
    # qperf: the case's name is qperf-TEST-ROLE (qperf-rc_bw-client; a word may come between, as
    # with perftest: qperf-rc_bw-4k-client); through qemu/roce/qperf.sh
    # (qperf's server runs until a client's `quit`; the client sends it after its test).
    qperf-*)
      local t=${name#qperf-}
      t=${t%%-*}
      [ "$server" = 1 ] && cmd=(bash "$here/qperf.sh" server) ||
        cmd=(bash "$here/qperf.sh" client "$peer" "$t" "$@") ;;
    # No program for this name: the case fails as such (cmd stays empty), it never runs
    # another case's program.
    *) ;;
  esac
  client=$((1 - server))
  if [ "$client" = 1 ] && [ ${#cmd[@]} -gt 0 ] &&
     [[ "$name" != rping-* && "$name" != ucmatose-* && "$name" != udaddy-* && "$name" != cmtime-* &&
        "$name" != mckey-* && "$name" != qperf-* ]]; then
    cmd+=("$peer")
  fi
  return 0
}

# The cases as "LABEL NAME OPTIONS": the label is the name, and NAME#K for its K-th case when
# one name has several (two `write` lines with other sizes are two results; lab.sh labels
# them the same way).
cases() {
  local -A seen=()
  local label name opts
  while read -r name opts; do
    case "$name" in '' | '#'*) continue ;; esac
    [ -z "$only" ] || [[ " $only " == *" $name "* ]] || continue
    seen[$name]=$(( ${seen[$name]:-0} + 1 ))
    label=$name
    [ "${seen[$name]}" = 1 ] || label="$name#${seen[$name]}"
    echo "$label $name $opts"
  done < "$cases_file"
}
