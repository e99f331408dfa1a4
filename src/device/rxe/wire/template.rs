//! The outer headers of a route made once ([`Template`]): a connected queue pair keeps its
//! own from the moment its peer's MAC is known until its next modify, and every frame it
//! sends copies them and patches the four fields that vary (the IPv4 total length and
//! identification, the IPv4 header checksum, the UDP length).

use super::bth::{BTH_LEN, DEFAULT_PKEY};
use super::eth::{ETH_LEN, ETHERTYPE_IPV4, EthHeader, Mac};
use super::ip::{IPV4_LEN, Ipv4Header, PROTO_UDP, ROCE_PORT, UDP_LEN, UdpHeader};
use super::ip6::V6_EXTRA;
use super::{be16, chunk, put};

/// Bytes of the outer headers (Ethernet, IPv4, UDP): the packet module's `ROCE_OFFSET`.
const ROCE_OFFSET: usize = ETH_LEN + IPV4_LEN + UDP_LEN;

/// Where the IPv4 total length is in a frame.
const TOTAL_AT: usize = ETH_LEN + 2;
/// Where the IPv4 identification is.
const ID_AT: usize = ETH_LEN + 4;
/// Where the IPv4 header checksum is.
const CSUM_AT: usize = ETH_LEN + 10;
/// Where the UDP length is.
const UDP_LEN_AT: usize = ETH_LEN + IPV4_LEN + 4;
/// The template's bytes kept as words: the outer headers but the UDP checksum (always 0).
const WORDS: usize = 5;
const _: () = assert!(8 * WORDS + 2 == ROCE_OFFSET);

/// Where a RoCEv2 frame goes and what its outer headers carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// The sender's MAC.
    pub src_mac: Mac,
    /// The next hop's MAC.
    pub dst_mac: Mac,
    /// The sender's IPv4 address (the one inside its GID).
    pub src_ip: [u8; 4],
    /// The receiver's IPv4 address.
    pub dst_ip: [u8; 4],
    /// IPv4 TOS (the address vector's traffic class).
    pub tos: u8,
    /// IPv4 TTL (the address vector's hop limit).
    pub ttl: u8,
    /// The UDP source port ([`super::addr`]).
    pub src_port: u16,
}

/// The Ethernet, IPv4 and UDP headers of a [`Route`]'s frames, with the fields that vary
/// per frame zero, and the IPv4 header's ones'-complement sum without them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Template {
    /// The first 40 bytes of the outer headers, as words (a frame's copy is five stores; at
    /// opt-level "z" an array copy is a `memcpy` call or a byte-wise `rep movsb`).
    words: [u64; WORDS],
    /// The BTH's first eight bytes with the opcode and the SE/pad byte zero (the default
    /// P_Key, the destination QP), little-endian.
    bth: u64,
    /// The IPv4 header sum of the constant fields, folded to 16 bits.
    sum: u16,
    /// How the frames leave: 0 on the wire as built; [`LOOPED`] to this interface's own
    /// address (looped back); [`PATH6`] + `i` on the wire over IPv6, along the device's IPv6
    /// path `i`. One byte tested once per frame, as the looped flag it holds was.
    mode: u8,
}

/// [`Template`]'s mode of a route to this interface's own address.
const LOOPED: u8 = 1;
/// [`Template`]'s mode of the first IPv6 path.
const PATH6: u8 = 2;

