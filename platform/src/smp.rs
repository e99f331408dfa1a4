//! Every CPU of the machine: the processors the ACPI MADT lists are started with the
//! INIT-SIPI-SIPI sequence through the local APIC (xAPIC), one after the other, through a
//! real-mode trampoline copied below 1 MiB that switches to long mode and calls into Rust on
//! the new CPU. `docs/smp.md` describes the sequence, its delays and its sources.
//!
//! Each CPU has its own stack (with an unmapped guard page below it), its own GDT and TSS (with
//! an interrupt stack, itself guarded, for #DF and #PF, so that a stack overflow is reported
//! instead of resetting the machine), its own local APIC timer and its own interrupt and
//! idle-halt counters. The IDT is one table for all CPUs: it is written once by the bootstrap
//! CPU before any other starts and only read by the CPUs afterwards; what differs per CPU (the
//! interrupt stacks) is in each CPU's TSS.
//!
//! A CPU that does not answer within [`ANSWER_TICKS`] timer ticks is sent INIT again (back to
//! waiting), reported and left out; the others go on. [`start`] runs an entry function on
//! every started CPU; [`cpu_id`] names the CPU running; [`PerCpu`] is data each CPU has its
//! own slot of, written by that CPU alone, so that no lock or cache line is shared.

use core::arch::{asm, global_asm};
use core::cell::{Cell, UnsafeCell};
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use x86_64::VirtAddr;
use x86_64::instructions::tables::{lgdt, load_tss};
use x86_64::registers::model_specific::Msr;
use x86_64::structures::DescriptorTablePointer;
use x86_64::structures::gdt::SegmentSelector;
use x86_64::structures::tss::TaskStateSegment;

pub use crate::acpi::MAX_CPUS;
use crate::acpi::{self, AcpiError, PhysMem};
use crate::console::Serial;
use crate::irq;

/// Where the trampoline is copied (physical; its page number is the SIPI vector).
pub const TRAMPOLINE: u64 = 0x8000;
/// Timer ticks (about 16 ms each) a CPU has to answer its start-up IPIs.
pub const ANSWER_TICKS: u32 = 64;

/// Each CPU's slot in the stacks' region: a guard page, the interrupt stack, a guard page,
/// the stack.
const SLOT: usize = 128 * 1024;
const GUARD: usize = 4096;
const IST_SIZE: usize = 12 * 1024;
/// The region: one 2 MiB page of the boot page tables, split into 4 KiB pages so that the
/// guards can be left unmapped.
const REGION: usize = 2 * 1024 * 1024;
const _: () = assert!(SLOT * MAX_CPUS == REGION);
/// Bytes of each CPU's stack (the bootstrap CPU keeps its boot stack).
pub const STACK_SIZE: usize = SLOT - 2 * GUARD - IST_SIZE;

#[repr(C, align(0x20_0000))]
struct Stacks(UnsafeCell<[u8; REGION]>);
// SAFETY: the region is only used as stacks, each slot by its one CPU (through `rsp` and the
// TSS), never through Rust references.
unsafe impl Sync for Stacks {}
static STACKS: Stacks = Stacks(UnsafeCell::new([0; REGION]));

#[repr(C, align(4096))]
struct PageTable(UnsafeCell<[u64; 512]>);
// SAFETY: written once by `guard_stacks` on the bootstrap CPU before any other CPU runs.
unsafe impl Sync for PageTable {}
static STACKS_PT: PageTable = PageTable(UnsafeCell::new([0; 512]));

/// One CPU's descriptor tables.
#[repr(C, align(64))]
struct Tables {
    gdt: [u64; 5],
    tss: TaskStateSegment,
}
struct TablesCell(UnsafeCell<Tables>);
// SAFETY: slot i is written only by CPU i in `load_tables`, before it loads them.
unsafe impl Sync for TablesCell {}
static TABLES: [TablesCell; MAX_CPUS] = [const {
    TablesCell(UnsafeCell::new(Tables {
        gdt: [0; 5],
        tss: TaskStateSegment::new(),
    }))
}; MAX_CPUS];

