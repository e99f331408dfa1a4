//! CM peer mode: unmodified Linux `rdma_cm` programs against the unikernel, connected through
//! [`bareverbs::cm`] on QP1 (REQ/REP/RTU, DREQ/DREP) instead of a TCP side channel. A case of
//! `bvroce.cases=` (see [`crate::roce_peer`]) names the Linux program's role:
//!
//! | case | Linux runs | the unikernel |
//! | --- | --- | --- |
//! | `rping-server` | `rping -s` | the client: connects to port 7174, advertises its ping buffer (SEND), lets the server READ it, advertises its sink (SEND), lets the server WRITE the ping back, checks every byte, then disconnects |
//! | `rping-client` | `rping -c -a <unikernel> -V` | the server: accepts, READs the client's ping buffer and checks every byte against rping's pattern, WRITEs it back into the client's sink (the client compares with `-V`) |
//! | `ucmatose-server` | `ucmatose` | the client: takes the server's SENDs, answers as many ([`cmatose`]) |
//! | `ucmatose-client` | `ucmatose -s <unikernel>` | the server: SENDs its messages, takes the answers, disconnects |
//! | `udaddy-server` | `udaddy` | the client: resolves the UD service through SIDR, sends its datagrams, takes the answers |
//! | `udaddy-client` | `udaddy -s <unikernel>` | the UD service: answers the SIDR_REQ, takes the datagrams, answers each |
//!
//! rping's exchange (librdmacm-utils' `rping.c`): every message is a SEND of 16 bytes, the
//! buffer's address (u64), rkey (u32) and size (u32), big-endian; per ping the client sends
//! its ping buffer's, the server READs it and answers with a 16-byte "go ahead" (zeros: the
//! server never fills its send buffer), the client sends its sink's, the server WRITEs the
//! ping there (its length up to and including the terminating NUL) and sends "go ahead"
//! again. A ping is `rdma-ping-<n>: ` then letters from `A` + n (mod 58) cycling through
//! `A`..`z`, NUL-terminated, `-S` bytes in all. Options: `-S size` (64), `-C count`.

use core::fmt::Write;

use bareverbs::Context;
use bareverbs::cm::{
    AcceptParams, Cm, CmConfig, CmError, CmEvent, ConnId, Failure as CmFailure, Service,
};
use bareverbs::hal::Clock;
use bareverbs::verbs::*;

use crate::{Failure, Step};

mod cmatose;

/// rping's default port.
pub const RPING_PORT: u16 = 7174;
/// Bytes of a `struct rping_rdma_info`.
const INFO: u32 = 16;
/// rping's largest `-S` (`RPING_BUFSIZE - 1`).
pub const MAX_SIZE: u32 = 64 * 1024 - 1;
/// The smallest `-S` rping takes (the text and a number).
pub const MIN_SIZE: u32 = 26;
/// Where the receive and send buffers and the two data buffers sit in the one region.
const RECV_AT: u32 = 0;
const SEND_AT: u32 = 16;
const DATA_AT: u32 = 64;
/// Work request IDs.
const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;
const WR_READ: u64 = 3;
const WR_WRITE: u64 = 4;
/// What a data buffer holds before the peer fills it: a byte rping's pattern never has.
const SENTINEL: u8 = 0xEE;
/// Largest `-S` of ucmatose and udaddy cases (a UD datagram within a 1024-byte MTU).
pub const MAX_MESSAGE: u32 = 1024;
/// Largest `-C` of ucmatose and udaddy cases (each message has its own receive buffer).
pub const MAX_MESSAGES: u32 = 32;
/// Connection entries of the case's CM.
const CONNS: usize = 2;
/// Milliseconds between two connection attempts while Linux's server is not listening yet.
const RETRY_MS: u64 = 500;

/// The Linux program and its role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// `rping -s`: the unikernel connects.
    RpingServer,
    /// `rping -c`: the unikernel listens.
    RpingClient,
    /// `ucmatose` (the server): the unikernel connects.
    UcmatoseServer,
    /// `ucmatose -s`: the unikernel listens.
    UcmatoseClient,
    /// `udaddy` (the server): the unikernel resolves its UD service through SIDR.
    UdaddyServer,
    /// `udaddy -s`: the unikernel serves the UD port.
    UdaddyClient,
}

