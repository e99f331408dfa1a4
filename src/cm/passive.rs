//! The passive side: a REQ to a listener (checked, matched against duplicates and stale
//! connections, given an entry), accept (QP to RTS, then REP), reject, the RTU; and a UD
//! service's SIDR_REQ and its answer.

use bareverbs_hal::Clock;

use super::mad::Mad;
use super::msg::{
    self, CMA_HDR, CmaAddrs, Ids, Private, Rej, Rep, Req, SidrRep, SidrReq, about, pdata, reason,
    sidr_status,
};
use super::table::Failure;
use super::table::{Conn, Lookup, St, pend};
use super::timer::{Timer, timeout_us};
use super::{Cm, CmAddr, CmError, ConnId, Service};
use crate::verbs::{AccessFlags, Endpoint, Handshake, Mtu, Provider, QueuePair, Rc, Reset, Rts};

/// The MRA service timeout rdma_cm sends while its user decides (24: about 69 s).
const MRA_TIMEOUT: u8 = 24;

/// How [`Cm::accept`] answers; the defaults are rping's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcceptParams<'d> {
    /// READs/atomics this side accepts at once (clamped to the request's initiator depth and
    /// the device's limit).
    pub responder_resources: u8,
    /// READs/atomics this side issues at once (clamped to the request's responder resources
    /// and the device's limit).
    pub initiator_depth: u8,
    /// RNR retries the active side is to use (the REP carries it; 7: infinite).
    pub rnr_retry_count: u8,
    /// Private data for the REP (at most 196 bytes).
    pub private_data: &'d [u8],
}

impl Default for AcceptParams<'_> {
    fn default() -> Self {
        AcceptParams {
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            private_data: &[],
        }
    }
}

impl<'a, P: Provider, C: Clock, const N: usize> Cm<'a, P, C, N> {
    /// A REQ from `ip`.
    pub(super) fn on_req(&mut self, ip: CmAddr, m: &Mad, now: u64) -> bool {
        let req = Req::decode(m);
        let reject = |reason: u16| Rej {
            ids: Ids {
                local: 0,
                remote: req.local_comm_id,
            },
            rejected: about::REQ,
            ari_len: 0,
            reason,
            private: Private::empty(),
        };
        // A duplicate: the same comm ID from the same CA.
        let dup = self.conns.iter().position(|c| {
            c.live()
                && c.remote_id == req.local_comm_id
                && c.remote_guid == req.local_ca_guid
                && c.peer_ip == ip
                && !c.is_active()
        });
        if let Some(i) = dup {
            let c = &self.conns[i];
            let ids = Ids {
                local: c.local_id,
                remote: c.remote_id,
            };
            let answer = match c.st {
                St::ReqRcvd => Some(
                    msg::Mra {
                        ids,
                        mraed: about::REQ,
                        service_timeout: MRA_TIMEOUT,
                    }
                    .encode(c.tid),
                ),
                St::TimeWait => Some(
                    Rej {
                        ids,
                        ..reject(reason::STALE_CONN)
                    }
                    .encode(c.tid),
                ),
                _ => None,
            };
            if let Some(a) = answer {
                self.answer(ip, &a);
            }
            return true;
        }
        // Stale: a new REQ from a QP of a connection this side still holds up.
        let stale = self.conns.iter().position(|c| {
            matches!(c.st, St::Established | St::RepSent)
                && c.remote_qpn == req.local_qpn
                && c.remote_guid == req.local_ca_guid
                && c.peer_ip == ip
        });
        if let Some(i) = stale {
            self.answer(ip, &reject(reason::STALE_CONN).encode(m.tid()));
            self.start_disconnect(i, now);
            return true;
        }
        let sid = req.service_id;
        let listener = (sid >> 32 == 0 && (sid >> 16) as u16 == msg::PS_TCP)
            .then(|| self.listener(sid as u16, Service::Rc))
            .flatten();
        let Some(l) = listener else {
            self.answer(ip, &reject(reason::INVALID_SERVICE_ID).encode(m.tid()));
            return true;
        };
        // rdma_cm's checks: its header (IPv4 or IPv6), the address connected to is this
        // side's of the sender's family (and the listener's), the sender is who the header
        // says, an RC request.
        let hdr = CmaAddrs::parse(req.private.as_slice());
        let fits = hdr.is_ok_and(|h| self.header_fits(&h, ip, l.ip));
        if !fits || req.transport != 0 {
            self.counts.bad_header += u64::from(!fits);
            self.answer(ip, &reject(reason::CONSUMER).encode(m.tid()));
            return true;
        }
        let Some(i) = self.take_entry() else {
            self.answer(ip, &reject(reason::NO_RESOURCES).encode(m.tid()));
            return true;
        };
        let local_id = self.new_id();
        let c = &mut self.conns[i];
        *c = Conn::idle();
        c.st = St::ReqRcvd;
        c.local_id = local_id;
        c.remote_id = req.local_comm_id;
        c.remote_guid = req.local_ca_guid;
        c.remote_qpn = req.local_qpn;
        c.peer_ip = ip;
        c.ports = (hdr.map_or(0, |h| h.src_port), sid as u16);
        c.tid = m.tid();
        c.born = now;
        c.req = Some(req);
        c.pending = pend::REQUEST;
        true
    }

