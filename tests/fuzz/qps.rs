//! QP state moves and their attributes, queries, destroys, connected pairs, and the teardown
//! that flushes every QP and polls every CQ dry.

use super::*;

impl<'c> World<'c> {
    pub(crate) fn attrs(&self, r: &mut Rng, peer: Option<u32>) -> Attrs {
        let good = r.below(4) != 0;
        let psn = |r: &mut Rng| {
            if good {
                r.below(1 << 24) as u32
            } else {
                r.pick(&[0, 0x00FF_FFFF, 0x0100_0000, u32::MAX])
            }
        };
        let port = if good { 1 } else { r.pick(&[0, 1, 2, 255]) };
        let pkey_index = if good {
            0
        } else {
            r.pick(&[0, 1, 2, u16::MAX])
        };
        let (sgid, dgid) = self
            .bound_gid(r)
            .filter(|_| good)
            .unwrap_or_else(|| (r.pick(&[0, 1, 254, 255]), Gid([0xFE; 16])));
        let mut av = AddressVector::new(dgid, sgid);
        if !good {
            av.flow_label = r.pick(&[0, 0xF_FFFF, 0x10_0000, u32::MAX]);
            av.hop_limit = r.pick(&[0, 1, 255]);
            av.traffic_class = r.below(256) as u8;
        }
        let dest = match peer {
            Some(q) if good => q,
            _ => r.pick(&[0, 1, 0x11, 0x00FF_FFFF, 0x0100_0000]),
        };
        let mut crtr = ConnectedRtr::new(dest, psn(r), av);
        if !good {
            crtr.path_mtu = r.pick(&[Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096]);
            crtr.max_dest_rd_atomic = r.pick(&[0, 1, 16, 255]);
            crtr.min_rnr_timer = r.below(256) as u8;
        }
        let mut crts = ConnectedRts::new(psn(r));
        if !good {
            crts.max_rd_atomic = r.pick(&[0, 1, 16, 255]);
            crts.timeout = r.below(256) as u8;
            crts.retry_cnt = r.below(256) as u8;
            crts.rnr_retry = r.below(256) as u8;
        }
        let any = r.next_u64() as u32;
        let qkey = r.pick(&[0x1111_1111, 0, 0x8000_0000, u32::MAX, any]);
        Attrs {
            cinit: ConnectedInit {
                port,
                pkey_index,
                access: AccessFlags::from_bits_truncate(r.below(32) as u32),
            },
            crtr,
            crts,
            dinit: DatagramInit {
                port,
                pkey_index,
                qkey,
            },
            drts: DatagramRts { sq_psn: psn(r) },
        }
    }

    /// Modifies QP `i`; returns the result.
    pub(crate) fn modify(&mut self, t: &mut Trace, i: usize, m: Move, a: &Attrs) -> bool {
        let Some(q) = self.qps[i].qp.take() else {
            return false;
        };
        note!(t, "modify_qp(#{i}, {m:?})");
        let before = on_qp!(&q, s => s.state());
        let (q, res) = match q {
            AnyQp::Rc(s) => {
                let (s, res) = rc_move(s, m, a);
                (AnyQp::Rc(s), res)
            }
            AnyQp::Ud(s) => {
                let (s, res) = dg_move(s, m, a);
                (AnyQp::Ud(s), res)
            }
            AnyQp::Gsi(s) => {
                let (s, res) = dg_move(s, m, a);
                (AnyQp::Gsi(s), res)
            }
        };
        let state = on_qp!(&q, s => s.state());
        note!(t, "    now {state:?}");
        self.qps[i].qp = Some(q);
        if state == QpState::Reset && before != QpState::Reset {
            // The reset drops the requests outstanding: none of them completes.
            self.kill(self.qps[i].qpn);
        }
        if res.is_ok() && matches!(m, Move::Next | Move::Ready) {
            self.qps[i].qkey = a.dinit.qkey;
        }
        self.res(t, &res);
        res.is_ok()
    }

    pub(crate) fn modify_qp(&mut self, r: &mut Rng, t: &mut Trace) {
        if self.qps.is_empty() {
            return;
        }
        let i = r.below(self.qps.len() as u64) as usize;
        let m = match r.below(10) {
            0 => Move::Reset,
            1 => Move::Error,
            2 => Move::Ready,
            _ => Move::Next,
        };
        let peer =
            (!self.qps.is_empty()).then(|| self.qps[r.below(self.qps.len() as u64) as usize].qpn);
        let a = self.attrs(r, peer);
        self.modify(t, i, m, &a);
    }

