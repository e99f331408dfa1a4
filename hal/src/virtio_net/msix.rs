//! The NIC's interrupts through MSI-X, for a driver that halts while it waits: virtio-drivers
//! 0.13 assigns no MSI-X vector (its PCI transport leaves every queue at "no vector"), so this
//! finds the function's MSI-X table and virtio's common configuration in its capability list,
//! writes one table entry and names it as the vector of both queues.
//!
//! With the event index negotiated (virtio-drivers does), the device signals a queue when its
//! used index passes the driver's `used_event`, which virtio-drivers moves to what it has
//! taken: the first frame (or transmit completion) after the driver caught up interrupts, and a
//! driver that halts only after finding the ring empty is woken by the next one.

use core::ptr::NonNull;

use pci_types::{ConfigRegionAccess, PciAddress};

use super::StaticHal;
use crate::MsiMessage;

/// PCI capability IDs.
const CAP_MSIX: u8 = 0x11;
const CAP_VENDOR: u8 = 0x09;
/// virtio's capability type of the common configuration.
const VIRTIO_COMMON_CFG: u8 = 1;
/// Offsets in virtio's common configuration (virtio 1.x, 4.1.4.3).
const MSIX_CONFIG: usize = 0x10;
const QUEUE_SELECT: usize = 0x16;
const QUEUE_MSIX_VECTOR: usize = 0x1A;
/// "No vector".
const NO_VECTOR: u16 = 0xFFFF;
/// The virtqueues of a single-queue virtio-net: receiveq1, transmitq1.
const QUEUES: [u16; 2] = [0, 1];

/// Why the interrupts could not be routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsixError {
    /// No MSI-X capability, or no virtio common configuration, in the capability list.
    NoCapability,
    /// A BAR the capability names is not a memory BAR, or not mapped by the HAL.
    Bar,
    /// The device did not take the vector (read back as "no vector").
    Refused,
}

impl core::fmt::Display for MsixError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            MsixError::NoCapability => "no MSI-X capability or virtio common configuration",
            MsixError::Bar => "a BAR of the MSI-X table or common configuration is not mapped",
            MsixError::Refused => "the device did not take the MSI-X vector",
        })
    }
}

/// Where the capabilities put things: (configuration offset of the MSI-X capability, its
/// table's BAR and offset, the common configuration's BAR and offset).
struct Places {
    msix_cap: u16,
    table: (u8, u32),
    common: (u8, u32),
}

fn find_places<C: ConfigRegionAccess>(pci: &C, at: PciAddress) -> Option<Places> {
    // SAFETY: configuration reads of the function the caller drives have no side effect.
    let status = unsafe { pci.read(at, 0x04) } >> 16;
    if status & 0x10 == 0 {
        return None;
    }
    // SAFETY: as above.
    let mut ptr = (unsafe { pci.read(at, 0x34) } & 0xFC) as u16;
    let (mut msix, mut common) = (None, None);
    // Bounded: a hostile list that loops ends after as many capabilities as fit.
    for _ in 0..48 {
        if ptr < 0x40 {
            break;
        }
        // SAFETY: as above.
        let head = unsafe { pci.read(at, ptr) };
        let (id, next) = (head as u8, (head >> 8) as u8 & 0xFC);
        if id == CAP_MSIX {
            // SAFETY: as above.
            let table = unsafe { pci.read(at, ptr + 4) };
            msix = Some((ptr, ((table & 7) as u8, table & !7)));
        } else if id == CAP_VENDOR && (head >> 24) as u8 == VIRTIO_COMMON_CFG {
            // SAFETY: as above.
            let (bar, offset) = unsafe { (pci.read(at, ptr + 4) as u8, pci.read(at, ptr + 8)) };
            common.get_or_insert((bar, offset));
        }
        ptr = u16::from(next);
    }
    let (msix_cap, table) = msix?;
    Some(Places {
        msix_cap,
        table,
        common: common?,
    })
}

/// The mapped address of `offset` (with `len` bytes) in memory BAR `bar`.
fn bar_at<S: StaticHal, C: ConfigRegionAccess>(
    pci: &C,
    at: PciAddress,
    bar: u8,
    offset: u32,
    len: usize,
) -> Option<NonNull<u8>> {
    if bar > 5 {
        return None;
    }
    let reg = 0x10 + 4 * u16::from(bar);
    // SAFETY: configuration reads of the function's BARs: no side effect.
    let low = unsafe { pci.read(at, reg) };
    if low & 1 != 0 {
        return None;
    }
    let mut base = u64::from(low & !0xF);
    if (low >> 1) & 3 == 2 {
        if bar == 5 {
            return None;
        }
        // SAFETY: as above (the upper half of a 64-bit BAR).
        base |= u64::from(unsafe { pci.read(at, reg + 4) }) << 32;
    }
    if base == 0 {
        return None;
    }
    S::mmio_virt(base + u64::from(offset), len)
}