/// A CM case: the program, its `-S` and `-C`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmCase {
    /// The Linux program's role.
    pub program: Program,
    /// Bytes of a ping or message (`-S`).
    pub size: u32,
    /// Pings or messages (`-C`).
    pub count: u32,
}

impl CmCase {
    /// Parses `rping-server,-S,64,-C,100,-V` (`,` for spaces); `None` for another program or
    /// options that do not parse. `-V` and `-v` are the Linux side's (the unikernel checks
    /// every byte anyway). The defaults are the programs': rping 64 bytes, ucmatose and
    /// udaddy 10 messages of 100 bytes.
    pub fn parse(spec: &str) -> Option<CmCase> {
        let mut words = spec.split(',').filter(|w| !w.is_empty());
        let program = match words.next()? {
            "rping-server" => Program::RpingServer,
            "rping-client" => Program::RpingClient,
            "ucmatose-server" => Program::UcmatoseServer,
            "ucmatose-client" => Program::UcmatoseClient,
            "udaddy-server" => Program::UdaddyServer,
            "udaddy-client" => Program::UdaddyClient,
            _ => return None,
        };
        let rping = matches!(program, Program::RpingServer | Program::RpingClient);
        let (mut size, mut count) = if rping { (64, 1) } else { (100, 10) };
        while let Some(w) = words.next() {
            match w {
                "-V" | "-v" => continue,
                "-S" => size = words.next()?.parse().ok()?,
                "-C" => count = words.next()?.parse().ok()?,
                _ => return None,
            }
        }
        let ok = if rping {
            (MIN_SIZE..=MAX_SIZE).contains(&size) && count >= 1
        } else {
            // A UD message fits the 1024-byte path MTU with room for nothing else.
            (1..=MAX_MESSAGE).contains(&size) && (1..=MAX_MESSAGES).contains(&count)
        };
        ok.then_some(CmCase {
            program,
            size,
            count,
        })
    }

    /// The case's name.
    pub fn name(&self) -> &'static str {
        match self.program {
            Program::RpingServer => "rping-server",
            Program::RpingClient => "rping-client",
            Program::UcmatoseServer => "ucmatose-server",
            Program::UcmatoseClient => "ucmatose-client",
            Program::UdaddyServer => "udaddy-server",
            Program::UdaddyClient => "udaddy-client",
        }
    }
}

/// Why a CM case failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaseError {
    /// A verbs call failed.
    Verbs(Failure),
    /// The CM refused a call.
    Cm(&'static str, CmError),
    /// The connection was not established.
    Connect(CmFailure),
    /// The case's deadline passed while waiting for this.
    Deadline(&'static str),
    /// A completion with an error status (and its work request).
    Status(WcStatus, u64),
    /// The peer disconnected while this was awaited.
    Disconnected(&'static str),
    /// A connection request that is not rping's (which field).
    Request(&'static str),
    /// A received message or buffer that is not what rping sends: which, in which ping, the
    /// first wrong byte (`u32::MAX`: the length).
    Bytes {
        /// What was checked.
        what: &'static str,
        /// The ping (from 0).
        ping: u32,
        /// The first wrong byte's offset, or `u32::MAX` for a wrong length.
        at: u32,
    },
}

impl From<Failure> for CaseError {
    fn from(f: Failure) -> Self {
        CaseError::Verbs(f)
    }
}

impl core::fmt::Display for CaseError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CaseError::Verbs(v) => write!(f, "{v}"),
            CaseError::Cm(step, e) => write!(f, "{step}: {e}"),
            CaseError::Connect(c) => write!(f, "not connected: {c:?}"),
            CaseError::Deadline(what) => write!(f, "deadline passed waiting for {what}"),
            CaseError::Status(s, id) => write!(f, "completion {s:?} for work request {id}"),
            CaseError::Disconnected(what) => write!(f, "peer disconnected before {what}"),
            CaseError::Request(what) => write!(f, "connection request: unexpected {what}"),
            CaseError::Bytes { what, ping, at } if *at == u32::MAX => {
                write!(f, "{what} of ping {ping}: wrong length")
            }
            CaseError::Bytes { what, ping, at } => {
                write!(f, "{what} of ping {ping}: wrong byte at {at}")
            }
        }
    }
}

