//! The ACPI tables the SMP bring-up reads: the RSDP, the RSDT or XSDT, and the MADT (its
//! processor entries). Pure parsing over a [`PhysMem`] reader, so that the host tests feed it
//! well-formed and hostile tables alike; `docs/smp.md` gives the layouts and their sources.
//!
//! Firmware input is not trusted: every length and count read from a table is bounded before
//! it sizes a read or a loop, every table's checksum is checked, and what is wrong comes back
//! as an [`AcpiError`]. Nothing is indexed by a table's value.

use core::fmt;

/// CPUs the parser reports at most (and the platform starts at most).
pub const MAX_CPUS: usize = 16;

/// The longest MADT accepted (bytes): a few thousand CPUs' entries, far more than a machine
/// this platform runs on has.
pub const MAX_MADT_LEN: u32 = 64 * 1024;

/// Tables an RSDT or XSDT may list at most.
pub const MAX_TABLES: u32 = 256;

/// Reads physical memory for the parser.
pub trait PhysMem {
    /// Fills `buf` from physical address `addr`; false when that range may not be read.
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;
}

/// What is wrong with the firmware's tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcpiError {
    /// No RSDP at the address given nor in the BIOS areas.
    NoRsdp,
    /// The RSDP's checksum (or its extended checksum) is not zero.
    RsdpChecksum,
    /// A range the reader refused: a table pointer outside readable memory.
    Unreadable {
        /// Where the read started.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// A table's signature is not the one its pointer promised.
    Signature {
        /// The signature expected.
        expected: [u8; 4],
        /// The signature found.
        found: [u8; 4],
    },
    /// A table's length is shorter than its own header or longer than the bound.
    Length {
        /// The table.
        table: [u8; 4],
        /// The length it claims.
        len: u32,
    },
    /// A table's bytes do not sum to zero.
    Checksum {
        /// The table.
        table: [u8; 4],
    },
    /// The RSDT/XSDT lists no MADT.
    NoMadt,
    /// A MADT entry whose length is under 2 or runs past the table's end.
    Entry {
        /// The entry's offset in the table.
        offset: u32,
        /// Its length byte.
        len: u8,
    },
}

impl fmt::Display for AcpiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn sig(s: &[u8; 4]) -> &str {
            core::str::from_utf8(s).ok().unwrap_or("????")
        }
        match self {
            Self::NoRsdp => write!(f, "no ACPI RSDP found"),
            Self::RsdpChecksum => write!(f, "the RSDP's checksum is wrong"),
            Self::Unreadable { addr, len } => {
                write!(f, "{len} bytes at {addr:#x} are not readable memory")
            }
            Self::Signature { expected, found } => write!(
                f,
                "expected table {} but found {:02x?}",
                sig(expected),
                found
            ),
            Self::Length { table, len } => {
                write!(f, "table {} claims an impossible length {len}", sig(table))
            }
            Self::Checksum { table } => write!(f, "table {}: wrong checksum", sig(table)),
            Self::NoMadt => write!(f, "no MADT (APIC) table listed"),
            Self::Entry { offset, len } => {
                write!(
                    f,
                    "MADT entry at offset {offset} has an impossible length {len}"
                )
            }
        }
    }
}

/// One processor the MADT lists as enabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CpuEntry {
    /// Its local APIC ID.
    pub apic_id: u32,
    /// Its ACPI processor UID.
    pub uid: u32,
}

/// What the MADT says about the machine's processors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Madt {
    /// The local APICs' MMIO address (32-bit field).
    pub lapic_addr: u32,
    /// The MADT's flags (bit 0: the machine also has 8259 PICs).
    pub flags: u32,
    cpus: [CpuEntry; MAX_CPUS],
    count: usize,
    /// Processor entries marked neither enabled nor online-capable, or online-capable but not
    /// enabled (hot-pluggable): not started.
    pub disabled: usize,
    /// Enabled processors not kept: past [`MAX_CPUS`], duplicates of an APIC ID already
    /// listed, or an ID that names no single APIC (0xFF, 0xFFFFFFFF).
    pub dropped: usize,
}

impl Madt {
    /// The enabled processors, in table order (at most [`MAX_CPUS`]).
    pub fn cpus(&self) -> &[CpuEntry] {
        &self.cpus[..self.count]
    }

