//! Whole frames: a received frame classified and checked ([`parse`]), and a RoCEv2 frame
//! built as Linux builds one ([`begin`], [`finish`], [`build`]; from a queue pair's template
//! of its outer headers: [`begin_with`], [`begin_bth`], [`ack`]).

use super::bth::{AETH_LEN, Aeth, AtomicEth, BTH_LEN, Bth, Deth, Headers, Layout, Reth, opcode};
use super::eth::{Arp, ETH_LEN, ETHERTYPE_ARP, ETHERTYPE_IPV4, Mac};
use super::icrc::{ICRC_LEN, icrc_v4};
use super::ip::{IPV4_LEN, Ipv4Header, PROTO_UDP, ROCE_PORT, UDP_LEN, UdpHeader, header_ok};
pub use super::template::{Route, Template};
use super::{Discard, be16, chunk, put};

/// Bytes before the transport headers of a RoCEv2 frame over IPv4.
pub const ROCE_OFFSET: usize = ETH_LEN + IPV4_LEN + UDP_LEN;

/// A received frame, classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// An ARP packet for IPv4 over Ethernet.
    Arp(Arp),
    /// A RoCEv2 packet: every length checked, the ICRC verified.
    Roce(Packet<'a>),
    /// Anything else (for the embedder's IP stack).
    Other,
}

/// A RoCEv2 packet over IPv4, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    /// The sender's MAC.
    pub src_mac: Mac,
    /// The IPv4 header.
    pub ip: Ipv4Header,
    /// The UDP header.
    pub udp: UdpHeader,
    /// The base transport header and its extended headers.
    pub headers: Headers,
    /// The payload, without pad and ICRC (empty for opcodes without one).
    pub payload: &'a [u8],
}

/// Classifies `frame` (from the destination MAC; trailing Ethernet padding allowed). IPv4
/// UDP to port 4791 is RoCEv2 and is checked completely: a failed check is the `Err`. ARP for
/// IPv4 is parsed; everything else is [`Frame::Other`].
pub fn parse(frame: &[u8]) -> Result<Frame<'_>, Discard> {
    Ok(match classify(frame)? {
        Seen::Roce(v) => Frame::Roce(v.packet()),
        Seen::Arp(a) => Frame::Arp(a),
        Seen::Other => Frame::Other,
    })
}

/// A received frame, classified as [`parse`] does, its RoCEv2 packet read in place.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Seen<'a> {
    /// An ARP packet for IPv4 over Ethernet.
    Arp(Arp),
    /// A RoCEv2 packet: every length checked, the ICRC verified.
    Roce(View<'a>),
    /// Anything else.
    Other,
}

/// Bytes of a RoCEv2 frame up to the end of its BTH.
const HEAD: usize = ROCE_OFFSET + BTH_LEN;

/// A checked RoCEv2 packet over IPv4, read in place: the transport reads the fields it uses
/// from the frame (the bounds were checked once, by [`classify`]), instead of a record of
/// every field written by the parse and read back (at opt-level "z", some 90 instructions a
/// frame for the record alone).
#[derive(Clone, Copy, Debug)]
pub(crate) struct View<'a> {
    /// The outer headers and the BTH.
    head: &'a [u8; HEAD],
    /// The extended headers (as long as `layout` says).
    ext: &'a [u8],
    /// The payload, without pad and ICRC.
    payload: &'a [u8],
    layout: Layout,
}

impl<'a> View<'a> {
    /// The sender's MAC.
    #[inline(always)]
    pub(crate) fn src_mac(&self) -> Mac {
        *chunk(self.head, 6)
    }

    /// The IPv4 source address.
    #[inline(always)]
    pub(crate) fn src_ip(&self) -> [u8; 4] {
        *chunk(self.head, ETH_LEN + 12)
    }

    /// The IPv4 destination address.
    #[inline(always)]
    pub(crate) fn dst_ip(&self) -> [u8; 4] {
        *chunk(self.head, ETH_LEN + 16)
    }

    /// The BTH's opcode.
    #[inline(always)]
    pub(crate) fn opcode(&self) -> u8 {
        self.head[ROCE_OFFSET]
    }