/// What a case that passed did.
struct Done {
    /// Pings or messages each way.
    count: u32,
    /// `pings` or `messages`.
    unit: &'static str,
    /// Bytes each.
    size: u32,
    /// Bytes the unikernel received and checked, every one (data READ or WRITTEN into it,
    /// messages, GRH areas).
    checked: u64,
    /// Milliseconds from the REQ or SIDR_REQ (sent or received) to the connection being up
    /// (the clock ticks every 16 ms).
    connect_ms: u64,
}

/// The CM's clock: the case's millisecond clock.
struct Ms<'c>(&'c dyn Fn() -> u64);

impl Clock for Ms<'_> {
    fn now_us(&self) -> u64 {
        (self.0)().saturating_mul(1000)
    }
}

/// Runs one CM case against the Linux side at `linux` and prints its `roce-uk` line; `true`
/// if it passed.
pub fn run_case<P: Provider>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    linux: [u8; 4],
    case: &CmCase,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
    out: &mut dyn Write,
) -> bool {
    let t0 = clock_ms();
    let r = run(ctx, pd, linux, case, deadline, clock_ms);
    let ms = clock_ms() - t0;
    match r {
        Ok(d) => {
            let _ = writeln!(
                out,
                "roce-uk {}: ok {} {} of {} bytes, every byte received checked ({} bytes), connected in {} ms; {ms} ms in all",
                case.name(),
                d.count,
                d.unit,
                d.size,
                d.checked,
                d.connect_ms
            );
            true
        }
        Err(e) => {
            let _ = writeln!(out, "roce-uk {}: FAIL {e} (after {ms} ms)", case.name());
            false
        }
    }
}

fn run<P: Provider>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    linux: [u8; 4],
    case: &CmCase,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
) -> Result<Done, CaseError> {
    let cm_cq = ctx.create_cq(32).at("cm: create CM CQ")?;
    // Room for every send and receive of the largest case.
    let cq = ctx
        .create_cq(2 * (16 + MAX_MESSAGES) + 4)
        .at("cm: create CQ")?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let len = match case.program {
        Program::RpingServer | Program::RpingClient => DATA_AT + 2 * case.size,
        _ => (case.count + 1) * cmatose::slot(case.size),
    };
    let mut mr = pd.register(len as usize, access).at("cm: register")?;
    let r = {
        let mut cm: Cm<'_, P, Ms<'_>, CONNS> =
            Cm::new(pd, &cm_cq, Ms(clock_ms), CmConfig::default())
                .map_err(|e| CaseError::Cm("CM over QP1", e))?;
        let mut s = Session {
            cm: &mut cm,
            cq: &cq,
            mr: &mut mr,
            deadline,
            clock_ms,
            seen: [None; SEEN],
            id: None,
            established: None,
            disconnected: false,
        };
        match case.program {
            Program::RpingServer => s.rping_client(pd, linux, case),
            Program::RpingClient => s.rping_server(pd, linux, case),
            Program::UcmatoseServer => s.ucmatose_client(pd, linux, case),
            Program::UcmatoseClient => s.ucmatose_server(pd, linux, case),
            Program::UdaddyServer => s.udaddy_client(pd, linux, case),
            Program::UdaddyClient => s.udaddy_server(pd, linux, case),
        }
    };
    // The region and the CQs go when they drop (the session's borrows tie them to it).
    r
}

