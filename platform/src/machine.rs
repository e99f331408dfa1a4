//! The machine a kernel boots on: QEMU's PVH start info (its memory map and command line),
//! the DMA region in the largest RAM range above the image, the interrupt controller's
//! self-test, the PCI configuration ports, the boot stack's high-water mark, a millisecond
//! clock, and the software RoCE device over the machine's NIC (`nic.rs`).

use core::fmt::Write;
use core::ptr::NonNull;

use bareverbs::device::rxe::{Config as RoceConfig, Rxe};
use core::sync::atomic::{AtomicU32, Ordering};

use bareverbs::hal::virtio_net::GlobalIdentity;
use bareverbs::hal::{Clock, DmaRegion, IdentityHal, Link, PAGE_SIZE, x86::PortIoConfig};

use crate::console::{self, Exit, Serial, exit};
use crate::irq;
use crate::nic::{self, Nic};

/// The PVH start info's address, for [`roce_device`]'s `bvnic=` (set by [`start`]).
static START_INFO: AtomicU32 = AtomicU32::new(0);

unsafe extern "C" {
    /// The end of the kernel image (`linker/unikernel.ld`).
    static __image_end: u8;
    /// The boot stack (painted with a pattern before `kmain` runs; `boot.rs`).
    static boot_stack: u8;
    static boot_stack_top: u8;
}

/// Milliseconds without a received frame after which an idle loop halts the CPU, when a frame
/// does not interrupt.
pub const IDLE_MS: u64 = 32;

/// What [`start`] brought up.
pub struct Machine {
    /// The physical address of QEMU's `hvm_start_info`.
    pub start_info: u32,
    /// The HAL over the DMA region, with MSI messages to this CPU's device vectors.
    pub hal: IdentityHal<'static>,
    /// The DMA region.
    pub dma: &'static DmaRegion,
    /// PCI configuration mechanism #1.
    pub pci: PortIoConfig,
    /// Where the DMA region starts (physical), and its pages.
    pub dma_at: u64,
    /// The DMA region's pages.
    pub dma_pages: usize,
    /// Where the RAM range the region lies in ends (physical): the memory between the
    /// region's end and there is free.
    pub ram_end: u64,
}

impl Machine {
    /// The PVH command line (read into `buf`; `None` without one or if it is not UTF-8).
    pub fn cmdline<'b>(&self, buf: &'b mut [u8; CMDLINE]) -> Option<&'b str> {
        cmdline(self.start_info, buf)
    }

    /// Whether the PVH command line has the word `word`.
    pub fn cmdline_has(&self, word: &str) -> bool {
        let mut buf = [0u8; CMDLINE];
        self.cmdline(&mut buf)
            .is_some_and(|t| t.split_ascii_whitespace().any(|w| w == word))
    }

    /// DMA pages not given back to the region.
    pub fn dma_left(&self) -> usize {
        dma_left(self.dma)
    }

    /// Bytes of free RAM above the DMA region (what [`Machine::ram_above_dma`] may hand over).
    pub fn ram_room(&self) -> u64 {
        let at = self.dma_at + (self.dma_pages * PAGE_SIZE) as u64;
        self.ram_end.saturating_sub(at)
    }

    /// The free RAM above the DMA region, `bytes` of it, if the range has that much.
    ///
    /// # Safety
    ///
    /// Called at most once in the run (the memory is handed over for good).
    pub unsafe fn ram_above_dma(&self, bytes: usize) -> Option<&'static mut [u8]> {
        let at = self.dma_at + (self.dma_pages * PAGE_SIZE) as u64;
        if at + bytes as u64 > self.ram_end {
            return None;
        }
        // SAFETY: RAM from the firmware's memory map above the DMA region (which ends at
        // `at`) and below the range's end, identity-mapped, used for nothing else for the rest
        // of the run (our caller's promise).
        Some(unsafe { core::slice::from_raw_parts_mut(at as usize as *mut u8, bytes) })
    }
}

/// Brings the machine up: the console (with `banner` as its first line) and the `log`
/// backend, the local APIC and its self-test, the DMA region and the HAL over it, PCI. Ends
/// the run with FAIL when one of them is not there.
pub fn start(start_info: u32, banner: &str) -> Machine {
    START_INFO.store(start_info, Ordering::Relaxed);
    console::init();
    console::init_log();
    let _ = writeln!(Serial, "{banner}");
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
    // The HAL lives in a static (virtio-drivers reaches it without a value).
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
    Machine {
        start_info,
        hal,
        dma,
        // SAFETY: a PC has configuration mechanism #1; this kernel is the only user of the
        // ports (one `Machine` per run: `install` above succeeds once).
        pci: unsafe { PortIoConfig::new() },
        dma_at: pa,
        dma_pages: pages,
        ram_end,
    }
}

/// Ends a run that passed: each CPU's idle halts when [`crate::smp::start`] started others,
/// how much of the boot stack it used, the verdict, QEMU's exit.
pub fn pass() -> ! {
    if crate::smp::cpus() > 1 {
        let _ = write!(Serial, "smp: idle halts:");
        for i in 0..crate::smp::cpus() {
            let _ = write!(
                Serial,
                " cpu {i} (apic {}) {}",
                crate::smp::apic_id(i).unwrap_or(0),
                crate::smp::idle_halts(i).unwrap_or(0)
            );
        }
        let _ = writeln!(Serial);
    }
    let (used, size) = stack_used();
    let _ = writeln!(Serial, "stack: {used} of {size} bytes used");
    // The boot stack has no guard page below it (the boot page tables are there, mapped by
    // 2 MiB pages): a run that went past three quarters of it fails here, before a deeper one
    // overwrites the page tables.
    if used > size / 4 * 3 {
        let _ = writeln!(
            Serial,
            "bareverbs: FAIL the boot stack: {used} of {size} bytes used, over three quarters"
        );
        exit(Exit::Fail)
    }
    let _ = writeln!(Serial, "bareverbs: PASS");
    exit(Exit::Pass)
}

