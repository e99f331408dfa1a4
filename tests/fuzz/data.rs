//! The data path: every posting and polling call of the fuzzer is here, so that a new data-path
//! API is a change of this module only.

use super::*;

pub(super) fn op(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
    match r.below(20) {
        0..=5 => post_send(w, r, t),
        6..=8 => post_recv(w, r, t),
        9 => srq_recv(w, r, t),
        10..=11 => safe_post(w, r, t),
        12..=14 => poll_cq(w, r, t),
        15 => churn(w, r, t),
        16 => await_cq(w, r, t),
        17..=18 => poll_qp(w, r, t),
        _ => arm(w, r, t),
    }
}

/// `n` scatter/gather entries: mostly inside regions of `pd`, sometimes anywhere.
fn sges(w: &World<'_>, r: &mut Rng, pd: usize, n: u32) -> Vec<Sge> {
    let own: Vec<usize> = (0..w.mrs.len()).filter(|&i| w.mrs[i].1 == pd).collect();
    (0..n)
        .map(|_| {
            let pool = if own.is_empty() || r.below(8) == 0 {
                (0..w.mrs.len()).collect()
            } else {
                own.clone()
            };
            if pool.is_empty() || r.below(16) == 0 {
                return Sge {
                    addr: r.next_u64(),
                    length: r.below(8192) as u32,
                    lkey: r.next_u64() as u32,
                };
            }
            let mr = &w.mrs[r.pick(&pool)].0;
            let len = mr.len() as u64;
            let off = r.below(len.min(1 << 16) + 1);
            // Payloads stay small (the model copies them); the edges are beyond the region.
            let length = if r.below(10) == 0 {
                r.pick(&[0, u32::MAX, len as u32 + 1])
            } else {
                r.below((len - off).min(1 << 14) + 1) as u32
            };
            Sge {
                addr: mr.addr().wrapping_add(off),
                length,
                lkey: mr.lkey(),
            }
        })
        .collect()
}

fn wr_id(r: &mut Rng) -> u64 {
    // The full 64 bits are the caller's.
    r.next_u64()
}

/// A UD destination: an address handle (its source GID index sometimes made up: the
/// driver must refuse what it cannot send from), a QP number and a Q_Key.
fn ud_dest(w: &World<'_>, r: &mut Rng) -> (AddressVector, u32, u32) {
    let (mut sgid, gid) = w.bound_gid(r).unwrap_or((0, Gid([0; 16])));
    if r.below(16) == 0 {
        // A source GID index the caller made up.
        sgid = r.pick(&[1, 7, 200, 254, 255]);
    }
    let uds: Vec<&QpEntry<'_>> = w
        .qps
        .iter()
        .filter(|e| matches!(e.qp, Some(AnyQp::Ud(_))))
        .collect();
    let (qpn, qkey) = if uds.is_empty() || r.below(6) == 0 {
        (r.pick(&[0, 1, 0x00FF_FFFF, u32::MAX]), r.next_u64() as u32)
    } else {
        let e = uds[r.below(uds.len() as u64) as usize];
        (e.qpn, if r.below(4) == 0 { 0x8000_0000 } else { e.qkey })
    };
    (AddressVector::new(gid, sgid), qpn, qkey)
}

/// A remote address and key: mostly a region of this world, sometimes anything.
fn remote(w: &World<'_>, r: &mut Rng) -> (u64, u32) {
    match w.mrs.get(r.below(w.mrs.len() as u64 + 1) as usize) {
        Some((mr, _)) => (mr.addr() + r.below(64), mr.rkey()),
        None => (r.next_u64(), r.next_u64() as u32),
    }
}

/// A QP (index) in a state matching `want`.
fn qp_where(w: &World<'_>, r: &mut Rng, want: impl Fn(QpState) -> bool) -> Option<usize> {
    let ok: Vec<usize> = (0..w.qps.len())
        .filter(|&i| {
            w.qps[i]
                .qp
                .as_ref()
                .is_some_and(|q| want(on_qp!(q, s => s.state())))
        })
        .collect();
    (!ok.is_empty()).then(|| r.pick(&ok))
}