    /// The BTH's solicited event bit.
    #[inline(always)]
    pub(crate) fn se(&self) -> bool {
        self.head[ROCE_OFFSET + 1] & 0x80 != 0
    }

    /// The BTH's destination QP.
    #[inline(always)]
    pub(crate) fn dest_qp(&self) -> u32 {
        // One 4-byte load with the reserved byte before masked off (not three byte loads).
        u32::from_be_bytes(*chunk(self.head, ROCE_OFFSET + 4)) & 0xFF_FFFF
    }

    /// The BTH's acknowledge request bit.
    #[inline(always)]
    pub(crate) fn ack_req(&self) -> bool {
        self.head[ROCE_OFFSET + 8] & 0x80 != 0
    }

    /// The BTH's PSN.
    #[inline(always)]
    pub(crate) fn psn(&self) -> u32 {
        // As `dest_qp`: the AckReq byte before masked off.
        u32::from_be_bytes(*chunk(self.head, ROCE_OFFSET + 8)) & 0xFF_FFFF
    }

    /// The DETH (UD).
    #[inline(always)]
    pub(crate) fn deth(&self) -> Option<Deth> {
        self.layout.deth(self.ext)
    }

    /// The RETH (WRITE FIRST/ONLY, READ request).
    #[inline(always)]
    pub(crate) fn reth(&self) -> Option<Reth> {
        self.layout.reth(self.ext)
    }

    /// The AtomicETH.
    #[inline(always)]
    pub(crate) fn atomic(&self) -> Option<AtomicEth> {
        self.layout.atomic(self.ext)
    }

    /// The AETH.
    #[inline(always)]
    pub(crate) fn aeth(&self) -> Option<Aeth> {
        self.layout.aeth(self.ext)
    }

    /// The AtomicAckETH's original value.
    #[inline(always)]
    pub(crate) fn atomic_ack(&self) -> Option<u64> {
        self.layout.atomic_ack(self.ext)
    }

    /// The immediate data (or the IETH's rkey).
    #[inline(always)]
    pub(crate) fn imm(&self) -> Option<u32> {
        self.layout.imm(self.ext)
    }

    /// The payload, without pad and ICRC.
    #[inline(always)]
    pub(crate) fn payload(&self) -> &'a [u8] {
        self.payload
    }

    /// The IPv4 header's bytes.
    #[inline(always)]
    pub(crate) fn ip_header(&self) -> &'a [u8; IPV4_LEN] {
        chunk(self.head, ETH_LEN)
    }

    /// Every field, as [`parse`] gives them.
    pub(crate) fn packet(&self) -> Packet<'a> {
        let h = self.head;
        let t = chunk::<BTH_LEN>(h, ROCE_OFFSET);
        Packet {
            src_mac: self.src_mac(),
            ip: Ipv4Header::read(self.ip_header()),
            udp: UdpHeader::read(chunk(h, ETH_LEN + IPV4_LEN)),
            headers: Headers {
                bth: Bth {
                    opcode: t[0],
                    se: self.se(),
                    pad: (t[1] >> 4) & 3,
                    pkey: be16(t, 2),
                    dest_qp: self.dest_qp(),
                    ack_req: self.ack_req(),
                    psn: self.psn(),
                },
                deth: self.deth(),
                reth: self.reth(),
                atomic: self.atomic(),
                aeth: self.aeth(),
                atomic_ack: self.atomic_ack(),
                imm: self.imm(),
            },
            payload: self.payload,
        }
    }
}

