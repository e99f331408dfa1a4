//! Interrupts for the example kernel, on stable Rust: the 8259 PICs silenced, the local APIC
//! (xAPIC, MMIO at its MSR base) on, an IDT whose entry stubs are written in `global_asm!`
//! (stable Rust has no `x86-interrupt` ABI), a periodic LAPIC timer as a safety net, and one
//! place where interrupts may arrive: [`wait`], an `sti; hlt; cli` window (and [`window`],
//! the same without the halt).
//!
//! Interrupts stay disabled (IF = 0) in all Rust code. Handlers therefore never interrupt a
//! lock holder, and the red zone that the precompiled `core` uses is never under the CPU's
//! interrupt frame: the window's `asm!` is not `nostack`, so the compiler keeps nothing below
//! the stack pointer across it. Facts: `docs/pvrdma.md` §13.1, §13.4, §13.5, §13.7.
//!
//! Device vectors are [`DEVICE_VECTORS`]; the handler counts each vector and ends with an EOI.
//! Exceptions (#DE, #UD, #DF, #GP, #PF) end the run with a FAIL line naming the vector and
//! the faulting instruction.

use core::arch::{asm, global_asm};
use core::cell::UnsafeCell;
use core::fmt::Write;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU32, Ordering};

use x86_64::VirtAddr;
use x86_64::instructions::port::Port;
use x86_64::registers::model_specific::Msr;
use x86_64::structures::idt::InterruptDescriptorTable;

use crate::wait::{Cpu, Entry};

use crate::console::{Exit, Serial, exit};
use crate::smp::{self, MAX_CPUS, cpu_id};

/// The vectors a device's MSI-X entries may name: 0x30 + entry index (3 entries on PVRDMA).
pub const DEVICE_VECTORS: core::ops::Range<u8> = 0x30..0x33;
/// The vector of the storage controllers' MSI-X messages (NVMe completions): counted and
/// acknowledged, routed nowhere; a driver that halted for a completion looks at its queue
/// after the window.
pub const STORAGE_VECTOR: u8 = 0x34;
/// The LAPIC timer's vector: bounds every halt (a lost wake-up costs one tick, not the run).
pub const TIMER_VECTOR: u8 = 0x40;
/// The vector [`wake`] sends: its handler only counts it ([`count_on`] gives the wake-ups a
/// CPU took), on every CPU, CPU 0 included (no device is routed to it).
pub const WAKE_VECTOR: u8 = 0x41;
/// The spurious-interrupt vector (SVR): handled without an EOI.
pub const SPURIOUS_VECTOR: u8 = 0xFF;

// Entry stubs. Each IRQ stub pushes its vector and joins the common path, which saves the
// System V caller-saved registers and the SSE state (fxsave64 into a 16-aligned area below
// the frame), clears DF, calls `irq_dispatch(vector)` on a 16-aligned stack, restores and
// returns with iretq. Vectors 0x30–0x41 and 0xFF push no error code.
// Exception stubs call `irq_fatal(vector, error code, rip)`, which does not return.
global_asm!(
    r#"
    .section .text.irq, "ax"
    .macro IRQ_STUB vec
    .globl irq_stub_\vec
irq_stub_\vec:
    push 0x\vec
    jmp irq_common
    .endm
    IRQ_STUB 30
    IRQ_STUB 31
    IRQ_STUB 32
    IRQ_STUB 34
    IRQ_STUB 40
    IRQ_STUB 41
    IRQ_STUB ff

irq_common:
    push rax
    push rcx
    push rdx
    push rsi
    push rdi
    push r8
    push r9
    push r10
    push r11
    push rbp
    mov rbp, rsp
    sub rsp, 512
    and rsp, -16
    fxsave64 [rsp]
    cld
    mov rdi, [rbp + 80]
    call irq_dispatch
    fxrstor64 [rsp]
    mov rsp, rbp
    pop rbp
    pop r11
    pop r10
    pop r9
    pop r8
    pop rdi
    pop rsi
    pop rdx
    pop rcx
    pop rax
    add rsp, 8
    iretq

    .macro EXC_STUB vec
    .globl exc_stub_\vec
exc_stub_\vec:
    mov edi, \vec
    xor esi, esi
    mov rdx, [rsp]
    and rsp, -16
    call irq_fatal
    ud2
    .endm
    .macro EXC_STUB_EC vec
    .globl exc_stub_\vec
exc_stub_\vec:
    mov edi, \vec
    mov rsi, [rsp]
    mov rdx, [rsp + 8]
    and rsp, -16
    call irq_fatal
    ud2
    .endm
    EXC_STUB 0
    EXC_STUB 6
    EXC_STUB_EC 8
    EXC_STUB_EC 13
    EXC_STUB_EC 14
    .text
"#
);

