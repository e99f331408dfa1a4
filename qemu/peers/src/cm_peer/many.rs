//! `ucmatose -c N` and `udaddy -c N`: several connections at once, each with its own QP and
//! message slots.
//!
//! librdmacm-utils' `cmatose.c` (rdma-core 44) with `-c N` makes N connections to port 7471
//! before it sends anything. Its server waits until every connection is up, then SENDs its
//! `-C` messages on each, waits for their completions, takes as many answers on each, and
//! disconnects every connection. Its client waits for every connection's messages, then
//! answers on each and waits for the server's DREQs. A request beyond the server's N is
//! rejected.
//!
//! `udaddy.c` with `-c N` makes N UD endpoints, each its own QP: its client resolves each
//! one's service through its own SIDR_REQ (port 7174, every answer naming another of the
//! server's QPs), then SENDs its `-C` datagrams on each and takes as many answers on each;
//! its server answers every SIDR_REQ with a new QP, waits for every endpoint's datagrams,
//! then answers on each from that QP. Both sides SEND WITH_IMM, the immediate the sending
//! QP's number (the server answers there). Nothing is
//! disconnected. There is no SIDR refusal in bareverbs' CM: a SIDR_REQ beyond `-c` is left
//! unanswered (Linux's timer gives up).
//!
//! Here the unikernel plays either side, with at most [`MAX_CONNS`] connections: every
//! connection has its own QP, its own receive slots (one per message) and its own send slot
//! in one region; one CQ takes every completion, told apart by the work request's ID (the
//! connection and the message). Every message is checked, on every connection, as the single
//! connection's case checks it (`cmatose.rs`); as the server the unikernel sends each
//! connection its own patterns, so an answer that comes back on another connection shows.

use bareverbs::Context;
use bareverbs::cm::msg::UDP_QKEY;
use bareverbs::cm::{
    AcceptParams, Cm, CmAddr, CmConfig, CmEvent, ConnId, ConnectParams, Failure as CmFailure,
    Service,
};
use bareverbs::hal::Clock;
use bareverbs::verbs::*;

use super::cmatose::{GRH, UCMATOSE_PORT, pattern, slot};
use super::cmtime::WINDOW;
use super::udaddy::{LINGER_MS, SIDR_UNSUPPORTED, UDADDY_PORT};
use super::{CaseError, CmCase, Done, MAX_MESSAGE, MAX_MESSAGES, Ms, Program, RETRY_MS};
use crate::Step;
use crate::peer::grh_ok;

/// Connections of a case, at most (`-c`).
pub const MAX_CONNS: u32 = 8;
/// The CM's entries: the lab's cases' one size ([`super::CONNS`], far more than every
/// connection and as many again for the ones a retried REQ or a TIME_WAIT holds).
const CM_CONNS: usize = super::CONNS;
const _: () = assert!(CM_CONNS >= 2 * MAX_CONNS as usize);
/// Work request IDs: the kind, the connection, the message.
const RECV: u64 = 0x1_0000;
const SEND: u64 = 0x2_0000;

/// A work request's ID.
fn wr_id(kind: u64, conn: usize, i: u32) -> u64 {
    kind | (conn as u64) << 8 | u64::from(i)
}

/// The kind, connection and message of a work request's ID; `None` for one this case never
/// posted.
fn wr_of(id: u64) -> Option<(u64, usize, u32)> {
    let kind = id & !0xFFFF;
    let conn = ((id >> 8) & 0xFF) as usize;
    let i = (id & 0xFF) as u32;
    ((kind == RECV || kind == SEND) && conn < MAX_CONNS as usize && i < MAX_MESSAGES)
        .then_some((kind, conn, i))
}

/// The pattern number of message `i` on connection `conn` (distinct for every message of the
/// case: at most 8 × 32).
fn pattern_no(conn: usize, i: u32) -> u32 {
    conn as u32 * MAX_MESSAGES + i
}

/// What a receive's completion brought.
#[derive(Clone, Copy)]
struct Got {
    byte_len: u32,
    /// A SEND's (not RDMA WRITE with immediate's).
    recv: bool,
    /// Its immediate, if it had one.
    imm: Option<u32>,
    src_qp: u32,
}