/// [`parse`], the RoCEv2 packet left in place ([`View`]): every check [`parse`] makes, in
/// the same order, with the same outcome.
#[inline(always)]
pub(crate) fn classify(frame: &[u8]) -> Result<Seen<'_>, Discard> {
    let eth = frame.first_chunk::<ETH_LEN>().ok_or(Discard::Truncated)?;
    // Slices taken with `get` throughout (the bounds were checked; an index is an out-of-line
    // call with its panic path at opt-level "z").
    let body = frame.get(ETH_LEN..).ok_or(Discard::Truncated)?;
    // The EtherType as it lies in the frame, against the constants in network order (no
    // byte swap of the field).
    let ethertype = u16::from_ne_bytes(*chunk(eth, 12));
    if ethertype != ETHERTYPE_IPV4.to_be() {
        return Ok(if ethertype == ETHERTYPE_ARP.to_be() {
            Arp::parse(body).map_or(Seen::Other, Seen::Arp)
        } else {
            Seen::Other
        });
    }
    // Is it for RoCE? Decided before the strict checks: an IP packet for the embedder's stack
    // may carry options or be a fragment. Without options (the only kind RoCE uses) the outer
    // headers are at fixed offsets, read from one array (no bounds checks).
    let Some(outer) = frame
        .first_chunk::<ROCE_OFFSET>()
        .filter(|o| o[ETH_LEN] == 0x45)
    else {
        // Not IPv4, with options, or too short for the IPv4 and UDP headers: not RoCE,
        // unless one with options is to port 4791 (RoCE does not use options).
        let ihl = usize::from(body.first().map_or(0, |b| b & 0xF)) * 4;
        let roce = body.len() >= ihl + UDP_LEN
            && ihl > IPV4_LEN
            && body[0] >> 4 == 4
            && body[9] == PROTO_UDP
            && be16(body, 6) & 0x1FFF == 0
            && be16(body, ihl + 2) == ROCE_PORT;
        return if roce {
            Err(Discard::BadIp)
        } else {
            Ok(Seen::Other)
        };
    };
    if outer[ETH_LEN + 9] != PROTO_UDP
        || be16(outer, ETH_LEN + 6) & 0x1FFF != 0
        || be16(outer, ETH_LEN + IPV4_LEN + 2) != ROCE_PORT
    {
        return Ok(Seen::Other);
    }
    // `Ipv4Header::check` with what is known here (version 4, no options, no fragment
    // offset) left out; a total length short of the IPv4 and UDP headers is refused at once,
    // as that check and `UdpHeader::check` would (both: truncated).
    let ip = chunk::<IPV4_LEN>(outer, ETH_LEN);
    if ip[6] & 0x20 != 0 || !header_ok(ip) {
        return Err(Discard::BadIp);
    }
    let total = usize::from(be16(ip, 2));
    if total < IPV4_LEN + UDP_LEN || total > body.len() {
        return Err(Discard::Truncated);
    }
    let datagram = body.get(IPV4_LEN..total).ok_or(Discard::Truncated)?;
    let (_, udp_len) = UdpHeader::check(datagram, chunk(ip, 12), chunk(ip, 16))?;
    let transport = datagram.get(UDP_LEN..udp_len).ok_or(Discard::Truncated)?;
    let bth = transport
        .first_chunk::<BTH_LEN>()
        .ok_or(Discard::Truncated)?;
    if bth[1] & 0xF != 0 {
        return Err(Discard::BadBth);
    }
    let layout = Layout::lookup(bth[0]).ok_or(Discard::UnknownOpcode)?;
    let hlen = layout.header_bytes();
    let ext = transport.get(BTH_LEN..hlen).ok_or(Discard::Truncated)?;
    // The P_Key's low 15 bits all ones (the default partition, either membership), tested
    // as the bytes lie: the membership bit set, then all ones.
    if u16::from_ne_bytes(*chunk(bth, 2)) | u16::from_ne_bytes([0x80, 0]) != 0xFFFF {
        return Err(Discard::BadBth);
    }
    let body_len = transport
        .len()
        .checked_sub(hlen + ICRC_LEN)
        .ok_or(Discard::Truncated)?;
    let pad = usize::from((bth[1] >> 4) & 3);
    if body_len < pad || (!layout.payload() && body_len != 0) {
        return Err(Discard::Truncated);
    }
    let end = transport.len() - ICRC_LEN;
    let sent = *chunk::<ICRC_LEN>(transport, end);
    // The ICRC covers the IP packet up to the end of the pad.
    let covered = body
        .get(..IPV4_LEN + UDP_LEN + end)
        .ok_or(Discard::Truncated)?;
    if icrc_v4(covered) != Some(u32::from_le_bytes(sent)) {
        return Err(Discard::BadIcrc);
    }
    Ok(Seen::Roce(View {
        head: frame.first_chunk::<HEAD>().ok_or(Discard::Truncated)?,
        ext,
        payload: transport.get(hlen..end - pad).ok_or(Discard::Truncated)?,
        layout,
    }))
}

