//! What the client's tests differ in: the buffer's size, the slots, the receives, the
//! server's answers, the polling loop of `rc_rdma_write_poll_lat`, and the server's
//! statistics checked against what this side did.

use bareverbs::hal::Clock;
use bareverbs::verbs::*;

use super::super::{CaseError, SENTINEL, SERVER_MARK};
use super::{Client, DEPTH, WR_BASE, reads};
use crate::Step;
use crate::tcp::qperf::{Node, Stat, Test};

/// The buffer's bytes: `-m`, 8 for the atomics (qperf's client sends no size for them).
pub(super) fn size(test: Test, msg_size: u32) -> u32 {
    if test.atomic() { 8 } else { msg_size }
}

/// Whether the test's work requests bring bytes into a slot (READs, atomics' old values).
pub(super) fn into_slot(test: Test) -> bool {
    test.atomic() || matches!(test, Test::RcRdmaReadBw | Test::RcRdmaReadLat)
}

/// Work requests in flight: one for the latency tests, the READs' and atomics' slots, else
/// [`DEPTH`].
pub(super) fn depth(test: Test, size: u32) -> u32 {
    match test {
        Test::RcLat | Test::RcRdmaWriteLat | Test::RcRdmaWritePollLat | Test::RcRdmaReadLat => 1,
        _ if into_slot(test) => reads(size),
        _ => DEPTH,
    }
}

/// Receives posted (each in its slot): one for `rc_lat` and `rc_rdma_write_lat`, a slot's
/// worth for `rc_bi_bw`.
pub(super) fn recvs(test: Test, size: u32) -> u32 {
    match test {
        Test::RcLat | Test::RcRdmaWriteLat => 1,
        Test::RcBiBw => reads(size),
        _ => 0,
    }
}

/// A receive's completion: `-m` bytes, and for `rc_rdma_write_lat` the immediate 0.
pub(super) fn answer(test: Test, w: &WorkCompletion, size: u32) -> Result<(), CaseError> {
    if w.byte_len != size {
        return Err(CaseError::Length(w.byte_len));
    }
    if test == Test::RcRdmaWriteLat && (w.imm != 0 || !w.flags.contains(WcFlags::WITH_IMM)) {
        return Err(CaseError::Bytes("the WRITE's immediate", 0));
    }
    Ok(())
}

impl<'a, P: Provider, C: Clock> Client<'_, 'a, P, C> {
    /// `rc_rdma_write_poll_lat`: WRITEs this side's message (its mark at both ends, zeros
    /// between) into the server's buffer, then polls slot 0 (where the server WRITEs) for
    /// the server's mark at both ends and zeros between, puts the sentinel back and WRITEs
    /// again; until the test's time is over.
    pub(super) fn poll_lat_loop(&mut self, peer: &Node) -> Result<Stat, CaseError> {
        let t0 = self.time();
        let end = t0 + u64::from(self.req.time) * 1000;
        let size = self.size() as usize;
        let mut stat = Stat::default();
        let mut in_flight = 1u32;
        self.post(peer, 0)?;
        stat.sent.msgs += 1;
        stat.sent.bytes += size as u64;
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
            // Polling the CQ runs the device: the server's WRITE lands meanwhile.
            let n = self.cq.poll(&mut wcs).at("qperf: poll CQ")?;
            stat.max_cqes = stat.max_cqes.max(n as u32);
            for w in &wcs[..n] {
                if w.status != WcStatus::Success {
                    return Err(CaseError::Status(w.status, w.wr_id));
                }
                if w.opcode != WcOpcode::RdmaWrite || w.wr_id != WR_BASE || in_flight == 0 {
                    return Err(CaseError::Unexpected(w.opcode, w.wr_id));
                }
                in_flight -= 1;
            }
            let b = &mut self.mr.as_mut_slice()[size..2 * size];
            if b[0] == SERVER_MARK && b[size - 1] == SERVER_MARK {
                let inner = &b[1..size.saturating_sub(1).max(1)];
                if let Some(i) = inner.iter().position(|&x| x != 0) {
                    return Err(CaseError::Bytes("the server's WRITE", i as u32 + 1));
                }
                b.fill(SENTINEL);
                self.checked += size as u64;
                stat.received.msgs += 1;
                stat.received.bytes += size as u64;
                owed = true;
            }
            if owed && in_flight < DEPTH {
                self.post(peer, 0)?;
                in_flight += 1;
                stat.sent.msgs += 1;
                stat.sent.bytes += size as u64;
                owed = false;
            }
        }
        stat.elapsed_ms = self.time() - t0;
        Ok(stat)
    }
}