impl Template {
    /// The template of the frames along `route` to the queue pair `dest_qp`.
    pub fn new(route: &Route, dest_qp: u32) -> Self {
        let mut b = [0u8; ROCE_OFFSET];
        let (eth, rest) = b.split_at_mut(ETH_LEN);
        let (ip, udp) = rest.split_at_mut(IPV4_LEN);
        if let Some(eth) = eth.first_chunk_mut::<ETH_LEN>() {
            EthHeader {
                dst: route.dst_mac,
                src: route.src_mac,
                ethertype: ETHERTYPE_IPV4,
            }
            .write(eth);
        }
        if let Some(ip) = ip.first_chunk_mut::<IPV4_LEN>() {
            Ipv4Header {
                tos: route.tos,
                total_len: 0,
                id: 0,
                ttl: route.ttl,
                protocol: PROTO_UDP,
                src: route.src_ip,
                dst: route.dst_ip,
            }
            .write(ip);
        }
        if let Some(udp) = udp.first_chunk_mut::<UDP_LEN>() {
            UdpHeader {
                src_port: route.src_port,
                dst_port: ROCE_PORT,
                len: 0,
                checksum: 0,
            }
            .write(udp);
        }
        // The checksum written is the complement of the constant fields' sum (the others are
        // zero): the sum back, and the checksum's place zero for the frames to fill.
        let sum = !be16(&b, CSUM_AT);
        put(&mut b, CSUM_AT, [0, 0]);
        let mut words = [0u64; WORDS];
        for (i, w) in words.iter_mut().enumerate() {
            *w = u64::from_ne_bytes(*chunk::<8>(&b, 8 * i));
        }
        let [_, q2, q1, q0] = dest_qp.to_be_bytes();
        let [p1, p0] = DEFAULT_PKEY.to_be_bytes();
        Template {
            words,
            bth: u64::from_le_bytes([0, 0, p1, p0, 0, q2, q1, q0]),
            sum,
            mode: if route.dst_ip == route.src_ip {
                LOOPED
            } else {
                0
            },
        }
    }

    /// The template with its frames sent over IPv6 along the device's IPv6 path `path` (the
    /// transport's frames stay IPv4 in shape until they leave: the device makes them IPv6).
    pub fn over_path6(mut self, path: usize) -> Self {
        self.mode = PATH6.saturating_add(path.min(usize::from(u8::MAX - PATH6)) as u8);
        self
    }

    /// Whether the frames leave otherwise than on the wire as built: looped back, or over
    /// IPv6 ([`Template::path6`]).
    #[inline(always)]
    pub fn special(&self) -> bool {
        self.mode != 0
    }

    /// Where in the transmit buffer a frame of this route is built: [`V6_EXTRA`] bytes in
    /// for an IPv6 path (its IPv6 header is that much longer), else at the start.
    #[inline(always)]
    pub fn ipv6_room(&self) -> usize {
        if self.mode >= PATH6 { V6_EXTRA } else { 0 }
    }

    /// The IPv6 path the frames go along, if any.
    pub fn path6(&self) -> Option<usize> {
        self.mode.checked_sub(PATH6).map(usize::from)
    }

    /// Whether the frames go to this interface's own address (looped back, never on the
    /// wire).
    #[inline(always)]
    pub fn looped(&self) -> bool {
        self.mode == LOOPED
    }

    /// Writes the outer headers of a frame whose IP packet is `total` bytes, with IPv4
    /// identification `id`, into `f`.
    #[inline(always)]
    pub fn write(&self, f: &mut [u8; ROCE_OFFSET], id: u16, total: u16) {
        // Written out: at opt-level "z" a loop of five stays a loop.
        let w = &self.words;
        put(f, 0, w[0].to_ne_bytes());
        put(f, 8, w[1].to_ne_bytes());
        put(f, 16, w[2].to_ne_bytes());
        put(f, 24, w[3].to_ne_bytes());
        put(f, 32, w[4].to_ne_bytes());
        put(f, 8 * WORDS, [0, 0]);
        put(f, TOTAL_AT, total.to_be_bytes());
        put(f, ID_AT, id.to_be_bytes());
        put(
            f,
            UDP_LEN_AT,
            total.wrapping_sub(IPV4_LEN as u16).to_be_bytes(),
        );
        // Ones'-complement addition of the two varying words to the constant sum: at most 18
        // bits, two folds bring it to 16 (the same sum the whole header's addition gives, and
        // never zero: the version word is in it).
        let s = u32::from(self.sum) + u32::from(total) + u32::from(id);
        let s = (s & 0xFFFF) + (s >> 16);
        let s = (s & 0xFFFF) + (s >> 16);
        put(f, CSUM_AT, (!(s as u16)).to_be_bytes());
    }