    /// A free entry, or the oldest half-open one (its peer told "no resources").
    fn take_entry(&mut self) -> Option<usize> {
        if let Some(i) = self.conns.free() {
            return Some(i);
        }
        let i = self.conns.oldest_half_open()?;
        let c = &self.conns[i];
        let (ip, tid) = (c.peer_ip, c.tid);
        let m = if c.st == St::SidrReqRcvd {
            sidr_answer(c, sidr_status::REJECT, 0, 0, &[])
        } else {
            Rej {
                ids: Ids {
                    local: c.local_id,
                    remote: c.remote_id,
                },
                rejected: about::REQ,
                ari_len: 0,
                reason: reason::NO_RESOURCES,
                private: Private::empty(),
            }
            .encode(tid)
        };
        self.answer(ip, &m);
        self.conns[i] = Conn::idle();
        self.counts.evicted += 1;
        Some(i)
    }

    /// Whether a request's rdma_cm header fits: from `ip` (the datagram's source) to this
    /// side's address of that family, and to the listener's address `at` if it has one.
    fn header_fits(&mut self, h: &CmaAddrs, ip: CmAddr, at: Option<CmAddr>) -> bool {
        let mine = self.local_for(ip).map(|(_, a)| a);
        h.src == ip && mine == Some(h.dst) && at.is_none_or(|a| a == h.dst)
    }

    fn listener(&self, port: u16, service: Service) -> Option<super::Listener> {
        self.listeners
            .iter()
            .flatten()
            .find(|l| l.port == port && l.service == service)
            .copied()
    }