unsafe extern "C" {
    fn irq_stub_30();
    fn irq_stub_31();
    fn irq_stub_32();
    fn irq_stub_34();
    fn irq_stub_40();
    fn irq_stub_41();
    fn irq_stub_ff();
    fn exc_stub_0();
    fn exc_stub_6();
    fn exc_stub_8();
    fn exc_stub_13();
    fn exc_stub_14();
}

/// Interrupts taken, per CPU and vector: each CPU writes only its own row (1 KiB, its own
/// cache lines).
static COUNTS: [[AtomicU32; 256]; MAX_CPUS] =
    [const { [const { AtomicU32::new(0) }; 256] }; MAX_CPUS];
/// Halts taken in [`wait`], per CPU, each on its own cache line.
#[repr(align(64))]
struct Halts(AtomicU32);
static HALTS: [Halts; MAX_CPUS] = [const { Halts(AtomicU32::new(0)) }; MAX_CPUS];
/// The LAPIC's MMIO base (0 until [`init`]).
static LAPIC: AtomicU32 = AtomicU32::new(0);

/// The IDT: written once by [`init`] before `lidt`, read only by the CPU afterwards.
struct Idt(UnsafeCell<MaybeUninit<InterruptDescriptorTable>>);
// SAFETY: written only by `init`, on the bootstrap CPU before any other CPU starts, before
// the table is loaded and with interrupts off; afterwards only loaded (`lidt`) by the other
// CPUs, never written.
unsafe impl Sync for Idt {}
static IDT: Idt = Idt(UnsafeCell::new(MaybeUninit::uninit()));

/// The driver entry the device vectors go to.
struct Route(UnsafeCell<Option<Entry>>);
// SAFETY: the device vectors arrive on the bootstrap CPU only (the MSI messages name its
// LAPIC, and the dispatcher reads this on that CPU alone); written only by `route`, on that
// CPU, with interrupts off (outside `wait`), so never while the handler that reads it runs.
unsafe impl Sync for Route {}
static ROUTE: Route = Route(UnsafeCell::new(None));

/// Sends the device vectors to `entry` (or nowhere). Called with interrupts off, as all code
/// outside [`wait`] runs.
pub fn route(entry: Option<Entry>) {
    if cpu_id() != 0 {
        return;
    }
    // SAFETY: see `Route`: the handler cannot run now (interrupts are off).
    unsafe { *ROUTE.0.get() = entry };
}

/// The kernel's CPU as the demo waits on it.
pub struct KernelCpu;

impl Cpu for KernelCpu {
    fn route(&mut self, entry: Option<Entry>) {
        route(entry);
    }
    fn halt(&mut self) -> bool {
        wait();
        true
    }
    fn ticks(&self) -> u32 {
        count(TIMER_VECTOR)
    }
}

const LAPIC_ID: u32 = 0x020;
const LAPIC_TPR: u32 = 0x080;
const LAPIC_EOI: u32 = 0x0B0;
const LAPIC_SVR: u32 = 0x0F0;
const LAPIC_ICR_LOW: u32 = 0x300;
const LAPIC_ICR_HIGH: u32 = 0x310;
const LAPIC_TIMER_CURRENT: u32 = 0x390;
const LAPIC_TIMER: u32 = 0x320;
const LAPIC_LINT0: u32 = 0x350;
const LAPIC_TIMER_INITIAL: u32 = 0x380;
const LAPIC_TIMER_DIVIDE: u32 = 0x3E0;