/// One connection's case: the CM, the data QP's CQ, the region, what was seen.
struct Session<'s, 'a, P: Provider, C: Clock> {
    cm: &'s mut Cm<'a, P, C, CONNS>,
    cq: &'a CompletionQueue<'a, P>,
    mr: &'s mut MemoryRegion<'a, P>,
    deadline: u64,
    clock_ms: &'s dyn Fn() -> u64,
    /// Completions taken while waiting for another one, by [`seen_slot`].
    seen: [Option<Seen>; SEEN],
    /// The connection.
    id: Option<ConnId>,
    /// When the passive side saw the RTU (ms).
    established: Option<u64>,
    /// The peer's DREQ (or the answer to this side's).
    disconnected: bool,
}

impl<'s, 'a, P: Provider, C: Clock> Session<'s, 'a, P, C> {
    fn now(&self) -> u64 {
        (self.clock_ms)()
    }

    fn qp(&self, pd: &'a ProtectionDomain<'a, P>) -> Result<QueuePair<'a, P, Rc, Reset>, Failure> {
        let caps = QpCaps {
            max_send_wr: 16 + MAX_MESSAGES,
            max_recv_wr: 2 + MAX_MESSAGES,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        pd.qp_builder(self.cq, self.cq)
            .caps(caps)
            .build::<Rc>()
            .at("cm: create QP")
    }

