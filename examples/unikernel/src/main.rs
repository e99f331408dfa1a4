//! The bareverbs unikernel: boots under QEMU (`-kernel`, PVH), prints what it finds on PCI,
//! and drives a PVRDMA through bareverbs if there is one (see the library for the demo);
//! otherwise it runs bareverbs' software RoCEv2 device over the first virtio-net NIC.
//! Ends with `bareverbs: PASS`, `bareverbs: FAIL <reason>`, or a plain "no device" line, and
//! exits QEMU through isa-debug-exit with a code for each.
//!
//! With `bvpeer=A.B.C.D` on the kernel command line (the lab's `-append`), a passing demo is
//! followed by peer mode (`bareverbs_unikernel::peer`): the kernel binds `::ffff:A.B.C.D` and
//! runs the exchanges the lab's bridge asks for over the console with unmodified Linux
//! programs.
#![no_std]
#![no_main]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod boot;
mod console;
mod irq;
mod storage;

use core::fmt::Write;
use core::ptr::NonNull;

use bareverbs::device::pvrdma::Config;
use bareverbs::device::rxe::{Config as RoceConfig, Rxe};
use bareverbs::hal::virtio_net::{self, GlobalIdentity, VirtioNet};
use bareverbs::hal::{Clock, DmaRegion, Hal, IdentityHal, Link, PAGE_SIZE, x86::PortIoConfig};
use bareverbs_unikernel::arp::{self, DisplayMac};
use bareverbs_unikernel::peer::{self, Line};
use bareverbs_unikernel::wait::Polling;
use bareverbs_unikernel::{Verdict, run};
use console::{Exit, Serial, exit};

unsafe extern "C" {
    static __image_end: u8;
    /// The boot stack (1 MiB, painted with a pattern before `kmain` runs; `boot.rs`).
    static boot_stack: u8;
    static boot_stack_top: u8;
}

/// Ends a run that passed: how much of the boot stack it used, the verdict, QEMU's exit.
fn pass() -> ! {
    let (used, size) = stack_used();
    let _ = writeln!(Serial, "stack: {used} of {size} bytes used");
    let _ = writeln!(Serial, "bareverbs: PASS");
    exit(Exit::Pass)
}

/// DMA pages not given back to the region.
fn dma_left(dma: &DmaRegion) -> usize {
    dma.total_pages() - dma.free_pages()
}

/// Bytes of the boot stack ever used: from the top down to the lowest byte whose paint is
/// gone.
fn stack_used() -> (usize, usize) {
    let lo = core::ptr::addr_of!(boot_stack);
    let hi = core::ptr::addr_of!(boot_stack_top) as usize;
    let size = hi - lo as usize;
    let word = |i: usize| {
        // SAFETY: i < size / 8: inside the stack (4 KiB-aligned, so the u64 is aligned); read
        // as plain data, never written here.
        unsafe { lo.cast::<u64>().add(i).read_volatile() }
    };
    let untouched = (0..size / 8)
        .take_while(|&i| word(i) == 0x5AFE_5AFE_5AFE_5AFE)
        .count();
    (size - untouched * 8, size)
}

impl Line for Serial {
    fn try_get(&mut self) -> Option<u8> {
        console::try_get()
    }
}

/// Bytes of the PVH command line read at most.
const CMDLINE: usize = 1024;

/// Whether the PVH command line has the word `word`.
fn cmdline_has(start_info: u32, word: &str) -> bool {
    let mut buf = [0u8; CMDLINE];
    cmdline(start_info, &mut buf).is_some_and(|t| t.split_ascii_whitespace().any(|w| w == word))
}

/// The PVH command line, read into `buf`.
fn cmdline(start_info: u32, buf: &mut [u8; CMDLINE]) -> Option<&str> {
    let info = start_info as usize as *const u8;
    // hvm_start_info: cmdline_paddr at 24 (0: none); the string is NUL-terminated.
    // SAFETY: QEMU hands over a valid hvm_start_info at `ebx` (its magic was checked by
    // `dma_memory`); memory is identity-mapped.
    let cmdline = unsafe { info.add(24).cast::<u64>().read_unaligned() } as usize as *const u8;
    if cmdline.is_null() {
        return None;
    }
    let mut len = 0;
    while len < buf.len() {
        // SAFETY: QEMU's command line string, read up to its NUL (bounded by the buffer).
        let b = unsafe { cmdline.add(len).read_volatile() };
        if b == 0 {
            break;
        }
        buf[len] = b;
        len += 1;
    }
    core::str::from_utf8(&buf[..len]).ok()
}

