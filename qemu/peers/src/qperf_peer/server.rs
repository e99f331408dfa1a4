//! The unikernel as qperf's server: [`serve_test`] takes the Linux client's request and runs
//! its test through [`Server`]'s hooks, then [`quit`] takes the client's `quit`.

use bareverbs::Context;
use bareverbs::cm::{AcceptParams, Cm, CmConfig, CmEvent, ConnId, ConnectRequest, Service};
use bareverbs::hal::Clock;
use bareverbs::verbs::*;
use bareverbs_hal::Link;

use super::{
    CM_PORT, CONNS, CaseError, Error, GUARD, MAX_RECVS, Ms, QperfCase, RECV_BASE, RECV_BYTES,
    SEND_ID, SENTINEL, SERVER_MARK,
};
use crate::Step;
use crate::tcp::Stack;
use crate::tcp::qperf::{self, Hooks, Node, Request, Stat, Test};

mod more;

/// Takes the client's `quit` (a test request meanwhile is refused: the case is over).
pub(super) fn quit<L: Link>(
    stack: &mut Stack<'_, L>,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
) -> Result<(), Error> {
    let mut h = NoTest(clock_ms);
    match qperf::serve(stack, &mut h, deadline) {
        Ok((_, Test::Quit, _)) => Ok(()),
        Ok((_, t, _)) => Err(Error::Case(CaseError::OtherTest(t.name()))),
        Err(e) => Err(e.into()),
    }
}

/// Hooks that run no test (for `quit`).
struct NoTest<'c>(&'c dyn Fn() -> u64);

impl Hooks for NoTest<'_> {
    type Error = CaseError;
    fn now(&mut self) -> u64 {
        (self.0)()
    }
    fn listen(&mut self, test: Test, _: &Request) -> Result<u16, CaseError> {
        Err(CaseError::OtherTest(test.name()))
    }
    fn accept(&mut self) -> Result<Node, CaseError> {
        Err(CaseError::OtherTest("a test"))
    }
    fn run(&mut self, _: &Node) -> Result<Stat, CaseError> {
        Err(CaseError::OtherTest("a test"))
    }
    fn finish(&mut self) -> Result<(), CaseError> {
        Ok(())
    }
}

/// Serves the case's test (a leftover `quit` of an earlier case taken first).
pub(super) fn serve_test<P: Provider, L: Link>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    stack: &mut Stack<'_, L>,
    linux: [u8; 4],
    case: &QperfCase,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
) -> Result<(Request, Stat, u64), Error> {
    let cm_cq = ctx
        .create_cq(32)
        .at("qperf: create CM CQ")
        .map_err(|f| Error::Case(f.into()))?;
    let cq = ctx
        .create_cq(2 * MAX_RECVS + 4)
        .at("qperf: create CQ")
        .map_err(|f| Error::Case(f.into()))?;
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_ATOMIC;
    // The largest layout: 16 receive slots of up to 1 MiB in all, or a buffer of -m (up to
    // 1 MiB) with its guard and a second one (the send buffer: `send_at`).
    let len = 2 * qperf::MAX_MSG + 2 * GUARD;
    let mut mr = pd
        .register(len as usize, access)
        .at("qperf: register")
        .map_err(|f| Error::Case(f.into()))?;
    let mut cm: Cm<'_, P, Ms<'_>, CONNS> =
        Cm::new(pd, &cm_cq, Ms(clock_ms), CmConfig::default())
            .map_err(|e| Error::Case(CaseError::Cm("CM over QP1", e)))?;
    let mut s = Server {
        cm: &mut cm,
        pd,
        cq: &cq,
        mr: &mut mr,
        clock_ms,
        deadline,
        linux,
        want: case.test,
        test: None,
        request: None,
        listening: false,
        id: None,
        qp: None,
        peer: Node::default(),
        sends: 0,
        disconnected: false,
        checked: 0,
    };
    let r = loop {
        match qperf::serve(stack, &mut s, deadline) {
            // A `quit` left from an earlier case: the test comes next.
            Ok((_, Test::Quit, _)) => continue,
            Ok((req, _, Some(stat))) => break Ok((req, stat, s.checked)),
            Ok((_, t, None)) => break Err(Error::Case(CaseError::OtherTest(t.name()))),
            Err(e) => break Err(e.into()),
        }
    };
    s.cleanup();
    r
}

