//! The base transport header, the opcodes and their extended headers
//! (`docs/roce-v2.md` §2, §3).

use super::{Discard, be16, be24, be32, be64, put, put24};

/// Bytes of the base transport header.
pub const BTH_LEN: usize = 12;
/// Bytes of an AETH.
pub const AETH_LEN: usize = 4;
/// The default partition key (full membership).
pub const DEFAULT_PKEY: u16 = 0xFFFF;
/// PSNs are 24 bits.
pub const PSN_MASK: u32 = 0xFF_FFFF;

/// The opcodes this transport speaks: RC (0x00–0x14, 0x16, 0x17) and UD (0x64, 0x65).
pub mod opcode {
    /// RC SEND_FIRST.
    pub const RC_SEND_FIRST: u8 = 0x00;
    /// RC SEND_MIDDLE.
    pub const RC_SEND_MIDDLE: u8 = 0x01;
    /// RC SEND_LAST.
    pub const RC_SEND_LAST: u8 = 0x02;
    /// RC SEND_LAST_WITH_IMMEDIATE.
    pub const RC_SEND_LAST_IMM: u8 = 0x03;
    /// RC SEND_ONLY.
    pub const RC_SEND_ONLY: u8 = 0x04;
    /// RC SEND_ONLY_WITH_IMMEDIATE.
    pub const RC_SEND_ONLY_IMM: u8 = 0x05;
    /// RC RDMA_WRITE_FIRST.
    pub const RC_WRITE_FIRST: u8 = 0x06;
    /// RC RDMA_WRITE_MIDDLE.
    pub const RC_WRITE_MIDDLE: u8 = 0x07;
    /// RC RDMA_WRITE_LAST.
    pub const RC_WRITE_LAST: u8 = 0x08;
    /// RC RDMA_WRITE_LAST_WITH_IMMEDIATE.
    pub const RC_WRITE_LAST_IMM: u8 = 0x09;
    /// RC RDMA_WRITE_ONLY.
    pub const RC_WRITE_ONLY: u8 = 0x0A;
    /// RC RDMA_WRITE_ONLY_WITH_IMMEDIATE.
    pub const RC_WRITE_ONLY_IMM: u8 = 0x0B;
    /// RC RDMA_READ_REQUEST.
    pub const RC_READ_REQUEST: u8 = 0x0C;
    /// RC RDMA_READ_RESPONSE_FIRST.
    pub const RC_READ_RESPONSE_FIRST: u8 = 0x0D;
    /// RC RDMA_READ_RESPONSE_MIDDLE.
    pub const RC_READ_RESPONSE_MIDDLE: u8 = 0x0E;
    /// RC RDMA_READ_RESPONSE_LAST.
    pub const RC_READ_RESPONSE_LAST: u8 = 0x0F;
    /// RC RDMA_READ_RESPONSE_ONLY.
    pub const RC_READ_RESPONSE_ONLY: u8 = 0x10;
    /// RC ACKNOWLEDGE.
    pub const RC_ACK: u8 = 0x11;
    /// RC ATOMIC_ACKNOWLEDGE.
    pub const RC_ATOMIC_ACK: u8 = 0x12;
    /// RC COMPARE_SWAP.
    pub const RC_COMPARE_SWAP: u8 = 0x13;
    /// RC FETCH_ADD.
    pub const RC_FETCH_ADD: u8 = 0x14;
    /// RC SEND_LAST_WITH_INVALIDATE (an IETH follows the BTH).
    pub const RC_SEND_LAST_INV: u8 = 0x16;
    /// RC SEND_ONLY_WITH_INVALIDATE (an IETH follows the BTH).
    pub const RC_SEND_ONLY_INV: u8 = 0x17;
    /// UD SEND_ONLY.
    pub const UD_SEND_ONLY: u8 = 0x64;
    /// UD SEND_ONLY_WITH_IMMEDIATE.
    pub const UD_SEND_ONLY_IMM: u8 = 0x65;
}

/// Which extended headers follow the BTH, and whether a payload does (bits of [`Layout`]).
mod has {
    pub const DETH: u8 = 1 << 0;
    pub const RETH: u8 = 1 << 1;
    pub const ATOMIC_ETH: u8 = 1 << 2;
    pub const AETH: u8 = 1 << 3;
    pub const ATOMIC_ACK_ETH: u8 = 1 << 4;
    pub const IMM: u8 = 1 << 5;
    pub const PAYLOAD: u8 = 1 << 6;
}

