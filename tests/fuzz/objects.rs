//! The world's books (what was posted, what completed, what is owed) and the operations on
//! objects: port queries, PDs, CQs, GIDs, memory regions, QPs and raw QPs, SRQs.

use super::*;

impl<'c> World<'c> {
    pub(crate) fn new(ctx: &'c Ctx, honest: bool, plain: bool) -> Self {
        World {
            ctx,
            honest,
            plain: honest && plain,
            posted: BTreeMap::new(),
            dead: BTreeMap::new(),
            strict: Vec::new(),
            pds: Vec::new(),
            cqs: Vec::new(),
            srqs: Vec::new(),
            mrs: Vec::new(),
            gids: Vec::new(),
            qps: Vec::new(),
            raw_qps: Vec::new(),
            unknown: false,
            leaked: false,
            complaints: Vec::new(),
        }
    }

    /// Looks at an error: kind and Display must work; an unknown outcome is remembered.
    pub(crate) fn err(&mut self, t: &mut Trace, e: &Error) {
        let _ = e.kind();
        let _ = write!(Sink, "{e}");
        self.unknown |= outcome_unknown(e);
        note!(t, "    -> Err({e:?})");
        // The driver checks every limit the device has before asking it to create anything:
        // an honest device that refuses a create was asked for something the driver let
        // through.
        if let Error::Device {
            op: op @ (Op::CreateQp | Op::CreateCq | Op::CreateSrq | Op::CreateMr | Op::CreatePd),
            ..
        } = e
            && self.honest
        {
            self.complain(t, format!("{op:?} refused by an honest device: {e:?}"));
        }
    }

    pub(crate) fn res<T: std::fmt::Debug>(&mut self, t: &mut Trace, r: &Result<T, Error>) {
        match r {
            Ok(v) => note!(t, "    -> Ok({v:?})"),
            Err(e) => self.err(t, e),
        }
    }

    pub(crate) fn complain(&mut self, t: &mut Trace, what: String) {
        note!(t, "    !! {what}");
        self.complaints.push(what);
    }

    /// An error where nothing can have gone wrong (a plain honest machine) is wrong.
    /// (A CQ without room for a new QP's completions is the driver's own refusal: the CQs of
    /// an execution fill up with the reservations of the QPs already on them.)
    pub(crate) fn must(&mut self, t: &mut Trace, what: &str, e: &Error) {
        self.err(t, e);
        let cq_room = matches!(
            e,
            Error::QueueFull {
                queue: bareverbs::error::Queue::Cq,
                ..
            }
        );
        if self.plain && !cq_room {
            self.complain(t, format!("{what} failed on a plain honest device: {e:?}"));
        }
    }