/// Scatter lists for `nwr` requests on QP `i` (sometimes one SGE too many).
fn lists(w: &World<'_>, r: &mut Rng, i: usize, max: u32, nwr: usize) -> Vec<Vec<Sge>> {
    // (Lists stay short whatever the QP allows.)
    let max = max.min(16);
    (0..nwr)
        .map(|_| {
            let n = if r.below(16) == 0 {
                max + 1
            } else {
                r.below(u64::from(max) + 1) as u32
            };
            sges(w, r, w.qps[i].pd, n)
        })
        .collect()
}

/// A batch of raw sends, every opcode the transport has; finished or dropped.
fn post_send(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
    let Some(i) = qp_where(w, r, |s| s == QpState::Rts) else {
        return;
    };
    let max = on_qp!(w.qps[i].qp.as_ref().unwrap(), s => on_st!(s, q => q.caps().max_send_sge));
    let nwr = 1 + r.below(4) as usize;
    let lists = lists(w, r, i, max, nwr);
    let finish = r.below(8) != 0;
    let pd = w.qps[i].pd;
    let dest = ud_dest(w, r);
    let ah = w.pd(pd).create_ah(&dest.0);
    note!(
        t,
        "send batch(#{i}, {nwr} WRs, finish {finish}), ah {:?}",
        ah.as_ref().err()
    );
    if let Err(e) = &ah {
        w.err(t, e);
    }
    let plan: Vec<(u64, u64, SendFlags, (u64, u32))> = (0..nwr)
        .map(|_| {
            let flags = SendFlags::from_bits_truncate(r.below(16) as u32 & !8);
            (wr_id(r), r.below(10), flags, remote(w, r))
        })
        .collect();
    let (mut ok, mut errs) = (Vec::new(), Vec::new());
    macro_rules! connected {
        ($q:expr) => {{
            let mut b = $q.send_batch();
            for (l, &(id, kind, flags, rem)) in lists.iter().zip(&plan) {
                // SAFETY: the buffers are regions of this world, or name none. A region may
                // be destroyed while a request names it (the contract's letter is broken),
                // but the device is the model: it reaches memory only through live regions
                // and the machine's allocation table, and never reuses a physical address.
                let res = unsafe {
                    match kind {
                        0..=3 => b.send(id, flags, l),
                        4 => b.send_imm(id, flags, 7, l),
                        5 => b.rdma_write(id, flags, rem, l),
                        6 => b.rdma_write_imm(id, flags, rem, 7, l),
                        7 | 8 => b.rdma_read(id, flags, rem, l),
                        _ => match l.first() {
                            Some(s) => b.atomic_fetch_add(id, flags, rem, 1, s),
                            None => b.send_inline(id, flags, b"inline"),
                        },
                    }
                };
                note!(t, "    wr {id:#x} kind {kind}: {res:?}");
                match res {
                    Ok(()) => ok.push(id),
                    Err(e) => errs.push(e),
                }
            }
            if finish {
                b.finish();
            }
        }};
    }
    macro_rules! datagram {
        ($q:expr) => {{
            let Ok(ah) = &ah else {
                return;
            };
            let mut b = $q.send_batch();
            for (l, &(id, kind, flags, _)) in lists.iter().zip(&plan) {
                let to = (ah, dest.1, dest.2);
                // SAFETY: as for connected QPs.
                let res = unsafe {
                    if kind == 4 {
                        b.send_to_imm(id, flags, to, 9, l)
                    } else {
                        b.send_to(id, flags, to, l)
                    }
                };
                note!(t, "    wr {id:#x} to {dest:?}: {res:?}");
                match res {
                    Ok(()) => ok.push(id),
                    Err(e) => errs.push(e),
                }
            }
            if finish {
                b.finish();
            }
        }};
    }
    match w.qps[i].qp.as_mut().unwrap() {
        AnyQp::Rc(St::Rts(q)) => connected!(q),
        AnyQp::Ud(St::Rts(q)) => datagram!(q),
        AnyQp::Gsi(St::Rts(q)) => datagram!(q),
        _ => return,
    }
    for e in &errs {
        w.err(t, e);
    }
    if finish {
        let qpn = w.qps[i].qpn;
        w.posted(qpn, ok.iter());
    }
}

