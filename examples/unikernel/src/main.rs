//! The bareverbs example kernel: boots under QEMU (`-kernel`, PVH), prints what it finds on
//! PCI, and drives a PVRDMA through bareverbs if there is one (the library's demo); otherwise
//! it checks the first virtio-net NIC (ARP for the gateway through the `Link` seam) and runs
//! bareverbs' software RoCEv2 device over it (`bareverbs_unikernel::roce`). Ends with
//! `bareverbs: PASS`, `bareverbs: FAIL <reason>`, or a plain "no device" line, and exits QEMU
//! through isa-debug-exit with a code for each. `cargo unikernel` builds and boots it.
//!
//! The machine (boot, console, interrupts) is `bareverbs-platform`'s.
#![no_std]
#![no_main]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

#[path = "../../../platform/src/rt.rs"]
mod rt;

use core::fmt::Write;
use core::sync::atomic::{AtomicBool, Ordering};

use bareverbs::hal::virtio_net::{self, GlobalIdentity, VirtioNet};
use bareverbs::hal::{DmaRegion, IdentityHal, Link, x86::PortIoConfig};
use bareverbs_platform::arp::{self, DisplayMac};
use bareverbs_platform::console::{Exit, Serial, exit};
use bareverbs_platform::machine::{self, Ticks, dma_left, pass, roce_device};
use bareverbs_platform::{irq, smp};
use bareverbs_unikernel::Verdict;
use bareverbs_unikernel::kernel::{fail, fail_dma_left, run_demo};

/// This kernel's address and the gateway's on QEMU's user network (slirp's defaults).
const LINK_IP: [u8; 4] = [10, 0, 2, 15];
const GATEWAY_IP: [u8; 4] = [10, 0, 2, 2];
/// Timer ticks (about 16 ms each) the ARP probe waits at most, and between its requests.
const ARP_TICKS: u32 = 128;
const ARP_RESEND_TICKS: u32 = 32;
/// ARP rounds: more than twice the receive buffers.
const ARP_ROUNDS: usize = 2 * virtio_net::RX_BUFFERS + 1;

/// The link self-test, on the first virtio-net NIC: ARP for the gateway through the `Link`
/// seam. Prints one `link:` line; a NIC that does not answer ends the run with FAIL.
fn link_test(pci: &PortIoConfig, dma: &DmaRegion) {
    let Some(address) = virtio_net::find(pci) else {
        let _ = writeln!(
            Serial,
            "link: no virtio-net NIC (its self-test skipped: the RoCE demo takes the NIC there is)"
        );
        return;
    };
    let at = (address.bus(), address.device(), address.function());
    // SAFETY: the port accessor reaches every function; this kernel drives nothing else on
    // the NIC; its BARs lie in the identity-mapped, uncached PCI hole (the HAL's mapping).
    let nic = unsafe { VirtioNet::<GlobalIdentity>::new(pci, address) };
    let mut nic = match nic {
        Ok(n) => n,
        Err(e) => {
            let _ = writeln!(Serial, "bareverbs: FAIL link: virtio-net bring-up: {e}");
            exit(Exit::Fail)
        }
    };
    // Round after round, so that every transmit slot and every receive buffer is used (and
    // recycled) more than once.
    let mut reply = Err(arp::ArpFailure::Timeout);
    for _ in 0..ARP_ROUNDS {
        let start = irq::count(irq::TIMER_VECTOR);
        reply = arp::probe(&mut nic, LINK_IP, GATEWAY_IP, ARP_RESEND_TICKS, || {
            irq::wait();
            irq::count(irq::TIMER_VECTOR).wrapping_sub(start) < ARP_TICKS
        });
        if reply.is_err() {
            break;
        }
    }
    let mac = nic.mac();
    let stats = nic.stats();
    drop(nic);
    match reply {
        Ok(r) if dma_left(dma) == 0 => {
            let _ = writeln!(
                Serial,
                "link: virtio-net {:02x}:{:02x}.{} MAC {}, ARP {}.{}.{}.{} is {} ({} frames in, {} out, {} dropped)",
                at.0,
                at.1,
                at.2,
                DisplayMac(mac),
                GATEWAY_IP[0],
                GATEWAY_IP[1],
                GATEWAY_IP[2],
                GATEWAY_IP[3],
                DisplayMac(r.mac),
                stats.received,
                stats.transmitted,
                stats.dropped
            );
        }
        Ok(_) => {
            let left = dma_left(dma);
            let _ = writeln!(
                Serial,
                "bareverbs: FAIL link: {left} DMA pages not returned"
            );
            exit(Exit::Fail)
        }
        Err(e) => {
            let _ = writeln!(
                Serial,
                "bareverbs: FAIL link: virtio-net {:02x}:{:02x}.{} MAC {}: {e} ({} frames in, {} out)",
                at.0,
                at.1,
                at.2,
                DisplayMac(mac),
                stats.received,
                stats.transmitted
            );
            exit(Exit::Fail)
        }
    }
}

