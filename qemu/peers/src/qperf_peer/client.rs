//! The unikernel as qperf's client, against Linux's `qperf` server (`…-server` cases): it
//! sends the request qperf 0.4.11's client would for `qperf <linux> -cm1 -t T -m M TEST`
//! (no size for the atomics),
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
//! | `rc_bi_bw` | SENDs as for `rc_bw` while taking the server's SENDs into [`DEPTH`] receive slots | every message received `-m` zeros; as `rc_bw`, and no more received than the server SENT |
//! | `rc_rdma_write_lat` | a WRITE with immediate 0, then waits for the server's (into a slot after its send buffer) | every answer `-m` zeros with immediate 0; as `rc_lat` |
//! | `rc_rdma_write_poll_lat` | a WRITE (its mark `0x55` at both ends), then polls its slot for the server's (`0xAA`) | zeros between the server's marks; as `rc_lat` |
//! | `rc_rdma_read_lat` | READs the server's buffer, one READ at a time | as `rc_rdma_read_bw` |
//! | `rc_compare_swap_mr`, `rc_fetch_add_mr` | qperf's atomics on the server's word: compare 0 swap 0, add 0, [`DEPTH`] posted | every atomic returned 0 (qperf's zeroed word, which these atomics leave zero), into a slot that held a sentinel; the server counted nothing |

use core::fmt::Write;

use bareverbs::Context;
use bareverbs::cm::{Cm, CmConfig, CmEvent, ConnId, ConnectParams, Failure as CmFailure};
use bareverbs::hal::Clock;
use bareverbs::verbs::*;
use bareverbs_hal::Link;

use super::{CLIENT_MARK, CONNS, CaseError, Error, Ms, QperfCase, SENTINEL};
use crate::roce_peer::CONNECT_RETRY;
use crate::tcp::Stack;
use crate::tcp::qperf::{self, ClientHooks, Node, Request, Stat, Test};
use crate::{Failure, Step};

mod more;
use more::check_stats;