/// The server's statistics against this side's: no errors, `-m` bytes a message; for the
/// SENDs and WRITEs, it received some, at most as many as were posted (`rc_bi_bw`: and it
/// SENT at least as many as arrived here); for READs and atomics, nothing (qperf's server
/// only waits); for the latency tests, as many as were sent, or one less (the last may have
/// come after its end).
pub(super) fn check_stats(
    test: Test,
    size: u32,
    mine: &Stat,
    theirs: &Stat,
) -> Result<(), CaseError> {
    let got = theirs.received;
    if got.errs != 0 || theirs.sent.errs != 0 {
        return Err(CaseError::Stats("errors", got.errs + theirs.sent.errs));
    }
    if got.bytes != got.msgs.saturating_mul(u64::from(size)) {
        return Err(CaseError::Stats("bytes received", got.bytes));
    }
    let bad = match test {
        Test::RcBw | Test::RcRdmaWriteBw | Test::RcBiBw => {
            if got.msgs == 0 || got.msgs > mine.sent.msgs {
                Some(("messages received", got.msgs))
            } else if test == Test::RcBiBw
                && (mine.received.msgs == 0 || mine.received.msgs > theirs.sent.msgs)
            {
                Some(("SENDs sent", theirs.sent.msgs))
            } else {
                None
            }
        }
        _ if into_slot(test) => {
            (got.msgs != 0 || theirs.sent.msgs != 0).then_some(("messages counted", got.msgs))
        }
        Test::RcLat | Test::RcRdmaWriteLat | Test::RcRdmaWritePollLat => {
            (got.msgs == 0 || got.msgs > mine.sent.msgs || got.msgs + 1 < mine.sent.msgs)
                .then_some(("messages received", got.msgs))
        }
        _ => None,
    };
    match bad {
        Some((what, n)) => Err(CaseError::Stats(what, n)),
        None => Ok(()),
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
        // rc_bi_bw: both ways, each side's count within what the other posted.
        let bi = Test::RcBiBw;
        assert_eq!(
            check_stats(bi, 65536, &stat(100, 80, k), &stat(90, 95, k)),
            Ok(())
        );
        assert!(check_stats(bi, 65536, &stat(100, 91, k), &stat(90, 95, k)).is_err());
        assert!(check_stats(bi, 65536, &stat(100, 0, k), &stat(90, 95, k)).is_err());
        assert!(check_stats(bi, 65536, &stat(100, 80, k), &stat(90, 101, k)).is_err());
        // READs and atomics: the server counts nothing.
        for t in [
            Test::RcRdmaReadBw,
            Test::RcRdmaReadLat,
            Test::RcCompareSwapMr,
            Test::RcFetchAddMr,
        ] {
            assert_eq!(check_stats(t, 8, &stat(0, 50, 8), &stat(0, 0, 8)), Ok(()));
            assert!(check_stats(t, 8, &stat(0, 50, 8), &stat(0, 1, 8)).is_err());
            assert!(check_stats(t, 8, &stat(0, 50, 8), &stat(1, 0, 8)).is_err());
        }
        // The latency tests: as many as sent, or one less.
        for t in [Test::RcLat, Test::RcRdmaWriteLat, Test::RcRdmaWritePollLat] {
            for (sent, got, ok) in [
                (10, 10, true),
                (10, 9, true),
                (10, 8, false),
                (10, 11, false),
            ] {
                assert_eq!(
                    check_stats(t, 1, &stat(sent, sent, 1), &stat(got, got, 1)).is_ok(),
                    ok,
                    "{t:?} {sent} {got}"
                );
            }
        }
    }

    #[test]
    fn atomics_use_one_word_and_the_latency_tests_one_request() {
        assert_eq!(size(Test::RcFetchAddMr, 0), 8);
        assert_eq!(size(Test::RcCompareSwapMr, 65536), 8);
        assert_eq!(size(Test::RcBiBw, 65536), 65536);
        assert_eq!(depth(Test::RcFetchAddMr, 8), DEPTH);
        for t in [Test::RcRdmaReadLat, Test::RcRdmaWriteLat, Test::RcLat] {
            assert_eq!(depth(t, 1), 1, "{t:?}");
        }
        assert_eq!(recvs(Test::RcBiBw, 65536), DEPTH);
        assert_eq!(recvs(Test::RcRdmaWritePollLat, 1), 0);
    }
}
