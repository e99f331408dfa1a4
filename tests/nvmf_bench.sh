#!/usr/bin/env bash
# The NVMe/RDMA target's instructions per I/O on the model, counted with valgrind's callgrind
# (deterministic, unlike wall time); tests/bench.sh runs it last.
#
#   tests/nvmf_bench.sh
#
# nvmf/benches/target.rs: a bareverbs-nvmf host on software RoCE device A, the appliance's
# target (14 queues of 64 commands, 2 I/O queues a controller, a CM of 28 entries, a RAM disk)
# on device B, on an in-memory wire that builds each frame in place and copies it once out (as
# the virtio-net link). The target runs in the appliance's loop shape (poll and counts while a
# poll finds work, then one idle poll, then the host's turn); callgrind counts only inside
# bench_target, the target's round: its poll (the CM's events, its completions, its device's
# progress: the frames received, the transport, the frames sent) and its counts, nothing of
# the host's or the harness's. Built with line tables (for callgrind_annotate; same code)
# into target/callgrind/, as tests/bench.sh's. Lines:
#   nvmf-bench <scenario>: target <instr> instructions per I/O (poll rounds <M>, idle polls <K>)
# for randread-4k (QD 32), randwrite-4k (QD 32) and seqread-128k (QD 8): the count over the
# counted I/Os (after a warm-up of one queue depth), M the target's rounds in the count, K
# those that found nothing; then
#   nvmf-bench idle: target <instr> instructions per idle poll (<K> polls, 3 queues connected)
# what one round that finds nothing costs (the appliance makes such rounds between I/Os; the
# NVMe-oF lab's count per I/O holds them too).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install valgrind" >&2; exit 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bin=$(CARGO_TARGET_DIR=target/callgrind CARGO_PROFILE_BENCH_DEBUG=line-tables-only \
  cargo bench -p bareverbs-nvmf --bench target --no-run --message-format=json 2>"$out/cargo.err" |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1) || true
[ -n "$bin" ] && [ -x "$bin" ] || { cat "$out/cargo.err" >&2; echo "nvmf_bench.sh: build failed" >&2; exit 1; }
"$bin" all >/dev/null || { echo "nvmf_bench.sh: the scenarios' self-check failed" >&2; exit 1; }

for s in randread-4k randwrite-4k seqread-128k idle; do
  f=$out/$s
  valgrind --tool=callgrind --collect-atstart=no --toggle-collect=bench_target \
    --callgrind-out-file="$f" "$bin" "$s" >"$f.txt" 2>"$f.log" ||
    { cat "$f.log" >&2; echo "nvmf_bench.sh: valgrind failed on $s" >&2; exit 1; }
  n=$(awk '/^(summary|totals):/ { print $2; exit }' "$f")
  [ -n "$n" ] || { echo "nvmf_bench.sh: no callgrind total for $s" >&2; exit 1; }
  read -r _ _ ios _ rounds _ idle <"$f.txt"
  if [ "$s" = idle ]; then
    echo "nvmf-bench idle: target $(awk -v n="$n" -v k="$idle" 'BEGIN { printf "%.0f", n / k }') instructions per idle poll ($idle polls, 3 queues connected)"
  else
    echo "nvmf-bench $s: target $(awk -v n="$n" -v k="$ios" 'BEGIN { printf "%.0f", n / k }') instructions per I/O (poll rounds $rounds, idle polls $idle)"
  fi
  [ -n "${NVMF_BENCH_KEEP:-}" ] && cp "$f" "$NVMF_BENCH_KEEP.$s"
done
exit 0