    /// One CM event, if any; the connection's own ones are noted.
    fn cm_event(&mut self) -> Option<CmEvent<'a, P>> {
        let ev = self.cm.poll()?;
        match &ev {
            CmEvent::Established { id, qp: None, .. } if Some(*id) == self.id => {
                self.established = Some(self.now());
            }
            CmEvent::Disconnected { id } if Some(*id) == self.id => self.disconnected = true,
            _ => {}
        }
        Some(ev)
    }

    /// Waits for the completion of work request `wr_id` (the CM polled meanwhile).
    fn wait(&mut self, wr_id: u64, what: &'static str) -> Result<Seen, CaseError> {
        let slot = seen_slot(wr_id).ok_or(CaseError::Status(WcStatus::GeneralErr, wr_id))?;
        loop {
            if let Some(w) = self.seen[slot].take() {
                return Ok(w);
            }
            self.poll_once(what)?;
        }
    }

    /// Takes the completions there are (and one CM event); an error status ends the case.
    fn poll_once(&mut self, what: &'static str) -> Result<(), CaseError> {
        let mut wcs = [WorkCompletion::default(); 4];
        let n = self.cq.poll(&mut wcs).at("cm: poll CQ")?;
        for w in &wcs[..n] {
            let slot = seen_slot(w.wr_id).filter(|&s| self.seen[s].is_none());
            match slot {
                Some(s) if w.status == WcStatus::Success => self.seen[s] = Some(Seen::from(w)),
                _ => return Err(CaseError::Status(w.status, w.wr_id)),
            }
        }
        let _ = self.cm_event();
        if n == 0 && self.disconnected {
            return Err(CaseError::Disconnected(what));
        }
        if n == 0 && self.now() > self.deadline {
            return Err(CaseError::Deadline(what));
        }
        Ok(())
    }

    /// Posts the one receive of 16 bytes.
    fn post_recv(&mut self, qp: &mut QueuePair<'a, P, Rc, Rts>) -> Result<(), Failure> {
        let sge = self.mr.sge(RECV_AT, INFO).at("cm: sge")?;
        // SAFETY: the region outlives the QP (destroyed first in every path of the case), and
        // the CPU reads the receive buffer only after its completion.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(WR_RECV, &[sge]).at("cm: post receive")?;
            r.finish();
        }
        Ok(())
    }

    /// Sends the 16-byte message `info` (the send buffer is free: the last SEND completed).
    fn send(&mut self, qp: &mut QueuePair<'a, P, Rc, Rts>, info: [u8; 16]) -> Result<(), Failure> {
        let at = SEND_AT as usize;
        self.mr.as_mut_slice()[at..at + 16].copy_from_slice(&info);
        let sge = self.mr.sge(SEND_AT, INFO).at("cm: sge")?;
        // SAFETY: as in `post_recv`; the send buffer is not written again before the SEND's
        // completion is taken.
        unsafe {
            let mut s = qp.send_batch();
            s.send(WR_SEND, SendFlags::SIGNALED, &[sge])
                .at("cm: post SEND")?;
            s.finish();
        }
        Ok(())
    }

    /// Waits for the next 16-byte message, checks its length, and posts the receive again.
    fn receive(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        what: &'static str,
        ping: u32,
    ) -> Result<[u8; 16], CaseError> {
        let w = self.wait(WR_RECV, what)?;
        if w.byte_len != INFO || w.opcode != WcOpcode::Recv || w.flags.contains(WcFlags::WITH_IMM) {
            return Err(CaseError::Bytes {
                what,
                ping,
                at: u32::MAX,
            });
        }
        let mut m = [0u8; 16];
        let at = RECV_AT as usize;
        m.copy_from_slice(&self.mr.as_slice()[at..at + 16]);
        self.post_recv(qp)?;
        Ok(m)
    }

    /// This side's buffer `which` (0 the ping, 1 the sink) as rping advertises it.
    fn info(&self, which: u32, size: u32) -> [u8; 16] {
        let addr = self.mr.addr() + u64::from(DATA_AT + which * size);
        encode_info(addr, self.mr.rkey(), size)
    }

    fn data(&mut self, which: u32, size: u32) -> &mut [u8] {
        let at = (DATA_AT + which * size) as usize;
        &mut self.mr.as_mut_slice()[at..at + size as usize]
    }

    /// The unikernel as rping's client (Linux runs `rping -s`).
    fn rping_client(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: [u8; 4],
        case: &CmCase,
    ) -> Result<Done, CaseError> {
        let qp = self.qp(pd)?;
        let (mut rts, connect_ms) = self.connect_retrying(qp, linux, RPING_PORT)?;
        let r = self.rping_client_pings(&mut rts, case);
        let mut done = r.map(|(data, messages)| Done {
            count: case.count,
            unit: "pings",
            size: case.size,
            checked: data + u64::from(messages) * u64::from(INFO),
            connect_ms,
        });
        // rping's disconnect: the QP to ERROR, then the DREQ; the DREP ends it.
        let qp = rts.to_error().at("cm: QP to ERROR")?;
        if let Some(id) = self.id {
            if !self.disconnected
                && let Err(e) = self.cm.disconnect(id)
            {
                done = done.and(Err(CaseError::Cm("disconnect", e)));
            }
            while !self.disconnected && self.now() <= self.deadline {
                let _ = self.cm_event();
            }
            if !self.disconnected {
                done = done.and(Err(CaseError::Deadline("the DREP")));
            }
        }
        self.drain();
        qp.destroy().at("cm: destroy QP")?;
        done
    }

    fn rping_client_pings(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
    ) -> Result<(u64, u32), CaseError> {
        let size = case.size;
        let (mut data, mut messages) = (0u64, 0u32);
        self.post_recv(qp)?;
        for ping in 0..case.count {
            rping_text(ping, self.data(0, size));
            self.data(1, size).fill(SENTINEL);
            // The ping buffer: the server READs it, then says "go ahead".
            let info = self.info(0, size);
            self.send(qp, info)?;
            self.wait(WR_SEND, "the SEND of the ping buffer")?;
            let go = self.receive(qp, "the go-ahead after the READ", ping)?;
            check_go_ahead(&go, ping)?;
            // The sink: the server WRITEs the ping there, then says "go ahead".
            let info = self.info(1, size);
            self.send(qp, info)?;
            self.wait(WR_SEND, "the SEND of the sink")?;
            let go = self.receive(qp, "the go-ahead after the WRITE", ping)?;
            check_go_ahead(&go, ping)?;
            messages += 2;
            let at = (DATA_AT + size) as usize;
            let sink = &self.mr.as_slice()[at..at + size as usize];
            if let Some(at) = first_difference(sink, ping) {
                return Err(CaseError::Bytes {
                    what: "the ping WRITTEN back",
                    ping,
                    at,
                });
            }
            data += u64::from(size);
        }
        Ok((data, messages))
    }

    /// The unikernel as rping's server (Linux runs `rping -c`).
    fn rping_server(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: [u8; 4],
        case: &CmCase,
    ) -> Result<Done, CaseError> {
        self.cm
            .listen(None, RPING_PORT, Service::Rc)
            .map_err(|e| CaseError::Cm("listen", e))?;
        let (req, t_req) = loop {
            match self.cm_event() {
                Some(CmEvent::ConnectRequest(r)) => break (r, self.now()),
                _ if self.now() > self.deadline => {
                    return Err(CaseError::Deadline("the REQ"));
                }
                _ => {}
            }
        };
        self.id = Some(req.id);
        // rping's request: from the Linux side to this port, depths 1/1, retries 7/7, no
        // private data after rdma_cm's header.
        let checks = [
            (req.src_ip == linux, "source address"),
            (req.dst_port == RPING_PORT, "port"),
            (
                (req.responder_resources, req.initiator_depth) == (1, 1),
                "depths",
            ),
            ((req.retry_count, req.rnr_retry_count) == (7, 7), "retries"),
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
        let r = self.rping_server_pings(&mut rts, case);
        // The client disconnects after its last ping.
        let r = r.and_then(|(data, messages)| {
            while !self.disconnected {
                let _ = self.cm_event();
                if self.now() > self.deadline {
                    return Err(CaseError::Deadline("the client's DREQ"));
                }
            }
            Ok((data, messages))
        });
        let qp = rts.to_error().at("cm: QP to ERROR")?;
        self.drain();
        qp.destroy().at("cm: destroy QP")?;
        let (data, messages) = r?;
        let up = self.established.ok_or(CaseError::Deadline("the RTU"))?;
        Ok(Done {
            count: case.count,
            unit: "pings",
            size: case.size,
            checked: data + u64::from(messages) * u64::from(INFO),
            connect_ms: up - t_req,
        })
    }

    fn rping_server_pings(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
    ) -> Result<(u64, u32), CaseError> {
        let size = case.size;
        let (mut data, mut messages) = (0u64, 0u32);
        let mut first: [Option<[u8; 16]>; 2] = [None; 2];
        self.post_recv(qp)?;
        for ping in 0..case.count {
            // The client's ping buffer: READ it, check it, "go ahead".
            let m = self.receive(qp, "the client's ping buffer", ping)?;
            let (addr, rkey) = check_info(&m, size, &mut first[0], "the ping buffer", ping)?;
            self.data(0, size).fill(SENTINEL);
            let sge = self.mr.sge(DATA_AT, size).at("cm: sge")?;
            // SAFETY: as in `post_recv`; the CPU leaves the buffer alone until the READ's
            // completion.
            unsafe {
                let mut s = qp.send_batch();
                s.rdma_read(WR_READ, SendFlags::SIGNALED, (addr, rkey), &[sge])
                    .at("cm: post READ")?;
                s.finish();
            }
            self.wait(WR_READ, "the READ")?;
            if let Some(at) = first_difference(self.data(0, size), ping) {
                return Err(CaseError::Bytes {
                    what: "the ping READ",
                    ping,
                    at,
                });
            }
            data += u64::from(size);
            self.send(qp, [0; 16])?;
            self.wait(WR_SEND, "the go-ahead after the READ")?;
            // The client's sink: WRITE the ping there (up to its NUL), "go ahead".
            let m = self.receive(qp, "the client's sink", ping)?;
            let (addr, rkey) = check_info(&m, size, &mut first[1], "the sink", ping)?;
            let len = self
                .data(0, size)
                .iter()
                .position(|&b| b == 0)
                .map_or(size, |n| n as u32 + 1);
            let sge = self.mr.sge(DATA_AT, len).at("cm: sge")?;
            // SAFETY: as above.
            unsafe {
                let mut s = qp.send_batch();
                s.rdma_write(WR_WRITE, SendFlags::SIGNALED, (addr, rkey), &[sge])
                    .at("cm: post WRITE")?;
                s.finish();
            }
            self.wait(WR_WRITE, "the WRITE")?;
            self.send(qp, [0; 16])?;
            self.wait(WR_SEND, "the go-ahead after the WRITE")?;
            messages += 2;
        }
        Ok((data, messages))
    }

    /// Takes what is left on the CQ (flushed work requests) and the CM's last events.
    fn drain(&mut self) {
        let mut wcs = [WorkCompletion::default(); 4];
        for _ in 0..8 {
            let n = self.cq.poll(&mut wcs).unwrap_or(0);
            let _ = self.cm_event();
            if n == 0 {
                break;
            }
        }
        self.seen = [None; SEEN];
    }
}

