//! RoCEv2 frames on the wire (`docs/roce-v2.md` §1–§5): parsed with every length and field
//! a peer wrote checked before use, and built byte for byte as Linux's `rdma_rxe` builds them.
//!
//! - [`eth`]: MAC addresses, the Ethernet header, ARP;
//! - [`ip`]: the IPv4 and UDP headers and their checksums;
//! - [`ip6`]: RoCEv2 over IPv6, frames built and checked;
//! - [`nd`]: IPv6 neighbour discovery messages;
//! - [`bth`]: the base transport header, the opcodes and the extended headers;
//! - [`icrc`]: the invariant CRC;
//! - [`igmp`]: IPv4 multicast groups: their MACs, the IGMPv2 report and leave;
//! - [`addr`]: GIDs and the UDP source ports derived from QPs;
//! - [`packet`]: whole frames, parsed ([`packet::parse`]) and built ([`packet::build`], or [`packet::begin`] and [`packet::finish`] around a payload written in place).
//! - [`template`]: a route's outer headers made once, patched per frame.

pub mod addr;
pub mod bth;
pub mod eth;
pub mod icrc;
pub mod igmp;
pub mod ip;
pub mod ip6;
pub mod nd;
pub mod packet;
pub mod template;

/// Why a received frame was dropped (each one a counter for the embedder; none is answered).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Discard {
    /// Shorter than the headers it claims, or lengths that disagree.
    Truncated,
    /// Not IPv4, not UDP, not to port 4791, or an ARP frame this stack does not handle.
    NotRoce,
    /// An IPv4 header with options, a fragment, or a bad header checksum.
    BadIp,
    /// A non-zero UDP checksum that is wrong.
    BadUdpChecksum,
    /// A BTH with a transport version other than 0, or a P_Key that is not the default.
    BadBth,
    /// An opcode with no meaning here (RD, CNP, reserved).
    UnknownOpcode,
    /// The ICRC does not match.
    BadIcrc,
    /// To another station's MAC (a promiscuous NIC passes such frames up).
    NotForUs,
    /// A source address no station on the segment has: this interface's own address from
    /// the wire, an unspecified, loopback, multicast or broadcast one (Linux's martians).
    Martian,
}

/// Reads a big-endian `u16` at `at` (the caller checked the bounds).
#[inline(always)]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Reads a big-endian 24-bit value at `at` (the caller checked the bounds).
#[inline(always)]
pub(crate) fn be24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

/// Reads a big-endian `u32` at `at` (the caller checked the bounds).
#[inline(always)]
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads a big-endian `u64` at `at` (the caller checked the bounds).
#[inline(always)]
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(*chunk(b, at))
}

/// The `N` bytes at `at` of `b`, as an array (the caller checked the bounds: out of them is a
/// panic, as indexing is).
#[inline(always)]
pub(crate) fn chunk<const N: usize>(b: &[u8], at: usize) -> &[u8; N] {
    match b.get(at..).and_then(<[u8]>::first_chunk::<N>) {
        Some(c) => c,
        None => panic!("header field out of bounds"),
    }
}

/// Writes the `N` bytes `v` at `at` of `b` (the caller checked the bounds: out of them is a
/// panic, as indexing is). One fixed-size store: at opt-level "z" a `copy_from_slice` of a few
/// bytes stays an out-of-line call that ends in `memcpy`, about 20 instructions a field.
#[inline(always)]
pub(crate) fn put<const N: usize>(b: &mut [u8], at: usize, v: [u8; N]) {
    match b.get_mut(at..).and_then(<[u8]>::first_chunk_mut::<N>) {
        Some(c) => *c = v,
        None => panic!("header field out of bounds"),
    }
}

/// Writes `v`'s low 24 bits big-endian at `at`.
#[inline(always)]
pub(crate) fn put24(b: &mut [u8], at: usize, v: u32) {
    let [_, x, y, z] = v.to_be_bytes();
    put(b, at, [x, y, z]);
}