/// The verbs and CM side of one test.
struct Server<'s, 'a, P: Provider, C: Clock> {
    cm: &'s mut Cm<'a, P, C, CONNS>,
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    mr: &'s mut MemoryRegion<'a, P>,
    clock_ms: &'s dyn Fn() -> u64,
    deadline: u64,
    linux: [u8; 4],
    /// The case's test.
    want: Test,
    /// The test and its request, once taken.
    test: Option<(Test, Request)>,
    /// The CM's connection request, until taken.
    request: Option<ConnectRequest>,
    listening: bool,
    id: Option<ConnId>,
    qp: Option<QueuePair<'a, P, Rc, Rts>>,
    /// The client's node (its buffer, for the WRITEs of the latency tests).
    peer: Node,
    /// This side's SENDs or WRITEs in flight.
    sends: u32,
    disconnected: bool,
    /// Bytes received (or left in the buffer) checked.
    checked: u64,
}

impl<'a, P: Provider, C: Clock> Server<'_, 'a, P, C> {
    fn time(&self) -> u64 {
        (self.clock_ms)()
    }

    /// The buffer's bytes: `-m`, 8 for the atomics (whatever the request says).
    fn size(&self) -> u32 {
        match self.test {
            Some((t, _)) if t.atomic() => 8,
            t => t.map_or(1, |(_, r)| r.msg_size),
        }
    }

    /// Receive slots (`rc_bw`): as many `-m` slots as fit, at most [`MAX_RECVS`].
    fn slots(&self) -> u32 {
        (RECV_BYTES / self.size()).clamp(1, MAX_RECVS)
    }

    /// Runs the CM once: the first connection request is kept (whichever wait polls when
    /// it comes), a further one rejected; the client's DREQ noted.
    fn cm_event(&mut self) {
        match self.cm.poll() {
            Some(CmEvent::Disconnected { id }) if Some(id) == self.id => self.disconnected = true,
            Some(CmEvent::ConnectRequest(r)) => {
                if self.id.is_none() && self.request.is_none() && self.listening {
                    self.request = Some(r);
                } else {
                    let _ = self.cm.reject(r.id, &[]);
                }
            }
            _ => {}
        }
    }

    fn post_recv(&mut self, slot: u32) -> Result<(), CaseError> {
        let size = self.size();
        let (at, len) = match self.test {
            Some((Test::RcRdmaWriteBw | Test::RcRdmaWriteLat, _)) => (size + GUARD, GUARD),
            _ => (slot * size, size),
        };
        let sge = self.mr.sge(at, len).at("qperf: sge")?;
        let qp = self.qp.as_mut().ok_or(CaseError::Disconnected)?;
        // SAFETY: the region outlives the QP (destroyed in `cleanup`, before the region
        // goes); the CPU reads a slot only after its receive completed.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(RECV_BASE + u64::from(slot), &[sge])
                .at("qperf: post receive")?;
            r.finish();
        }
        Ok(())
    }

    /// Checks that `len` bytes at `at` all are `want`.
    fn expect(&mut self, at: u32, len: u32, want: u8, what: &'static str) -> Result<(), CaseError> {
        let b = &self.mr.as_slice()[at as usize..(at + len) as usize];
        if let Some(i) = b.iter().position(|&x| x != want) {
            return Err(CaseError::Bytes(what, i as u32));
        }
        self.checked += u64::from(len);
        Ok(())
    }

    /// A receive's completion: of `-m` bytes (and for `rc_bw` / `rc_lat` zeros in its
    /// slot, which then holds the sentinel again).
    fn received(&mut self, test: Test, w: &WorkCompletion) -> Result<(), CaseError> {
        let size = self.size();
        let write = matches!(test, Test::RcRdmaWriteBw | Test::RcRdmaWriteLat);
        let want = match test {
            _ if write => WcOpcode::RecvRdmaWithImm,
            _ => WcOpcode::Recv,
        };
        if w.opcode != want {
            return Err(CaseError::Unexpected(w.opcode, w.wr_id));
        }
        if w.byte_len != size {
            return Err(CaseError::Length(w.byte_len));
        }
        if write {
            if w.imm != 0 || !w.flags.contains(WcFlags::WITH_IMM) {
                return Err(CaseError::Bytes("the WRITE's immediate", 0));
            }
            return Ok(());
        }
        // A slot this side posted (the work request ID is the device's to return: bounded
        // before it places anything).
        let slot = w.wr_id.wrapping_sub(RECV_BASE);
        if slot >= u64::from(self.slots()) {
            return Err(CaseError::Unexpected(w.opcode, w.wr_id));
        }
        let slot = slot as u32;
        self.expect(slot * size, size, 0, "a message")?;
        let at = (slot * size) as usize;
        self.mr.as_mut_slice()[at..at + size as usize].fill(SENTINEL);
        Ok(())
    }

    /// The test's loop, until its time is over (or `-n` messages came).
    fn test_loop(&mut self, test: Test, req: &Request) -> Result<Stat, CaseError> {
        if test == Test::RcRdmaWritePollLat {
            let stat = self.poll_lat_loop(req)?;
            self.after(test, &stat)?;
            return Ok(stat);
        }
        let t0 = self.time();
        let end = if req.no_msgs == 0 {
            t0 + u64::from(req.time) * 1000
        } else {
            self.deadline
        };
        let mut stat = Stat::default();
        // rc_lat: 1 once this side's SEND completed, 2 once the client's came (the server
        // starts with its "send" done, as qperf's does).
        let mut done = 1u8;
        let lat = matches!(test, Test::RcLat | Test::RcRdmaWriteLat);
        let receives = lat || matches!(test, Test::RcBw | Test::RcRdmaWriteBw | Test::RcBiBw);
        let mut wcs = [WorkCompletion::default(); 16];
        if test == Test::RcBiBw {
            while self.sends < more::SENDS {
                self.post_out(test, &mut stat)?;
            }
        }
        loop {
            let now = self.time();
            if now >= end {
                break;
            }
            if now > self.deadline {
                return Err(CaseError::Deadline("the test's end"));
            }
            self.cm_event();
            if self.disconnected {
                return Err(CaseError::Disconnected);
            }
            let n = self.cq.poll(&mut wcs).at("qperf: poll CQ")?;
            stat.max_cqes = stat.max_cqes.max(n as u32);
            for w in &wcs[..n] {
                if w.status != WcStatus::Success {
                    return Err(CaseError::Status(w.status, w.wr_id));
                }
                match (test, w.wr_id) {
                    (_, SEND_ID) if self.sends > 0 && (lat || test == Test::RcBiBw) => {
                        self.sent(test, w)?;
                        done |= 1;
                        if test == Test::RcBiBw {
                            self.post_out(test, &mut stat)?;
                        }
                    }
                    (_, id)
                        if receives
                            && (RECV_BASE..RECV_BASE + u64::from(MAX_RECVS)).contains(&id) =>
                    {
                        self.received(test, w)?;
                        stat.received.msgs += 1;
                        stat.received.bytes += u64::from(self.size());
                        if req.no_msgs == 0 || stat.received.msgs < u64::from(req.no_msgs) {
                            self.post_recv((id - RECV_BASE) as u32)?;
                        }
                        done |= 2;
                    }
                    _ => return Err(CaseError::Unexpected(w.opcode, w.wr_id)),
                }
            }
            if lat && done == 3 {
                self.post_out(test, &mut stat)?;
                done = 0;
            }
            if req.no_msgs != 0 && stat.received.msgs >= u64::from(req.no_msgs) {
                break;
            }
        }
        stat.elapsed_ms = self.time() - t0;
        self.after(test, &stat)?;
        Ok(stat)
    }

    /// What the buffer holds after the test: the client's zeros over the sentinel (once a
    /// WRITE came), the READ pattern unchanged, the atomics' zeros (compare-and-swap of 0
    /// with 0, fetch-and-add of 0), the guard untouched (its slots fill the bytes after
    /// `rc_bw`'s and `rc_bi_bw`'s first).
    fn after(&mut self, test: Test, stat: &Stat) -> Result<(), CaseError> {
        let size = self.size();
        match test {
            Test::RcRdmaWriteBw | Test::RcRdmaWriteLat if stat.received.msgs > 0 => {
                self.expect(0, size, 0, "the WRITE target")?
            }
            _ if test.atomic() => self.expect(0, size, 0, "the atomics' target")?,
            Test::RcRdmaReadBw | Test::RcRdmaReadLat => {
                let b = &self.mr.as_slice()[..size as usize];
                if let Some(i) = b.iter().enumerate().position(|(i, &x)| x != pattern(i)) {
                    return Err(CaseError::Bytes("the READ buffer", i as u32));
                }
                self.checked += u64::from(size);
            }
            _ => {}
        }
        if !matches!(test, Test::RcBw | Test::RcBiBw) {
            self.expect(size, GUARD, SENTINEL, "the guard after the buffer")?;
        }
        Ok(())
    }

    /// The QP to ERROR, its flushed work requests taken, destroyed; the listener gone.
    fn cleanup(&mut self) {
        if let Some(qp) = self.qp.take() {
            match qp.to_error() {
                Ok(e) => {
                    self.drain();
                    let _ = e.destroy();
                }
                Err((qp, _)) => {
                    let _ = qp.destroy();
                }
            }
        }
        self.drain();
        if self.listening {
            self.cm.unlisten(CM_PORT, Service::Rc);
            self.listening = false;
        }
        self.id = None;
        if let Some(r) = self.request.take() {
            let _ = self.cm.reject(r.id, &[]);
        }
    }

    fn drain(&mut self) {
        let mut wcs = [WorkCompletion::default(); 16];
        for _ in 0..8 {
            let n = self.cq.poll(&mut wcs).unwrap_or(0);
            self.cm_event();
            if n == 0 {
                break;
            }
        }
    }
}

