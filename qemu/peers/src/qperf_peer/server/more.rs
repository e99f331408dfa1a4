//! The server's side of qperf's tests that send back (`rc_bi_bw`, `rc_rdma_write_lat`,
//! `rc_rdma_write_poll_lat`): what it posts, and the polling loop of `rc_rdma_write_poll_lat`.

use bareverbs::hal::Clock;
use bareverbs::verbs::*;

use super::super::{CLIENT_MARK, CaseError, GUARD, SEND_AT_MOST, SEND_ID, SENTINEL};
use super::Server;
use crate::Step;
use crate::tcp::qperf::{Request, Stat, Test};

/// SENDs `rc_bi_bw`'s server keeps in flight (its QP's send queue).
pub(super) const SENDS: u32 = 4;

/// Where this side's send buffer starts: after the buffer and its guard, or for `rc_bi_bw`
/// after the receive slots (up to 1 MiB).
pub(super) fn send_at(test: Test, size: u32) -> u32 {
    match test {
        Test::RcBiBw => SEND_AT_MOST,
        _ => size + GUARD,
    }
}

impl<'a, P: Provider, C: Clock> Server<'_, 'a, P, C> {
    /// Posts this side's message from the send buffer: a SEND (`rc_lat`, `rc_bi_bw`), a
    /// WRITE with immediate 0 (`rc_rdma_write_lat`) or a WRITE (`rc_rdma_write_poll_lat`)
    /// into the client's buffer; counted as sent.
    pub(super) fn post_out(&mut self, test: Test, stat: &mut Stat) -> Result<(), CaseError> {
        let size = self.size();
        if self.sends >= SENDS {
            return Err(CaseError::Deadline("room on the send queue"));
        }
        let sge = self.mr.sge(send_at(test, size), size).at("qperf: sge")?;
        let remote = (self.peer.vaddr, self.peer.rkey);
        let qp = self.qp.as_mut().ok_or(CaseError::Disconnected)?;
        // SAFETY: the region outlives the QP (destroyed in `cleanup`, before the region
        // goes); the send buffer is never written while a work request is posted.
        unsafe {
            let mut s = qp.send_batch();
            let flags = SendFlags::SIGNALED;
            match test {
                Test::RcRdmaWriteLat => s.rdma_write_imm(SEND_ID, flags, remote, 0, &[sge]),
                Test::RcRdmaWritePollLat => s.rdma_write(SEND_ID, flags, remote, &[sge]),
                _ => s.send(SEND_ID, flags, &[sge]),
            }
            .at("qperf: post")?;
            s.finish();
        }
        self.sends += 1;
        stat.sent.msgs += 1;
        stat.sent.bytes += u64::from(size);
        Ok(())
    }

    /// One of this side's messages completed (of the opcode the test posts).
    pub(super) fn sent(&mut self, test: Test, w: &WorkCompletion) -> Result<(), CaseError> {
        let want = match test {
            Test::RcRdmaWriteLat | Test::RcRdmaWritePollLat => WcOpcode::RdmaWrite,
            _ => WcOpcode::Send,
        };
        if w.opcode != want || self.sends == 0 {
            return Err(CaseError::Unexpected(w.opcode, w.wr_id));
        }
        self.sends -= 1;
        Ok(())
    }

    /// `rc_rdma_write_poll_lat`: waits for the client's WRITE (its mark at both ends of the
    /// buffer, zeros between), puts the sentinel back and WRITEs this side's message (its
    /// mark at both ends) into the client's buffer; until the test's time is over.
    pub(super) fn poll_lat_loop(&mut self, req: &Request) -> Result<Stat, CaseError> {
        let test = Test::RcRdmaWritePollLat;
        let t0 = self.time();
        let end = t0 + u64::from(req.time) * 1000;
        let size = self.size() as usize;
        let mut stat = Stat::default();
        // Whether the client's message came while the send queue was full.
        let mut owed = false;
        let mut wcs = [WorkCompletion::default(); 16];
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
            // Polling the CQ runs the device: the client's WRITE lands meanwhile.
            let n = self.cq.poll(&mut wcs).at("qperf: poll CQ")?;
            stat.max_cqes = stat.max_cqes.max(n as u32);
            for w in &wcs[..n] {
                if w.status != WcStatus::Success {
                    return Err(CaseError::Status(w.status, w.wr_id));
                }
                if w.wr_id != SEND_ID {
                    return Err(CaseError::Unexpected(w.opcode, w.wr_id));
                }
                self.sent(test, w)?;
            }
            let b = &mut self.mr.as_mut_slice()[..size];
            if b[0] == CLIENT_MARK && b[size - 1] == CLIENT_MARK {
                let inner = &b[1..size.saturating_sub(1).max(1)];
                if let Some(i) = inner.iter().position(|&x| x != 0) {
                    return Err(CaseError::Bytes("the client's WRITE", i as u32 + 1));
                }
                b.fill(SENTINEL);
                self.checked += size as u64;
                stat.received.msgs += 1;
                stat.received.bytes += size as u64;
                owed = true;
            }
            if owed && self.sends < SENDS {
                self.post_out(test, &mut stat)?;
                owed = false;
            }
        }
        stat.elapsed_ms = self.time() - t0;
        Ok(stat)
    }
}