/// One connection of the case.
struct Conn<'a, P: Provider> {
    id: Option<ConnId>,
    qp: Option<QueuePair<'a, P, Rc, Rts>>,
    /// udaddy's endpoint.
    ud: Option<QueuePair<'a, P, Ud, Rts>>,
    /// udaddy: the peer's QP for this endpoint (from the SIDR_REP, or the client's immediate).
    remote: Option<u32>,
    /// Up: its REP (active side) or RTU (passive side) came.
    up: bool,
    /// Its DREQ came, or the answer to this side's.
    down: bool,
    got: [Option<Got>; MAX_MESSAGES as usize],
    sent: [bool; MAX_MESSAGES as usize],
}

impl<P: Provider> Default for Conn<'_, P> {
    fn default() -> Self {
        Conn {
            id: None,
            qp: None,
            ud: None,
            remote: None,
            up: false,
            down: false,
            got: [None; MAX_MESSAGES as usize],
            sent: [false; MAX_MESSAGES as usize],
        }
    }
}

/// Runs a `ucmatose -c N` or `udaddy -c N` case ([`Program::Many`]): the unikernel connects
/// (resolves) N times when Linux serves, else it serves N connections (endpoints).
pub(super) fn run<P: Provider>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    (linux, v6): ([u8; 4], bool),
    case: &CmCase,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
) -> Result<Done, CaseError> {
    let Program::Many {
        udaddy,
        linux_serves,
        conns,
    } = case.program
    else {
        return Err(CaseError::Request("a case of one connection"));
    };
    // What the parser lets through, again: the tables below are sized by these bounds.
    let bounded = (2..=MAX_CONNS).contains(&conns)
        && (1..=MAX_MESSAGES).contains(&case.count)
        && (1..=MAX_MESSAGE).contains(&case.size);
    if !bounded {
        return Err(CaseError::Request("-c, -C or -S beyond the peer's bounds"));
    }
    let n = conns as usize;
    let cm_cq = ctx.create_cq(32).at("cm: create CM CQ")?;
    // Every send and receive of every connection.
    let cq = ctx
        .create_cq(2 * conns * case.count + 4)
        .at("cm: create CQ")?;
    let per = (case.count + 1) * slot(case.size);
    let access = AccessFlags::LOCAL_WRITE;
    let mut mr = pd
        .register((conns * per) as usize, access)
        .at("cm: register")?;
    let mut cm: Cm<'_, P, Ms<'_>, CM_CONNS> =
        Cm::new(pd, &cm_cq, Ms(clock_ms), CmConfig::default())
            .map_err(|e| CaseError::Cm("CM over QP1", e))?;
    let linux = super::linux_addr(&cm, linux, v6)?;
    let mut conns: [Conn<'_, P>; MAX_CONNS as usize] = core::array::from_fn(|_| Conn::default());
    let mut m = Many {
        cm: &mut cm,
        pd,
        cq: &cq,
        mr: &mut mr,
        linux,
        case: *case,
        udaddy,
        ah: None,
        per,
        conns: &mut conns[..n],
        deadline,
        clock_ms,
    };
    let t0 = clock_ms();
    let r = match (udaddy, linux_serves) {
        (false, true) => m.client(),
        (false, false) => m.server(),
        (true, true) => m.ud_client(),
        (true, false) => m.ud_server(),
    };
    let up_ms = clock_ms() - t0;
    // Whatever happened: every QP still held goes (its work requests flushed first).
    for c in m.conns.iter_mut() {
        if let Some(q) = c.qp.take() {
            let _ = q.to_error().map(|q| q.destroy());
        }
        if let Some(q) = c.ud.take() {
            let _ = q.destroy();
        }
    }
    drop(m);
    let mut wcs = [WorkCompletion::default(); 8];
    while cq.poll(&mut wcs).unwrap_or(0) > 0 {}
    let (checked, up) = r?;
    Ok(Done {
        count: case.count,
        unit: if udaddy { "datagrams" } else { "messages" },
        size: case.size,
        checked,
        connect_ms: up.unwrap_or(up_ms),
        how: super::EVERY_BYTE,
    })
}

/// The case's state: the CM, the QPs' one CQ, the region, the connections.
struct Many<'s, 'a, P: Provider, C: Clock> {
    cm: &'s mut Cm<'a, P, C, CM_CONNS>,
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    mr: &'s mut MemoryRegion<'a, P>,
    /// Linux's address, IPv4 or IPv6 (the case's family).
    linux: CmAddr,
    case: CmCase,
    /// udaddy's case (UD), else ucmatose's (RC).
    udaddy: bool,
    /// udaddy: the address of Linux's endpoints.
    ah: Option<AddressHandle<'a, P>>,
    /// Bytes of a connection's part of the region.
    per: u32,
    conns: &'s mut [Conn<'a, P>],
    deadline: u64,
    clock_ms: &'s dyn Fn() -> u64,
}

