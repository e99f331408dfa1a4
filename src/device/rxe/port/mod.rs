//! The port of the software RoCE device: the interface's MAC and IPv4 address, its GIDs,
//! the neighbour cache, and the first look at every received frame — RoCEv2 to the
//! transport, ARP answered and learnt from, everything else to the embedder's IP stack
//! (`docs/roce-v2.md` §5, §8). What a station on the segment can do with these frames:
//! `docs/security.md`. Its IPv6 side (addresses, paths, neighbour discovery) is in `ipv6.rs`,
//! the neighbour tables both families share in `neighbours.rs`.

use bareverbs_hal::Link;

use super::mcast::Groups;
use super::wire::Discard;
use super::wire::eth::{Arp, ArpOp, Mac, same_mac};
use super::wire::ip6::Ip6;
use super::wire::packet::{Packet, Seen, View, classify};
use crate::error::{Error, Feature, Param, Result, Unsupported};
use crate::verbs::Gid;

mod ipv6;
mod neighbours;

pub use ipv6::{AddrRefused, check_global, gid6};
pub(crate) use ipv6::{Ipv6Rx, Path6, alias_path};
use neighbours::Neighbour;

/// Neighbours remembered (IPv4 → MAC); the least recently learnt one makes room.
pub const NEIGHBOURS: usize = 16;
/// Microseconds between two ARP requests for the same address.
pub const ARP_RETRY_US: u64 = 200_000;
/// ARP requests sent for an address before its resolution fails (Linux gives up after
/// about a second, `docs/roce-v2.md` §5).
pub const ARP_TRIES: u8 = 5;

/// IPv6 neighbours remembered (IPv6 → MAC), apart from the IPv4 ones.
pub const NEIGHBOURS6: usize = 16;
/// Global IPv6 addresses an interface may have besides its link-local one.
pub const GLOBALS6: usize = 3;
/// Entries of the GID table: the link-local GID, the IPv4-mapped one, the global IPv6 ones.
pub const GIDS: u32 = 2 + GLOBALS6 as u32;
/// IPv6 paths of connected queue pairs held at once (distinct source, destination and flow
/// label; queue pairs on the same path share it): one for every queue pair the device holds
/// ([`MAX_QP`](crate::device::rxe::MAX_QP): rdma_cm gives each connection a flow label of
/// its own, from its ports), and 16 more for address handles and stray datagrams. At most
/// 256 (an alias names the slot in one byte).
pub const PATHS6: usize = crate::device::rxe::MAX_QP + 16;
const _: () = assert!(PATHS6 <= 256);

/// Why an address vector's source GID index over 1 is refused where the destination is
/// IPv4: past the table, or a global IPv6 GID (an IPv4 destination is reached from the IPv4
/// address).
pub(crate) fn sgid_refused(index: u8) -> Error {
    if u32::from(index) < GIDS {
        Error::Unsupported(Unsupported::Feature(Feature::Ipv6))
    } else {
        Error::invalid(Param::GidIndex, index, GIDS - 1)
    }
}

/// GID `index` of an interface with `mac` and `ip`, as rxe lays the table out: 0 the
/// link-local GID of the MAC, 1 the IPv4-mapped GID of the address (the one RoCEv2 over
/// IPv4 uses).
pub fn gid(mac: Mac, ip: [u8; 4], index: u32) -> Option<Gid> {
    match index {
        0 => Some(Gid::link_local_from_mac(mac)),
        1 => Some(Gid::from_ipv4(ip)),
        _ => None,
    }
}

/// What became of a received frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Rx<'a> {
    /// A RoCEv2 packet to this interface, checked: for the transport.
    Roce(Packet<'a>),
    /// For the embedder's IP stack (ARP included, after the port answered and learnt from
    /// it, so that the stack learns too).
    Stack,
    /// Dropped, with the reason.
    Dropped(Discard),
}