    /// Work requests posted to QP `qpn` (or to an SRQ: [`ANY_QP`]): each must complete once.
    pub(crate) fn posted<'a>(&mut self, qpn: u32, ids: impl Iterator<Item = &'a u64>) {
        for &id in ids {
            *self.posted.entry((qpn, id)).or_default() += 1;
        }
    }

    /// QP `qpn` was reset or destroyed: its requests not completed are dead (none of them may
    /// complete any more, on any QP).
    pub(crate) fn kill(&mut self, qpn: u32) {
        let gone: Vec<(u32, u64)> = self
            .posted
            .range((qpn, 0)..=(qpn, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            let n = self.posted.remove(&k).unwrap_or(0);
            *self.dead.entry(k).or_default() += n;
        }
    }

    /// A complaint that stands unless the device lied about a command's outcome: on an honest
    /// device at once, otherwise decided at the end of the execution.
    pub(crate) fn complain_strict(&mut self, t: &mut Trace, what: String) {
        if self.honest {
            self.complain(t, what);
        } else {
            note!(
                t,
                "    !! (unless a command's outcome was lied about) {what}"
            );
            self.strict.push(what);
        }
    }

    /// A completion polled must be of a request posted to its QP (or its SRQ) and not yet
    /// completed, whatever the device wrote: a wr_id never posted, one already completed, and
    /// one of a QP reset or destroyed since are wrong.
    pub(crate) fn completed(&mut self, t: &mut Trace, wc: &WorkCompletion) {
        let key = (wc.qp_num, wc.wr_id);
        let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        for k in [Some(key), recv.then_some((ANY_QP, wc.wr_id))]
            .into_iter()
            .flatten()
        {
            if let Some(n) = self.posted.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    self.posted.remove(&k);
                }
                return;
            }
        }
        let what = if self.dead.contains_key(&key) {
            "of a request its QP lost to a reset or a destroy"
        } else {
            "not posted or already completed"
        };
        self.complain_strict(
            t,
            format!(
                "a completion for wr_id {:#x} on QP {}, {what}",
                wc.wr_id, wc.qp_num
            ),
        );
    }

    /// A poll (or a future) failed: on an honest device no completion is ever refused.
    pub(crate) fn poll_failed(&mut self, t: &mut Trace, e: &Error) {
        self.err(t, e);
        if self.honest && matches!(e, Error::Protocol { .. }) {
            self.complain(
                t,
                format!("a completion refused on an honest device: {e:?}"),
            );
        }
    }

    pub(crate) fn pd(&self, i: usize) -> &'c Pd<'c> {
        // SAFETY: callers register as users before keeping the reference.
        unsafe { self.pds[i].as_ref().expect("live PD").get() }
    }

    pub(crate) fn cq(&self, i: usize) -> &'c Cq<'c> {
        // SAFETY: as for `pd`.
        unsafe { self.cqs[i].as_ref().expect("live CQ").get() }
    }

    pub(crate) fn srq(&self, i: usize) -> &'c Srq<'c> {
        // SAFETY: as for `pd`.
        unsafe { self.srqs[i].as_ref().expect("live SRQ").0.get() }
    }

    pub(crate) fn use_pd(&mut self, i: usize, d: i32) {
        let o = self.pds[i].as_mut().expect("live PD");
        o.users = o.users.checked_add_signed(d).expect("PD users");
    }

    pub(crate) fn use_cq(&mut self, i: usize, d: i32) {
        let o = self.cqs[i].as_mut().expect("live CQ");
        o.users = o.users.checked_add_signed(d).expect("CQ users");
    }

    pub(crate) fn use_srq(&mut self, i: usize, d: i32) {
        let o = &mut self.srqs[i].as_mut().expect("live SRQ").0;
        o.users = o.users.checked_add_signed(d).expect("SRQ users");
    }

    pub(crate) fn bound_gid(&self, r: &mut Rng) -> Option<(u8, Gid)> {
        if self.gids.is_empty() {
            return None;
        }
        let g = &self.gids[r.below(self.gids.len() as u64) as usize];
        Some((g.index().min(255) as u8, g.gid()))
    }

    // -----------------------------------------------------------------------------------------
    // Operations.

    pub(crate) fn step(&mut self, r: &mut Rng, t: &mut Trace) {
        match r.below(100) {
            0..=1 => self.query_port(r, t),
            2 => self.query_pkey(r, t),
            3..=6 => self.alloc_pd(t),
            7..=8 => self.destroy_pd(r, t),
            9..=12 => self.create_cq(r, t),
            13..=14 => self.destroy_cq(r, t),
            15..=17 => self.bind_gid(r, t),
            18 => self.unbind_gid(r, t),
            19..=24 => self.register_mr(r, t),
            25..=26 => self.destroy_mr(r, t),
            27..=32 => self.create_qp(r, t),
            33..=34 => self.raw_qp(r, t),
            35..=41 => self.modify_qp(r, t),
            42..=43 => self.query_qp(r, t),
            44..=46 => self.destroy_qp(r, t),
            47..=49 => self.create_srq(r, t),
            50 => self.destroy_srq(r, t),
            51..=57 => self.connect(r, t),
            _ => data::op(self, r, t),
        }
    }

    pub(crate) fn query_port(&mut self, r: &mut Rng, t: &mut Trace) {
        let port = r.pick(&[1, 1, 1, 1, 1, 0, 2, 255]);
        note!(t, "query_port({port})");
        let res = self.ctx.query_port(port);
        self.res(t, &res);
    }

    pub(crate) fn query_pkey(&mut self, r: &mut Rng, t: &mut Trace) {
        let port = r.pick(&[1, 1, 1, 0, 2]);
        let index = r.pick(&[0, 0, 0, 0, 0, 1, 255, 256, u16::MAX]);
        note!(t, "query_pkey({port}, {index})");
        let res = self.ctx.query_pkey(port, index);
        self.res(t, &res);
    }

    pub(crate) fn alloc_pd(&mut self, t: &mut Trace) {
        note!(t, "alloc_pd() = #{}", self.pds.len());
        match self.ctx.alloc_pd() {
            Ok(pd) => {
                note!(t, "    -> Ok(handle {})", pd.raw().handle());
                self.pds.push(Some(Owned::new(pd)));
            }
            Err(e) => self.err(t, &e),
        }
    }

    pub(crate) fn destroy_pd(&mut self, r: &mut Rng, t: &mut Trace) {
        let Some(i) = pick_live(r, &self.pds).filter(|&i| self.pds[i].as_ref().unwrap().users == 0)
        else {
            return;
        };
        let explicit = r.below(2) == 0;
        note!(t, "destroy_pd(#{i}, explicit {explicit})");
        let pd = self.pds[i].take().unwrap().take();
        if explicit {
            if let Err((pd, e)) = pd.destroy() {
                self.err(t, &e);
                self.pds[i] = Some(Owned::new(pd));
            }
        } else {
            drop(pd);
        }
    }

    pub(crate) fn create_cq(&mut self, r: &mut Rng, t: &mut Trace) {
        let max = self.ctx.caps().max_cqe;
        let entries = count(
            r,
            300,
            &[
                0,
                1,
                63,
                64,
                65,
                4095,
                4096,
                4097,
                8192,
                max,
                max.wrapping_add(1),
                u32::MAX,
                0x8000_0000,
            ],
        );
        note!(t, "create_cq({entries}) = #{}", self.cqs.len());
        match self.ctx.create_cq(entries) {
            Ok(cq) => {
                let n = cq.entries();
                note!(t, "    -> Ok(entries {n}, handle {})", cq.raw().handle());
                if n < entries.max(1) || !n.is_power_of_two() {
                    self.complain(t, format!("create_cq({entries}) gave {n} entries"));
                }
                self.cqs.push(Some(Owned::new(cq)));
            }
            Err(e) => self.err(t, &e),
        }
    }

    pub(crate) fn destroy_cq(&mut self, r: &mut Rng, t: &mut Trace) {
        let Some(i) = pick_live(r, &self.cqs).filter(|&i| self.cqs[i].as_ref().unwrap().users == 0)
        else {
            return;
        };
        let explicit = r.below(2) == 0;
        note!(t, "destroy_cq(#{i}, explicit {explicit})");
        let cq = self.cqs[i].take().unwrap().take();
        if explicit {
            if let Err((cq, e)) = cq.destroy() {
                self.err(t, &e);
                self.cqs[i] = Some(Owned::new(cq));
            }
        } else {
            drop(cq);
        }
    }

    pub(crate) fn bind_gid(&mut self, r: &mut Rng, t: &mut Trace) {
        let len = self.ctx.caps().gid_tbl_len;
        let index = count(r, 3, &[254, 255, 256, len.wrapping_sub(1), len, u32::MAX]);
        let mut gid = Gid::link_local_from_mac([0x52, 0x54, 0, 0x12, 0x34, r.below(256) as u8]);
        if r.below(4) == 0 {
            gid = Gid(r.next_u64().to_le_bytes().repeat(2).try_into().unwrap());
        }
        note!(t, "bind_gid({index}, {:02x?})", gid.0);
        match self.ctx.bind_gid(index, gid) {
            Ok(g) => {
                note!(t, "    -> Ok");
                self.gids.push(g);
            }
            Err(e) => self.err(t, &e),
        }
    }

    pub(crate) fn unbind_gid(&mut self, r: &mut Rng, t: &mut Trace) {
        if self.gids.is_empty() {
            return;
        }
        let i = r.below(self.gids.len() as u64) as usize;
        let g = self.gids.swap_remove(i);
        let explicit = r.below(2) == 0;
        note!(t, "unbind_gid(index {}, explicit {explicit})", g.index());
        if explicit {
            let res = g.unbind();
            self.res(t, &res);
        } else {
            drop(g);
        }
    }

    pub(crate) fn register_mr(&mut self, r: &mut Rng, t: &mut Trace) {
        let Some(pd) = pick_live(r, &self.pds) else {
            return;
        };
        let max = usize::try_from(self.ctx.caps().max_mr_size).unwrap_or(usize::MAX);
        // Mostly small; the large edges are rare (a region of max_mr_size costs milliseconds).
        let len = match r.below(100) {
            0..=79 => 1 + r.below(3 * 4096) as usize,
            80..=97 => r.pick(&[0, 1, 4095, 4096, 4097, 64 << 10]),
            _ => r.pick(&[max, max.wrapping_add(1), 1 << 30, (1 << 30) + 1, usize::MAX]),
        };
        let access = AccessFlags::from_bits_truncate(r.below(32) as u32);
        note!(
            t,
            "register_mr(pd #{pd}, {len}, {access:?}) = #{}",
            self.mrs.len()
        );
        match self.pd(pd).register(len, access) {
            Ok(mr) => {
                note!(
                    t,
                    "    -> Ok(lkey {:#x}, rkey {:#x}, addr {:#x})",
                    mr.lkey(),
                    mr.rkey(),
                    mr.addr()
                );
                self.use_pd(pd, 1);
                self.mrs.push((mr, pd));
            }
            Err(e) => self.err(t, &e),
        }
    }

    pub(crate) fn destroy_mr(&mut self, r: &mut Rng, t: &mut Trace) {
        if self.mrs.is_empty() {
            return;
        }
        let i = r.below(self.mrs.len() as u64) as usize;
        let (mr, pd) = self.mrs.swap_remove(i);
        let explicit = r.below(2) == 0;
        note!(t, "destroy_mr(lkey {:#x}, explicit {explicit})", mr.lkey());
        if explicit {
            if let Err((mr, e)) = mr.destroy() {
                self.err(t, &e);
                self.mrs.push((mr, pd));
                return;
            }
        } else {
            drop(mr);
        }
        self.use_pd(pd, -1);
    }

    pub(crate) fn qp_caps(&self, r: &mut Rng) -> QpCaps {
        let c = self.ctx.caps();
        let wr = |r: &mut Rng| {
            count(
                r,
                16,
                &[
                    17,
                    100,
                    2048,
                    2049,
                    4096,
                    c.max_qp_wr,
                    c.max_qp_wr.wrapping_add(1),
                    u32::MAX,
                    0x8000_0000,
                ],
            )
        };
        let sge = |r: &mut Rng| {
            count(
                r,
                4,
                &[
                    5,
                    c.max_sge,
                    c.max_sge.wrapping_add(1),
                    256,
                    4096,
                    0x1_0000,
                    0x0100_0000,
                    0x0800_0000,
                    0x1000_0000,
                    u32::MAX / 16,
                    u32::MAX,
                ],
            )
        };
        QpCaps {
            max_send_wr: wr(r),
            max_recv_wr: wr(r),
            max_send_sge: sge(r),
            max_recv_sge: sge(r),
            max_inline_data: if r.below(64) == 0 { 1 } else { 0 },
        }
    }

    /// A PD, two CQs and maybe an SRQ for a new QP (all of the same world).
    pub(crate) fn qp_parts(&self, r: &mut Rng) -> Option<(usize, usize, usize, Option<usize>)> {
        let pd = pick_live(r, &self.pds)?;
        let scq = pick_live(r, &self.cqs)?;
        let rcq = if r.below(2) == 0 {
            scq
        } else {
            pick_live(r, &self.cqs)?
        };
        let srq = if r.below(5) == 0 {
            pick_live(r, &self.srqs)
        } else {
            None
        };
        Some((pd, scq, rcq, srq))
    }

    pub(crate) fn add_users(
        &mut self,
        pd: usize,
        scq: usize,
        rcq: usize,
        srq: Option<usize>,
        d: i32,
    ) {
        self.use_pd(pd, d);
        self.use_cq(scq, d);
        self.use_cq(rcq, d);
        if let Some(s) = srq {
            self.use_srq(s, d);
        }
    }

    pub(crate) fn create_qp(&mut self, r: &mut Rng, t: &mut Trace) {
        let Some((pd, scq, rcq, srq)) = self.qp_parts(r) else {
            return;
        };
        let caps = self.qp_caps(r);
        let ty = r.below(24);
        let sig = r.below(2) == 0;
        let mut ex = QpInitEx::default();
        match r.below(64) {
            0 => ex.create_flags = CreateFlags::SCATTER_FCS,
            1 => ex.source_qpn = Some(5),
            2 => ex.max_tso_header = 64,
            3 => ex.xrcd = Some(1),
            _ => {}
        }
        note!(
            t,
            "create_qp(type {ty}, pd #{pd}, cqs #{scq} #{rcq}, srq {srq:?}, {caps:?}, \
             sig_all {sig}, {ex:?}) = #{}",
            self.qps.len()
        );
        let mut b = self
            .pd(pd)
            .qp_builder(self.cq(scq), self.cq(rcq))
            .caps(caps)
            .sq_sig_all(sig)
            .ex(ex);
        if let Some(s) = srq {
            b = b.srq(self.srq(s));
        }
        let res = match ty {
            0..=10 => b.build::<Rc>().map(|q| AnyQp::Rc(St::Reset(q))),
            11..=19 => b.build::<Ud>().map(|q| AnyQp::Ud(St::Reset(q))),
            20..=22 => b.build::<Gsi>().map(|q| AnyQp::Gsi(St::Reset(q))),
            _ => match b.build::<Uc>() {
                Ok(q) => {
                    drop(q);
                    self.complain(t, "a UC QP was created".into());
                    return;
                }
                Err(e) => Err(e),
            },
        };
        match res {
            Ok(q) => {
                let (qpn, got) = on_qp!(&q, s => on_st!(s, q => (q.qp_num(), q.caps())));
                note!(t, "    -> Ok(qpn {qpn}, {got:?})");
                let short = got.max_send_wr < caps.max_send_wr.max(1)
                    || got.max_send_sge < caps.max_send_sge.max(1)
                    || (srq.is_none()
                        && (got.max_recv_wr < caps.max_recv_wr.max(1)
                            || got.max_recv_sge < caps.max_recv_sge.max(1)));
                if short {
                    self.complain(t, format!("QP caps {got:?} for a request of {caps:?}"));
                }
                self.add_users(pd, scq, rcq, srq, 1);
                self.qps.push(QpEntry {
                    qp: Some(q),
                    pd,
                    scq,
                    rcq,
                    srq,
                    qpn,
                    qkey: 0,
                    held: Vec::new(),
                });
            }
            Err(e) => self.err(t, &e),
        }
    }

    /// A QP created, modified, queried and destroyed at the provider level: no bookkeeping
    /// capacity, so the device's largest queues too.
    pub(crate) fn raw_qp(&mut self, r: &mut Rng, t: &mut Trace) {
        let p = self.ctx.provider();
        if !self.raw_qps.is_empty() && r.below(2) == 0 {
            let i = r.below(self.raw_qps.len() as u64) as usize;
            let state = self.raw_qps[i].state;
            let to = match r.below(6) {
                0 => QpState::Reset,
                1 => QpState::Err,
                _ => match state {
                    QpState::Reset => QpState::Init,
                    QpState::Init => QpState::Rtr,
                    QpState::Rtr => QpState::Rts,
                    _ => QpState::Reset,
                },
            };
            let Some(qp) = self.raw_qps[i].qp.as_mut() else {
                return;
            };
            if r.below(3) == 0 {
                note!(t, "raw query_qp(#{i})");
                let res = p.query_qp(qp);
                self.res(t, &res);
                return;
            }
            note!(t, "raw modify_qp(#{i}, {state:?} -> {to:?})");
            let res = p.modify_qp(qp, &ModifyAttr::to_state(to));
            if res.is_ok() {
                self.raw_qps[i].state = to;
            }
            self.res(t, &res);
            return;
        }
        let Some((pd, scq, rcq, srq)) = self.qp_parts(r) else {
            return;
        };
        let mut caps = self.qp_caps(r);
        if r.below(2) == 0 {
            caps.max_send_wr = r.pick(&[64, 512, 1024, 2048, 4096, 8192]);
            caps.max_recv_wr = r.pick(&[64, 512, 1024, 2048, 4096, 8192]);
        }
        let qp_type = r.pick(&[QpType::Rc, QpType::Ud, QpType::Gsi, QpType::Uc]);
        let init = QpInit {
            qp_type,
            caps,
            sq_sig_all: r.below(2) == 0,
            has_srq: srq.is_some(),
            ex: QpInitEx::default(),
            safe: None,
        };
        note!(t, "raw create_qp({init:?}) = #{}", self.raw_qps.len());
        let plan = p.plan_qp(&init);
        self.res(t, &plan);
        if plan.is_err() && r.below(4) != 0 {
            return;
        }
        let (pdr, scqr, rcqr) = (self.pd(pd).raw(), self.cq(scq).raw(), self.cq(rcq).raw());
        let srqr = srq.map(|s| self.srq(s).raw());
        // SAFETY: the PD, CQs and SRQ are boxed (they do not move) and count this QP as a user
        // until it is destroyed (or leaked), which happens before the context goes.
        let res = unsafe { p.create_qp(pdr, scqr, rcqr, srqr, &init) };
        match res {
            Ok(qp) => {
                note!(t, "    -> Ok(qpn {}, {:?})", p.qp_num(&qp), p.qp_caps(&qp));
                self.add_users(pd, scq, rcq, srq, 1);
                self.raw_qps.push(RawQp {
                    qp: Some(qp),
                    state: QpState::Reset,
                    pd,
                    scq,
                    rcq,
                    srq,
                });
            }
            Err(e) => self.err(t, &e),
        }
    }
}