/// Completion slots: rping's four work requests, then ucmatose's and udaddy's receives and
/// sends (one each per message).
const SEEN: usize = 4 + 2 * MAX_MESSAGES as usize;
/// Work request IDs of the per-message receives and sends.
const RECV_BASE: u64 = 0x100;
const SEND_BASE: u64 = 0x200;

/// The slot of `seen` a work request's completion goes to.
fn seen_slot(wr_id: u64) -> Option<usize> {
    let per = u64::from(MAX_MESSAGES);
    match wr_id {
        WR_RECV..=WR_WRITE => Some((wr_id - WR_RECV) as usize),
        _ if (RECV_BASE..RECV_BASE + per).contains(&wr_id) => {
            Some((4 + wr_id - RECV_BASE) as usize)
        }
        _ if (SEND_BASE..SEND_BASE + per).contains(&wr_id) => {
            Some((4 + per + wr_id - SEND_BASE) as usize)
        }
        _ => None,
    }
}

/// What the case keeps of a completion.
#[derive(Clone, Copy, Debug)]
struct Seen {
    byte_len: u32,
    imm: u32,
    src_qp: u32,
    opcode: WcOpcode,
    flags: WcFlags,
}

impl From<&WorkCompletion> for Seen {
    fn from(w: &WorkCompletion) -> Self {
        Seen {
            byte_len: w.byte_len,
            imm: w.imm,
            src_qp: w.src_qp,
            opcode: w.opcode,
            flags: w.flags,
        }
    }
}