/// [`Layout::of`] of every opcode.
static LAYOUTS: [Option<Layout>; 256] = {
    let mut t = [None; 256];
    let mut op = 0;
    while op < 256 {
        t[op] = Layout::of(op as u8);
        op += 1;
    }
    t
};

/// [`Layout::header_len`] of every layout (each fits a byte: at most 12 + 8 + 16 + 28 + 4 + 8
/// + 4 + 4).
static HEADER_LENS: [u8; 256] = {
    let mut t = [0; 256];
    let mut bits = 0;
    while bits < 256 {
        t[bits] = Layout(bits as u8).header_len() as u8;
        bits += 1;
    }
    t
};

/// The extended headers of an opcode, in wire order (DETH, RETH, AtomicETH, AETH,
/// AtomicAckETH, ImmDt), and whether it carries a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout(u8);

impl Layout {
    /// The layout of `op`, or `None` for an opcode this transport does not speak.
    pub const fn of(op: u8) -> Option<Layout> {
        use has::*;
        let bits = match op {
            0x00..=0x02 | 0x04 => PAYLOAD,
            0x03 | 0x05 => PAYLOAD | IMM,
            0x06 | 0x0A => PAYLOAD | RETH,
            0x07 | 0x08 => PAYLOAD,
            0x09 => PAYLOAD | IMM,
            0x0B => PAYLOAD | RETH | IMM,
            0x0C => RETH,
            0x0D | 0x0F | 0x10 => PAYLOAD | AETH,
            0x0E => PAYLOAD,
            0x11 => AETH,
            0x12 => AETH | ATOMIC_ACK_ETH,
            0x13 | 0x14 => ATOMIC_ETH,
            // The IETH (the rkey to invalidate) is 4 bytes right after the BTH: where ImmDt
            // is in a SEND with immediate. It is carried in `Headers::imm`.
            0x16 | 0x17 => PAYLOAD | IMM,
            0x64 => PAYLOAD | DETH,
            0x65 => PAYLOAD | DETH | IMM,
            _ => return None,
        };
        Some(Layout(bits))
    }

    const fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }

    /// Whether a payload follows the headers.
    pub const fn payload(self) -> bool {
        self.has(has::PAYLOAD)
    }

    /// [`Layout::of`], from a table made at compile time (one load; the match is a chain of
    /// compares and jumps at opt-level "z").
    #[inline(always)]
    pub fn lookup(op: u8) -> Option<Layout> {
        LAYOUTS[usize::from(op)]
    }

    /// [`Layout::header_len`], from a table made at compile time.
    #[inline(always)]
    pub fn header_bytes(self) -> usize {
        usize::from(HEADER_LENS[usize::from(self.0)])
    }

    /// The DETH in `ext` (the extended headers after the BTH, as long as this layout says),
    /// if the layout has one: it comes first.
    #[inline(always)]
    pub(crate) fn deth(self, ext: &[u8]) -> Option<Deth> {
        let h = ext.first_chunk::<8>().filter(|_| self.has(has::DETH))?;
        Some(Deth {
            qkey: be32(h, 0),
            src_qp: be24(h, 5),
        })
    }

    /// The RETH in `ext`, if the layout has one: first (no DETH comes with it).
    #[inline(always)]
    pub(crate) fn reth(self, ext: &[u8]) -> Option<Reth> {
        let h = ext.first_chunk::<16>().filter(|_| self.has(has::RETH))?;
        Some(Reth {
            va: be64(h, 0),
            rkey: be32(h, 8),
            len: be32(h, 12),
        })
    }

    /// The AtomicETH in `ext`, if the layout has one: alone.
    #[inline(always)]
    pub(crate) fn atomic(self, ext: &[u8]) -> Option<AtomicEth> {
        let h = ext
            .first_chunk::<28>()
            .filter(|_| self.has(has::ATOMIC_ETH))?;
        Some(AtomicEth {
            va: be64(h, 0),
            rkey: be32(h, 8),
            swap_add: be64(h, 12),
            compare: be64(h, 20),
        })
    }

    /// The AETH in `ext`, if the layout has one: first (acknowledges and READ responses have
    /// no DETH, RETH or AtomicETH).
    #[inline(always)]
    pub(crate) fn aeth(self, ext: &[u8]) -> Option<Aeth> {
        let h = ext.first_chunk::<4>().filter(|_| self.has(has::AETH))?;
        Some(Aeth {
            syndrome: h[0],
            msn: be24(h, 1),
        })
    }

    /// The AtomicAckETH in `ext`, if the layout has one: last (after the AETH, no ImmDt).
    #[inline(always)]
    pub(crate) fn atomic_ack(self, ext: &[u8]) -> Option<u64> {
        // The layout's bit first: `last_chunk` stays an out-of-line call at opt-level "z".
        if !self.has(has::ATOMIC_ACK_ETH) {
            return None;
        }
        let h = ext.last_chunk::<8>()?;
        Some(u64::from_be_bytes(*h))
    }

    /// The ImmDt (or IETH) in `ext`, if the layout has one: always last.
    #[inline(always)]
    pub(crate) fn imm(self, ext: &[u8]) -> Option<u32> {
        // As `atomic_ack`: most packets carry none, and they skip the call.
        if !self.has(has::IMM) {
            return None;
        }
        let h = ext.last_chunk::<4>()?;
        Some(u32::from_be_bytes(*h))
    }

    /// Bytes of the BTH and the extended headers.
    pub const fn header_len(self) -> usize {
        let mut n = BTH_LEN;
        if self.has(has::DETH) {
            n += 8;
        }
        if self.has(has::RETH) {
            n += 16;
        }
        if self.has(has::ATOMIC_ETH) {
            n += 28;
        }
        if self.has(has::AETH) {
            n += 4;
        }
        if self.has(has::ATOMIC_ACK_ETH) {
            n += 8;
        }
        if self.has(has::IMM) {
            n += 4;
        }
        n
    }
}