/// Routes both queues' interrupts of the virtio-net function at `at` to `msg` (MSI-X table
/// entry 0) and enables MSI-X; configuration changes get no vector.
///
/// # Safety
///
/// `pci` reaches the function at `at`, a virtio-net function this caller drives (brought up:
/// its queues exist), whose BARs the HAL maps; nothing else uses its MSI-X table or the common
/// configuration's queue selector meanwhile.
pub(super) unsafe fn route<S: StaticHal, C: ConfigRegionAccess>(
    pci: &C,
    at: PciAddress,
    msg: MsiMessage,
) -> Result<(), MsixError> {
    let p = find_places(pci, at).ok_or(MsixError::NoCapability)?;
    let table = bar_at::<S, C>(pci, at, p.table.0, p.table.1, 16).ok_or(MsixError::Bar)?;
    let common = bar_at::<S, C>(pci, at, p.common.0, p.common.1, 0x20).ok_or(MsixError::Bar)?;
    let t = table.as_ptr().cast::<u32>();
    let c = common.as_ptr();
    // SAFETY: entry 0 of the MSI-X table (16 bytes: address low, high, data, control) and the
    // common configuration's registers, mapped by the HAL (the caller's promise), written with
    // aligned volatile accesses of their widths.
    unsafe {
        t.write_volatile(msg.address as u32);
        t.add(1).write_volatile((msg.address >> 32) as u32);
        t.add(2).write_volatile(msg.data);
        t.add(3).write_volatile(0);
        // Message control (the capability's upper 16 bits): enable, function mask off.
        let head = pci.read(at, p.msix_cap);
        pci.write(at, p.msix_cap, (head | 1 << 31) & !(1 << 30));
        c.add(MSIX_CONFIG).cast::<u16>().write_volatile(NO_VECTOR);
        for q in QUEUES {
            c.add(QUEUE_SELECT).cast::<u16>().write_volatile(q);
            c.add(QUEUE_MSIX_VECTOR).cast::<u16>().write_volatile(0);
            if c.add(QUEUE_MSIX_VECTOR).cast::<u16>().read_volatile() != 0 {
                return Err(MsixError::Refused);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::cell::RefCell;

    /// One function's configuration space (256 bytes), dword-addressed.
    struct Config(RefCell<[u32; 64]>);

    impl Config {
        fn new() -> Self {
            Config(RefCell::new([0; 64]))
        }
        fn set(&self, offset: u16, value: u32) {
            self.0.borrow_mut()[usize::from(offset / 4)] = value;
        }
    }

    impl ConfigRegionAccess for Config {
        unsafe fn read(&self, _: PciAddress, offset: u16) -> u32 {
            self.0.borrow()[usize::from(offset / 4)]
        }
        unsafe fn write(&self, _: PciAddress, offset: u16, value: u32) {
            self.set(offset, value);
        }
    }

    fn at() -> PciAddress {
        PciAddress::new(0, 0, 3, 0)
    }

    /// virtio-net as QEMU lays it out: MSI-X at 0x98 (table in BAR 1 at 0), vendor
    /// capabilities for the common (BAR 4 at 0), ISR and notify configurations.
    fn qemu_like() -> Config {
        let c = Config::new();
        c.set(0x04, 0x0010_0000);
        c.set(0x34, 0x98);
        c.set(0x9C, 0x0000_0001); // MSI-X table: BAR 1, offset 0
        c.set(0x84, 0x0103_7009); // common: type 1, next 0x70
        c.set(0x88, 4);
        c.set(0x8C, 0);
        c.set(0x70, 0x0310_6009); // ISR: type 3, next 0x60
        c.set(0x60, 0x0214_0009); // notify: type 2, last
        c.set(0x98, 0x0003_8411); // MSI-X: 4 entries, next 0x84
        c
    }

    #[test]
    fn finds_the_msix_table_and_the_common_configuration() {
        let p = find_places(&qemu_like(), at()).expect("both capabilities");
        assert_eq!(p.msix_cap, 0x98);
        assert_eq!(p.table, (1, 0));
        assert_eq!(p.common, (4, 0));
    }

    #[test]
    fn a_function_without_them_has_no_places() {
        let c = qemu_like();
        c.set(0x04, 0);
        assert!(find_places(&c, at()).is_none(), "no capability list");
        let c = qemu_like();
        c.set(0x84, 0x0003_7009); // the common configuration's next, but type 3
        assert!(find_places(&c, at()).is_none(), "no common configuration");
        let c = qemu_like();
        c.set(0x34, 0x84); // the list starts after the MSI-X capability
        assert!(find_places(&c, at()).is_none(), "no MSI-X");
    }

    #[test]
    fn a_looping_capability_list_ends() {
        let c = qemu_like();
        c.set(0x60, 0x0284_0009); // notify points back at the common configuration
        c.set(0x34, 0x84); // and MSI-X is not in the loop
        assert!(find_places(&c, at()).is_none());
    }
}