/// The [`View`] of a frame the device made from a RoCEv2 packet over IPv6 that the port
/// checked whole ([`ipv6_to_ipv4`](super::ip6::ipv6_to_ipv4) of a frame
/// [`parse6`](super::ip6::parse6) took): its lengths, BTH and ICRC were checked in the IPv6
/// form, so only the bounds are looked at again. `None` when they do not hold. Out of line:
/// [`classify`]'s IPv4 path is not duplicated for it.
#[inline(never)]
pub(crate) fn view_converted(frame: &[u8]) -> Option<View<'_>> {
    let head = frame.first_chunk::<HEAD>()?;
    let total = usize::from(be16(head, ETH_LEN + 2));
    let transport = frame.get(ROCE_OFFSET..ETH_LEN + total)?;
    let layout = Layout::lookup(*transport.first()?)?;
    let hlen = layout.header_bytes();
    let ext = transport.get(BTH_LEN..hlen)?;
    let end = transport.len().checked_sub(ICRC_LEN)?;
    let pad = usize::from((transport.get(1)? >> 4) & 3);
    let payload = transport.get(hlen..end.checked_sub(pad)?)?;
    Some(View {
        head,
        ext,
        payload,
        layout,
    })
}

/// Writes the outer headers and the transport headers of a frame whose payload is
/// `payload_len` bytes into `buf` (the BTH's pad count is set from the length; the IPv4
/// identification is `id`). Returns where the payload goes; the caller writes it there and
/// calls [`finish`]. `None` when the headers cannot be written (an extended header the opcode
/// needs is absent) or the frame would not fit `buf`.
pub fn begin(
    buf: &mut [u8],
    route: &Route,
    id: u16,
    headers: &Headers,
    payload_len: usize,
) -> Option<usize> {
    let outer = Template::new(route, headers.bth.dest_qp);
    begin_with(buf, &outer, id, headers, payload_len)
}

/// [`begin`] with the route's outer headers made beforehand ([`Template`]).
pub fn begin_with(
    buf: &mut [u8],
    outer: &Template,
    id: u16,
    headers: &Headers,
    payload_len: usize,
) -> Option<usize> {
    let pad = payload_len.wrapping_neg() & 3;
    let transport = buf.get_mut(ROCE_OFFSET..)?;
    // Written as given, then the pad count set in its byte (the headers are not copied to
    // change one field: at opt-level "z" that copy is some 30 instructions a frame).
    let hlen = headers.write(transport)?;
    transport[1] = (transport[1] & !0x30) | (pad as u8) << 4;
    let udp_len = UDP_LEN + hlen + payload_len + pad + ICRC_LEN;
    let total = IPV4_LEN + udp_len;
    if ETH_LEN + total > buf.len() || total > usize::from(u16::MAX) {
        return None;
    }
    outer.write(buf.first_chunk_mut()?, id, total as u16);
    Some(ROCE_OFFSET + hlen)
}

/// [`begin_with`] for a frame whose transport header is a BTH alone (no extended header), at
/// fixed offsets: no header record, no layout lookup. `bth` gives the opcode, SE, AckReq and
/// PSN; the P_Key is the default one and the destination QP the template's; the pad count is
/// set from `payload_len`.
#[inline(always)]
pub fn begin_bth(
    buf: &mut [u8],
    outer: &Template,
    id: u16,
    bth: &Bth,
    payload_len: usize,
) -> Option<usize> {
    let pad = payload_len.wrapping_neg() & 3;
    let total = IPV4_LEN + UDP_LEN + BTH_LEN + payload_len + pad + ICRC_LEN;
    if ETH_LEN + total > buf.len() || total > usize::from(u16::MAX) {
        return None;
    }
    // The headers as one array (one bounds check), split at fixed offsets (none).
    let (o, t) = buf
        .first_chunk_mut::<{ ROCE_OFFSET + BTH_LEN }>()?
        .split_first_chunk_mut::<ROCE_OFFSET>()?;
    outer.write(o, id, total as u16);
    let flags = u8::from(bth.se) << 7 | (pad as u8) << 4;
    let b = t.first_chunk_mut::<BTH_LEN>()?;
    outer.write_bth(b, bth.opcode, flags, bth.ack_req, bth.psn);
    Some(ROCE_OFFSET + BTH_LEN)
}

