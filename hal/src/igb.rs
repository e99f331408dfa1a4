//! Intel's igb family as QEMU emulates it (`-device igb`: an 82576, 8086:10C9) as a
//! [`Link`](crate::Link): [`Igb`], the shared [`IntelNic`] with this family's
//! [`I82576`].
//!
//! What is the 82576's own: queue 0's registers at 0xC000 (receive) and 0xE000 (transmit);
//! advanced descriptors (`SRRCTL.DESCTYPE` one buffer, 2 KiB, and advanced data descriptors
//! for transmit); the queue enables in `RXDCTL`/`TXDCTL`; the link started by restarting the
//! PHY's auto-negotiation (QEMU brings the link up some 500 ms of virtual time later:
//! [`IntelNic::wait_link`]); and its interrupts in MSI-X mode (`GPIE`), queue 0's causes
//! mapped to vector 0 through `IVAR0`. Registers and sources: docs/intel-nics.md.
//!
//! ```ignore
//! let address = intel::pci::find(&pci, igb::DEVICE_IDS).ok_or(IntelError::NoDevice)?;
//! // SAFETY: the function is an igb NIC nothing else drives, BAR 0 mapped by the HAL.
//! let mut nic = unsafe { Igb::new(hal, &pci, address) }?;
//! nic.wait_link(1 << 24)?;
//! nic.transmit(&frame)?;
//! ```

use crate::Mmio;
use crate::intel::regs::{RingRegs, TX_DEXT, TX_EOP, TX_IFCS, TX_RS};
use crate::intel::{Family, IntelError, IntelNic, phy_write, sealed};

/// The 82576's PCI device IDs (QEMU's igb is the first: copper).
pub const DEVICE_IDS: &[u16] = &[
    0x10C9, 0x10E6, 0x10E7, 0x10E8, 0x1526, 0x150A, 0x1518, 0x150D,
];

/// An igb NIC as a [`Link`](crate::Link).
pub type Igb<H> = IntelNic<H, I82576>;

/// The 82576: what the igb family does its own way.
#[derive(Debug)]
pub enum I82576 {}

impl sealed::Sealed for I82576 {}

/// Queue 0's split and replication receive control.
const SRRCTL0: usize = 0xC00C;
/// Queue 0's receive descriptor control.
const RXDCTL0: usize = 0xC028;
/// Queue 0's transmit descriptor control.
const TXDCTL0: usize = 0xE028;
/// General purpose interrupt enable.
const GPIE: usize = 0x1514;
/// Extended interrupt mask set.
const EIMS: usize = 0x1524;
/// Extended interrupt auto-clear.
const EIAC: usize = 0x152C;
/// Interrupt throttle of vector 0.
const EITR0: usize = 0x1680;
/// Interrupt vector allocation of queues 0 and 1.
const IVAR0: usize = 0x1700;

/// SRRCTL: advanced descriptors, one buffer.
const SRRCTL_DESCTYPE_ADV_ONEBUF: u32 = 1 << 25;
/// SRRCTL: the packet buffer size, in KiB (2).
const SRRCTL_BSIZEPKT_2K: u32 = 2;
/// RXDCTL/TXDCTL: the queue is enabled.
const QUEUE_ENABLE: u32 = 1 << 25;
/// Transmit descriptor type: advanced data.
const DTYP_DATA: u32 = 0x3 << 20;
/// Where the payload length goes in the advanced data descriptor's fourth dword.
const PAYLEN_SHIFT: u32 = 14;
/// GPIE: MSI-X mode (a cause per vector in EICR).
const GPIE_MSIX_MODE: u32 = 1 << 4;
/// GPIE: interrupt causes are not cleared by reading ICR.
const GPIE_NSICR: u32 = 1 << 0;
/// GPIE: the MSI-X pending bits are supported.
const GPIE_PBA: u32 = 1 << 31;
/// IVAR: the entry is valid.
const IVAR_VALID: u32 = 0x80;
/// PHY control (BMCR): auto-negotiation on, restart it, full duplex, 1000 Mb/s.
const PHY_CTRL: u32 = 0;
const BMCR_RESTART_AUTONEG: u16 = 1 << 12 | 1 << 9 | 1 << 8 | 1 << 6;

impl Family for I82576 {
    const NAME: &'static str = "igb";
    const DEVICE_IDS: &'static [u16] = DEVICE_IDS;
    const RX_RING: RingRegs = RingRegs {
        bal: 0xC000,
        bah: 0xC004,
        len: 0xC008,
        head: 0xC010,
        tail: 0xC018,
    };
    const TX_RING: RingRegs = RingRegs {
        bal: 0xE000,
        bah: 0xE004,
        len: 0xE008,
        head: 0xE010,
        tail: 0xE018,
    };

    fn tx_words(len: u32) -> (u32, u32) {
        (
            (len & 0xFFFF) | DTYP_DATA | TX_DEXT | TX_EOP | TX_IFCS | TX_RS,
            len << PAYLEN_SHIFT,
        )
    }

    fn configure<M: Mmio>(regs: &M) {
        regs.write32(SRRCTL0, SRRCTL_DESCTYPE_ADV_ONEBUF | SRRCTL_BSIZEPKT_2K);
        regs.write32(RXDCTL0, regs.read32(RXDCTL0) | QUEUE_ENABLE);
        regs.write32(TXDCTL0, regs.read32(TXDCTL0) | QUEUE_ENABLE);
    }

    fn start_link<M: Mmio>(regs: &M) -> Result<(), IntelError> {
        use crate::intel::regs::{CTRL, CTRL_SLU};
        regs.write32(CTRL, regs.read32(CTRL) | CTRL_SLU);
        phy_write(regs, PHY_CTRL, BMCR_RESTART_AUTONEG)
    }

    fn route_vector0<M: Mmio>(regs: &M) {
        regs.write32(GPIE, GPIE_MSIX_MODE | GPIE_NSICR | GPIE_PBA);
        // Receive queue 0 is byte 0 of IVAR0, transmit queue 0 byte 1: both vector 0.
        regs.write32(IVAR0, IVAR_VALID | IVAR_VALID << 8);
        regs.write32(EITR0, 0);
        regs.write32(EIAC, 1);
        regs.write32(EIMS, 1);
    }
}