    /// Accepts a connection request: moves `qp` (RESET) to RTS with the request's values —
    /// the peer's QP and starting PSN, the MTU (at most this port's), the depths clamped as
    /// [`AcceptParams`] says, the request's retry counts — then sends the REP. The
    /// connection is established at the RTU ([`CmEvent::Established`](super::CmEvent)); the
    /// QP may receive at once (Linux sends as soon as it sent the RTU).
    ///
    /// # Errors
    ///
    /// [`CmError::UnknownConnection`] / [`CmError::WrongState`] when `id` is not a request
    /// waiting for an answer; [`CmError::PrivateDataTooLong`]; [`CmError::Verbs`] when the QP
    /// cannot be moved (then the request is rejected with reason 28); [`CmError::NoAddress`]
    /// when this side has no address of the request's family (it had one when the request
    /// came). The QP comes back in RESET on every error.
    #[allow(clippy::type_complexity)]
    pub fn accept(
        &mut self,
        id: ConnId,
        qp: QueuePair<'a, P, Rc, Reset>,
        params: &AcceptParams<'_>,
    ) -> Result<QueuePair<'a, P, Rc, Rts>, (QueuePair<'a, P, Rc, Reset>, CmError)> {
        if params.private_data.len() > pdata::REP {
            return Err((qp, CmError::PrivateDataTooLong(pdata::REP)));
        }
        let Some(i) = self.conns.by_local(id.0) else {
            return Err((qp, CmError::UnknownConnection));
        };
        let (St::ReqRcvd, Some(req)) = (self.conns[i].st, self.conns[i].req) else {
            return Err((qp, CmError::WrongState));
        };
        let caps = *self.ctx.caps();
        let resp = params
            .responder_resources
            .min(req.initiator_depth)
            .min(caps.max_qp_rd_atom.min(255) as u8);
        let init = params
            .initiator_depth
            .min(req.responder_resources)
            .min(caps.max_qp_init_rd_atom.min(255) as u8);
        let peer = self.conns[i].peer_ip;
        let Some((sgid_index, _)) = self.local_for(peer) else {
            return Err((qp, CmError::NoAddress));
        };
        let remote = Endpoint {
            qpn: req.local_qpn,
            gid: peer.gid(),
            psn: req.starting_psn,
            mtu: Mtu::from_raw(u32::from(req.mtu)).map_or(self.mtu, |m| m.min(self.mtu)),
        };
        let opts = self.qp_options(
            sgid_index,
            resp,
            init,
            req.retry_count,
            req.rnr_retry_count,
            req.flow_label,
        );
        let local_psn = qp.local_psn();
        let qp = match qp.handshake_with(&remote, &opts) {
            Ok(q) => q,
            Err((q, e)) => {
                let _ = self.reject(id, &[]);
                return Err((q, CmError::Verbs(e)));
            }
        };
        let c = &mut self.conns[i];
        let rep = Rep {
            local_comm_id: c.local_id,
            remote_comm_id: c.remote_id,
            local_qpn: qp.qp_num(),
            starting_psn: local_psn,
            responder_resources: resp,
            initiator_depth: init,
            target_ack_delay: 15,
            flow_control: false,
            rnr_retry_count: params.rnr_retry_count.min(7),
            srq: false,
            local_ca_guid: self.guid,
            private: Private::from_slice(params.private_data),
        }
        .encode(c.tid);
        c.st = St::RepSent;
        c.local_qpn = qp.qp_num();
        c.depths = (resp, init);
        c.out = rep;
        c.req = None;
        let now = self.clock.now_us();
        c.timer = Timer::arm(
            now,
            timeout_us(req.local_cm_response_timeout),
            req.max_cm_retries,
        );
        c.pending &= !pend::REQUEST;
        let ip = c.peer_ip;
        self.send(ip, &rep);
        Ok(qp)
    }

    /// The options of a connected QP's handshake from a connection's negotiated values.
    pub(super) fn qp_options(
        &self,
        sgid_index: u32,
        responder: u8,
        initiator: u8,
        retry: u8,
        rnr: u8,
        flow_label: u32,
    ) -> Handshake {
        let mut access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        if responder > 0 {
            access |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
        }
        Handshake {
            access,
            max_rd_atomic: Some(initiator),
            max_dest_rd_atomic: Some(responder),
            sgid_index: Some(sgid_index),
            path_mtu: None,
            timeout: self.cfg.ack_timeout,
            retry_cnt: retry.min(7),
            rnr_retry: rnr.min(7),
            min_rnr_timer: 12,
            hop_limit: self.cfg.hop_limit,
            traffic_class: 0,
            flow_label,
        }
    }

    /// Rejects a connection request (REJ reason 28, "consumer defined", with
    /// `private_data`, at most 148 bytes), or a SIDR request (SIDR_REP "rejected").
    ///
    /// # Errors
    ///
    /// [`CmError::UnknownConnection`], [`CmError::WrongState`] (not a request waiting for an
    /// answer), [`CmError::PrivateDataTooLong`].
    pub fn reject(&mut self, id: ConnId, private_data: &[u8]) -> Result<(), CmError> {
        if private_data.len() > pdata::REJ {
            return Err(CmError::PrivateDataTooLong(pdata::REJ));
        }
        let i = self
            .conns
            .by_local(id.0)
            .ok_or(CmError::UnknownConnection)?;
        let c = &mut self.conns[i];
        let m = match c.st {
            St::ReqRcvd => Rej {
                ids: Ids {
                    local: c.local_id,
                    remote: c.remote_id,
                },
                rejected: about::REQ,
                ari_len: 0,
                reason: reason::CONSUMER,
                private: Private::from_slice(private_data),
            }
            .encode(c.tid),
            St::SidrReqRcvd => sidr_answer(c, sidr_status::REJECT, 0, 0, private_data),
            _ => return Err(CmError::WrongState),
        };
        let ip = c.peer_ip;
        c.pending &= !(pend::REQUEST | pend::SIDR_REQUEST);
        c.close();
        self.answer(ip, &m);
        Ok(())
    }

    /// An RTU: the passive connection is up.
    pub(super) fn on_rtu(&mut self, ip: CmAddr, m: &Mad) -> bool {
        let ids = Ids::decode(m);
        let Some(i) = self.conns.by_pair(ids.remote, ids.local, ip) else {
            return false;
        };
        let c = &mut self.conns[i];
        if c.st != St::RepSent {
            return false;
        }
        c.st = St::Established;
        c.timer.stop();
        c.private = Private::empty();
        c.pending |= pend::ESTABLISHED;
        true
    }

    /// A SIDR_REQ from `ip`.
    pub(super) fn on_sidr_req(&mut self, ip: CmAddr, m: &Mad, now: u64) -> bool {
        let r = SidrReq::decode(m);
        let dup = self
            .conns
            .iter()
            .any(|c| c.st == St::SidrReqRcvd && c.remote_id == r.request_id && c.peer_ip == ip);
        if dup {
            return true;
        }
        let sid = r.service_id;
        let hdr = CmaAddrs::parse(r.private.as_slice());
        let listener = (sid >> 32 == 0 && (sid >> 16) as u16 == msg::PS_UDP)
            .then(|| self.listener(sid as u16, Service::Ud))
            .flatten();
        let fits = match (listener, hdr) {
            (Some(l), Ok(h)) => self.header_fits(&h, ip, l.ip),
            _ => false,
        };
        self.counts.bad_header += u64::from(listener.is_some() && !fits);
        let listener = listener.filter(|_| fits);
        let answer = |status| {
            SidrRep {
                request_id: r.request_id,
                status,
                qpn: 0,
                service_id: sid,
                qkey: 0,
                private: Private::empty(),
            }
            .encode(m.tid())
        };
        if listener.is_none() {
            self.answer(ip, &answer(sidr_status::UNSUPPORTED_SID));
            return true;
        }
        let Some(i) = self.take_entry() else {
            self.answer(ip, &answer(sidr_status::REJECT));
            return true;
        };
        let local_id = self.new_id();
        let c = &mut self.conns[i];
        *c = Conn::idle();
        c.st = St::SidrReqRcvd;
        c.local_id = local_id;
        c.remote_id = r.request_id;
        c.peer_ip = ip;
        c.ports = (hdr.map_or(0, |h| h.src_port), sid as u16);
        c.tid = m.tid();
        c.born = now;
        c.out = *m;
        c.private = Private::from_slice(&r.private.bytes[CMA_HDR..]);
        c.pending = pend::SIDR_REQUEST;
        true
    }

    /// Answers a SIDR request: the UD service is QP `qpn` with Q_Key `qkey` (rdma_cm's is
    /// [`msg::UDP_QKEY`]), with `private_data` (at most 136 bytes).
    ///
    /// # Errors
    ///
    /// [`CmError::UnknownConnection`], [`CmError::WrongState`],
    /// [`CmError::PrivateDataTooLong`].
    pub fn sidr_reply(
        &mut self,
        id: ConnId,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        if private_data.len() > pdata::SIDR_REP {
            return Err(CmError::PrivateDataTooLong(pdata::SIDR_REP));
        }
        let i = self
            .conns
            .by_local(id.0)
            .ok_or(CmError::UnknownConnection)?;
        let c = &mut self.conns[i];
        if c.st != St::SidrReqRcvd {
            return Err(CmError::WrongState);
        }
        let m = sidr_answer(c, sidr_status::OK, qpn, qkey, private_data);
        let ip = c.peer_ip;
        c.pending &= !pend::SIDR_REQUEST;
        c.close();
        self.answer(ip, &m);
        Ok(())
    }

    /// Marks entry `i` failed with `failure` (kept for the event).
    pub(super) fn fail(&mut self, i: usize, failure: Failure) {
        self.conns[i].fail(failure);
    }
}

/// The SIDR_REP for the request held in `c` (its SIDR_REQ is `c.out`).
fn sidr_answer<P: Provider>(
    c: &Conn<'_, P>,
    status: u8,
    qpn: u32,
    qkey: u32,
    private_data: &[u8],
) -> Mad {
    SidrRep {
        request_id: c.remote_id,
        status,
        qpn,
        service_id: c.out.u64(32),
        qkey,
        private: Private::from_slice(private_data),
    }
    .encode(c.tid)
}