/// What the CPUs know of themselves: the block `gs` points at (the index first), and what the
/// bootstrap CPU reads of the others.
#[repr(C, align(64))]
struct Local {
    index: u64,
    apic: AtomicU32,
    up: AtomicBool,
}
static LOCAL: [Local; MAX_CPUS] = {
    let mut l = [const {
        Local {
            index: 0,
            apic: AtomicU32::new(0),
            up: AtomicBool::new(false),
        }
    }; MAX_CPUS];
    let mut i = 0;
    while i < MAX_CPUS {
        l[i].index = i as u64;
        i += 1;
    }
    l
};
/// Whether `gs` points at the running CPU's `Local` (set once the bootstrap CPU's is).
static GS_READY: AtomicBool = AtomicBool::new(false);
/// CPUs started (the bootstrap CPU included); 0 before [`start`].
static STARTED: AtomicUsize = AtomicUsize::new(0);
/// The entry function the started CPUs run (a `fn(usize)`).
static ENTRY: AtomicUsize = AtomicUsize::new(0);

const CODE64: u64 = 0x00AF_9A00_0000_FFFF;
const DATA: u64 = 0x00CF_9200_0000_FFFF;
const TSS_SELECTOR: u16 = 0x18;

/// The index of the CPU running this: 0 for the bootstrap CPU, then 1, 2, … in the order the
/// CPUs started. Always below [`MAX_CPUS`].
#[inline]
pub fn cpu_id() -> usize {
    if !GS_READY.load(Ordering::Relaxed) {
        return 0;
    }
    let i: u64;
    // SAFETY: `gs` points at this CPU's `Local` (GS_READY), whose first field is its index;
    // a plain read.
    unsafe {
        asm!("mov {}, qword ptr gs:[0]", out(reg) i, options(nostack, readonly, preserves_flags))
    };
    (i as usize).min(MAX_CPUS - 1)
}

/// CPUs running: those [`start`] started (the bootstrap CPU included), 1 before.
pub fn cpus() -> usize {
    STARTED.load(Ordering::Acquire).max(1)
}

/// CPU `index`'s local APIC ID.
pub fn apic_id(index: usize) -> Option<u32> {
    (index < cpus()).then(|| LOCAL[index].apic.load(Ordering::Relaxed))
}

/// The idle halts CPU `index` took so far ([`irq::wait`] on that CPU).
pub fn idle_halts(index: usize) -> Option<u32> {
    (index < cpus()).then(|| irq::halts_on(index))
}

/// The timer ticks CPU `index` took so far.
pub fn timer_ticks(index: usize) -> Option<u32> {
    (index < cpus()).then(|| irq::count_on(index, irq::TIMER_VECTOR))
}

/// The CPU whose guard page (below its stack or its interrupt stack) `addr` lies in.
pub fn guard_owner(addr: u64) -> Option<usize> {
    let off = usize::try_from(addr.checked_sub(STACKS.0.get() as u64)?).ok()?;
    let at = off % SLOT;
    let guard = at < GUARD || (GUARD + IST_SIZE..2 * GUARD + IST_SIZE).contains(&at);
    (off < REGION && guard).then_some(off / SLOT)
}

