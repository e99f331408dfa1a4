//! The port's IPv6 side: the interface's IPv6 addresses and GIDs, the IPv6 paths of
//! connected queue pairs (named inside the transport by an IPv4 address no station has), the
//! first look at received IPv6 frames, and neighbour discovery answered, resolved and learnt
//! from with ARP's trust rules (`docs/roce-v2.md` §5.1, `docs/security.md`).

use bareverbs_hal::Link;

use super::neighbours::{learn, lookup, refresh, step};
use super::{GLOBALS6, PATHS6, Port, gid};
use crate::device::rxe::wire::Discard;
use crate::device::rxe::wire::bth::opcode;
use crate::device::rxe::wire::eth::{ETH_LEN, Mac};
use crate::device::rxe::wire::ip6::{ETHERTYPE_IPV6, Ip6, martian6, parse6};
use crate::device::rxe::wire::nd::{self, Nd};
use crate::error::{Error, Op, Result};
use crate::verbs::Gid;

/// The IPv4 address by which the transport names IPv6 path `i` in its generation `gen`
/// (counted up each time the slot is taken afresh): 0.134.`gen`.`i`. No station sends from
/// 0/8 (the port drops such sources from the wire as martian), so no IPv4 frame can pass for
/// one of these paths; an alias of an earlier generation names nothing ([`Port::path6`]).
fn path_alias(i: usize, generation: u8) -> [u8; 4] {
    [0, 0x86, generation, i as u8]
}

/// The slot of the IPv6 path an address of [`path_alias`] names, whatever its generation.
pub(crate) fn alias_path(ip: [u8; 4]) -> Option<usize> {
    let i = usize::from(ip[3]);
    (ip[..2] == [0, 0x86] && i < PATHS6).then_some(i)
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
    /// A UD SEND over IPv6 (the GSI QP's too) from a peer no path is held to, on the IPv6
    /// path `i` taken for it alone: for the transport, then given back at once
    /// ([`Port::release_path6`]), so that no stranger keeps a path.
    Transient(usize),
    /// Dropped, with the reason.
    Dropped(Discard),
}

impl Port {
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
                self.gens6[i] = self.gens6[i].wrapping_add(1);
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
        Some(self.alias6(i))
    }

    /// The address by which the transport names the IPv6 path in slot `i` now.
    pub(crate) fn alias6(&self, i: usize) -> [u8; 4] {
        path_alias(i, self.gens6.get(i).copied().unwrap_or(0))
    }

    /// Gives back a use of the path `alias` names (nothing for any other address); the last
    /// use frees it.
    pub(crate) fn release_path6(&mut self, alias: [u8; 4]) {
        let Some(i) = alias_path(alias) else { return };
        if alias != self.alias6(i) {
            return;
        }
        if let Some(e) = self.paths6[i].as_mut() {
            e.users = e.users.saturating_sub(1);
            if e.users == 0 {
                self.paths6[i] = None;
            }
        }
    }

    /// Whether `a` and `b` name held IPv6 paths between the same two addresses (paths that
    /// differ by their flow label only).
    pub(crate) fn same_peer6(&self, a: [u8; 4], b: [u8; 4]) -> bool {
        match (self.path6(a), self.path6(b)) {
            (Some(x), Some(y)) => (x.src, x.dst) == (y.src, y.dst),
            _ => false,
        }
    }

    /// The IPv6 path `alias` names, when it is held (in the alias's generation).
    pub(crate) fn path6(&self, alias: [u8; 4]) -> Option<Path6> {
        let i = alias_path(alias)?;
        self.paths6[i].filter(|_| alias == self.alias6(i))
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
            Some(_) => match self.path6(ip) {
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
            Some(_) => self.lookup6(&self.path6(ip)?.dst),
            None => self.lookup(ip),
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
        match parse6(frame) {
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
                let ud = matches!(
                    p.headers.bth.opcode,
                    opcode::UD_SEND_ONLY | opcode::UD_SEND_ONLY_IMM
                );
                if ud {
                    // (The table full: dropped as any other.)
                    if let Some(alias) = self.hold_path6(p.ip.dst, p.ip.src, 0) {
                        self.counts.roce += 1;
                        return alias_path(alias).map(Ipv6Rx::Transient);
                    }
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