    fn add(&mut self, cpu: CpuEntry) {
        if self.cpus().iter().any(|c| c.apic_id == cpu.apic_id) || self.count == MAX_CPUS {
            self.dropped += 1;
        } else {
            self.cpus[self.count] = cpu;
            self.count += 1;
        }
    }
}

/// MADT entry types this parser reads (ACPI spec, MADT interrupt controller structures).
const ENTRY_LOCAL_APIC: u8 = 0;
const ENTRY_LOCAL_X2APIC: u8 = 9;
/// The processor flags: enabled, online-capable.
const FLAG_ENABLED: u32 = 1;

const HEADER: u32 = 36;

fn read<const N: usize>(mem: &impl PhysMem, addr: u64) -> Result<[u8; N], AcpiError> {
    let mut b = [0u8; N];
    if mem.read(addr, &mut b) {
        Ok(b)
    } else {
        Err(AcpiError::Unreadable {
            addr,
            len: N as u64,
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Checks the RSDP at `addr`: its signature and checksum(s). Returns (revision, RSDT, XSDT).
fn rsdp_at(mem: &impl PhysMem, addr: u64) -> Result<(u8, u32, u64), AcpiError> {
    let b: [u8; 36] = match read(mem, addr) {
        Ok(b) => b,
        // A revision-0 RSDP is 20 bytes: at the end of a readable range the 36 may not be.
        Err(_) => {
            let s: [u8; 20] = read(mem, addr)?;
            let mut b = [0u8; 36];
            b[..20].copy_from_slice(&s);
            b
        }
    };
    if &b[..8] != b"RSD PTR " {
        return Err(AcpiError::NoRsdp);
    }
    if b[..20].iter().fold(0u8, |s, x| s.wrapping_add(*x)) != 0 {
        return Err(AcpiError::RsdpChecksum);
    }
    let revision = b[15];
    let rsdt = u32_at(&b, 16);
    if revision < 2 {
        return Ok((revision, rsdt, 0));
    }
    // Revision 2 and later: 36 bytes with an extended checksum over them all (the length
    // field is not trusted to size anything).
    if b.iter().fold(0u8, |s, x| s.wrapping_add(*x)) != 0 {
        return Err(AcpiError::RsdpChecksum);
    }
    let xsdt = u64::from_le_bytes(b[24..32].try_into().unwrap_or([0; 8]));
    Ok((revision, rsdt, xsdt))
}

/// Finds the RSDP: at `hint` when given (the boot protocol's pointer), else in the first KiB
/// of the EBDA and in 0xE0000–0xFFFFF, on 16-byte boundaries. Returns its address.
pub fn find_rsdp(mem: &impl PhysMem, hint: Option<u64>) -> Result<u64, AcpiError> {
    if let Some(at) = hint.filter(|&a| a != 0) {
        rsdp_at(mem, at)?;
        return Ok(at);
    }
    let ebda = read::<2>(mem, 0x40E)
        .map(|s| u64::from(u16::from_le_bytes(s)) << 4)
        .unwrap_or(0);
    let areas = [(ebda, ebda + 1024), (0xE_0000, 0x10_0000)];
    for (start, end) in areas {
        if start == 0 {
            continue;
        }
        let mut at = start;
        while at + 20 <= end {
            if rsdp_at(mem, at).is_ok() {
                return Ok(at);
            }
            at += 16;
        }
    }
    Err(AcpiError::NoRsdp)
}

/// Checks a table's header at `addr`: its signature, a length between the header's and
/// `max`, and the checksum over that length. Returns the length.
fn table(mem: &impl PhysMem, addr: u64, sig: [u8; 4], max: u32) -> Result<u32, AcpiError> {
    let h: [u8; 36] = read(mem, addr)?;
    let found: [u8; 4] = [h[0], h[1], h[2], h[3]];
    if found != sig {
        return Err(AcpiError::Signature {
            expected: sig,
            found,
        });
    }
    let len = u32_at(&h, 4);
    if !(HEADER..=max).contains(&len) {
        return Err(AcpiError::Length { table: sig, len });
    }
    let mut sum = 0u8;
    let mut chunk = [0u8; 256];
    let mut off = 0u32;
    while off < len {
        let n = (len - off).min(256) as usize;
        let addr = addr + u64::from(off);
        if !mem.read(addr, &mut chunk[..n]) {
            return Err(AcpiError::Unreadable {
                addr,
                len: n as u64,
            });
        }
        sum = chunk[..n].iter().fold(sum, |s, x| s.wrapping_add(*x));
        off += n as u32;
    }
    if sum != 0 {
        return Err(AcpiError::Checksum { table: sig });
    }
    Ok(len)
}

/// Finds the MADT through the RSDP at `rsdp` (the XSDT when the RSDP has one, else the
/// RSDT) and reads its processor entries.
pub fn read_madt(mem: &impl PhysMem, rsdp: u64) -> Result<Madt, AcpiError> {
    let (_, rsdt, xsdt) = rsdp_at(mem, rsdp)?;
    let (root, sig, width) = if xsdt != 0 {
        (xsdt, *b"XSDT", 8u32)
    } else {
        (u64::from(rsdt), *b"RSDT", 4u32)
    };
    let len = table(mem, root, sig, HEADER + MAX_TABLES * width)?;
    let entries = (len - HEADER) / width;
    for i in 0..entries {
        let at = root + u64::from(HEADER + i * width);
        let ptr = if width == 8 {
            u64::from_le_bytes(read(mem, at)?)
        } else {
            u64::from(u32::from_le_bytes(read(mem, at)?))
        };
        let Ok(s) = read::<4>(mem, ptr) else {
            continue;
        };
        if &s == b"APIC" {
            return parse_madt(mem, ptr);
        }
    }
    Err(AcpiError::NoMadt)
}

/// Reads the MADT at `addr`: its header, checksum and processor entries.
pub fn parse_madt(mem: &impl PhysMem, addr: u64) -> Result<Madt, AcpiError> {
    let len = table(mem, addr, *b"APIC", MAX_MADT_LEN)?;
    if len < HEADER + 8 {
        return Err(AcpiError::Length {
            table: *b"APIC",
            len,
        });
    }
    let f: [u8; 8] = read(mem, addr + u64::from(HEADER))?;
    let mut madt = Madt {
        lapic_addr: u32_at(&f, 0),
        flags: u32_at(&f, 4),
        cpus: [CpuEntry::default(); MAX_CPUS],
        count: 0,
        disabled: 0,
        dropped: 0,
    };
    let mut off = HEADER + 8;
    // Each pass moves `off` on by at least 2 (lengths under 2 are refused), so the loop ends
    // within `len / 2` passes.
    while off < len {
        if len - off < 2 {
            return Err(AcpiError::Entry {
                offset: off,
                len: 0,
            });
        }
        let [ty, elen]: [u8; 2] = read(mem, addr + u64::from(off))?;
        if elen < 2 || u32::from(elen) > len - off {
            return Err(AcpiError::Entry {
                offset: off,
                len: elen,
            });
        }
        let at = addr + u64::from(off);
        let entry = match (ty, elen) {
            // Processor Local APIC: type, length 8, ACPI UID, APIC ID, flags.
            (ENTRY_LOCAL_APIC, 8..) => {
                let e: [u8; 8] = read(mem, at)?;
                let id = u32::from(e[3]);
                Some((
                    CpuEntry {
                        apic_id: id,
                        uid: u32::from(e[2]),
                    },
                    u32_at(&e, 4),
                    id == 0xFF,
                ))
            }
            // Processor Local x2APIC: type, length 16, reserved, x2APIC ID, flags, UID.
            (ENTRY_LOCAL_X2APIC, 16..) => {
                let e: [u8; 16] = read(mem, at)?;
                let id = u32_at(&e, 4);
                Some((
                    CpuEntry {
                        apic_id: id,
                        uid: u32_at(&e, 12),
                    },
                    u32_at(&e, 8),
                    id == u32::MAX,
                ))
            }
            (ENTRY_LOCAL_APIC | ENTRY_LOCAL_X2APIC, _) => {
                return Err(AcpiError::Entry {
                    offset: off,
                    len: elen,
                });
            }
            _ => None,
        };
        if let Some((cpu, flags, invalid)) = entry {
            if flags & FLAG_ENABLED == 0 {
                madt.disabled += 1;
            } else if invalid {
                madt.dropped += 1;
            } else {
                madt.add(cpu);
            }
        }
        off += u32::from(elen);
    }
    Ok(madt)
}
