//! The control connection: one SEND each way per exchange, into the peer's one receive.

use bareverbs::hal::Clock;
use bareverbs::verbs::*;

use super::super::{CaseError, Session, WR_RECV, WR_SEND};
use super::{CTL_RECV_AT, CTL_SEND_AT, DEST_LEN};
use crate::Step;

impl<'a, P: Provider, C: Clock> Session<'_, 'a, P, C> {
    /// Posts the control QP's one receive.
    pub(super) fn post_ctl_recv(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
    ) -> Result<(), CaseError> {
        let sge = self.mr.sge(CTL_RECV_AT, DEST_LEN as u32).at("cm: sge")?;
        // SAFETY: the region outlives the QP (destroyed first on every path of the case); the
        // CPU reads the buffer only after the receive's completion.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(WR_RECV, &[sge]).at("cm: post receive")?;
            r.finish();
        }
        Ok(())
    }

    /// One control message each way: the side that connected sends first. Returns the
    /// peer's, which must be `len` bytes (zero-padded to 56).
    pub(super) fn xchg(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        client: bool,
        mine: &[u8],
        len: u32,
        what: &'static str,
    ) -> Result<[u8; DEST_LEN], CaseError> {
        if client {
            self.ctl_send(qp, mine)?;
            self.ctl_recv(qp, len, what)
        } else {
            let m = self.ctl_recv(qp, len, what)?;
            self.ctl_send(qp, mine)?;
            Ok(m)
        }
    }

    fn ctl_send(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        bytes: &[u8],
    ) -> Result<(), CaseError> {
        let at = CTL_SEND_AT as usize;
        let n = bytes.len().min(DEST_LEN);
        self.mr.as_mut_slice()[at..at + n].copy_from_slice(&bytes[..n]);
        let sge = self.mr.sge(CTL_SEND_AT, n as u32).at("cm: sge")?;
        // SAFETY: as in `post_ctl_recv`; the buffer is written again only after the SEND's
        // completion.
        unsafe {
            let mut s = qp.send_batch();
            s.send(WR_SEND, SendFlags::SIGNALED, &[sge])
                .at("cm: post SEND")?;
            s.finish();
        }
        self.wait(WR_SEND, "a control SEND's completion")?;
        Ok(())
    }

    fn ctl_recv(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        len: u32,
        what: &'static str,
    ) -> Result<[u8; DEST_LEN], CaseError> {
        let w = self.wait(WR_RECV, what)?;
        if w.byte_len != len || w.opcode != WcOpcode::Recv || w.flags.contains(WcFlags::WITH_IMM) {
            return Err(CaseError::Message {
                what,
                index: 0,
                at: u32::MAX,
            });
        }
        let mut m = [0u8; DEST_LEN];
        let at = CTL_RECV_AT as usize;
        m[..len as usize].copy_from_slice(&self.mr.as_slice()[at..at + len as usize]);
        self.post_ctl_recv(qp)?;
        Ok(m)
    }
}
