//! The Ethernet header and ARP (RFC 826) for IPv4 over Ethernet.

use super::{Discard, be16, chunk, put};

/// A MAC address.
pub type Mac = [u8; 6];

/// Whether two MACs are the same, compared as a 4-byte and a 2-byte word (the arrays'
/// equality loads each MAC as one 48-bit number, assembled with shifts).
#[inline(always)]
pub(crate) fn same_mac(a: &Mac, b: &Mac) -> bool {
    chunk::<4>(a, 0) == chunk::<4>(b, 0) && chunk::<2>(a, 4) == chunk::<2>(b, 4)
}

/// The broadcast MAC address.
pub const BROADCAST: Mac = [0xFF; 6];

/// Bytes of an Ethernet header (no 802.1Q tag).
pub const ETH_LEN: usize = 14;

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;

/// Bytes of an ARP packet for IPv4 over Ethernet.
pub const ARP_LEN: usize = 28;

/// An Ethernet header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EthHeader {
    /// Destination MAC.
    pub dst: Mac,
    /// Source MAC.
    pub src: Mac,
    /// EtherType.
    pub ethertype: u16,
}

impl EthHeader {
    /// The header at the start of `frame`.
    pub fn parse(frame: &[u8]) -> Result<Self, Discard> {
        let h = frame.get(..ETH_LEN).ok_or(Discard::Truncated)?;
        Ok(EthHeader {
            dst: *chunk(h, 0),
            src: *chunk(h, 6),
            ethertype: be16(h, 12),
        })
    }

    /// Writes the header into the first [`ETH_LEN`] bytes of `out`.
    pub fn write(&self, out: &mut [u8; ETH_LEN]) {
        put(out, 0, self.dst);
        put(out, 6, self.src);
        put(out, 12, self.ethertype.to_be_bytes());
    }
}

/// An ARP operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArpOp {
    /// Who has `target_ip`? (1)
    Request,
    /// `sender_ip` is at `sender_mac` (2).
    Reply,
}

/// An ARP packet for IPv4 over Ethernet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arp {
    /// Request or reply.
    pub op: ArpOp,
    /// The sender's MAC.
    pub sender_mac: Mac,
    /// The sender's IPv4 address.
    pub sender_ip: [u8; 4],
    /// The target's MAC (zero in a request).
    pub target_mac: Mac,
    /// The target's IPv4 address.
    pub target_ip: [u8; 4],
}

impl Arp {
    /// The ARP packet after an Ethernet header (`body`: the frame from byte 14). Anything but
    /// Ethernet/IPv4 with 6- and 4-byte addresses and operation 1 or 2 is
    /// [`Discard::NotRoce`].
    pub fn parse(body: &[u8]) -> Result<Self, Discard> {
        let b = body.get(..ARP_LEN).ok_or(Discard::Truncated)?;
        if be16(b, 0) != 1 || be16(b, 2) != ETHERTYPE_IPV4 || b[4] != 6 || b[5] != 4 {
            return Err(Discard::NotRoce);
        }
        let op = match be16(b, 6) {
            1 => ArpOp::Request,
            2 => ArpOp::Reply,
            _ => return Err(Discard::NotRoce),
        };
        let mut a = Arp {
            op,
            sender_mac: [0; 6],
            sender_ip: [0; 4],
            target_mac: [0; 6],
            target_ip: [0; 4],
        };
        a.sender_mac.copy_from_slice(&b[8..14]);
        a.sender_ip.copy_from_slice(&b[14..18]);
        a.target_mac.copy_from_slice(&b[18..24]);
        a.target_ip.copy_from_slice(&b[24..28]);
        Ok(a)
    }

    /// The whole frame carrying this packet from `src` (to the broadcast address for a
    /// request, to the target for a reply), padded to Ethernet's 60-byte minimum.
    pub fn frame(&self, src: Mac) -> [u8; 60] {
        let mut f = [0u8; 60];
        let dst = match self.op {
            ArpOp::Request => BROADCAST,
            ArpOp::Reply => self.target_mac,
        };
        let mut eth = [0u8; ETH_LEN];
        EthHeader {
            dst,
            src,
            ethertype: ETHERTYPE_ARP,
        }
        .write(&mut eth);
        f[..ETH_LEN].copy_from_slice(&eth);
        let b = &mut f[ETH_LEN..ETH_LEN + ARP_LEN];
        b[..2].copy_from_slice(&1u16.to_be_bytes());
        b[2..4].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        b[4] = 6;
        b[5] = 4;
        let op: u16 = match self.op {
            ArpOp::Request => 1,
            ArpOp::Reply => 2,
        };
        b[6..8].copy_from_slice(&op.to_be_bytes());
        b[8..14].copy_from_slice(&self.sender_mac);
        b[14..18].copy_from_slice(&self.sender_ip);
        b[18..24].copy_from_slice(&self.target_mac);
        b[24..28].copy_from_slice(&self.target_ip);
        f
    }

    /// The reply this request asks of the owner of `(mac, ip)`, if it asks for `ip`.
    pub fn answer(&self, mac: Mac, ip: [u8; 4]) -> Option<Arp> {
        (self.op == ArpOp::Request && self.target_ip == ip).then_some(Arp {
            op: ArpOp::Reply,
            sender_mac: mac,
            sender_ip: ip,
            target_mac: self.sender_mac,
            target_ip: self.sender_ip,
        })
    }
}