/// Splits the stacks' 2 MiB page into 4 KiB pages, leaving each slot's two guard pages
/// unmapped. Runs once, on the bootstrap CPU, before the tables are loaded.
pub(crate) fn guard_stacks() {
    unsafe extern "C" {
        /// The boot page directories (`boot.rs`): 2,048 entries of 2 MiB for 0–4 GiB.
        static mut boot_pd: u64;
    }
    let region = STACKS.0.get() as usize;
    let pt = STACKS_PT.0.get();
    for i in 0..512 {
        let off = i * 4096;
        let at = off % SLOT;
        let guard = at < GUARD || (GUARD + IST_SIZE..2 * GUARD + IST_SIZE).contains(&at);
        // SAFETY: our page table, not yet in use (see `PageTable`).
        unsafe { (*pt)[i] = if guard { 0 } else { (region + off) as u64 | 3 } };
    }
    // SAFETY: the region is 2 MiB-aligned inside the identity-mapped 0–4 GiB, so entry
    // `region >> 21` of the four contiguous page directories maps it; the new entry maps the
    // same addresses save the guards. No other CPU runs; the CR3 reload flushes this one's TLB.
    unsafe {
        let pd = core::ptr::addr_of_mut!(boot_pd);
        pd.add(region >> 21).write_volatile(pt as u64 | 3);
        asm!("mov {0}, cr3", "mov cr3, {0}", out(reg) _, options(nostack, preserves_flags));
    }
}

/// Fills and loads CPU `index`'s GDT and TSS (its interrupt stack in IST 1) and points `gs`
/// at its `Local`. Called once on each CPU, by that CPU.
pub(crate) fn load_tables(index: usize) {
    let index = index.min(MAX_CPUS - 1);
    let slot = STACKS.0.get() as usize + index * SLOT;
    let t = TABLES[index].0.get();
    // SAFETY: slot `index` is this CPU's alone (see `TablesCell`); the GDT keeps the boot
    // GDT's code and data selectors (0x08, 0x10), so the segment registers stay valid; the
    // TSS descriptor names this CPU's TSS, which lives as long as the run; `gs` points at this
    // CPU's `Local`, a static.
    unsafe {
        let tss = core::ptr::addr_of_mut!((*t).tss);
        tss.write(TaskStateSegment::new());
        (*tss).interrupt_stack_table[0] = VirtAddr::new((slot + GUARD + IST_SIZE) as u64);
        let base = tss as u64;
        let limit = (size_of::<TaskStateSegment>() - 1) as u64;
        let low = (limit & 0xFFFF)
            | (base & 0xFF_FFFF) << 16
            | 0x89 << 40
            | (limit >> 16 & 0xF) << 48
            | (base >> 24 & 0xFF) << 56;
        (*t).gdt = [0, CODE64, DATA, low, base >> 32];
        lgdt(&DescriptorTablePointer {
            limit: (5 * 8 - 1) as u16,
            base: VirtAddr::new(core::ptr::addr_of!((*t).gdt) as u64),
        });
        load_tss(SegmentSelector(TSS_SELECTOR));
        Msr::new(0xC000_0101).write(core::ptr::addr_of!(LOCAL[index]) as u64);
    }
    LOCAL[index]
        .apic
        .store(u32::from(irq::lapic_id()), Ordering::Relaxed);
    if index == 0 {
        GS_READY.store(true, Ordering::Release);
    }
}

