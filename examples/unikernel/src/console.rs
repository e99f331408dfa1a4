//! Serial console (COM1), QEMU's isa-debug-exit, a `log` backend, and the C symbols the
//! precompiled `core` of the linux-gnu target expects.

use core::arch::asm;
use core::fmt::{self, Write};

const COM1: u16 = 0x3F8;
const DEBUG_EXIT: u16 = 0xF4;

fn outb(port: u16, value: u8) {
    // SAFETY: port I/O to COM1 and isa-debug-exit, which this kernel owns; no memory access.
    unsafe { asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack)) }
}

fn inb(port: u16) -> u8 {
    let v: u8;
    // SAFETY: as in `outb`: a read of COM1's registers (line status, receive buffer).
    unsafe { asm!("in al, dx", out("al") v, in("dx") port, options(nomem, nostack)) }
    v
}

/// Sets COM1 to 38400 8N1, FIFO on.
pub fn init() {
    for (off, v) in [
        (1, 0x00),
        (3, 0x80),
        (0, 0x03),
        (1, 0x00),
        (3, 0x03),
        (2, 0xC7),
        (4, 0x0B),
    ] {
        outb(COM1 + off, v);
    }
}

/// The console as a `fmt::Write` sink.
pub struct Serial;

impl Write for Serial {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            if b == b'\n' {
                put(b'\r');
            }
            put(b);
        }
        Ok(())
    }
}

fn put(b: u8) {
    // Wait (bounded) for the transmit holding register to empty.
    for _ in 0..100_000 {
        if inb(COM1 + 5) & 0x20 != 0 {
            break;
        }
    }
    outb(COM1, b);
}

/// The next byte COM1 has received, if any: polls the line status register's data-ready bit
/// and reads the receive buffer register (no interrupts; QEMU holds further bytes back until
/// the FIFO has room, so none are lost).
pub fn try_get() -> Option<u8> {
    (inb(COM1 + 5) & 0x01 != 0).then(|| inb(COM1))
}

/// Exit codes through isa-debug-exit: QEMU exits with `(code << 1) | 1`.
#[derive(Clone, Copy)]
#[repr(u8)]
pub enum Exit {
    /// `bareverbs: PASS` — QEMU status 33.
    Pass = 0x10,
    /// `bareverbs: FAIL …` — QEMU status 35.
    Fail = 0x11,
    /// No PVRDMA on the bus — QEMU status 37.
    NoDevice = 0x12,
}

/// Leaves QEMU with `code`.
pub fn exit(code: Exit) -> ! {
    outb(DEBUG_EXIT, code as u8);
    loop {
        // SAFETY: halting with interrupts off; only reached without isa-debug-exit.
        unsafe { asm!("cli; hlt", options(nomem, nostack)) }
    }
}

struct Logger;

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let _ = writeln!(Serial, "[{}] {}", r.level(), r.args());
        }
    }
    fn flush(&self) {}
}

static LOGGER: Logger = Logger;

/// Sends the driver's `log` output to the console.
pub fn init_log() {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let _ = writeln!(Serial, "bareverbs: FAIL panic: {info}");
    exit(Exit::Fail)
}

// The C symbols the precompiled `core` calls. Byte loops with volatile accesses, so that the
// compiler cannot turn them back into calls to themselves.

/// # Safety
///
/// C `memcpy`: `dst` and `src` valid for `n` bytes, not overlapping.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    for i in 0..n {
        // SAFETY: the caller's contract: both ranges are valid for `n` bytes.
        unsafe { dst.add(i).write_volatile(src.add(i).read_volatile()) };
    }
    dst
}

/// # Safety
///
/// C `memmove`: `dst` and `src` valid for `n` bytes; they may overlap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize) < (src as usize) {
        for i in 0..n {
            // SAFETY: the caller's contract; copying forwards is safe when dst < src.
            unsafe { dst.add(i).write_volatile(src.add(i).read_volatile()) };
        }
    } else {
        for i in (0..n).rev() {
            // SAFETY: the caller's contract; copying backwards is safe when dst >= src.
            unsafe { dst.add(i).write_volatile(src.add(i).read_volatile()) };
        }
    }
    dst
}

/// # Safety
///
/// C `memset`: `dst` valid for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    for i in 0..n {
        // SAFETY: the caller's contract: `dst` is valid for `n` bytes.
        unsafe { dst.add(i).write_volatile(c as u8) };
    }
    dst
}

/// # Safety
///
/// C `memcmp`: `a` and `b` valid for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        // SAFETY: the caller's contract: both ranges are valid for `n` bytes.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
    }
    0
}

/// # Safety
///
/// C `bcmp`: as `memcmp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { memcmp(a, b, n) }
}

/// Referenced by `core`'s unwind tables even with panic=abort; never called.
#[unsafe(no_mangle)]
pub extern "C" fn rust_eh_personality() {}