fn lapic_write(reg: u32, value: u32) {
    let base = LAPIC.load(Ordering::Relaxed) as usize;
    debug_assert!(base != 0);
    // SAFETY: `base` is the LAPIC's MMIO page (from IA32_APIC_BASE, inside the identity-mapped,
    // uncached PCI hole); `reg` is one of the aligned 32-bit registers above.
    unsafe { ((base + reg as usize) as *mut u32).write_volatile(value) }
}

fn lapic_read(reg: u32) -> u32 {
    let base = LAPIC.load(Ordering::Relaxed) as usize;
    // SAFETY: as in `lapic_write`.
    unsafe { ((base + reg as usize) as *const u32).read_volatile() }
}

/// The 8259 pair remapped to 0x20/0x28 (off the exception vectors) and fully masked: SeaBIOS
/// leaves the PIT and the RTC unmasked, and the first `sti` would take the PIT on vector 8.
fn silence_pics() {
    let steps: [(u16, u8); 10] = [
        (0x20, 0x11),
        (0xA0, 0x11),
        (0x21, 0x20),
        (0xA1, 0x28),
        (0x21, 0x04),
        (0xA1, 0x02),
        (0x21, 0x01),
        (0xA1, 0x01),
        (0x21, 0xFF),
        (0xA1, 0xFF),
    ];
    for (port, value) in steps {
        // SAFETY: the PICs' command and data ports; this kernel is their only user and runs
        // with interrupts off.
        unsafe { Port::<u8>::new(port).write(value) }
    }
}

/// Sets up the PICs, the LAPIC, the bootstrap CPU's GDT and TSS, the IDT and the
/// safety-net timer. Interrupts stay off until [`wait`]. Returns the LAPIC ID (the
/// destination a device's MSI message must name).
pub fn init() -> u8 {
    silence_pics();
    // SAFETY: IA32_APIC_BASE exists on every x86-64 CPU; reading it has no side effect.
    let base = unsafe { Msr::new(0x1B).read() };
    // The base (bits 35:12); bit 11 (global enable) is never cleared: QEMU would not let it
    // be set again before a reset.
    LAPIC.store((base & 0xF_FFFF_F000) as u32, Ordering::Relaxed);
    lapic_on();
    smp::guard_stacks();
    smp::load_tables(0);

    let idt = IDT.0.get();
    // SAFETY: the only writer, before `lidt` (see `Idt`); the stubs are the handlers the
    // entries' types describe (the error-code ones for #DF, #GP, #PF; IRQ vectors have none).
    unsafe {
        (*idt).write(InterruptDescriptorTable::new());
        let t = (*idt).assume_init_mut();
        let at = |f: unsafe extern "C" fn()| VirtAddr::new(f as usize as u64);
        t.divide_error.set_handler_addr(at(exc_stub_0));
        t.invalid_opcode.set_handler_addr(at(exc_stub_6));
        // #DF and #PF on each CPU's interrupt stack (IST 1 of its TSS): a stack overflow
        // into the guard page is reported, not turned into a reset.
        t.double_fault
            .set_handler_addr(at(exc_stub_8))
            .set_stack_index(0);
        t.general_protection_fault.set_handler_addr(at(exc_stub_13));
        t.page_fault
            .set_handler_addr(at(exc_stub_14))
            .set_stack_index(0);
        t[0x30].set_handler_addr(at(irq_stub_30));
        t[0x31].set_handler_addr(at(irq_stub_31));
        t[0x32].set_handler_addr(at(irq_stub_32));
        t[STORAGE_VECTOR].set_handler_addr(at(irq_stub_34));
        t[TIMER_VECTOR].set_handler_addr(at(irq_stub_40));
        t[WAKE_VECTOR].set_handler_addr(at(irq_stub_41));
        t[SPURIOUS_VECTOR].set_handler_addr(at(irq_stub_ff));
        t.load_unsafe();
    }

    timer_on();
    lapic_id()
}

/// This CPU's LAPIC: LINT0 masked, every priority accepted, software-enabled with the
/// spurious vector.
fn lapic_on() {
    lapic_write(LAPIC_LINT0, 1 << 16);
    lapic_write(LAPIC_TPR, 0);
    lapic_write(LAPIC_SVR, 0x100 | SPURIOUS_VECTOR as u32);
}

