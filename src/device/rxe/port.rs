//! The port of the software RoCE device: the interface's MAC and IPv4 address, its GIDs,
//! the neighbour cache, and the first look at every received frame — RoCEv2 to the
//! transport, ARP answered and learnt from, everything else to the embedder's IP stack
//! (`docs/roce-v2.md` §5, §8). What a station on the segment can do with these frames:
//! `docs/security.md`.

use bareverbs_hal::Link;

use super::wire::Discard;
use super::wire::eth::{Arp, ArpOp, ETH_LEN, Mac, same_mac};
use super::wire::ip6::{ETHERTYPE_IPV6, Ip6, martian6};
use super::wire::nd::{self, Nd};
use super::wire::packet::{Packet, Seen, View, classify};
use crate::error::{Error, Feature, Op, Param, Result, Unsupported};
use crate::verbs::Gid;

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
/// label; queue pairs on the same path share it).
pub const PATHS6: usize = 16;

/// Why an address vector's source GID index over 1 is refused where the destination is
/// IPv4 (or the vector is an address handle's): past the table, or a global IPv6 GID (an
/// IPv4 destination is reached from the IPv4 address; UD runs over IPv4 only).
pub(crate) fn sgid_refused(index: u8) -> Error {
    if u32::from(index) < GIDS {
        Error::Unsupported(Unsupported::Feature(Feature::Ipv6))
    } else {
        Error::invalid(Param::GidIndex, index, GIDS - 1)
    }
}

/// The IPv4 address by which the transport names IPv6 path `i`: 0.134.221.`i`. No station
/// sends from 0/8 (the port drops such sources from the wire as martian), so no IPv4 frame
/// can pass for one of these paths.
pub(crate) fn path_alias(i: usize) -> [u8; 4] {
    [0, 0x86, 0xDD, i as u8]
}

/// The IPv6 path an address of [`path_alias`] names.
pub(crate) fn alias_path(ip: [u8; 4]) -> Option<usize> {
    let i = usize::from(ip[3]);
    (ip[..3] == [0, 0x86, 0xDD] && i < PATHS6).then_some(i)
}

/// An IPv6 path of connected queue pairs: this interface's address, the peer's, the flow
/// label, and how many queue pairs use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Path6 {
    pub(crate) src: Ip6,
    pub(crate) dst: Ip6,
    pub(crate) flow: u32,
    users: u32,
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

/// [`gid`] with the interface's global IPv6 addresses after the IPv4-mapped GID, in the
/// order they were configured (indexes 2 to 1 + [`GLOBALS6`]).
pub fn gid6(mac: Mac, ip: [u8; 4], globals: &[Option<Ip6>; GLOBALS6], index: u32) -> Option<Gid> {
    match index {
        0 | 1 => gid(mac, ip, index),
        _ => globals
            .get(usize::try_from(index).ok()? - 2)
            .copied()
            .flatten()
            .map(Gid),
    }
}

/// Why an IPv6 address cannot be given to an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddrRefused {
    /// Not an address a station can have: unspecified, loopback, multicast, IPv4-mapped.
    Martian,
    /// A link-local address (fe80::/10): the interface has its own, from its MAC.
    LinkLocal,
    /// The interface has it already.
    Duplicate,
    /// Every one of the [`GLOBALS6`] places is taken.
    Full,
}

/// Checks `a` as a global IPv6 address to add to `globals`: the index it would take there.
pub fn check_global(globals: &[Option<Ip6>; GLOBALS6], a: &Ip6) -> Result<usize, AddrRefused> {
    if martian6(a) {
        return Err(AddrRefused::Martian);
    }
    if a[0] == 0xFE && a[1] & 0xC0 == 0x80 {
        return Err(AddrRefused::LinkLocal);
    }
    if globals.contains(&Some(*a)) {
        return Err(AddrRefused::Duplicate);
    }
    globals
        .iter()
        .position(Option::is_none)
        .ok_or(AddrRefused::Full)
}