    pub(crate) fn query_qp(&mut self, r: &mut Rng, t: &mut Trace) {
        if self.qps.is_empty() {
            return;
        }
        let i = r.below(self.qps.len() as u64) as usize;
        let Some(q) = self.qps[i].qp.as_ref() else {
            return;
        };
        let (res, state, qpn) = on_qp!(q, s => (s.query(), s.state(), s.qp_num()));
        note!(t, "query_qp(#{i}) in {state:?}");
        // A device moves a connected QP to ERROR on its own when a request fails (the
        // model's `Semantics::Verbs`, as rxe and hardware): that is no lie.
        let failed = a_failed(&res, state);
        if let Ok(a) = &res
            && self.honest
            && !failed
            && (a.state != state || a.qp_num != qpn)
        {
            self.complain(
                t,
                format!("query_qp in {state:?} (qpn {qpn}) says {a:?} on an honest device"),
            );
        }
        self.res(t, &res);
    }

    pub(crate) fn drop_qp_entry(&mut self, e: QpEntry<'c>) {
        self.kill(e.qpn);
        self.add_users(e.pd, e.scq, e.rcq, e.srq, -1);
        for pd in e.held {
            self.use_pd(pd, -1);
        }
    }

    pub(crate) fn destroy_qp(&mut self, r: &mut Rng, t: &mut Trace) {
        if !self.raw_qps.is_empty() && r.below(3) == 0 {
            let i = r.below(self.raw_qps.len() as u64) as usize;
            self.destroy_raw_qp(t, i);
            return;
        }
        if self.qps.is_empty() {
            return;
        }
        let i = r.below(self.qps.len() as u64) as usize;
        let explicit = r.below(2) == 0;
        note!(t, "destroy_qp(#{i}, explicit {explicit})");
        let Some(q) = self.qps[i].qp.take() else {
            return;
        };
        if explicit {
            let res = match q {
                AnyQp::Rc(s) => s.destroy().map_err(|(s, e)| (AnyQp::Rc(s), e)),
                AnyQp::Ud(s) => s.destroy().map_err(|(s, e)| (AnyQp::Ud(s), e)),
                AnyQp::Gsi(s) => s.destroy().map_err(|(s, e)| (AnyQp::Gsi(s), e)),
            };
            if let Err((q, e)) = res {
                self.err(t, &e);
                self.qps[i].qp = Some(q);
                return;
            }
        } else {
            drop(q);
        }
        let e = self.qps.swap_remove(i);
        self.drop_qp_entry(e);
    }

    pub(crate) fn destroy_raw_qp(&mut self, t: &mut Trace, i: usize) {
        note!(t, "raw destroy_qp(#{i})");
        let Some(qp) = self.raw_qps[i].qp.take() else {
            return;
        };
        if let Err((qp, e)) = self.ctx.provider().destroy_qp(qp) {
            self.err(t, &e);
            // As the verbs layer's Drop does: the device may still use it; keep its memory.
            std::mem::forget(qp);
            self.leaked = true;
        }
        let q = self.raw_qps.swap_remove(i);
        self.add_users(q.pd, q.scq, q.rcq, q.srq, -1);
    }

    pub(crate) fn create_srq(&mut self, r: &mut Rng, t: &mut Trace) {
        let Some(pd) = pick_live(r, &self.pds) else {
            return;
        };
        let c = self.ctx.caps();
        let attr = SrqAttr {
            max_wr: count(
                r,
                64,
                &[
                    65,
                    128,
                    4096,
                    c.max_srq_wr,
                    c.max_srq_wr.wrapping_add(1),
                    u32::MAX,
                ],
            ),
            max_sge: count(
                r,
                4,
                &[
                    5,
                    c.max_srq_sge,
                    c.max_srq_sge.wrapping_add(1),
                    256,
                    0x0100_0000,
                    0x1000_0000,
                    u32::MAX,
                ],
            ),
            srq_limit: count(r, 4, &[64, 65, u32::MAX]),
        };
        note!(t, "create_srq(pd #{pd}, {attr:?}) = #{}", self.srqs.len());
        match self.pd(pd).create_srq(attr) {
            Ok(s) => {
                let got = s.attr();
                note!(t, "    -> Ok({got:?})");
                if got.max_wr < attr.max_wr.max(1) || got.max_sge < attr.max_sge.max(1) {
                    self.complain(t, format!("SRQ attr {got:?} for a request of {attr:?}"));
                }
                self.use_pd(pd, 1);
                self.srqs.push(Some((Owned::new(s), pd)));
            }
            Err(e) => self.err(t, &e),
        }
    }