/// Bytes of extended headers [`begin_ext`] writes at most (a RETH's).
pub const EXT_MAX: usize = 16;

/// [`begin_bth`] with the first `ext_len` bytes of `ext` after the BTH: the extended headers
/// of `bth`'s opcode as [`Headers::write`] writes them ([`reth_bytes`], [`aeth_bytes`]; none
/// for a BTH alone), at fixed offsets. `None` as [`begin_bth`], and when `ext_len` is over
/// [`EXT_MAX`].
#[inline(always)]
pub fn begin_ext(
    buf: &mut [u8],
    outer: &Template,
    id: u16,
    bth: &Bth,
    ext: &[u8; EXT_MAX],
    ext_len: usize,
    payload_len: usize,
) -> Option<usize> {
    if ext_len > EXT_MAX {
        return None;
    }
    let pad = payload_len.wrapping_neg() & 3;
    let total = IPV4_LEN + UDP_LEN + BTH_LEN + ext_len + payload_len + pad + ICRC_LEN;
    if ETH_LEN + total > buf.len() || total > usize::from(u16::MAX) {
        return None;
    }
    let (o, t) = buf
        .first_chunk_mut::<{ ROCE_OFFSET + BTH_LEN }>()?
        .split_first_chunk_mut::<ROCE_OFFSET>()?;
    outer.write(o, id, total as u16);
    let flags = u8::from(bth.se) << 7 | (pad as u8) << 4;
    let b = t.first_chunk_mut::<BTH_LEN>()?;
    outer.write_bth(b, bth.opcode, flags, bth.ack_req, bth.psn);
    let room = buf.get_mut(ROCE_OFFSET + BTH_LEN..)?;
    match room.first_chunk_mut::<EXT_MAX>() {
        // All of `ext` in one store: the bytes past `ext_len` land where the payload, the pad
        // and the ICRC are written after, or past the frame.
        Some(w) => *w = *ext,
        // A buffer that ends sooner (a short frame in a buffer of its size).
        None => room
            .get_mut(..ext_len)?
            .copy_from_slice(ext.get(..ext_len)?),
    }
    Some(ROCE_OFFSET + BTH_LEN + ext_len)
}

/// A RETH's 16 bytes, as [`Headers::write`] writes them.
#[inline(always)]
pub fn reth_bytes(r: &Reth) -> [u8; EXT_MAX] {
    let mut b = [0; EXT_MAX];
    put(&mut b, 0, r.va.to_be_bytes());
    put(&mut b, 8, r.rkey.to_be_bytes());
    put(&mut b, 12, r.len.to_be_bytes());
    b
}

/// An AETH's 4 bytes, as [`Headers::write`] writes them, first in [`begin_ext`]'s array.
#[inline(always)]
pub fn aeth_bytes(a: &Aeth) -> [u8; EXT_MAX] {
    let mut b = [0; EXT_MAX];
    put(
        &mut b,
        0,
        (u32::from(a.syndrome) << 24 | a.msn & 0xFF_FFFF).to_be_bytes(),
    );
    b
}

/// Bytes of an acknowledgement's frame: the outer headers, BTH, AETH, ICRC (no payload, no
/// pad).
pub const ACK_FRAME_LEN: usize = ROCE_OFFSET + BTH_LEN + AETH_LEN + ICRC_LEN;

