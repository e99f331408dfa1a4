//! The 82576 as QEMU's igb emulates it (hw/net/igb_core.c; docs/intel-nics.md): queue 0's
//! registers at 0xC000/0xE000, the queue enables in RXDCTL/TXDCTL (on after reset), advanced
//! receive descriptors (QEMU implements no other kind) with SRRCTL's buffer size, advanced
//! transmit data and context descriptors (legacy ones are skipped), the link down after a
//! reset until auto-negotiation is restarted through the PHY, and MSI-X causes through GPIE's
//! MSI-X mode, IVAR0 and EIMS.

use super::{Personality, Ring, TxDesc};

/// The igb personality.
pub struct Igb;

const SRRCTL0: usize = 0xC00C;
const RXDCTL0: usize = 0xC028;
const TXDCTL0: usize = 0xE028;
const GPIE: usize = 0x1514;
const EIMS: usize = 0x1524;
const EIMC: usize = 0x1528;
const IVAR0: usize = 0x1700;
const QUEUE_ENABLE: u32 = 1 << 25;
const GPIE_MSIX_MODE: u32 = 1 << 4;

impl Personality for Igb {
    fn name(&self) -> &'static str {
        "igb"
    }

    fn device_id(&self) -> u16 {
        0x10C9
    }

    fn msix_bar_64(&self) -> bool {
        true
    }

    fn msix_vectors(&self) -> u16 {
        25
    }

    fn reset(&self, regs: &mut [u32]) {
        regs[RXDCTL0 / 4] = QUEUE_ENABLE | 1 << 16;
        regs[TXDCTL0 / 4] = QUEUE_ENABLE;
        // Full duplex, 1000 Mb/s, link reset; PHY reset asserted; no link.
        regs[0] = 1 | 1 << 3 | 2 << 8 | 1 << 20;
        regs[2] = 1 << 10 | 1 << 31;
        regs[super::RCTL / 4] = 0;
        // RXCSUM: IP and TCP/UDP checksum offload on.
        regs[0x5000 / 4] = 1 << 8 | 1 << 9;
    }

    fn link_after_reset(&self) -> bool {
        false
    }

    fn rings(&self) -> (Ring, Ring) {
        (
            Ring {
                bal: 0xC000,
                bah: 0xC004,
                len: 0xC008,
                head: 0xC010,
                tail: 0xC018,
            },
            Ring {
                bal: 0xE000,
                bah: 0xE004,
                len: 0xE008,
                head: 0xE010,
                tail: 0xE018,
            },
        )
    }

    fn rx_enabled(&self, regs: &[u32]) -> bool {
        regs[RXDCTL0 / 4] & QUEUE_ENABLE != 0
    }

    fn tx_enabled(&self, regs: &[u32]) -> bool {
        regs[TXDCTL0 / 4] & QUEUE_ENABLE != 0
    }

    fn rx_buffer(&self, regs: &[u32]) -> usize {
        match regs[SRRCTL0 / 4] & 0x7F {
            0 => rctl_buffer(regs[super::RCTL / 4]),
            k => k as usize * 1024,
        }
    }

    fn rx_writeback(&self, _: &[u32], status: u32, len: u16) -> [u8; 16] {
        advanced_writeback(status, len)
    }

    fn tx_desc(&self, d: &[u8; 16]) -> TxDesc {
        let cmd = u32::from_le_bytes([d[8], d[9], d[10], d[11]]);
        let rs = cmd & 1 << 27 != 0;
        if cmd & 1 << 29 == 0 {
            return TxDesc::Unsupported { rs };
        }
        match (cmd >> 20) & 0xF {
            0x3 => TxDesc::Data {
                addr: u64::from_le_bytes(d[..8].try_into().expect("8 bytes")),
                len: (cmd & 0xFFFF) as usize,
                eop: cmd & 1 << 24 != 0,
                rs,
            },
            0x2 => TxDesc::Context { rs: false },
            _ => TxDesc::Unsupported { rs: false },
        }
    }

    fn write(&self, regs: &mut [u32], offset: usize, value: u32) -> bool {
        match offset {
            EIMS => regs[EIMS / 4] |= value,
            EIMC => regs[EIMS / 4] &= !value,
            _ => return false,
        }
        true
    }

    fn vector(&self, regs: &[u32], rx: bool) -> Option<u16> {
        if regs[GPIE / 4] & GPIE_MSIX_MODE == 0 {
            return None;
        }
        let entry = (regs[IVAR0 / 4] >> if rx { 0 } else { 8 }) & 0xFF;
        let v = (entry & 0x1F) as u16;
        (entry & 0x80 != 0 && regs[EIMS / 4] & 1 << v != 0).then_some(v)
    }
}

/// The receive buffer size RCTL's BSIZE and BSEX give.
pub(crate) fn rctl_buffer(rctl: u32) -> usize {
    let size = [2048, 1024, 512, 256][((rctl >> 16) & 3) as usize];
    if rctl & 1 << 25 != 0 { size * 16 } else { size }
}

/// The advanced (igb) and extended (e1000e) receive write-back: status and errors in the
/// third dword, the length in bytes 12-13.
pub(crate) fn advanced_writeback(status: u32, len: u16) -> [u8; 16] {
    let mut wb = [0u8; 16];
    wb[8..12].copy_from_slice(&status.to_le_bytes());
    wb[12..14].copy_from_slice(&len.to_le_bytes());
    wb
}