impl<'a, P: Provider, C: Clock> Many<'_, 'a, P, C> {
    fn now(&self) -> u64 {
        (self.clock_ms)()
    }

    fn late(&self, what: &'static str) -> Result<(), CaseError> {
        if self.now() > self.deadline {
            return Err(CaseError::Deadline(what));
        }
        Ok(())
    }

    /// This side's GID index and address towards Linux (of its family).
    fn me(&mut self) -> Result<(u32, CmAddr), CaseError> {
        self.cm
            .local_for(self.linux)
            .ok_or(CaseError::Request("an address of the peer's family"))
    }

    fn conn_of(&self, id: ConnId) -> Option<usize> {
        self.conns.iter().position(|c| c.id == Some(id))
    }

    /// Where message slot `i` of connection `k` starts (its send slot: `i` = `-C`).
    fn at(&self, k: usize, i: u32) -> u32 {
        k as u32 * self.per + i * slot(self.case.size)
    }

    fn qp(&self) -> Result<QueuePair<'a, P, Rc, Reset>, CaseError> {
        let caps = QpCaps {
            max_send_wr: self.case.count,
            max_recv_wr: self.case.count,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        Ok(self
            .pd
            .qp_builder(self.cq, self.cq)
            .caps(caps)
            .build::<Rc>()
            .at("cm: create QP")?)
    }

    /// Posts connection `k`'s receives, one per message into its own slot (a UD one with its
    /// GRH area).
    fn post_recvs(&mut self, k: usize) -> Result<(), CaseError> {
        let len = self.case.size + if self.udaddy { GRH } else { 0 };
        for i in 0..self.case.count {
            let sge = self.mr.sge(self.at(k, i), len).at("cm: sge")?;
            let id = wr_id(RECV, k, i);
            let c = &mut self.conns[k];
            // SAFETY: the region outlives the QP (every QP goes before `run` returns); the CPU
            // reads a slot only after its receive completed.
            unsafe {
                if let Some(qp) = c.qp.as_mut() {
                    let mut r = qp.recv_batch();
                    r.recv(id, &[sge]).at("cm: post receive")?;
                    r.finish();
                } else if let Some(qp) = c.ud.as_mut() {
                    let mut r = qp.recv_batch();
                    r.recv(id, &[sge]).at("cm: post receive")?;
                    r.finish();
                } else {
                    return Err(CaseError::Request("a connection without its QP"));
                }
            }
        }
        Ok(())
    }

    /// A UD endpoint with rdma_cm's Q_Key, in RTS.
    fn ud_qp(&self) -> Result<QueuePair<'a, P, Ud, Rts>, CaseError> {
        let caps = QpCaps {
            max_send_wr: self.case.count,
            max_recv_wr: self.case.count,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = self
            .pd
            .qp_builder(self.cq, self.cq)
            .caps(caps)
            .build::<Ud>()
            .at("cm: create UD QP")?;
        Ok(qp.ready(UDP_QKEY, 0).at("cm: UD QP to RTS")?)
    }

    /// udaddy: the address handle of Linux's endpoints, made once.
    fn make_ah(&mut self) -> Result<(), CaseError> {
        if self.ah.is_none() {
            let (index, _) = self.me()?;
            let mut av = AddressVector::new(self.linux.gid(), index as u8);
            av.hop_limit = 64;
            self.ah = Some(self.pd.create_ah(&av).at("cm: create AH")?);
        }
        Ok(())
    }

    /// SENDs message `i` on connection `k` from its send slot, filled with pattern `no`.
    fn send(&mut self, k: usize, i: u32, no: u32) -> Result<(), CaseError> {
        let (size, count) = (self.case.size, self.case.count);
        let at = self.at(k, count) as usize;
        for (j, b) in self.mr.as_mut_slice()[at..at + size as usize]
            .iter_mut()
            .enumerate()
        {
            *b = pattern(no, j);
        }
        let sge = self.mr.sge(at as u32, size).at("cm: sge")?;
        let id = wr_id(SEND, k, i);
        let c = &mut self.conns[k];
        // SAFETY: as in `post_recvs`; the send slot is written again only after this SEND's
        // completion.
        unsafe {
            if let Some(qp) = c.qp.as_mut() {
                let mut s = qp.send_batch();
                s.send(id, SendFlags::SIGNALED, &[sge])
                    .at("cm: post SEND")?;
                s.finish();
            } else if let (Some(qp), Some(remote), Some(ah)) =
                (c.ud.as_mut(), c.remote, self.ah.as_ref())
            {
                // udaddy's SENDs are WITH_IMM, the immediate the sending QP's number.
                let me = qp.qp_num();
                let mut s = qp.send_batch();
                s.send_to_imm(id, SendFlags::SIGNALED, (ah, remote, UDP_QKEY), me, &[sge])
                    .at("cm: post UD SEND")?;
                s.finish();
            } else {
                return Err(CaseError::Request("a connection without its QP or peer"));
            }
        }
        Ok(())
    }

    /// Takes the completions there are; an error status, or one this case never posted,
    /// ends it.
    fn poll_cq(&mut self) -> Result<(), CaseError> {
        let mut wcs = [WorkCompletion::default(); 8];
        let got = self.cq.poll(&mut wcs).at("cm: poll CQ")?;
        for w in &wcs[..got] {
            let Some((kind, k, i)) = wr_of(w.wr_id).filter(|&(_, k, _)| k < self.conns.len())
            else {
                return Err(CaseError::Status(w.status, w.wr_id));
            };
            if w.status != WcStatus::Success {
                return Err(CaseError::Status(w.status, w.wr_id));
            }
            let c = &mut self.conns[k];
            if kind == RECV {
                c.got[i as usize] = Some(Got {
                    byte_len: w.byte_len,
                    recv: w.opcode == WcOpcode::Recv,
                    imm: w.flags.contains(WcFlags::WITH_IMM).then_some(w.imm),
                    src_qp: w.src_qp,
                });
            } else {
                c.sent[i as usize] = true;
            }
        }
        Ok(())
    }

    /// One CM event, its connection's state noted; `Err` for a failed connection.
    fn cm_event(&mut self) -> Result<Option<CmEvent<'a, P>>, CaseError> {
        let Some(ev) = self.cm.poll() else {
            return Ok(None);
        };
        match &ev {
            CmEvent::Established { id, qp: None, .. } => {
                if let Some(k) = self.conn_of(*id) {
                    self.conns[k].up = true;
                }
            }
            CmEvent::Disconnected { id } => {
                if let Some(k) = self.conn_of(*id) {
                    self.conns[k].down = true;
                }
            }
            _ => {}
        }
        Ok(Some(ev))
    }

    /// Waits until every connection's receives completed.
    fn wait_messages(&mut self, what: &'static str) -> Result<(), CaseError> {
        let count = self.case.count as usize;
        while !self
            .conns
            .iter()
            .all(|c| c.got[..count].iter().all(Option::is_some))
        {
            self.poll_cq()?;
            let _ = self.cm_event()?;
            if self.conns.iter().any(|c| c.down) {
                return Err(CaseError::Disconnected(what));
            }
            self.late(what)?;
        }
        Ok(())
    }

    /// Checks every connection's messages: `size` bytes each, every one the same bytes as its
    /// connection's first (a ucmatose sends one buffer again and again), and, when `answer`
    /// says so, those bytes this side's last message on that connection. The bytes checked.
    fn check(&self, answer: bool) -> Result<u64, CaseError> {
        let (size, count) = (self.case.size, self.case.count);
        for (k, c) in self.conns.iter().enumerate() {
            let first_at = self.at(k, 0) as usize;
            let first = &self.mr.as_slice()[first_at..first_at + size as usize];
            for i in 0..count {
                let index = k as u32 * count + i;
                if !c.got[i as usize]
                    .is_some_and(|g| g.recv && g.imm.is_none() && g.byte_len == size)
                {
                    return Err(CaseError::Bytes {
                        what: "a message (connection × -C + message)",
                        ping: index,
                        at: u32::MAX,
                    });
                }
                let at = self.at(k, i) as usize;
                let this = &self.mr.as_slice()[at..at + size as usize];
                if let Some(j) = first.iter().zip(this).position(|(a, b)| a != b) {
                    return Err(CaseError::Bytes {
                        what: "a message, not its connection's first one's bytes (connection × -C + message)",
                        ping: index,
                        at: j as u32,
                    });
                }
            }
            let last = pattern_no(k, count - 1);
            if answer && let Some(j) = (0..size as usize).find(|&j| first[j] != pattern(last, j)) {
                return Err(CaseError::Bytes {
                    what: "an answer, not our last message on its connection (connection)",
                    ping: k as u32,
                    at: j as u32,
                });
            }
        }
        Ok(u64::from(count) * u64::from(size) * self.conns.len() as u64)
    }

    /// The unikernel as ucmatose's client: connects every connection (at most [`WINDOW`]
    /// between REQ and REP, again while Linux does not listen yet), posts each one's receives
    /// as it comes up, takes every message, answers on each connection, and waits for the
    /// server's DREQs. The bytes checked and the milliseconds until every connection was up.
    fn client(&mut self) -> Result<(u64, Option<u64>), CaseError> {
        let n = self.conns.len();
        let t0 = self.now();
        let mut waiting_until = 0;
        while !self.conns.iter().all(|c| c.up) {
            self.late("the connections' REPs")?;
            let in_flight = self
                .conns
                .iter()
                .filter(|c| c.id.is_some() && !c.up)
                .count();
            let next = self.conns.iter().position(|c| c.id.is_none());
            if let Some(k) = next
                && in_flight < WINDOW
                && self.now() >= waiting_until
            {
                let q = self.qp()?;
                let id = self
                    .cm
                    .connect(q, self.linux, UCMATOSE_PORT, &ConnectParams::default())
                    .map_err(|(_, e)| CaseError::Cm("connect", e))?;
                self.conns[k].id = Some(id);
            }
            match self.cm_event()? {
                Some(CmEvent::Established {
                    id, qp: Some(q), ..
                }) => {
                    let k = self
                        .conn_of(id)
                        .ok_or(CaseError::Request("an unknown connection"))?;
                    self.conns[k].qp = Some(q);
                    self.conns[k].up = true;
                    self.post_recvs(k)?;
                }
                Some(CmEvent::Failed {
                    id,
                    failure: CmFailure::Rejected { reason: 8 },
                    ..
                }) if !self.conns.iter().any(|c| c.up) => {
                    // Nobody listens yet (before the first connection only): that one again,
                    // a little later (its QP, handed back, goes).
                    if let Some(k) = self.conn_of(id) {
                        self.conns[k].id = None;
                    }
                    waiting_until = self.now() + RETRY_MS;
                }
                Some(CmEvent::Failed { failure, .. }) => return Err(CaseError::Connect(failure)),
                _ => {}
            }
        }
        let up_ms = self.now() - t0;
        self.wait_messages("the server's messages")?;
        let checked = self.check(false)?;
        // As many answers on each connection, from its own send slot (all SENDs of one
        // connection share it: the same bytes each time, as ucmatose's).
        let count = self.case.count;
        for k in 0..n {
            for i in 0..count {
                self.send(k, i, pattern_no(k, 0))?;
            }
        }
        // The server disconnects once it has every answer: a connection's DREQ may come
        // before its SENDs' completions here (its rxe acknowledges lazily).
        while !self.conns.iter().all(|c| c.down) {
            self.poll_cq()?;
            let _ = self.cm_event()?;
            self.late("the server's DREQs")?;
        }
        Ok((checked, Some(up_ms)))
    }

    /// The unikernel as ucmatose's server: accepts `-c` requests from Linux (rejecting any
    /// other), posts each one's receives at once, and once every connection is up (its RTU)
    /// SENDs the messages on each, takes the answers, and disconnects every connection.
    fn server(&mut self) -> Result<(u64, Option<u64>), CaseError> {
        let n = self.conns.len();
        self.cm
            .listen(None, UCMATOSE_PORT, Service::Rc)
            .map_err(|e| CaseError::Cm("listen", e))?;
        let mut taken = 0;
        let mut first_req = None;
        while !self.conns.iter().all(|c| c.up) {
            self.late(if taken < n {
                "the requests"
            } else {
                "the RTUs"
            })?;
            self.poll_cq()?;
            if let Some(CmEvent::ConnectRequest(r)) = self.cm_event()? {
                // ucmatose's request: depths 1/1, retry count 5, RNR retry 0, no private
                // data; from Linux to ucmatose's port; and at most -c of them.
                let ok = r.src_addr == self.linux
                    && r.dst_port == UCMATOSE_PORT
                    && (r.responder_resources, r.initiator_depth) == (1, 1)
                    && (r.retry_count, r.rnr_retry_count) == (5, 0)
                    && r.private_data.as_slice().iter().all(|&b| b == 0);
                if !ok || taken == n {
                    let _ = self.cm.reject(r.id, &[]);
                    if !ok {
                        return Err(CaseError::Request("a request that is not ucmatose's"));
                    }
                    continue;
                }
                first_req.get_or_insert(self.now());
                let q = self.qp()?;
                let q = self
                    .cm
                    .accept(r.id, q, &AcceptParams::default())
                    .map_err(|(_, e)| CaseError::Cm("accept", e))?;
                self.conns[taken].id = Some(r.id);
                self.conns[taken].qp = Some(q);
                self.post_recvs(taken)?;
                taken += 1;
            }
            if self.conns.iter().any(|c| c.down) {
                return Err(CaseError::Disconnected("every RTU"));
            }
        }
        let up_ms = first_req.map(|t| self.now() - t);
        // Message i on every connection, then its completions, then the next: each its own
        // pattern (distinct per connection too).
        let count = self.case.count;
        for i in 0..count {
            for k in 0..n {
                self.send(k, i, pattern_no(k, i))?;
            }
            while !self.conns.iter().all(|c| c.sent[i as usize]) {
                self.poll_cq()?;
                let _ = self.cm_event()?;
                if self.conns.iter().any(|c| c.down) {
                    return Err(CaseError::Disconnected("a SEND's completion"));
                }
                self.late("a SEND's completion")?;
            }
        }
        self.wait_messages("the client's answers")?;
        let checked = self.check(true)?;
        // ucmatose's server disconnects every connection: the QP to ERROR, the DREQ.
        for k in 0..n {
            if let Some(q) = self.conns[k].qp.take() {
                q.to_error()
                    .at("cm: QP to ERROR")?
                    .destroy()
                    .at("cm: destroy QP")?;
            }
            if let Some(id) = self.conns[k].id {
                self.cm
                    .disconnect(id)
                    .map_err(|e| CaseError::Cm("disconnect", e))?;
            }
        }
        while !self.conns.iter().all(|c| c.down) {
            let _ = self.cm_event()?;
            self.late("the DREPs")?;
        }
        Ok((checked, up_ms))
    }
}

