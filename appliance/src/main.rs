//! The bareverbs storage appliance: boots under QEMU (`-kernel`, PVH), brings up bareverbs'
//! software RoCEv2 device on the first virtio-net NIC and serves NVMe over Fabrics on it (a
//! RAM disk, and the first virtio-blk disk when there is one) until its console receives `q`
//! (or `bvnvmf.serve=S` seconds passed); then reports what it served, flushes the disk and
//! powers off with PASS. What the command line may say: `bareverbs_appliance::cmdline`.
//! `cargo appliance` builds and boots it (`qemu/appliance.sh`); docs/appliance.md.
//!
//! With `bvblk` on the command line it runs the virtio-blk boot check instead (the NVMe-oF
//! lab's first step).
#![no_std]
#![no_main]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

#[path = "../../platform/src/rt.rs"]
mod rt;
mod storage;

use core::fmt::Write;

use bareverbs_appliance::cmdline::Options;
use bareverbs_platform::console::{Exit, Serial, exit};
use bareverbs_platform::machine::{self, CMDLINE};

#[unsafe(no_mangle)]
extern "C" fn kmain(start_info: u32) -> ! {
    let m = machine::start(
        start_info,
        "bareverbs appliance: x86_64, PVH entry, NVMe over Fabrics on software RoCEv2",
    );
    if m.cmdline_has("bvblk") {
        storage::blk_check(&m.pci, m.hal, m.dma)
    }
    let mut buf = [0u8; CMDLINE];
    let text = m.cmdline(&mut buf).unwrap_or("");
    let Some(opts) = Options::parse(text) else {
        let _ = writeln!(
            Serial,
            "bareverbs: FAIL nvmf: a malformed bvnvmf word on the command line: {text}"
        );
        exit(Exit::Fail)
    };
    let bytes = opts.mib as usize * 1024 * 1024;
    // SAFETY: the only call in this run.
    let Some(ram) = (unsafe { m.ram_above_dma(bytes) }) else {
        let _ = writeln!(
            Serial,
            "bareverbs: FAIL nvmf: no room for a {} MiB RAM disk above the DMA region",
            opts.mib
        );
        exit(Exit::Fail)
    };
    storage::appliance(&m.pci, m.hal, m.dma, &opts, ram)
}
