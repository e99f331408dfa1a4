//! The IPv4 header (no options, never fragmented) and the UDP header, with their checksums
//! (`docs/roce-v2.md` §1.1, §8).

use super::{Discard, be16, put};

/// Bytes of an IPv4 header without options (the only kind RoCE uses: the ICRC assumes it).
pub const IPV4_LEN: usize = 20;
/// Bytes of a UDP header.
pub const UDP_LEN: usize = 8;
/// The RoCEv2 UDP destination port.
pub const ROCE_PORT: u16 = 4791;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

/// The fields of an IPv4 header RoCE cares about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Header {
    /// DSCP and ECN (the address vector's traffic class).
    pub tos: u8,
    /// Total length: header and payload.
    pub total_len: u16,
    /// Identification.
    pub id: u16,
    /// Time to live (the address vector's hop limit).
    pub ttl: u8,
    /// Protocol (17: UDP).
    pub protocol: u8,
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
}

/// The Internet checksum's one's-complement sum of `bytes`, folded into 16 bits, added to
/// `sum` (not yet complemented).
pub fn ones_sum(sum: u32, bytes: &[u8]) -> u32 {
    // Four bytes at a time: 2^16 is 1 modulo 0xFFFF, so the sum of the big-endian 32-bit
    // words folds to the sum of the 16-bit ones (a header is five words, not ten halves).
    let mut s = u64::from(sum);
    let mut words = bytes.chunks_exact(4);
    for w in &mut words {
        s += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    // The last one to three bytes as a word padded with zeroes: the same sum modulo 0xFFFF
    // as their 16-bit halves. Each byte shifted into place (no copy into a padded array:
    // that `memcpy`'s lowering made the function's code differ with and without debug line
    // tables, which tests/size.sh checks).
    let tail = words
        .remainder()
        .iter()
        .zip([24u32, 16, 8])
        .fold(0u32, |t, (&b, at)| t | u32::from(b) << at);
    s += u64::from(tail);
    // Bounded: each fold at least halves the bits above 16.
    while s > 0xFFFF {
        s = (s & 0xFFFF) + (s >> 16);
    }
    s as u32
}

/// [`ones_sum`] of an IPv4 header without options, from zero: its five big-endian words
/// added in a straight line (no loop, no remainder), folded.
#[inline(always)]
fn header_sum(h: &[u8; IPV4_LEN]) -> u32 {
    let w = |at: usize| u64::from(u32::from_be_bytes(*super::chunk::<4>(h, at)));
    let s = w(0) + w(4) + w(8) + w(12) + w(16);
    // At most 35 bits: two folds bring it to 17, the third to 16.
    let s = (s & 0xFFFF) + (s >> 16);
    let s = (s & 0xFFFF) + (s >> 16);
    ((s & 0xFFFF) + (s >> 16)) as u32
}

/// Whether an IPv4 header's checksum is right: the one's-complement sum of the header is all
/// ones. Read in the machine's byte order (no swaps): a one's-complement sum taken with the
/// bytes of every 16-bit word swapped is the true sum swapped (RFC 1071), and all ones swapped
/// is all ones. Not folded: the folded sum of a non-zero total `s` is the number in 1..=0xFFFF
/// congruent to `s` modulo 0xFFFF, so it is all ones exactly when `s` is a non-zero multiple
/// of 0xFFFF. For a header whose version its caller checked (4): its first byte is not zero,
/// so neither is `s`, and the test for zero is left out.
#[inline(always)]
pub(crate) fn header_ok(h: &[u8; IPV4_LEN]) -> bool {
    debug_assert_eq!(h[0] >> 4, 4, "the caller checks the version first");
    let w = |at: usize| u64::from(u32::from_ne_bytes(*super::chunk::<4>(h, at)));
    let s = w(0) + w(4) + w(8) + w(12) + w(16);
    s % 0xFFFF == 0
}

impl Ipv4Header {
    /// The header at the start of `packet` (the frame after Ethernet). Options, fragments
    /// and a wrong header checksum are [`Discard::BadIp`]; a total length the packet does not
    /// hold is [`Discard::Truncated`] (trailing Ethernet padding is allowed).
    pub fn parse(packet: &[u8]) -> Result<Self, Discard> {
        Self::check(packet).map(Self::read)
    }

    /// [`Ipv4Header::parse`]'s checks only: the header's bytes, whose total length (bytes 2
    /// and 3) the packet holds.
    #[inline(always)]
    pub(crate) fn check(packet: &[u8]) -> Result<&[u8; IPV4_LEN], Discard> {
        let h = packet.first_chunk::<IPV4_LEN>().ok_or(Discard::Truncated)?;
        if h[0] >> 4 != 4 {
            return Err(Discard::NotRoce);
        }
        if h[0] & 0xF != 5 || be16(h, 6) & 0x3FFF != 0 || !header_ok(h) {
            return Err(Discard::BadIp);
        }
        let total_len = usize::from(be16(h, 2));
        if total_len < IPV4_LEN || total_len > packet.len() {
            return Err(Discard::Truncated);
        }
        Ok(h)
    }

    /// The fields of a header [`Ipv4Header::check`] passed.
    #[inline(always)]
    pub(crate) fn read(h: &[u8; IPV4_LEN]) -> Self {
        Ipv4Header {
            tos: h[1],
            total_len: be16(h, 2),
            id: be16(h, 4),
            ttl: h[8],
            protocol: h[9],
            src: *super::chunk(h, 12),
            dst: *super::chunk(h, 16),
        }
    }

    /// Writes the header, with DF set and its checksum, into `out`.
    #[inline(always)]
    pub fn write(&self, out: &mut [u8; IPV4_LEN]) {
        out[0] = 0x45;
        out[1] = self.tos;
        put(out, 2, self.total_len.to_be_bytes());
        put(out, 4, self.id.to_be_bytes());
        put(out, 6, 0x4000u16.to_be_bytes());
        out[8] = self.ttl;
        out[9] = self.protocol;
        put(out, 10, [0, 0]);
        put(out, 12, self.src);
        put(out, 16, self.dst);
        let sum = !(header_sum(out) as u16);
        put(out, 10, sum.to_be_bytes());
    }
}

/// A UDP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpHeader {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Length: header and payload.
    pub len: u16,
    /// Checksum (0: none, which RoCE sends).
    pub checksum: u16,
}