/// What became of an IPv6 frame the port looked at ([`Port::take_ipv6`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ipv6Rx {
    /// For the IP stack (neighbour discovery too, after the port answered and learnt).
    Stack,
    /// RoCEv2 over IPv6 on the device's IPv6 path `i`: for the transport.
    Path(usize),
    /// Dropped, with the reason.
    Dropped(Discard),
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

#[derive(Clone, Copy, Debug)]
struct Neighbour<A> {
    ip: A,
    /// `None` while a resolution is under way.
    mac: Option<Mac>,
    /// When it was learnt, or when the last request went out.
    at: u64,
    /// Requests sent without an answer.
    tries: u8,
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
            counts: PortCounts::default(),
        }
    }

    /// Gives the interface the global IPv6 address `a`: its GID index (2 and up, in the
    /// order of addition). The NIC must take frames to the address's solicited-node group
    /// ([`nd::multicast_mac`] of [`nd::solicited_node`]) for peers to resolve it.
    pub fn add_ipv6(&mut self, a: Ip6) -> Result<u32, AddrRefused> {
        let i = check_global(&self.globals, &a)?;
        self.globals[i] = Some(a);
        Ok(2 + i as u32)
    }

    /// The interface's IPv6 addresses: the link-local one first, then the global ones.
    pub fn ipv6(&self) -> impl Iterator<Item = Ip6> + '_ {
        core::iter::once(self.link_local).chain(self.globals.iter().flatten().copied())
    }

    /// Whether `a` is one of the interface's IPv6 addresses.
    pub fn has_ipv6(&self, a: &Ip6) -> bool {
        *a == self.link_local || self.globals.contains(&Some(*a))
    }

    /// Takes a use of the IPv6 path from `src` (one of this interface's addresses) to `dst`
    /// with flow label `flow`: the address by which the transport names it
    /// ([`path_alias`]); `None` when [`PATHS6`] other paths are in use.
    pub(crate) fn hold_path6(&mut self, src: Ip6, dst: Ip6, flow: u32) -> Option<[u8; 4]> {
        let flow = flow & 0xF_FFFF;
        let same =
            |e: &Option<Path6>| e.is_some_and(|e| (e.src, e.dst, e.flow) == (src, dst, flow));
        let i = match self.paths6.iter().position(same) {
            Some(i) => i,
            None => {
                let i = self.paths6.iter().position(Option::is_none)?;
                self.paths6[i] = Some(Path6 {
                    src,
                    dst,
                    flow,
                    users: 0,
                });
                i
            }
        };
        if let Some(e) = self.paths6[i].as_mut() {
            e.users += 1;
        }
        Some(path_alias(i))
    }

    /// Gives back a use of the path `alias` names (nothing for any other address); the last
    /// use frees it.
    pub(crate) fn release_path6(&mut self, alias: [u8; 4]) {
        let Some(i) = alias_path(alias) else { return };
        if let Some(e) = self.paths6[i].as_mut() {
            e.users = e.users.saturating_sub(1);
            if e.users == 0 {
                self.paths6[i] = None;
            }
        }
    }

    /// The IPv6 path `alias` names, when it is held.
    pub(crate) fn path6(&self, alias: [u8; 4]) -> Option<Path6> {
        self.paths6[alias_path(alias)?]
    }

    /// [`Port::resolve`] of an address that is IPv4 or names an IPv6 path: the path's peer
    /// resolved by neighbour discovery.
    pub(crate) fn resolve_any<L: Link>(
        &mut self,
        link: &mut L,
        ip: [u8; 4],
        now: u64,
    ) -> Result<Option<Mac>> {
        match alias_path(ip) {
            Some(i) => match self.paths6[i] {
                Some(p) => self.resolve6(link, p.dst, now),
                None => Err(Error::Timeout {
                    op: Op::ResolveAddress,
                }),
            },
            None => self.resolve(link, ip, now),
        }
    }

    /// [`Port::lookup`] of an address that is IPv4 or names an IPv6 path.
    pub(crate) fn lookup_any(&self, ip: [u8; 4]) -> Option<Mac> {
        match alias_path(ip) {
            Some(i) => self.lookup6(&self.paths6[i]?.dst),
            None => self.lookup(ip),
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

    /// A frame [`Port::take`] left to the IP stack, if it is IPv6 (`None` otherwise: it
    /// goes to the stack): neighbour discovery is answered and learnt from (and goes to the
    /// stack too, as ARP does), RoCEv2 over IPv6 to this interface is checked whole and
    /// either carried on to the transport (on a connected QP's IPv6 path) or dropped, a
    /// damaged one of either is dropped. The IPv4 path never comes here: the device asks
    /// only about frames for the stack, out of line.
    #[inline(never)]
    pub(crate) fn take_ipv6<L: Link>(
        &mut self,
        link: &mut L,
        frame: &[u8],
        now: u64,
    ) -> Option<Ipv6Rx> {
        if frame.get(12..14) != Some(&ETHERTYPE_IPV6.to_be_bytes()[..]) {
            return None;
        }
        match super::wire::ip6::parse6(frame) {
            Ok(Some(p))
                if self.has_ipv6(&p.ip.dst)
                    && !martian6(&p.ip.src)
                    && !self.has_ipv6(&p.ip.src) =>
            {
                self.counts.stack -= 1;
                self.counts.roce6 += 1;
                // On a connected QP's path: for the transport (the device carries it).
                let path = self
                    .paths6
                    .iter()
                    .position(|e| e.is_some_and(|e| e.src == p.ip.dst && e.dst == p.ip.src));
                if let Some(i) = path {
                    self.counts.roce += 1;
                    return Some(Ipv6Rx::Path(i));
                }
                self.counts.dropped += 1;
                return Some(Ipv6Rx::Dropped(Discard::NotRoce));
            }
            Ok(Some(_)) => return Some(self.unstack(Discard::NotRoce)),
            Err(d) => return Some(self.unstack(d)),
            Ok(None) => {}
        }
        let src_mac = frame.get(6..12).and_then(|m| m.first_chunk::<6>());
        match (Nd::parse(frame.get(ETH_LEN..).unwrap_or(&[])), src_mac) {
            (Ok(Some(m)), Some(&src_mac)) => self.neighbour_discovery(link, &m, src_mac, now),
            (Err(_), _) => {
                self.counts.nd_invalid += 1;
                return Some(self.unstack(Discard::BadIp));
            }
            _ => {}
        }
        Some(Ipv6Rx::Stack)
    }

    /// A frame counted for the stack, dropped after all.
    fn unstack(&mut self, d: Discard) -> Ipv6Rx {
        self.counts.stack -= 1;
        self.counts.dropped += 1;
        Ipv6Rx::Dropped(d)
    }

    /// Answers a solicitation for one of this interface's addresses, and learns as ARP
    /// learns: the asker of our address (from its source link-layer option), or the target
    /// of an advertisement when that address is being resolved or known. Nothing is learnt
    /// about this interface's own addresses, nor about addresses no station has.
    fn neighbour_discovery<L: Link>(&mut self, link: &mut L, m: &Nd, src_mac: Mac, now: u64) {
        if m.kind == nd::NS {
            if !self.has_ipv6(&m.target) {
                return;
            }
            let dad = m.src == [0; 16];
            if !dad
                && !martian6(&m.src)
                && !self.has_ipv6(&m.src)
                && let Some(mac) = m.lladdr
            {
                learn(&mut self.neighbours6, m.src, mac, now);
            }
            // To the asker: its option's MAC, else the frame's source; duplicate address
            // detection is answered to all nodes, unsolicited.
            let (dst, dst_mac, flags) = if dad {
                (
                    nd::ALL_NODES,
                    nd::multicast_mac(&nd::ALL_NODES),
                    nd::OVERRIDE,
                )
            } else if martian6(&m.src) {
                return;
            } else {
                (
                    m.src,
                    m.lladdr.unwrap_or(src_mac),
                    nd::SOLICITED | nd::OVERRIDE,
                )
            };
            let na = Nd {
                kind: nd::NA,
                src: m.target,
                dst,
                target: m.target,
                lladdr: Some(self.mac),
                flags,
            };
            let (f, n) = na.frame(self.mac, dst_mac);
            if link.transmit(&f[..n]).is_ok() {
                self.counts.nd_answered += 1;
            }
        } else if !self.has_ipv6(&m.target)
            && !martian6(&m.target)
            && let Some(mac) = m.lladdr
        {
            refresh(&mut self.neighbours6, m.target, mac, now);
        }
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
        let i = match self.find(ip) {
            Some(i) => i,
            None => self.make_room(ip, now),
        };
        let Some(n) = self.neighbours[i].as_mut() else {
            return Ok(None);
        };
        if let Some(mac) = n.mac {
            return Ok(Some(mac));
        }
        if n.tries > 0 && now.wrapping_sub(n.at) < ARP_RETRY_US {
            return Ok(None);
        }
        if n.tries >= ARP_TRIES {
            self.neighbours[i] = None;
            return Err(Error::Timeout {
                op: Op::ResolveAddress,
            });
        }
        let req = Arp {
            op: ArpOp::Request,
            sender_mac: self.mac,
            sender_ip: self.ip,
            target_mac: [0; 6],
            target_ip: ip,
        };
        if link.transmit(&req.frame(self.mac)).is_ok() {
            n.tries += 1;
            n.at = now;
            self.counts.arp_sent += 1;
        }
        Ok(None)
    }

    fn find(&self, ip: [u8; 4]) -> Option<usize> {
        self.neighbours
            .iter()
            .position(|n| n.is_some_and(|n| n.ip == ip))
    }

    /// A slot for `ip`, pending: a free one, or the least recently learnt.
    fn make_room(&mut self, ip: [u8; 4], now: u64) -> usize {
        let i = self
            .neighbours
            .iter()
            .position(Option::is_none)
            .unwrap_or_else(|| {
                (0..NEIGHBOURS)
                    .min_by_key(|&i| self.neighbours[i].map_or(0, |n| n.at))
                    .unwrap_or(0)
            });
        self.neighbours[i] = Some(Neighbour {
            ip,
            mac: None,
            at: now,
            tries: 0,
        });
        i
    }

    /// The MAC of `ip` when it is known (no ARP request is sent).
    pub fn lookup(&self, ip: [u8; 4]) -> Option<Mac> {
        if ip == self.ip {
            return Some(self.mac);
        }
        self.find(ip).and_then(|i| self.neighbours[i]?.mac)
    }

    /// Records `ip` at `mac`, making room if needed.
    fn learn(&mut self, ip: [u8; 4], mac: Mac, now: u64) {
        let i = match self.find(ip) {
            Some(i) => i,
            None => self.make_room(ip, now),
        };
        self.neighbours[i] = Some(Neighbour {
            ip,
            mac: Some(mac),
            at: now,
            tries: 0,
        });
    }

    /// Records `ip` at `mac` if `ip` is known or being resolved (nobody else's traffic fills
    /// the cache).
    fn refresh(&mut self, ip: [u8; 4], mac: Mac, now: u64) {
        if self.find(ip).is_some() {
            self.learn(ip, mac, now);
        }
    }

    /// [`Port::resolve`] for an IPv6 address: a Neighbor Solicitation to its solicited-node
    /// group (from the link-local address, or the global one on the same /64), the answer
    /// learnt from the advertisement; the same retries and limit as ARP.
    pub fn resolve6<L: Link>(&mut self, link: &mut L, ip: Ip6, now: u64) -> Result<Option<Mac>> {
        if self.has_ipv6(&ip) {
            return Ok(Some(self.mac));
        }
        let mac = self.mac;
        let src = self
            .globals
            .iter()
            .flatten()
            .find(|g| g[..8] == ip[..8])
            .copied()
            .unwrap_or(self.link_local);
        let sent = &mut self.counts.nd_sent;
        step(&mut self.neighbours6, ip, now, sent, |_| {
            let group = nd::solicited_node(&ip);
            let ns = Nd {
                kind: nd::NS,
                src,
                dst: group,
                target: ip,
                lladdr: Some(mac),
                flags: 0,
            };
            let (f, n) = ns.frame(mac, nd::multicast_mac(&group));
            link.transmit(&f[..n]).is_ok()
        })
    }

    /// The MAC of the IPv6 address `ip` when it is known (no solicitation is sent).
    pub fn lookup6(&self, ip: &Ip6) -> Option<Mac> {
        if self.has_ipv6(ip) {
            return Some(self.mac);
        }
        lookup(&self.neighbours6, *ip)
    }
}

/// One step of the resolution of `ip` in `cache`: `Ok(Some)` known; `Ok(None)` pending (a
/// request sent by `send` if none went out in the last [`ARP_RETRY_US`]); the timeout after
/// [`ARP_TRIES`] unanswered requests. `sent` counts the requests that went out.
fn step<A: Copy + PartialEq, const N: usize>(
    cache: &mut [Option<Neighbour<A>>; N],
    ip: A,
    now: u64,
    sent: &mut u64,
    send: impl FnOnce(A) -> bool,
) -> Result<Option<Mac>> {
    let i = match find(cache, ip) {
        Some(i) => i,
        None => make_room(cache, ip, now),
    };
    let Some(n) = cache[i].as_mut() else {
        return Ok(None);
    };
    if let Some(mac) = n.mac {
        return Ok(Some(mac));
    }
    if n.tries > 0 && now.wrapping_sub(n.at) < ARP_RETRY_US {
        return Ok(None);
    }
    if n.tries >= ARP_TRIES {
        cache[i] = None;
        return Err(Error::Timeout {
            op: Op::ResolveAddress,
        });
    }
    if send(ip) {
        n.tries += 1;
        n.at = now;
        *sent += 1;
    }
    Ok(None)
}

fn find<A: Copy + PartialEq, const N: usize>(
    cache: &[Option<Neighbour<A>>; N],
    ip: A,
) -> Option<usize> {
    cache.iter().position(|n| n.is_some_and(|n| n.ip == ip))
}

/// A slot for `ip`, pending: a free one, or the least recently learnt.
fn make_room<A: Copy + PartialEq, const N: usize>(
    cache: &mut [Option<Neighbour<A>>; N],
    ip: A,
    now: u64,
) -> usize {
    let i = cache.iter().position(Option::is_none).unwrap_or_else(|| {
        (0..N)
            .min_by_key(|&i| cache[i].map_or(0, |n| n.at))
            .unwrap_or(0)
    });
    cache[i] = Some(Neighbour {
        ip,
        mac: None,
        at: now,
        tries: 0,
    });
    i
}

fn lookup<A: Copy + PartialEq, const N: usize>(
    cache: &[Option<Neighbour<A>>; N],
    ip: A,
) -> Option<Mac> {
    find(cache, ip).and_then(|i| cache[i]?.mac)
}

/// Records `ip` at `mac`, making room if needed.
fn learn<A: Copy + PartialEq, const N: usize>(
    cache: &mut [Option<Neighbour<A>>; N],
    ip: A,
    mac: Mac,
    now: u64,
) {
    let i = match find(cache, ip) {
        Some(i) => i,
        None => make_room(cache, ip, now),
    };
    cache[i] = Some(Neighbour {
        ip,
        mac: Some(mac),
        at: now,
        tries: 0,
    });
}

/// Records `ip` at `mac` if `ip` is known or being resolved.
fn refresh<A: Copy + PartialEq, const N: usize>(
    cache: &mut [Option<Neighbour<A>>; N],
    ip: A,
    mac: Mac,
    now: u64,
) {
    if find(cache, ip).is_some() {
        learn(cache, ip, mac, now);
    }
}

/// Whether `ip` is an address no station on the segment sends from: unspecified (0/8),
/// loopback (127/8), multicast (224/4) or broadcast (and the reserved 240/4).
fn martian(ip: [u8; 4]) -> bool {
    // 224 to 255 and 0 in one comparison (they wrap to 0 to 32), then 127.
    ip[0].wrapping_add(32) <= 32 || ip[0] == 127
}
