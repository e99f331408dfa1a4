//! Packet sequence numbers and how a message is cut into packets (`docs/roce-v2.md` §2,
//! §6.2): 24-bit PSNs compared modulo 2^24 with a half window, and the packets of a SEND,
//! RDMA WRITE or READ response at a path MTU, with their opcodes and acknowledge requests.

use super::wire::bth::{PSN_MASK, opcode};

/// `a + n` in PSN space.
pub fn psn_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// `a - b` in PSN space, as a signed distance within half the space (±2^23): positive when
/// `a` is after `b`.
pub fn psn_diff(a: u32, b: u32) -> i32 {
    (a.wrapping_sub(b) << 8) as i32 >> 8
}

/// The path MTUs RoCE uses, in bytes.
pub const MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// Unacknowledged PSNs a requester may have in flight (rxe's window).
pub(crate) const WINDOW: i32 = 128;

/// An acknowledge request at least every this many packets of a long message (rxe: 64).
pub const ACK_EVERY: u32 = 64;

/// What a message is, for cutting it into packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// SEND, with immediate data or not.
    Send {
        /// With immediate data.
        imm: bool,
    },
    /// RDMA WRITE, with immediate data or not.
    Write {
        /// With immediate data.
        imm: bool,
    },
    /// The responses of an RDMA READ.
    ReadResponse,
}

/// One packet of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The opcode (RC).
    pub opcode: u8,
    /// Where its payload starts in the message.
    pub offset: u32,
    /// Its payload's length.
    pub len: u32,
    /// The packet's index in the message (its PSN is the first PSN plus this).
    pub index: u32,
    /// Whether it asks for an acknowledge (the last packet, and every [`ACK_EVERY`]th).
    pub ack_req: bool,
}

/// Packets of a message of `len` bytes at path MTU `mtu` (a zero-length message is one
/// packet). `None` when `mtu` is not one of [`MTUS`].
#[inline(always)]
pub fn packets(len: u32, mtu: u32) -> Option<u32> {
    // One of MTUS: the powers of two from 256 to 4096 (two compares, not a walk of the list).
    let mtu_ok = mtu.is_power_of_two() && (MTUS[0]..=MTUS[MTUS.len() - 1]).contains(&mtu);
    // A power of two: a shift and a mask (`div_ceil` and `then` are out-of-line calls at
    // opt-level "z").
    if !mtu_ok {
        return None;
    }
    let n = (len >> mtu.trailing_zeros()) + u32::from(len & (mtu - 1) != 0);
    Some(n.max(1))
}

/// The packets of a `kind` message of `len` bytes at path MTU `mtu`, in order; empty when
/// `mtu` is not one of [`MTUS`].
pub fn segments(kind: Kind, len: u32, mtu: u32) -> impl Iterator<Item = Segment> {
    segments_from(kind, len, mtu, 0)
}

/// The packets of [`segments`] from the packet `from` on, found without walking the ones
/// before it.
pub fn segments_from(kind: Kind, len: u32, mtu: u32, from: u32) -> impl Iterator<Item = Segment> {
    let n = packets(len, mtu).unwrap_or(0);
    (from.min(n)..n).map(move |i| nth(kind, len, mtu, n, i))
}

/// Packet `i` of the `n` of a message of `len` bytes at path MTU `mtu`, `n` counted by
/// [`packets`] when the message started (the requester keeps it): [`segment`] without the
/// count again, nor its MTU checks. `None` past the last packet, or when `n` does not cut
/// `len` at `mtu` (a packet would be longer than the MTU, or none would be left for the
/// last one).
#[inline(always)]
pub fn segment_of(kind: Kind, len: u32, mtu: u32, n: u32, i: u32) -> Option<Segment> {
    let rest = len.checked_sub(i.checked_mul(mtu)?)?;
    let fits = i < n && if i == n - 1 { rest <= mtu } else { rest > mtu };
    fits.then(|| nth(kind, len, mtu, n, i))
}

/// Packet `i` of [`segments`], alone (no iterator: the requester sends one packet at a time);
/// `None` past the last packet or when `mtu` is not one of [`MTUS`].
pub fn segment(kind: Kind, len: u32, mtu: u32, i: u32) -> Option<Segment> {
    let n = packets(len, mtu)?;
    (i < n).then(|| nth(kind, len, mtu, n, i))
}

/// Packet `i` of the `n` of a `kind` message of `len` bytes at path MTU `mtu` (`i < n`).
#[inline(always)]
fn nth(kind: Kind, len: u32, mtu: u32, n: u32, i: u32) -> Segment {
    let (first, last) = (i == 0, i + 1 == n);
    let offset = i * mtu;
    let opcode = match (kind, first, last) {
        (Kind::Send { imm: false }, true, true) => opcode::RC_SEND_ONLY,
        (Kind::Send { imm: true }, true, true) => opcode::RC_SEND_ONLY_IMM,
        (Kind::Send { .. }, true, false) => opcode::RC_SEND_FIRST,
        (Kind::Send { .. }, false, false) => opcode::RC_SEND_MIDDLE,
        (Kind::Send { imm: false }, false, true) => opcode::RC_SEND_LAST,
        (Kind::Send { imm: true }, false, true) => opcode::RC_SEND_LAST_IMM,
        (Kind::Write { imm: false }, true, true) => opcode::RC_WRITE_ONLY,
        (Kind::Write { imm: true }, true, true) => opcode::RC_WRITE_ONLY_IMM,
        (Kind::Write { .. }, true, false) => opcode::RC_WRITE_FIRST,
        (Kind::Write { .. }, false, false) => opcode::RC_WRITE_MIDDLE,
        (Kind::Write { imm: false }, false, true) => opcode::RC_WRITE_LAST,
        (Kind::Write { imm: true }, false, true) => opcode::RC_WRITE_LAST_IMM,
        (Kind::ReadResponse, true, true) => opcode::RC_READ_RESPONSE_ONLY,
        (Kind::ReadResponse, true, false) => opcode::RC_READ_RESPONSE_FIRST,
        (Kind::ReadResponse, false, false) => opcode::RC_READ_RESPONSE_MIDDLE,
        (Kind::ReadResponse, false, true) => opcode::RC_READ_RESPONSE_LAST,
    };
    Segment {
        opcode,
        offset,
        len: if last { len - offset } else { mtu },
        index: i,
        // Responses ask for nothing; requests on the last packet and periodically.
        ack_req: kind != Kind::ReadResponse && (last || (i + 1).is_multiple_of(ACK_EVERY)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The count by shift and mask equals the rounded-up quotient at every MTU, around each
    /// multiple and at the ends of the range.
    #[test]
    fn packets_equals_the_quotient_rounded_up() {
        for &mtu in MTUS.iter() {
            for k in [0u32, 1, 2, 3, 1000, u32::MAX / mtu - 1, u32::MAX / mtu] {
                for len in [k * mtu, (k * mtu).saturating_sub(1), k * mtu + 1] {
                    assert_eq!(
                        packets(len, mtu),
                        Some(len.div_ceil(mtu).max(1)),
                        "{len} {mtu}"
                    );
                }
            }
            assert_eq!(packets(u32::MAX, mtu), Some(u32::MAX.div_ceil(mtu)));
        }
    }
}
