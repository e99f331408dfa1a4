//! The unikernel as qperf's client, against Linux's `qperf` server (`…-server` cases): it
//! sends the request qperf 0.4.11's client would for `qperf <linux> -cm1 -t T -m M TEST`,
//! connects its QP through the CM to the port the server names, runs the test for `-t`
//! seconds, checks the server's statistics against what it did, disconnects, and ends the
//! Linux server with `quit`.
//!
//! | test | the unikernel | what it checks |
//! | --- | --- | --- |
//! | `rc_bw` | SENDs `-m` bytes (zeros), up to [`DEPTH`] in flight | every SEND completed; the server received some, at most as many as were sent, `-m` bytes each |
//! | `rc_rdma_write_bw` | WRITEs with immediate 0 into the server's buffer | as `rc_bw` (each WRITE consumes a receive of the server's) |
//! | `rc_rdma_read_bw` | READs the server's buffer, up to [`DEPTH`] posted | every READ brought `-m` zeros (qperf's buffer), into a slot that held a sentinel; the server counted nothing |
//! | `rc_lat` | a SEND, then waits for the server's, round after round | every answer `-m` zeros; the server received as many SENDs as were sent, or one less |

use core::fmt::Write;

use bareverbs::Context;
use bareverbs::cm::{Cm, CmConfig, CmEvent, ConnId, ConnectParams, Failure as CmFailure};
use bareverbs::hal::Clock;
use bareverbs::verbs::*;
use bareverbs_hal::Link;

use super::{CONNS, CaseError, Error, Ms, QperfCase, SENTINEL};
use crate::roce_peer::CONNECT_RETRY;
use crate::tcp::Stack;
use crate::tcp::qperf::{self, ClientHooks, Node, Request, Stat, Test};
use crate::{Failure, Step};

/// Work requests in flight at most (SENDs, WRITEs, READs).
pub const DEPTH: u32 = 8;
/// READ slots take at most this many bytes; READs in flight are bounded by it too.
const READ_BYTES: u32 = 1 << 20;
/// Milliseconds between two connection attempts while the server does not listen yet.
const RETRY_MS: u64 = 100;
/// Work request IDs: `rc_lat`'s receive; the SENDs, WRITEs and READs from `WR_BASE` (+ slot).
const WR_RECV: u64 = 1;
const WR_BASE: u64 = 0x100;

/// Runs a `…-server` case: the test, then `quit`; prints its `roce-uk` line.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_case<P: Provider, L: Link>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    stack: &mut Stack<'_, L>,
    linux: [u8; 4],
    name: &str,
    case: &QperfCase,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
    out: &mut dyn Write,
) -> bool {
    let t0 = clock_ms();
    let r = run(ctx, pd, stack, linux, case, deadline, clock_ms);
    // Linux's server runs until a `quit`, whatever happened to the test.
    let q = qperf::quit(stack, linux, CONNECT_RETRY, deadline, &mut || clock_ms());
    let ms = clock_ms() - t0;
    match (r, q) {
        (Ok((req, mine, theirs, checked)), Ok(())) => {
            let (what, n) = match case.test {
                Test::RcRdmaReadBw => ("READs", mine.received.msgs),
                Test::RcLat => ("rounds", mine.received.msgs),
                _ => ("messages taken by the server", theirs.received.msgs),
            };
            let _ = writeln!(
                out,
                "roce-uk {name}: ok {} -m {} -t {}: {n} {what} in {} ms (the server's {} ms), {checked} bytes checked, quit sent; {ms} ms in all",
                case.test.name(),
                req.msg_size,
                req.time,
                mine.elapsed_ms,
                theirs.elapsed_ms
            );
            true
        }
        (Err(e), _) => {
            let _ = writeln!(out, "roce-uk {name}: FAIL {e} (after {ms} ms)");
            false
        }
        (Ok(_), Err(e)) => {
            let _ = writeln!(out, "roce-uk {name}: FAIL quit: {e} (after {ms} ms)");
            false
        }
    }
}

