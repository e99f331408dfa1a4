//! `rxe.rs` as the unikernel runs it: the driver with the example kernel's own `memcpy`,
//! `memmove`, `memset`, `memcmp` and `bcmp` (`platform/src/cmem.rs`, the same source
//! file, compiled into this binary: its exported symbols take the place of the C library's for
//! every caller in the binary, the driver, the link's copies and the floor's alike).
//! `tests/bench.sh` builds it with the kernel's profile (opt-level "z", one codegen unit, LTO).

#[path = "../../platform/src/cmem.rs"]
mod cmem;
#[path = "rxe.rs"]
mod rxe;

fn main() {
    rxe::main();
}
