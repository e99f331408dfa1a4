//! The reference model's behaviour: what every operation and every completion must be, as
//! the model's loopback execution gives it under each semantics.

use super::*;

impl Ref {
    pub(crate) fn wr_id(&mut self) -> u64 {
        // Distinct (an odd multiplier is a bijection) and using all 64 bits.
        self.next_wr += 1;
        self.next_wr.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    pub(crate) fn qp_by_qpn(&self, qpn: u32) -> Option<usize> {
        self.qps
            .iter()
            .position(|q| q.qpn == qpn && q.st != St::Gone)
    }

    /// What writing send request number `pending` of a batch must give.
    pub(crate) fn expect_sq_write(
        &self,
        q: usize,
        pending: usize,
        nsge: usize,
    ) -> Result<(), Error> {
        let p = &self.qps[q];
        if p.sq.len() + pending >= p.caps.max_send_wr as usize {
            return Err(Error::QueueFull {
                queue: Queue::Send,
                free: 0,
            });
        }
        if nsge > p.caps.max_send_sge as usize {
            return Err(Error::InvalidInput {
                param: Param::NumSge,
                value: nsge as u64,
                max: p.caps.max_send_sge.into(),
            });
        }
        Ok(())
    }

    pub(crate) fn expect_rq_write(
        &self,
        q: usize,
        pending: usize,
        nsge: usize,
    ) -> Result<(), Error> {
        let p = &self.qps[q];
        let full = Error::QueueFull {
            queue: Queue::Recv,
            free: 0,
        };
        if TOPO[q].srq || p.rq.len() + pending >= p.caps.max_recv_wr as usize {
            return Err(full);
        }
        if nsge > p.caps.max_recv_sge as usize {
            return Err(Error::InvalidInput {
                param: Param::NumSge,
                value: nsge as u64,
                max: p.caps.max_recv_sge.into(),
            });
        }
        Ok(())
    }

    /// Whether a send to `j` would consume a receive the driver already completed or
    /// discarded (the device still holds it: see `late_receive_*` below).
    pub(crate) fn late_risk(&self, j: usize) -> bool {
        !TOPO[j].srq
            && self.qps[j]
                .dev_rq
                .front()
                .is_some_and(|&w| self.wrs[w].done)
    }

    pub(crate) fn post_recv(
        &mut self,
        q: usize,
        wr_id: u64,
        room: u32,
        bad_lkey: bool,
        raw: Option<usize>,
        buf: Option<u32>,
    ) {
        let w = self.wrs.len();
        self.wrs.push(Wr {
            wq: if q == usize::MAX { Wq::Srq } else { Wq::Rq },
            wr_id,
            buf,
            room,
            bad_lkey,
            raw,
            exec: None,
            done: false,
            parked: false,
        });
        if buf.is_some() {
            self.in_qps += 1;
        }
        if q == usize::MAX {
            self.srq_out.push(w);
            self.srq_dev.push_back(w);
        } else {
            self.qps[q].rq.push_back(w);
            self.qps[q].dev_rq.push_back(w);
            if self.qps[q].dev_err {
                // Taken at the doorbell by a QP in ERROR: flushed there.
                self.flush_dev_rq(q);
            }
        }
    }

    pub(crate) fn pop_recv(&mut self, j: usize) -> Option<usize> {
        if TOPO[j].srq {
            self.srq_dev.pop_front()
        } else {
            self.qps[j].dev_rq.pop_front()
        }
    }

    /// A receive executed: its CQE goes to its consumer's receive CQ.
    pub(crate) fn deliver(&mut self, r: usize, e: Exec) {
        let q = e.consumer;
        self.wrs[r].exec = Some(e);
        self.rings[TOPO[q].rcq].push_back((q, r));
    }

    /// A send published at the doorbell: the model runs it there and then.
    pub(crate) fn post_send(&mut self, q: usize, wr_id: u64, s: &Resolved) {
        let w = self.wrs.len();
        self.wrs.push(Wr {
            wq: Wq::Sq,
            wr_id,
            buf: s.buf,
            room: 0,
            bad_lkey: false,
            raw: s.raw,
            exec: None,
            done: false,
            parked: false,
        });
        if s.buf.is_some() {
            self.in_qps += 1;
        }
        self.qps[q].sq.push_back(w);
        let e = self.execute(q, wr_id, s);
        self.wrs[w].exec = Some(e);
        self.rings[TOPO[q].scq].push_back((q, w));
    }

    /// The model's run of one send WQE (tests/model/src/datapath.rs), as the reference sees
    /// it: flushed on a QP the device moved to ERROR, else executed; a failed RC request
    /// moves its QP to ERROR (`Semantics::Verbs`).
    pub(crate) fn execute(&mut self, q: usize, wr_id: u64, s: &Resolved) -> Exec {
        if self.qps[q].dev_err {
            let op = match s.kind {
                Kind::Write | Kind::WriteImm => WcOpcode::RdmaWrite,
                Kind::Read => WcOpcode::RdmaRead,
                Kind::Send | Kind::SendImm => WcOpcode::Send,
            };
            return Exec {
                wc: WorkCompletion {
                    opcode: op,
                    ..flush_wc(wr_id, self.qps[q].qpn, false)
                },
                vendor_err: 0,
                consumer: q,
                data: None,
                grh: false,
            };
        }
        let e = self.run(q, wr_id, s);
        if e.wc.status != WcStatus::Success {
            self.enter_error(q, false);
        }
        e
    }

    /// `Semantics::Verbs`: RC QP `q` goes to ERROR (the model's `enter_error`); a responder's
    /// receives the device holds are flushed at once, a requester's when its send queue's run
    /// ends ([`end_run`](Self::end_run)).
    pub(crate) fn enter_error(&mut self, q: usize, responder: bool) {
        if !self.strict || TOPO[q].ud {
            return;
        }
        self.qps[q].dev_err = true;
        if responder {
            self.flush_dev_rq(q);
        } else {
            self.qps[q].flush_rq = true;
        }
    }

    /// Completes every receive QP `q`'s device holds (not its SRQ's) as flushed.
    pub(crate) fn flush_dev_rq(&mut self, q: usize) {
        self.qps[q].flush_rq = false;
        let qpn = self.qps[q].qpn;
        while let Some(r) = self.qps[q].dev_rq.pop_front() {
            let wc = flush_wc(self.wrs[r].wr_id, qpn, true);
            self.deliver(
                r,
                Exec {
                    wc,
                    vendor_err: 0,
                    consumer: q,
                    data: None,
                    grh: false,
                },
            );
        }
    }

    /// The end of a send doorbell's run on QP `q`: a requester that failed in it has its
    /// receives flushed now (the order rxe flushes in).
    pub(crate) fn end_run(&mut self, q: usize) {
        if self.qps[q].flush_rq {
            self.flush_dev_rq(q);
        }
    }

    /// The model's `execute` (tests/model/src/datapath.rs), as the reference sees it.
    pub(crate) fn run(&mut self, q: usize, wr_id: u64, s: &Resolved) -> Exec {
        let me = self.qps[q].qpn;
        let kind = if self.qemu { Kind::Send } else { s.kind };
        let sender = |status: WcStatus, opcode: WcOpcode, byte_len: u32| Exec {
            wc: WorkCompletion {
                wr_id,
                byte_len,
                qp_num: me,
                status,
                opcode,
                ..WorkCompletion::default()
            },
            vendor_err: if status == WcStatus::Success {
                0
            } else {
                0x201
            },
            consumer: q,
            data: None,
            grh: false,
        };
        // The gather list (an RDMA READ gathers nothing).
        let data = if kind == Kind::Read {
            Vec::new()
        } else if s.bad_lkey && s.nsge > 0 {
            // With the completion opcode of the work request, as rxe gives it.
            let op = match kind {
                Kind::Write | Kind::WriteImm => WcOpcode::RdmaWrite,
                _ => WcOpcode::Send,
            };
            return sender(WcStatus::LocProtErr, op, 0);
        } else {
            s.payload.clone()
        };
        // The destination.
        let (dest, ud) = match s.ud {
            Some((qpn, qkey)) => match self.qp_by_qpn(qpn) {
                Some(j) if TOPO[j].ud && qkey == QKEY => (j, true),
                // Nowhere, not UD, wrong Q_Key: dropped on the wire.
                _ => return sender(WcStatus::Success, WcOpcode::Send, data.len() as u32),
            },
            None => {
                let j = TOPO[q].peer;
                if self.qps[j].st == St::Gone {
                    return sender(WcStatus::RetryExcErr, WcOpcode::Send, 0);
                }
                if self.qps[j].dev_err {
                    // A responder in ERROR drops every request: the retries run out.
                    let op = match kind {
                        Kind::Write | Kind::WriteImm => WcOpcode::RdmaWrite,
                        Kind::Read => WcOpcode::RdmaRead,
                        Kind::Send | Kind::SendImm => WcOpcode::Send,
                    };
                    return sender(WcStatus::RetryExcErr, op, 0);
                }
                (j, false)
            }
        };
        let dest_qpn = self.qps[dest].qpn;
        let len = data.len();
        match kind {
            Kind::Write | Kind::WriteImm => {
                let has_recv = if TOPO[dest].srq {
                    !self.srq_dev.is_empty()
                } else {
                    !self.qps[dest].dev_rq.is_empty()
                };
                if self.strict && kind == Kind::WriteImm && len <= PATH_MTU && !has_recv {
                    // A one-packet WRITE with immediate: rxe checks for the receive (RNR)
                    // before the key (a longer one has its key checked by its first packet).
                    return sender(WcStatus::RnrRetryExcErr, WcOpcode::RdmaWrite, 0);
                }
                if !s.remote_ok {
                    self.enter_error(dest, true);
                    return sender(WcStatus::RemAccessErr, WcOpcode::RdmaWrite, 0);
                }
                if kind == Kind::WriteImm {
                    let Some(r) = self.pop_recv(dest) else {
                        return sender(WcStatus::RnrRetryExcErr, WcOpcode::RdmaWrite, 0);
                    };
                    self.deliver(
                        r,
                        Exec {
                            wc: WorkCompletion {
                                wr_id: self.wrs[r].wr_id,
                                byte_len: len as u32,
                                imm: s.imm,
                                qp_num: dest_qpn,
                                src_qp: me,
                                status: WcStatus::Success,
                                opcode: WcOpcode::RecvRdmaWithImm,
                                flags: WcFlags::WITH_IMM,
                            },
                            vendor_err: 0,
                            consumer: dest,
                            data: None,
                            grh: false,
                        },
                    );
                }
                self.shadow[s.remote_off..s.remote_off + len].copy_from_slice(&data);
                sender(WcStatus::Success, WcOpcode::RdmaWrite, len as u32)
            }
            Kind::Read => {
                let len = s.payload.len();
                if !s.remote_ok {
                    self.enter_error(dest, true);
                    return sender(WcStatus::RemAccessErr, WcOpcode::RdmaRead, 0);
                }
                if s.bad_lkey && len > 0 {
                    return sender(WcStatus::LocProtErr, WcOpcode::RdmaRead, 0);
                }
                let bytes = self.shadow[s.remote_off..s.remote_off + len].to_vec();
                Exec {
                    data: Some(bytes),
                    ..sender(WcStatus::Success, WcOpcode::RdmaRead, len as u32)
                }
            }
            Kind::Send | Kind::SendImm => {
                let Some(r) = self.pop_recv(dest) else {
                    return match ud {
                        true => sender(WcStatus::Success, WcOpcode::Send, len as u32),
                        false => sender(WcStatus::RnrRetryExcErr, WcOpcode::Send, 0),
                    };
                };
                let plen = len + if ud { GRH } else { 0 };
                let (room, bad) = (self.wrs[r].room as usize, self.wrs[r].bad_lkey);
                let recv_err = if room < plen {
                    Some(WcStatus::LocLenErr)
                } else if bad && plen > 0 {
                    Some(WcStatus::LocProtErr)
                } else {
                    None
                };
                let r_id = self.wrs[r].wr_id;
                match recv_err {
                    Some(st) => {
                        self.deliver(
                            r,
                            Exec {
                                wc: WorkCompletion {
                                    wr_id: r_id,
                                    qp_num: dest_qpn,
                                    src_qp: me,
                                    status: st,
                                    opcode: WcOpcode::Recv,
                                    ..WorkCompletion::default()
                                },
                                vendor_err: 0x201,
                                consumer: dest,
                                data: None,
                                grh: false,
                            },
                        );
                        self.enter_error(dest, true);
                        sender(WcStatus::RemInvReqErr, WcOpcode::Send, 0)
                    }
                    None => {
                        let mut flags = WcFlags::empty();
                        // QEMU passes rxe's completion through: GRH on RC receives too.
                        if ud || self.qemu {
                            flags |= WcFlags::GRH;
                        }
                        if kind == Kind::SendImm {
                            flags |= WcFlags::WITH_IMM;
                        }
                        let imm = if flags.contains(WcFlags::WITH_IMM) {
                            s.imm
                        } else {
                            0
                        };
                        self.deliver(
                            r,
                            Exec {
                                wc: WorkCompletion {
                                    wr_id: r_id,
                                    byte_len: plen as u32,
                                    imm,
                                    qp_num: dest_qpn,
                                    // ... and source QP 0 on RC receives.
                                    src_qp: if self.qemu && !ud { 0 } else { me },
                                    status: WcStatus::Success,
                                    opcode: WcOpcode::Recv,
                                    flags,
                                },
                                vendor_err: 0,
                                consumer: dest,
                                data: Some(data),
                                grh: ud,
                            },
                        );
                        sender(WcStatus::Success, WcOpcode::Send, len as u32)
                    }
                }
            }
        }
    }

    /// Whether a queue in ERR on CQ `c` (of QP `only`, if given) has a request to flush.
    pub(crate) fn flush_due(&self, c: usize, only: Option<usize>) -> bool {
        let unexecuted =
            |f: &VecDeque<usize>| f.front().is_some_and(|&w| self.wrs[w].exec.is_none());
        self.qps.iter().enumerate().any(|(p, x)| {
            x.st == St::Err
                && only.is_none_or(|q| q == p)
                && ((TOPO[p].scq == c && unexecuted(&x.sq))
                    || (TOPO[p].rcq == c && !TOPO[p].srq && unexecuted(&x.rq)))
        })
    }

    /// The next completion `CompletionQueue::poll` must give on CQ `c` (dropping the CQEs
    /// nobody gets, as the driver does).
    pub(crate) fn next_on_cq(&mut self, c: usize) -> Option<Next> {
        while let Some(&(p, w)) = self.rings[c].front() {
            if self.qps[p].st != St::Gone && !self.wrs[w].done {
                return Some(Next::Hw(c, p, w));
            }
            self.rings[c].pop_front();
        }
        self.flush_due(c, None).then_some(Next::Flush)
    }

    /// The next completion `poll_one` of QP `q` must give: from its send CQ, then its receive
    /// CQ, each up to the first CQE of another QP (left for that QP's poll).
    pub(crate) fn next_on_qp(&mut self, q: usize) -> Option<Next> {
        let (s, r) = (TOPO[q].scq, TOPO[q].rcq);
        for c in if s == r { vec![s] } else { vec![s, r] } {
            while let Some(&(p, w)) = self.rings[c].front() {
                if p != q || !self.wrs[w].done {
                    break;
                }
                self.rings[c].pop_front();
            }
            match self.rings[c].front() {
                Some(&(p, w)) if p == q => return Some(Next::Hw(c, p, w)),
                Some(_) => {}
                None if self.flush_due(c, Some(q)) => return Some(Next::Flush),
                None => {}
            }
        }
        None
    }

    /// Checks a completion the driver returned; gives the request it completes.
    pub(crate) fn complete(
        &mut self,
        wc: &WorkCompletion,
        vendor_err: Option<u32>,
        via: Via,
    ) -> Result<usize, String> {
        let next = match via {
            Via::Qp(q) => self.next_on_qp(q),
            Via::Cq(c) => self.next_on_cq(c),
        };
        match next {
            None => return Err(format!("{via:?}: a completion when none was due: {wc:?}")),
            Some(Next::Hw(c, p, w)) => {
                ensure_eq!(
                    (wc.qp_num, wc.wr_id),
                    (self.qps[p].qpn, self.wrs[w].wr_id),
                    "{via:?}: not the CQE at the head of CQ {c} ({wc:?})"
                );
                self.rings[c].pop_front();
            }
            Some(Next::Flush) => ensure_eq!(
                wc.status,
                WcStatus::WrFlushErr,
                "{via:?}: the ring is empty, only a flush is due ({wc:?})"
            ),
        }
        let q = self
            .qp_by_qpn(wc.qp_num)
            .ok_or_else(|| format!("completion for no live QP: {wc:?}"))?;
        let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        if let Via::Cq(c) = via {
            let want = if recv { TOPO[q].rcq } else { TOPO[q].scq };
            ensure!(
                c == want,
                "completion of QP {q} on CQ {c}, not its CQ {want}: {wc:?}"
            );
        }
        let w = if recv && TOPO[q].srq {
            let pos = self
                .srq_out
                .iter()
                .position(|&w| self.wrs[w].wr_id == wc.wr_id)
                .ok_or_else(|| format!("SRQ completion for no outstanding SRQ request: {wc:?}"))?;
            self.srq_out.remove(pos)
        } else {
            let fifo = if recv {
                &mut self.qps[q].rq
            } else {
                &mut self.qps[q].sq
            };
            let Some(&head) = fifo.front() else {
                return Err(format!(
                    "completion on QP {q} ({}) with nothing outstanding: {wc:?}",
                    if recv { "RQ" } else { "SQ" }
                ));
            };
            ensure_eq!(
                wc.wr_id,
                self.wrs[head].wr_id,
                "QP {q}: completion out of posting order ({wc:?})"
            );
            fifo.pop_front();
            head
        };
        let st = self.qps[q].st;
        let wr = &mut self.wrs[w];
        let (want, want_vendor) = match &wr.exec {
            Some(e) => {
                ensure_eq!(e.consumer, q, "completion on the wrong QP");
                (e.wc, e.vendor_err)
            }
            None => {
                ensure!(
                    st == St::Err && wr.wq != Wq::Srq,
                    "QP {q} ({st:?}): completion of a request the device never executed: {wc:?}"
                );
                (flush_wc(wr.wr_id, wc.qp_num, recv), 0)
            }
        };
        ensure_eq!(*wc, want, "QP {q}: work completion");
        if let Some(v) = vendor_err {
            ensure_eq!(v, want_vendor, "QP {q}: vendor_err of {wc:?}");
        }
        // The device took every published receive at its doorbell (the model, as QEMU).
        let held = recv && wr.exec.is_none() && wr.wq == Wq::Rq;
        let wr = &mut self.wrs[w];
        wr.done = true;
        if wr.buf.is_some() {
            if held {
                // Flushed while the device holds it: parked until the QP is destroyed.
                wr.parked = true;
                self.qps[q].parked.push(w);
            } else {
                self.in_qps -= 1;
            }
        }
        Ok(w)
    }

    /// RESET or destroy: outstanding requests are dropped without completions.
    pub(crate) fn discard(&mut self, q: usize) {
        // The QP's CQEs still in the rings go with it (the driver removes them): the requests
        // they completed are done, their buffers free.
        let mut completed = Vec::new();
        for ring in &mut self.rings {
            ring.retain(|&(p, w)| {
                if p == q {
                    completed.push(w);
                }
                p != q
            });
        }
        // SRQ receives among them: completed for the SRQ, never to be polled.
        for &w in &completed {
            if self.wrs[w].wq == Wq::Srq {
                self.wrs[w].done = true;
                self.srq_out.retain(|&x| x != w);
            }
        }
        let p = &mut self.qps[q];
        let ws: Vec<usize> = p.sq.drain(..).chain(p.rq.drain(..)).collect();
        for w in ws {
            self.wrs[w].done = true;
            if self.wrs[w].buf.is_some() {
                if self.wrs[w].wq == Wq::Rq && !completed.contains(&w) {
                    // Discarded after the device took it (at its doorbell; its completion, if
                    // any, is discarded too): parked until the QP is destroyed.
                    self.wrs[w].parked = true;
                    self.qps[q].parked.push(w);
                } else {
                    self.in_qps -= 1;
                }
            }
        }
    }

    pub(crate) fn on_destroy(&mut self, q: usize) {
        self.discard(q);
        // The device dropped the QP: the parked buffers come back.
        for w in std::mem::take(&mut self.qps[q].parked) {
            self.wrs[w].parked = false;
            self.in_qps -= 1;
        }
        self.qps[q].dev_rq.clear();
        self.qps[q].st = St::Gone;
        // SRQ receives it consumed whose completions were not polled: gone with its CQEs.
        let wrs = &mut self.wrs;
        self.srq_out.retain(|&w| {
            let lost = wrs[w].exec.as_ref().is_some_and(|e| e.consumer == q);
            if lost {
                wrs[w].done = true;
            }
            !lost
        });
    }

    /// After every CQ was polled empty: nothing that should have completed is left.
    pub(crate) fn check_drained(&self) -> Result<(), String> {
        for (q, p) in self.qps.iter().enumerate() {
            if p.st == St::Gone {
                continue;
            }
            ensure!(
                p.sq.is_empty(),
                "QP {q} ({:?}): sends never completed: {:?}",
                p.st,
                p.sq.iter().map(|&w| &self.wrs[w]).collect::<Vec<_>>()
            );
            if p.st == St::Err {
                ensure!(
                    p.rq.is_empty(),
                    "QP {q} in ERR: receives never flushed: {:?}",
                    p.rq.iter().map(|&w| &self.wrs[w]).collect::<Vec<_>>()
                );
            }
            for &w in &p.rq {
                ensure!(
                    self.wrs[w].exec.is_none(),
                    "QP {q}: receive executed but its completion never came: {:?}",
                    self.wrs[w]
                );
            }
        }
        for &w in &self.srq_out {
            ensure!(
                self.wrs[w].exec.is_none(),
                "SRQ receive executed but its completion never came: {:?}",
                self.wrs[w]
            );
        }
        Ok(())
    }
}