/// The timer's period, in its counts (divide by 16, about 16 ms under QEMU's 1 GHz APIC
/// clock: 16 ns a count).
const TIMER_COUNTS: u32 = 1_000_000;

/// This CPU's periodic safety-net timer.
fn timer_on() {
    lapic_write(LAPIC_TIMER_DIVIDE, 0x3);
    lapic_write(LAPIC_TIMER, (1 << 17) | TIMER_VECTOR as u32);
    lapic_write(LAPIC_TIMER_INITIAL, TIMER_COUNTS);
}

/// A started CPU's interrupts: its LAPIC and timer, and the IDT the bootstrap CPU wrote.
pub(crate) fn init_ap() {
    lapic_on();
    // SAFETY: the IDT was written by `init` before this CPU was started and is only read now
    // (see `Idt`); its handlers are valid on every CPU.
    unsafe { (*IDT.0.get()).assume_init_ref().load_unsafe() };
    timer_on();
}

/// The running CPU's LAPIC ID.
pub fn lapic_id() -> u8 {
    (lapic_read(LAPIC_ID) >> 24) as u8
}

/// An inter-processor interrupt [`send_ipi`] sends.
#[derive(Clone, Copy)]
pub(crate) enum Ipi {
    /// INIT (level assert): the target waits for a start-up IPI.
    Init,
    /// Start-up with this vector: the target runs from physical `vector << 12` in real mode.
    Startup(u8),
}

/// Sends `ipi` to the CPU whose LAPIC ID is `apic`, and waits (bounded) until the LAPIC has
/// sent it.
pub(crate) fn send_ipi(apic: u8, ipi: Ipi) {
    let low = match ipi {
        Ipi::Init => 0x4500,
        Ipi::Startup(v) => 0x4600 | u32::from(v),
    };
    lapic_write(LAPIC_ICR_HIGH, u32::from(apic) << 24);
    lapic_write(LAPIC_ICR_LOW, low);
    for _ in 0..100_000 {
        if lapic_read(LAPIC_ICR_LOW) & (1 << 12) == 0 {
            break;
        }
        core::hint::spin_loop();
    }
}

/// Spins at least `us` microseconds (at most a timer period), on the LAPIC timer's count.
pub(crate) fn delay_us(us: u32) {
    // 16 ns a count (see TIMER_COUNTS).
    let want = (us.saturating_mul(1000) / 16).min(TIMER_COUNTS - 1);
    let t0 = lapic_read(LAPIC_TIMER_CURRENT);
    loop {
        let now = lapic_read(LAPIC_TIMER_CURRENT);
        // The count runs down and reloads at 0.
        let gone = if now <= t0 {
            t0 - now
        } else {
            t0 + (TIMER_COUNTS - now)
        };
        if gone >= want {
            return;
        }
        core::hint::spin_loop();
    }
}

