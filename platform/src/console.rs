//! Serial console (COM1), QEMU's isa-debug-exit and a `log` backend.

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
