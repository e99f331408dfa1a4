//! The 82574 as QEMU's e1000e emulates it (hw/net/e1000e_core.c; docs/intel-nics.md): queue
//! 0's registers at 0x2800/0x3800, the link up from reset (CTRL.SLU and STATUS.LU in the reset
//! values), legacy receive descriptors unless RFCTL.EXTEN asks for extended ones, RCTL's
//! buffer size, legacy transmit descriptors (extended ones are skipped), transmit enabled by
//! TARC0 (on after reset), and MSI-X causes through IVAR and IMS: a message only when a queue
//! cause newly appears in ICR, then the cause auto-cleared from ICR by EIAC and, unless
//! CTRL_EXT.IAME, masked in IMS as well (QEMU 8.0 and later, `e1000e_msix_notify_one`): the
//! driver enables it again.

use super::igb::{advanced_writeback, rctl_buffer};
use super::{ICR, IMS, Personality, Ring, TxDesc};

/// The e1000e personality.
pub struct E1000e;

const RFCTL: usize = 0x5008;
const RFCTL_EXTEN: u32 = 1 << 15;
const TARC0: usize = 0x3840;
const TARC_ENABLE: u32 = 1 << 10;
const IVAR: usize = 0x00E4;
const EIAC: usize = 0x00DC;
const CTRL_EXT: usize = 0x0018;
const CTRL_EXT_IAME: u32 = 1 << 27;
const ICR_RXQ0: u32 = 1 << 20;
const ICR_TXQ0: u32 = 1 << 22;

impl Personality for E1000e {
    fn name(&self) -> &'static str {
        "e1000e"
    }

    fn device_id(&self) -> u16 {
        0x10D3
    }

    fn msix_bar_64(&self) -> bool {
        false
    }

    fn msix_vectors(&self) -> u16 {
        5
    }

    fn reset(&self, regs: &mut [u32]) {
        // Full duplex, set link up, 1000 Mb/s.
        regs[0] = 1 | 1 << 6 | 2 << 8;
        regs[2] = 2 << 8;
        regs[TARC0 / 4] = 0x3 | TARC_ENABLE;
        regs[0x5000 / 4] = 1 << 8 | 1 << 9;
        regs[0x0014 / 4] = 1 << 1;
    }

    fn link_after_reset(&self) -> bool {
        true
    }

    fn rings(&self) -> (Ring, Ring) {
        (
            Ring {
                bal: 0x2800,
                bah: 0x2804,
                len: 0x2808,
                head: 0x2810,
                tail: 0x2818,
            },
            Ring {
                bal: 0x3800,
                bah: 0x3804,
                len: 0x3808,
                head: 0x3810,
                tail: 0x3818,
            },
        )
    }

    fn rx_enabled(&self, _: &[u32]) -> bool {
        true
    }

    fn tx_enabled(&self, regs: &[u32]) -> bool {
        regs[TARC0 / 4] & TARC_ENABLE != 0
    }

    fn rx_buffer(&self, regs: &[u32]) -> usize {
        rctl_buffer(regs[super::RCTL / 4])
    }

    fn rx_writeback(&self, regs: &[u32], status: u32, len: u16) -> [u8; 16] {
        if regs[RFCTL / 4] & RFCTL_EXTEN != 0 {
            return advanced_writeback(status, len);
        }
        // Legacy: the buffer address stays, length at 8, status at 12, errors at 13.
        let mut wb = [0u8; 16];
        wb[8..10].copy_from_slice(&len.to_le_bytes());
        wb[12] = status as u8;
        wb[13] = (status >> 24) as u8;
        wb
    }

    fn tx_desc(&self, d: &[u8; 16]) -> TxDesc {
        let cmd = u32::from_le_bytes([d[8], d[9], d[10], d[11]]);
        let rs = cmd & 1 << 27 != 0;
        if cmd & 1 << 29 != 0 {
            return TxDesc::Unsupported { rs };
        }
        TxDesc::Data {
            addr: u64::from_le_bytes(d[..8].try_into().expect("8 bytes")),
            len: (cmd & 0xFFFF) as usize,
            eop: cmd & 1 << 24 != 0,
            rs,
        }
    }

    fn write(&self, _: &mut [u32], _: usize, _: u32) -> bool {
        false
    }

    fn vector(&self, regs: &[u32], rx: bool) -> Option<u16> {
        let field = (regs[IVAR / 4] >> if rx { 0 } else { 8 }) & 0xF;
        (field & 0x8 != 0 && regs[IMS / 4] & self.cause(rx) != 0).then_some((field & 7) as u16)
    }

    fn cause(&self, rx: bool) -> u32 {
        if rx { ICR_RXQ0 } else { ICR_TXQ0 }
    }

    fn fired(&self, regs: &mut [u32], rx: bool) {
        let cleared = regs[EIAC / 4] & self.cause(rx);
        regs[ICR / 4] &= !cleared;
        if regs[CTRL_EXT / 4] & CTRL_EXT_IAME == 0 {
            regs[IMS / 4] &= !cleared;
        }
    }
}