    pub(crate) fn destroy_srq(&mut self, r: &mut Rng, t: &mut Trace) {
        let Some(i) =
            pick_live(r, &self.srqs).filter(|&i| self.srqs[i].as_ref().unwrap().0.users == 0)
        else {
            return;
        };
        let explicit = r.below(2) == 0;
        note!(t, "destroy_srq(#{i}, explicit {explicit})");
        let (s, pd) = self.srqs[i].take().unwrap();
        let s = s.take();
        if explicit {
            if let Err((s, e)) = s.destroy() {
                self.err(t, &e);
                self.srqs[i] = Some((Owned::new(s), pd));
                return;
            }
        } else {
            drop(s);
        }
        self.use_pd(pd, -1);
    }

    /// Sets up what traffic needs: a bound GID, a PD, a CQ, and either two RC QPs connected to
    /// each other or a UD QP, all the way to RTS.
    pub(crate) fn connect(&mut self, r: &mut Rng, t: &mut Trace) {
        note!(t, "connect:");
        if self.gids.is_empty() {
            let gid = Gid::link_local_from_mac([0x52, 0x54, 0, 0x12, 0x34, 0x57]);
            note!(t, "  bind_gid(0)");
            match self.ctx.bind_gid(0, gid) {
                Ok(g) => self.gids.push(g),
                Err(e) => return self.must(t, "bind_gid(0)", &e),
            }
        }
        if live(&self.pds).is_empty() {
            note!(t, "  alloc_pd()");
            match self.ctx.alloc_pd() {
                Ok(pd) => self.pds.push(Some(Owned::new(pd))),
                Err(e) => return self.must(t, "alloc_pd", &e),
            }
        }
        if live(&self.cqs).is_empty() {
            note!(t, "  create_cq(256)");
            match self.ctx.create_cq(256) {
                Ok(cq) => self.cqs.push(Some(Owned::new(cq))),
                Err(e) => return self.must(t, "create_cq(256)", &e),
            }
        }
        let first = self.qps.len();
        let ud = r.below(3) == 0;
        for _ in 0..if ud { 1 } else { 2 } {
            let Some((pd, scq, rcq, _)) = self.qp_parts(r) else {
                return;
            };
            let caps = QpCaps {
                max_send_wr: 1 + r.below(16) as u32,
                max_recv_wr: 1 + r.below(16) as u32,
                max_send_sge: 1 + r.below(4) as u32,
                max_recv_sge: 1 + r.below(4) as u32,
                max_inline_data: 0,
            };
            note!(
                t,
                "  create_qp(ud {ud}, pd #{pd}, cqs #{scq} #{rcq}, {caps:?})"
            );
            let b = self
                .pd(pd)
                .qp_builder(self.cq(scq), self.cq(rcq))
                .caps(caps);
            let res = if ud {
                b.build::<Ud>().map(|q| AnyQp::Ud(St::Reset(q)))
            } else {
                b.build::<Rc>().map(|q| AnyQp::Rc(St::Reset(q)))
            };
            match res {
                Ok(q) => {
                    let qpn = on_qp!(&q, s => s.qp_num());
                    self.add_users(pd, scq, rcq, None, 1);
                    self.qps.push(QpEntry {
                        qp: Some(q),
                        pd,
                        scq,
                        rcq,
                        srq: None,
                        qpn,
                        qkey: 0,
                        held: Vec::new(),
                    });
                }
                Err(e) => return self.must(t, "create_qp", &e),
            }
        }
        let n = self.qps.len() - first;
        for k in 0..n {
            let i = first + k;
            let peer = self.qps[first + (k + 1) % n].qpn;
            let mut a = self.attrs(r, Some(peer));
            // Good values throughout (`attrs` makes a quarter of them edges).
            if let Some((sgid, gid)) = self.bound_gid(r) {
                a.crtr = ConnectedRtr::new(peer, 0, AddressVector::new(gid, sgid));
            }
            a.cinit = ConnectedInit {
                access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
                ..Default::default()
            };
            a.crts = ConnectedRts::new(0);
            a.dinit = DatagramInit::new(0x1111_1111);
            a.drts = DatagramRts { sq_psn: 0 };
            let moves: &[Move] = if ud {
                &[Move::Ready]
            } else {
                &[Move::Next, Move::Next, Move::Next]
            };
            for &m in moves {
                if !self.modify(t, i, m, &a) {
                    if self.plain {
                        self.complain(t, format!("{m:?} failed on a plain honest device"));
                    }
                    break;
                }
            }
        }
    }