/// Work requests in flight at most (SENDs, WRITEs, READs).
pub const DEPTH: u32 = 8;
/// READ slots take at most this many bytes; READs in flight are bounded by it too.
const READ_BYTES: u32 = 1 << 20;
/// Milliseconds between two connection attempts while the server does not listen yet.
const RETRY_MS: u64 = 100;
/// Work request IDs: the receives from `WR_RECV` (+ slot: `rc_lat`'s and
/// `rc_rdma_write_lat`'s one, `rc_bi_bw`'s); the SENDs, WRITEs, READs and atomics from
/// `WR_BASE` (+ slot).
const WR_RECV: u64 = 0x1000;
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
                Test::RcRdmaReadBw | Test::RcRdmaReadLat => ("READs", mine.received.msgs),
                Test::RcCompareSwapMr => ("compare-and-swaps", mine.received.msgs),
                Test::RcFetchAddMr => ("fetch-and-adds", mine.received.msgs),
                Test::RcLat | Test::RcRdmaWriteLat | Test::RcRdmaWritePollLat => {
                    ("rounds", mine.received.msgs)
                }
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
    // The send buffer (zeros, -m bytes: 8 for the atomics), then the receive, READ or
    // atomic slots.
    let size = more::size(case.test, req.msg_size);
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
        more::size(self.test, self.req.msg_size)
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
            _ if more::into_slot(test) => self.mr.sge(size + slot * size, size),
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
            let f = SendFlags::SIGNALED;
            // qperf's atomics: compare 0 and swap 0, add 0.
            match test {
                Test::RcRdmaWriteBw | Test::RcRdmaWriteLat => {
                    s.rdma_write_imm(id, f, remote, 0, &[sge])
                }
                Test::RcRdmaWritePollLat => s.rdma_write(id, f, remote, &[sge]),
                Test::RcRdmaReadBw | Test::RcRdmaReadLat => s.rdma_read(id, f, remote, &[sge]),
                Test::RcCompareSwapMr => s.atomic_cmp_swp(id, f, remote, (0, 0), &sge),
                Test::RcFetchAddMr => s.atomic_fetch_add(id, f, remote, 0, &sge),
                _ => s.send(id, f, &[sge]),
            }
            .at("qperf: post")?;
            s.finish();
        }
        Ok(())
    }

    /// A receive into slot `slot` after the send buffer (`rc_lat`'s one is slot 0).
    fn post_recv(&mut self, slot: u32) -> Result<(), CaseError> {
        let size = self.size();
        let sge = self.mr.sge(size + slot * size, size).at("qperf: sge")?;
        let qp = self.qp.as_mut().ok_or(CaseError::Disconnected)?;
        // SAFETY: as in `post`; the slot is read only after the receive completed.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(WR_RECV + u64::from(slot), &[sge])
                .at("qperf: post receive")?;
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
        if self.test == Test::RcRdmaWritePollLat {
            return self.poll_lat_loop(peer);
        }
        let t0 = self.time();
        let end = t0 + u64::from(self.req.time) * 1000;
        let size = u64::from(self.size());
        let mut stat = Stat::default();
        let test = self.test;
        let lat = matches!(test, Test::RcLat | Test::RcRdmaWriteLat);
        let depth = more::depth(test, self.size());
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
                let rslot = w.wr_id.wrapping_sub(WR_RECV);
                match (test, w.opcode) {
                    (Test::RcLat | Test::RcBiBw, WcOpcode::Recv)
                    | (Test::RcRdmaWriteLat, WcOpcode::RecvRdmaWithImm)
                        if rslot < u64::from(more::recvs(test, self.size())) =>
                    {
                        more::answer(test, w, self.size())?;
                        self.take_slot(rslot as u32, "the server's message")?;
                        stat.received.msgs += 1;
                        stat.received.bytes += size;
                        self.post_recv(rslot as u32)?;
                        posted = true;
                        done |= 2;
                    }
                    (Test::RcLat, WcOpcode::Send) | (Test::RcRdmaWriteLat, WcOpcode::RdmaWrite)
                        if slot == 0 =>
                    {
                        done |= 1
                    }
                    (Test::RcRdmaReadBw | Test::RcRdmaReadLat, WcOpcode::RdmaRead)
                    | (Test::RcCompareSwapMr, WcOpcode::CompSwap)
                    | (Test::RcFetchAddMr, WcOpcode::FetchAdd)
                        if slot < u64::from(depth) =>
                    {
                        if !test.atomic() && w.byte_len != self.size() {
                            return Err(CaseError::Length(w.byte_len));
                        }
                        let what = match test.atomic() {
                            true => "the value an atomic returned",
                            false => "a READ's bytes",
                        };
                        self.take_slot(slot as u32, what)?;
                        stat.received.msgs += 1;
                        stat.received.bytes += size;
                        self.post(peer, slot as u32)?;
                        posted = true;
                    }
                    (Test::RcBw | Test::RcBiBw, WcOpcode::Send)
                    | (Test::RcRdmaWriteBw, WcOpcode::RdmaWrite)
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
        if more::into_slot(test) {
            // READs and atomics count as received here, as qperf's client counts them.
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
            max_recv_wr: DEPTH,
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
        // (rc_rdma_write_poll_lat: this side's mark at both ends, as qperf's client writes.)
        let size = self.size() as usize;
        let buf = self.mr.as_mut_slice();
        buf[..size].fill(0);
        buf[size..].fill(SENTINEL);
        if self.test == Test::RcRdmaWritePollLat {
            buf[0] = CLIENT_MARK;
            buf[size - 1] = CLIENT_MARK;
        }
        for slot in 0..more::recvs(self.test, size as u32) {
            self.post_recv(slot)?;
        }
        // The server's WRITEs (the latency tests) land in slot 0, after the send buffer.
        let into = match self.test {
            Test::RcRdmaWriteLat | Test::RcRdmaWritePollLat => size as u64,
            _ => 0,
        };
        Ok(Node {
            vaddr: self.mr.addr() + into,
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

    #[test]
    fn reads_in_flight_stay_within_their_bytes() {
        assert_eq!(reads(65536), DEPTH);
        assert_eq!(reads(1 << 20), 1);
        assert_eq!(reads(0), DEPTH);
        assert!(reads(300_000) * 300_000 <= READ_BYTES);
    }
}
