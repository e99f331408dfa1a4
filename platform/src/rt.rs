//! The part of the platform every kernel binary compiles into itself (`#[path]`): the PVH
//! entry and boot stack (`boot.rs`), the C memory functions the precompiled `core` calls
//! (`cmem.rs`), and the panic handler. Not a module of the library: a host test binary
//! linked with the library keeps the C library's memory functions and `std`'s panic handler.

use core::fmt::Write;

use bareverbs_platform::console::{Exit, Serial, exit};

#[path = "boot.rs"]
mod boot;

// The C memory functions the precompiled `core` calls, in their own file: the host benchmark
// (tests/bench/rxe_guest.rs) and platform/tests/cmem.rs compile the same file.
#[path = "cmem.rs"]
mod cmem;

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let _ = writeln!(Serial, "bareverbs: FAIL panic: {info}");
    exit(Exit::Fail)
}

/// Referenced by `core`'s unwind tables even with panic=abort; never called.
#[unsafe(no_mangle)]
pub extern "C" fn rust_eh_personality() {}
