//! The active side: connect (REQ for a RESET QP), the REP (QP to RTR and RTS, then the RTU),
//! duplicate REPs; and SIDR resolution of a UD service.

use bareverbs_hal::Clock;

use super::event::SIDR_TIMEOUT;
use super::mad::{Mad, attr};
use super::msg::{
    self, CMA_HDR, Ids, Private, Rej, Rep, Req, SidrRep, SidrReq, about, pdata, reason, sidr_status,
};
use super::table::Failure;
use super::table::{Conn, Lookup, St, pend};
use super::timer::{Timer, timeout_us};
use super::{Cm, CmAddr, CmError, ConnId, REQ_USER_DATA, SIDR_USER_DATA};
use crate::verbs::{Endpoint, Provider, QueuePair, Rc, Reset};

/// What [`Cm::connect`] asks for; the defaults are rping's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectParams<'d> {
    /// READs/atomics this side accepts at once (clamped to the device's limit).
    pub responder_resources: u8,
    /// READs/atomics this side issues at once (clamped to the device's limit, and at the
    /// REP to the peer's responder resources).
    pub initiator_depth: u8,
    /// Transport retries (at most 7).
    pub retry_count: u8,
    /// RNR retries the passive side is to use (7: infinite).
    pub rnr_retry_count: u8,
    /// Private data after rdma_cm's header (at most 56 bytes).
    pub private_data: &'d [u8],
}

impl Default for ConnectParams<'_> {
    fn default() -> Self {
        ConnectParams {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            private_data: &[],
        }
    }
}

/// rdma_cm's ephemeral ports: 32768 to 60999 (Linux's default local port range).
const EPHEMERAL: (u16, u16) = (32768, 60999);

impl<'a, P: Provider, C: Clock, const N: usize> Cm<'a, P, C, N> {
    /// Connects `qp` (RESET) to port `port` at `dst` (IPv4 or IPv6: RoCEv2 over that
    /// family, from this side's address of it): sends a REQ advertising the QP's
    /// starting PSN ([`QueuePair::local_psn`]) and `params`, resent until the REP or the
    /// retry count. The CM holds the QP until [`CmEvent::Established`](super::CmEvent) hands
    /// it back in RTS, or [`CmEvent::Failed`](super::CmEvent) in RESET.
    ///
    /// # Errors
    ///
    /// [`CmError::PrivateDataTooLong`], [`CmError::TableFull`], [`CmError::NoAddress`] (no
    /// address of `dst`'s family on this side); the QP comes back.
    #[allow(clippy::type_complexity)]
    pub fn connect(
        &mut self,
        qp: QueuePair<'a, P, Rc, Reset>,
        dst: impl Into<CmAddr>,
        port: u16,
        params: &ConnectParams<'_>,
    ) -> Result<ConnId, (QueuePair<'a, P, Rc, Reset>, CmError)> {
        let dst = dst.into();
        if params.private_data.len() > REQ_USER_DATA {
            return Err((qp, CmError::PrivateDataTooLong(REQ_USER_DATA)));
        }
        let Some((_, me)) = self.local_for(dst) else {
            return Err((qp, CmError::NoAddress));
        };
        let Some(i) = self.conns.free() else {
            return Err((qp, CmError::TableFull));
        };
        let local_id = self.new_id();
        let src_port = self.ephemeral_port();
        let caps = *self.ctx.caps();
        let resp = params
            .responder_resources
            .min(caps.max_qp_rd_atom.min(255) as u8);
        let init = params
            .initiator_depth
            .min(caps.max_qp_init_rd_atom.min(255) as u8);
        let mut private = [0u8; pdata::REQ];
        private[..CMA_HDR].copy_from_slice(&msg::cma_header(src_port, me, dst));
        private[CMA_HDR..CMA_HDR + params.private_data.len()].copy_from_slice(params.private_data);
        let tid = self.tid_for(local_id);
        let req = Req {
            local_comm_id: local_id,
            service_id: msg::service_id(msg::PS_TCP, port),
            local_ca_guid: self.guid,
            local_qpn: qp.qp_num(),
            responder_resources: resp,
            initiator_depth: init,
            remote_cm_response_timeout: self.cfg.response_timeout,
            transport: 0,
            flow_control: false,
            starting_psn: qp.local_psn(),
            local_cm_response_timeout: self.cfg.response_timeout,
            retry_count: params.retry_count.min(7),
            pkey: 0xFFFF,
            mtu: self.mtu as u8,
            rnr_retry_count: params.rnr_retry_count.min(7),
            max_cm_retries: self.cfg.max_retries,
            srq: false,
            local_gid: me.gid().0,
            remote_gid: dst.gid().0,
            flow_label: flow_label(src_port, port),
            traffic_class: 0,
            hop_limit: self.cfg.hop_limit,
            local_ack_timeout: self.cfg.ack_timeout,
            private: Private {
                bytes: private,
                len: pdata::REQ,
            },
        };
        let m = req.encode(tid);
        let now = self.clock.now_us();
        let period = 2 * timeout_us(self.cfg.packet_life) + timeout_us(self.cfg.response_timeout);
        let c = &mut self.conns[i];
        *c = Conn::idle();
        c.st = St::ReqSent;
        c.active = true;
        c.local_id = local_id;
        c.local_qpn = qp.qp_num();
        c.peer_ip = dst;
        c.ports = (src_port, port);
        c.tid = tid;
        c.born = now;
        c.out = m;
        c.timer = Timer::arm(now, period, self.cfg.max_retries);
        c.depths = (resp, init);
        c.retries = (params.retry_count.min(7), params.rnr_retry_count.min(7));
        c.qp = Some(qp);
        self.send(dst, &m);
        Ok(ConnId(local_id))
    }

