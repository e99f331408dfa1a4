//! Sending one RoCEv2 frame: the outer headers from a route's template (a connected QP keeps
//! its own, `Net::path`), the transport headers, the payload copied straight from registered
//! memory into the NIC's transmit buffer (through [`Link::transmit_with`]), the ICRC.

use bareverbs_hal::{Link, LinkError};

use super::mem::{Denied, MrTable};
use super::port::{Port, alias_path};
use super::qp_state::QpCore;
use super::rings::Loopback;
use super::tables::Tables;
use super::wire::bth::{Aeth, Bth, Headers};
use super::wire::eth::Mac;
use super::wire::icrc::ICRC_LEN;
use super::wire::ip6::ipv4_to_ipv6;
use super::wire::packet::{EXT_MAX, Route, ack, begin_bth, begin_ext, begin_with, finish_at};
use super::wire::template::Template;
use crate::error::Result;
use crate::events::EventHub;

/// What the transport works with while it holds the device lock.
pub(crate) struct Net<'a, L: Link> {
    pub(crate) link: &'a mut L,
    pub(crate) t: &'a mut Tables,
    pub(crate) tx: &'a mut [u8],
    pub(crate) hub: &'a EventHub,
    pub(crate) now: u64,
    /// The port's active MTU (UD messages larger than it are not sent).
    pub(crate) mtu: u32,
    /// Answer packets the responder may still send in this turn
    /// ([`ANSWER_BURST`](super::reply::ANSWER_BURST) a turn).
    pub(crate) answers: u32,
}

/// Why a frame was not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unsent {
    /// The NIC has no free transmit slot now: try again later.
    Busy,
    /// The payload's memory was refused.
    Denied(Denied),
    /// The frame could not be built or the NIC refused it (lost, as on a wire).
    Lost,
}

impl<L: Link> Net<'_, L> {
    /// The route of a connected QP's packets to its peer at `mac`: its path, the address
    /// vector's destination, traffic class and hop limit, from this interface.
    pub(crate) fn route(&self, q: &QpCore, mac: Mac) -> Route {
        let av = q.attr.av;
        Route {
            src_mac: self.t.port.mac(),
            dst_mac: mac,
            src_ip: self.t.port.ip(),
            dst_ip: q.peer_ip,
            tos: av.map_or(0, |a| a.traffic_class),
            ttl: av.map_or(64, |a| a.hop_limit),
            src_port: q.src_port,
        }
    }

    /// The MAC of the peer of the connected QP `q`: kept in the QP once known, else from the
    /// neighbour cache (learnt from ARP only), else resolved — `Ok(None)` while an ARP request
    /// is out; the error when nobody answered it.
    /// The known MAC's test inlined; the resolution apart.
    #[inline(always)]
    pub(crate) fn peer_mac(&mut self, q: &mut QpCore) -> Result<Option<Mac>> {
        match q.peer_mac {
            Some(m) => Ok(Some(m)),
            None => self.resolve_peer(q),
        }
    }

    /// Makes sure the connected QP `q` keeps the outer headers of its frames to its peer
    /// (`q.hdr`, made once the peer's MAC is known, dropped at every modify): `Ok(false)`
    /// while an ARP request is out; the error when nobody answered it. The kept template's
    /// test inlined; its making apart.
    #[inline(always)]
    pub(crate) fn path(&mut self, q: &mut QpCore) -> Result<bool> {
        if q.hdr.is_some() {
            return Ok(true);
        }
        self.make_path(q)
    }

    /// [`Net::path`] of a QP without its template.
    fn make_path(&mut self, q: &mut QpCore) -> Result<bool> {
        let Some(mac) = self.peer_mac(q)? else {
            return Ok(false);
        };
        let t = Template::new(&self.route(q, mac), q.attr.dest_qpn);
        q.hdr = Some(match alias_path(q.peer_ip) {
            Some(i) => t.over_path6(i),
            None => t,
        });
        Ok(true)
    }

    /// [`Net::peer_mac`] of a QP whose peer's MAC is not kept yet.
    fn resolve_peer(&mut self, q: &mut QpCore) -> Result<Option<Mac>> {
        let m = self.t.port.resolve_any(self.link, q.peer_ip, self.now)?;
        q.peer_mac = m;
        Ok(m)
    }

    /// Sends a frame with `headers` and `len` payload bytes that `fill` writes.
    #[inline(always)]
    pub(crate) fn send(
        &mut self,
        outer: &Template,
        headers: &Headers,
        len: usize,
        fill: impl FnOnce(&MrTable, &mut [u8]) -> Result<(), Denied>,
    ) -> Result<(), Unsent> {
        let begin = move |buf: &mut [u8], id: u16| begin_with(buf, outer, id, headers, len);
        self.send_framed(outer, len, begin, fill)
    }

    /// Sends a frame whose transport header is `bth` alone (no extended header; its pad
    /// count set from the length) with `len` payload bytes that `fill` writes: the common
    /// one-packet SEND, without the header record's layout lookups ([`begin_bth`]).
    #[inline(always)]
    pub(crate) fn send_bth(
        &mut self,
        outer: &Template,
        bth: Bth,
        len: usize,
        fill: impl FnOnce(&MrTable, &mut [u8]) -> Result<(), Denied>,
    ) -> Result<(), Unsent> {
        // Captured by value (`move`): the frame's closure carries the header and the length,
        // not pointers to copies of them on the caller's stack.
        let begin = move |buf: &mut [u8], id: u16| begin_bth(buf, outer, id, &bth, len);
        self.send_framed(outer, len, begin, fill)
    }

    /// [`Net::send_bth`] with the first `ext_len` bytes of `ext` after the BTH (the bytes of
    /// the extended headers `bth`'s opcode has, in order: [`begin_ext`]): a RETH, an AETH or
    /// nothing, at fixed offsets.
    #[inline(always)]
    pub(crate) fn send_ext(
        &mut self,
        outer: &Template,
        bth: Bth,
        (ext, ext_len): ([u8; EXT_MAX], usize),
        len: usize,
        fill: impl FnOnce(&MrTable, &mut [u8]) -> Result<(), Denied>,
    ) -> Result<(), Unsent> {
        let begin =
            move |buf: &mut [u8], id: u16| begin_ext(buf, outer, id, &bth, &ext, ext_len, len);
        self.send_framed(outer, len, begin, fill)
    }

    /// Sends a frame whose headers `begin` writes (given the buffer and the IPv4
    /// identification; it returns where the payload goes) with `len` payload bytes that
    /// `fill` writes.
    fn send_framed(
        &mut self,
        outer: &Template,
        len: usize,
        begin: impl FnOnce(&mut [u8], u16) -> Option<usize>,
        fill: impl FnOnce(&MrTable, &mut [u8]) -> Result<(), Denied>,
    ) -> Result<(), Unsent> {
        let mrs = &self.t.mrs;
        let mut denied = None;
        let refused = &mut denied;
        // Headers, payload and ICRC written where the frame goes out from; `begin`, `fill`
        // and `len` moved in (their values in the closure, not pointers to them).
        let build = move |buf: &mut [u8], id: u16| {
            let at = begin(buf, id)?;
            let pad_at = at + len;
            let payload = buf.get_mut(at..pad_at)?;
            if let Err(d) = fill(mrs, payload) {
                *refused = Some(d);
                return None;
            }
            // The frame's end from the lengths (`begin` sized the frame from them), not read
            // back from its headers.
            finish_at(buf, pad_at, pad_at + (len.wrapping_neg() & 3) + ICRC_LEN)
        };
        let r = transmit(
            self.link,
            self.tx,
            &mut self.t.loopback,
            &mut self.t.ip_id,
            &self.t.port,
            outer,
            build,
        );
        r.map_err(|e| match (e, denied) {
            (Unsent::Lost, Some(d)) => Unsent::Denied(d),
            (e, _) => e,
        })
    }

    /// Sends the acknowledgement (ACK or NAK) `aeth` of `psn` along `outer`, built whole at
    /// fixed offsets ([`ack`]).
    pub(crate) fn send_ack(
        &mut self,
        outer: &Template,
        psn: u32,
        aeth: Aeth,
    ) -> Result<(), Unsent> {
        let build = |buf: &mut [u8], id: u16| ack(buf, outer, id, psn, aeth);
        transmit(
            self.link,
            self.tx,
            &mut self.t.loopback,
            &mut self.t.ip_id,
            &self.t.port,
            outer,
            build,
        )
    }
}