/// Whether CPU 1 overflows its stack (`bvsmp.overflow`), and when it may (the bootstrap CPU
/// has printed what it had to).
static OVERFLOW: AtomicBool = AtomicBool::new(false);
static GO: AtomicBool = AtomicBool::new(false);

/// What the other CPUs run: nothing but their idle halts, or (CPU 1, `bvsmp.overflow`) a
/// recursion without end.
fn cpu_entry(cpu: usize) {
    if cpu == 1 && OVERFLOW.load(Ordering::Relaxed) {
        while !GO.load(Ordering::Acquire) {
            irq::wait();
        }
        let depth = deeper(core::hint::black_box(0));
        let _ = writeln!(
            Serial,
            "bareverbs: FAIL smp: recursed {depth} deep unstopped"
        );
        exit(Exit::Fail)
    }
}

/// Recurses until the stack's guard page stops it.
fn deeper(n: u64) -> u64 {
    if core::hint::black_box(n) == u64::MAX {
        return n;
    }
    let pad = core::hint::black_box([n; 64]);
    deeper(n + 1) + pad[(n % 64) as usize]
}

/// Timer ticks a RoCE demo wait lasts at most (about 5 s).
const ROCE_TICKS: u32 = 300;

#[unsafe(no_mangle)]
extern "C" fn kmain(start_info: u32) -> ! {
    let m = machine::start(
        start_info,
        "bareverbs unikernel: x86_64, PVH entry, polling driver",
    );
    // Every other CPU started; each only idles (the demo runs on this one). Two words check
    // the bring-up's failure paths: `bvsmp.silent=ID` withholds the start-up IPIs from one
    // CPU (it must be left out, the others start), `bvsmp.overflow` has CPU 1 overflow its
    // stack (its guard page must stop it with a page fault on that CPU).
    let mut buf = [0u8; machine::CMDLINE];
    let words = m.cmdline(&mut buf).unwrap_or("");
    let silent = words
        .split_ascii_whitespace()
        .find_map(|w| w.strip_prefix("bvsmp.silent="))
        .and_then(|v| v.parse().ok());
    OVERFLOW.store(m.cmdline_has("bvsmp.overflow"), Ordering::Relaxed);
    let overflow = m.cmdline_has("bvsmp.overflow");
    smp::start_with(start_info, cpu_entry, silent);
    if overflow {
        // CPU 1 ends the run; this one stays off the console meanwhile.
        GO.store(true, Ordering::Release);
        loop {
            irq::wait();
        }
    }
    match run_demo(&m) {
        Ok(Verdict::NoDevice) => {
            link_test(&m.pci, m.dma);
            roce(&m.pci, m.hal, m.dma)
        }
        Ok(Verdict::Pass) if m.dma_left() == 0 => {
            let _ = writeln!(Serial, "DMA pages outstanding: 0");
            pass()
        }
        Ok(Verdict::Pass) => fail_dma_left(m.dma_left()),
        Err(f) => fail(&f),
    }
}

/// The second device: software RoCEv2 over the first virtio-net NIC (the demo of
/// `bareverbs_unikernel::roce`). Ends the run with PASS or FAIL.
fn roce(pci: &PortIoConfig, hal: IdentityHal<'static>, dma: &DmaRegion) -> ! {
    let dev = roce_device(pci, hal, LINK_IP, |_| {});
    let start = irq::count(irq::TIMER_VECTOR);
    let r = bareverbs_unikernel::roce::demo(dev, Ticks, &mut Serial, &mut || {
        irq::wait();
        irq::count(irq::TIMER_VECTOR).wrapping_sub(start) < ROCE_TICKS
    });
    match r {
        Ok(()) if dma_left(dma) == 0 => {
            let _ = writeln!(Serial, "DMA pages outstanding: 0");
            pass()
        }
        Ok(()) => {
            let left = dma_left(dma);
            let _ = writeln!(
                Serial,
                "bareverbs: FAIL roce: {left} DMA pages not returned"
            );
            exit(Exit::Fail)
        }
        Err(f) => {
            let _ = writeln!(Serial, "bareverbs: FAIL roce: {f}");
            exit(Exit::Fail)
        }
    }
}