// The trampoline: copied to TRAMPOLINE and entered there in real mode by the start-up IPI
// (CS = TRAMPOLINE >> 4, IP = 0). It claims the start (a CPU that comes late finds the claim
// taken and parks), loads its GDT, enables PAE with the boot page tables, long mode, paging
// and SSE in one step, jumps to its 64-bit code, turns the AVX state on as the bootstrap CPU
// did, and calls the entry with the index on the stack the bootstrap CPU wrote. Addresses inside are TRAMPOLINE + offset (DS = 0).
global_asm!(
    r#"
    .section .rodata.ap_trampoline, "a"
    .balign 16
    .globl ap_tramp_start, ap_tramp_end, ap_tramp_claim, ap_tramp_cr3
    .globl ap_tramp_stack, ap_tramp_entry, ap_tramp_index
    .set T, 0x8000
    .code16
ap_tramp_start:
    cli
    cld
    xorw %ax, %ax
    movw %ax, %ds
    xchgw %ax, (ap_tramp_claim - ap_tramp_start + T)
    testw %ax, %ax
    jz 2f
    lgdtl (ap_tramp_gdt_ptr - ap_tramp_start + T)
    movl %cr4, %eax
    orl $0x620, %eax
    movl %eax, %cr4
    movl (ap_tramp_cr3 - ap_tramp_start + T), %eax
    movl %eax, %cr3
    movl $0xC0000080, %ecx
    rdmsr
    orl $0x100, %eax
    wrmsr
    movl %cr0, %eax
    andl $0xFFFFFFF3, %eax
    orl $0x80000003, %eax
    movl %eax, %cr0
    ljmpl $0x08, $(ap_tramp_long - ap_tramp_start + T)
2:  cli
    hlt
    jmp 2b

    .code64
ap_tramp_long:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    xorw %ax, %ax
    movw %ax, %fs
    movw %ax, %gs
    movq (ap_tramp_stack - ap_tramp_start + T), %rsp
    /* The AVX state on, as the first CPU turned it on (platform/src/boot.rs). */
    movl $1, %eax
    cpuid
    andl $0x14000000, %ecx
    cmpl $0x14000000, %ecx
    jne 4f
    movq %cr4, %rax
    orq $0x40000, %rax
    movq %rax, %cr4
    xorl %ecx, %ecx
    xorl %edx, %edx
    movl $7, %eax
    xsetbv
4:  movq (ap_tramp_index - ap_tramp_start + T), %rdi
    movq (ap_tramp_entry - ap_tramp_start + T), %rax
    callq *%rax
3:  cli
    hlt
    jmp 3b

    .balign 8
ap_tramp_gdt:
    .quad 0
    .quad 0x00AF9A000000FFFF
    .quad 0x00CF92000000FFFF
ap_tramp_gdt_ptr:
    .word 23
    .long ap_tramp_gdt - ap_tramp_start + T
    .balign 8
ap_tramp_claim: .quad 0
ap_tramp_cr3:   .quad 0
ap_tramp_stack: .quad 0
ap_tramp_entry: .quad 0
ap_tramp_index: .quad 0
ap_tramp_end:
    .text
"#,
    options(att_syntax)
);

unsafe extern "C" {
    static ap_tramp_start: u8;
    static ap_tramp_end: u8;
    static ap_tramp_claim: u8;
    static ap_tramp_cr3: u8;
    static ap_tramp_stack: u8;
    static ap_tramp_entry: u8;
    static ap_tramp_index: u8;
}

/// Where a trampoline field lives once copied.
fn field(sym: *const u8) -> *mut u64 {
    let start = core::ptr::addr_of!(ap_tramp_start) as u64;
    (TRAMPOLINE + (sym as u64 - start)) as usize as *mut u64
}

/// Where the other CPUs enter Rust: their tables, their local APIC, then the entry function,
/// then idle halts for the rest of the run.
extern "C" fn ap_main(index: u64) -> ! {
    let index = (index as usize).min(MAX_CPUS - 1);
    load_tables(index);
    irq::init_ap();
    LOCAL[index].up.store(true, Ordering::Release);
    let entry = ENTRY.load(Ordering::Acquire);
    if entry != 0 {
        // SAFETY: `start` stored a `fn(usize)` there before any start-up IPI.
        let f: fn(usize) = unsafe { core::mem::transmute::<usize, fn(usize)>(entry) };
        f(index);
    }
    loop {
        irq::wait();
    }
}

/// Physical memory the ACPI tables may be read from: the first MiB (the BIOS areas) and the
/// ranges the PVH memory map lists, below 4 GiB (the identity map).
struct Firmware {
    ranges: [(u64, u64); 32],
    n: usize,
    /// Whether the trampoline's page is RAM the memory map lists, away from the start info,
    /// its memory map and its command line (what the boot protocol handed over).
    trampoline_free: bool,
}