    /// Drops everything, dependents first, each class in a random order, explicitly or not.
    pub(crate) fn teardown(
        mut self,
        r: &mut Rng,
        t: &mut Trace,
    ) -> (bool, bool, Vec<String>, Vec<String>) {
        note!(t, "teardown");
        if self.honest {
            self.flush_all(r, t);
        }
        while !self.raw_qps.is_empty() {
            let i = r.below(self.raw_qps.len() as u64) as usize;
            self.destroy_raw_qp(t, i);
        }
        while !self.qps.is_empty() {
            let i = r.below(self.qps.len() as u64) as usize;
            if r.below(2) == 0 {
                self.destroy_qp_at(t, i);
            } else {
                let mut e = self.qps.swap_remove(i);
                drop(e.qp.take());
                self.drop_qp_entry(e);
            }
        }
        while !self.mrs.is_empty() {
            let (mr, pd) = self
                .mrs
                .swap_remove(r.below(self.mrs.len() as u64) as usize);
            drop(mr);
            self.use_pd(pd, -1);
        }
        for i in live(&self.srqs) {
            let (s, pd) = self.srqs[i].take().unwrap();
            drop(s.take());
            self.use_pd(pd, -1);
        }
        for i in live(&self.cqs) {
            drop(self.cqs[i].take().unwrap().take());
        }
        for i in live(&self.pds) {
            drop(self.pds[i].take().unwrap().take());
        }
        while !self.gids.is_empty() {
            drop(
                self.gids
                    .swap_remove(r.below(self.gids.len() as u64) as usize),
            );
        }
        (
            self.unknown,
            self.leaked,
            std::mem::take(&mut self.complaints),
            std::mem::take(&mut self.strict),
        )
    }

    /// Exactly once, on an honest device: every QP goes to ERR and every CQ is polled dry;
    /// then every request posted to those QPs has completed (once: `completed` checks that).
    pub(crate) fn flush_all(&mut self, r: &mut Rng, t: &mut Trace) {
        note!(t, "flush every QP");
        let a = self.attrs(r, None);
        for i in 0..self.qps.len() {
            let s = self.qps[i].qp.as_ref().map(|q| on_qp!(q, s => s.state()));
            if s.is_some_and(|s| s != QpState::Err) {
                self.modify(t, i, Move::Error, &a);
            }
        }
        for _ in 0..64 {
            let mut any = false;
            for i in live(&self.cqs) {
                let mut wc = [WorkCompletion::default(); 16];
                match self.cq(i).poll(&mut wc) {
                    Ok(k) => {
                        note!(t, "  poll_cq(#{i}) {:?}", &wc[..k]);
                        for c in &wc[..k] {
                            self.completed(t, c);
                        }
                        any |= k > 0;
                    }
                    Err(e) => {
                        self.poll_failed(t, &e);
                        any = true;
                    }
                }
            }
            if !any {
                break;
            }
        }
        let flushed: Vec<u32> = self
            .qps
            .iter()
            .filter(|e| {
                e.qp.as_ref()
                    .is_some_and(|q| on_qp!(q, s => s.state()) == QpState::Err)
            })
            .map(|e| e.qpn)
            .collect();
        let left: Vec<(u32, u64)> = self
            .posted
            .keys()
            .filter(|k| flushed.contains(&k.0))
            .copied()
            .collect();
        if let Some(&(qpn, id)) = left.first() {
            self.complain(
                t,
                format!(
                    "every QP flushed and every CQ polled dry, {} requests never completed \
                     (wr_id {id:#x} on QP {qpn}, ...)",
                    left.len()
                ),
            );
        }
    }

    /// Explicitly destroys QP `i` (teardown: a failure drops it, which keeps its memory).
    pub(crate) fn destroy_qp_at(&mut self, t: &mut Trace, i: usize) {
        note!(t, "destroy_qp(#{i})");
        if let Some(q) = self.qps[i].qp.take() {
            let res = on_qp!(q, s => s.destroy().map_err(|(s, e)| {
                drop(s);
                e
            }));
            if let Err(e) = res {
                self.err(t, &e);
            }
        }
        let e = self.qps.swap_remove(i);
        self.drop_qp_entry(e);
    }
}