/// The IPv4 address of `bvpeer=A.B.C.D` on the PVH command line, if there is one.
fn peer_ip(start_info: u32) -> Option<[u8; 4]> {
    let mut buf = [0u8; CMDLINE];
    let text = cmdline(start_info, &mut buf)?;
    let arg = text
        .split_ascii_whitespace()
        .find_map(|w| w.strip_prefix("bvpeer="))?;
    let mut ip = [0u8; 4];
    let mut parts = arg.split('.');
    for x in &mut ip {
        *x = parts.next()?.parse().ok()?;
    }
    parts.next().is_none().then_some(ip)
}

/// DMA memory given to the driver at most (the region's bitmap limit is 128 MiB).
const DMA_MAX_PAGES: usize = 16 * 1024;

/// The largest RAM range above the kernel image from the PVH memory map, page-aligned: the DMA
/// region's (physical address, pages), and where the range ends (the appliance's RAM disk
/// lies between the region's end and there).
fn dma_memory(start_info: u32) -> Option<(u64, usize, u64)> {
    // Only the address of the linker-defined symbol is taken.
    let image_end = core::ptr::addr_of!(__image_end) as u64;
    let info = start_info as usize as *const u8;
    // hvm_start_info: magic at 0 (0x336ec578), memmap_paddr at 40, memmap_entries at 48.
    // SAFETY: QEMU hands over a valid hvm_start_info at `ebx`; memory is identity-mapped.
    let (magic, memmap, entries) = unsafe {
        (
            info.cast::<u32>().read_unaligned(),
            info.add(40).cast::<u64>().read_unaligned(),
            info.add(48).cast::<u32>().read_unaligned(),
        )
    };
    if magic != 0x336E_C578 {
        return None;
    }
    let mut best: Option<(u64, u64)> = None;
    for i in 0..entries.min(128) as usize {
        // hvm_memmap_table_entry: addr u64, size u64, type u32 (1 = RAM), reserved u32.
        // SAFETY: the table QEMU built, `entries` entries of 24 bytes, identity-mapped.
        let (addr, size, ty) = unsafe {
            let e = (memmap as usize + i * 24) as *const u8;
            (
                e.cast::<u64>().read_unaligned(),
                e.add(8).cast::<u64>().read_unaligned(),
                e.add(16).cast::<u32>().read_unaligned(),
            )
        };
        let start = addr.max(image_end).next_multiple_of(PAGE_SIZE as u64);
        let end = (addr + size).min(0xC000_0000) & !(PAGE_SIZE as u64 - 1);
        if ty == 1 && end > start && best.is_none_or(|(s, e)| end - start > e - s) {
            best = Some((start, end));
        }
    }
    best.map(|(s, e)| {
        (
            s,
            (((e - s) / PAGE_SIZE as u64) as usize).min(DMA_MAX_PAGES),
            e,
        )
    })
}

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
        let _ = writeln!(Serial, "link: no virtio-net NIC");
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

/// Time for the RoCE transport's timers: the LAPIC timer's ticks (about 16 ms each).
struct Ticks;

impl Clock for Ticks {
    fn now_us(&self) -> u64 {
        // Interrupts are off but in windows: take a tick that is due, so that a kernel that
        // polls without halting still sees time pass.
        irq::window();
        u64::from(irq::count(irq::TIMER_VECTOR)) * 16_000
    }
}

/// Timer ticks a RoCE demo wait lasts at most (about 5 s).
const ROCE_TICKS: u32 = 300;

/// The software RoCE device over the first virtio-net NIC, at IPv4 address `ip`; ends the run
/// if there is none or it does not come up.
fn roce_device(
    pci: &PortIoConfig,
    hal: IdentityHal<'static>,
    ip: [u8; 4],
    setup: impl FnOnce(&mut VirtioNet<GlobalIdentity>),
) -> Rxe<IdentityHal<'static>, VirtioNet<GlobalIdentity>, Ticks> {
    let Some(address) = virtio_net::find(pci) else {
        let _ = writeln!(Serial, "roce: no virtio-net NIC either");
        exit(Exit::NoDevice)
    };
    // SAFETY: as in `link_test` (the link test's NIC is gone: this takes the NIC over anew).
    let mut nic = match unsafe { VirtioNet::<GlobalIdentity>::new(pci, address) } {
        Ok(n) => n,
        Err(e) => {
            let _ = writeln!(Serial, "bareverbs: FAIL roce: virtio-net bring-up: {e}");
            exit(Exit::Fail)
        }
    };
    setup(&mut nic);
    let filters = nic.filters();
    let dev = match Rxe::new(hal, nic, Ticks, RoceConfig { ip }) {
        Ok(d) => d,
        Err(e) => {
            let _ = writeln!(Serial, "bareverbs: FAIL roce: device: {e}");
            exit(Exit::Fail)
        }
    };
    let _ = writeln!(
        Serial,
        "roce: over virtio-net {:02x}:{:02x}.{}, {}",
        address.bus(),
        address.device(),
        address.function(),
        if filters {
            "the device filters (promiscuous mode off)"
        } else {
            "promiscuous"
        }
    );
    dev
}