/// What the reliable-connection transport of the device counted, as Linux's rxe counts it in
/// its `hw_counters` (the names in brackets): the evidence of loss on the segment and of
/// what each side did about it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportCounts {
    /// Requests that came again, PSNs the responder had already taken (`duplicate_request`).
    pub duplicates: u64,
    /// Requests after a gap (the PSN beyond the expected one), dropped
    /// (`out_of_seq_request`).
    pub out_of_sequence: u64,
    /// Sequence NAKs the responder sent: one per gap.
    pub seq_naks_sent: u64,
    /// RNR NAKs the responder sent (a SEND with no receive posted).
    pub rnr_naks_sent: u64,
    /// Sequence NAKs the requester received (`rcvd_seq_err`).
    pub seq_naks_received: u64,
    /// RNR NAKs the requester received (`rcvd_rnr_err`).
    pub rnr_naks_received: u64,
    /// Retransmission timeouts: the requester's timer expired with packets unanswered
    /// (`completer_retry_err`).
    pub timeouts: u64,
    /// READ responses after a gap in a READ's responses, dropped (the retransmission timer
    /// asks for the READ again from the first missing one).
    pub read_gaps: u64,
    /// Times the responder held a READ's responses back for its pace (a burst to another
    /// station is bounded, and so is its rate: the rest goes at a later progress).
    pub reads_paced: u64,
    /// READs and atomics that came while the responder already had as many in flight as it
    /// takes (`max_dest_rd_atomic`): dropped unexecuted, their PSN not taken, and a sequence
    /// NAK of it sent behind the answers before it (the requester sends it again).
    pub rd_atomic_deferred: u64,
}

/// Frames the port handled, by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounts {
    /// RoCEv2 packets handed to the transport.
    pub roce: u64,
    /// Frames left to the IP stack.
    pub stack: u64,
    /// Frames dropped (damaged RoCE, or RoCE to another address).
    pub dropped: u64,
    /// ARP requests for this interface answered.
    pub arp_answered: u64,
    /// ARP requests sent.
    pub arp_sent: u64,
    /// Neighbor Solicitations for this interface's IPv6 addresses answered.
    pub nd_answered: u64,
    /// Neighbor Solicitations sent.
    pub nd_sent: u64,
    /// Neighbour discovery messages that failed RFC 4861's checks, dropped.
    pub nd_invalid: u64,
    /// RoCEv2 packets over IPv6 to this interface, checked: those on a connected queue
    /// pair's IPv6 path go on to the transport (and count in `roce` too), the others are
    /// dropped (UD over IPv6 is not taken).
    pub roce6: u64,
    /// Frames to this interface's own address that found its loopback queue
    /// ([`LOOPBACK_FRAMES`](super::LOOPBACK_FRAMES)) full: not built then, their sender tries
    /// again at a later turn, as when the NIC has no transmit room (nothing is lost).
    pub loopback_full: u64,
}

/// The interface: addresses, neighbours, counters.
#[derive(Debug)]
pub struct Port {
    mac: Mac,
    ip: [u8; 4],
    neighbours: [Option<Neighbour<[u8; 4]>>; NEIGHBOURS],
    /// The link-local address (from the MAC) and the global ones.
    link_local: Ip6,
    globals: [Option<Ip6>; GLOBALS6],
    neighbours6: [Option<Neighbour<Ip6>>; NEIGHBOURS6],
    paths6: [Option<Path6>; PATHS6],
    /// Each path slot's generation (its aliases', [`Port::alias6`]).
    gens6: [u8; PATHS6],
    /// The multicast groups the device's UD queue pairs are attached to.
    pub(crate) groups: Groups,
    counts: PortCounts,
}

impl Port {
    /// The port of an interface with `mac` and the static IPv4 address `ip`.
    pub fn new(mac: Mac, ip: [u8; 4]) -> Self {
        Port {
            mac,
            ip,
            neighbours: [None; NEIGHBOURS],
            link_local: Gid::link_local_from_mac(mac).0,
            globals: [None; GLOBALS6],
            neighbours6: [None; NEIGHBOURS6],
            paths6: [None; PATHS6],
            gens6: [0; PATHS6],
            groups: Groups::new(),
            counts: PortCounts::default(),
        }
    }

    /// The interface's MAC address.
    pub fn mac(&self) -> Mac {
        self.mac
    }

    /// The interface's IPv4 address.
    pub fn ip(&self) -> [u8; 4] {
        self.ip
    }

    /// The GID table as rxe lays it out: 0 the link-local GID of the MAC, 1 the IPv4-mapped
    /// GID of the address (the one RoCEv2 over IPv4 uses), then the global IPv6 addresses.
    pub fn gid(&self, index: u32) -> Option<Gid> {
        gid6(self.mac, self.ip, &self.globals, index)
    }

