//! Device-agnostic PCI plumbing: enumerate functions, size BARs with decoding turned off, and
//! enable a function for MMIO and DMA.

use pci_types::{CommandRegister, ConfigRegionAccess, PciAddress};

use crate::error::{Error, NotFound, Result, Unsupported};

/// Configuration-space offsets (PCI Local Bus Specification 3.0, §6.1).
const ID: u16 = 0x00;
const COMMAND: u16 = 0x04;
const CLASS: u16 = 0x08;
const HEADER: u16 = 0x0C;
const BAR0: u16 = 0x10;

/// One function found on the bus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciFunction {
    /// Where it is.
    pub address: PciAddress,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Revision ID.
    pub revision: u8,
    /// Base class, subclass, programming interface.
    pub class: (u8, u8, u8),
    /// Header type (bit 7 cleared): 0 endpoint, 1 PCI-PCI bridge.
    pub header_type: u8,
}

/// Reads the function at `address`, or `None` when nothing answers there.
pub fn function<C: ConfigRegionAccess>(access: &C, address: PciAddress) -> Option<PciFunction> {
    // SAFETY: offsets 0x00–0x0C exist in every function's configuration header; reads of an
    // absent function return all-ones without side effects.
    let (id, class, header) = unsafe {
        let id = access.read(address, ID);
        if id & 0xFFFF == 0xFFFF {
            return None;
        }
        (
            id,
            access.read(address, CLASS),
            access.read(address, HEADER),
        )
    };
    Some(PciFunction {
        address,
        vendor: id as u16,
        device: (id >> 16) as u16,
        revision: class as u8,
        class: ((class >> 24) as u8, (class >> 16) as u8, (class >> 8) as u8),
        header_type: (header >> 16) as u8 & 0x7F,
    })
}

/// Every function on segment 0, buses 0–255, in address order.
///
/// All eight functions of every slot are looked at, so that a function whose function 0 is
/// missing (a misconfiguration a driver must report) is still seen.
pub fn scan<C: ConfigRegionAccess>(access: &C) -> impl Iterator<Item = PciFunction> + '_ {
    (0u32..256 * 32 * 8).filter_map(move |i| {
        let address = PciAddress::new(0, (i >> 8) as u8, ((i >> 3) & 31) as u8, (i & 7) as u8);
        function(access, address)
    })
}

/// A decoded base address register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bar {
    /// A memory BAR.
    Memory {
        /// Physical address.
        address: u64,
        /// Size in bytes (a power of two).
        size: u64,
        /// Whether it is a 64-bit BAR (it then occupies this slot and the next).
        is_64bit: bool,
        /// Prefetchable.
        prefetchable: bool,
    },
    /// An I/O-port BAR.
    Io {
        /// First port.
        port: u32,
        /// Size in ports.
        size: u32,
    },
}

/// Sizes the six BARs of the endpoint at `address` with I/O and memory decoding turned off
/// (writing all-ones to a decoding BAR would make it claim addresses), then restores the
/// command register. A 64-bit BAR fills its slot and leaves the next `None`.
///
/// # Errors
///
/// [`Unsupported::BarType`] for a BAR of the reserved memory type, or a 64-bit BAR in slot 5.
#[inline(never)]
pub fn size_bars<C: ConfigRegionAccess>(
    access: &C,
    address: PciAddress,
) -> Result<[Option<Bar>; 6]> {
    // SAFETY: the command register exists in every header; this function owns the device's
    // configuration while it probes it (the caller's contract with its ConfigRegionAccess).
    let command = unsafe { access.read(address, COMMAND) };
    let off = CommandRegister::IO_ENABLE | CommandRegister::MEMORY_ENABLE;
    // SAFETY: clearing the decode bits only stops the function answering on the bus.
    unsafe { access.write(address, COMMAND, command & !u32::from(off.bits())) };
    let result = size_bars_decoding_off(access, address);
    // SAFETY: restores the value read above.
    unsafe { access.write(address, COMMAND, command & 0xFFFF) };
    result
}

