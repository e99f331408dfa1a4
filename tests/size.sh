#!/usr/bin/env bash
# The driver's footprint in the kernel that uses the most of it, the lab peers' (the example
# kernel's demo on both devices, then every peer mode of the labs): the sizes of the public
# objects, then the driver's .text bytes.
#
#   tests/size.sh        # prints `size <Object> <bytes>` lines, then `driver_text_bytes N`
#
# Objects: size_of of each public object for the example kernel's HAL, P = Pvrdma<IdentityHal>
# (QueuePair is QueuePair<P, Rc, Rts>), printed by `tests/bench/ops.rs sizes`.
#
# Text: the kernel is built as `cargo build --release -p bareverbs-lab-peers` builds it
# (qemu/peers, linked with linker/unikernel.ld), once more with DWARF line tables
# (`debug = "line-tables-only"`, in target/size) and v0 symbol mangling, whose demangled names
# carry generic arguments (`bareverbs::verbs::Context<bareverbs::device::rxe::Rxe<…>>::
# create_cq`); the script checks that both builds have text symbols of the same sizes, i.e.
# that line tables and names changed no code (the padding between functions may differ).
# The rule, the same every time (`tests/size/driver_text.py`):
#   - symbols of the driver: every text symbol (nm type t, T, w or W) with a size whose
#     demangled name
#       * starts with `bareverbs::` or `bareverbs_hal::` once any leading `<` is stripped: a
#         function of the driver crates, generic instantiations included wherever they were
#         compiled (`bareverbs::device::pvrdma::cmd::Channel<H>::run`), and an impl whose
#         Self type is the driver's (`<bareverbs::error::Error as core::fmt::Display>::fmt`,
#         `<bareverbs::device::pvrdma::Pvrdma<H> as bareverbs::verbs::Provider>::create_qp`);
#       * or is the drop glue of a driver type: `core::ptr::drop_in_place<T>` with T (or the
#         first element of a tuple T) a `bareverbs::` or `bareverbs_hal::` type;
#     symbols sharing an address (aliases, folded code) count once, whole;
#   - what the driver inlines into the example: every other .text byte that is driver code by
#     the DWARF debug info, i.e. whose innermost source line (the line table's row for its
#     address; line 0 rows excluded) is in a file of the driver crates (`src/`, `hal/src/`), or
#     that lies in code inlined at a call site in such a file (a DW_TAG_inlined_subroutine whose
#     DW_AT_call_file is a driver file: the core/spin code a driver function inlined, also
#     after that function was itself inlined into the example). Examples: the data path's
#     #[inline] methods inside `bareverbs_unikernel::run`, with what they inline; an `Error`
#     built in the example's code;
#   - nothing else counts: not the example's own code, not core/log/pci_types code the example
#     itself calls (core code inlined into driver code counts with it, wherever it landed).
# The NIC links (`hal/src/virtio_net`, `bareverbs_hal::virtio_net::…`, and the virtio-drivers
# crate it wraps; the Intel links, `hal/src/intel`, `igb.rs`, `e1000e.rs`, all three in the
# kernel since the platform drives whichever NIC it finds) are not the RDMA driver: their
# symbols are printed apart, `link_text_symbols N`.
# The second device, software RoCEv2 (`src/device/rxe/`, and driver symbols whose name mentions
# `bareverbs::device::rxe::`: the verbs layer instantiated for it), is counted apart as well:
# `rxe_text_symbols`, `rxe_text_inlined` (bytes whose innermost line is in its files, and driver
# code inlined into the example's functions for the rxe device), and `rxe_text_bytes`.
# `driver_text_bytes` stays the PVRDMA driver with the verbs layer (code shared by both
# devices, not generic over the device, counts here).
# BAREVERBS_SIZE_TOP=N lists the N largest driver symbols on stderr.
# Where the driver's bytes come from, one `driver_text_layer NAME N` line per layer (they sum to
# driver_text_bytes): each counted byte goes to the innermost frame of its inline chain
# (llvm-symbolizer) that lies in a driver file, so core code a driver function inlined counts
# with that function's file; a byte no driver file claims (drop glue, whose lines are core's;
# line-0 code) goes by the first driver module path in its function's name. Layers: pvrdma
# (src/device/pvrdma, the device), verbs (src/verbs), error, events, dma, pci (src/*.rs), hal
# (hal/src), other (the rest of src/), unattributed (neither says).
# Prints `link_text_symbols N`, the `rxe_text_*` lines, the `driver_text_layer` lines,
# `driver_text_symbols N`, `driver_text_inlined N`, then last `driver_text_bytes N` (the
# driver's sum).
#
# Needs binutils (nm, objdump), llvm-dwarfdump and llvm-symbolizer (Debian package llvm, LLVM 13
# or later for the symbolizer's JSON output) and python3; installed with apt-get when missing
# and run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v nm >/dev/null && command -v objdump >/dev/null || need+=(binutils)
command -v llvm-dwarfdump >/dev/null && command -v llvm-symbolizer >/dev/null || need+=(llvm)
command -v python3 >/dev/null || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "size.sh: missing tools: apt-get install ${need[*]}" >&2; exit 1; }
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
fi

# The object sizes, from the bench binary (built as tests/bench.sh builds it).
bin=$(CARGO_TARGET_DIR=target/callgrind CARGO_PROFILE_BENCH_DEBUG=line-tables-only \
  cargo bench --bench ops --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1) || true
[ -n "$bin" ] && [ -x "$bin" ] || { echo "size.sh: cannot build the bench binary" >&2; exit 1; }
"$bin" sizes

# The kernel.
kernel=$(cargo build --release -p bareverbs-lab-peers --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1) || true
[ -n "$kernel" ] && [ -f "$kernel" ] || { echo "size.sh: cannot build the lab peers' kernel" >&2; exit 1; }

# The same kernel with line tables, for the inlined code.
lined=$(CARGO_TARGET_DIR=target/size CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
  RUSTFLAGS="-C symbol-mangling-version=v0" \
  cargo build --release -p bareverbs-lab-peers --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1) || true
[ -n "$lined" ] && [ -f "$lined" ] || { echo "size.sh: cannot build the kernel with line tables" >&2; exit 1; }
# The same code: the sizes of the text symbols, as a sorted list (their names differ by the
# mangling, and the linker's identical-code folding may lay them out in another order, with
# other alignment padding between them).
code() { nm -S -t d "$1" | awk '$3 ~ /^[tTwW]$/ { print $2 }' | sort -n | md5sum; }
[ "$(code "$kernel")" = "$(code "$lined")" ] ||
  { echo "size.sh: line tables changed the kernel's code (its text symbols' sizes differ)" >&2; exit 1; }

python3 tests/size/driver_text.py "$lined" .