/// Builds a whole acknowledgement along `outer` into `buf`: an RC ACK or NAK (opcode
/// Acknowledge, no SE, no AckReq, pad 0, the default P_Key, the template's destination QP) for
/// `psn`, then `aeth`; at fixed offsets, the frame [`begin`] and [`finish`] would build from
/// the same headers, without the general path's header record, layout lookups and lengths.
/// Returns [`ACK_FRAME_LEN`]; `None` when `buf` is shorter.
pub fn ack(buf: &mut [u8], outer: &Template, id: u16, psn: u32, aeth: Aeth) -> Option<usize> {
    let f = buf.first_chunk_mut::<ACK_FRAME_LEN>()?;
    let (o, t) = f.split_first_chunk_mut::<ROCE_OFFSET>()?;
    outer.write(o, id, (ACK_FRAME_LEN - ETH_LEN) as u16);
    let (b, t) = t.split_first_chunk_mut::<BTH_LEN>()?;
    outer.write_bth(b, opcode::RC_ACK, 0, false, psn);
    let word = u32::from(aeth.syndrome) << 24 | aeth.msn & 0xFF_FFFF;
    put(t, 0, word.to_be_bytes());
    let crc = icrc_v4(f.get(ETH_LEN..ACK_FRAME_LEN - ICRC_LEN)?)?;
    put(f, ACK_FRAME_LEN - ICRC_LEN, crc.to_le_bytes());
    Some(ACK_FRAME_LEN)
}

/// Completes a frame [`begin`] started, once its payload is in place: the pad and the ICRC.
/// Returns the frame's length; `None` when `buf` does not hold a frame [`begin`] started.
#[inline(always)]
pub fn finish(buf: &mut [u8]) -> Option<usize> {
    let total = usize::from(be16(buf.get(..ROCE_OFFSET + 2)?, ETH_LEN + 2));
    let end = ETH_LEN + total;
    let pad = usize::from((buf[ROCE_OFFSET + 1] >> 4) & 3);
    let icrc_at = end.checked_sub(ICRC_LEN)?;
    let pad_at = icrc_at.checked_sub(pad)?;
    if pad_at < ROCE_OFFSET + BTH_LEN || end > buf.len() {
        return None;
    }
    // The pad (0 to 3 bytes) zeroed by one 4-byte store (no `memset` call): the bytes after
    // it are the ICRC's, written below (`pad_at + 4 <= end`).
    put(buf, pad_at, [0; 4]);
    let crc = icrc_v4(buf.get(ETH_LEN..icrc_at)?)?;
    put(buf, icrc_at, crc.to_le_bytes());
    Some(end)
}

/// [`finish`] of a frame whose payload ends at `pad_at` and which ends at `end`, both known to
/// the sender (from [`begin`]'s offset and the payload's length: `end` is `pad_at` plus the
/// pad and the ICRC), without reading the lengths back from the headers. Returns `end`;
/// `None` when they leave no room for the pad and the ICRC, or `end` is past `buf`.
#[inline(always)]
pub fn finish_at(buf: &mut [u8], pad_at: usize, end: usize) -> Option<usize> {
    let icrc_at = end.checked_sub(ICRC_LEN)?;
    let f = buf.get_mut(..end)?;
    if pad_at < ROCE_OFFSET + BTH_LEN || pad_at > icrc_at {
        return None;
    }
    // As in `finish`: the pad zeroed by one 4-byte store (`pad_at + 4 <= end`).
    put(f, pad_at, [0; 4]);
    let crc = icrc_v4(f.get(ETH_LEN..icrc_at)?)?;
    put(f, icrc_at, crc.to_le_bytes());
    Some(end)
}

/// Builds a whole RoCEv2 frame with `payload` into `buf` and returns its length; `None` as
/// [`begin`].
pub fn build(
    buf: &mut [u8],
    route: &Route,
    id: u16,
    headers: &Headers,
    payload: &[u8],
) -> Option<usize> {
    let at = begin(buf, route, id, headers, payload.len())?;
    buf[at..at + payload.len()].copy_from_slice(payload);
    finish(buf)
}

/// Bytes a frame needs beyond its payload, at most (IPv4, the largest transport headers,
/// pad, ICRC).
pub const MAX_OVERHEAD: usize = ROCE_OFFSET + BTH_LEN + 28 + 3 + ICRC_LEN;

#[cfg(test)]
#[path = "packet_tests.rs"]
mod tests;
