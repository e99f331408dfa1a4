#!/usr/bin/env bash
# Instructions per data-path operation of rdma-core's vmw_pvrdma userspace provider, counted with
# valgrind's callgrind like tests/bench.sh counts ours, so both can be printed side by side.
#
#   tests/bench/rdma_core.sh      # prints `rdma-core <key> <instructions per operation>` lines
#
# The provider is Debian's own build of it: libibverbs-dev ships the provider's object code as
# a static archive (libvmw_pvrdma-rdmav*.a). This script links that archive's qp.c.o and cq.c.o
# with tests/bench/rdma_core_harness.c, which fakes the QP, CQ and UAR in plain memory (see its
# header), checks the result natively, then runs each scenario REPS times under callgrind,
# counting only inside bench_<key>. Per operation = (total - empty total) / (REPS x operations
# per call): 16 for the *_16 keys, 1 otherwise (poll_empty: 1 per call). The `empty` line gives
# the subtracted per-call overhead itself. What stays counted besides the provider is the
# call into it from bench_<key> (argument set-up, the call, stack alignment: 5 instructions
# per call).
#
# Missing packages (build-essential, dpkg-dev, valgrind, libibverbs-dev) are installed with
# apt-get (as root). Objects and build output go to target/rdma-core-bench/ (or
# $RDMA_CORE_BENCH_DIR), which git ignores.
set -euo pipefail
cd "$(dirname "$0")/../.."
die() {
  echo "rdma_core.sh: $*" >&2
  exit 1
}

reps=1000 # REPS in rdma_core_harness.c
keys=(post_send_1 post_send_16 post_recv_1 post_recv_16 poll_1 poll_16 poll_empty post_send_ud_1 write_16)
src=tests/bench/rdma_core_harness.c
[ -f "$src" ] || die "$src not found"

# Packages.
packages=(build-essential dpkg-dev valgrind libibverbs-dev)
missing=()
for p in "${packages[@]}"; do
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "missing packages: ${missing[*]} (apt-get install them as root)"
  echo "rdma_core.sh: installing ${missing[*]}" >&2
  apt-get update -qq >&2 || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
    die "apt-get install ${missing[*]} failed"
fi

# Debian's provider objects.
version=$(dpkg-query -W -f='${Version}' libibverbs-dev)
archive=$(dpkg -L libibverbs-dev | grep -E '/libvmw_pvrdma-rdmav[0-9]+\.a$' | head -1) ||
  die "libibverbs-dev $version ships no libvmw_pvrdma-rdmav*.a"
work=${RDMA_CORE_BENCH_DIR:-target/rdma-core-bench}/$version
mkdir -p "$work/obj" "$work/callgrind"
objs=()
for m in qp.c.o cq.c.o; do
  ar t "$archive" | grep -x "$m" >/dev/null || die "$archive has no member $m"
  (cd "$work/obj" && ar x "$archive" "$m") || die "cannot extract $m from $archive"
  objs+=("$work/obj/$m")
done
# The provider's global symbols carry rdma-core's version prefix (rdmacore44_0_pvrdma_post_send).
prefix=$(nm --defined-only "${objs[@]}" | awk '$3 ~ /pvrdma_post_send$/ { sub(/pvrdma_post_send$/, "", $3); print $3; exit }')
[ -n "$prefix" ] || die "no pvrdma_post_send in $archive"
# Every other rdma-core symbol the two objects name (ibv_cmd_*, buffer allocation, CQ cleaning)
# is off the data path: bind it to the harness's abort.
defsyms=()
while read -r sym; do
  defsyms+=("-Wl,--defsym=$sym=harness_unexpected_call")
done < <(comm -23 \
  <(nm -u "${objs[@]}" | awk '$2 ~ /^rdmacore/ { print $2 }' | sort -u) \
  <(nm --defined-only "${objs[@]}" | awk '{ print $3 }' | sort -u))

bin=$work/rdma_core_harness
gcc -O2 -fno-optimize-sibling-calls -Wall -Wextra -Werror -DPROVIDER_PREFIX="$prefix" \
  -o "$bin" "$src" "${objs[@]}" -Wl,-z,now "${defsyms[@]}" ||
  die "cannot build the harness against $archive (libibverbs-dev $version)"
"$bin" all >/dev/null || die "the harness's self-check failed against libibverbs-dev $version"

count() {
  local out=$work/callgrind/$1
  valgrind --tool=callgrind --collect-atstart=no --toggle-collect="bench_$1" \
    --callgrind-out-file="$out" "$bin" "$1" >/dev/null 2>"$out.log" ||
    die "valgrind failed on $1 (see $out.log)"
  awk '/^(summary|totals):/ { print $2; exit }' "$out"
}
empty=$(count empty)
[ -n "$empty" ] || die "no callgrind total for empty"
for key in "${keys[@]}"; do
  total=$(count "$key")
  [ -n "$total" ] || die "no callgrind total for $key"
  case $key in *_16) per=16 ;; *) per=1 ;; esac
  awk -v k="$key" -v t="$total" -v e="$empty" -v o=$((reps * per)) \
    'BEGIN { printf "rdma-core %s %.1f\n", k, (t - e) / o }'
done
awk -v e="$empty" -v r=$reps 'BEGIN { printf "rdma-core empty %.1f\n", e / r }'