    fn ephemeral_port(&self) -> u16 {
        let span = u64::from(EPHEMERAL.1 - EPHEMERAL.0) + 1;
        EPHEMERAL.0 + (self.ctx.entropy().next_u64() % span) as u16
    }

    /// A REP from `ip`.
    pub(super) fn on_rep(&mut self, ip: CmAddr, m: &Mad) -> bool {
        let rep = Rep::decode(m);
        let Some(i) = self.conns.by_local(rep.remote_comm_id) else {
            return false;
        };
        let c = &self.conns[i];
        if c.peer_ip != ip || !c.active {
            return false;
        }
        if c.st == St::Established && c.remote_id == rep.local_comm_id {
            // A duplicate: the RTU was lost.
            let rtu = msg::encode_simple(
                attr::RTU,
                Ids {
                    local: c.local_id,
                    remote: c.remote_id,
                },
                &[],
                c.tid,
            );
            self.send(ip, &rtu);
            return true;
        }
        if c.st != St::ReqSent {
            return false;
        }
        let reject = |reason: u16, c: &Conn<'_, P>| {
            Rej {
                ids: Ids {
                    local: c.local_id,
                    remote: rep.local_comm_id,
                },
                rejected: about::REP,
                ari_len: 0,
                reason,
                private: Private::empty(),
            }
            .encode(c.tid)
        };
        // Stale: the REP names a QP of a connection this side holds up.
        let stale = self.conns.iter().any(|o| {
            matches!(o.st, St::Established | St::DreqSent)
                && o.remote_qpn == rep.local_qpn
                && o.remote_guid == rep.local_ca_guid
                && o.peer_ip == ip
        });
        if stale {
            let r = reject(reason::STALE_CONN, c);
            self.send(ip, &r);
            self.fail(i, Failure::Stale);
            return true;
        }
        // The peer's address came in a REQ this side sent: it has an address of its family.
        let Some((sgid_index, _)) = self.local_for(ip) else {
            return false;
        };
        let Some(qp) = self.conns[i].qp.take() else {
            return false;
        };
        let c = &self.conns[i];
        let (resp, init) = c.depths;
        let (retry, _) = c.retries;
        let remote = Endpoint {
            qpn: rep.local_qpn,
            gid: ip.gid(),
            psn: rep.starting_psn,
            mtu: self.mtu,
        };
        let opts = self.qp_options(
            sgid_index,
            resp.min(rep.initiator_depth),
            init.min(rep.responder_resources),
            retry,
            rep.rnr_retry_count,
            flow_label(c.ports.0, c.ports.1),
        );
        match qp.handshake_with(&remote, &opts) {
            Ok(q) => {
                let c = &mut self.conns[i];
                c.remote_id = rep.local_comm_id;
                c.remote_qpn = rep.local_qpn;
                c.remote_guid = rep.local_ca_guid;
                c.st = St::Established;
                c.timer.stop();
                c.private = rep.private;
                c.ready = Some(q);
                c.pending |= pend::ESTABLISHED;
                let rtu = msg::encode_simple(
                    attr::RTU,
                    Ids {
                        local: c.local_id,
                        remote: c.remote_id,
                    },
                    &[],
                    c.tid,
                );
                self.send(ip, &rtu);
            }
            Err((q, e)) => {
                let r = reject(reason::CONSUMER, &self.conns[i]);
                self.send(ip, &r);
                let c = &mut self.conns[i];
                c.qp = Some(q);
                c.fail(Failure::Qp(e));
            }
        }
        true
    }

    /// Asks which QP serves UD port `port` at `dst`, IPv4 or IPv6 (SIDR_REQ, with rdma_cm's
    /// header and
    /// `private_data`, at most 180 bytes); the answer comes as
    /// [`CmEvent::SidrResolved`](super::CmEvent).
    ///
    /// # Errors
    ///
    /// [`CmError::PrivateDataTooLong`], [`CmError::TableFull`], [`CmError::NoAddress`] (no
    /// address of `dst`'s family on this side).
    pub fn sidr_resolve(
        &mut self,
        dst: impl Into<CmAddr>,
        port: u16,
        private_data: &[u8],
    ) -> Result<ConnId, CmError> {
        let dst = dst.into();
        if private_data.len() > SIDR_USER_DATA {
            return Err(CmError::PrivateDataTooLong(SIDR_USER_DATA));
        }
        let (_, me) = self.local_for(dst).ok_or(CmError::NoAddress)?;
        let i = self.conns.free().ok_or(CmError::TableFull)?;
        let local_id = self.new_id();
        let src_port = self.ephemeral_port();
        let mut private = [0u8; pdata::SIDR_REQ];
        private[..CMA_HDR].copy_from_slice(&msg::cma_header(src_port, me, dst));
        private[CMA_HDR..CMA_HDR + private_data.len()].copy_from_slice(private_data);
        let tid = self.tid_for(local_id);
        let m = SidrReq {
            request_id: local_id,
            pkey: 0xFFFF,
            service_id: msg::service_id(msg::PS_UDP, port),
            private: Private {
                bytes: private,
                len: pdata::SIDR_REQ,
            },
        }
        .encode(tid);
        let now = self.clock.now_us();
        let c = &mut self.conns[i];
        *c = Conn::idle();
        c.st = St::SidrReqSent;
        c.active = true;
        c.local_id = local_id;
        c.peer_ip = dst;
        c.ports = (src_port, port);
        c.tid = tid;
        c.born = now;
        c.out = m;
        c.timer = Timer::arm(
            now,
            timeout_us(self.cfg.response_timeout),
            self.cfg.max_retries,
        );
        self.send(dst, &m);
        Ok(ConnId(local_id))
    }

    /// A SIDR_REP from `ip`.
    pub(super) fn on_sidr_rep(&mut self, ip: CmAddr, m: &Mad) -> bool {
        let r = SidrRep::decode(m);
        let Some(i) = self.conns.by_local(r.request_id) else {
            return false;
        };
        let c = &mut self.conns[i];
        if c.st != St::SidrReqSent || c.peer_ip != ip {
            return false;
        }
        c.sidr = if r.status == sidr_status::OK {
            Ok((r.qpn, r.qkey))
        } else {
            Err(r.status)
        };
        c.private = Private::from_slice(&r.private.bytes);
        c.pending |= pend::SIDR_RESOLVED;
        c.close();
        true
    }

    /// A SIDR_REQ that went unanswered.
    pub(super) fn sidr_timed_out(&mut self, i: usize) {
        let c = &mut self.conns[i];
        c.sidr = Err(SIDR_TIMEOUT);
        c.pending |= pend::SIDR_RESOLVED;
        c.close();
    }
}

/// The flow label rdma_cm gives a RoCEv2 connection from its two ports.
pub(super) fn flow_label(src_port: u16, dst_port: u16) -> u32 {
    (u32::from(src_port)
        .wrapping_mul(31)
        .wrapping_add(u32::from(dst_port)))
        & 0xF_FFFF
}