/// `struct rping_rdma_info`: address, rkey, size, big-endian.
pub fn encode_info(addr: u64, rkey: u32, size: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&addr.to_be_bytes());
    m[8..12].copy_from_slice(&rkey.to_be_bytes());
    m[12..].copy_from_slice(&size.to_be_bytes());
    m
}

/// The address and rkey of a buffer the client advertised: its size must be the case's, and
/// the same buffer each ping (rping reuses its two buffers).
fn check_info(
    m: &[u8; 16],
    size: u32,
    first: &mut Option<[u8; 16]>,
    what: &'static str,
    ping: u32,
) -> Result<(u64, u32), CaseError> {
    let addr = u64::from_be_bytes([m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]]);
    let rkey = u32::from_be_bytes([m[8], m[9], m[10], m[11]]);
    let got = u32::from_be_bytes([m[12], m[13], m[14], m[15]]);
    if got != size {
        return Err(CaseError::Bytes { what, ping, at: 12 });
    }
    match first {
        Some(f) if f != m => {
            let at = f.iter().zip(m).position(|(a, b)| a != b).unwrap_or(0);
            Err(CaseError::Bytes {
                what,
                ping,
                at: at as u32,
            })
        }
        _ => {
            *first = Some(*m);
            Ok((addr, rkey))
        }
    }
}

/// rping's server answers with its send buffer, which it never fills: 16 zero bytes.
fn check_go_ahead(m: &[u8; 16], ping: u32) -> Result<(), CaseError> {
    match m.iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(at) => Err(CaseError::Bytes {
            what: "the go-ahead",
            ping,
            at: at as u32,
        }),
    }
}

/// Fills `buf` with rping's ping number `ping`: `rdma-ping-<ping>: `, then letters from
/// `A` + `ping` mod 58 on, cycling through `A`..=`z`, and a NUL in the last byte.
pub fn rping_text(ping: u32, buf: &mut [u8]) {
    let text = Text::new(ping, buf.len());
    for (i, b) in buf.iter_mut().enumerate() {
        *b = text.byte(i);
    }
}