/// The base transport header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bth {
    /// The opcode (transport in bits 7:5, operation in 4:0).
    pub opcode: u8,
    /// Solicited event.
    pub se: bool,
    /// Pad bytes after the payload (0–3).
    pub pad: u8,
    /// Partition key.
    pub pkey: u16,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl Bth {
    /// The BTH at the start of `b`. A transport version other than 0 is [`Discard::BadBth`].
    pub fn parse(b: &[u8]) -> Result<Self, Discard> {
        let h = b.get(..BTH_LEN).ok_or(Discard::Truncated)?;
        if h[1] & 0xF != 0 {
            return Err(Discard::BadBth);
        }
        Ok(Bth {
            opcode: h[0],
            se: h[1] & 0x80 != 0,
            pad: (h[1] >> 4) & 3,
            pkey: be16(h, 2),
            dest_qp: be24(h, 5),
            ack_req: h[8] & 0x80 != 0,
            psn: be24(h, 9),
        })
    }

    /// Writes the BTH into `out` (MigReq, FECN, BECN, TVer and the reserved bits 0).
    #[inline(always)]
    pub fn write(&self, out: &mut [u8]) {
        out[0] = self.opcode;
        out[1] = u8::from(self.se) << 7 | (self.pad & 3) << 4;
        put(out, 2, self.pkey.to_be_bytes());
        out[4] = 0;
        put24(out, 5, self.dest_qp);
        out[8] = u8::from(self.ack_req) << 7;
        put24(out, 9, self.psn);
    }
}

/// The datagram extended transport header (UD).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deth {
    /// Queue key.
    pub qkey: u32,
    /// Source QP (24 bits).
    pub src_qp: u32,
}

/// The RDMA extended transport header (writes and read requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole message (what remains of it, on a retried read).
    pub len: u32,
}

/// The atomic extended transport header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicEth {
    /// Remote virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// The value to swap in (compare-and-swap) or to add (fetch-and-add).
    pub swap_add: u64,
    /// The value to compare with (compare-and-swap only).
    pub compare: u64,
}

/// The ACK extended transport header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aeth {
    /// Syndrome: ACK (0x00–0x1F, credits), RNR NAK (0x20 | timer), NAK (0x60 | code).
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