impl Firmware {
    fn from_start_info(start_info: u32) -> (Self, Option<u64>) {
        let mut fw = Firmware {
            ranges: [(0, 0); 32],
            n: 1,
            trampoline_free: false,
        };
        fw.ranges[0] = (0, 0x10_0000);
        let info = start_info as usize as *const u8;
        if info.is_null() {
            return (fw, None);
        }
        // hvm_start_info: magic at 0, version at 4, rsdp_paddr at 32 (version 1 and later),
        // memmap_paddr at 40, memmap_entries at 48.
        // SAFETY: QEMU hands over a valid hvm_start_info; memory is identity-mapped.
        let (magic, version, cmdline, rsdp, memmap, entries) = unsafe {
            (
                info.cast::<u32>().read_unaligned(),
                info.add(4).cast::<u32>().read_unaligned(),
                info.add(24).cast::<u64>().read_unaligned(),
                info.add(32).cast::<u64>().read_unaligned(),
                info.add(40).cast::<u64>().read_unaligned(),
                info.add(48).cast::<u32>().read_unaligned(),
            )
        };
        if magic != 0x336E_C578 {
            return (fw, None);
        }
        let page = TRAMPOLINE..TRAMPOLINE + 4096;
        let clear = |at: u64, len: u64| at.saturating_add(len) <= page.start || at >= page.end;
        let entries = entries.min(31);
        fw.trampoline_free = clear(u64::from(start_info), 56)
            && clear(memmap, u64::from(entries) * 24)
            && (cmdline == 0 || clear(cmdline, crate::machine::CMDLINE as u64));
        let mut ram = false;
        for i in 0..entries as usize {
            // SAFETY: the table QEMU built (checked magic), 24-byte entries, identity-mapped.
            let (addr, size, ty) = unsafe {
                let e = (memmap as usize + i * 24) as *const u8;
                (
                    e.cast::<u64>().read_unaligned(),
                    e.add(8).cast::<u64>().read_unaligned(),
                    e.add(16).cast::<u32>().read_unaligned(),
                )
            };
            let end = addr.saturating_add(size).min(1 << 32);
            ram |= ty == 1 && addr <= page.start && end >= page.end;
            if addr < end {
                fw.ranges[fw.n] = (addr, end);
                fw.n += 1;
            }
        }
        fw.trampoline_free &= ram;
        (fw, (version >= 1 && rsdp != 0).then_some(rsdp))
    }
}

impl PhysMem for Firmware {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let Some(end) = addr.checked_add(buf.len() as u64) else {
            return false;
        };
        if !self.ranges[..self.n]
            .iter()
            .any(|&(s, e)| addr >= s && end <= e)
        {
            return false;
        }
        for (i, b) in buf.iter_mut().enumerate() {
            // SAFETY: inside a range the firmware's memory map lists (or the first MiB),
            // below 4 GiB: identity-mapped; read as plain bytes.
            *b = unsafe { ((addr as usize + i) as *const u8).read_volatile() };
        }
        true
    }
}

/// What [`start`] did.
#[derive(Clone, Copy, Debug)]
pub struct Report {
    apic: [u32; MAX_CPUS],
    started: usize,
    left_out: [u32; MAX_CPUS],
    left: usize,
    /// Why the MADT could not be used (then only the bootstrap CPU runs).
    pub acpi: Option<AcpiError>,
    /// Whether the trampoline's page was refused (not free RAM: then only the bootstrap CPU
    /// runs).
    pub no_trampoline: bool,
    /// Processors the MADT lists as not enabled.
    pub disabled: usize,
    /// Enabled processors the MADT lists that are not started: duplicates, past
    /// [`MAX_CPUS`], or IDs an xAPIC cannot address.
    pub dropped: usize,
}