/// The first byte of `got` that differs from ping `ping`'s text.
fn first_difference(got: &[u8], ping: u32) -> Option<u32> {
    let text = Text::new(ping, got.len());
    got.iter()
        .enumerate()
        .position(|(i, &b)| b != text.byte(i))
        .map(|i| i as u32)
}

/// Ping `ping`'s text of `len` bytes, byte by byte (no buffer of its size).
struct Text {
    head: Head,
    start: u32,
    len: usize,
}

impl Text {
    fn new(ping: u32, len: usize) -> Text {
        let mut head = Head {
            buf: [0; 32],
            len: 0,
        };
        let _ = write!(head, "rdma-ping-{ping}: ");
        Text {
            head,
            start: ping % 58,
            len,
        }
    }

    fn byte(&self, i: usize) -> u8 {
        let n = self.head.len.min(self.len.saturating_sub(1));
        if i + 1 == self.len {
            0
        } else if i < n {
            self.head.buf[i]
        } else {
            b'A' + ((self.start as usize + (i - n)) % 58) as u8
        }
    }
}

/// A small text buffer for the ping's head.
struct Head {
    buf: [u8; 32],
    len: usize,
}

impl Write for Head {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(core::fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_parse_as_rpings_options() {
        assert_eq!(
            CmCase::parse("rping-server,-S,64,-C,100,-V"),
            Some(CmCase {
                program: Program::RpingServer,
                size: 64,
                count: 100
            })
        );
        let c = CmCase::parse("rping-client").expect("defaults");
        assert_eq!((c.program, c.size, c.count), (Program::RpingClient, 64, 1));
        assert_eq!(CmCase::parse("rping-client,-S,8"), None);
        assert_eq!(CmCase::parse("rping-client,-S,65536"), None);
        assert_eq!(CmCase::parse("rping-client,-C,0"), None);
        assert_eq!(CmCase::parse("rping-client,-x"), None);
        assert_eq!(CmCase::parse("rc-server"), None);
    }

    #[test]
    fn pings_are_rpings_text() {
        let mut b = [0u8; 32];
        rping_text(0, &mut b);
        assert_eq!(&b, b"rdma-ping-0: ABCDEFGHIJKLMNOPQR\0");
        rping_text(57, &mut b);
        assert_eq!(&b[..16], b"rdma-ping-57: zA");
        assert_eq!(b[31], 0);
        let mut long = [0u8; 80];
        rping_text(1, &mut long);
        // From 'B' to 'z' is 57 letters, then 'A' again.
        assert_eq!(long[13 + 57], b'A');
        assert_eq!(first_difference(&long, 1), None);
        long[40] ^= 1;
        assert_eq!(first_difference(&long, 1), Some(40));
    }

    #[test]
    fn infos_are_big_endian_and_checked() {
        let m = encode_info(0x1122_3344_5566_7788, 0xAABB_CCDD, 64);
        assert_eq!(
            m,
            [
                0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xAA, 0xBB, 0xCC, 0xDD, 0, 0, 0, 64
            ]
        );
        let mut first = None;
        assert_eq!(
            check_info(&m, 64, &mut first, "x", 0),
            Ok((0x1122_3344_5566_7788, 0xAABB_CCDD))
        );
        assert_eq!(
            check_info(&m, 64, &mut first, "x", 1),
            Ok((0x1122_3344_5566_7788, 0xAABB_CCDD))
        );
        let other = encode_info(0x1122_3344_5566_7789, 0xAABB_CCDD, 64);
        assert_eq!(
            check_info(&other, 64, &mut first, "x", 2),
            Err(CaseError::Bytes {
                what: "x",
                ping: 2,
                at: 7
            })
        );
        assert_eq!(
            check_info(&m, 65, &mut None, "x", 0),
            Err(CaseError::Bytes {
                what: "x",
                ping: 0,
                at: 12
            })
        );
        assert!(check_go_ahead(&[0; 16], 0).is_ok());
        let mut g = [0u8; 16];
        g[5] = 1;
        assert!(check_go_ahead(&g, 0).is_err());
    }
}
