//! `ucmatose` (RC SENDs both ways over a CM connection) and `udaddy` (UD datagrams to a
//! service resolved through SIDR), librdmacm-utils' `cmatose.c` and `udaddy.c`:
//!
//! - ucmatose: port 7471, `-C` messages of `-S` bytes (10 of 100). The server, once the
//!   connection is up, SENDs its messages, then takes the client's; the client takes the
//!   server's, then SENDs as many back. Both send from one buffer and receive into it, so the
//!   server sends the same bytes each time (whatever its buffer held) and the client's answers
//!   are the server's last message. The server disconnects.
//! - udaddy: port 7174 in rdma_cm's UDP port space, Q_Key 0x01234567. The client SENDs
//!   its messages WITH_IMM (the immediate is its QPN: the server answers there), the server
//!   answers each one from the start of its receive buffer: the last datagram's 40-byte GRH
//!   area, then the first `-S` − 40 bytes of its payload.

use bareverbs::cm::msg::UDP_QKEY;
use bareverbs::cm::{AcceptParams, CmEvent, ConnectParams, Service};
use bareverbs::hal::Clock;
use bareverbs::verbs::*;

use super::{CaseError, CmCase, Done, RECV_BASE, RETRY_MS, SEND_BASE, Seen, Session};
use crate::Step;
use crate::peer::grh_ok;

/// ucmatose's port.
pub const UCMATOSE_PORT: u16 = 7471;
/// udaddy's port.
pub const UDADDY_PORT: u16 = 7174;
/// The GID index of the device's IPv4-mapped GID.
const GID_INDEX: u32 = 1;
/// The GRH area in front of a UD receive.
const GRH: u32 = 40;
/// SIDR_REP status "no such service": Linux's udaddy is not listening yet.
const SIDR_UNSUPPORTED: u8 = 1;

/// Bytes of a message slot in the region: room for the GRH area and the message.
pub(super) fn slot(size: u32) -> u32 {
    (size + GRH).next_multiple_of(64)
}

/// Byte `j` of message `i` this side sends.
fn pattern(i: u32, j: usize) -> u8 {
    (i as usize * 31 + j * 7 + 3) as u8
}