/// The test against Linux's server: the request, this side's and the server's statistics
/// (checked against each other), the bytes checked.
fn run<P: Provider, L: Link>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    stack: &mut Stack<'_, L>,
    linux: [u8; 4],
    case: &QperfCase,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
) -> Result<(Request, Stat, Stat, u64), Error> {
    let req = case.request();
    req.test().map_err(Error::Qperf)?;
    let v = |f: Failure| Error::Case(f.into());
    let cm_cq = ctx.create_cq(32).at("qperf: create CM CQ").map_err(v)?;
    let cq = ctx
        .create_cq(2 * DEPTH + 4)
        .at("qperf: create CQ")
        .map_err(v)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    // The send buffer (zeros, -m bytes), then the receive or READ slots.
    let size = req.msg_size;
    let slots = reads(size);
    let len = size + slots.max(1) * size;
    let mut mr = pd
        .register(len as usize, access)
        .at("qperf: register")
        .map_err(v)?;
    let mut cm: Cm<'_, P, Ms<'_>, CONNS> =
        Cm::new(pd, &cm_cq, Ms(clock_ms), CmConfig::default())
            .map_err(|e| Error::Case(CaseError::Cm("CM over QP1", e)))?;
    let mut c = Client {
        cm: &mut cm,
        pd,
        cq: &cq,
        mr: &mut mr,
        clock_ms,
        deadline,
        linux,
        test: case.test,
        req,
        id: None,
        qp: None,
        disconnected: false,
        checked: 0,
    };
    let r = qperf::run_client(stack, linux, CONNECT_RETRY, &req, &mut c, deadline);
    c.cleanup();
    let (mine, theirs) = r?;
    check_stats(case.test, size, &mine, &theirs).map_err(Error::Case)?;
    Ok((req, mine, theirs, c.checked))
}

/// READs (and READ slots) of `size` bytes in flight.
fn reads(size: u32) -> u32 {
    (READ_BYTES / size.max(1)).clamp(1, DEPTH)
}

/// The server's statistics against this side's: for the SENDs and WRITEs, it received some,
/// at most as many as were posted, `-m` bytes each, no errors; for READs, nothing; for
/// `rc_lat`, as many SENDs as were sent, or one less (the last may have come after its end).
fn check_stats(test: Test, size: u32, mine: &Stat, theirs: &Stat) -> Result<(), CaseError> {
    let got = theirs.received;
    if got.errs != 0 || theirs.sent.errs != 0 {
        return Err(CaseError::Stats("errors", got.errs + theirs.sent.errs));
    }
    if got.bytes != got.msgs.saturating_mul(u64::from(size)) {
        return Err(CaseError::Stats("bytes received", got.bytes));
    }
    match test {
        Test::RcBw | Test::RcRdmaWriteBw => {
            if got.msgs == 0 || got.msgs > mine.sent.msgs {
                return Err(CaseError::Stats("messages received", got.msgs));
            }
        }
        Test::RcRdmaReadBw => {
            if got.msgs != 0 || theirs.sent.msgs != 0 {
                return Err(CaseError::Stats("messages counted", got.msgs));
            }
        }
        Test::RcLat => {
            if got.msgs == 0 || got.msgs > mine.sent.msgs || got.msgs + 1 < mine.sent.msgs {
                return Err(CaseError::Stats("SENDs received", got.msgs));
            }
        }
        Test::Quit => {}
    }
    Ok(())
}

/// The verbs and CM side of the test.
struct Client<'s, 'a, P: Provider, C: Clock> {
    cm: &'s mut Cm<'a, P, C, CONNS>,
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    mr: &'s mut MemoryRegion<'a, P>,
    clock_ms: &'s dyn Fn() -> u64,
    deadline: u64,
    linux: [u8; 4],
    test: Test,
    req: Request,
    id: Option<ConnId>,
    qp: Option<QueuePair<'a, P, Rc, Rts>>,
    disconnected: bool,
    checked: u64,
}

