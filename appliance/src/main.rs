//! The bareverbs storage appliance: boots under QEMU (`-kernel`, PVH), brings up bareverbs'
//! software RoCEv2 device on the first virtio-net NIC and serves NVMe over Fabrics on it (a
//! RAM disk, and the first virtio-blk disk when there is one) until its console receives `q`
//! (or `bvnvmf.serve=S` seconds passed); then reports what it served, flushes the disk and
//! powers off with PASS. What it serves is declared on the command line: `bareverbs_appliance::config`;
//! the namespaces of NVMe controllers on the bus (`nvme:C/NSID`) are among what it can serve.
//! `cargo appliance` builds and boots it (`qemu/appliance.sh`); docs/appliance.md.
//!
//! With `bvblk` on the command line it runs the virtio-blk boot check instead (the NVMe-oF
//! lab's first step); with `bvnvme`, the same check on the first NVMe namespace.
#![no_std]
#![no_main]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

#[path = "../../platform/src/rt.rs"]
mod rt;
mod storage;

use core::fmt::Write;

use bareverbs_appliance::config::{Config, MAX_DISKS, MAX_NSID, MAX_NVME, Machine};
use bareverbs_appliance::nvmf_app::HOST_SCRATCH;
use bareverbs_platform::console::{Exit, Serial, exit};
use bareverbs_platform::machine::{self, CMDLINE};
use bareverbs_platform::smp;
use bareverbs_platform::virtio_blk;

#[unsafe(no_mangle)]
extern "C" fn kmain(start_info: u32) -> ! {
    let m = machine::start(
        start_info,
        "bareverbs appliance: x86_64, PVH entry, NVMe over Fabrics on software RoCEv2",
    );
    // Every other CPU started: each waits for its poll group of the NVMe-oF target
    // (storage::ap_main), or idles (the boot checks, CPUs past the groups' limit).
    smp::start(start_info, storage::ap_main);
    if m.cmdline_has("bvblk") {
        storage::blk_check(&m.pci, m.hal, m.dma)
    }
    if m.cmdline_has("bvnvme") {
        storage::nvme_check(&m.pci, m.hal, m.dma)
    }
    let mut buf = [0u8; CMDLINE];
    let text = m.cmdline(&mut buf).unwrap_or("");
    // The configuration, checked against the machine before anything is served.
    let disks = (0..MAX_DISKS)
        .take_while(|&n| virtio_blk::find_nth(&m.pci, n).is_some())
        .count();
    // The NVMe controllers, brought up before the configuration is checked: their namespaces
    // are what `nvme:C/NSID` may name.
    let nvme = storage::nvme_controllers(&m.pci, m.hal);
    let served = nvme.each_ref().map(|c| {
        c.as_ref().map_or(0, |c| {
            c.borrow()
                .namespaces()
                .filter(|ns| ns.nsid <= MAX_NSID)
                .fold(0u64, |mask, ns| mask | 1 << (ns.nsid - 1))
        })
    });
    let machine = Machine {
        disks,
        // The host mode's scratch (64 KiB) comes out of the RAM namespaces' memory too.
        ram_bytes: m.ram_room().saturating_sub(HOST_SCRATCH as u64),
        nvme: served,
    };
    let _: [u64; MAX_NVME] = machine.nvme;
    let config = match Config::parse(text, &machine) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(Serial, "nvmf: config refused: {e}");
            let _ = writeln!(
                Serial,
                "bareverbs: FAIL nvmf: the command line's configuration is refused (docs/appliance.md, Configuration); nothing served"
            );
            exit(Exit::Fail)
        }
    };
    let mut bytes = usize::try_from(config.ram_bytes()).unwrap_or(usize::MAX);
    if config.host.is_some() {
        bytes = bytes.max(HOST_SCRATCH);
    }
    // SAFETY: the only call in this run.
    let Some(ram) = (unsafe { m.ram_above_dma(bytes) }) else {
        let _ = writeln!(
            Serial,
            "bareverbs: FAIL nvmf: no room for {bytes} bytes of RAM namespaces above the DMA region"
        );
        exit(Exit::Fail)
    };
    storage::appliance(&m.pci, m.hal, m.dma, &config, ram, nvme)
}