/// Routes the NIC's interrupts to device vector 0 (an idle wait then halts until the next
/// frame); whether they are.
fn route_nic_interrupts(
    pci: &PortIoConfig,
    hal: IdentityHal<'static>,
    nic: &mut VirtioNet<GlobalIdentity>,
) -> bool {
    let Some(msg) = hal.msi_message(0) else {
        return false;
    };
    // SAFETY: `pci` reaches the NIC's function, as given to `VirtioNet::new`; nothing else
    // uses its MSI-X table.
    match unsafe { nic.route_interrupts(pci, msg) } {
        Ok(()) => true,
        Err(e) => {
            let _ = writeln!(Serial, "roce: virtio-net interrupts not routed: {e}");
            false
        }
    }
}

/// Milliseconds since boot, from the LAPIC timer's ticks.
fn clock_ms() -> u64 {
    Ticks.now_us() / 1000
}

/// Peer mode on the software RoCE device (`bvroce=` on the command line): the cases against
/// the Linux side of `qemu/roce/lab.sh`. Ends the run with PASS or FAIL.
fn roce_peer(
    pci: &PortIoConfig,
    hal: IdentityHal<'static>,
    dma: &DmaRegion,
    opts: &bareverbs_unikernel::roce_peer::Options<'_>,
) -> ! {
    let mut nic_interrupts = false;
    let dev = roce_device(pci, hal, opts.net.ip, |nic| {
        nic_interrupts = route_nic_interrupts(pci, hal, nic)
    });
    let idle = bareverbs_unikernel::roce_peer::Idle {
        halt: &irq::wait,
        nic_interrupts,
    };
    let _ = writeln!(
        Serial,
        "roce: idle waits halt {}",
        if nic_interrupts {
            "until the NIC's interrupt or the timer's"
        } else {
            "after 32 ms without a frame, until the timer's interrupt"
        }
    );
    match bareverbs_unikernel::roce_peer::serve(dev, &mut Serial, opts, &clock_ms, idle) {
        Ok(o) if o.failed == 0 && dma_left(dma) == 0 => {
            let _ = writeln!(Serial, "roce peer: {} cases passed", o.cases);
            let _ = writeln!(Serial, "DMA pages outstanding: 0");
            pass()
        }
        Ok(o) => {
            let left = dma_left(dma);
            let _ = writeln!(
                Serial,
                "bareverbs: FAIL roce peer: {} of {} cases failed, {left} DMA pages not returned",
                o.failed, o.cases
            );
            exit(Exit::Fail)
        }
        Err(e) => {
            let _ = writeln!(Serial, "bareverbs: FAIL roce peer: {e}");
            exit(Exit::Fail)
        }
    }
}

