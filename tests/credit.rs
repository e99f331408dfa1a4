//! Send and receive credit and completion-queue capacity on the device model: a QP's credit
//! is exactly its depth and comes back with polling, a CQ's room is reserved at build,
//! released at destroy and not worn down by SRQ traffic, and the poll cursor reads each field
//! when asked.
//!
//! Every test runs in `lab`, which ends with every DMA page back and no violation of what QEMU
//! would mishandle.

mod common;

use bareverbs::Error;
use bareverbs::device::pvrdma::Pvrdma;
use bareverbs::error::Queue;
use bareverbs::verbs::*;
use bareverbs_model::Model;
use common::*;

type P = Pvrdma<Model>;
type UdQp<'a> = QueuePair<'a, P, Ud, Rts>;

const SIG: SendFlags = SendFlags::SIGNALED;

// ---------------------------------------------------------------------------------------------
// Credit

#[test]
fn send_credit_is_exactly_max_send_wr_and_comes_back_with_polling() {
    lab(|model, _, pd, cq, gid| {
        let pool = pd.buffer_pool(16, 64).unwrap();
        let qp = pd
            .qp_builder(cq, cq)
            .caps(caps(5, 1, 1))
            .pool(&pool)
            .build::<Ud>()
            .unwrap();
        let mut qp = qp.ready(1, 0).unwrap();
        let max = qp.caps().max_send_wr;
        assert_eq!(max, 8, "5 rounds up to the ring's 8 slots, all usable");
        let ah = pd.create_ah(&AddressVector::new(gid, 0)).unwrap();
        let src = with_mr(pd, b"x");
        let sge = [src.sge(0, 1).unwrap()];
        // To a QP that does not exist: dropped on the wire, each completes at once.
        let to = (&ah, 0xFFFF, 1);
        let post = |qp: &mut UdQp<'_>, wr_id| {
            let mut sb = qp.send_batch();
            // SAFETY: the region outlives the completions polled in this test.
            let r = unsafe { sb.send_to(wr_id, SIG, to, &sge) };
            sb.finish();
            r
        };
        for i in 0..max {
            post(&mut qp, u64::from(i)).unwrap();
        }
        assert_eq!(
            post(&mut qp, 99),
            Err(full(Queue::Send, 0)),
            "max_send_wr outstanding (completed by the device, not yet polled)"
        );
        let doorbells = model.counters().0;
        assert_eq!(post(&mut qp, 99), Err(full(Queue::Send, 0)));
        assert_eq!(model.counters().0, doorbells, "refused: nothing rang");
        // The safe path sees the same credit, and hands the buffer back.
        let (back, e) = qp
            .post_send_to(98, buf_with(&pool, b"kept"), to)
            .err()
            .unwrap();
        assert_eq!((e, back.as_slice()), (full(Queue::Send, 0), &b"kept"[..]));
        drop(back);
        // One polled, one more accepted, and not two.
        let mut wc = [WorkCompletion::default(); 1];
        assert_eq!(cq.poll(&mut wc), Ok(1));
        assert_eq!(wc[0].wr_id, 0);
        post(&mut qp, 8).unwrap();
        assert_eq!(post(&mut qp, 99), Err(full(Queue::Send, 0)));
        // Everything polled: a whole batch of max fits again.
        let wcs = drain(cq);
        assert_eq!(
            wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            (1..=8).collect::<Vec<_>>()
        );
        {
            let mut sb = qp.send_batch();
            for i in 0..max {
                // SAFETY: as above.
                unsafe { sb.send_to(100 + u64::from(i), SIG, to, &sge).unwrap() };
            }
            // SAFETY: as above (refused).
            assert_eq!(
                unsafe { sb.send_to(200, SIG, to, &sge) },
                Err(full(Queue::Send, 0))
            );
            sb.finish();
        }
        assert_eq!(drain(cq).len(), max as usize);
        assert_eq!(pool.free_count(), 16);
    });
}