impl<'a, P: Provider, C: Clock> Many<'_, 'a, P, C> {
    /// Checks every endpoint's datagrams: `size` + GRH bytes each, a GRH area from Linux to
    /// this side, sent from one QP of Linux's per endpoint (a QP no other endpoint's), each
    /// one's payload the same as its endpoint's first (udaddy sends one buffer again and
    /// again), WITH_IMM, the immediate the sending QP's number. As the client (`answer`):
    /// from the QP the SIDR_REP named, each the server's receive buffer after our last
    /// datagram (its GRH area from us to the server, then our message); as the server, the
    /// sending QP is noted as the endpoint's peer. The bytes checked.
    fn check_ud(&mut self, answer: bool) -> Result<u64, CaseError> {
        let (size, count) = (self.case.size, self.case.count);
        let (linux, me) = (self.linux.gid(), self.me()?.1.gid());
        let n = self.conns.len();
        for k in 0..n {
            let mut src = if answer { self.conns[k].remote } else { None };
            for i in 0..count {
                let index = k as u32 * count + i;
                let bad = |what| CaseError::Bytes {
                    what,
                    ping: index,
                    at: u32::MAX,
                };
                let g = self.conns[k].got[i as usize].ok_or(bad("a datagram"))?;
                if !g.recv || g.byte_len != size + GRH {
                    return Err(bad("a datagram's length (endpoint × -C + datagram)"));
                }
                if src.is_some_and(|q| q != g.src_qp) {
                    return Err(bad("a datagram's source QP (endpoint × -C + datagram)"));
                }
                src = Some(g.src_qp);
                if g.imm != Some(g.src_qp) {
                    return Err(bad("a datagram's immediate (endpoint × -C + datagram)"));
                }
                let at = self.at(k, i) as usize;
                let m = &self.mr.as_slice()[at..at + (size + GRH) as usize];
                if !grh_ok(&m[..GRH as usize], &linux, &me) {
                    return Err(bad("a datagram's GRH area (endpoint × -C + datagram)"));
                }
                let body = &m[GRH as usize..];
                let wrong = if answer {
                    let head = GRH.min(size) as usize;
                    let area_ok = head < GRH as usize || grh_ok(&body[..head], &me, &linux);
                    let last = pattern_no(k, count - 1);
                    let wrong = body[head..]
                        .iter()
                        .enumerate()
                        .position(|(j, &b)| b != pattern(last, j))
                        .map(|j| j + head);
                    if area_ok { wrong } else { Some(0) }
                } else {
                    let f = self.at(k, 0) as usize + GRH as usize;
                    let first = &self.mr.as_slice()[f..f + size as usize];
                    first.iter().zip(body).position(|(a, b)| a != b)
                };
                if let Some(j) = wrong {
                    return Err(CaseError::Bytes {
                        what: if answer {
                            "an answer, not our last datagram on its endpoint (endpoint × -C + datagram)"
                        } else {
                            "a datagram, not its endpoint's first one's bytes (endpoint × -C + datagram)"
                        },
                        ping: index,
                        at: j as u32,
                    });
                }
            }
            if self.conns[..k]
                .iter()
                .any(|c| c.remote.is_some() && c.remote == src)
            {
                return Err(CaseError::Request("one of Linux's QPs for two endpoints"));
            }
            self.conns[k].remote = src;
        }
        Ok(u64::from(count) * u64::from(size + GRH) * n as u64)
    }

    /// Message `i` on every endpoint (each its own pattern), then their completions.
    fn ud_round(&mut self, i: u32) -> Result<(), CaseError> {
        for k in 0..self.conns.len() {
            self.send(k, i, pattern_no(k, i))?;
        }
        while !self.conns.iter().all(|c| c.sent[i as usize]) {
            self.poll_cq()?;
            let _ = self.cm_event()?;
            self.late("a UD SEND's completion")?;
        }
        Ok(())
    }

    /// The unikernel as udaddy's client: an endpoint per connection, its receives posted,
    /// its service resolved through its own SIDR_REQ (at most [`WINDOW`] at once, again while
    /// Linux does not listen yet); then the datagrams on every endpoint, and the answers.
    fn ud_client(&mut self) -> Result<(u64, Option<u64>), CaseError> {
        let n = self.conns.len();
        for k in 0..n {
            self.conns[k].ud = Some(self.ud_qp()?);
            self.post_recvs(k)?;
        }
        let t0 = self.now();
        let mut waiting_until = 0;
        while !self.conns.iter().all(|c| c.remote.is_some()) {
            self.late("the SIDR_REPs")?;
            let in_flight = self
                .conns
                .iter()
                .filter(|c| c.id.is_some() && c.remote.is_none())
                .count();
            let next = self.conns.iter().position(|c| c.id.is_none());
            if let Some(k) = next
                && in_flight < WINDOW
                && self.now() >= waiting_until
            {
                let id = self
                    .cm
                    .sidr_resolve(self.linux, UDADDY_PORT, &[])
                    .map_err(|e| CaseError::Cm("SIDR", e))?;
                self.conns[k].id = Some(id);
            }
            if let Some(CmEvent::SidrResolved { id, result, .. }) = self.cm_event()? {
                let k = self
                    .conn_of(id)
                    .ok_or(CaseError::Request("an unknown SIDR request"))?;
                match result {
                    Ok((qpn, UDP_QKEY)) => self.conns[k].remote = Some(qpn),
                    Ok(_) => return Err(CaseError::Request("Q_Key in the SIDR_REP")),
                    // Nobody listens yet (before the first answer only): again, later.
                    Err(SIDR_UNSUPPORTED) if !self.conns.iter().any(|c| c.remote.is_some()) => {
                        self.conns[k].id = None;
                        waiting_until = self.now() + RETRY_MS;
                    }
                    Err(_) => return Err(CaseError::Request("SIDR_REP status")),
                }
            }
        }
        let up_ms = self.now() - t0;
        let remotes = self.conns.iter().filter_map(|c| c.remote);
        for (k, q) in remotes.enumerate() {
            if self.conns[..k].iter().any(|c| c.remote == Some(q)) {
                return Err(CaseError::Request(
                    "one QP of Linux's for two SIDR requests",
                ));
            }
        }
        self.make_ah()?;
        for i in 0..self.case.count {
            self.ud_round(i)?;
        }
        self.wait_messages("the server's answers")?;
        let checked = self.check_ud(true)?;
        Ok((checked, Some(up_ms)))
    }

    /// The unikernel as udaddy's server: answers `-c` SIDR_REQs from Linux, each with a new
    /// endpoint (its receives posted first), takes every endpoint's datagrams, then answers
    /// each one's sender from that endpoint.
    fn ud_server(&mut self) -> Result<(u64, Option<u64>), CaseError> {
        let n = self.conns.len();
        self.cm
            .listen(None, UDADDY_PORT, Service::Ud)
            .map_err(|e| CaseError::Cm("listen", e))?;
        let mut taken = 0;
        let mut first_req = None;
        while taken < n {
            self.late("the SIDR_REQs")?;
            self.poll_cq()?;
            if let Some(CmEvent::SidrRequest(r)) = self.cm_event()? {
                if r.src_addr != self.linux || r.dst_port != UDADDY_PORT {
                    return Err(CaseError::Request("SIDR_REQ's address or port"));
                }
                first_req.get_or_insert(self.now());
                self.conns[taken].ud = Some(self.ud_qp()?);
                self.post_recvs(taken)?;
                let qpn = self.conns[taken].ud.as_ref().map_or(0, |q| q.qp_num());
                self.cm
                    .sidr_reply(r.id, qpn, UDP_QKEY, &[])
                    .map_err(|e| CaseError::Cm("SIDR reply", e))?;
                self.conns[taken].id = Some(r.id);
                taken += 1;
            }
        }
        let up_ms = first_req.map(|t| self.now() - t);
        self.wait_messages("the client's datagrams")?;
        let checked = self.check_ud(false)?;
        self.make_ah()?;
        for i in 0..self.case.count {
            self.ud_round(i)?;
        }
        // A UD SEND completes once its frame is on the NIC's ring: linger, as the single
        // endpoint's case does, so that the answers leave before the run ends.
        let until = self.now() + LINGER_MS;
        while self.now() < until {
            self.poll_cq()?;
            let _ = self.cm_event()?;
        }
        Ok((checked, up_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_request_ids_give_their_connection_and_message_back() {
        for kind in [RECV, SEND] {
            for k in 0..MAX_CONNS as usize {
                for i in [0, 1, MAX_MESSAGES - 1] {
                    assert_eq!(wr_of(wr_id(kind, k, i)), Some((kind, k, i)));
                }
            }
        }
        assert_eq!(wr_of(0), None);
        assert_eq!(wr_of(wr_id(RECV, MAX_CONNS as usize, 0)), None);
        assert_eq!(wr_of(wr_id(SEND, 0, MAX_MESSAGES)), None);
        assert_eq!(wr_of(0x3_0000), None);
    }

    #[test]
    fn every_message_of_a_case_has_its_own_pattern() {
        let mut firsts = [false; 256];
        for k in 0..MAX_CONNS as usize {
            for i in 0..MAX_MESSAGES {
                let b = pattern(pattern_no(k, i), 0) as usize;
                assert!(!firsts[b], "connection {k} message {i}");
                firsts[b] = true;
            }
        }
    }
}