impl<'a, P: Provider, C: Clock> Client<'_, 'a, P, C> {
    fn time(&self) -> u64 {
        (self.clock_ms)()
    }

    fn size(&self) -> u32 {
        self.req.msg_size
    }

    /// Runs the CM once; the server's DREQ (or the answer to ours) noted.
    fn cm_event(&mut self) -> Option<CmEvent<'a, P>> {
        let ev = self.cm.poll()?;
        if matches!(&ev, CmEvent::Disconnected { id } if Some(*id) == self.id) {
            self.disconnected = true;
        }
        Some(ev)
    }

    /// Posts the test's work request for `slot`: the SEND or WRITE from the send buffer, or a
    /// READ into slot `wr_id - WR_BASE` (its sentinel checked away on completion).
    fn post(&mut self, peer: &Node, slot: u32) -> Result<(), CaseError> {
        let size = self.size();
        let test = self.test;
        let sge = match test {
            Test::RcRdmaReadBw => self.mr.sge(size + slot * size, size),
            _ => self.mr.sge(0, size),
        }
        .at("qperf: sge")?;
        let qp = self.qp.as_mut().ok_or(CaseError::Disconnected)?;
        let id = WR_BASE + u64::from(slot);
        let remote = (peer.vaddr, peer.rkey);
        // SAFETY: the region outlives the QP (destroyed in `cleanup`, before the region
        // goes); the send buffer is never written, a READ slot only after its completion.
        unsafe {
            let mut s = qp.send_batch();
            match test {
                Test::RcRdmaWriteBw => s.rdma_write_imm(id, SendFlags::SIGNALED, remote, 0, &[sge]),
                Test::RcRdmaReadBw => s.rdma_read(id, SendFlags::SIGNALED, remote, &[sge]),
                _ => s.send(id, SendFlags::SIGNALED, &[sge]),
            }
            .at("qperf: post")?;
            s.finish();
        }
        Ok(())
    }

    /// `rc_lat`'s one receive, into the slot after the send buffer.
    fn post_recv(&mut self) -> Result<(), CaseError> {
        let size = self.size();
        let sge = self.mr.sge(size, size).at("qperf: sge")?;
        let qp = self.qp.as_mut().ok_or(CaseError::Disconnected)?;
        // SAFETY: as in `post`; the slot is read only after the receive completed.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(WR_RECV, &[sge]).at("qperf: post receive")?;
            r.finish();
        }
        Ok(())
    }

    /// Checks that slot `slot` (after the send buffer) holds `-m` zeros, then refills it
    /// with the sentinel.
    fn take_slot(&mut self, slot: u32, what: &'static str) -> Result<(), CaseError> {
        let size = self.size() as usize;
        let at = size + slot as usize * size;
        let b = &mut self.mr.as_mut_slice()[at..at + size];
        if let Some(i) = b.iter().position(|&x| x != 0) {
            return Err(CaseError::Bytes(what, i as u32));
        }
        b.fill(SENTINEL);
        self.checked += size as u64;
        Ok(())
    }

    fn test_loop(&mut self, peer: &Node) -> Result<Stat, CaseError> {
        let t0 = self.time();
        let end = t0 + u64::from(self.req.time) * 1000;
        let size = u64::from(self.size());
        let mut stat = Stat::default();
        let lat = self.test == Test::RcLat;
        let depth = match self.test {
            Test::RcRdmaReadBw => reads(self.size()),
            Test::RcLat => 1,
            _ => DEPTH,
        };
        for slot in 0..depth {
            self.post(peer, slot)?;
            stat.sent.msgs += 1;
            stat.sent.bytes += size;
        }
        // rc_lat: 1 once our SEND completed, 2 once the server's came.
        let mut done = 0u8;
        let mut wcs = [WorkCompletion::default(); 16];
        // Whether the last round posted: the next one polls the CQ (which runs the device,
        // sending what was posted) before it reads the clock, as a read of the clock with no
        // frame in since the last one may halt the CPU until the next interrupt.
        // (One round at most without the clock: the end still comes when completions
        // never stop.)
        let (mut posted, mut skipped) = (true, false);
        loop {
            let skip = posted && !skipped;
            skipped = skip;
            if !skip {
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
            }
            posted = false;
            let n = self.cq.poll(&mut wcs).at("qperf: poll CQ")?;
            stat.max_cqes = stat.max_cqes.max(n as u32);
            for w in &wcs[..n] {
                if w.status != WcStatus::Success {
                    return Err(CaseError::Status(w.status, w.wr_id));
                }
                let slot = w.wr_id.wrapping_sub(WR_BASE);
                match (self.test, w.opcode) {
                    (Test::RcLat, WcOpcode::Recv) if w.wr_id == WR_RECV => {
                        if w.byte_len != self.size() {
                            return Err(CaseError::Length(w.byte_len));
                        }
                        self.take_slot(0, "the server's answer")?;
                        stat.received.msgs += 1;
                        stat.received.bytes += size;
                        self.post_recv()?;
                        posted = true;
                        done |= 2;
                    }
                    (Test::RcLat, WcOpcode::Send) if slot == 0 => done |= 1,
                    (Test::RcRdmaReadBw, WcOpcode::RdmaRead) if slot < u64::from(depth) => {
                        if w.byte_len != self.size() {
                            return Err(CaseError::Length(w.byte_len));
                        }
                        self.take_slot(slot as u32, "a READ's bytes")?;
                        stat.received.msgs += 1;
                        stat.received.bytes += size;
                        self.post(peer, slot as u32)?;
                        posted = true;
                    }
                    (Test::RcBw, WcOpcode::Send) | (Test::RcRdmaWriteBw, WcOpcode::RdmaWrite)
                        if slot < u64::from(depth) =>
                    {
                        self.post(peer, slot as u32)?;
                        stat.sent.msgs += 1;
                        stat.sent.bytes += size;
                        posted = true;
                    }
                    _ => return Err(CaseError::Unexpected(w.opcode, w.wr_id)),
                }
            }
            if lat && done == 3 {
                self.post(peer, 0)?;
                stat.sent.msgs += 1;
                stat.sent.bytes += size;
                posted = true;
                done = 0;
            }
        }
        if self.test == Test::RcRdmaReadBw {
            // READs count as received here, as qperf's client counts them.
            stat.sent = qperf::Counts::default();
        }
        stat.elapsed_ms = self.time() - t0;
        Ok(stat)
    }

    /// The QP to ERROR (its work requests still posted flushed and taken), destroyed.
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
    }

    fn drain(&mut self) {
        let mut wcs = [WorkCompletion::default(); 16];
        for _ in 0..8 {
            let n = self.cq.poll(&mut wcs).unwrap_or(0);
            let _ = self.cm_event();
            if n == 0 {
                break;
            }
        }
    }
}

