#!/usr/bin/env bash
# Instructions per data-path operation, counted with valgrind's callgrind (deterministic here,
# unlike wall time): each scenario of tests/bench/ops.rs runs REPS times; callgrind counts only
# inside its `bench_*` function; the script divides by the operations done.
#
#   tests/bench.sh            # prints the table
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install valgrind" >&2; exit 1; }
cargo bench --bench ops --no-run 2>/dev/null
bin=$(ls -t target/release/deps/ops-* | grep -v '\.d$' | head -1)
reps=1000
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# scenario | measured function | operations per call | rdma-core vmw_pvrdma figure | target
# (RC QP; the last row is a UD send, whose WQE carries an address vector)
rows=(
  "post_send_1|bench_post_send_1|1|135|40"
  "post_send_16|bench_post_send_16|16|82.5|25"
  "post_recv_1|bench_post_recv_1|1|129|35"
  "post_recv_16|bench_post_recv_16|16|71.8|20"
  "poll_1|bench_poll_1|1|95|30"
  "poll_16|bench_poll_16|16|58.4|20"
  "poll_empty|bench_poll_empty|1|64|12"
  "post_send_ud_1|bench_post_send_ud_1|1|-|-"
)
printf '%-34s %10s %10s %8s %6s\n' "operation" "instr/op" "rdma-core" "target" "met"
for row in "${rows[@]}"; do
  IFS='|' read -r name fn per ref target <<<"$row"
  valgrind --tool=callgrind --collect-atstart=no --toggle-collect="$fn" \
    --callgrind-out-file="$out/$name" "$bin" "$name" >/dev/null 2>&1
  total=$(awk '/^(summary|totals):/ {print $2; exit}' "$out/$name")
  ops=$((reps * per))
  per_op=$(awk -v t="$total" -v o="$ops" 'BEGIN { printf "%.1f", t / o }')
  met=$(awk -v p="$per_op" -v t="$target" 'BEGIN { print (t == "-") ? "-" : (p <= t) ? "yes" : "no" }')
  case $name in
    post_send_1) label="post_send, 1 WR (1 SGE, signaled)";;
    post_send_16) label="post_send, per WR in 16";;
    post_recv_1) label="post_recv, 1 WR";;
    post_recv_16) label="post_recv, per WR in 16";;
    poll_1) label="poll_cq returning 1";;
    poll_16) label="poll_cq, per CQE in 16";;
    poll_empty) label="poll_cq, empty";;
    post_send_ud_1) label="(UD post_send, 1 WR, with AV)";;
  esac
  printf '%-34s %10s %10s %8s %6s\n' "$label" "$per_op" "$ref" "$target" "$met"
done
