//! Intel's e1000e family as QEMU emulates it (`-device e1000e`: an 82574L, 8086:10D3) as a
//! [`Link`](crate::Link): [`E1000e`], the shared [`IntelNic`] with this family's
//! [`I82574`].
//!
//! What is the 82574's own: queue 0's registers at 0x2800 (receive) and 0x3800 (transmit);
//! extended receive descriptors (`RFCTL.EXTEN`: the write-back has the status and length
//! where igb's advanced one has them) with the 2 KiB buffer `RCTL` gives by default; legacy
//! transmit descriptors; the link forced up (`CTRL.SLU`, and QEMU reports it up from reset);
//! and its interrupts in MSI-X mode through `IVAR` (receive queue 0, transmit queue 0 and
//! "other" to vector 0) and the queue causes in `IMS`, enabled again whenever the link finds
//! no frame (a message masks its cause). Registers and sources:
//! docs/intel-nics.md.

use crate::Mmio;
use crate::intel::regs::{CTRL, CTRL_EXT, CTRL_SLU, IMS, RingRegs, TX_EOP, TX_IFCS, TX_RS};
use crate::intel::{Family, IntelError, IntelNic, sealed};

/// The 82574's PCI device IDs (82574L, 82574LA).
pub const DEVICE_IDS: &[u16] = &[0x10D3, 0x10F6];

/// An e1000e NIC as a [`Link`](crate::Link).
pub type E1000e<H> = IntelNic<H, I82574>;

/// The 82574: what the e1000e family does its own way.
#[derive(Debug)]
pub enum I82574 {}

impl sealed::Sealed for I82574 {}

/// Receive filter control.
const RFCTL: usize = 0x5008;
/// RFCTL: extended receive descriptors.
const RFCTL_EXTEN: u32 = 1 << 15;
/// Interrupt vector allocation.
const IVAR: usize = 0x00E4;
/// Extended interrupt auto-clear.
const EIAC: usize = 0x00DC;
/// IVAR: a field's vector is valid (each field: 3 bits of vector, then this bit).
const IVAR_FIELD_VALID: u32 = 0x8;
/// IVAR: an interrupt on every write-back.
const IVAR_INT_ON_ALL_WB: u32 = 1 << 31;
/// IMS/ICR: receive queue 0, transmit queue 0.
const IMS_RXQ0: u32 = 1 << 20;
const IMS_TXQ0: u32 = 1 << 22;
/// CTRL_EXT: the MSI-X pending bit array is supported.
const CTRL_EXT_PBA_SUPPORT: u32 = 1 << 31;

impl Family for I82574 {
    const NAME: &'static str = "e1000e";
    const DEVICE_IDS: &'static [u16] = DEVICE_IDS;
    const RX_RING: RingRegs = RingRegs {
        bal: 0x2800,
        bah: 0x2804,
        len: 0x2808,
        head: 0x2810,
        tail: 0x2818,
    };
    const TX_RING: RingRegs = RingRegs {
        bal: 0x3800,
        bah: 0x3804,
        len: 0x3808,
        head: 0x3810,
        tail: 0x3818,
    };

    fn tx_words(len: u32) -> (u32, u32) {
        ((len & 0xFFFF) | TX_EOP | TX_IFCS | TX_RS, 0)
    }

    fn configure<M: Mmio>(regs: &M) {
        regs.write32(RFCTL, regs.read32(RFCTL) | RFCTL_EXTEN);
    }

    fn start_link<M: Mmio>(regs: &M) -> Result<(), IntelError> {
        regs.write32(CTRL, regs.read32(CTRL) | CTRL_SLU);
        Ok(())
    }

    fn route_vector0<M: Mmio>(regs: &M) {
        regs.write32(CTRL_EXT, regs.read32(CTRL_EXT) | CTRL_EXT_PBA_SUPPORT);
        // Fields: receive queue 0 (bits 3:0), transmit queue 0 (11:8), other (19:16).
        regs.write32(
            IVAR,
            IVAR_FIELD_VALID | IVAR_FIELD_VALID << 8 | IVAR_FIELD_VALID << 16 | IVAR_INT_ON_ALL_WB,
        );
        regs.write32(EIAC, IMS_RXQ0 | IMS_TXQ0);
        regs.write32(IMS, IMS_RXQ0 | IMS_TXQ0);
    }

    /// A message auto-clears its cause from ICR (EIAC) and, with CTRL_EXT.IAME clear, masks it
    /// in IMS too (QEMU 8.0 and later, `e1000e_msix_notify_one`; Linux's driver enables it
    /// again after each poll): one message and no more, unless enabled again.
    fn rearm<M: Mmio>(regs: &M) {
        regs.write32(IMS, IMS_RXQ0 | IMS_TXQ0);
    }
}