/// One interrupt window: enables interrupts, halts until one arrives (at the latest the next
/// timer tick), and disables them again. An interrupt that was already pending is taken at once.
pub fn wait() {
    HALTS[cpu_id()].0.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the only place with IF = 1. Not `nostack` (the handlers' frames land below rsp,
    // so the compiler must keep nothing there) and not `nomem` (handlers change counters).
    unsafe { asm!("sti", "hlt", "cli") }
}

/// A window without the halt: takes the interrupts already pending (a timer tick that came
/// while the kernel polled) and goes on. What a polling loop calls to keep the clock moving.
pub fn window() {
    // SAFETY: as in `wait`: IF = 1 only for the instruction after `sti` (its shadow), where
    // pending interrupts are taken; the same rules for the stack and memory.
    unsafe { asm!("sti", "nop", "cli") }
}

/// Interrupts this CPU took on `vector` so far.
pub fn count(vector: u8) -> u32 {
    count_on(cpu_id(), vector)
}

/// Interrupts CPU `cpu` took on `vector` so far (0 for a CPU past [`MAX_CPUS`]).
pub fn count_on(cpu: usize, vector: u8) -> u32 {
    COUNTS
        .get(cpu)
        .map_or(0, |c| c[vector as usize].load(Ordering::Relaxed))
}

/// Halts this CPU took in [`wait`] so far.
pub fn halts() -> u32 {
    halts_on(cpu_id())
}

/// Halts CPU `cpu` took in [`wait`] so far (0 for a CPU past [`MAX_CPUS`]).
pub fn halts_on(cpu: usize) -> u32 {
    HALTS.get(cpu).map_or(0, |h| h.0.load(Ordering::Relaxed))
}

/// Sends `vector` to this CPU through the LAPIC (a fixed self-IPI): pending until the next
/// [`wait`].
pub fn self_ipi(vector: u8) {
    lapic_write(LAPIC_ICR_LOW, 0x4_0000 | vector as u32);
}

/// Wakes CPU `index` (0, the bootstrap CPU, or one [`smp::start`] started) from [`wait`], or
/// keeps its next [`wait`] from halting: a fixed IPI of [`WAKE_VECTOR`]. For a CPU that polls
/// what another produces. Nothing for the running CPU itself or an index no CPU has.
pub fn wake(index: usize) {
    let Some(apic) = smp::apic_id(index).filter(|_| index != cpu_id()) else {
        return;
    };
    // With interrupts off, so that nothing on this CPU writes the ICR between its halves.
    x86_64::instructions::interrupts::without_interrupts(|| {
        lapic_write(LAPIC_ICR_HIGH, apic << 24);
        lapic_write(LAPIC_ICR_LOW, u32::from(WAKE_VECTOR));
    });
}

/// Proves the path from the LAPIC to the dispatcher and back: a self-IPI on the last device
/// vector must be taken in the first window, and a window with nothing pending must end by
/// the timer. Returns the windows the IPI took.
pub fn self_test() -> Result<u32, &'static str> {
    let v = DEVICE_VECTORS.end - 1;
    let before = count(v);
    self_ipi(v);
    let mut windows = 0;
    while count(v) == before {
        if windows == 4 {
            return Err("a self-IPI was not delivered in 4 interrupt windows");
        }
        wait();
        windows += 1;
    }
    let ticks = count(TIMER_VECTOR);
    for _ in 0..4 {
        if count(TIMER_VECTOR) > ticks {
            return Ok(windows);
        }
        wait();
    }
    if count(TIMER_VECTOR) > ticks {
        Ok(windows)
    } else {
        Err("4 interrupt windows passed without a timer tick")
    }
}

#[unsafe(no_mangle)]
extern "C" fn irq_dispatch(vector: u64) {
    let v = vector as u8;
    let cpu = cpu_id();
    COUNTS[cpu][v as usize].fetch_add(1, Ordering::Relaxed);
    if cpu == 0 && DEVICE_VECTORS.contains(&v) {
        // SAFETY: see `Route`: written only with interrupts off, so stable while this runs;
        // `route(None)` comes before the context it names goes.
        if let Some(e) = unsafe { *ROUTE.0.get() } {
            // SAFETY: the entry's context is alive while it is routed (the demo unroutes
            // before dropping it).
            unsafe { e.run(u16::from(v - DEVICE_VECTORS.start)) };
        }
    }
    if v != SPURIOUS_VECTOR {
        lapic_write(LAPIC_EOI, 0);
    }
}

#[unsafe(no_mangle)]
extern "C" fn irq_fatal(vector: u64, error: u64, rip: u64) -> ! {
    if vector == 14 {
        let cr2: u64;
        // SAFETY: reads CR2 (the faulting address); no side effect.
        unsafe { asm!("mov {}, cr2", out(reg) cr2, options(nomem, nostack, preserves_flags)) };
        if let Some(cpu) = smp::guard_owner(cr2) {
            let _ = writeln!(
                Serial,
                "bareverbs: FAIL stack overflow: cpu {cpu}'s guard page hit at {cr2:#x} by {rip:#x}, on cpu {}",
                cpu_id()
            );
            exit(Exit::Fail)
        }
    }
    let _ = writeln!(
        Serial,
        "bareverbs: FAIL exception {vector} at {rip:#x} (error code {error:#x}) on cpu {}",
        cpu_id()
    );
    exit(Exit::Fail)
}
