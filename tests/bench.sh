#!/usr/bin/env bash
# Instructions per data-path operation, bareverbs next to rdma-core's vmw_pvrdma provider, in
# one run, counted with valgrind's callgrind (deterministic, unlike wall time).
#
#   tests/bench.sh            # prints the table, then the targets, then the rxe lines
#   tests/bench.sh rxe        # only the software RoCE device's lines (below)
#   tests/bench.sh nvmf       # only the NVMe/RDMA target's lines (tests/nvmf_bench.sh)
#
# bareverbs: each scenario of tests/bench/ops.rs runs REPS times under callgrind, counting only
# inside its bench_<key> function (--toggle-collect); per operation = (Ir(bench_<key>) -
# Ir(bench_empty)) / (REPS x operations per call), operations per call being 16 for the *_16
# keys and 1 otherwise (poll_empty: 1 per call). rdma-core: tests/bench/rdma_core.sh, the same
# scenarios against Debian's build of the provider, the same way.
#
# The device, the same on both sides. Both harnesses give the driver a UAR (the doorbell page)
# of plain memory: rdma-core's harness a zeroed heap page as its context's `uar`, ours the
# model's BAR2 mapped in plain mode (`Model::set_plain_uar`), so a doorbell is a store into
# memory that no device sees (on our side behind the one pointer test with which the HAL's one
# MMIO type tells that page from the model's register BAR: 3 instructions and the store; the
# model's other branch, never taken here, calls the model through a trampoline that preserves
# every register, so the driver's code is compiled as around a store to hardware, not around a
# call the compiler would save registers for). Both
# harnesses check the doorbell word written after every measured call, outside the count, and
# play the device between calls: rdma-core's marks the WQEs consumed and writes the CQEs; ours
# rings the model's doorbell itself (`Model::doorbell`), so the model executes what was posted,
# or puts CQEs in place (`Model::inject_cqe`).
#
# Fairness. rdma-core's harness calls the provider, a separate function, from bench_<key>; the
# Rust bench_<key> functions have the driver inlined, as an application does. rdma_core.sh's
# figures therefore still include the call made around the provider (argument set-up, the
# call, stack alignment: 5 instructions per call). This script takes that overhead off: it reads
# the self cost of each rdma-core bench_<key> from rdma_core.sh's callgrind output (not an
# assumed number) and subtracts what it exceeds the `empty` function by. Both columns then count
# the operation's own instructions with its function frame (pushes, pops) and nothing of the
# harness; the one difference left is rdma-core's `ret` (counted) against bareverbs' (taken off
# with `empty`, a bare `ret`): at most 1 instruction per call, 1/16 per op for the *_16 keys.
#
# Output, one line per key, in this order:
#   bench <key> <bareverbs instr/op> <rdma-core instr/op or -> <ratio or ->
# ratio = bareverbs / rdma-core; for the safe_* keys (no rdma-core counterpart) the ratio is
# safe / raw (safe_post_send_1 / post_send_1, safe_post_recv_1 / post_recv_1,
# safe_poll_1 / poll_1). Then `target <key> <bareverbs instr/op> met|not met` for the keys
# with a target (bounds: TARGETS below; each safe key <= 1.25 x its raw key).
#
# The Rust bench is built with line tables (for callgrind_annotate; same code) into
# target/callgrind/, so ordinary `cargo bench` builds are left alone. Needs valgrind; without
# rdma-core's packages (see rdma_core.sh) the rdma-core column is `-`.
#
# The software RoCE device (tests/bench/rxe.rs): two rxe devices over an in-memory link that
# builds each frame in place and copies it once out, as the virtio-net link does; every call on
# the requester's device runs inside bench_req, every call on the responder's inside
# bench_resp, and each scenario runs under callgrind once per side, counting only inside that
# side's function
# (--toggle-collect: the two sides interleave in one run, and the call tree, not the clock,
# says whose an instruction is). Two builds: `guest`, the bench as the example kernel is built
# (the driver crates at opt-level "z", one codegen unit, LTO; the kernel's own memcpy, memmove
# and memset, platform/src/cmem.rs, linked in: tests/bench/rxe_guest.rs), into
# target/callgrind-guest/; and `o3`, the bench profile as it is (opt-level 3, the C library's
# memory functions). Lines, per build:
#   bench rxe_<op>_<side>_<mtu> <build> <instr/B> <floor instr/B>
# op send, write or read of 64 KiB at path MTU 1024 or 4096, side req or resp, instructions
# per payload byte over 8 messages (after one uncounted); the floor, measured in the same run
# (bench_floor): the same 64 KiB in packets of the MTU's size, each copied once with the
# build's memcpy and CRC-checked with the best algorithm the machine has (crc32fast:
# PCLMULQDQ folding where the CPU has it), per byte.
#   bench rxe_send64_msg <build> <instr>
# 64-byte SENDs, both sides (the responder's receive posted, the SEND posted, both devices
# polled until the requester's completion and the receive's), per message, over 256 messages.
# Then `target <key> guest <value> met|not met` for the guest build's lines (bounds:
# RXE_TARGETS below).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install valgrind" >&2; exit 1; }