    /// Writes a BTH to the template's queue pair with the default P_Key into `b`: `opcode`,
    /// the byte of SE, MigReq, pad count and TVer `flags`, AckReq `ack_req`, `psn` (its low
    /// 24 bits). Two stores: the header as [`Bth::write`](super::bth::Bth::write) writes it.
    #[inline(always)]
    pub fn write_bth(&self, b: &mut [u8; BTH_LEN], opcode: u8, flags: u8, ack_req: bool, psn: u32) {
        let head = self.bth | u64::from(opcode) | u64::from(flags) << 8;
        put(b, 0, head.to_le_bytes());
        put(
            b,
            8,
            (u32::from(ack_req) << 31 | psn & 0xFF_FFFF).to_be_bytes(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The headers the template writes are the ones written whole from the route, checksum
    /// included, over routes, lengths and identifications at every extreme (carries out of
    /// every word of the sum) and pseudo-random ones.
    #[test]
    fn the_template_writes_the_headers_the_route_gives() {
        let mut x: u32 = 0x2545_F491;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for i in 0..3000u32 {
            let r = next().to_le_bytes();
            let extreme = i % 4 == 0;
            let byte = |k: usize| {
                if extreme {
                    0xFF ^ (r[k % 4] & 1)
                } else {
                    r[k % 4]
                }
            };
            let route = Route {
                src_mac: [2, byte(0), byte(1), 3, byte(2), byte(3)],
                dst_mac: [byte(3), 0, byte(2), byte(1), 9, byte(0)],
                src_ip: next().to_be_bytes(),
                dst_ip: if i % 7 == 0 {
                    [0xFF; 4]
                } else {
                    next().to_be_bytes()
                },
                tos: byte(1),
                ttl: byte(2),
                src_port: next() as u16 | 0xC000,
            };
            let total = if extreme {
                0xFFFF
            } else {
                40 + next() as u16 % 9000
            };
            let id = if extreme { 0xFFFF } else { next() as u16 };
            let mut want = [0u8; ROCE_OFFSET];
            let (eth, rest) = want.split_first_chunk_mut::<ETH_LEN>().unwrap();
            let (ip, udp) = rest.split_first_chunk_mut::<IPV4_LEN>().unwrap();
            let udp = udp.first_chunk_mut::<UDP_LEN>().unwrap();
            EthHeader {
                dst: route.dst_mac,
                src: route.src_mac,
                ethertype: ETHERTYPE_IPV4,
            }
            .write(eth);
            Ipv4Header {
                tos: route.tos,
                total_len: total,
                id,
                ttl: route.ttl,
                protocol: PROTO_UDP,
                src: route.src_ip,
                dst: route.dst_ip,
            }
            .write(ip);
            UdpHeader {
                src_port: route.src_port,
                dst_port: ROCE_PORT,
                len: total - IPV4_LEN as u16,
                checksum: 0,
            }
            .write(udp);
            let t = Template::new(&route, next() & 0xFF_FFFF);
            let mut got = [0xA5u8; ROCE_OFFSET];
            t.write(&mut got, id, total);
            assert_eq!(got, want, "{route:?} {total} {id}");
            assert_eq!(t.looped(), route.src_ip == route.dst_ip);
        }
        let mut same = Route {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: [10, 0, 0, 1],
            dst_ip: [10, 0, 0, 1],
            tos: 0,
            ttl: 64,
            src_port: 0xC000,
        };
        assert!(Template::new(&same, 1).looped());
        assert!(Template::new(&same, 1).special());
        same.dst_ip[3] = 2;
        let t = Template::new(&same, 1);
        assert!(!t.looped() && !t.special() && t.path6().is_none());
        let t = t.over_path6(5);
        assert!(!t.looped() && t.special());
        assert_eq!(t.path6(), Some(5));
    }
}