/// DMA pages not given back to the region.
pub fn dma_left(dma: &DmaRegion) -> usize {
    dma.total_pages() - dma.free_pages()
}

/// Bytes of the boot stack ever used (from the top down to the lowest byte whose paint is
/// gone), and its size.
pub fn stack_used() -> (usize, usize) {
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

/// Bytes of the PVH command line read at most. QEMU's PVH option ROM copies the command line
/// into a 4,096-byte buffer of its own, and a longer one does not boot (`docs/testing.md`):
/// what may grow past that (the RoCE lab's case list, some 4,700 bytes for its whole matrix)
/// goes in a fw_cfg file instead ([`crate::fw_cfg`]).
pub const CMDLINE: usize = 4096;

/// The PVH command line, read into `buf`.
fn cmdline(start_info: u32, buf: &mut [u8; CMDLINE]) -> Option<&str> {
    let info = start_info as usize as *const u8;
    // hvm_start_info: cmdline_paddr at 24 (0: none); the string is NUL-terminated.
    if info.is_null() {
        return None;
    }
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

/// An IPv4 address written `A.B.C.D`.
pub fn ipv4(s: &str) -> Option<[u8; 4]> {
    let mut ip = [0u8; 4];
    let mut parts = s.split('.');
    for x in &mut ip {
        *x = parts.next()?.parse().ok()?;
    }
    parts.next().is_none().then_some(ip)
}

/// DMA memory given to the driver at most (the region's bitmap limit is 128 MiB).
const DMA_MAX_PAGES: usize = 16 * 1024;

/// The largest RAM range above the kernel image from the PVH memory map, page-aligned: the DMA
/// region's (physical address, pages), and where the range ends.
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

/// Time for the RoCE transport's timers: the LAPIC timer's ticks (about 16 ms each).
#[derive(Clone, Copy)]
pub struct Ticks;

impl Clock for Ticks {
    fn now_us(&self) -> u64 {
        // Interrupts are off but in windows: take a tick that is due, so that a kernel that
        // polls without halting still sees time pass.
        irq::window();
        u64::from(irq::count(irq::TIMER_VECTOR)) * 16_000
    }
}

/// Milliseconds since boot, from the LAPIC timer's ticks.
pub fn clock_ms() -> u64 {
    Ticks.now_us() / 1000
}

/// The software RoCE device over the machine's NIC ([`nic::find`]: the first igb, else the
/// first e1000e, else the first virtio-net, or the family the command line's `bvnic=` names)
/// at IPv4 address `ip` (`setup` sees the NIC first); prints which NIC it is; ends the run if
/// there is none or it does not come up.
pub fn roce_device(
    pci: &PortIoConfig,
    hal: IdentityHal<'static>,
    ip: [u8; 4],
    setup: impl FnOnce(&mut Nic),
) -> Rxe<IdentityHal<'static>, Nic, Ticks> {
    let mut buf = [0u8; CMDLINE];
    let text = cmdline(START_INFO.load(Ordering::Relaxed), &mut buf).unwrap_or("");
    let only = match nic::Family::from_cmdline(text) {
        Ok(f) => f,
        Err(word) => {
            let _ = writeln!(
                Serial,
                "bareverbs: FAIL bvnic={word}: not igb, e1000e or virtio"
            );
            exit(Exit::Fail)
        }
    };
    let Some((family, address)) = nic::find(pci, only) else {
        let _ = writeln!(
            Serial,
            "roce: no {} NIC either",
            only.map_or("igb, e1000e or virtio-net", nic::Family::name)
        );
        exit(Exit::NoDevice)
    };
    let t0 = clock_ms();
    // SAFETY: the port accessor reaches every function; this kernel drives nothing else on
    // the NIC (a NIC taken before is gone: this takes it over anew); its BARs lie in the
    // identity-mapped, uncached PCI hole (the HAL's mapping).
    let mut nic = match unsafe { Nic::new(family, pci, hal, address, &clock_ms) } {
        Ok(n) => n,
        Err(e) => {
            let _ = writeln!(
                Serial,
                "bareverbs: FAIL roce: {} bring-up: {e}",
                family.name()
            );
            exit(Exit::Fail)
        }
    };
    // SAFETY: offset 0 of the function's header: no side effect.
    let id = unsafe { pci_types::ConfigRegionAccess::read(pci, address, 0) };
    let m = nic.mac();
    let _ = writeln!(
        Serial,
        "nic: {} {:04x}:{:04x} at {:02x}:{:02x}.{}, MAC {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}, up in {} ms",
        family.name(),
        id as u16,
        id >> 16,
        address.bus(),
        address.device(),
        address.function(),
        m[0],
        m[1],
        m[2],
        m[3],
        m[4],
        m[5],
        clock_ms() - t0
    );
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
        "roce: over {}, {}",
        family.name(),
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
pub fn route_nic_interrupts(pci: &PortIoConfig, hal: IdentityHal<'static>, nic: &mut Nic) -> bool {
    nic.route_interrupts(pci, hal)
}