/// A batch of raw receives; finished or dropped.
fn post_recv(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
    let Some(i) = qp_where(w, r, |s| {
        matches!(s, QpState::Init | QpState::Rtr | QpState::Rts)
    }) else {
        return;
    };
    let max = on_qp!(w.qps[i].qp.as_ref().unwrap(), s => on_st!(s, q => q.caps().max_recv_sge));
    let nwr = 1 + r.below(4) as usize;
    let lists = lists(w, r, i, max, nwr);
    let ids: Vec<u64> = (0..nwr).map(|_| wr_id(r)).collect();
    let finish = r.below(8) != 0;
    note!(t, "recv batch(#{i}, {lists:?}, finish {finish})");
    let (mut ok, mut errs) = (Vec::new(), Vec::new());
    macro_rules! recv {
        ($q:expr) => {{
            let mut b = $q.recv_batch();
            for (l, &id) in lists.iter().zip(&ids) {
                // SAFETY: as in `post_send`.
                match unsafe { b.recv(id, l) } {
                    Ok(()) => ok.push(id),
                    Err(e) => errs.push(e),
                }
            }
            if finish {
                b.finish();
            }
        }};
    }
    match w.qps[i].qp.as_mut().unwrap() {
        AnyQp::Rc(St::Init(q)) => recv!(q),
        AnyQp::Rc(St::Rtr(q)) => recv!(q),
        AnyQp::Rc(St::Rts(q)) => recv!(q),
        AnyQp::Ud(St::Init(q)) => recv!(q),
        AnyQp::Ud(St::Rtr(q)) => recv!(q),
        AnyQp::Ud(St::Rts(q)) => recv!(q),
        AnyQp::Gsi(St::Init(q)) => recv!(q),
        AnyQp::Gsi(St::Rtr(q)) => recv!(q),
        AnyQp::Gsi(St::Rts(q)) => recv!(q),
        _ => return,
    }
    for e in &errs {
        w.err(t, e);
    }
    if finish {
        let qpn = w.qps[i].qpn;
        w.posted(qpn, ok.iter());
    }
}

fn srq_recv(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
    let Some(i) = pick_live(r, &w.srqs) else {
        return;
    };
    let (srq, pd) = (w.srq(i), w.srqs[i].as_ref().unwrap().1);
    let max = srq.attr().max_sge.min(16);
    let lists: Vec<Vec<Sge>> = (0..1 + r.below(4))
        .map(|_| {
            let n = r.below(u64::from(max) + 1) as u32 + u32::from(r.below(16) == 0);
            sges(w, r, pd, n)
        })
        .collect();
    let wrs: Vec<RecvWr<'_>> = lists
        .iter()
        .map(|l| RecvWr {
            wr_id: wr_id(r),
            sg_list: l,
        })
        .collect();
    note!(t, "srq post_recv_raw(#{i}, {wrs:?})");
    // SAFETY: as in `post_send`.
    let res = unsafe { srq.post_recv_raw(&wrs) };
    if res.is_ok() {
        w.posted(ANY_QP, wrs.iter().map(|w| &w.wr_id));
    }
    w.res(t, &res);
}

