//! `ucmatose` (RC SENDs both ways over a CM connection, librdmacm-utils' `cmatose.c`), and
//! what the message cases share with `udaddy` (`udaddy.rs`):
//!
//! - ucmatose: port 7471, `-C` messages of `-S` bytes (10 of 100). The server, once the
//!   connection is up, SENDs its messages, then takes the client's; the client takes the
//!   server's, then SENDs as many back. Both send from one buffer and receive into it, so the
//!   server sends the same bytes each time (whatever its buffer held) and the client's answers
//!   are the server's last message. The server disconnects.

use bareverbs::cm::{CmAddr, CmEvent, ConnectParams};
use bareverbs::hal::Clock;
use bareverbs::verbs::*;

use super::{CaseError, CmCase, Done, RECV_BASE, RETRY_MS, SEND_BASE, Seen, Session};
use crate::Step;

/// ucmatose's port.
pub const UCMATOSE_PORT: u16 = 7471;
/// The GRH area in front of a UD receive.
pub(super) const GRH: u32 = 40;

/// Bytes of a message slot in the region: room for the GRH area and the message.
pub(super) fn slot(size: u32) -> u32 {
    (size + GRH).next_multiple_of(64)
}

/// Byte `j` of message `i` this side sends.
pub(super) fn pattern(i: u32, j: usize) -> u8 {
    (i as usize * 31 + j * 7 + 3) as u8
}

impl<'a, P: Provider, C: Clock> Session<'_, 'a, P, C> {
    /// Message slot `i` (receives first, then the one send buffer at `count`).
    pub(super) fn at(&self, i: u32, size: u32) -> u32 {
        i * slot(size)
    }

    /// Posts one receive per message, each into its own slot (`len` bytes).
    pub(super) fn post_recvs<T: Transport>(
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

    /// Waits for every receive of the case (in any order).
    pub(super) fn wait_all(
        &mut self,
        count: u32,
        what: &'static str,
    ) -> Result<[Option<Seen>; super::MAX_MESSAGES as usize], CaseError> {
        let mut got = [None; super::MAX_MESSAGES as usize];
        for i in 0..count {
            got[i as usize] = Some(self.wait(RECV_BASE + u64::from(i), what)?);
        }
        Ok(got)
    }

    /// Fills the send buffer with message `i`'s pattern.
    pub(super) fn fill_send(&mut self, case: &CmCase, i: u32) {
        let at = self.at(case.count, case.size) as usize;
        let buf = &mut self.mr.as_mut_slice()[at..at + case.size as usize];
        for (j, b) in buf.iter_mut().enumerate() {
            *b = pattern(i, j);
        }
    }

    pub(super) fn slot_bytes(&self, i: u32, size: u32, len: u32) -> &[u8] {
        let at = self.at(i, size) as usize;
        &self.mr.as_slice()[at..at + len as usize]
    }

    /// The unikernel as ucmatose's client (Linux runs `ucmatose`).
    pub(super) fn ucmatose_client(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: CmAddr,
        case: &CmCase,
    ) -> Result<Done, CaseError> {
        let qp = self.qp(pd)?;
        let (mut rts, connect_ms) = self.connect_retrying(qp, linux, UCMATOSE_PORT)?;
        let r = self.ucmatose_client_messages(&mut rts, case);
        // The server disconnects once it has our answers.
        let r = r.and_then(|checked| {
            self.wait_disconnected("the server's DREQ")?;
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
            how: super::EVERY_BYTE,
        })
    }

    fn ucmatose_client_messages(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
    ) -> Result<u64, CaseError> {
        let (count, size) = (case.count, case.size);
        self.post_recvs(qp, count, size, size)?;
        let got = self.wait_all(count, "the server's messages")?;
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
        // The server disconnects once it has them all: its DREQ may come before their
        // completions here.
        for i in 0..count {
            let id = SEND_BASE + u64::from(i);
            if !self.wait_unless_disconnected(id, "our messages' completions")? {
                break;
            }
        }
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
        linux: CmAddr,
        port: u16,
    ) -> Result<(QueuePair<'a, P, Rc, Rts>, u64), CaseError> {
        self.connect_retrying_with(qp, linux, port, &ConnectParams::default())
    }

    /// [`Self::connect_retrying`] with `params` in the REQ.
    pub(super) fn connect_retrying_with(
        &mut self,
        qp: QueuePair<'a, P, Rc, Reset>,
        linux: impl Into<CmAddr>,
        port: u16,
        params: &ConnectParams<'_>,
    ) -> Result<(QueuePair<'a, P, Rc, Rts>, u64), CaseError> {
        let linux = linux.into();
        let mut qp = Some(qp);
        loop {
            let Some(q) = qp.take() else {
                return Err(CaseError::Deadline("a QP"));
            };
            let t_req = self.now();
            let id = self
                .cm
                .connect(q, linux, port, params)
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
    pub(super) fn pause(&mut self) -> Result<(), CaseError> {
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
        linux: CmAddr,
        case: &CmCase,
    ) -> Result<Done, CaseError> {
        // ucmatose's request: depths 1/1, retry count 5, RNR retry 0, no private data.
        let (mut rts, t_req) = self.accept_checked(pd, linux, UCMATOSE_PORT, (5, 0))?;
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
            how: super::EVERY_BYTE,
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
        let got = self.wait_all(count, "the client's answers")?;
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
}