#[test]
fn max_recv_wr_is_enforced_whatever_the_send_queue() {
    lab(|model, _, pd, cq, gid| {
        let pool = pd.buffer_pool(32, 64).unwrap();
        let build = || {
            pd.qp_builder(cq, cq)
                .caps(caps(64, 16, 1))
                .pool(&pool)
                .build::<Rc>()
                .unwrap()
        };
        let (mut a, mut b) = connect(build(), build(), gid);
        assert_eq!(b.caps().max_recv_wr, 16);
        assert_eq!(b.caps().max_send_wr, 64);
        let view = model.qp(b.qp_num()).unwrap();
        assert_eq!(view.caps[1], 16, "the device's receive queue has 16 slots");
        let rbuf = pd.register(4096, RW).unwrap();
        let doorbells = model.counters().0;
        for i in 0..16 {
            // SAFETY: the region outlives the completions polled below.
            unsafe { b.post_recv_raw(i, &[rbuf.sge(0, 64).unwrap()]).unwrap() };
        }
        assert_eq!(model.counters().0, doorbells + 16);
        // SAFETY: refused.
        let e = unsafe { b.post_recv_raw(16, &[rbuf.sge(0, 64).unwrap()]) };
        assert_eq!(e, Err(full(Queue::Recv, 0)), "the 17th receive is refused");
        let (back, e) = b.post_recv(17, pool.alloc().unwrap()).err().unwrap();
        assert_eq!(e, full(Queue::Recv, 0));
        drop(back);
        assert_eq!(model.counters().0, doorbells + 16, "refusals ring nothing");
        // One receive completes and is polled: exactly one more fits.
        let src = with_mr(pd, b"one");
        // SAFETY: as above.
        unsafe { send1(&mut a, 50, src.sge(0, 3).unwrap()) };
        let r = b.poll_one().unwrap().unwrap();
        assert_eq!((r.wc.wr_id, r.wc.status), (0, WcStatus::Success));
        drop(r);
        b.post_recv(18, pool.alloc().unwrap()).unwrap();
        let (back, e) = b.post_recv(19, pool.alloc().unwrap()).err().unwrap();
        assert_eq!(e, full(Queue::Recv, 0));
        drop(back);
        while a.poll_one().unwrap().is_some() {}
        // A UD QP likewise.
        let ud = pd
            .qp_builder(cq, cq)
            .caps(caps(64, 16, 1))
            .build::<Ud>()
            .unwrap();
        let mut ud = ud.ready(7, 0).unwrap();
        assert_eq!(ud.caps().max_recv_wr, 16);
        // SAFETY: as above.
        unsafe {
            let mut rb = ud.recv_batch();
            for i in 0..16 {
                rb.recv(i, &[rbuf.sge(0, 64).unwrap()]).unwrap();
            }
            assert_eq!(
                rb.recv(16, &[rbuf.sge(0, 64).unwrap()]),
                Err(full(Queue::Recv, 0))
            );
            rb.finish();
            assert_eq!(
                ud.post_recv_raw(17, &[rbuf.sge(0, 64).unwrap()]),
                Err(full(Queue::Recv, 0))
            );
        }
        drop((a, b, ud));
        assert_eq!(pool.free_count(), 32);
    });
}

// ---------------------------------------------------------------------------------------------
// Completion-queue capacity

/// Posts `n` raw receives to `qp` (ids from 0) one by one: how many were taken before the
/// first refusal, and that refusal.
fn recv_until_refused<S: CanRecv>(
    qp: &mut QueuePair<'_, P, impl Transport, S>,
    buf: &MemoryRegion<'_, P>,
    n: u64,
) -> (u64, Option<Error>) {
    for i in 0..n {
        // SAFETY: the region outlives the QP's receives in these tests.
        if let Err(e) = unsafe { qp.post_recv_raw(i, &[buf.sge(0, 64).unwrap()]) } {
            return (i, Some(e));
        }
    }
    (n, None)
}