impl<'a, P: Provider, C: Clock> ClientHooks for Client<'_, 'a, P, C> {
    type Error = CaseError;

    fn now(&mut self) -> u64 {
        self.cm_event();
        self.time()
    }

    fn connect(&mut self, port: u16) -> Result<Node, CaseError> {
        let caps = QpCaps {
            max_send_wr: DEPTH,
            max_recv_wr: 2,
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
        // qperf's rdma_connect: depths 1/1, retry and RNR retry counts 7, no private data.
        let params = ConnectParams {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            private_data: &[],
        };
        // qperf 0.4.11's server names its port before it listens (a later qperf swapped the
        // two): a REQ that comes first is rejected as for nobody listening (reason 8), and
        // is sent again after a pause, with the QP the CM handed back.
        let mut qp = Some(qp);
        let rts = loop {
            let q = qp.take().ok_or(CaseError::Deadline("the QP back"))?;
            let id = self
                .cm
                .connect(q, self.linux, port, &params)
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
                    _ if self.time() > self.deadline => {
                        return Err(CaseError::Deadline("the REP"));
                    }
                    _ => {}
                }
            };
            match outcome {
                Ok(q) => break q,
                Err((CmFailure::Rejected { reason: 8 }, Some(q))) => {
                    self.id = None;
                    qp = Some(q);
                    let until = self.time() + RETRY_MS;
                    while self.time() < until {
                        self.cm_event();
                    }
                    if self.time() > self.deadline {
                        return Err(CaseError::Deadline("the server's CM listener"));
                    }
                }
                Err((failure, _)) => return Err(CaseError::Connect(failure)),
            }
        };
        self.qp = Some(rts);
        // The send buffer zeros (what qperf's client sends), the slots the sentinel.
        let size = self.size() as usize;
        let buf = self.mr.as_mut_slice();
        buf[..size].fill(0);
        buf[size..].fill(SENTINEL);
        if self.test == Test::RcLat {
            self.post_recv()?;
        }
        Ok(Node {
            vaddr: self.mr.addr(),
            rkey: self.mr.rkey(),
            rd_atomic: 1,
            ..Node::default()
        })
    }

    fn run(&mut self, peer: &Node) -> Result<Stat, CaseError> {
        self.test_loop(peer)
    }

    fn finish(&mut self) -> Result<(), CaseError> {
        if let Some(id) = self.id {
            self.cm
                .disconnect(id)
                .map_err(|e| CaseError::Cm("disconnect", e))?;
        }
        while !self.disconnected {
            self.cm_event();
            if self.time() > self.deadline {
                return Err(CaseError::Deadline("the server's DREP"));
            }
        }
        self.cleanup();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::qperf::Counts;

    fn stat(sent: u64, received: u64, size: u64) -> Stat {
        Stat {
            max_cqes: 1,
            elapsed_ms: 2000,
            sent: Counts {
                bytes: sent * size,
                msgs: sent,
                errs: 0,
            },
            received: Counts {
                bytes: received * size,
                msgs: received,
                errs: 0,
            },
        }
    }

    #[test]
    fn the_servers_statistics_must_match_what_was_done() {
        let k = 65536;
        // rc_bw: the server took some of what was posted.
        assert_eq!(
            check_stats(Test::RcBw, 65536, &stat(100, 0, k), &stat(0, 90, k)),
            Ok(())
        );
        assert!(check_stats(Test::RcBw, 65536, &stat(100, 0, k), &stat(0, 0, k)).is_err());
        assert!(check_stats(Test::RcBw, 65536, &stat(100, 0, k), &stat(0, 101, k)).is_err());
        let mut wrong_size = stat(0, 90, k);
        wrong_size.received.bytes += 1;
        assert!(check_stats(Test::RcBw, 65536, &stat(100, 0, k), &wrong_size).is_err());
        let mut errs = stat(0, 90, k);
        errs.received.errs = 1;
        assert!(check_stats(Test::RcRdmaWriteBw, 65536, &stat(100, 0, k), &errs).is_err());
        // READs: the server counts nothing.
        assert_eq!(
            check_stats(Test::RcRdmaReadBw, 65536, &stat(0, 50, k), &stat(0, 0, k)),
            Ok(())
        );
        assert!(check_stats(Test::RcRdmaReadBw, 65536, &stat(0, 50, k), &stat(0, 1, k)).is_err());
        // rc_lat: as many as sent, or one less.
        for (sent, got, ok) in [
            (10, 10, true),
            (10, 9, true),
            (10, 8, false),
            (10, 11, false),
        ] {
            assert_eq!(
                check_stats(Test::RcLat, 1, &stat(sent, sent, 1), &stat(got, got, 1)).is_ok(),
                ok,
                "{sent} {got}"
            );
        }
    }

    #[test]
    fn reads_in_flight_stay_within_their_bytes() {
        assert_eq!(reads(65536), DEPTH);
        assert_eq!(reads(1 << 20), 1);
        assert_eq!(reads(0), DEPTH);
        assert!(reads(300_000) * 300_000 <= READ_BYTES);
    }
}