/// Sends the frame `build` writes (given the buffer and the IPv4 identification to use)
/// with the outer headers `outer`: through the NIC, or, for a route that is not on the wire
/// as built ([`Template::special`]), built in `tx` and looped back (to this interface) or
/// made IPv6 ([`send_special`]). Room first: a frame is built only when it can go out now
/// (`transmit_with` calls `build` only with a free transmit slot; the loopback queue's room
/// is asked for both special routes). `Lost` when `build` returns `None`.
#[inline(always)]
fn transmit<L: Link>(
    link: &mut L,
    tx: &mut [u8],
    loopback: &mut Loopback,
    ip_id: &mut u16,
    port: &Port,
    outer: &Template,
    build: impl FnOnce(&mut [u8], u16) -> Option<usize>,
) -> Result<(), Unsent> {
    let special = outer.special();
    if special && !loopback.has_room() {
        loopback.full += 1;
        return Err(Unsent::Busy);
    }
    let build = |buf: &mut [u8]| {
        let id = *ip_id;
        *ip_id = id.wrapping_add(1);
        build(buf, id)
    };
    if special {
        // An IPv6 route's frame is built as over IPv4 `V6_EXTRA` bytes in (made IPv6 after).
        let at = outer.ipv6_room();
        let n = build(tx.get_mut(at..).ok_or(Unsent::Lost)?).ok_or(Unsent::Lost)?;
        return send_special(link, loopback, tx, n, port, outer);
    }
    match link.transmit_with(tx, build) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(Unsent::Lost),
        Err(LinkError::Busy) => Err(Unsent::Busy),
        Err(_) => Err(Unsent::Lost),
    }
}

/// Sends the frame [`transmit`] built in `tx` for a special route: looped back (`n` bytes at
/// the start), or, along an IPv6 path, the frame over IPv4 of `n` bytes at `tx[V6_EXTRA..]`
/// made the IPv6 frame of the same packet ([`ipv4_to_ipv6`]) and copied to the NIC.
#[inline(never)]
fn send_special<L: Link>(
    link: &mut L,
    loopback: &mut Loopback,
    tx: &mut [u8],
    n: usize,
    port: &Port,
    outer: &Template,
) -> Result<(), Unsent> {
    let Some(path) = outer.path6() else {
        // To this interface: looped back, never on the wire.
        return if loopback.push(tx.get(..n).ok_or(Unsent::Lost)?) {
            Ok(())
        } else {
            Err(Unsent::Busy)
        };
    };
    let p = port.path6(port.alias6(path)).ok_or(Unsent::Lost)?;
    let n = ipv4_to_ipv6(tx, n, &p.src, &p.dst, p.flow).ok_or(Unsent::Lost)?;
    match link.transmit(tx.get(..n).ok_or(Unsent::Lost)?) {
        Ok(()) => Ok(()),
        Err(LinkError::Busy) => Err(Unsent::Busy),
        Err(_) => Err(Unsent::Lost),
    }
}
