//! Registers and bits the 82576 (igb) and the 82574 (e1000e) have at the same offsets with the
//! same meaning: device control and status, the EEPROM and PHY windows, interrupt causes and
//! masks, receive and transmit control, the receive checksum control, the multicast table and
//! the first receive address. Offsets are bytes into BAR 0; sources: docs/intel-nics.md.
// With one family compiled, the registers only the other uses are unused.
#![cfg_attr(not(all(feature = "igb", feature = "e1000e")), allow(dead_code))]

/// Device control.
pub(crate) const CTRL: usize = 0x0000;
/// Device status.
pub(crate) const STATUS: usize = 0x0008;
/// EEPROM read through the controller: start, done, word address, data.
pub(crate) const EERD: usize = 0x0014;
/// Extended device control.
pub(crate) const CTRL_EXT: usize = 0x0018;
/// MDI control: the PHY's registers.
pub(crate) const MDIC: usize = 0x0020;
/// Interrupt cause read (reading clears).
pub(crate) const ICR: usize = 0x00C0;
/// Interrupt mask set.
pub(crate) const IMS: usize = 0x00D0;
/// Interrupt mask clear.
pub(crate) const IMC: usize = 0x00D8;
/// Receive control.
pub(crate) const RCTL: usize = 0x0100;
/// Transmit control.
pub(crate) const TCTL: usize = 0x0400;
/// Receive checksum control.
pub(crate) const RXCSUM: usize = 0x5000;
/// The multicast table: 128 registers, 4096 bits.
pub(crate) const MTA: usize = 0x5200;
/// Registers of the multicast table.
pub(crate) const MTA_LEN: usize = 128;
/// Receive address 0, low four bytes of the MAC.
pub(crate) const RAL0: usize = 0x5400;
/// Receive address 0, the last two bytes and the valid bit.
pub(crate) const RAH0: usize = 0x5404;

/// CTRL: set link up.
pub(crate) const CTRL_SLU: u32 = 1 << 6;
/// CTRL: software reset (self-clearing).
pub(crate) const CTRL_RST: u32 = 1 << 26;
/// STATUS: link up.
pub(crate) const STATUS_LU: u32 = 1 << 1;
/// EERD: start a read.
pub(crate) const EERD_START: u32 = 1 << 0;
/// EERD: the read is done.
pub(crate) const EERD_DONE: u32 = 1 << 1;
/// EERD: where the word address goes.
pub(crate) const EERD_ADDR_SHIFT: u32 = 2;
/// EERD: where the word read comes back.
pub(crate) const EERD_DATA_SHIFT: u32 = 16;
/// MDIC: register number.
pub(crate) const MDIC_REG_SHIFT: u32 = 16;
/// MDIC: PHY address (the internal PHY is 1).
pub(crate) const MDIC_PHY_SHIFT: u32 = 21;
/// MDIC: a write.
pub(crate) const MDIC_OP_WRITE: u32 = 1 << 26;
/// MDIC: the access is done.
pub(crate) const MDIC_READY: u32 = 1 << 28;
/// MDIC: the access failed.
pub(crate) const MDIC_ERROR: u32 = 1 << 30;
/// RCTL: receiver enable.
pub(crate) const RCTL_EN: u32 = 1 << 1;
/// RCTL: accept broadcast.
pub(crate) const RCTL_BAM: u32 = 1 << 15;
/// RCTL: strip the Ethernet CRC.
pub(crate) const RCTL_SECRC: u32 = 1 << 26;
/// TCTL: transmitter enable.
pub(crate) const TCTL_EN: u32 = 1 << 1;
/// TCTL: pad short packets.
pub(crate) const TCTL_PSP: u32 = 1 << 3;
/// TCTL: collision threshold (15) and distance (64 byte times), the values full duplex wants.
pub(crate) const TCTL_CT_COLD: u32 = 0x0F << 4 | 0x40 << 12;
/// RXCSUM: check the IPv4 header checksum.
pub(crate) const RXCSUM_IPOFLD: u32 = 1 << 8;
/// RAH: the address is valid (the filter uses it).
pub(crate) const RAH_AV: u32 = 1 << 31;

/// Receive write-back, status dword (bytes 8..12 of the 16-byte descriptor): done.
pub(crate) const RX_DD: u32 = 1 << 0;
/// Receive write-back: end of packet (the last descriptor of a frame).
pub(crate) const RX_EOP: u32 = 1 << 1;
/// Receive write-back errors: CRC or alignment, symbol, sequence, carrier extension, TCP/UDP
/// checksum, IPv4 header checksum (bit 30: `RXCSUM.IPOFLD` has the NIC check it), data error.
pub(crate) const RX_ERRORS: u32 = 0xF700_0000;

/// Transmit command (bits 31:24 of the descriptor's third dword): end of packet.
pub(crate) const TX_EOP: u32 = 1 << 24;
/// Transmit command: insert the FCS.
pub(crate) const TX_IFCS: u32 = 1 << 25;
/// Transmit command: report status (write DD back).
pub(crate) const TX_RS: u32 = 1 << 27;
/// Transmit command: extended (advanced) descriptor.
pub(crate) const TX_DEXT: u32 = 1 << 29;
/// Transmit write-back (fourth dword): done.
pub(crate) const TX_DD: u32 = 1 << 0;

/// A descriptor ring's registers: base address (low, high), length in bytes, head, tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingRegs {
    /// Base address, low 32 bits.
    pub bal: usize,
    /// Base address, high 32 bits.
    pub bah: usize,
    /// Length in bytes (a multiple of 128).
    pub len: usize,
    /// Head: the next descriptor the device takes.
    pub head: usize,
    /// Tail: one past the last descriptor the driver gave.
    pub tail: usize,
}

/// The multicast table bit a destination MAC hashes to, with the table's offset 0 (RCTL.MO 0:
/// bits 47:36 of the address): (register, bit).
pub(crate) fn mta_bit(mac: [u8; 6]) -> (usize, u32) {
    let hash = ((usize::from(mac[5]) << 8 | usize::from(mac[4])) >> 4) & 0xFFF;
    (hash >> 5, 1 << (hash & 31))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_multicast_hash_takes_the_top_twelve_bits() {
        // 01:00:5e:00:00:01 (all hosts): bytes 4, 5 = 0x00, 0x01 -> 0x010 -> register 0, bit 16.
        assert_eq!(mta_bit([0x01, 0x00, 0x5E, 0, 0x00, 0x01]), (0, 1 << 16));
        // 33:33:ff:12:34:56: 0x5634 >> 4 = 0x563 -> register 43, bit 3.
        assert_eq!(mta_bit([0x33, 0x33, 0xFF, 0x12, 0x34, 0x56]), (43, 1 << 3));
        assert_eq!(mta_bit([0xFF; 6]), (127, 1 << 31));
    }
}