    /// Frames handled so far.
    pub fn counts(&self) -> PortCounts {
        self.counts
    }

    /// Takes a frame received from the wire: a RoCEv2 packet to this interface's MAC and
    /// address, from a source a station can have, goes to the transport (RoCEv2 to another
    /// address, or from this interface's own address, is dropped: Linux drops martian
    /// sources); an ARP request for this interface is answered on `link`; ARP from anyone
    /// teaches the sender's MAC of an address being resolved or known. Neighbours are learnt
    /// from ARP only, as Linux learns them: a RoCE frame binds nothing (its sender's MAC is
    /// whatever the sender wrote). Frames to another station's MAC are dropped (a promiscuous
    /// NIC passes them up); broadcast and multicast ones go on (ARP, the IP stack's).
    pub fn receive<'a, L: Link>(&mut self, link: &mut L, frame: &'a [u8], now: u64) -> Rx<'a> {
        match self.take(link, frame, now, false) {
            Ok(Some(v)) => Rx::Roce(v.packet()),
            Ok(None) => match self.take_ipv6(link, frame, now) {
                None | Some(Ipv6Rx::Stack) => Rx::Stack,
                // On a connected QP's IPv6 path: the device carries it to the transport.
                Some(Ipv6Rx::Path(_)) => Rx::Dropped(Discard::NotRoce),
                // A stray datagram's path, held only while the device carries it.
                Some(Ipv6Rx::Transient(i)) => {
                    self.release_path6(self.alias6(i));
                    Rx::Dropped(Discard::NotRoce)
                }
                Some(Ipv6Rx::Dropped(d)) => Rx::Dropped(d),
            },
            Err(d) => Rx::Dropped(d),
        }
    }

    /// [`Port::receive`], the packet read in place: `Ok(Some)` for the transport, `Ok(None)`
    /// for the IP stack, `Err` dropped (and counted). With `looped`, a frame the device sent
    /// to its own address (its source is this interface, which a frame from the wire may not
    /// claim). Inlined into the device's progress (one call site).
    #[inline(always)]
    pub(crate) fn take<'a, L: Link>(
        &mut self,
        link: &mut L,
        frame: &'a [u8],
        now: u64,
        looped: bool,
    ) -> Result<Option<View<'a>>, Discard> {
        let to_us = frame
            .first_chunk::<6>()
            .is_some_and(|d| same_mac(d, &self.mac));
        let group = frame.first().is_some_and(|d| d & 1 == 1);
        match classify(frame) {
            // To a group MAC: a multicast datagram, taken only for a group a queue pair of
            // the device is in (`take_group`).
            Ok(Seen::Roce(p)) if group => match self.take_group(frame, &p, looped) {
                true => {
                    self.counts.roce += 1;
                    Ok(Some(p))
                }
                false => self.drop(Discard::NotForUs),
            },
            Ok(Seen::Roce(_)) if !to_us => self.drop(Discard::NotForUs),
            Ok(Seen::Roce(p)) if p.src_ip() == self.ip && !looped => self.drop(Discard::Martian),
            Ok(Seen::Roce(p)) if martian(p.src_ip()) => self.drop(Discard::Martian),
            Ok(Seen::Roce(p)) if p.dst_ip() == self.ip => {
                self.counts.roce += 1;
                Ok(Some(p))
            }
            Ok(Seen::Roce(_)) => self.drop(Discard::NotRoce),
            Ok(_) if !to_us && !group => self.drop(Discard::NotForUs),
            Ok(Seen::Arp(a)) => {
                if a.sender_ip == self.ip || martian(a.sender_ip) {
                    // Someone claims this interface's address, or none a station can have:
                    // nothing is learnt (the IP stack sees it).
                } else if a.target_ip == self.ip {
                    // Asked of us (or told to us): remember the asker, as Linux does.
                    self.learn(a.sender_ip, a.sender_mac, now);
                } else {
                    self.refresh(a.sender_ip, a.sender_mac, now);
                }
                if let Some(reply) = a.answer(self.mac, self.ip)
                    && link.transmit(&reply.frame(self.mac)).is_ok()
                {
                    self.counts.arp_answered += 1;
                }
                self.counts.stack += 1;
                Ok(None)
            }
            Ok(Seen::Other) => {
                self.counts.stack += 1;
                Ok(None)
            }
            Err(d) => self.drop(d),
        }
    }

    /// Whether a RoCE packet to a group MAC is for the device's queue pairs: to a class D
    /// address one of them is attached to, at that group's MAC, to the multicast QPN
    /// (0xFFFFFF), from a source a station can have (this interface's own only looped back).
    /// The Q_Key each member checks itself. (`docs/multicast.md`)
    fn take_group(&self, frame: &[u8], p: &View<'_>, looped: bool) -> bool {
        let dst = p.dst_ip();
        super::wire::igmp::is_multicast(dst)
            && frame
                .first_chunk::<6>()
                .is_some_and(|d| same_mac(d, &super::wire::igmp::multicast_mac(dst)))
            && p.dest_qp() == super::MCAST_QPN
            && !martian(p.src_ip())
            && (p.src_ip() != self.ip || looped)
            && !self.groups.members(dst).is_empty()
    }

    /// Whether the NIC should hand `frame` on: to this interface's MAC, or to a group
    /// (broadcast, multicast). Else it is counted as dropped (not for us) before any copy,
    /// parse or ICRC: a promiscuous NIC on a shared segment shows every station's frames, its
    /// own echoed ones too (docs/porting.md).
    pub(crate) fn wants(&mut self, frame: &[u8]) -> bool {
        let ok = frame
            .first_chunk::<6>()
            .is_some_and(|d| same_mac(d, &self.mac) || d[0] & 1 == 1);
        if !ok {
            self.counts.dropped += 1;
        }
        ok
    }

    /// Takes back the count of a RoCE packet the transport could not take now (it is looked
    /// at again, and counted then).
    pub(crate) fn unhand(&mut self) {
        self.counts.roce -= 1;
    }

    fn drop<T>(&mut self, d: Discard) -> Result<T, Discard> {
        self.counts.dropped += 1;
        Err(d)
    }

    /// The MAC of `ip` (on this segment): `Ok(Some)` when known; `Ok(None)` while an ARP
    /// request is out (one is sent now if none went out in the last [`ARP_RETRY_US`]);
    /// [`Error::Timeout`] once [`ARP_TRIES`] requests went unanswered (the next call starts
    /// over).
    pub fn resolve<L: Link>(&mut self, link: &mut L, ip: [u8; 4], now: u64) -> Result<Option<Mac>> {
        if ip == self.ip {
            // This interface: the device loops the frames back itself.
            return Ok(Some(self.mac));
        }
        let (mac, my_ip) = (self.mac, self.ip);
        let sent = &mut self.counts.arp_sent;
        neighbours::step(&mut self.neighbours, ip, now, sent, |ip| {
            let req = Arp {
                op: ArpOp::Request,
                sender_mac: mac,
                sender_ip: my_ip,
                target_mac: [0; 6],
                target_ip: ip,
            };
            link.transmit(&req.frame(mac)).is_ok()
        })
    }

    /// The MAC of `ip` when it is known (no ARP request is sent).
    pub fn lookup(&self, ip: [u8; 4]) -> Option<Mac> {
        if ip == self.ip {
            return Some(self.mac);
        }
        neighbours::lookup(&self.neighbours, ip)
    }

    /// Records `ip` at `mac`, making room if needed.
    fn learn(&mut self, ip: [u8; 4], mac: Mac, now: u64) {
        neighbours::learn(&mut self.neighbours, ip, mac, now);
    }

    /// Records `ip` at `mac` if `ip` is known or being resolved (nobody else's traffic fills
    /// the cache).
    fn refresh(&mut self, ip: [u8; 4], mac: Mac, now: u64) {
        neighbours::refresh(&mut self.neighbours, ip, mac, now);
    }
}

/// Whether `ip` is an address no station on the segment sends from: unspecified (0/8),
/// loopback (127/8), multicast (224/4) or broadcast (and the reserved 240/4).
fn martian(ip: [u8; 4]) -> bool {
    // 224 to 255 and 0 in one comparison (they wrap to 0 to 32), then 127.
    ip[0].wrapping_add(32) <= 32 || ip[0] == 127
}
