# shellcheck shell=bash
# The NVMe-oF lab on two cores (BAREVERBS_NVMF_SMP=2), sourced by qemu/roce/nvmf.sh once its
# helpers are defined (say_to, console_in, power_off, the counter): the appliance's poll groups
# (docs/percore.md) under Linux's own host, which asks for one I/O queue per CPU.
#
# Linux A boots with two CPUs (nvme-rdma makes no more I/O queues than the host has CPUs);
# Linux B only at the end, counted; the appliance serves one RAM subsystem (its queues spread over the cores; the
# main lab runs the virtio-blk, NVMe and restart steps with the appliance on 2 CPUs, those
# subsystems' queues on CPU 0), and those steps do not run in this mode. Two appliances, one after the other, same configuration, same jobs:
#   smp2: `-smp 2 -accel tcg,thread=multi`; A connects with `nvme connect -i 2`, runs fio
#         randwrite 4k with --verify=crc32c and --numjobs=2 (8 MiB each), the performance runs
#         (randread 4k and randwrite 4k, depth 32, --numjobs=2), three counted randread runs
#         (run k between the marks 000k and 010k), and asks the lab (`nvmf-smp-cores`) to read the
#         appliance's `nvmf-uk cores:` line from its console (`s`) while it is connected;
#   smp1: the same appliance with one CPU, the same connect and jobs (no verify, no cores line);
#   linux: with the counter, Linux B with two CPUs (`-smp 2`, multi-threaded TCG, counted),
#         nvmet-rdma on a RAM disk, the same connect and jobs: the 2-core figure's baseline.
# Each appliance runs under the instruction counter when there is one (its sum over the vCPUs:
# qemu/roce/icount.c), so the IOPS lines of both are taken under the counter too (informative).
# Prints `nvmf smp2 <step>: PASS|FAIL`, `nvmf cores: …` (FAIL when a core served under 30 % of
# the I/O commands or the line is missing), `nvmf randread-4k efficiency smp2: unikernel X
# linux Y ratio r` (both on two vCPUs, summed; each target's median over its three counted
# runs, all printed) with the 1-core appliance's figure beside it (target: 2 cores at most
# 1.10 times 1 core; said, not judged), the IOPS lines, and the verdict.
# BAREVERBS_NVMF_SMP_PROFILE=1 also profiles both appliances' first counted window (the plugin's
# prof=, its blocks summed over the vCPUs) and prints `nvmf profile smp2:` lines: per symbol,
# the instructions per I/O on 2 cores and on 1 core and their difference, the largest
# differences first. The profile's callbacks slow the guests: the IOPS lines of such a run
# are not comparable.
smp_prof() { echo "$cache/nvmf-smp-prof-$1.txt"; }
smp_t0=$(date +%s)
smp_log() { echo "$cache/nvmf-smp-unikernel-$1.log"; }
smp_count() { echo "$cache/nvmf-smp-icount-$1.txt"; }
rm -f "$cache"/nvmf-smp-* "$cache"/nvmf-console-smp*
stage "BAREVERBS_NVMF_SMP=2: Linux A (2 CPUs) against a RAM-only appliance on 2 vCPUs, then on 1${counter:+, then a counted Linux B on 2}; no virtio-blk, NVMe or restart steps in this mode"
smp_linux_a() {
  console_in a > /dev/null
  timeout "$limit" "$qemu" \
    -accel "$accel" -machine q35 -cpu max -smp 2 -m 1024 -nographic -no-reboot \
    -kernel "$cache/kroot/boot/vmlinuz-$kver" -initrd "$cache/initramfs.cpio.gz" \
    -append "console=ttyS0 panic=-1 quiet bvlab.kroot=$cache/kroot bvlab.inner=$here/nvmf-linux.sh bvnvmf.role=a bvnvmf.ip=10.0.0.1 bvnvmf.uk=1 bvnvmf.mib=$mib bvnvmf.perf=$runs bvnvmf.secs=$secs bvnvmf.smp=2 bvnvmf.count=$count_arg" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -netdev "$seg,id=n0" -device virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01,romfile=,rx_queue_size=1024 \
    < "$cache/nvmf-console-a.in" > "$alog" 2>&1 &
  pids+=($!)
  last_pid=$!
}
smp_appliance() { # TAG(smp2|smp1) CPUS
  local name=$1 out=$cache/nvmf-console-$1.out acc=(-accel tcg,thread=multi)
  [ "$accel" = kvm ] && acc=(-accel kvm)
  [ -n "$counter" ] && acc=(-accel tcg,thread=multi -plugin "$counter,out=$(smp_count "$1")${BAREVERBS_NVMF_SMP_PROFILE:+,prof=$(smp_prof "$1"),from=0001,to=0101}")
  rm -f "$out"; mkfifo "$out"
  console_in "$name" > /dev/null
  cat "$out" > "$(smp_log "$1")" &
  readers+=($!)
  timeout "$limit" "$qemu" \
    "${acc[@]}" -smp "$2" -machine q35 -cpu max -m 512M -nodefaults -vga none -display none -no-reboot \
    -serial "pipe:$cache/nvmf-console-$name" -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
    -netdev "$seg,id=nu" -device "$uk_nic",netdev=nu,addr=0x3.0,mac=52:54:00:00:00:02,romfile= \
    -kernel "$uk_kernel" \
    -append "bvnvmf=10.0.0.2/24 bvnvmf.subsys=$nqn_ram bvnvmf.ns=ram:${mib}M bvnvmf.allow=$hostnqn" \
    > "$cache/nvmf-$name.qemu" 2>&1 &
  pids+=($!)
  last_pid=$!
}
# Linux B, counted, two CPUs: nvmet-rdma on a RAM disk (nvmf-linux.sh's role b, no NVMe part),
# the marks on its console.
smp_linux_b() {
  console_in linux > /dev/null
  timeout "$limit" "$qemu" \
    -accel tcg,thread=multi -plugin "$counter,out=$(smp_count linux)" -machine q35 -cpu max -smp 2 -m 1024 -nographic -no-reboot \
    -kernel "$cache/kroot/boot/vmlinuz-$kver" -initrd "$cache/initramfs.cpio.gz" \
    -append "console=ttyS0 panic=-1 quiet bvlab.kroot=$cache/kroot bvlab.inner=$here/nvmf-linux.sh bvnvmf.role=b bvnvmf.ip=10.0.0.3 bvnvmf.uk=1 bvnvmf.mib=$mib bvnvmf.nvme=0 bvnvmf.mark=$counter_mark" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -netdev "$seg,id=n0" -device virtio-net-pci,netdev=n0,mac=52:54:00:00:00:03,romfile=,rx_queue_size=1024 \
    < "$cache/nvmf-console-linux.in" > "$cache/nvmf-smp-linux-b.log" 2>&1 &
  pids+=($!)
  last_pid=$!
}
alog=$cache/nvmf-smp-linux-a.log
stage "booting Linux A (10.0.0.1, 2 CPUs) and the appliance (10.0.0.2, -smp 2, multi-threaded TCG${counter:+, counted}), $("$qemu" --version | head -1), on mcast group port $port"
smp_linux_a
a_pid=$last_pid
smp_appliance smp2 2
cur=smp2 cur_pid=$last_pid stopped='' relayed=0 cores_asked=0
declare -A smp_status=()
deadline=$(( t0 + limit ))
while kill -0 "$a_pid" 2>/dev/null; do
  if [ "$(date +%s)" -ge "$deadline" ]; then stopped="the lab's timeout (${limit} s)"; break; fi
  # The cores line while A is connected: `s` on the console, the line it prints after that.
  if [ "$cores_asked" = 0 ] && grep -a -q "^nvmf-smp-cores" "$alog"; then
    cores_asked=1
    before=$(wc -l < "$(smp_log smp2)")
    say_to smp2 s
    for _ in $(seq 1 100); do
      tail -n +"$((before + 1))" "$(smp_log smp2)" | grep -a -q "^nvmf-uk cores:" && break
      sleep 0.3
    done
    tail -n +"$((before + 1))" "$(smp_log smp2)" | { grep -a "^nvmf-uk cores:" || true; } | head -1 | tr -d '\r' > "$cache/nvmf-smp-cores.txt"
    say_to a "ack cores"
  fi
  # Phase smp1: the 2-core appliance powered off, the 1-core one booted.
  if [ "$cur" = smp2 ] && grep -a -q "^nvmf-smp-next" "$alog"; then
    power_off smp2 "$cur_pid"; smp_status[smp2]=$uk_exit
    stage "booting the appliance again with -smp 1 (same configuration, same jobs)"
    smp_appliance smp1 1
    cur=smp1 cur_pid=$last_pid
    say_to a "ack next"
  fi
  # Phase linux: the 1-core appliance powered off, the counted Linux B booted.
  if [ "$cur" = smp1 ] && grep -a -q "^nvmf-smp-linux" "$alog"; then
    power_off smp1 "$cur_pid"; smp_status[smp1]=$uk_exit
    stage "booting a counted Linux B (10.0.0.3, -smp 2, multi-threaded TCG): nvmet-rdma on a RAM disk, the same jobs"
    smp_linux_b
    cur=linux cur_pid=$last_pid
    say_to a "ack linux"
  fi
  mapfile -t reqs < <({ grep -a "^nvmf-mark " "$alog" || true; } | tr -d '\r')
  while [ "$relayed" -lt ${#reqs[@]} ]; do
    read -r _ _ code <<<"${reqs[$relayed]}"
    relayed=$((relayed + 1))
    if [ "$cur" = linux ]; then say_to linux "mark $code"; else say_to "$cur" "m$code"; fi
    for _ in $(seq 1 100); do grep -q "^mark $code " "$(smp_count "$cur")" 2>/dev/null && break; sleep 0.2; done
    say_to a "ack $code"
  done
  sleep 0.3
done
if [ -n "$stopped" ]; then stage "stopping: $stopped"; else stage "Linux A done"; fi
if [ "$cur" = linux ]; then
  # Linux B serves until stopped (its console takes marks only).
  kill "$cur_pid" 2>/dev/null || true; wait "$cur_pid" 2>/dev/null || true
else
  power_off "$cur" "$cur_pid"; smp_status[$cur]=$uk_exit
fi
for r in "${readers[@]}"; do
  for _ in $(seq 1 10); do kill -0 "$r" 2>/dev/null || break; sleep 0.5; done
  kill "$r" 2>/dev/null || true
done
cleanup

why=()
res() { { grep -a "^nvmf-result $1: " "$alog" || true; } | tail -1 | sed "s/^nvmf-result $1: //" | tr -d '\r'; }
steps=("smp2 discover" "smp2 connect" "smp2 fio-rand4k" "smp1 connect")
[ -n "$counter" ] && steps+=("smp-linux connect")
for s in "${steps[@]}"; do
  r=$(res "$s")
  echo "nvmf $s: ${r:-FAIL (no result)}"
  [[ "$r" == PASS* ]] || why+=("$s")
done
# The cores line: both queues and at least 30 % of the I/O commands on each core.
l=$(cat "$cache/nvmf-smp-cores.txt" 2>/dev/null || true)
if [[ "$l" =~ ^nvmf-uk\ cores:\ 2\ cores,\ I/O\ queues\ ([0-9]+)\+([0-9]+),\ commands\ ([0-9]+)\+([0-9]+)$ ]]; then
  q0=${BASH_REMATCH[1]} q1=${BASH_REMATCH[2]} c0=${BASH_REMATCH[3]} c1=${BASH_REMATCH[4]}
  echo "nvmf cores: 2 cores, I/O queues $q0+$q1, commands $c0+$c1"
  if [ "$q0" != 1 ] || [ "$q1" != 1 ]; then
    echo "nvmf cores: FAIL (I/O queues $q0+$q1 while Linux A was connected with -i 2; 1+1 wanted)"
    why+=("cores: queues")
  elif [ $((c0 + c1)) -eq 0 ] || [ $((c0 * 10)) -lt $((3 * (c0 + c1))) ] || [ $((c1 * 10)) -lt $((3 * (c0 + c1))) ]; then
    echo "nvmf cores: FAIL (a core served under 30 % of the $((c0 + c1)) I/O commands)"
    why+=("cores: balance")
  else
    echo "nvmf cores: PASS (each core served at least 30 % of the I/O commands: $((c0 * 100 / (c0 + c1))) % and $((c1 * 100 / (c0 + c1))) %)"
  fi
else
  echo "nvmf cores: FAIL (no cores line from the appliance's console while Linux A was connected${l:+: '$l'})"
  why+=("cores: no line")
fi
# IOPS: the median of each job's runs on each appliance (informative).
median() { sort -n | awk '{v[NR] = $1} END {if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%d\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
for job in randread-4k randwrite-4k; do
  vals() { { grep -a "^nvmf-perf $job $1 [0-9]" "$alog" || true; } | tr -d '\r' | awk '{print $4}'; }
  m2=$(vals smp2 | median) m1=$(vals smp1 | median) ml=$(vals linux | median)
  if [ -n "$m2" ] && [ -n "$m1" ]; then
    echo "nvmf $job smp2: unikernel 2 cores $m2 IOPS, 1 core $m1 IOPS${ml:+, linux 2 CPUs $ml IOPS} (median of $(vals smp2 | grep -c .) and $(vals smp1 | grep -c .) runs: $(vals smp2 | paste -sd' ') / $(vals smp1 | paste -sd' ')${ml:+ / $(vals linux | paste -sd' ')}; --numjobs=2, depth 32, informative${counter:+, all under the instruction counter})"
  else
    echo "nvmf $job smp2: SKIP (no measurement: 2 cores '${m2}', 1 core '${m1}', runs $runs)"
  fi
done
# Efficiency: instructions per I/O over the window 0001..0101, summed over the vCPUs.
if [ -z "$counter" ]; then
  echo "nvmf randread-4k efficiency smp2: SKIP (no instruction counter: $counter_why)"
else
  # Counted run K of TAG: its I/Os (A's line) and its window (the marks 000K and 010K).
  ios() { { grep -a "^nvmf-count randread-4k $1 [0-9]* $2\b" "$alog" || true; } | tr -d '\r' | awk '{print $4; exit}'; }
  # `<instructions> <I/Os>` of each counted run of TAG that has both.
  runs() {
    local k n w
    for k in 1 2 3; do
      n=$(ios "$1" "$k") w=$(window_count "$(smp_count "$1")" "0$k")
      [ -n "$w" ] && [ "${n:-0}" -gt 0 ] && echo "$w $n"
    done
  }
  i2=$(ios smp2 1) i1=$(ios smp1 1)
  r2=$(runs smp2) r1=$(runs smp1) rl=$(runs linux)
  if [ -n "$r2" ] && [ -n "$r1" ] && [ -n "$rl" ]; then
    # Each target's median instructions per I/O over its counted runs. The 2-core target (at
    # most 1.10 times the 1-core figure) is reported, not a verdict: the figure includes the
    # polls of a core waiting for work, which the host's load moves.
    { sed 's/^/a /' <<<"$r2"; sed 's/^/b /' <<<"$r1"; sed 's/^/l /' <<<"$rl"; } | awk '
      function med(v, n,   i, j, t) {
        for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) {t = v[j]; v[j] = v[j - 1]; v[j - 1] = t}
        return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
      }
      {n[$1]++; v[$1, n[$1]] = $2 / $3; s[$1] = s[$1] sprintf("%s%.0f (%.1fM over %d)", n[$1] > 1 ? ", " : "", $2 / $3, $2 / 1e6, $3)}
      END {
        for (t in n) {delete u; for (i = 1; i <= n[t]; i++) u[i] = v[t, i]; m[t] = med(u, n[t])}
        x = m["a"]; y = m["b"]; z = m["l"]; r = x / y
        printf "nvmf randread-4k efficiency smp2: unikernel %.0f linux %.0f ratio %.2f (2 vCPUs each, summed); 1 core %.0f, 2 cores over 1 core %.3f, target at most 1.10: %s (instructions per I/O, the median of each target'"'"'s counted runs: 2 cores %s; 1 core %s; linux %s; the same jobs, -i 2 and --numjobs=2, on all three)\n",
          x, z, x / z, y, r, (r <= 1.10 ? "met" : "NOT MET"), s["a"], s["b"], s["l"] }'
  else
    echo "nvmf randread-4k efficiency smp2: FAIL (counted runs with a window and I/Os: 2 cores '$(paste -sd, <<<"$r2")', 1 core '$(paste -sd, <<<"$r1")', linux '$(paste -sd, <<<"$rl")')"
    why+=("efficiency smp2")
  fi
fi
# The profile (BAREVERBS_NVMF_SMP_PROFILE): each block's instructions given to the symbol at or
# below its first address, per I/O of its run, the two runs side by side.
if [ -n "${BAREVERBS_NVMF_SMP_PROFILE:-}" ] && [ -s "$(smp_prof smp2)" ] && [ -s "$(smp_prof smp1)" ] &&
  [ "${i2:-0}" -gt 0 ] && [ "${i1:-0}" -gt 0 ] && command -v nm > /dev/null; then
  by_symbol() { # PROF IOS: `<instructions per I/O> <symbol>` lines
    { nm -C -n --defined-only "$uk_kernel" 2>/dev/null |
        awk '$2 ~ /^[tTwW]$/ {a = $1; $1 = ""; $2 = ""; sub(/^ +/, ""); print "S", a, $0}'
      awk '{print "P", $1, $2}' "$1"; } |
      LC_ALL=C sort -k2,2 -k1,1r | awk '$1 == "S" {s = $0; sub(/^S [0-9a-f]+ /, "", s); next}
        {by[s == "" ? "?" : s] += $3} END {for (k in by) print by[k], k}' |
      awk -v n="$2" '{v = $1; $1 = ""; sub(/^ /, ""); printf "%.1f\t%s\n", v / n, $0}'
  }
  by_symbol "$(smp_prof smp2)" "$i2" > "$cache/nvmf-smp-prof-smp2.sym"
  by_symbol "$(smp_prof smp1)" "$i1" > "$cache/nvmf-smp-prof-smp1.sym"
  awk -F '\t' 'FNR == NR {two[$2] = $1; next} {one[$2] = $1}
    END {for (k in two) if (!(k in one)) one[k] = 0
      for (k in one) {d = two[k] - one[k]; t2 += two[k]; t1 += one[k]
        printf "%.1f\t%.1f\t%.1f\t%s\n", d, two[k], one[k], substr(k, 1, 100)}
      printf "TOTAL\t%.1f\t%.1f\n", t2, t1 > "/dev/stderr"}' \
    "$cache/nvmf-smp-prof-smp2.sym" "$cache/nvmf-smp-prof-smp1.sym" 2> "$cache/nvmf-smp-prof-total.txt" |
    sort -t "$(printf '\t')" -k1,1 -gr > "$cache/nvmf-smp-prof-diff.txt"
  read -r _ p2 p1 < "$cache/nvmf-smp-prof-total.txt"
  echo "nvmf profile smp2: instructions per I/O in the profiled windows: 2 cores $p2, 1 core $p1; by symbol (2 cores, 1 core, difference), the largest differences each way:"
  { head -25 "$cache/nvmf-smp-prof-diff.txt"; echo "..."; tail -10 "$cache/nvmf-smp-prof-diff.txt"; } |
    awk -F '\t' '$0 == "..." {print "nvmf profile smp2: ..."; next}
      {printf "nvmf profile smp2: %9.1f %9.1f %+9.1f %s\n", $2, $3, $1, $4}'
  echo "nvmf profile smp2: top symbols on 2 cores:"
  sort -t "$(printf '\t')" -k1,1 -gr "$cache/nvmf-smp-prof-smp2.sym" | head -25 |
    awk -F '\t' '{printf "nvmf profile smp2: %9.1f %s\n", $1, substr($2, 1, 100)}'
fi
for t in smp2 smp1; do
  [ "${smp_status[$t]:-}" = 0 ] || [ "${smp_status[$t]:-}" = 33 ] ||
    { echo "nvmf $t appliance: FAIL (QEMU status ${smp_status[$t]:-none}, 33 wanted)"; why+=("$t exit"); }
done
[ -n "$stopped" ] && why+=("stopped: $stopped")
if [ ${#why[@]} -gt 0 ]; then
  echo "[nvmf] Linux A's log ($alog) ends:"; tail -25 "$alog" | tr -d '\r' | sed 's/^/  /'
  for t in smp2 smp1; do
    echo "[nvmf] the $t appliance's log ends:"; tail -12 "$(smp_log $t)" 2>/dev/null | tr -d '\r' | sed 's/^/  /'
  done
  [ -s "$cache/nvmf-smp-linux-b.log" ] &&
    { echo "[nvmf] Linux B's log ends:"; tail -12 "$cache/nvmf-smp-linux-b.log" | tr -d '\r' | sed 's/^/  /'; }
fi
stage "done (the 2-core mode: $(( $(date +%s) - smp_t0 )) s)"
if [ ${#why[@]} -eq 0 ]; then
  echo "[nvmf] verdict: PASS ($accel, appliance on $nic, -smp 2 and -smp 1, RAM only${counter:+, Linux B on 2 CPUs counted})"
  exit 0
fi
msg=$(printf '%s; ' "${why[@]}")
echo "[nvmf] verdict: FAIL (${msg%; })"
exit 1