/// Byte `i` of the buffer `rc_rdma_read_bw`'s client READs.
pub(super) fn pattern(i: usize) -> u8 {
    (i * 7 + 3) as u8
}

impl<'a, P: Provider, C: Clock> Hooks for Server<'_, 'a, P, C> {
    type Error = CaseError;

    fn now(&mut self) -> u64 {
        self.cm_event();
        self.time()
    }

    fn listen(&mut self, test: Test, req: &Request) -> Result<u16, CaseError> {
        if test != self.want {
            return Err(CaseError::OtherTest(test.name()));
        }
        self.cleanup();
        self.test = Some((test, *req));
        self.disconnected = false;
        self.checked = 0;
        self.cm
            .listen(None, CM_PORT, Service::Rc)
            .map_err(|e| CaseError::Cm("listen", e))?;
        self.listening = true;
        Ok(CM_PORT)
    }

    fn accept(&mut self) -> Result<Node, CaseError> {
        let req: ConnectRequest = loop {
            if let Some(r) = self.request.take() {
                break r;
            }
            self.cm_event();
            if self.time() > self.deadline {
                return Err(CaseError::Deadline("the CM's REQ"));
            }
        };
        // qperf's rdma_connect: depths 1/1, retry and RNR retry counts 7, no private data.
        let checks = [
            (req.src_ip == self.linux, "source address"),
            (req.dst_port == CM_PORT, "port"),
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
        let caps = QpCaps {
            max_send_wr: 4,
            max_recv_wr: MAX_RECVS,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = self
            .pd
            .qp_builder(self.cq, self.cq)
            .caps(caps)
            .build::<Rc>()
            .at("qperf: create QP")?;
        self.id = Some(req.id);
        let rts = self
            .cm
            .accept(req.id, qp, &AcceptParams::default())
            .map_err(|(_, e)| CaseError::Cm("accept", e))?;
        self.qp = Some(rts);
        // The buffer: the sentinel everywhere, the READ pattern for rc_rdma_read_bw, zeros
        // in rc_lat's send buffer; the receives posted before qperf's synchronization, as
        // qperf's server posts them.
        let (test, _) = self.test.ok_or(CaseError::Deadline("the request"))?;
        let size = self.size();
        let at = more::send_at(test, size) as usize;
        let buf = self.mr.as_mut_slice();
        buf.fill(SENTINEL);
        match test {
            Test::RcRdmaReadBw | Test::RcRdmaReadLat => {
                for (i, b) in buf[..size as usize].iter_mut().enumerate() {
                    *b = pattern(i);
                }
            }
            // qperf's zeroed buffer, which the atomics leave as it is.
            _ if test.atomic() => buf[..size as usize].fill(0),
            _ => {}
        }
        // The send buffer: zeros (for rc_rdma_write_poll_lat with this side's mark at both
        // ends, as qperf's server writes it).
        buf[at..at + size as usize].fill(0);
        if test == Test::RcRdmaWritePollLat {
            buf[at] = SERVER_MARK;
            buf[at + size as usize - 1] = SERVER_MARK;
        }
        self.sends = 0;
        let recvs = match test {
            Test::RcBw | Test::RcRdmaWriteBw | Test::RcBiBw => self.slots(),
            Test::RcLat | Test::RcRdmaWriteLat => 1,
            _ => 0,
        };
        for slot in 0..recvs {
            self.post_recv(slot)?;
        }
        Ok(Node {
            vaddr: self.mr.addr(),
            rkey: self.mr.rkey(),
            rd_atomic: 1,
            ..Node::default()
        })
    }

    fn run(&mut self, peer: &Node) -> Result<Stat, CaseError> {
        let (test, req) = self.test.ok_or(CaseError::Deadline("the request"))?;
        self.peer = *peer;
        self.test_loop(test, &req)
    }

    fn finish(&mut self) -> Result<(), CaseError> {
        while !self.disconnected {
            self.cm_event();
            if self.time() > self.deadline {
                return Err(CaseError::Deadline("the client's DREQ"));
            }
        }
        self.cleanup();
        Ok(())
    }
}
