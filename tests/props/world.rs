//! The harness's operations: each step run on the driver's objects and checked against the
//! reference model.

use super::*;

impl<'a> World<'a> {
    pub(crate) fn raw_alloc(&mut self, len: usize) -> usize {
        let off = self.raw_next;
        self.raw_next += len.next_multiple_of(64).max(64);
        assert!(
            self.raw_next <= RAW_LEN,
            "raw region too small for the steps"
        );
        off
    }

    pub(crate) fn seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Raw gather/scatter entries over `len` fresh bytes (filled with `fill`).
    pub(crate) fn raw_sges(
        &mut self,
        len: usize,
        n: usize,
        bad_lkey: bool,
        fill: &[u8],
    ) -> (usize, Vec<Sge>) {
        let off = self.raw_alloc(len);
        self.raw.as_mut_slice()[off..off + fill.len()].copy_from_slice(fill);
        let (addr, lkey) = (
            self.raw.addr(),
            self.raw.lkey() ^ if bad_lkey { BAD_KEY } else { 0 },
        );
        let mut at = off;
        let sges = split(len, n)
            .into_iter()
            .map(|l| {
                let s = Sge {
                    addr: addr + at as u64,
                    length: l as u32,
                    lkey,
                };
                at += l;
                s
            })
            .collect();
        (off, sges)
    }

    pub(crate) fn expected_free(&self) -> u32 {
        POOL_N - self.held.len() as u32 - self.r.in_qps
    }