/// The second device: software RoCEv2 over the first virtio-net NIC (the demo of
/// `bareverbs_unikernel::roce`). Ends the run with PASS or FAIL.
fn roce(pci: &PortIoConfig, hal: IdentityHal<'static>, dma: &DmaRegion) -> ! {
    let dev = roce_device(pci, hal, LINK_IP, |_| {});
    let start = irq::count(irq::TIMER_VECTOR);
    let r = bareverbs_unikernel::roce::demo(dev, &mut Serial, &mut || {
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

#[unsafe(no_mangle)]
extern "C" fn kmain(start_info: u32) -> ! {
    console::init();
    console::init_log();
    let _ = writeln!(
        Serial,
        "bareverbs unikernel: x86_64, PVH entry, polling driver"
    );
    let apic = irq::init();
    match irq::self_test() {
        Ok(windows) => {
            let _ = writeln!(
                Serial,
                "interrupts: LAPIC {apic}, IDT loaded, a self-IPI taken in {windows} window(s), \
                 timer ticks {}, halts {}",
                irq::count(irq::TIMER_VECTOR),
                irq::halts()
            );
        }
        Err(why) => {
            let _ = writeln!(Serial, "bareverbs: FAIL interrupts: {why}");
            exit(Exit::Fail)
        }
    }
    let Some((pa, pages, ram_end)) = dma_memory(start_info) else {
        let _ = writeln!(
            Serial,
            "bareverbs: FAIL no usable RAM in the PVH memory map"
        );
        exit(Exit::Fail)
    };
    let _ = writeln!(Serial, "DMA region: {pa:#x}, {pages} pages");
    let Some(vaddr) = NonNull::new(pa as usize as *mut u8) else {
        exit(Exit::Fail)
    };
    // The HAL lives in a static (virtio-drivers, behind the link test, reaches it without a
    // value); the PVRDMA path uses the same one.
    // SAFETY: RAM above the image from the firmware's memory map, identity-mapped, used for
    // nothing else; the boot code identity-maps 0–4 GiB with the PCI hole uncached, and PCI
    // devices' BARs lie in that hole. Installed once, here.
    let Some(hal) = (unsafe { GlobalIdentity::install(pa, vaddr, pages, 0) }) else {
        exit(Exit::Fail)
    };
    let dma = hal.region();
    // Device vector v arrives at CPU vector 0x30 + v on this CPU's LAPIC.
    let msi = 0xFEE0_0000 | u32::from(apic) << 12;
    let hal = hal.with_msi(msi, u32::from(irq::DEVICE_VECTORS.start));
    // SAFETY: a PC has configuration mechanism #1; this kernel is the only user of the ports.
    let pci = unsafe { PortIoConfig::new() };
    // `bvirq` on the command line (the lab passes it): interrupt-driven waits (MSI-X, halts).
    // Without it the demo polls.
    let irq_mode = cmdline_has(start_info, "bvirq");
    let config = Config {
        interrupts: irq_mode,
        ..Config::default()
    };
    let (mut kernel_cpu, mut polling) = (irq::KernelCpu, Polling);
    let cpu: &mut dyn bareverbs_unikernel::wait::Cpu = if irq_mode {
        &mut kernel_cpu
    } else {
        &mut polling
    };
    match run(hal, &pci, &mut Serial, config, cpu) {
        Ok(Verdict::NoDevice) => {
            let mut buf = [0u8; CMDLINE];
            let text = cmdline(start_info, &mut buf).unwrap_or("");
            let seed =
                u64::from(irq::count(irq::TIMER_VECTOR)) ^ bareverbs_unikernel::peer::rdtsc();
            if cmdline_has(start_info, "bvblk") {
                storage::blk_check(&pci, hal, dma)
            }
            if let Some(opts) = bareverbs_unikernel::nvmf_app::Options::parse(text) {
                let disk_at = pa + (pages * PAGE_SIZE) as u64;
                let bytes = opts.mib as usize * 1024 * 1024;
                if disk_at + bytes as u64 > ram_end {
                    let _ = writeln!(
                        Serial,
                        "bareverbs: FAIL nvmf: no room for a {} MiB RAM disk above the DMA region",
                        opts.mib
                    );
                    exit(Exit::Fail)
                }
                let at = disk_at as usize as *mut u8;
                // SAFETY: RAM from the firmware's memory map above the DMA region (which ends
                // at `disk_at`) and below the range's end, identity-mapped, used for nothing
                // else for the rest of the run.
                let ram = unsafe { core::slice::from_raw_parts_mut(at, bytes) };
                storage::appliance(&pci, hal, dma, &opts, ram)
            }
            if let Some(opts) = bareverbs_unikernel::roce_peer::Options::parse(text, seed) {
                roce_peer(&pci, hal, dma, &opts)
            }
            link_test(&pci, dma);
            roce(&pci, hal, dma)
        }
        Ok(Verdict::Pass) if dma_left(dma) == 0 => {
            let _ = writeln!(Serial, "DMA pages outstanding: 0");
            if let Some(ip) = peer_ip(start_info) {
                match peer::serve(hal, &pci, &mut Serial, Config::default(), ip) {
                    Ok(o) if o.failed == 0 && dma_left(dma) == 0 => {
                        let _ = writeln!(Serial, "peer mode: {} cases passed", o.cases);
                    }
                    Ok(o) => {
                        let left = dma_left(dma);
                        let _ = writeln!(
                            Serial,
                            "bareverbs: FAIL peer mode: {} of {} cases failed, {left} DMA pages not returned",
                            o.failed, o.cases
                        );
                        exit(Exit::Fail)
                    }
                    Err(f) => {
                        let _ = writeln!(Serial, "bareverbs: FAIL peer mode: {f}");
                        exit(Exit::Fail)
                    }
                }
            }
            pass()
        }
        Ok(Verdict::Pass) => {
            let left = dma_left(dma);
            let _ = writeln!(Serial, "bareverbs: FAIL {left} DMA pages not returned");
            exit(Exit::Fail)
        }
        Err(f) => {
            let v = |i: u8| irq::count(irq::DEVICE_VECTORS.start + i);
            let _ = writeln!(
                Serial,
                "CPU: device vectors taken {} / {} / {}, timer ticks {}, halts {}",
                v(0),
                v(1),
                v(2),
                irq::count(irq::TIMER_VECTOR),
                irq::halts()
            );
            let _ = writeln!(Serial, "bareverbs: FAIL {f}");
            exit(Exit::Fail)
        }
    }
}