/// A BTH with its extended headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headers {
    /// The base transport header.
    pub bth: Bth,
    /// DETH (UD).
    pub deth: Option<Deth>,
    /// RETH (WRITE FIRST/ONLY, READ request).
    pub reth: Option<Reth>,
    /// AtomicETH (compare-and-swap, fetch-and-add).
    pub atomic: Option<AtomicEth>,
    /// AETH (acknowledges, read responses FIRST/LAST/ONLY).
    pub aeth: Option<Aeth>,
    /// AtomicAckETH: the original remote value.
    pub atomic_ack: Option<u64>,
    /// Immediate data (opaque, as sent); for SEND_LAST/ONLY_WITH_INVALIDATE, the IETH's
    /// rkey (the same 4 bytes in the same place).
    pub imm: Option<u32>,
}

impl Headers {
    /// Headers of `bth`'s opcode with every extended header absent (set them after).
    pub const fn new(bth: Bth) -> Self {
        Headers {
            bth,
            deth: None,
            reth: None,
            atomic: None,
            aeth: None,
            atomic_ack: None,
            imm: None,
        }
    }

    /// The BTH and the extended headers its opcode has, at the start of `b`; returns them
    /// and their length. An opcode this transport does not speak is
    /// [`Discard::UnknownOpcode`].
    pub fn parse(b: &[u8]) -> Result<(Self, Layout), Discard> {
        let bth = Bth::parse(b)?;
        let layout = Layout::lookup(bth.opcode).ok_or(Discard::UnknownOpcode)?;
        let h = b.get(..layout.header_bytes()).ok_or(Discard::Truncated)?;
        let mut at = BTH_LEN;
        let mut out = Headers::new(bth);
        if layout.has(has::DETH) {
            out.deth = Some(Deth {
                qkey: be32(h, at),
                src_qp: be24(h, at + 5),
            });
            at += 8;
        }
        if layout.has(has::RETH) {
            out.reth = Some(Reth {
                va: be64(h, at),
                rkey: be32(h, at + 8),
                len: be32(h, at + 12),
            });
            at += 16;
        }
        if layout.has(has::ATOMIC_ETH) {
            out.atomic = Some(AtomicEth {
                va: be64(h, at),
                rkey: be32(h, at + 8),
                swap_add: be64(h, at + 12),
                compare: be64(h, at + 20),
            });
            at += 28;
        }
        if layout.has(has::AETH) {
            out.aeth = Some(Aeth {
                syndrome: h[at],
                msn: be24(h, at + 1),
            });
            at += 4;
        }
        if layout.has(has::ATOMIC_ACK_ETH) {
            out.atomic_ack = Some(be64(h, at));
            at += 8;
        }
        if layout.has(has::IMM) {
            out.imm = Some(be32(h, at));
        }
        Ok((out, layout))
    }

    /// Writes the BTH and the extended headers of its opcode into `out` and returns their
    /// length; `None` when the opcode is unknown, an extended header it needs is absent, or
    /// `out` is too short.
    pub fn write(&self, out: &mut [u8]) -> Option<usize> {
        let layout = Layout::lookup(self.bth.opcode)?;
        let out = out.get_mut(..layout.header_bytes())?;
        self.bth.write(out);
        let mut at = BTH_LEN;
        if layout.has(has::DETH) {
            let d = self.deth?;
            put(out, at, d.qkey.to_be_bytes());
            out[at + 4] = 0;
            put24(out, at + 5, d.src_qp);
            at += 8;
        }
        if layout.has(has::RETH) {
            let r = self.reth?;
            put(out, at, r.va.to_be_bytes());
            put(out, at + 8, r.rkey.to_be_bytes());
            put(out, at + 12, r.len.to_be_bytes());
            at += 16;
        }
        if layout.has(has::ATOMIC_ETH) {
            let a = self.atomic?;
            put(out, at, a.va.to_be_bytes());
            put(out, at + 8, a.rkey.to_be_bytes());
            put(out, at + 12, a.swap_add.to_be_bytes());
            put(out, at + 20, a.compare.to_be_bytes());
            at += 28;
        }
        if layout.has(has::AETH) {
            let a = self.aeth?;
            out[at] = a.syndrome;
            put24(out, at + 1, a.msn);
            at += 4;
        }
        if layout.has(has::ATOMIC_ACK_ETH) {
            put(out, at, self.atomic_ack?.to_be_bytes());
            at += 8;
        }
        if layout.has(has::IMM) {
            put(out, at, self.imm?.to_be_bytes());
            at += 4;
        }
        Some(at)
    }
}
