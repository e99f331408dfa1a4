//! What the bareverbs kernels share: the machine they boot on (QEMU's `-kernel` PVH entry,
//! the boot stack, the PVH memory map and command line, the DMA region), the serial console
//! and QEMU's exit device, the local APIC's interrupts and the idle halt, the waits that
//! halt between interrupts, the virtio-blk driver, ARP, the fw_cfg device's files (what does
//! not fit on the command line), and the steps' error type.
//!
//! Three binaries link it: the example kernel (`examples/unikernel`), the storage appliance
//! (`appliance/`) and the lab peers (`qemu/peers/`). Each compiles `src/rt.rs` into itself
//! (boot code, memory functions, panic handler) and links with `linker/unikernel.ld` through
//! `link.rs`, its build script. Nothing here is the appliance's or a lab's.
#![no_std]
#![deny(
    unsafe_op_in_unsafe_fn,
    missing_docs,
    clippy::undocumented_unsafe_blocks
)]

pub mod acpi;
pub mod arp;
pub mod block;
pub mod console;
pub mod fw_cfg;
pub mod irq;
pub mod machine;
pub mod nic;
pub mod smp;
pub mod step;
pub mod virtio_blk;
pub mod wait;

pub use step::{DisplayGid, Failure, Step};

/// Runs the lab's instruction-counter marker with code `CODE`: `nopl 0x4256CODE(%rax)`, a
/// no-op that `qemu/roce/icount.c` (a QEMU plugin) records with the guest's instruction count.
/// Elsewhere it costs one instruction.
#[inline(always)]
pub fn mark<const CODE: u16>() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a multi-byte NOP: its memory operand is only encoded, never accessed; no
    // register, flag or memory changes.
    unsafe {
        core::arch::asm!(
            ".byte 0x0f, 0x1f, 0x80",
            ".2byte {code}",
            ".byte 0x56, 0x42",
            code = const CODE,
            options(nomem, nostack, preserves_flags)
        );
    }
}
