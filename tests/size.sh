#!/usr/bin/env bash
# The driver's footprint in the example kernel: the sizes of the public objects, then the
# driver's .text bytes.
#
#   tests/size.sh        # prints `size <Object> <bytes>` lines, then `driver_text_bytes N`
#
# Objects: size_of of each public object for the example kernel's HAL, P = Pvrdma<IdentityHal>
# (QueuePair is QueuePair<P, Rc, Rts>), printed by `tests/bench/ops.rs sizes`.
#
# Text: the kernel is built as `cargo build --release -p bareverbs-unikernel` builds it
# (examples/unikernel, linked with linker/unikernel.ld), and its symbol table is read with
# binutils' `nm -S -C` (demangled). The rule, the same every time:
#   - a symbol counts when it is a text symbol (nm type t, T, w or W) with a size, and its
#     demangled name
#       * starts with `bareverbs::` or `bareverbs_hal::` once any leading `<` is stripped: a
#         function of the driver crates, generic instantiations included wherever they were
#         compiled (`bareverbs::device::pvrdma::cmd::Channel<H>::exec`), and an impl whose
#         Self type is the driver's (`<bareverbs::error::Error as core::fmt::Display>::fmt`,
#         `<bareverbs::device::pvrdma::Pvrdma<H> as bareverbs::verbs::Provider>::create_qp`);
#       * or is the drop glue of a driver type: `core::ptr::drop_in_place<T>` with T (or the
#         first element of a tuple T) a `bareverbs::` or `bareverbs_hal::` type;
#   - symbols sharing an address (aliases, folded code) count once;
#   - nothing else counts: not the example's own functions (`bareverbs_unikernel::*`, `kmain`),
#     not generic code of other crates instantiated for driver types under a name that does
#     not say so (`<&T as core::fmt::Debug>::fmt`), not core/alloc/log/pci_types.
# Driver code that the compiler inlined into the example's functions (the data path's
# #[inline] methods end up in `bareverbs_unikernel::run`) has no symbol of its own and is not
# counted: the figure is what the driver costs in functions of its own.
#
# Needs binutils (nm); installed with apt-get when missing and run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nm >/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "size.sh: nm not found: apt-get install binutils" >&2; exit 1; }
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq binutils >&2
fi

# The object sizes, from the bench binary (built as tests/bench.sh builds it).
bin=$(CARGO_TARGET_DIR=target/callgrind CARGO_PROFILE_BENCH_DEBUG=line-tables-only \
  cargo bench --bench ops --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1) || true
[ -n "$bin" ] && [ -x "$bin" ] || { echo "size.sh: cannot build the bench binary" >&2; exit 1; }
"$bin" sizes

# The kernel.
kernel=$(cargo build --release -p bareverbs-unikernel --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1) || true
[ -n "$kernel" ] && [ -f "$kernel" ] || { echo "size.sh: cannot build the example kernel" >&2; exit 1; }

# `nm -S -t d`: decimal address and size, type, demangled name (which may contain spaces).
nm -S -t d --size-sort -C "$kernel" | awk '
  $3 ~ /^[tTwW]$/ {
    name = $0
    sub(/^[^ ]+ [^ ]+ [^ ]+ /, "", name)
    bare = name
    sub(/^<+/, "", bare)
    if (bare ~ /^(bareverbs|bareverbs_hal)::/ ||
        name ~ /^core::ptr::drop_in_place<\(?(bareverbs|bareverbs_hal)::/) {
      if (!seen[$1]++) total += $2
    }
  }
  END { printf "driver_text_bytes %d\n", total }'