impl UdpHeader {
    /// The UDP header at the start of `datagram` (the IPv4 payload, exactly as long as the IP
    /// header says). A length the datagram does not hold is [`Discard::Truncated`]; a non-zero
    /// checksum is verified over the IPv4 pseudo-header ([`Discard::BadUdpChecksum`]).
    pub fn parse(datagram: &[u8], ip: &Ipv4Header) -> Result<Self, Discard> {
        Self::check(datagram, &ip.src, &ip.dst).map(|(h, _)| Self::read(h))
    }

    /// [`UdpHeader::parse`]'s checks only, for a datagram from `src` to `dst`: the header's
    /// bytes and the length it gives (which the datagram holds).
    #[inline(always)]
    pub(crate) fn check<'a>(
        datagram: &'a [u8],
        src: &[u8; 4],
        dst: &[u8; 4],
    ) -> Result<(&'a [u8; UDP_LEN], usize), Discard> {
        let h = datagram
            .first_chunk::<UDP_LEN>()
            .ok_or(Discard::Truncated)?;
        let len = usize::from(be16(h, 4));
        if len < UDP_LEN || len > datagram.len() {
            return Err(Discard::Truncated);
        }
        if be16(h, 6) != 0 {
            let mut sum = ones_sum(0, src);
            sum = ones_sum(sum, dst);
            sum = ones_sum(sum, &[0, PROTO_UDP]);
            sum = ones_sum(sum, &h[4..6]);
            if ones_sum(sum, &datagram[..len]) != 0xFFFF {
                return Err(Discard::BadUdpChecksum);
            }
        }
        Ok((h, len))
    }

    /// The fields of a header [`UdpHeader::check`] passed.
    #[inline(always)]
    pub(crate) fn read(h: &[u8; UDP_LEN]) -> Self {
        UdpHeader {
            src_port: be16(h, 0),
            dst_port: be16(h, 2),
            len: be16(h, 4),
            checksum: be16(h, 6),
        }
    }

    /// Writes the header into `out`.
    pub fn write(&self, out: &mut [u8; UDP_LEN]) {
        put(out, 0, self.src_port.to_be_bytes());
        put(out, 2, self.dst_port.to_be_bytes());
        put(out, 4, self.len.to_be_bytes());
        put(out, 6, self.checksum.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::{IPV4_LEN, header_ok, header_sum, ones_sum};

    /// `n` version-4 headers after an all-zero and an all-ones one (version 4 too: the callers
    /// check it first), every third mostly ones (carries out of every word), the rest
    /// pseudo-random from `seed`.
    fn headers(mut x: u32, n: usize) -> std::vec::Vec<[u8; IPV4_LEN]> {
        let mut headers = std::vec![[0u8; IPV4_LEN], [0xFF; IPV4_LEN]];
        for i in 0..n {
            let mut h = [0u8; IPV4_LEN];
            for b in &mut h {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *b = if i % 3 == 0 {
                    0xFF ^ (x as u8 & 1)
                } else {
                    x as u8
                };
            }
            headers.push(h);
        }
        for h in &mut headers {
            h[0] = 0x40 | (h[0] & 0xF);
        }
        headers
    }

    /// The straight-line header sum equals the definition, on headers of every extreme
    /// (all zeros, all ones, carries out of every word) and on pseudo-random ones.
    #[test]
    fn header_sum_equals_the_definition() {
        for h in &headers(0x9E37_79B9, 2000) {
            assert_eq!(header_sum(h), reference(0, h), "{h:?}");
        }
    }

    /// The check without swaps or folds says what the folded sum says, on version-4 headers
    /// of every extreme and on pseudo-random ones, each also with its checksum made right.
    #[test]
    fn header_check_equals_the_sum() {
        let mut all = std::vec::Vec::new();
        for mut h in headers(0x2545_F491, 4000) {
            all.push(h);
            h[10..12].fill(0);
            let sum = !(header_sum(&h) as u16);
            h[10..12].copy_from_slice(&sum.to_be_bytes());
            all.push(h);
        }
        let mut right = 0;
        for h in &all {
            let ok = reference(0, h) == 0xFFFF;
            assert_eq!(header_ok(h), ok, "{h:?}");
            right += usize::from(ok);
        }
        assert!(right >= 4000, "{right}");
    }

    /// The definition: 16-bit big-endian halves (an odd last byte the high half of one),
    /// added with the end-around carry.
    fn reference(mut sum: u32, bytes: &[u8]) -> u32 {
        for c in bytes.chunks(2) {
            sum += u32::from(c[0]) << 8 | u32::from(c.get(1).copied().unwrap_or(0));
            sum = (sum & 0xFFFF) + (sum >> 16);
        }
        sum
    }

    /// The word-at-a-time sum equals the definition at every length and starting sum,
    /// all-ones bytes (the carries) included.
    #[test]
    fn word_sum_equals_the_definition() {
        let mut x: u32 = 0x9E37_79B9;
        let bytes: std::vec::Vec<u8> = (0..64)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        let ones = [0xFFu8; 64];
        for data in [&bytes[..], &ones[..]] {
            for len in 0..data.len() {
                for start in [0, 1, 0x1234, 0xFFFF] {
                    assert_eq!(
                        ones_sum(start, &data[..len]),
                        reference(start, &data[..len]),
                        "{len} {start:#x}"
                    );
                }
            }
        }
    }
}