reps=1000 # REPS in tests/bench/ops.rs and rdma_core_harness.c
keys=(post_send_1 post_send_16 post_recv_1 post_recv_16 poll_1 poll_16 poll_empty
  post_send_ud_1 write_16 safe_post_send_1 safe_post_recv_1 safe_poll_1)
# Upper bounds, instructions per operation (the safe keys: 1.25 x their raw key).
declare -A TARGETS=([post_send_1]=40 [post_send_16]=20 [post_recv_1]=30 [post_recv_16]=12
  [poll_1]=30 [poll_16]=15 [poll_empty]=10)
declare -A RAW_OF=([safe_post_send_1]=post_send_1 [safe_post_recv_1]=post_recv_1
  [safe_poll_1]=poll_1)
SAFE_FACTOR=1.25

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# ---- The software RoCE device (tests/bench/rxe.rs), printed last. ----
rxe_keys=(send_1024 write_1024 read_1024 send_4096 write_4096 read_4096)
rxe_bytes=$((8 * 65536)) # REPS x MSG in tests/bench/rxe.rs
rxe_msgs=256             # SMALL_REPS in tests/bench/rxe.rs
# Upper bounds for the guest build: instructions per payload byte by MTU, per small SEND.
declare -A RXE_TARGETS=([1024]=3 [4096]=1.5 [msg]=3000)
# Builds the rxe bench for build $1 (guest or o3); prints the executable's path.
rxe_build() {
  local target=rxe dir=target/callgrind cfg=()
  if [ "$1" = guest ]; then
    target=rxe_guest dir=target/callgrind-guest
    cfg=(--config 'profile.bench.lto=true'
      --config 'profile.bench.package.bareverbs.opt-level="z"'
      --config 'profile.bench.package.bareverbs.codegen-units=1'
      --config 'profile.bench.package.bareverbs-hal.opt-level="z"')
  fi
  CARGO_TARGET_DIR=$dir CARGO_PROFILE_BENCH_DEBUG=line-tables-only \
    cargo bench --bench "$target" --no-run --message-format=json "${cfg[@]}" 2>"$out/cargo-$1.err" |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1
}
# Instructions inside bench_$2 (req, resp or floor) of scenario $3 of executable $1.
rxe_count() {
  local f
  f=$out/rxe.$(basename "$1").$3.$2
  valgrind --tool=callgrind --collect-atstart=no --toggle-collect="bench_$2" \
    --callgrind-out-file="$f" "$1" "$3" >/dev/null 2>"$f.log" ||
    { cat "$f.log" >&2; echo "bench.sh: valgrind failed on rxe $3 ($2)" >&2; exit 1; }
  awk '/^(summary|totals):/ { print $2; exit }' "$f"
}
rxe_bench() {
  local build bin mtu n v req resp name targets=()
  local -A floor
  for build in guest o3; do
    bin=$(rxe_build $build) || true
    [ -n "$bin" ] && [ -x "$bin" ] || { cat "$out/cargo-$build.err" >&2; echo "bench.sh: rxe $build build failed" >&2; exit 1; }
    "$bin" all >/dev/null || { echo "bench.sh: the rxe scenarios' self-check failed ($build)" >&2; exit 1; }
    for mtu in 1024 4096; do
      n=$(rxe_count "$bin" floor "floor_$mtu")
      floor[$mtu]=$(awk -v n="$n" -v b=$rxe_bytes 'BEGIN { printf "%.2f", n / b }')
    done
    for key in "${rxe_keys[@]}"; do
      for side in req resp; do
        n=$(rxe_count "$bin" $side "$key")
        v=$(awk -v n="$n" -v b=$rxe_bytes 'BEGIN { printf "%.2f", n / b }')
        name=rxe_${key%_*}_${side}_${key#*_}
        echo "bench $name $build $v ${floor[${key#*_}]}"
        [ $build = guest ] && targets+=("$name $v ${RXE_TARGETS[${key#*_}]}")
      done
    done
    req=$(rxe_count "$bin" req send64)
    resp=$(rxe_count "$bin" resp send64)
    v=$(awk -v a="$req" -v b="$resp" -v m=$rxe_msgs 'BEGIN { printf "%.0f", (a + b) / m }')
    echo "bench rxe_send64_msg $build $v"
    [ $build = guest ] && targets+=("rxe_send64_msg $v ${RXE_TARGETS[msg]}")
  done
  echo "# rxe targets, guest build: instructions per payload byte <= ${RXE_TARGETS[1024]} at MTU 1024, <= ${RXE_TARGETS[4096]} at 4096; per 64-byte SEND <= ${RXE_TARGETS[msg]}"
  for t in "${targets[@]}"; do
    read -r name v bound <<<"$t"
    echo "target $name guest $v $(awk -v v="$v" -v b="$bound" 'BEGIN { print (v <= b) ? "met" : "not met" }')"
  done
}
if [ "${1:-}" = rxe ]; then
  rxe_bench
  exit 0
fi
if [ "${1:-}" = nvmf ]; then
  exec tests/nvmf_bench.sh
fi

# rdma-core, in the background while ours run (its own build and callgrind runs).
RDMA_CORE_BENCH_DIR=$out/rdma-core tests/bench/rdma_core.sh >"$out/rdma-core.txt" 2>"$out/rdma-core.err" &
rc_pid=$!

export CARGO_TARGET_DIR=target/callgrind CARGO_PROFILE_BENCH_DEBUG=line-tables-only
bin=$(cargo bench --bench ops --no-run --message-format=json 2>"$out/cargo.err" |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1) || true
[ -n "$bin" ] && [ -x "$bin" ] || { cat "$out/cargo.err" >&2; echo "bench.sh: build failed" >&2; exit 1; }
"$bin" all >/dev/null || { echo "bench.sh: the scenarios' self-check failed" >&2; exit 1; }

# Total Ir counted inside bench_<key> of callgrind output $1.
total() { awk '/^(summary|totals):/ { print $2; exit }' "$1"; }
# Ir of function $2's own instructions (callees excluded) in callgrind output $1.
self_ir() {
  callgrind_annotate --inclusive=no --threshold=100 "$1" 2>/dev/null |
    awk -v f="$2" '{ for (i = 1; i <= NF; i++) if ($i ~ ("(^|:)" f "$")) { gsub(",", "", $1); print $1; exit } }'
}
per_call() { case $1 in *_16) echo 16 ;; *) echo 1 ;; esac; }