impl Report {
    /// The local APIC IDs of the CPUs started, by index.
    pub fn started(&self) -> &[u32] {
        &self.apic[..self.started]
    }
    /// The local APIC IDs of the CPUs that did not answer.
    pub fn left_out(&self) -> &[u32] {
        &self.left_out[..self.left]
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "smp: {} cpus started (apic ids", self.started)?;
        for a in self.started() {
            write!(f, " {a}")?;
        }
        write!(f, "), {} left out", self.left)?;
        if self.left > 0 {
            write!(f, " (apic ids")?;
            for a in self.left_out() {
                write!(f, " {a}")?;
            }
            write!(f, ")")?;
        }
        if self.disabled + self.dropped > 0 {
            write!(
                f,
                "; the MADT's {} disabled and {} not startable",
                self.disabled, self.dropped
            )?;
        }
        if self.no_trampoline {
            write!(f, "; the trampoline's page {TRAMPOLINE:#x} is not free RAM")?;
        }
        if let Some(e) = self.acpi {
            write!(f, "; ACPI: {e}")?;
        }
        Ok(())
    }
}

/// Waits until `ticks` timer ticks passed on this CPU or `done` holds; whether it held.
fn wait_ticks(ticks: u32, done: impl Fn() -> bool) -> bool {
    let t0 = irq::count(irq::TIMER_VECTOR);
    while !done() {
        if irq::count(irq::TIMER_VECTOR).wrapping_sub(t0) >= ticks {
            return done();
        }
        irq::wait();
    }
    true
}

/// Starts every other CPU the MADT lists (found through the PVH start info's RSDP pointer or
/// the BIOS areas), one after the other, and has each run `entry(index)` and then idle;
/// prints the [`Report`] line and returns it. Runs once, on the bootstrap CPU, after
/// [`crate::machine::start`] (the interrupts are set up). Without usable tables, or with one
/// CPU, only the bootstrap CPU runs.
pub fn start(start_info: u32, entry: fn(usize)) -> Report {
    start_with(start_info, entry, None)
}

/// [`start`], but the CPU with LAPIC ID `silent` (if listed) is sent INIT and no start-up
/// IPI: a CPU that never answers, for the check that it is reported and left out while the
/// others start.
pub fn start_with(start_info: u32, entry: fn(usize), silent: Option<u32>) -> Report {
    let me = u32::from(irq::lapic_id());
    let mut r = Report {
        apic: [0; MAX_CPUS],
        started: 1,
        left_out: [0; MAX_CPUS],
        left: 0,
        acpi: None,
        no_trampoline: false,
        disabled: 0,
        dropped: 0,
    };
    r.apic[0] = me;
    if STARTED.load(Ordering::Acquire) != 0 {
        return r;
    }
    ENTRY.store(entry as *const () as usize, Ordering::Release);
    let (fw, hint) = Firmware::from_start_info(start_info);
    let madt = acpi::find_rsdp(&fw, hint).and_then(|at| acpi::read_madt(&fw, at));
    match madt {
        Err(e) => r.acpi = Some(e),
        Ok(_) if !fw.trampoline_free => r.no_trampoline = true,
        Ok(madt) => {
            r.disabled = madt.disabled;
            r.dropped = madt.dropped;
            let len = core::ptr::addr_of!(ap_tramp_end) as usize
                - core::ptr::addr_of!(ap_tramp_start) as usize;
            // SAFETY: the trampoline's bytes, copied to TRAMPOLINE: a page of RAM the memory
            // map lists, below the image, away from what the boot protocol handed over
            // (`trampoline_free`), identity-mapped; no other CPU runs code there yet.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    core::ptr::addr_of!(ap_tramp_start),
                    TRAMPOLINE as usize as *mut u8,
                    len,
                );
                let cr3: u64;
                asm!("mov {}, cr3", out(reg) cr3, options(nomem, nostack, preserves_flags));
                field(core::ptr::addr_of!(ap_tramp_cr3)).write_volatile(cr3);
                field(core::ptr::addr_of!(ap_tramp_entry))
                    .write_volatile(ap_main as *const () as u64);
            }
            for cpu in madt.cpus().iter().filter(|c| c.apic_id != me) {
                let index = r.started;
                if index == MAX_CPUS || cpu.apic_id > 0xFE {
                    r.dropped += 1;
                    continue;
                }
                if start_one(cpu.apic_id as u8, index, silent == Some(cpu.apic_id)) {
                    r.apic[index] = LOCAL[index].apic.load(Ordering::Relaxed);
                    r.started += 1;
                    STARTED.store(r.started, Ordering::Release);
                } else {
                    r.left_out[r.left] = cpu.apic_id;
                    r.left += 1;
                }
            }
        }
    }
    STARTED.store(r.started, Ordering::Release);
    let _ = writeln!(Serial, "{r}");
    r
}