/// The safe path, whole: a pool, a QP of its own on this world's CQs (connected to itself,
/// or UD), safe posts and polls through the QP, then the QP and the pool go. Every buffer
/// must be back in the pool at the end.
fn safe_post(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
    let (Some(pd), Some(cq)) = (pick_live(r, &w.pds), pick_live(r, &w.cqs)) else {
        return;
    };
    let (count, size) = (1 + r.below(8) as u32, r.pick(&[1, 64, 256, 4096, 1 << 20]));
    note!(t, "safe path: pool({count} x {size}) in pd #{pd}, cq #{cq}");
    let pool = match w.pd(pd).buffer_pool(count, size) {
        Ok(p) => p,
        Err(e) => return w.err(t, &e),
    };
    let ud = r.below(2) == 0;
    let caps = QpCaps {
        max_send_wr: 1 + r.below(4) as u32,
        max_recv_wr: 1 + r.below(4) as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let b = || {
        w.pd(pd)
            .qp_builder(w.cq(cq), w.cq(cq))
            .caps(caps)
            .pool(&pool)
    };
    let sends = 1 + r.below(4);
    let after_err = r.below(6);
    // wr_ids of its own (bit 63 clear: the fuzzer's books), sends at base + k, receives at
    // base + 2^40 + k.
    let base = r.next_u64() >> 24;
    let mut books = PoolBooks::default();
    // One round: a receive and a send posted (each with a buffer of the pool), then up to
    // two polls through the QP; the pool's books checked after each step.
    macro_rules! round {
        ($qpv:ident, $qpn:expr, $k:expr, $q:ident, $kk:ident, $buf:ident => $post:expr) => {{
            let k: u64 = $k;
            if let Some(mut buf) = pool.alloc() {
                books.handed_out(w, t, buf.index());
                if let Some(rb) = pool.alloc() {
                    books.handed_out(w, t, rb.index());
                    let (id, index) = (base + (1 << 40) + k, rb.index());
                    let res = $qpv.post_recv(id, rb);
                    books.posted(w, t, ($qpn, id, index), res);
                    // (The send's buffer is still in hand.)
                    books.check(w, t, &pool, 1, "a safe receive");
                }
                let _ = buf.set_len(r.below(u64::from(buf.capacity()) + 1) as u32);
                let (id, index) = (base + k, buf.index());
                let res = {
                    let ($q, $kk, $buf) = (&mut $qpv, id, buf);
                    $post
                };
                books.posted(w, t, ($qpn, id, index), res);
                books.check(w, t, &pool, 0, "a safe send");
            }
            for _ in 0..r.below(3) {
                match $qpv.poll_one() {
                    Ok(Some(c)) => {
                        note!(t, "    -> {:?} with buffer {}", c.wc, c.buf.is_some());
                        w.completed(t, &c.wc);
                        books.completed(w, t, c.wc.wr_id, c.buf.as_ref().map(|b| b.index()));
                        drop(c);
                    }
                    Ok(None) => {}
                    Err(e) => w.poll_failed(t, &e),
                }
                books.check(w, t, &pool, 0, "a poll");
            }
        }};
    }
    macro_rules! exercise {
        ($qp:expr, $q:ident, $kk:ident, $buf:ident => $post:expr) => {{
            let mut qp = $qp;
            let qpn = qp.qp_num();
            for k in 0..sends {
                round!(qp, qpn, k, $q, $kk, $buf => $post);
            }
            if r.below(3) == 0 {
                note!(t, "    to_error, then {after_err} rounds in ERR");
                match qp.to_error() {
                    Ok(mut q) => {
                        // Posts and polls go on in ERR: the flushed requests' slots are
                        // used again.
                        for k in sends..sends + after_err {
                            round!(q, qpn, k, $q, $kk, $buf => $post);
                        }
                        drop(q);
                    }
                    Err((q, e)) => {
                        w.err(t, &e);
                        drop(q);
                    }
                }
            } else {
                drop(qp);
            }
            w.kill(qpn);
        }};
    }
    if ud {
        let dest = ud_dest(w, r);
        let ah = match w.pd(pd).create_ah(&dest.0) {
            Ok(a) => a,
            Err(e) => return w.err(t, &e),
        };
        let qp = match b().build::<Ud>() {
            Ok(q) => q,
            Err(e) => return w.err(t, &e),
        };
        let qp = match qp.ready(0x1234, 0) {
            Ok(q) => q,
            Err((_, e)) => return w.err(t, &e),
        };
        exercise!(qp, q, id, buf => q.post_send_to(id, buf, (&ah, dest.1, dest.2)));
    } else {
        let qp = match b().build::<Rc>() {
            Ok(q) => q,
            Err(e) => return w.err(t, &e),
        };
        let qpn = qp.qp_num();
        let Some((sgid, gid)) = w.bound_gid(r) else {
            return;
        };
        let qp = match qp.init(&ConnectedInit::default()) {
            Ok(q) => q,
            Err((_, e)) => return w.err(t, &e),
        };
        let qp = match qp.rtr(&ConnectedRtr::new(qpn, 0, AddressVector::new(gid, sgid))) {
            Ok(q) => q,
            Err((_, e)) => return w.err(t, &e),
        };
        let qp = match qp.rts(&ConnectedRts::new(0)) {
            Ok(q) => q,
            Err((_, e)) => return w.err(t, &e),
        };
        exercise!(qp, q, id, buf => q.post_send(id, buf));
    }
    // The QP is gone: every buffer is back (a raw poll, a flush or the destroy returned
    // the rest) — unless the device lied about the destroy, which keeps them.
    if pool.free_count() != pool.count() {
        let (free, count) = (pool.free_count(), pool.count());
        w.complain_strict(
            t,
            format!("pool: {free} of {count} buffers back after the QP went"),
        );
    }
}

fn poll_cq(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
    let Some(i) = pick_live(r, &w.cqs) else {
        return;
    };
    let mut wc = [WorkCompletion::default(); 8];
    let n = r.below(9) as usize;
    note!(t, "poll_cq(#{i}, {n})");
    let res = w.cq(i).poll(&mut wc[..n]);
    if let Ok(k) = res {
        if k > n {
            w.complain(t, format!("poll returned {k} completions into {n} slots"));
        }
        note!(t, "    {:?}", &wc[..k.min(n)]);
        for c in &wc[..k.min(n)] {
            w.completed(t, c);
        }
    }
    match &res {
        Ok(k) => note!(t, "    -> Ok({k})"),
        Err(e) => w.poll_failed(t, e),
    }
}

/// Lifecycles on one CQ: a datagram QP (GSI or UD) sends to itself, its CQEs sometimes
/// left in the ring, then is reset and brought up again (GSI: the same QP) or destroyed
/// and made again (GSI: the same handle, 1); two to four lives. Every completion polled
/// is checked against the books: none of an earlier life may appear, and on an honest
/// device none is refused.
fn churn(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
    let (Some(pd), Some(cq), Some((sgid, gid))) =
        (pick_live(r, &w.pds), pick_live(r, &w.cqs), w.bound_gid(r))
    else {
        return;
    };
    let gsi = r.below(2) == 0;
    let lives = 2 + r.below(3);
    note!(t, "churn(pd #{pd}, cq #{cq}, gsi {gsi}, {lives} lives)");
    let ah = match w.pd(pd).create_ah(&AddressVector::new(gid, sgid)) {
        Ok(a) => a,
        Err(e) => return w.err(t, &e),
    };
    let qkey = 0x1111_0000;
    macro_rules! lives {
        ($ty:ty) => {{
            let (pdr, cqr) = (w.pd(pd), w.cq(cq));
            let build = || {
                pdr.qp_builder(cqr, cqr)
                    .caps(QpCaps {
                        max_send_wr: 4,
                        max_recv_wr: 4,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    })
                    .build::<$ty>()
            };
            let mut qp = match build() {
                Ok(q) => q,
                Err(e) => return w.err(t, &e),
            };
            for life in 0..lives {
                let qpn = qp.qp_num();
                let mut up = match qp.ready(qkey, 0) {
                    Ok(q) => q,
                    Err((_, e)) => return w.err(t, &e),
                };
                let n = 1 + r.below(3);
                let ids: Vec<u64> = (0..2 * n).map(|_| wr_id(r)).collect();
                let mut b = up.recv_batch();
                // SAFETY: no SGE: the requests name no memory.
                let recvs: Vec<u64> = ids[..n as usize]
                    .iter()
                    .filter(|&&id| unsafe { b.recv(id, &[]) }.is_ok())
                    .copied()
                    .collect();
                b.finish();
                w.posted(qpn, recvs.iter());
                let mut b = up.send_batch();
                let to = (&ah, qpn, qkey);
                // SAFETY: as above.
                let sends: Vec<u64> = ids[n as usize..]
                    .iter()
                    .filter(|&&id| unsafe { b.send_to(id, SendFlags::SIGNALED, to, &[]) }.is_ok())
                    .copied()
                    .collect();
                b.finish();
                w.posted(qpn, sends.iter());
                note!(
                    t,
                    "  life {life} of QP {qpn}: recvs {recvs:x?}, sends {sends:x?}"
                );
                for _ in 0..r.below(3) {
                    let mut wc = [WorkCompletion::default(); 2];
                    match w.cq(cq).poll(&mut wc) {
                        Ok(k) => {
                            note!(t, "    {:?}", &wc[..k]);
                            for c in &wc[..k] {
                                w.completed(t, c);
                            }
                        }
                        Err(e) => w.poll_failed(t, &e),
                    }
                }
                if gsi && r.below(2) == 0 {
                    note!(t, "  reset");
                    qp = match up.reset() {
                        Ok(q) => q,
                        Err((q, e)) => {
                            w.err(t, &e);
                            drop(q);
                            w.kill(qpn);
                            return;
                        }
                    };
                    w.kill(qpn);
                } else {
                    note!(t, "  destroy, build again");
                    drop(up);
                    w.kill(qpn);
                    qp = match build() {
                        Ok(q) => q,
                        Err(e) => return w.err(t, &e),
                    };
                }
            }
            let qpn = qp.qp_num();
            drop(qp);
            w.kill(qpn);
        }};
    }
    if gsi {
        lives!(Gsi);
    } else {
        lives!(Ud);
    }
    // What is left in the CQ: nothing of those lives may come out.
    let mut wc = [WorkCompletion::default(); 8];
    match w.cq(cq).poll(&mut wc) {
        Ok(k) => {
            for c in &wc[..k] {
                w.completed(t, c);
            }
        }
        Err(e) => w.poll_failed(t, &e),
    }
}

/// The futures: `next_completion` (or `ready`) polled up to three times with a waker that
/// does nothing. Each poll must return (an unbounded loop is the watchdog's); a
/// completion it gives is checked as a poll's.
fn await_cq(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
    use std::future::Future;
    use std::task::{Context as TaskContext, Poll as TaskPoll, Waker};
    let Some(i) = pick_live(r, &w.cqs) else {
        return;
    };
    let mut cx = TaskContext::from_waker(Waker::noop());
    let tries = 1 + r.below(3);
    let cq = w.cq(i);
    if r.below(4) == 0 {
        note!(t, "ready(#{i}) x{tries}");
        let mut f = std::pin::pin!(cq.ready());
        for _ in 0..tries {
            match f.as_mut().poll(&mut cx) {
                TaskPoll::Ready(Ok(())) => return note!(t, "    -> ready"),
                TaskPoll::Ready(Err(e)) => return w.err(t, &e),
                TaskPoll::Pending => note!(t, "    -> pending"),
            }
        }
        return;
    }
    note!(t, "next_completion(#{i}) x{tries}");
    let mut f = std::pin::pin!(cq.next_completion());
    for _ in 0..tries {
        match f.as_mut().poll(&mut cx) {
            TaskPoll::Ready(Ok(wc)) => {
                note!(t, "    -> {wc:?}");
                return w.completed(t, &wc);
            }
            TaskPoll::Ready(Err(e)) => return w.poll_failed(t, &e),
            TaskPoll::Pending => note!(t, "    -> pending"),
        }
    }
}

fn poll_qp(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
    if w.qps.is_empty() {
        return;
    }
    let i = r.below(w.qps.len() as u64) as usize;
    note!(t, "poll_one(#{i})");
    let Some(q) = w.qps[i].qp.as_mut() else {
        return;
    };
    let res = on_qp!(q, s => on_st!(s, q => q.poll_one()));
    match res {
        Ok(Some(c)) => {
            note!(t, "    -> {:?} with buffer {}", c.wc, c.buf.is_some());
            w.completed(t, &c.wc);
        }
        Ok(None) => note!(t, "    -> None"),
        Err(e) => w.poll_failed(t, &e),
    }
}

fn arm(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
    let Some(i) = pick_live(r, &w.cqs) else {
        return;
    };
    let sol = r.below(2) == 0;
    note!(t, "arm(#{i}, solicited {sol})");
    let _ = w.cq(i).req_notify(sol);
}