impl<'a, P: Provider, C: Clock> Session<'_, 'a, P, C> {
    /// Message slot `i` (receives first, then the one send buffer at `count`).
    fn at(&self, i: u32, size: u32) -> u32 {
        i * slot(size)
    }

    /// Posts one receive per message, each into its own slot (`len` bytes).
    fn post_recvs<T: Transport>(
        &mut self,
        qp: &mut QueuePair<'a, P, T, Rts>,
        count: u32,
        size: u32,
        len: u32,
    ) -> Result<(), CaseError> {
        for i in 0..count {
            let sge = self.mr.sge(self.at(i, size), len).at("cm: sge")?;
            // SAFETY: the region outlives the QP (destroyed first on every path of the
            // case); the CPU reads a slot only after its receive completed.
            unsafe {
                let mut r = qp.recv_batch();
                r.recv(RECV_BASE + u64::from(i), &[sge])
                    .at("cm: post receive")?;
                r.finish();
            }
        }
        Ok(())
    }

    /// Waits for every receive (in any order) and every send (`sends`) of the case.
    fn wait_all(
        &mut self,
        count: u32,
        recvs: bool,
        sends: bool,
        what: &'static str,
    ) -> Result<[Option<Seen>; super::MAX_MESSAGES as usize], CaseError> {
        let mut got = [None; super::MAX_MESSAGES as usize];
        for i in 0..count {
            if sends {
                self.wait(SEND_BASE + u64::from(i), what)?;
            }
            if recvs {
                got[i as usize] = Some(self.wait(RECV_BASE + u64::from(i), what)?);
            }
        }
        Ok(got)
    }

    /// Fills the send buffer with message `i`'s pattern.
    fn fill_send(&mut self, case: &CmCase, i: u32) {
        let at = self.at(case.count, case.size) as usize;
        let buf = &mut self.mr.as_mut_slice()[at..at + case.size as usize];
        for (j, b) in buf.iter_mut().enumerate() {
            *b = pattern(i, j);
        }
    }

    fn slot_bytes(&self, i: u32, size: u32, len: u32) -> &[u8] {
        let at = self.at(i, size) as usize;
        &self.mr.as_slice()[at..at + len as usize]
    }

    /// The unikernel as ucmatose's client (Linux runs `ucmatose`).
    pub(super) fn ucmatose_client(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: [u8; 4],
        case: &CmCase,
    ) -> Result<Done, CaseError> {
        let qp = self.qp(pd)?;
        let (mut rts, connect_ms) = self.connect_retrying(qp, linux, UCMATOSE_PORT)?;
        let r = self.ucmatose_client_messages(&mut rts, case);
        // The server disconnects once it has our answers.
        let r = r.and_then(|checked| {
            while !self.disconnected {
                let _ = self.cm_event();
                if self.now() > self.deadline {
                    return Err(CaseError::Deadline("the server's DREQ"));
                }
            }
            Ok(checked)
        });
        let qp = rts.to_error().at("cm: QP to ERROR")?;
        self.drain();
        qp.destroy().at("cm: destroy QP")?;
        Ok(Done {
            count: case.count,
            unit: "messages",
            size: case.size,
            checked: r?,
            connect_ms,
        })
    }

    fn ucmatose_client_messages(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
    ) -> Result<u64, CaseError> {
        let (count, size) = (case.count, case.size);
        self.post_recvs(qp, count, size, size)?;
        let got = self.wait_all(count, true, false, "the server's messages")?;
        let checked = self.check_same(&got, case)?;
        // As many back, each signaled.
        self.fill_send(case, 0);
        let sge = self.mr.sge(self.at(count, size), size).at("cm: sge")?;
        // SAFETY: as in `post_recvs`; the send buffer is not written until the sends completed.
        unsafe {
            let mut s = qp.send_batch();
            for i in 0..count {
                s.send(SEND_BASE + u64::from(i), SendFlags::SIGNALED, &[sge])
                    .at("cm: post SEND")?;
            }
            s.finish();
        }
        self.wait_all(count, false, true, "our messages' completions")?;
        Ok(checked)
    }

    /// ucmatose's server sends one buffer `count` times: every message has `size` bytes and
    /// the first one's bytes.
    fn check_same(
        &self,
        got: &[Option<Seen>; super::MAX_MESSAGES as usize],
        case: &CmCase,
    ) -> Result<u64, CaseError> {
        let (count, size) = (case.count, case.size);
        for (i, w) in got.iter().take(count as usize).enumerate() {
            let ok = w.is_some_and(|w| {
                w.byte_len == size
                    && w.opcode == WcOpcode::Recv
                    && !w.flags.contains(WcFlags::WITH_IMM)
            });
            if !ok {
                return Err(CaseError::Bytes {
                    what: "a message",
                    ping: i as u32,
                    at: u32::MAX,
                });
            }
            let first = self.slot_bytes(0, size, size);
            let this = self.slot_bytes(i as u32, size, size);
            if let Some(at) = first.iter().zip(this).position(|(a, b)| a != b) {
                return Err(CaseError::Bytes {
                    what: "a message (not the first one's bytes)",
                    ping: i as u32,
                    at: at as u32,
                });
            }
        }
        Ok(u64::from(count) * u64::from(size))
    }

    /// Connects `qp` to `port` at `linux`, again while nobody listens there (REJ "invalid
    /// service ID"); the QP in RTS and the milliseconds from the REQ that was answered to
    /// the connection being up.
    pub(super) fn connect_retrying(
        &mut self,
        qp: QueuePair<'a, P, Rc, Reset>,
        linux: [u8; 4],
        port: u16,
    ) -> Result<(QueuePair<'a, P, Rc, Rts>, u64), CaseError> {
        let mut qp = Some(qp);
        loop {
            let Some(q) = qp.take() else {
                return Err(CaseError::Deadline("a QP"));
            };
            let t_req = self.now();
            let id = self
                .cm
                .connect(q, linux, port, &ConnectParams::default())
                .map_err(|(_, e)| CaseError::Cm("connect", e))?;
            self.id = Some(id);
            let outcome = loop {
                match self.cm_event() {
                    Some(CmEvent::Established {
                        id: i, qp: Some(q), ..
                    }) if i == id => break Ok(q),
                    Some(CmEvent::Failed {
                        id: i, failure, qp, ..
                    }) if i == id => break Err((failure, qp)),
                    _ if self.now() > self.deadline => {
                        return Err(CaseError::Deadline("the REP"));
                    }
                    _ => {}
                }
            };
            match outcome {
                Ok(q) => return Ok((q, self.now() - t_req)),
                Err((bareverbs::cm::Failure::Rejected { reason: 8 }, Some(q))) => {
                    qp = Some(q);
                    self.pause()?;
                }
                Err((failure, _)) => return Err(CaseError::Connect(failure)),
            }
        }
    }

    /// Waits a little (the CM polled) before trying again.
    fn pause(&mut self) -> Result<(), CaseError> {
        let until = self.now() + RETRY_MS;
        while self.now() < until.min(self.deadline) {
            let _ = self.cm_event();
        }
        if self.now() > self.deadline {
            return Err(CaseError::Deadline("a listening Linux server"));
        }
        Ok(())
    }

    /// The unikernel as ucmatose's server (Linux runs `ucmatose -s`).
    pub(super) fn ucmatose_server(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: [u8; 4],
        case: &CmCase,
    ) -> Result<Done, CaseError> {
        self.cm
            .listen(None, UCMATOSE_PORT, Service::Rc)
            .map_err(|e| CaseError::Cm("listen", e))?;
        let (req, t_req) = loop {
            match self.cm_event() {
                Some(CmEvent::ConnectRequest(r)) => break (r, self.now()),
                _ if self.now() > self.deadline => return Err(CaseError::Deadline("the REQ")),
                _ => {}
            }
        };
        self.id = Some(req.id);
        // ucmatose's request: depths 1/1, retry count 5, RNR retry 0, no private data.
        let checks = [
            (req.src_ip == linux, "source address"),
            (req.dst_port == UCMATOSE_PORT, "port"),
            (
                (req.responder_resources, req.initiator_depth) == (1, 1),
                "depths",
            ),
            ((req.retry_count, req.rnr_retry_count) == (5, 0), "retries"),
            (
                req.private_data.as_slice().iter().all(|&b| b == 0),
                "private data",
            ),
        ];
        if let Some((_, what)) = checks.iter().find(|(ok, _)| !ok) {
            let _ = self.cm.reject(req.id, &[]);
            return Err(CaseError::Request(what));
        }
        let qp = self.qp(pd)?;
        let mut rts = self
            .cm
            .accept(req.id, qp, &AcceptParams::default())
            .map_err(|(_, e)| CaseError::Cm("accept", e))?;
        let r = self.ucmatose_server_messages(&mut rts, case);
        // ucmatose's server disconnects: the QP to ERROR, the DREQ, the client's DREP.
        let mut r = r.and_then(|checked| {
            if let Some(id) = self.id {
                self.cm
                    .disconnect(id)
                    .map_err(|e| CaseError::Cm("disconnect", e))?;
            }
            Ok(checked)
        });
        let qp = rts.to_error().at("cm: QP to ERROR")?;
        while r.is_ok() && !self.disconnected {
            let _ = self.cm_event();
            if self.now() > self.deadline {
                r = Err(CaseError::Deadline("the DREP"));
            }
        }
        self.drain();
        qp.destroy().at("cm: destroy QP")?;
        let checked = r?;
        let up = self.established.ok_or(CaseError::Deadline("the RTU"))?;
        Ok(Done {
            count: case.count,
            unit: "messages",
            size: case.size,
            checked,
            connect_ms: up - t_req,
        })
    }

    fn ucmatose_server_messages(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
    ) -> Result<u64, CaseError> {
        let (count, size) = (case.count, case.size);
        self.post_recvs(qp, count, size, size)?;
        // Linux's server sends once the connection is established (the RTU): so does this one.
        while self.established.is_none() {
            self.poll_once("the RTU")?;
        }
        // Each message its own pattern, one after the other from the one send buffer; the
        // client answers with the last one.
        for i in 0..count {
            self.fill_send(case, i);
            let sge = self.mr.sge(self.at(count, size), size).at("cm: sge")?;
            // SAFETY: as in `post_recvs`; the buffer is written again only after the
            // send's completion.
            unsafe {
                let mut s = qp.send_batch();
                s.send(SEND_BASE + u64::from(i), SendFlags::SIGNALED, &[sge])
                    .at("cm: post SEND")?;
                s.finish();
            }
            self.wait(SEND_BASE + u64::from(i), "a SEND's completion")?;
        }
        let got = self.wait_all(count, true, false, "the client's answers")?;
        let checked = self.check_same(&got, case)?;
        // The answers are the client's buffer after our last message landed in it.
        let first = self.slot_bytes(0, size, size);
        if let Some(at) = (0..size as usize).find(|&j| first[j] != pattern(count - 1, j)) {
            return Err(CaseError::Bytes {
                what: "the client's answer (not our last message)",
                ping: 0,
                at: at as u32,
            });
        }
        Ok(checked)
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
        (linux, qpn): ([u8; 4], u32),
        imm: Option<u32>,
        case: &CmCase,
    ) -> Result<(), CaseError> {
        let mut av = AddressVector::new(Gid::from_ipv4(linux), GID_INDEX as u8);
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
        &self,
        w: Option<Seen>,
        i: u32,
        case: &CmCase,
        (linux, qpn): ([u8; 4], Option<u32>),
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
        let grh = self.slot_bytes(i, case.size, GRH);
        let me = Gid::from_ipv4(self.cm.ip());
        if !grh_ok(grh, &Gid::from_ipv4(linux), &me) {
            return Err(bad("a datagram's GRH area"));
        }
        Ok(w.src_qp)
    }

    /// The unikernel as udaddy's client (Linux runs `udaddy`).
    pub(super) fn udaddy_client(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: [u8; 4],
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
        linux: [u8; 4],
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
        let got = self.wait_all(case.count, true, false, "the server's answers")?;
        for (i, w) in got.iter().take(case.count as usize).enumerate() {
            self.check_datagram(*w, i as u32, case, (linux, Some(qpn)))?;
        }
        // Each answer is the start of the server's receive buffer after our last datagram:
        // its GRH area (from us to the server), then our last message.
        let size = case.size;
        let us = Gid::from_ipv4(self.cm.ip());
        for i in 0..case.count {
            let m = self.slot_bytes(i, size, size + GRH);
            let body = &m[GRH as usize..];
            let head = GRH.min(size) as usize;
            let area_ok = head < GRH as usize || grh_ok(&body[..head], &us, &Gid::from_ipv4(linux));
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
        })
    }

    /// The unikernel as udaddy's server (Linux runs `udaddy -s`).
    pub(super) fn udaddy_server(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: [u8; 4],
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
        linux: [u8; 4],
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
        if req.src_ip != linux || req.dst_port != UDADDY_PORT {
            return Err(CaseError::Request("SIDR_REQ's address or port"));
        }
        self.cm
            .sidr_reply(req.id, qp.qp_num(), UDP_QKEY, &[])
            .map_err(|e| CaseError::Cm("SIDR reply", e))?;
        let t_up = self.now();
        let got = self.wait_all(case.count, true, false, "the client's datagrams")?;
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
        Ok(Done {
            count: case.count,
            unit: "datagrams",
            size,
            checked: u64::from(case.count) * u64::from(size + GRH),
            connect_ms: t_up - t_req,
        })
    }
}