/// INIT, 10 ms, SIPI, 200 µs, SIPI to the CPU with `apic`, to come up as `index`; waits for
/// it to say it is up. A CPU that does not answer is sent INIT again (back to waiting for a
/// SIPI) and the trampoline's claim withdrawn.
fn start_one(apic: u8, index: usize, silent: bool) -> bool {
    let slot = STACKS.0.get() as usize + index * SLOT;
    // SAFETY: the trampoline page (copied by `start`); no CPU runs there now: the previous
    // one has answered or was sent INIT, and this one's claim is not set yet.
    unsafe {
        field(core::ptr::addr_of!(ap_tramp_stack)).write_volatile((slot + SLOT) as u64);
        field(core::ptr::addr_of!(ap_tramp_index)).write_volatile(index as u64);
        field(core::ptr::addr_of!(ap_tramp_claim)).write_volatile(1);
    }
    let vector = (TRAMPOLINE >> 12) as u8;
    let up = || LOCAL[index].up.load(Ordering::Acquire);
    irq::send_ipi(apic, irq::Ipi::Init);
    // At least 10 ms: two tick boundaries.
    wait_ticks(2, || false);
    if !silent {
        irq::send_ipi(apic, irq::Ipi::Startup(vector));
        irq::delay_us(200);
        if !up() {
            irq::send_ipi(apic, irq::Ipi::Startup(vector));
        }
    }
    if wait_ticks(ANSWER_TICKS, up) {
        return true;
    }
    irq::send_ipi(apic, irq::Ipi::Init);
    // SAFETY: as above; a CPU that comes late finds no claim and parks.
    unsafe { field(core::ptr::addr_of!(ap_tramp_claim)).write_volatile(0) };
    false
}

/// A value each CPU has its own slot of, on its own cache lines: CPU i reaches only slot i
/// ([`PerCpu::with`]), so nothing is shared between CPUs and no lock is taken. Not for
/// interrupt handlers (all Rust code runs with interrupts off, outside [`irq::wait`]).
pub struct PerCpu<T> {
    init: fn() -> T,
    slots: [Slot<T>; MAX_CPUS],
}

#[repr(align(64))]
struct Slot<T> {
    busy: Cell<bool>,
    value: UnsafeCell<Option<T>>,
}

// SAFETY: slot i is reached only by CPU i (`with` indexes by `cpu_id`), one borrow at a time
// (`busy`); a `T` made on one CPU stays there, so `T: Send` is enough.
unsafe impl<T: Send> Sync for PerCpu<T> {}

impl<T> PerCpu<T> {
    /// A per-CPU value each CPU makes with `init` on its first [`PerCpu::with`].
    pub const fn new(init: fn() -> T) -> Self {
        PerCpu {
            init,
            slots: [const {
                Slot {
                    busy: Cell::new(false),
                    value: UnsafeCell::new(None),
                }
            }; MAX_CPUS],
        }
    }

    /// Runs `f` on this CPU's value; `None` when this CPU is already inside a `with` of the
    /// same value (a second `&mut` is never handed out).
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let slot = &self.slots[cpu_id()];
        if slot.busy.replace(true) {
            return None;
        }
        // SAFETY: this CPU's slot (no other CPU reaches it) and not borrowed (`busy`).
        let v = unsafe { &mut *slot.value.get() };
        let r = f(v.get_or_insert_with(self.init));
        slot.busy.set(false);
        Some(r)
    }
}
