//! PCI for the Intel NICs: finding the function, decoding and bus mastering, BAR 0 (the
//! registers) and the MSI-X table's entry 0. Every value read from configuration space is
//! bounded before use (a capability list that loops ends, a BAR of the wrong kind is refused).

use pci_types::{ConfigRegionAccess, PciAddress};

use crate::{Hal, MsiMessage};

/// Intel's PCI vendor ID.
pub const VENDOR_INTEL: u16 = 0x8086;
/// Command register: memory decoding.
const CMD_MEMORY: u32 = 1 << 1;
/// Command register: bus mastering.
const CMD_MASTER: u32 = 1 << 2;
/// Capability ID of MSI-X.
const CAP_MSIX: u8 = 0x11;

/// Why MSI-X could not be set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsixError {
    /// No MSI-X capability in the function's list.
    NoCapability,
    /// The table's BAR is not a memory BAR, not assigned, or not mapped by the HAL.
    Bar,
}

impl core::fmt::Display for MsixError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            MsixError::NoCapability => "no MSI-X capability",
            MsixError::Bar => "the MSI-X table's BAR is not a mapped memory BAR",
        })
    }
}

/// The first function on segment 0 with Intel's vendor ID and a device ID in `ids`, in
/// address order.
pub fn find<C: ConfigRegionAccess>(access: &C, ids: &[u16]) -> Option<PciAddress> {
    (0u32..256 * 32 * 8).find_map(|i| {
        let a = PciAddress::new(0, (i >> 8) as u8, ((i >> 3) & 31) as u8, (i & 7) as u8);
        // SAFETY: offset 0 exists in every function's header; reading an absent function
        // returns all-ones without side effects.
        let id = unsafe { access.read(a, 0) };
        (id as u16 == VENDOR_INTEL && ids.contains(&((id >> 16) as u16))).then_some(a)
    })
}

/// The device ID at `at` if the vendor is Intel.
pub(crate) fn device_id<C: ConfigRegionAccess>(pci: &C, at: PciAddress) -> Option<u16> {
    // SAFETY: offset 0 of the header: no side effect.
    let id = unsafe { pci.read(at, 0) };
    (id as u16 == VENDOR_INTEL).then_some((id >> 16) as u16)
}

/// Turns memory decoding and bus mastering on; returns the command register as it was.
///
/// # Safety
///
/// The caller drives the function at `at`.
pub(crate) unsafe fn enable<C: ConfigRegionAccess>(pci: &C, at: PciAddress) -> u32 {
    // SAFETY: the caller drives the function; the command register is at 0x04.
    unsafe {
        let old = pci.read(at, 0x04);
        pci.write(at, 0x04, (old & 0xFFFF) | CMD_MEMORY | CMD_MASTER);
        old & 0xFFFF
    }
}

/// Writes back a command register value [`enable`] returned.
///
/// # Safety
///
/// As [`enable`].
pub(crate) unsafe fn restore<C: ConfigRegionAccess>(pci: &C, at: PciAddress, old: u32) {
    // SAFETY: the caller's promise.
    unsafe { pci.write(at, 0x04, old & 0xFFFF) }
}

/// The physical address memory BAR `bar` decodes (64-bit BARs read whole), `None` for an I/O
/// BAR, an unassigned one, or a 64-bit BAR in the last slot.
pub(crate) fn memory_bar<C: ConfigRegionAccess>(pci: &C, at: PciAddress, bar: u8) -> Option<u64> {
    if bar > 5 {
        return None;
    }
    let reg = 0x10 + 4 * u16::from(bar);
    // SAFETY: BAR registers of the function the caller drives: reads have no side effect.
    let low = unsafe { pci.read(at, reg) };
    if low & 1 != 0 {
        return None;
    }
    let mut base = u64::from(low & !0xF);
    if (low >> 1) & 3 == 2 {
        if bar == 5 {
            return None;
        }
        // SAFETY: as above, the upper half of a 64-bit BAR.
        base |= u64::from(unsafe { pci.read(at, reg + 4) }) << 32;
    }
    (base != 0).then_some(base)
}

/// The MSI-X capability's offset and its table's (BAR, offset).
fn msix_place<C: ConfigRegionAccess>(pci: &C, at: PciAddress) -> Option<(u16, u8, u32)> {
    // SAFETY: configuration reads of the caller's function have no side effect.
    let status = unsafe { pci.read(at, 0x04) } >> 16;
    if status & 0x10 == 0 {
        return None;
    }
    // SAFETY: as above.
    let mut ptr = (unsafe { pci.read(at, 0x34) } & 0xFC) as u16;
    // Bounded: a list that loops ends after as many capabilities as fit in 256 bytes.
    for _ in 0..48 {
        if ptr < 0x40 {
            return None;
        }
        // SAFETY: as above.
        let head = unsafe { pci.read(at, ptr) };
        if head as u8 == CAP_MSIX {
            // SAFETY: as above.
            let table = unsafe { pci.read(at, ptr + 4) };
            return Some((ptr, (table & 7) as u8, table & !7));
        }
        ptr = u16::from((head >> 8) as u8 & 0xFC);
    }
    None
}

/// Writes MSI-X table entry 0 with `msg`, unmasked, and enables MSI-X (function mask off).
///
/// # Safety
///
/// The caller drives the function at `at`; its BARs lie where `hal` maps them.
pub(crate) unsafe fn msix_entry0<H: Hal, C: ConfigRegionAccess>(
    hal: &H,
    pci: &C,
    at: PciAddress,
    msg: MsiMessage,
) -> Result<(), MsixError> {
    use crate::Mmio;
    let (cap, bir, offset) = msix_place(pci, at).ok_or(MsixError::NoCapability)?;
    let base = memory_bar(pci, at, bir).ok_or(MsixError::Bar)?;
    let entry = base.checked_add(u64::from(offset)).ok_or(MsixError::Bar)?;
    // SAFETY: the entry lies in the function's MSI-X BAR, which the caller drives.
    let table = unsafe { hal.map_mmio(entry, 16) }.ok_or(MsixError::Bar)?;
    table.write32(0, msg.address as u32);
    table.write32(4, (msg.address >> 32) as u32);
    table.write32(8, msg.data);
    table.write32(12, 0);
    // SAFETY: the capability's first dword: message control in its upper half (bit 31 enable,
    // bit 30 function mask).
    unsafe {
        let head = pci.read(at, cap);
        pci.write(at, cap, (head | 1 << 31) & !(1 << 30));
    }
    Ok(())
}