#[test]
fn cq_room_a_qp_holds_is_given_back_at_destroy() {
    lab(|model, ctx, pd, big, _| {
        let cq16 = ctx.create_cq(16).unwrap();
        assert_eq!(cq16.entries(), 16);
        let rbuf = pd.register(4096, RW).unwrap();
        let init = ConnectedInit::default();
        let qp1 = pd
            .qp_builder(&cq16, &cq16)
            .caps(caps(8, 8, 1))
            .build::<Rc>()
            .unwrap();
        // A QP is never refused for its CQ's room: its requests are, while qp1 holds it.
        let other = pd
            .qp_builder(&cq16, &cq16)
            .caps(caps(1, 1, 1))
            .build::<Rc>()
            .unwrap();
        let mut other = other.init(&init).unwrap();
        assert_eq!(
            recv_until_refused(&mut other, &rbuf, 1),
            (0, Some(full(Queue::Cq, 0)))
        );
        // Released by drop…
        drop(qp1);
        assert_eq!(recv_until_refused(&mut other, &rbuf, 1), (1, None));
        drop(other);
        // …and by destroy.
        let qp2 = pd
            .qp_builder(&cq16, &cq16)
            .caps(caps(8, 8, 1))
            .build::<Rc>()
            .unwrap();
        qp2.destroy().unwrap();
        // A build the device refuses gives its reservation back.
        model.fail_command(1, 12);
        assert!(
            pd.qp_builder(&cq16, &cq16)
                .caps(caps(8, 8, 1))
                .build::<Rc>()
                .is_err()
        );
        let qp3 = pd
            .qp_builder(&cq16, &cq16)
            .caps(caps(16, 0, 1))
            .build::<Ud>()
            .unwrap();
        drop(qp3);
        // A QP receiving from an SRQ reserves the SRQ's depth on its receive CQ, once for the
        // SRQ and that CQ; where the CQ's room is held elsewhere the SRQ's receives are metered
        // there instead: the QP is made, a receive finds no room until the holder goes.
        let srq = pd
            .create_srq(SrqAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let holder = pd
            .qp_builder(&cq16, &cq16)
            .caps(caps(8, 8, 1))
            .build::<Rc>()
            .unwrap();
        let metered = pd
            .qp_builder(big, &cq16)
            .caps(caps(1, 0, 1))
            .srq(&srq)
            .build::<Rc>()
            .unwrap();
        let sge = rbuf.sge(0, 64).unwrap();
        let one = [RecvWr {
            wr_id: 1,
            sg_list: std::slice::from_ref(&sge),
        }];
        // SAFETY: the region outlives the SRQ's receives.
        assert_eq!(unsafe { srq.post_recv_raw(&one) }, Err(full(Queue::Cq, 0)));
        drop(holder);
        // SAFETY: as above.
        unsafe { srq.post_recv_raw(&one) }.unwrap();
        drop(metered);
        let with_srq = pd
            .qp_builder(big, &cq16)
            .caps(caps(1, 0, 1))
            .srq(&srq)
            .build::<Rc>()
            .unwrap();
        let second = pd
            .qp_builder(big, &cq16)
            .caps(caps(1, 0, 1))
            .srq(&srq)
            .build::<Rc>()
            .unwrap();
        let qp4 = pd
            .qp_builder(&cq16, &cq16)
            .caps(caps(8, 8, 1))
            .build::<Rc>()
            .unwrap();
        let mut qp4 = qp4.init(&init).unwrap();
        assert_eq!(
            recv_until_refused(&mut qp4, &rbuf, 1),
            (0, Some(full(Queue::Cq, 0)))
        );
        drop((with_srq, second));
        drop(qp4);
        let qp5 = pd
            .qp_builder(&cq16, &cq16)
            .caps(caps(8, 8, 1))
            .build::<Rc>()
            .unwrap();
        let mut qp5 = qp5.init(&init).unwrap();
        assert_eq!(recv_until_refused(&mut qp5, &rbuf, 8), (8, None));
        drop(qp5);
        drop(srq);
        drop((cq16, rbuf));
    });
}

#[test]
fn a_full_cq_is_counted_exactly() {
    lab(|_, ctx, pd, _, _| {
        let cq = ctx.create_cq(16).unwrap();
        let rbuf = pd.register(4096, RW).unwrap();
        // 4 sends + 32 receives on a CQ of 16: made; the two depths do not fit the CQ
        // together, so both queues are metered: the receives take the CQ's 16 entries as they
        // are posted, and the 17th finds none.
        let qp = pd
            .qp_builder(&cq, &cq)
            .caps(caps(4, 32, 1))
            .build::<Ud>()
            .unwrap();
        let mut qp = qp.ready(1, 0).unwrap();
        assert_eq!(
            recv_until_refused(&mut qp, &rbuf, 32),
            (16, Some(full(Queue::Cq, 0)))
        );
        drop(qp);
        let fits = pd
            .qp_builder(&cq, &cq)
            .caps(caps(8, 8, 1))
            .build::<Ud>()
            .unwrap();
        drop(fits);
        drop((cq, rbuf));
    });
}

#[test]
fn srq_traffic_never_wears_the_cq_down() {
    lab(|model, ctx, pd, _, gid| {
        let cq = ctx.create_cq(64).unwrap();
        let srq = pd
            .create_srq(SrqAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let build = || {
            pd.qp_builder(&cq, &cq)
                .caps(caps(8, 0, 1))
                .srq(&srq)
                .build::<Rc>()
                .unwrap()
        };
        // 2 × 8 sends + 16 SRQ receives (once for the pair) = 32 of the CQ's 64.
        let (mut a, mut b) = connect(build(), build(), gid);
        let rbuf = pd.register(4096, RW).unwrap();
        let src = with_mr(pd, b"round");
        let sges: Vec<_> = (0..16).map(|i| rbuf.sge(i * 64, 64).unwrap()).collect();
        let mut delivered = 0u64;
        // Far more rounds than the CQ has entries, bursts of 1..=8 messages each way.
        for round in 0..400u64 {
            let k = (round % 8 + 1) as usize;
            let wrs: Vec<_> = (0..2 * k)
                .map(|i| RecvWr {
                    wr_id: round << 8 | i as u64,
                    sg_list: &sges[i..=i],
                })
                .collect();
            // SAFETY: the regions outlive the completions polled right after.
            unsafe {
                srq.post_recv_raw(&wrs)
                    .unwrap_or_else(|e| panic!("round {round}: {e}"));
                for qp in [&mut a, &mut b] {
                    let mut sb = qp.send_batch();
                    for i in 0..k {
                        sb.send(round << 8 | i as u64, SIG, &[src.sge(0, 5).unwrap()])
                            .unwrap_or_else(|e| panic!("round {round}: {e}"));
                    }
                    sb.finish();
                }
            }
            let wcs = drain(&cq);
            assert_eq!(wcs.len(), 4 * k, "round {round}");
            assert!(
                wcs.iter().all(|w| w.status == WcStatus::Success),
                "round {round}: {wcs:?}"
            );
            delivered += wcs.iter().filter(|w| w.opcode == WcOpcode::Recv).count() as u64;
        }
        assert_eq!(delivered, (0..400).map(|r| 2 * (r % 8 + 1)).sum::<u64>());
        assert!(model.violations().is_empty());
        // A QP with an SRQ has no receive queue of its own: its receives are refused before
        // the device (QEMU would read past its allocation).
        // SAFETY: refused.
        let e = unsafe { a.post_recv_raw(1, &sges[..1]) };
        assert_eq!(e, Err(full(Queue::Recv, 0)));
        // The reservations are what they were: a third QP of the pair takes nothing more for
        // its receives, and exactly 64 - 32 - 8 = 24 entries are left, which a QP whose two
        // depths (16 + 32) do not fit them takes request by request.
        let third = build();
        let q = pd
            .qp_builder(&cq, &cq)
            .caps(caps(16, 32, 1))
            .build::<Ud>()
            .unwrap();
        let mut q = q.ready(1, 0).unwrap();
        assert_eq!(
            recv_until_refused(&mut q, &rbuf, 32),
            (24, Some(full(Queue::Cq, 0)))
        );
        drop(q);
        // The pair's last QP gives the SRQ's reservation back.
        drop((a, b, third));
        let again = pd
            .qp_builder(&cq, &cq)
            .caps(caps(32, 32, 1))
            .build::<Ud>()
            .unwrap();
        let mut again = again.ready(1, 0).unwrap();
        assert_eq!(recv_until_refused(&mut again, &rbuf, 32), (32, None));
        drop(again);
        drop(srq);
        drop(cq);
    });
}

#[test]
fn srq_receives_outstanding_never_exceed_what_the_cq_reserved() {
    lab(|model, ctx, pd, scq, gid| {
        let rcq = ctx.create_cq(32).unwrap();
        let srq = pd
            .create_srq(SrqAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let build = || {
            pd.qp_builder(scq, &rcq)
                .caps(caps(16, 0, 1))
                .srq(&srq)
                .build::<Rc>()
                .unwrap()
        };
        // Each QP reserves the SRQ's 16 on the receive CQ: 32 of 32.
        let (mut a, b) = connect(build(), build(), gid);
        let rbuf = pd.register(16 * 64, RW).unwrap();
        let sges: Vec<_> = (0..16).map(|i| rbuf.sge(i * 64, 64).unwrap()).collect();
        let mut accepted = 0;
        for round in 0..3u64 {
            let wrs: Vec<_> = (0..16)
                .map(|i| RecvWr {
                    wr_id: round * 16 + i as u64,
                    sg_list: &sges[i..=i],
                })
                .collect();
            // SAFETY: the region outlives the QPs; its bytes are not read.
            match unsafe { srq.post_recv_raw(&wrs) } {
                Ok(()) => accepted += 16,
                Err(e) => assert_eq!(e, full(Queue::Srq, 0)),
            }
        }
        // The peer sends 48 messages; the receive CQ is never polled.
        let src = with_mr(pd, b"m");
        for round in 0..3u64 {
            // SAFETY: the region outlives the completions polled right after.
            unsafe {
                let mut sb = a.send_batch();
                for i in 0..16 {
                    sb.send(round * 16 + i, SIG, &[src.sge(0, 1).unwrap()])
                        .unwrap();
                }
                sb.finish();
            }
            assert_eq!(drain(scq).len(), 16);
        }
        let v = model.violations();
        assert!(
            v.is_empty(),
            "{accepted} SRQ receives were outstanding for 32 reserved CQEs: {v:?}"
        );
        assert_eq!(
            accepted, 16,
            "the SRQ holds 16 outstanding receives, not more"
        );
        assert_eq!(drain(&rcq).len(), 16);
        drop((a, b));
        drop(srq);
        drop(rcq);
    });
}

// ---------------------------------------------------------------------------------------------
// The poll cursor

#[test]
fn the_poll_cursor_reads_each_field_when_asked() {
    lab(|_, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, None);
        assert!(cq.start_poll().unwrap().is_none(), "nothing to poll");
        let src = with_mr(pd, b"cursor");
        let rbuf = pd.register(4096, RW).unwrap();
        // SAFETY: the regions outlive the completions polled below.
        unsafe {
            b.post_recv_raw(1, &[rbuf.sge(0, 64).unwrap()]).unwrap();
            let mut sb = a.send_batch();
            sb.send_imm(2, SIG, 0xFEED, &[src.sge(0, 6).unwrap()])
                .unwrap();
            sb.rdma_write(3, SIG, (0, 0xBAD), &[src.sge(0, 1).unwrap()])
                .unwrap();
            sb.finish();
        }
        let (qa, qb) = (a.qp_num(), b.qp_num());
        let mut c = cq.start_poll().unwrap().expect("three completions");
        // Fields in any order, as often as asked.
        assert_eq!(c.imm(), 0xFEED);
        assert_eq!(c.flags(), WcFlags::WITH_IMM);
        assert_eq!(c.byte_len(), 6);
        assert_eq!(c.wr_id(), 1);
        assert_eq!(
            (c.opcode(), c.status()),
            (WcOpcode::Recv, WcStatus::Success)
        );
        assert_eq!((c.qp_num(), c.src_qp(), c.vendor_err()), (qb, qa, 0));
        assert_eq!((c.wr_id(), c.imm()), (1, 0xFEED));
        assert!(c.next_poll().unwrap());
        assert_eq!((c.wr_id(), c.opcode(), c.qp_num()), (2, WcOpcode::Send, qa));
        assert_eq!((c.imm(), c.flags()), (0, WcFlags::empty()));
        assert!(c.next_poll().unwrap());
        assert_eq!(c.status(), WcStatus::RemAccessErr);
        assert_eq!(c.vendor_err(), 0x201, "the device's detail");
        assert_eq!((c.wr_id(), c.opcode()), (3, WcOpcode::RdmaWrite));
        assert!(!c.next_poll().unwrap(), "no more");
        drop(c);
        assert_eq!(drain(cq), [], "everything read was consumed");
        // Fields never read: the completions are consumed all the same, and the credit
        // comes back.
        // SAFETY: as above.
        unsafe {
            let mut sb = a.send_batch();
            for i in 0..16 {
                sb.send(10 + i, SIG, &[src.sge(0, 1).unwrap()]).unwrap();
            }
            sb.finish();
        }
        let mut c = cq.start_poll().unwrap().unwrap();
        let mut n = 1;
        while c.next_poll().unwrap() {
            n += 1;
        }
        drop(c);
        assert_eq!(n, 16);
        // SAFETY: as above.
        unsafe {
            let mut sb = a.send_batch();
            for i in 0..16 {
                sb.send(30 + i, SIG, &[src.sge(0, 1).unwrap()]).unwrap();
            }
            sb.finish();
        }
        // A cursor dropped part-way leaves the rest for the next poll.
        let c = cq.start_poll().unwrap().unwrap();
        assert_eq!(c.wr_id(), 30);
        drop(c);
        let rest = drain(cq);
        assert_eq!(
            rest.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            (31..46).collect::<Vec<_>>()
        );
        // A flush has no device entry behind it: its device fields read as 0.
        // SAFETY: as above.
        unsafe { b.post_recv_raw(50, &[rbuf.sge(0, 64).unwrap()]).unwrap() };
        let b = b.to_error().unwrap();
        let c = cq.start_poll().unwrap().unwrap();
        assert_eq!(
            (c.wr_id(), c.status(), c.opcode()),
            (50, WcStatus::WrFlushErr, WcOpcode::Recv)
        );
        assert_eq!(
            (
                c.qp_num(),
                c.byte_len(),
                c.vendor_err(),
                c.imm(),
                c.src_qp()
            ),
            (qb, 0, 0, 0, 0)
        );
        assert_eq!(c.flags(), WcFlags::empty());
        drop(c);
        assert_eq!(drain(cq), []);
        drop((a, b));
    });
}
