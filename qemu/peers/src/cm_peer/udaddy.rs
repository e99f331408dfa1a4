//! udaddy (UD datagrams to a service resolved through SIDR, librdmacm-utils' `udaddy.c`):
//!
//! port 7174 in rdma_cm's UDP port space, Q_Key 0x01234567. The client SENDs its messages
//! WITH_IMM (the immediate is its QPN: the server answers there), the server answers each
//! one from the start of its receive buffer: the last datagram's 40-byte GRH area, then the
//! first `-S` − 40 bytes of its payload.

use bareverbs::cm::msg::UDP_QKEY;
use bareverbs::cm::{CmAddr, CmEvent, Service};
use bareverbs::hal::Clock;
use bareverbs::verbs::*;

use super::cmatose::{GRH, pattern};
use super::{CaseError, CmCase, Done, SEND_BASE, Seen, Session};
use crate::Step;
use crate::peer::grh_ok;

/// udaddy's port.
pub const UDADDY_PORT: u16 = 7174;
/// How long the UD service keeps the NIC going after its last answer (ms).
pub(super) const LINGER_MS: u64 = 200;
/// SIDR_REP status "no such service": Linux's udaddy is not listening yet.
pub(super) const SIDR_UNSUPPORTED: u8 = 1;

impl<'a, P: Provider, C: Clock> Session<'_, 'a, P, C> {
    /// This side's GID index and address towards `linux` (of its family).
    pub(super) fn me(&mut self, linux: CmAddr) -> Result<(u32, CmAddr), CaseError> {
        self.cm
            .local_for(linux)
            .ok_or(CaseError::Request("an address of the peer's family"))
    }

    /// A UD QP with rdma_cm's Q_Key, and one receive per message (with its GRH area).
    fn ud_qp(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        case: &CmCase,
    ) -> Result<QueuePair<'a, P, Ud, Rts>, CaseError> {
        let caps = QpCaps {
            max_send_wr: super::MAX_MESSAGES,
            max_recv_wr: super::MAX_MESSAGES,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd
            .qp_builder(self.cq, self.cq)
            .caps(caps)
            .build::<Ud>()
            .at("cm: create UD QP")?;
        let mut qp = qp.ready(UDP_QKEY, 0).at("cm: UD QP to RTS")?;
        self.post_recvs(&mut qp, case.count, case.size, case.size + GRH)?;
        Ok(qp)
    }

    /// Sends the case's messages to QP `qpn` at `linux` (each its own pattern, WITH_IMM
    /// carrying `imm`), one after the other.
    fn ud_sends(
        &mut self,
        qp: &mut QueuePair<'a, P, Ud, Rts>,
        pd: &'a ProtectionDomain<'a, P>,
        (linux, qpn): (CmAddr, u32),
        imm: Option<u32>,
        case: &CmCase,
    ) -> Result<(), CaseError> {
        let (index, _) = self.me(linux)?;
        let mut av = AddressVector::new(linux.gid(), index as u8);
        av.hop_limit = 64;
        let ah = pd.create_ah(&av).at("cm: create AH")?;
        for i in 0..case.count {
            self.fill_send(case, i);
            let sge = self
                .mr
                .sge(self.at(case.count, case.size), case.size)
                .at("cm: sge")?;
            let id = SEND_BASE + u64::from(i);
            // SAFETY: as in `post_recvs`; the buffer is written again only after the send's
            // completion.
            unsafe {
                let mut s = qp.send_batch();
                match imm {
                    Some(v) => {
                        s.send_to_imm(id, SendFlags::SIGNALED, (&ah, qpn, UDP_QKEY), v, &[sge])
                    }
                    None => s.send_to(id, SendFlags::SIGNALED, (&ah, qpn, UDP_QKEY), &[sge]),
                }
                .at("cm: post UD SEND")?;
                s.finish();
            }
            self.wait(id, "a UD SEND's completion")?;
        }
        Ok(())
    }

    /// Checks a UD receive: its length, its GRH area (from `linux` to this side) and its
    /// sender (`qpn`, and the immediate when `imm`).
    fn check_datagram(
        &mut self,
        w: Option<Seen>,
        i: u32,
        case: &CmCase,
        (linux, qpn): (CmAddr, Option<u32>),
    ) -> Result<u32, CaseError> {
        let bad = |what| CaseError::Bytes {
            what,
            ping: i,
            at: u32::MAX,
        };
        let w = w.ok_or(bad("a datagram"))?;
        if w.byte_len != case.size + GRH || w.opcode != WcOpcode::Recv {
            return Err(bad("a datagram's length"));
        }
        if qpn.is_some_and(|q| q != w.src_qp) {
            return Err(bad("a datagram's source QP"));
        }
        let (_, me) = self.me(linux)?;
        let grh = self.slot_bytes(i, case.size, GRH);
        if !grh_ok(grh, &linux.gid(), &me.gid()) {
            return Err(bad("a datagram's GRH area"));
        }
        Ok(w.src_qp)
    }

    /// The unikernel as udaddy's client (Linux runs `udaddy`).
    pub(super) fn udaddy_client(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: CmAddr,
        case: &CmCase,
    ) -> Result<Done, CaseError> {
        let mut qp = self.ud_qp(pd, case)?;
        let r = self.udaddy_client_messages(&mut qp, pd, linux, case);
        self.drain();
        qp.destroy().at("cm: destroy UD QP")?;
        r
    }

    fn udaddy_client_messages(
        &mut self,
        qp: &mut QueuePair<'a, P, Ud, Rts>,
        pd: &'a ProtectionDomain<'a, P>,
        linux: CmAddr,
        case: &CmCase,
    ) -> Result<Done, CaseError> {
        let (qpn, connect_ms) = loop {
            let t_req = self.now();
            let id = self
                .cm
                .sidr_resolve(linux, UDADDY_PORT, &[])
                .map_err(|e| CaseError::Cm("SIDR", e))?;
            let result = loop {
                match self.cm_event() {
                    Some(CmEvent::SidrResolved { id: i, result, .. }) if i == id => break result,
                    _ if self.now() > self.deadline => {
                        return Err(CaseError::Deadline("the SIDR_REP"));
                    }
                    _ => {}
                }
            };
            match result {
                Ok((qpn, UDP_QKEY)) => break (qpn, self.now() - t_req),
                Ok(_) => return Err(CaseError::Request("Q_Key in the SIDR_REP")),
                Err(SIDR_UNSUPPORTED) => self.pause()?,
                Err(_) => return Err(CaseError::Request("SIDR_REP status")),
            }
        };
        // udaddy's client: every message WITH_IMM, the immediate our QPN.
        let me = qp.qp_num();
        self.ud_sends(qp, pd, (linux, qpn), Some(me), case)?;
        let got = self.wait_all(case.count, "the server's answers")?;
        for (i, w) in got.iter().take(case.count as usize).enumerate() {
            self.check_datagram(*w, i as u32, case, (linux, Some(qpn)))?;
        }
        // Each answer is the start of the server's receive buffer after our last datagram:
        // its GRH area (from us to the server), then our last message.
        let size = case.size;
        let (_, us) = self.me(linux)?;
        let us = us.gid();
        for i in 0..case.count {
            let m = self.slot_bytes(i, size, size + GRH);
            let body = &m[GRH as usize..];
            let head = GRH.min(size) as usize;
            let area_ok = head < GRH as usize || grh_ok(&body[..head], &us, &linux.gid());
            let rest = body.get(head..).unwrap_or(&[]);
            let wrong = rest
                .iter()
                .enumerate()
                .position(|(j, &b)| b != pattern(case.count - 1, j));
            if !area_ok || wrong.is_some() {
                return Err(CaseError::Bytes {
                    what: "the server's answer (not our last datagram)",
                    ping: i,
                    at: wrong.map_or(0, |j| (j + head) as u32),
                });
            }
        }
        Ok(Done {
            count: case.count,
            unit: "datagrams",
            size,
            checked: u64::from(case.count) * u64::from(size + GRH),
            connect_ms,
            how: super::EVERY_BYTE,
        })
    }

    /// The unikernel as udaddy's server (Linux runs `udaddy -s`).
    pub(super) fn udaddy_server(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: CmAddr,
        case: &CmCase,
    ) -> Result<Done, CaseError> {
        self.cm
            .listen(None, UDADDY_PORT, Service::Ud)
            .map_err(|e| CaseError::Cm("listen", e))?;
        let mut qp = self.ud_qp(pd, case)?;
        let r = self.udaddy_server_messages(&mut qp, pd, linux, case);
        self.drain();
        qp.destroy().at("cm: destroy UD QP")?;
        r
    }

    fn udaddy_server_messages(
        &mut self,
        qp: &mut QueuePair<'a, P, Ud, Rts>,
        pd: &'a ProtectionDomain<'a, P>,
        linux: CmAddr,
        case: &CmCase,
    ) -> Result<Done, CaseError> {
        let (req, t_req) = loop {
            match self.cm_event() {
                Some(CmEvent::SidrRequest(r)) => break (r, self.now()),
                _ if self.now() > self.deadline => {
                    return Err(CaseError::Deadline("the SIDR_REQ"));
                }
                _ => {}
            }
        };
        if req.src_addr != linux || req.dst_port != UDADDY_PORT {
            return Err(CaseError::Request("SIDR_REQ's address or port"));
        }
        self.cm
            .sidr_reply(req.id, qp.qp_num(), UDP_QKEY, &[])
            .map_err(|e| CaseError::Cm("SIDR reply", e))?;
        let t_up = self.now();
        let got = self.wait_all(case.count, "the client's datagrams")?;
        let mut client = None;
        for (i, w) in got.iter().take(case.count as usize).enumerate() {
            let src = self.check_datagram(*w, i as u32, case, (linux, client))?;
            // The immediate names the client's QP, the one it sent from.
            if w.is_none_or(|w| !w.flags.contains(WcFlags::WITH_IMM) || w.imm != src) {
                return Err(CaseError::Bytes {
                    what: "a datagram's immediate",
                    ping: i as u32,
                    at: u32::MAX,
                });
            }
            client = Some(src);
        }
        let client = client.ok_or(CaseError::Deadline("the client's datagrams"))?;
        // The client sends one buffer each time: every payload is the first one's.
        let size = case.size;
        for i in 1..case.count {
            let first = &self.slot_bytes(0, size, size + GRH)[GRH as usize..];
            let this = &self.slot_bytes(i, size, size + GRH)[GRH as usize..];
            if let Some(at) = first.iter().zip(this).position(|(a, b)| a != b) {
                return Err(CaseError::Bytes {
                    what: "a datagram (not the first one's bytes)",
                    ping: i,
                    at: at as u32,
                });
            }
        }
        self.ud_sends(qp, pd, (linux, client), None, case)?;
        // A UD send completes once its frame is on the NIC's ring, not once it arrived; the
        // run may end right after this case, and QEMU, exiting, drops what its NIC had not
        // sent yet (seen in the lab: two of the ten answers reached Linux, whose udaddy
        // then waited for the others). Linger, as a socket does at close.
        self.linger(LINGER_MS);
        Ok(Done {
            count: case.count,
            unit: "datagrams",
            size,
            checked: u64::from(case.count) * u64::from(size + GRH),
            connect_ms: t_up - t_req,
            how: super::EVERY_BYTE,
        })
    }
}