    /// A pool buffer for a post: a held one (`reuse`) or a new one; None when the pool is
    /// empty (checked against the reference).
    pub(crate) fn take_buf(&mut self, reuse: bool) -> Result<Option<Buf<'a, P>>, String> {
        if reuse && !self.held.is_empty() {
            return Ok(Some(self.held.remove(0).0));
        }
        let b = self.pool.alloc();
        ensure_eq!(
            b.is_none(),
            self.expected_free() == 0,
            "pool.alloc() with {} buffers expected free",
            self.expected_free()
        );
        Ok(b)
    }

    pub(crate) fn ud_target(&self, to: UdTo, qkey: Qkey) -> (u32, u32, u32) {
        let qpn = match to {
            UdTo::U0 => self.r.qps[4].qpn,
            UdTo::U1 => self.r.qps[5].qpn,
            UdTo::Rc0 => self.r.qps[0].qpn,
            UdTo::Nowhere => NOWHERE,
        };
        let (given, seen) = match qkey {
            Qkey::Right => (QKEY, QKEY),
            Qkey::Wrong => (BAD_QKEY, BAD_QKEY),
            Qkey::Own => (0x8000_0000, QKEY),
        };
        (qpn, given, seen)
    }

    /// The QP a send of QP `q` reaches (None: no QP).
    pub(crate) fn dest_of(&self, q: usize, ud: Option<u32>) -> Option<usize> {
        match ud {
            Some(qpn) => self.r.qp_by_qpn(qpn),
            None => Some(TOPO[q].peer),
        }
    }

    /// Whether a send to these destinations is to be skipped (known driver bug, see the top).
    pub(crate) fn skip_late(&self, q: usize, dests: &[Option<u32>]) -> bool {
        !self.known_bugs.late_recv
            && dests
                .iter()
                .filter_map(|&d| self.dest_of(q, d))
                .any(|j| self.r.late_risk(j))
    }

    pub(crate) fn step(&mut self, step: &Step) -> Result<(), String> {
        match step {
            Step::RawSend { qp, items, finish } => self.raw_send(*qp, items, *finish),
            Step::RawRecv {
                qp,
                items,
                finish,
                single,
            } => self.raw_recv(*qp, items, *finish, *single),
            Step::SafeSend {
                qp,
                len,
                to,
                qkey,
                reuse,
                no_dest,
            } => self.safe_send(*qp, *len, *to, *qkey, *reuse, *no_dest),
            Step::SafeRecv { qp, reuse } => self.safe_recv(*qp, *reuse),
            Step::SrqRecv { items } => self.srq_recv(items),
            Step::PollQp { qp, max, keep } => self.poll_qp(*qp, *max, *keep),
            Step::PollCq { cq, n } => self.poll_cq(*cq, *n as usize).map(|_| ()),
            Step::Cursor { cq, max } => self.cursor(*cq, *max),
            Step::Drain => self.drain(),
            Step::ToError { qp } => self.transition(*qp, St::Err),
            Step::Reset { qp } => self.transition(*qp, St::Reset),
            Step::Destroy { qp } => self.transition(*qp, St::Gone),
            Step::Reinit { qp } => self.transition(*qp, St::Rts),
            Step::Hold => {
                if let Some(mut b) = self.take_buf(false)? {
                    let s = self.seq();
                    let bytes = payload(s, b.len() as usize);
                    b.as_mut_slice().copy_from_slice(&bytes);
                    self.held.push((b, bytes));
                }
                Ok(())
            }
            Step::Release { i } => {
                if !self.held.is_empty() {
                    let i = *i as usize % self.held.len();
                    self.held.remove(i);
                }
                Ok(())
            }
            Step::Foreign { qp, send } => self.foreign(*qp, *send),
        }
    }

    pub(crate) fn raw_send(
        &mut self,
        q: usize,
        items: &[SendItem],
        finish: bool,
    ) -> Result<(), String> {
        if self.r.qps[q].st != St::Rts {
            return Ok(());
        }
        let spec = TOPO[q];
        // Resolve every item: its bytes, its gather list, where it goes.
        let mut prepared = Vec::new();
        for it in items {
            let kind = match (spec.ud, it.kind) {
                (true, Kind::SendImm | Kind::WriteImm) => Kind::SendImm,
                (true, _) => Kind::Send,
                (false, k) => k,
            };
            let nsge = it.sges as usize;
            let len = if nsge == 0 { 0 } else { it.len as usize };
            let s = self.seq();
            let bytes = payload(s, len);
            let (off, sges) = self.raw_sges(len, nsge, it.bad_lkey, &bytes);
            let remote_off = match it.remote {
                Remote::OutOfRange => RDMA_LEN - len + 1,
                _ => it.off as usize % (RDMA_LEN - len + 1),
            };
            let rkey = self.rdma.rkey()
                ^ if it.remote == Remote::BadKey {
                    BAD_KEY
                } else {
                    0
                };
            let ud = spec.ud.then(|| self.ud_target(it.to, it.qkey));
            let flags = SendFlags::from_bits_truncate(it.flags.into())
                & (SendFlags::SIGNALED | SendFlags::SOLICITED | SendFlags::FENCE);
            let res = Resolved {
                kind,
                payload: bytes,
                nsge,
                bad_lkey: it.bad_lkey,
                remote_ok: it.remote == Remote::Good,
                remote_off,
                ud: ud.map(|(qpn, _, seen)| (qpn, seen)),
                imm: it.imm,
                raw: Some(off),
                buf: None,
            };
            prepared.push((
                res,
                sges,
                (self.rdma.addr() + remote_off as u64, rkey),
                ud,
                flags,
            ));
        }
        let dests: Vec<_> = prepared.iter().map(|p| p.0.ud.map(|u| u.0)).collect();
        if self.skip_late(q, &dests) {
            return Ok(());
        }
        let World { qps, r, ah, .. } = self;
        let ah: &AddressHandle<'_, P> = ah;
        let mut posted = Vec::new();
        macro_rules! batch {
            ($b:ident, |$res:ident, $sges:ident, $remote:ident, $ud:ident, $flags:ident, $wr_id:ident| $write:expr) => {{
                for ($res, $sges, $remote, $ud, $flags) in &prepared {
                    let $wr_id = r.wr_id();
                    let want = r.expect_sq_write(q, posted.len(), $sges.len());
                    // SAFETY: the bytes named are the raw region's, never reused nor touched
                    // by the CPU after this (each request has its own).
                    let got = unsafe { $write };
                    ensure_eq!(got, want, "QP {q}: writing send {:?}", $res.kind);
                    if got.is_ok() {
                        posted.push(($wr_id, $res.clone()));
                    }
                }
                if finish {
                    $b.finish();
                } else {
                    drop($b);
                    posted.clear();
                }
            }};
        }
        match &mut qps[q] {
            AnyQp::Rc(Slot::Rts(qp)) => {
                let mut b = qp.send_batch();
                batch!(b, |res, sges, remote, _ud, flags, wr_id| match res.kind {
                    Kind::Send => b.send(wr_id, *flags, sges),
                    Kind::SendImm => b.send_imm(wr_id, *flags, res.imm, sges),
                    Kind::Write => b.rdma_write(wr_id, *flags, *remote, sges),
                    Kind::WriteImm => b.rdma_write_imm(wr_id, *flags, *remote, res.imm, sges),
                    Kind::Read => b.rdma_read(wr_id, *flags, *remote, sges),
                })
            }
            AnyQp::Ud(Slot::Rts(qp)) => {
                let mut b = qp.send_batch();
                batch!(b, |res, sges, _remote, ud, flags, wr_id| {
                    let (qpn, qkey, _) = ud.expect("UD target");
                    match res.kind {
                        Kind::SendImm => {
                            b.send_to_imm(wr_id, *flags, (ah, qpn, qkey), res.imm, sges)
                        }
                        _ => b.send_to(wr_id, *flags, (ah, qpn, qkey), sges),
                    }
                })
            }
            _ => unreachable!("state mismatch"),
        }
        for (wr_id, res) in posted {
            r.post_send(q, wr_id, &res);
        }
        r.end_run(q);
        Ok(())
    }

    pub(crate) fn raw_recv(
        &mut self,
        q: usize,
        items: &[RecvItem],
        finish: bool,
        single: bool,
    ) -> Result<(), String> {
        if self.r.qps[q].st != St::Rts {
            return Ok(());
        }
        let mut prepared = Vec::new();
        for it in items {
            let nsge = it.sges as usize;
            let room = if nsge == 0 { 0 } else { it.room as usize };
            let (off, sges) = self.raw_sges(room, nsge, it.bad_lkey, &[]);
            prepared.push((it, room, off, sges));
        }
        let World { qps, r, .. } = self;
        let mut posted = Vec::new();
        let single = single && prepared.len() == 1;
        let p = &prepared;
        match &mut qps[q] {
            AnyQp::Rc(Slot::Rts(qp)) => post_recvs(qp, r, q, p, single, finish, &mut posted)?,
            AnyQp::Ud(Slot::Rts(qp)) => post_recvs(qp, r, q, p, single, finish, &mut posted)?,
            _ => unreachable!("state mismatch"),
        }
        for (wr_id, room, bad, off) in posted {
            r.post_recv(q, wr_id, room as u32, bad, Some(off), None);
        }
        Ok(())
    }

    pub(crate) fn safe_send(
        &mut self,
        q: usize,
        len: u16,
        to: UdTo,
        qkey: Qkey,
        reuse: bool,
        no_dest: bool,
    ) -> Result<(), String> {
        if self.r.qps[q].st != St::Rts {
            return Ok(());
        }
        let spec = TOPO[q];
        let ud = spec.ud.then(|| self.ud_target(to, qkey));
        if self.skip_late(q, &[ud.map(|u| u.0)]) {
            return Ok(());
        }
        let Some(mut buf) = self.take_buf(reuse)? else {
            return Ok(());
        };
        let s = self.seq();
        buf.set_len((len as u32).min(buf.capacity()))
            .map_err(|e| format!("set_len: {e:?}"))?;
        let bytes = payload(s, buf.len() as usize);
        buf.as_mut_slice().copy_from_slice(&bytes);
        let index = buf.index();
        let want = if !spec.safe {
            Err(Error::InvalidInput {
                param: Param::Pool,
                value: index.into(),
                max: 0,
            })
        } else {
            match self.r.expect_sq_write(q, 0, 1) {
                Ok(()) if spec.ud && no_dest => Err(Error::MissingAttribute {
                    op: DevOp::PostSend,
                    attr: Attr::UdDest,
                }),
                other => other,
            }
        };
        let wr_id = self.r.wr_id();
        let ah: &AddressHandle<'_, P> = self.ah;
        let got = match &mut self.qps[q] {
            AnyQp::Rc(Slot::Rts(qp)) => qp.post_send(wr_id, buf),
            AnyQp::Ud(Slot::Rts(qp)) if no_dest => qp.post_send(wr_id, buf),
            AnyQp::Ud(Slot::Rts(qp)) => {
                let (qpn, given, _) = ud.expect("UD target");
                qp.post_send_to(wr_id, buf, (ah, qpn, given))
            }
            _ => unreachable!("state mismatch"),
        };
        match got {
            Ok(()) => {
                ensure!(
                    want.is_ok(),
                    "QP {q}: post_send accepted, expected {want:?}"
                );
                let res = Resolved {
                    kind: Kind::Send,
                    payload: bytes,
                    nsge: 1,
                    bad_lkey: false,
                    remote_ok: false,
                    remote_off: 0,
                    ud: ud.map(|(qpn, _, seen)| (qpn, seen)),
                    imm: 0,
                    raw: None,
                    buf: Some(index),
                };
                self.r.post_send(q, wr_id, &res);
                self.r.end_run(q);
            }
            Err((buf, e)) => {
                ensure_eq!(Err::<(), _>(e), want, "QP {q}: post_send");
                ensure_eq!(buf.index(), index, "buffer handed back");
                ensure_eq!(buf.as_slice(), &bytes[..], "buffer handed back");
                self.held.push((buf, bytes));
            }
        }
        Ok(())
    }

    pub(crate) fn safe_recv(&mut self, q: usize, reuse: bool) -> Result<(), String> {
        if self.r.qps[q].st != St::Rts {
            return Ok(());
        }
        let Some(buf) = self.take_buf(reuse)? else {
            return Ok(());
        };
        let index = buf.index();
        let kept = buf.as_slice().to_vec();
        let want = if !TOPO[q].safe {
            Err(Error::InvalidInput {
                param: Param::Pool,
                value: index.into(),
                max: 0,
            })
        } else {
            self.r.expect_rq_write(q, 0, 1)
        };
        let wr_id = self.r.wr_id();
        let got = rts!(&mut self.qps[q], |qp| qp.post_recv(wr_id, buf)).expect("state mismatch");
        match got {
            Ok(()) => {
                ensure!(
                    want.is_ok(),
                    "QP {q}: post_recv accepted, expected {want:?}"
                );
                self.r.post_recv(q, wr_id, BUF, false, None, Some(index));
            }
            Err((buf, e)) => {
                ensure_eq!(Err::<(), _>(e), want, "QP {q}: post_recv");
                ensure_eq!(buf.index(), index, "buffer handed back");
                self.held.push((buf, kept));
            }
        }
        Ok(())
    }

    pub(crate) fn srq_recv(&mut self, items: &[RecvItem]) -> Result<(), String> {
        let out = self.r.srq_out.len() as u32;
        let n = items.len() as u32;
        let too_many = items
            .iter()
            .position(|it| u32::from(it.sges) > self.r.srq_sge);
        // The SRQ holds at most max_wr requests not yet completed: that is all a CQ was
        // reserved for (see `srq_overflow` below for what the driver does instead).
        if !self.known_bugs.srq_credit && too_many.is_none() && out > 0 && out + n > self.r.srq_max
        {
            return Ok(());
        }
        let mut prepared = Vec::new();
        for it in items {
            let nsge = it.sges as usize;
            let room = if nsge == 0 { 0 } else { it.room as usize };
            let (off, sges) = self.raw_sges(room, nsge, it.bad_lkey, &[]);
            prepared.push((self.r.wr_id(), room, it.bad_lkey, off, sges));
        }
        let want = if let Some(i) = too_many {
            Err(Error::InvalidInput {
                param: Param::NumSge,
                value: items[i].sges.into(),
                max: self.r.srq_sge.into(),
            })
        } else if out + n > self.r.srq_max {
            Err(Error::QueueFull {
                queue: Queue::Srq,
                free: self.r.srq_max - out,
            })
        } else {
            Ok(())
        };
        let wrs: Vec<RecvWr<'_>> = prepared
            .iter()
            .map(|(wr_id, _, _, _, sges)| RecvWr {
                wr_id: *wr_id,
                sg_list: sges,
            })
            .collect();
        // SAFETY: fresh bytes of the raw region, untouched until the completions.
        let got = unsafe { self.srq.post_recv_raw(&wrs) };
        ensure_eq!(got, want, "SRQ post of {n} with {out} outstanding");
        if got.is_ok() {
            for (wr_id, room, bad, off, _) in &prepared {
                self.r
                    .post_recv(usize::MAX, *wr_id, *room as u32, *bad, Some(*off), None);
            }
        }
        Ok(())
    }

    /// The bytes a successful receive (or RDMA READ) must have put where it landed.
    pub(crate) fn check_data(&self, w: usize, buf: Option<&Buf<'a, P>>) -> Result<(), String> {
        let wr = &self.r.wrs[w];
        let Some(e) = &wr.exec else { return Ok(()) };
        let (Some(data), WcStatus::Success) = (&e.data, e.wc.status) else {
            return Ok(());
        };
        let start = if e.grh { GRH } else { 0 };
        let got: &[u8] = match (buf, wr.raw) {
            (Some(b), _) => b.as_slice(),
            (None, Some(off)) => &self.raw.as_slice()[off..off + start + data.len()],
            (None, None) => return Ok(()),
        };
        ensure!(
            got.len() >= start + data.len(),
            "received {} bytes, expected {}",
            got.len(),
            start + data.len()
        );
        ensure_eq!(
            &got[start..start + data.len()],
            &data[..],
            "bytes received by {:?}",
            e.wc
        );
        Ok(())
    }

    pub(crate) fn poll_qp(&mut self, q: usize, max: u8, keep: bool) -> Result<(), String> {
        for _ in 0..max {
            let Some(got) = any_state!(&mut self.qps[q], |qp| qp.poll_one()) else {
                return Ok(());
            };
            let c = match got {
                Ok(Some(c)) => c,
                Ok(None) => {
                    let next = self.r.next_on_qp(q);
                    ensure!(
                        next.is_none(),
                        "poll_one of QP {q} gave nothing, {next:?} was due"
                    );
                    return Ok(());
                }
                Err(e) => return fail(&format!("QP {q}: poll_one"), e),
            };
            ensure_eq!(
                c.wc.qp_num,
                self.r.qps[q].qpn,
                "poll_one of QP {q} gave another QP's"
            );
            let w = self.r.complete(&c.wc, None, Via::Qp(q))?;
            let wr = &self.r.wrs[w];
            ensure_eq!(
                c.buf.as_ref().map(|b| b.index()),
                if wr.parked { None } else { wr.buf },
                "buffer of {:?}",
                c.wc
            );
            if let Some(b) = &c.buf {
                let recv = wr.wq != Wq::Sq;
                let len = if recv { c.wc.byte_len.min(BUF) } else { BUF };
                ensure_eq!(b.len(), len, "length of the buffer of {:?}", c.wc);
            }
            self.check_data(w, c.buf.as_ref())?;
            if let (true, Some(b)) = (keep, c.buf) {
                let bytes = b.as_slice().to_vec();
                self.held.push((b, bytes));
            }
        }
        Ok(())
    }

    pub(crate) fn poll_cq(&mut self, cq: usize, n: usize) -> Result<usize, String> {
        let mut out = [WorkCompletion::default(); 16];
        let k = match self.cqs[cq].poll(&mut out[..n]) {
            Ok(k) => k,
            Err(e) => return fail(&format!("CQ {cq}: poll"), e),
        };
        ensure!(k <= n, "poll returned {k} > {n}");
        for wc in &out[..k] {
            let w = self.r.complete(wc, None, Via::Cq(cq))?;
            self.check_data(w, None)?;
        }
        if k < n {
            self.nothing_due(cq, "poll")?;
        }
        Ok(k)
    }

    pub(crate) fn cursor(&mut self, cq: usize, max: u8) -> Result<(), String> {
        let cqs = self.cqs;
        let mut c = match cqs[cq].start_poll() {
            Ok(Some(c)) => c,
            Ok(None) => return self.nothing_due(cq, "start_poll"),
            Err(e) => return fail(&format!("CQ {cq}: start_poll"), e),
        };
        for i in 0..max {
            let wc = WorkCompletion {
                wr_id: c.wr_id(),
                byte_len: c.byte_len(),
                imm: c.imm(),
                qp_num: c.qp_num(),
                src_qp: c.src_qp(),
                status: c.status(),
                opcode: c.opcode(),
                flags: c.flags(),
            };
            let w = self.r.complete(&wc, Some(c.vendor_err()), Via::Cq(cq))?;
            self.check_data(w, None)?;
            if i + 1 == max {
                break;
            }
            match c.next_poll() {
                Ok(true) => {}
                Ok(false) => {
                    drop(c);
                    return self.nothing_due(cq, "the cursor");
                }
                Err(e) => return fail(&format!("CQ {cq}: cursor next"), e),
            }
        }
        Ok(())
    }

    /// A poll of CQ `cq` found nothing more: nothing may be due there.
    pub(crate) fn nothing_due(&mut self, cq: usize, what: &str) -> Result<(), String> {
        let next = self.r.next_on_cq(cq);
        ensure!(
            next.is_none(),
            "CQ {cq}: {what} found nothing, {next:?} was due"
        );
        Ok(())
    }

    pub(crate) fn drain(&mut self) -> Result<(), String> {
        loop {
            let mut n = 0;
            for cq in 0..N_CQ {
                loop {
                    let k = self.poll_cq(cq, 16)?;
                    n += k;
                    if k == 0 {
                        break;
                    }
                }
            }
            if n == 0 {
                break;
            }
        }
        self.r.check_drained()
    }

    pub(crate) fn transition(&mut self, q: usize, to: St) -> Result<(), String> {
        let st = self.r.qps[q].st;
        if st == St::Gone || (to == St::Rts && st != St::Reset) {
            return Ok(());
        }
        let slot = std::mem::replace(&mut self.qps[q], AnyQp::Rc(Slot::Gone));
        self.qps[q] = match (slot, to) {
            (AnyQp::Rc(s), St::Err) => AnyQp::Rc(s.into_error()?),
            (AnyQp::Ud(s), St::Err) => AnyQp::Ud(s.into_error()?),
            (AnyQp::Rc(s), St::Reset) => AnyQp::Rc(s.reset()?),
            (AnyQp::Ud(s), St::Reset) => AnyQp::Ud(s.reset()?),
            (AnyQp::Rc(s), St::Rts) => AnyQp::Rc(s.reinit(&rc_init())?),
            (AnyQp::Ud(s), St::Rts) => AnyQp::Ud(s.reinit(&DatagramInit::new(QKEY))?),
            (AnyQp::Rc(s), _) => {
                s.destroy()?;
                AnyQp::Rc(Slot::Gone)
            }
            (AnyQp::Ud(s), _) => {
                s.destroy()?;
                AnyQp::Ud(Slot::Gone)
            }
        };
        match to {
            St::Err => self.r.qps[q].st = St::Err,
            St::Reset => {
                self.r.discard(q);
                // (A QP the device moved to ERROR starts over.)
                let p = &mut self.r.qps[q];
                (p.st, p.dev_err, p.flush_rq) = (St::Reset, false, false);
            }
            St::Gone => self.r.on_destroy(q),
            St::Rts => {}
        }
        Ok(())
    }

    pub(crate) fn foreign(&mut self, q: usize, send: bool) -> Result<(), String> {
        if self.r.qps[q].st != St::Rts {
            return Ok(());
        }
        let buf = self.pool2.alloc().ok_or("second pool empty")?;
        let want = Error::InvalidInput {
            param: Param::Pool,
            value: buf.index().into(),
            max: 0,
        };
        let wr_id = self.r.wr_id();
        let ah: &AddressHandle<'_, P> = self.ah;
        let got = match &mut self.qps[q] {
            AnyQp::Rc(Slot::Rts(qp)) if send => qp.post_send(wr_id, buf),
            AnyQp::Ud(Slot::Rts(qp)) if send => qp.post_send_to(wr_id, buf, (ah, NOWHERE, QKEY)),
            AnyQp::Rc(Slot::Rts(qp)) => qp.post_recv(wr_id, buf),
            AnyQp::Ud(Slot::Rts(qp)) => qp.post_recv(wr_id, buf),
            _ => unreachable!("state mismatch"),
        };
        match got {
            Ok(()) => Err(format!("QP {q}: a buffer of another pool was posted")),
            Err((_, e)) => {
                ensure_eq!(e, want, "QP {q}: foreign buffer");
                Ok(())
            }
        }
    }

    /// What holds after every step.
    pub(crate) fn invariants(&self) -> Result<(), String> {
        let v = self.model.violations();
        ensure!(v.is_empty(), "model violations: {v:#?}");
        ensure_eq!(
            self.pool.free_count(),
            self.expected_free(),
            "pool.free_count()"
        );
        ensure_eq!(self.pool2.free_count(), 2, "second pool's free_count()");
        for (b, bytes) in &self.held {
            ensure_eq!(
                b.as_slice(),
                &bytes[..],
                "held buffer {} changed",
                b.index()
            );
        }
        ensure!(
            self.rdma.as_slice() == &self.r.shadow[..],
            "RDMA region differs from the reference"
        );
        Ok(())
    }
}