fn size_bars_decoding_off<C: ConfigRegionAccess>(
    access: &C,
    address: PciAddress,
) -> Result<[Option<Bar>; 6]> {
    let mut bars = [None; 6];
    let mut slot = 0u8;
    while slot < 6 {
        let offset = BAR0 + 4 * u16::from(slot);
        // Probe one 32-bit register: write all-ones, read the size mask, restore.
        let probe = |off: u16| -> (u32, u32) {
            // SAFETY: BAR registers of an endpoint header; decoding is off, so the all-ones
            // value is never decoded; the original value is written back.
            unsafe {
                let orig = access.read(address, off);
                access.write(address, off, 0xFFFF_FFFF);
                let mask = access.read(address, off);
                access.write(address, off, orig);
                (orig, mask)
            }
        };
        let (orig, mask) = probe(offset);
        if orig & 1 == 1 {
            let size_mask = mask & !0x3;
            if size_mask != 0 {
                bars[usize::from(slot)] = Some(Bar::Io {
                    port: orig & !0x3,
                    size: (!size_mask).wrapping_add(1) & 0xFFFF,
                });
            }
            slot += 1;
            continue;
        }
        let prefetchable = orig & 0x8 != 0;
        match (orig >> 1) & 0x3 {
            0b00 => {
                let size_mask = mask & !0xF;
                if size_mask != 0 {
                    bars[usize::from(slot)] = Some(Bar::Memory {
                        address: u64::from(orig & !0xF),
                        size: u64::from((!size_mask).wrapping_add(1)),
                        is_64bit: false,
                        prefetchable,
                    });
                }
                slot += 1;
            }
            0b10 if slot < 5 => {
                let (orig_hi, mask_hi) = probe(offset + 4);
                let size_mask = (u64::from(mask_hi) << 32) | u64::from(mask & !0xF);
                if size_mask != 0 {
                    bars[usize::from(slot)] = Some(Bar::Memory {
                        address: (u64::from(orig_hi) << 32) | u64::from(orig & !0xF),
                        size: (!size_mask).wrapping_add(1),
                        is_64bit: true,
                        prefetchable,
                    });
                }
                slot += 2;
            }
            _ => return Err(Error::Unsupported(Unsupported::BarType { bar: slot })),
        }
    }
    Ok(bars)
}

/// The memory BAR `index` of `bars`, if it exists and is at least `min_size` bytes.
pub(crate) fn memory_bar(bars: &[Option<Bar>; 6], index: u8, min_size: u64) -> Result<(u64, u64)> {
    match bars.get(usize::from(index)).copied().flatten() {
        Some(Bar::Memory { address, size, .. }) if size >= min_size && address != 0 => {
            Ok((address, size))
        }
        Some(Bar::Io { .. }) => Err(Error::Unsupported(Unsupported::BarType { bar: index })),
        _ => Err(Error::NotFound(NotFound::Bar { bar: index })),
    }
}

/// The configuration-space offset of the function's first capability with ID `id`, walking
/// the capability list (bounded: a looping or out-of-range list ends the walk).
pub fn find_capability<C: ConfigRegionAccess>(
    access: &C,
    address: PciAddress,
    id: u8,
) -> Option<u16> {
    // SAFETY: the status register and the capabilities pointer exist in every endpoint
    // header; reading them has no side effect.
    let status = unsafe { access.read(address, COMMAND) } >> 16;
    if status & (1 << 4) == 0 {
        return None;
    }
    // SAFETY: as above (offset 0x34, the capabilities pointer).
    let mut at = (unsafe { access.read(address, 0x34) } & 0xFC) as u16;
    // At most 48 capabilities fit between 0x40 and 0x100.
    for _ in 0..48 {
        if !(0x40..0x100).contains(&at) {
            return None;
        }
        // SAFETY: a dword of the device-specific configuration region (0x40–0xFF), which the
        // capability list lives in; reading a capability header has no side effect.
        let header = unsafe { access.read(address, at) };
        if header & 0xFF == u32::from(id) {
            return Some(at);
        }
        at = ((header >> 8) & 0xFC) as u16;
    }
    None
}

/// Turns on memory decoding and bus mastering (DMA) for the function.
pub(crate) fn enable_mmio_and_dma<C: ConfigRegionAccess>(access: &C, address: PciAddress) {
    let on = CommandRegister::MEMORY_ENABLE | CommandRegister::BUS_MASTER_ENABLE;
    // SAFETY: the command register exists in every header; setting these bits is what the
    // driver that owns the function does to use it.
    unsafe {
        let command = access.read(address, COMMAND) & 0xFFFF;
        access.write(address, COMMAND, command | u32::from(on.bits()));
    }
}