declare -A ours theirs
for key in empty "${keys[@]}"; do
  valgrind --tool=callgrind --collect-atstart=no --toggle-collect="bench_$key" \
    --callgrind-out-file="$out/$key" "$bin" "$key" >/dev/null 2>"$out/$key.log" ||
    { cat "$out/$key.log" >&2; echo "bench.sh: valgrind failed on $key" >&2; exit 1; }
  ours[$key]=$(total "$out/$key")
  [ -n "${ours[$key]}" ] || { echo "bench.sh: no callgrind total for $key" >&2; exit 1; }
done

bounds=
for key in "${keys[@]}"; do
  if [ -n "${RAW_OF[$key]:-}" ]; then
    bounds+=" $key<=${SAFE_FACTOR}x${RAW_OF[$key]}"
  elif [ -n "${TARGETS[$key]:-}" ]; then
    bounds+=" $key<=${TARGETS[$key]}"
  fi
done
echo "# targets, instructions per operation:$bounds"
rc_ok=1 overheads=()
wait "$rc_pid" || rc_ok=0
if [ $rc_ok = 1 ]; then
  rc_dir=$(ls -d "$out"/rdma-core/*/callgrind 2>/dev/null | head -1)
  rc_empty=$(total "$rc_dir/empty")
  while read -r tag key value; do
    [ "$tag" = rdma-core ] && [ "$key" != empty ] || continue
    per=$(per_call "$key")
    self=$(self_ir "$rc_dir/$key" "bench_$key")
    [ -n "$self" ] || { echo "bench.sh: no self cost of rdma-core bench_$key" >&2; exit 1; }
    theirs[$key]=$(awk -v v="$value" -v s="$self" -v e="$rc_empty" -v o=$((reps * per)) \
      'BEGIN { printf "%.1f", v - (s - e) / o }')
    overheads+=("$(awk -v s="$self" -v e="$rc_empty" -v r=$reps 'BEGIN { printf "%g", (s - e) / r }')")
  done <"$out/rdma-core.txt"
  overhead=$(printf '%s\n' "${overheads[@]}" | sort -un | paste -sd/)
  echo "# rdma-core: minus its harness's call overhead, $overhead instructions per call (measured)"
else
  echo "# rdma-core: not measured ($(tail -1 "$out/rdma-core.err" 2>/dev/null))"
fi

declare -A fig
for key in "${keys[@]}"; do
  fig[$key]=$(awk -v t="${ours[$key]}" -v e="${ours[empty]}" -v o=$((reps * $(per_call "$key"))) \
    'BEGIN { printf "%.1f", (t - e) / o }')
done
for key in "${keys[@]}"; do
  if [ -n "${RAW_OF[$key]:-}" ]; then
    rc=- ratio=$(awk -v a="${fig[$key]}" -v b="${fig[${RAW_OF[$key]}]}" 'BEGIN { printf "%.2f", a / b }')
  elif [ -n "${theirs[$key]:-}" ]; then
    rc=${theirs[$key]} ratio=$(awk -v a="${fig[$key]}" -v b="$rc" 'BEGIN { printf "%.2f", a / b }')
  else
    rc=- ratio=-
  fi
  echo "bench $key ${fig[$key]} $rc $ratio"
done
echo "# safe ratios are safe/raw"
for key in "${keys[@]}"; do
  if [ -n "${RAW_OF[$key]:-}" ]; then
    bound=$(awk -v r="${fig[${RAW_OF[$key]}]}" -v f=$SAFE_FACTOR 'BEGIN { print r * f }')
  elif [ -n "${TARGETS[$key]:-}" ]; then
    bound=${TARGETS[$key]}
  else
    continue
  fi
  met=$(awk -v v="${fig[$key]}" -v b="$bound" 'BEGIN { print (v <= b) ? "met" : "not met" }')
  echo "target $key ${fig[$key]} $met"
done
rxe_bench
# The NVMe/RDMA target's instructions per I/O (its own script), last.
tests/nvmf_bench.sh
