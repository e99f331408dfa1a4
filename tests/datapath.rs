//! The data path on the device model: every operation and QP type moving real bytes in
//! loopback (RC pair, UD, SRQ shared by two RC QPs), with wr_ids, byte counts and immediates
//! checked, batching, and every error posting and polling can report (typed, nothing lost).
//! Also the same traffic under QEMU's own semantics (every opcode runs as SEND).
//!
//! Raw posts go through `send_batch()` / `recv_batch()` (one doorbell per `finish`), safe
//! posts move `Buf`s of a `BufferPool` into the QP and back with their completion.

mod common;

use bareverbs::Error;
use bareverbs::device::pvrdma::Pvrdma;
use bareverbs::error::{Feature, Op, Param, Queue, Unsupported};
use bareverbs::verbs::*;
use bareverbs_model::{Model, ModelConfig, Semantics};
use common::*;

type P = Pvrdma<Model>;
type RcQp<'a> = QueuePair<'a, P, Rc, Rts>;
type UdQp<'a> = QueuePair<'a, P, Ud, Rts>;

#[test]
fn rc_send_recv_moves_bytes_and_hands_buffers_back() {
    lab(|model, _ctx, pd, cq, gid| {
        let pool = pd.buffer_pool(8, 256).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
        b.post_recv(7, pool.alloc().unwrap()).unwrap();
        let msg = b"hello, remote memory";
        a.post_send(42, buf_with(&pool, msg)).unwrap();
        assert_eq!(pool.free_count(), 6, "both buffers are in the QPs");
        // One CQ for both: the receive completion is at its head, so b polls first (a safe
        // poll leaves other QPs' completions where they are).
        assert!(
            a.poll_one().unwrap().is_none(),
            "a does not take b's completion"
        );
        let r = b.poll_one().unwrap().expect("recv completion");
        assert_eq!(
            (r.wc.wr_id, r.wc.opcode, r.wc.byte_len, r.wc.status),
            (7, WcOpcode::Recv, msg.len() as u32, WcStatus::Success)
        );
        assert_eq!((r.wc.src_qp, r.wc.qp_num), (a.qp_num(), b.qp_num()));
        let buf = r.buf.expect("buffer back");
        assert_eq!(
            buf.as_slice(),
            msg,
            "byte for byte, the length what arrived"
        );
        drop(buf);
        let s = a.poll_one().unwrap().expect("send completion");
        assert_eq!(
            (s.wc.wr_id, s.wc.status, s.wc.opcode),
            (42, WcStatus::Success, WcOpcode::Send)
        );
        assert_eq!(s.wc.qp_num, a.qp_num());
        let sbuf = s.buf.expect("buffer back");
        assert_eq!(&sbuf.as_slice()[..msg.len()], msg);
        drop(sbuf);
        assert_eq!(pool.free_count(), 8);
        assert!(a.poll_one().unwrap().is_none() && b.poll_one().unwrap().is_none());

        // The raw path: a receive at an offset of a region lands there and nowhere else.
        let target = pd.register(4096, RW).unwrap();
        let src = with_mr(pd, msg);
        // SAFETY: both regions outlive the completions polled right after; the CPU reads
        // them only after those.
        unsafe {
            b.post_recv_raw(8, &[target.sge(100, 200).unwrap()])
                .unwrap();
            let mut batch = a.send_batch();
            batch
                .send(
                    43,
                    SendFlags::SIGNALED,
                    &[src.sge(0, msg.len() as u32).unwrap()],
                )
                .unwrap();
            batch.finish();
        }
        let r = b.poll_one().unwrap().expect("raw recv completion");
        assert_eq!((r.wc.wr_id, r.wc.byte_len), (8, msg.len() as u32));
        assert!(r.buf.is_none(), "a raw post has no buffer to hand back");
        assert_eq!(
            &target.as_slice()[100..100 + msg.len()],
            msg,
            "byte for byte at the offset"
        );
        assert!(target.as_slice()[..100].iter().all(|&x| x == 0));
        assert!(target.as_slice()[100 + msg.len()..].iter().all(|&x| x == 0));
        let s = a.poll_one().unwrap().expect("raw send completion");
        assert_eq!((s.wc.wr_id, s.wc.status), (43, WcStatus::Success));
        assert!(s.buf.is_none());
        assert_eq!(model.violations(), Vec::<String>::new());
    });
}

#[test]
fn send_with_imm_delivers_the_immediate() {
    lab(|_, _, pd, cq, gid| {
        let pool = pd.buffer_pool(4, 64).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
        b.post_recv(1, pool.alloc().unwrap()).unwrap();
        let src = with_mr(pd, b"imm");
        // SAFETY: the region outlives the completion polled below.
        unsafe {
            let mut batch = a.send_batch();
            batch
                .send_imm(
                    2,
                    SendFlags::SIGNALED,
                    0xC0FF_EE00,
                    &[src.sge(0, 3).unwrap()],
                )
                .unwrap();
            batch.finish();
        }
        let r = b.poll_one().unwrap().unwrap();
        assert_eq!(
            (r.wc.wr_id, r.wc.opcode, r.wc.imm, r.wc.byte_len),
            (1, WcOpcode::Recv, 0xC0FF_EE00, 3)
        );
        assert!(r.wc.flags.contains(WcFlags::WITH_IMM));
        assert_eq!(r.buf.unwrap().as_slice(), b"imm");
        let s = a.poll_one().unwrap().unwrap();
        assert_eq!((s.wc.wr_id, s.wc.opcode), (2, WcOpcode::Send));
    });
}

#[test]
fn rdma_write_read_and_write_with_imm() {
    lab(|_, _, pd, cq, gid| {
        let pool = pd.buffer_pool(4, 64).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
        let target = pd.register(8192, RW).unwrap();
        let (raddr, rkey) = (target.addr(), target.rkey());
        // RDMA WRITE across a page boundary of the target.
        let src = with_mr(pd, &[0x5A; 300]);
        // SAFETY: every region named outlives the completions polled right after each post,
        // and the CPU reads them only after those.
        unsafe {
            let mut batch = a.send_batch();
            batch
                .rdma_write(
                    1,
                    SendFlags::SIGNALED,
                    (raddr + 4000, rkey),
                    &[src.sge(0, 300).unwrap()],
                )
                .unwrap();
            batch.finish();
        }
        let c = a.poll_one().unwrap().unwrap();
        assert_eq!(
            (c.wc.wr_id, c.wc.status, c.wc.opcode),
            (1, WcStatus::Success, WcOpcode::RdmaWrite)
        );
        assert!(target.as_slice()[4000..4300].iter().all(|&x| x == 0x5A));
        assert!(target.as_slice()[3999] == 0 && target.as_slice()[4300] == 0);
        // RDMA READ back into a fresh region, at an offset.
        let back = pd.register(4096, RW).unwrap();
        // SAFETY: as above.
        unsafe {
            let mut batch = a.send_batch();
            batch
                .rdma_read(
                    2,
                    SendFlags::SIGNALED,
                    (raddr + 4000, rkey),
                    &[back.sge(10, 300).unwrap()],
                )
                .unwrap();
            batch.finish();
        }
        let c = a.poll_one().unwrap().unwrap();
        assert_eq!(
            (c.wc.wr_id, c.wc.opcode, c.wc.byte_len),
            (2, WcOpcode::RdmaRead, 300)
        );
        assert!(back.as_slice()[10..310].iter().all(|&x| x == 0x5A));
        assert!(back.as_slice()[..10].iter().all(|&x| x == 0));
        // RDMA WRITE with immediate consumes a receive at the peer.
        b.post_recv(9, pool.alloc().unwrap()).unwrap();
        let xyz = with_mr(pd, b"xyz");
        // SAFETY: as above.
        unsafe {
            let mut batch = a.send_batch();
            batch
                .rdma_write_imm(
                    3,
                    SendFlags::SIGNALED,
                    (raddr, rkey),
                    77,
                    &[xyz.sge(0, 3).unwrap()],
                )
                .unwrap();
            batch.finish();
        }
        let r = b.poll_one().unwrap().unwrap();
        assert_eq!(
            (r.wc.wr_id, r.wc.opcode, r.wc.imm, r.wc.byte_len),
            (9, WcOpcode::RecvRdmaWithImm, 77, 3)
        );
        assert!(r.wc.flags.contains(WcFlags::WITH_IMM));
        assert!(r.buf.is_some(), "the consumed receive's buffer comes back");
        assert_eq!(&target.as_slice()[..3], b"xyz");
        let s = a.poll_one().unwrap().unwrap();
        assert_eq!(
            (s.wc.wr_id, s.wc.opcode, s.wc.status),
            (3, WcOpcode::RdmaWrite, WcStatus::Success)
        );
    });
}

#[test]
fn ud_sends_carry_a_grh_and_check_the_qkey() {
    lab(|_, _, pd, cq, gid| {
        let pool = pd.buffer_pool(8, 4096).unwrap();
        let ud = || {
            pd.qp_builder(cq, cq)
                .caps(caps(16, 16, 2))
                .pool(&pool)
                .build::<Ud>()
                .unwrap()
        };
        let mut a: UdQp<'_> = ud().ready(0x1111, 0).unwrap();
        let mut b: UdQp<'_> = ud().ready(0x2222, 0).unwrap();
        let ah = pd.create_ah(&AddressVector::new(gid, 0)).unwrap();
        b.post_recv(5, pool.alloc().unwrap()).unwrap();
        let bq = b.qp_num();
        // Wrong Q_Key: dropped on the wire, the sender still completes.
        a.post_send_to(1, buf_with(&pool, b"lost"), (&ah, bq, 0x9999))
            .unwrap();
        let s = a.poll_one().unwrap().unwrap();
        assert_eq!((s.wc.wr_id, s.wc.status), (1, WcStatus::Success));
        drop(s);
        assert!(b.poll_one().unwrap().is_none());
        // Right Q_Key.
        a.post_send_to(2, buf_with(&pool, b"datagram"), (&ah, bq, 0x2222))
            .unwrap();
        let r = b.poll_one().unwrap().unwrap();
        assert_eq!(
            (r.wc.wr_id, r.wc.byte_len, r.wc.src_qp),
            (5, 40 + 8, a.qp_num())
        );
        assert!(r.wc.flags.contains(WcFlags::GRH));
        let buf = r.buf.unwrap();
        assert_eq!(buf.as_slice()[0] >> 4, 6, "an IPv6 GRH first");
        assert_eq!(&buf.as_slice()[40..48], b"datagram");
        drop(buf);
        // A remote Q_Key with bit 31 set means the sender's own Q_Key (0x1111 ≠ b's: dropped).
        b.post_recv(6, pool.alloc().unwrap()).unwrap();
        a.post_send_to(3, buf_with(&pool, b"own"), (&ah, bq, 0x8000_0000))
            .unwrap();
        assert!(
            b.poll_one().unwrap().is_none(),
            "sent with the QP's own Q_Key"
        );
        // RDMA on UD and a UD send without a destination do not compile any more: the batch
        // of a datagram QP has only `send_to` / `send_to_imm`, and the safe path only
        // `post_send_to`.
        while a.poll_one().unwrap().is_some() {}
        drop((a, b));
        assert_eq!(pool.free_count(), 8);
    });
}

#[test]
fn an_srq_feeds_two_rc_qps() {
    lab(|_, _, pd, cq, gid| {
        let srq = pd
            .create_srq(SrqAttr {
                max_wr: 64,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let pool = pd.buffer_pool(4, 64).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, Some(&srq), Some(&pool));
        assert_eq!(a.caps().max_recv_wr, 0, "receives come from the SRQ");
        let bufs: Vec<_> = (0..4).map(|_| pd.register(4096, RW).unwrap()).collect();
        let sges: Vec<_> = bufs.iter().map(|m| m.sge(0, 64).unwrap()).collect();
        let wrs: Vec<_> = (0..4)
            .map(|i| RecvWr {
                wr_id: 100 + i as u64,
                sg_list: &sges[i..=i],
            })
            .collect();
        // SAFETY: the buffers live until the end of the test, after their completions, and are
        // only read after those.
        unsafe { srq.post_recv_raw(&wrs).unwrap() };
        for (qp, text) in [(&mut a, &b"from a"[..]), (&mut b, &b"from b"[..])] {
            qp.post_send(1, buf_with(&pool, text)).unwrap();
        }
        assert_eq!(pool.free_count(), 2);
        let wcs = drain(cq);
        let recvs: Vec<_> = wcs.iter().filter(|w| w.opcode == WcOpcode::Recv).collect();
        assert_eq!(recvs.len(), 2);
        assert_eq!(
            (recvs[0].wr_id, recvs[0].qp_num, recvs[0].src_qp),
            (100, b.qp_num(), a.qp_num())
        );
        assert_eq!(
            (recvs[1].wr_id, recvs[1].qp_num, recvs[1].src_qp),
            (101, a.qp_num(), b.qp_num())
        );
        assert_eq!(&bufs[0].as_slice()[..6], b"from a");
        assert_eq!(&bufs[1].as_slice()[..6], b"from b");
        let sends: Vec<_> = wcs
            .iter()
            .filter(|w| w.opcode == WcOpcode::Send)
            .map(|w| (w.wr_id, w.status))
            .collect();
        assert_eq!(sends, [(1, WcStatus::Success), (1, WcStatus::Success)]);
        // The send completions were taken by the raw poll: their buffers went back to the
        // pool all the same.
        assert_eq!(pool.free_count(), 4);
        drop((a, b));
        srq.destroy().unwrap();
    });
}

#[test]
fn a_batch_is_one_doorbell_and_a_full_queue_posts_nothing() {
    lab(|model, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, None);
        let rbuf = pd.register(16 * 64, RW).unwrap();
        let rsges: Vec<_> = (0..16).map(|i| rbuf.sge(i * 64, 64).unwrap()).collect();
        let sbuf = with_mr(pd, &(0..=255u8).collect::<Vec<_>>());
        let ssges: Vec<_> = (0..17).map(|i| sbuf.sge(i, 16).unwrap()).collect();
        let (doorbells, _, _) = model.counters();
        // SAFETY: the buffers outlive the completions polled below and are not written.
        unsafe {
            let mut rb = b.recv_batch();
            for (i, s) in rsges.iter().enumerate() {
                rb.recv(1000 + i as u64, core::slice::from_ref(s)).unwrap();
            }
            rb.finish();
            assert_eq!(
                model.counters().0,
                doorbells + 1,
                "16 receives, one doorbell"
            );
            let mut sb = a.send_batch();
            for (i, s) in ssges[..16].iter().enumerate() {
                sb.send(i as u64, SendFlags::empty(), core::slice::from_ref(s))
                    .unwrap();
            }
            assert_eq!(
                sb.send(16, SendFlags::empty(), &ssges[16..]),
                Err(Error::QueueFull {
                    queue: Queue::Send,
                    free: 0
                }),
                "the 17th does not fit"
            );
            drop(sb);
            assert_eq!(
                model.counters().0,
                doorbells + 1,
                "the abandoned batch rang nothing"
            );
            let mut sb = a.send_batch();
            for (i, s) in ssges[..16].iter().enumerate() {
                sb.send(i as u64, SendFlags::empty(), core::slice::from_ref(s))
                    .unwrap();
            }
            sb.finish();
        }
        assert_eq!(model.counters().0, doorbells + 2, "16 WRs, one doorbell");
        let wcs = drain(cq);
        let sends: Vec<_> = wcs
            .iter()
            .filter(|w| w.opcode == WcOpcode::Send)
            .map(|w| (w.wr_id, w.status))
            .collect();
        let recvs: Vec<_> = wcs
            .iter()
            .filter(|w| w.opcode == WcOpcode::Recv)
            .map(|w| (w.wr_id, w.byte_len))
            .collect();
        assert_eq!(
            sends,
            (0..16).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>(),
            "every send completes on PVRDMA, even unsignaled"
        );
        assert_eq!(recvs, (0..16).map(|i| (1000 + i, 16)).collect::<Vec<_>>());
        for i in 0..16 {
            let want: Vec<u8> = (i as u8..i as u8 + 16).collect();
            assert_eq!(&rbuf.as_slice()[i * 64..i * 64 + 16], &want[..]);
            assert!(
                rbuf.as_slice()[i * 64 + 16..(i + 1) * 64]
                    .iter()
                    .all(|&x| x == 0)
            );
        }
        // The ring is free again: the same 16 post once more.
        // SAFETY: as above; nothing is received, the completions are polled.
        unsafe {
            let mut sb = a.send_batch();
            for (i, s) in ssges[..16].iter().enumerate() {
                sb.send(i as u64, SendFlags::empty(), core::slice::from_ref(s))
                    .unwrap();
            }
            sb.finish();
        }
        // No receive posted: the first send fails (the model does not retry: RNR retries
        // exhausted at once) and moves the QP to ERROR, which flushes the other 15, as rxe does.
        let wcs = drain(cq);
        let statuses: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
        let mut want = vec![(0, WcStatus::RnrRetryExcErr)];
        want.extend((1..16).map(|i| (i, WcStatus::WrFlushErr)));
        assert_eq!(statuses, want, "no receives posted: RNR, then flushed");
    });
}

#[test]
fn posting_errors_are_typed_and_lose_nothing() {
    lab(|model, _, pd, cq, gid| {
        let pool = pd.buffer_pool(32, 64).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
        let buf = pd.register(4096, RW).unwrap();
        let sges: Vec<_> = (0..5).map(|i| buf.sge(i * 8, 8).unwrap()).collect();
        let doorbells = model.counters().0;
        // SAFETY: nothing in this block is posted (every batch is dropped unfinished).
        unsafe {
            let mut sb = a.send_batch();
            assert_eq!(
                sb.send(1, SendFlags::SIGNALED, &sges[..5]),
                Err(invalid(Param::NumSge, 5, 4))
            );
            assert_eq!(
                sb.send_inline(1, SendFlags::SIGNALED, b"inline"),
                Err(Error::Unsupported(Unsupported::Feature(
                    Feature::InlineData
                )))
            );
            let remote = (buf.addr(), buf.rkey());
            assert_eq!(
                sb.atomic_fetch_add(1, SendFlags::SIGNALED, remote, 1, &sges[0]),
                Err(Error::Unsupported(Unsupported::Feature(Feature::Atomics)))
            );
            assert_eq!(
                sb.atomic_cmp_swp(1, SendFlags::SIGNALED, remote, (0, 1), &sges[0]),
                Err(Error::Unsupported(Unsupported::Feature(Feature::Atomics)))
            );
            drop(sb);
            assert_eq!(
                b.post_recv_raw(1, &sges[..5]),
                Err(invalid(Param::NumSge, 5, 4)),
                "case 8: max_recv_sge + 1 SGEs"
            );
            // Case 8: the receive queue takes its queried max_recv_wr and not one more.
            let max = b.caps().max_recv_wr;
            assert_eq!(max, 16);
            let mut rb = b.recv_batch();
            for i in 0..max {
                rb.recv(u64::from(i), &sges[..1]).unwrap();
            }
            assert_eq!(
                rb.recv(u64::from(max), &sges[..1]),
                Err(Error::QueueFull {
                    queue: Queue::Recv,
                    free: 0
                })
            );
            drop(rb);
        }
        assert_eq!(
            model.counters().0,
            doorbells,
            "no refused post reached the device"
        );
        // A bad lkey and a bad rkey complete with typed error statuses.
        let bad_lkey = Sge {
            lkey: 0xDEAD,
            ..buf.sge(0, 8).unwrap()
        };
        // SAFETY: the buffer outlives the completions polled right after.
        unsafe {
            let mut sb = a.send_batch();
            sb.send(3, SendFlags::SIGNALED, &[bad_lkey]).unwrap();
            sb.rdma_write(2, SendFlags::SIGNALED, (buf.addr(), 0xBAD), &sges[..1])
                .unwrap();
            sb.finish();
        }
        // The failed send moves A to ERROR, as on rxe and hardware: the write behind it is
        // flushed.
        let wcs = drain(cq);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(3, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
        );
        assert_eq!(a.query().unwrap().state, QpState::Err);
        // A bad rkey, on a fresh pair: both ends go to ERROR.
        let (mut a, b) = rc_pair(pd, cq, gid, None, Some(&pool));
        // SAFETY: the buffer outlives the completion polled right after.
        unsafe {
            let mut sb = a.send_batch();
            sb.rdma_write(2, SendFlags::SIGNALED, (buf.addr(), 0xBAD), &sges[..1])
                .unwrap();
            sb.finish();
        }
        let wcs = drain(cq);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(2, WcStatus::RemAccessErr)]
        );
        assert_eq!(a.query().unwrap().state, QpState::Err);
        assert_eq!(b.query().unwrap().state, QpState::Err);
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
        // A receive too small for the message (the pool's buffers hold 64 bytes).
        b.post_recv(4, pool.alloc().unwrap()).unwrap();
        let long = with_mr(pd, &[7; 100]);
        // SAFETY: the region outlives the completion polled below.
        unsafe {
            let mut sb = a.send_batch();
            sb.send(5, SendFlags::SIGNALED, &[long.sge(0, 100).unwrap()])
                .unwrap();
            sb.finish();
        }
        let r = b.poll_one().unwrap().unwrap();
        assert_eq!((r.wc.wr_id, r.wc.status), (4, WcStatus::LocLenErr));
        assert!(
            r.buf.is_some(),
            "the buffer comes back with an error completion too"
        );
        drop(r);
        let s = a.poll_one().unwrap().unwrap();
        assert_eq!((s.wc.wr_id, s.wc.status), (5, WcStatus::RemInvReqErr));
        assert_eq!(pool.free_count(), 32);
        // A safe post into a full queue hands the buffer back, bytes and all.
        for i in 0..16 {
            b.post_recv(i, pool.alloc().unwrap()).unwrap();
        }
        let (back, e) = b.post_recv(99, buf_with(&pool, b"mine")).err().unwrap();
        assert_eq!(
            e,
            Error::QueueFull {
                queue: Queue::Recv,
                free: 0
            }
        );
        assert_eq!(back.as_slice(), b"mine");
        assert_eq!(pool.free_count(), 32 - 17);
        drop(back);
        drop((a, b));
        assert_eq!(pool.free_count(), 32, "the posted buffers came back");
    });
}

#[test]
fn a_cq_that_would_overflow_is_refused_at_post() {
    lab(|model, ctx, pd, cq, gid| {
        // The send CQ holds 4 completions: a QP that can have 8 sends outstanding is made
        // (the verbs never refuse a QP for its CQ's size), and its sends take the CQ's room
        // as they are posted.
        let small = ctx.create_cq(4).unwrap();
        let qp = pd.qp_builder(&small, cq).caps(caps(8, 8, 1)).build::<Ud>();
        let mut qp = qp.unwrap().ready(1, 0).unwrap();
        // So is a second QP completing there.
        let other = pd.qp_builder(&small, cq).caps(caps(1, 1, 1)).build::<Ud>();
        drop(other.unwrap());
        let ah = pd.create_ah(&AddressVector::new(gid, 0)).unwrap();
        let buf = pd.register(4096, RW).unwrap();
        let sge = [buf.sge(0, 8).unwrap()];
        for round in 0..3u64 {
            // SAFETY: the buffer outlives the completions polled below.
            unsafe {
                let mut sb = qp.send_batch();
                for i in 0..4 {
                    sb.send_to(round * 4 + i, SendFlags::empty(), (&ah, 0xFFFF, 1), &sge)
                        .unwrap();
                }
                sb.finish();
            }
            let mut wc = [WorkCompletion::default(); 8];
            assert_eq!(
                small.poll(&mut wc).unwrap(),
                4,
                "every send completes on PVRDMA, even unsignaled"
            );
            assert_eq!(
                wc[..4].iter().map(|w| w.wr_id).collect::<Vec<_>>(),
                (round * 4..round * 4 + 4).collect::<Vec<_>>()
            );
        }
        // A batch of 5 would overflow it: refused whole, nothing posted, nothing completes.
        let commands = model.commands();
        // SAFETY: as above.
        let e = unsafe {
            let mut sb = qp.send_batch();
            (0..5u64)
                .map(|i| sb.send_to(100 + i, SendFlags::empty(), (&ah, 0xFFFF, 1), &sge))
                .find_map(|r| r.err())
        };
        assert_eq!(
            e,
            Some(Error::QueueFull {
                queue: Queue::Cq,
                free: 0
            })
        );
        assert_eq!(model.commands(), commands);
        assert_eq!(small.poll(&mut [WorkCompletion::default(); 8]).unwrap(), 0);
        assert!(
            model.violations().is_empty(),
            "the device never had to drop a CQE"
        );
        drop(qp);
        drop(buf);
        drop(small);
    });
}

#[test]
fn garbage_in_the_cq_is_an_error_not_an_index() {
    lab(|model, _, pd, cq, gid| {
        let (mut a, _b) = rc_pair(pd, cq, gid, None, None);
        let h = cq.raw().handle();
        let qa = a.raw().handle();
        let buf = pd.register(4096, RW).unwrap();
        let sge = [buf.sge(0, 8).unwrap()];
        // Posts a send on `a` that the device never runs (its completion is injected).
        let post_unrun = |a: &mut RcQp<'_>, wr_id: u64| {
            model.set_free_doorbells(true);
            // SAFETY: the region outlives the QP; the device never reads the request.
            unsafe {
                let mut sb = a.send_batch();
                sb.send(wr_id, SendFlags::SIGNALED, &sge).unwrap();
                sb.finish();
            }
            model.set_free_doorbells(false);
            model.consume_rings(qa);
        };
        let mut wc = [WorkCompletion::default(); 4];
        let mut injected = 0;
        // An opcode outside the ABI: reported, and consumed so that the CQ goes on.
        let mut bad = [0u8; 64];
        bad[0x10] = 77;
        model.inject_raw_cqe(h, bad);
        injected += 1;
        assert!(matches!(
            cq.poll(&mut wc),
            Err(Error::Protocol { op: Op::PollCq, .. })
        ));
        assert_eq!(cq.poll(&mut wc), Ok(0));
        // A status outside the ABI.
        let mut bad = [0u8; 64];
        bad[0x14] = 200;
        model.inject_raw_cqe(h, bad);
        injected += 1;
        assert!(matches!(
            cq.poll(&mut wc),
            Err(Error::Protocol { op: Op::PollCq, .. })
        ));
        assert_eq!(cq.poll(&mut wc), Ok(0));
        // A good completion (of a send the device never ran) is matched to its request.
        post_unrun(&mut a, 5);
        model.inject_cqe(h, qa, 5);
        injected += 1;
        assert_eq!(cq.poll(&mut wc), Ok(1));
        assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::Success));
        assert_eq!(cq.poll(&mut wc), Ok(0));
        // A QP field beyond the 24 bits of a handle.
        let mut bad = [0u8; 64];
        bad[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        model.inject_raw_cqe(h, bad);
        injected += 1;
        assert!(matches!(cq.poll(&mut wc), Err(Error::Protocol { .. })));
        // A completion for `a` naming a request that is not its next: an error, not a match
        // (the request stays outstanding and completes with its own CQE).
        post_unrun(&mut a, 6);
        model.inject_cqe(h, qa, 9999);
        injected += 1;
        assert!(matches!(
            a.poll_one(),
            Err(Error::Protocol { op: Op::PollCq, .. })
        ));
        model.inject_cqe(h, qa, 6);
        injected += 1;
        let c = a.poll_one().unwrap().unwrap();
        assert_eq!((c.wc.wr_id, c.wc.status), (6, WcStatus::Success));
        // One for `a` when nothing is outstanding (a late one): dropped.
        model.inject_cqe(h, qa, 6);
        injected += 1;
        assert!(a.poll_one().unwrap().is_none());
        assert_eq!(cq.poll(&mut wc), Ok(0));
        // One for a QP that does not exist: dropped.
        model.inject_cqe(h, 0xABCD, 1);
        injected += 1;
        assert_eq!(cq.poll(&mut wc), Ok(0));
        // A producer index outside the ring.
        model.set_cq_prod(h, 0xFFFF_0000);
        assert!(matches!(
            cq.poll(&mut wc),
            Err(Error::Protocol { op: Op::PollCq, .. })
        ));
        model.set_cq_prod(h, injected); // back where it was
        assert_eq!(cq.poll(&mut wc), Ok(0));
        // The QP still works.
        post_unrun(&mut a, 7);
        model.inject_cqe(h, qa, 7);
        assert_eq!(a.poll_one().unwrap().unwrap().wc.wr_id, 7);
    });
}

#[test]
fn a_refused_cqe_behind_good_ones_is_reported_by_the_next_poll() {
    lab(|model, _, pd, cq, gid| {
        let (mut a, _b) = rc_pair(pd, cq, gid, None, None);
        let (h, qa) = (cq.raw().handle(), a.raw().handle());
        let buf = pd.register(4096, RW).unwrap();
        // A send the device never runs; its completion is injected, then a CQE with a status
        // outside the ABI.
        model.set_free_doorbells(true);
        // SAFETY: the region outlives the QP; the device never reads the request.
        unsafe {
            let mut sb = a.send_batch();
            sb.send(5, SendFlags::SIGNALED, &[buf.sge(0, 8).unwrap()])
                .unwrap();
            sb.finish();
        }
        model.set_free_doorbells(false);
        model.consume_rings(qa);
        model.inject_cqe(h, qa, 5);
        let mut bad = [0u8; 64];
        bad[0x14] = 200;
        model.inject_raw_cqe(h, bad);
        let mut wc = [WorkCompletion::default(); 4];
        // The good one first, then the error (`CompletionQueue::poll`'s documented contract:
        // "reported by the poll after the one that returned the good completions before it").
        assert_eq!(cq.poll(&mut wc), Ok(1));
        assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::Success));
        let next = cq.poll(&mut wc);
        assert!(
            matches!(next, Err(Error::Protocol { op: Op::PollCq, .. })),
            "the refusal is reported by the next poll, got {next:?}"
        );
        assert_eq!(cq.poll(&mut wc), Ok(0));
    });
}

#[test]
fn arming_raises_one_interrupt_per_arm() {
    lab(|model, _, pd, cq, gid| {
        let (mut a, _b) = rc_pair(pd, cq, gid, None, None);
        let src = with_mr(pd, b"x");
        cq.req_notify(false).expect("arm");
        for i in 0..2 {
            // SAFETY: the region outlives the completions polled below.
            unsafe {
                let mut sb = a.send_batch();
                // Fails remotely (no such rkey), still completes.
                sb.rdma_write(i, SendFlags::SIGNALED, (0, 0), &[src.sge(0, 1).unwrap()])
                    .unwrap();
                sb.finish();
            }
        }
        assert_eq!(model.counters().2, 1, "armed once, one interrupt");
        // The first fails and moves the QP to ERROR; the second is flushed.
        let mut got = Vec::new();
        while let Some(c) = a.poll_one().unwrap() {
            got.push(c.wc.status);
        }
        assert_eq!(got, [WcStatus::RemAccessErr, WcStatus::WrFlushErr]);
        cq.req_notify(false).expect("arm");
        // SAFETY: as above.
        unsafe {
            let mut sb = a.send_batch();
            sb.rdma_write(9, SendFlags::SIGNALED, (0, 0), &[src.sge(0, 1).unwrap()])
                .unwrap();
            sb.finish();
        }
        assert_eq!(model.counters().2, 2, "armed again, one more");
        assert!(a.poll_one().unwrap().is_some());
    });
}

#[test]
fn qemu_semantics_run_every_opcode_as_send() {
    let cfg = ModelConfig {
        semantics: Semantics::Qemu,
        ..Default::default()
    };
    lab_with(cfg, CONFIG, |model, _, pd, cq, gid| {
        let pool = pd.buffer_pool(4, 64).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
        let target = pd.register(4096, RW).unwrap();
        assert_eq!(target.rkey(), 0xFFFF_FFFF, "QEMU's rkey");
        b.post_recv(1, pool.alloc().unwrap()).unwrap();
        let src = with_mr(pd, b"as a send");
        // SAFETY: the regions outlive the completions polled below.
        unsafe {
            let mut sb = a.send_batch();
            sb.rdma_write_imm(
                2,
                SendFlags::SIGNALED,
                (target.addr(), target.rkey()),
                5,
                &[src.sge(0, 9).unwrap()],
            )
            .unwrap();
            sb.finish();
        }
        let r = b.poll_one().unwrap().unwrap();
        assert_eq!(
            (r.wc.wr_id, r.wc.opcode, r.wc.imm, r.wc.byte_len),
            (1, WcOpcode::Recv, 0, 9),
            "no immediate on QEMU"
        );
        assert!(!r.wc.flags.contains(WcFlags::WITH_IMM));
        assert_eq!(r.buf.unwrap().as_slice(), b"as a send");
        let s = a.poll_one().unwrap().unwrap();
        assert_eq!(
            (s.wc.wr_id, s.wc.opcode, s.wc.status),
            (2, WcOpcode::Send, WcStatus::Success)
        );
        assert!(
            target.as_slice()[..9].iter().all(|&x| x == 0),
            "nothing was RDMA-written"
        );
        // The safe path's SEND is what QEMU does run.
        b.post_recv(3, pool.alloc().unwrap()).unwrap();
        a.post_send(4, buf_with(&pool, b"plain")).unwrap();
        let r = b.poll_one().unwrap().unwrap();
        assert_eq!(r.buf.unwrap().as_slice(), b"plain");
        assert_eq!(a.poll_one().unwrap().unwrap().wc.wr_id, 4);
        assert!(model.violations().is_empty());
    });
}

#[test]
fn dropping_a_qp_with_posted_buffers_returns_every_page() {
    lab(|model, _, pd, cq, gid| {
        let before = model.outstanding_pages();
        {
            let pool = pd.buffer_pool(8, 4096).unwrap();
            let mrs = model.objects().mrs;
            {
                let (_a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
                for i in 0..8 {
                    b.post_recv(i, pool.alloc().unwrap()).unwrap();
                }
                assert_eq!(pool.free_count(), 0);
                assert!(pool.alloc().is_none());
            }
            assert_eq!(
                pool.free_count(),
                8,
                "the held buffers went back with the QP"
            );
            assert_eq!(model.objects().mrs, mrs, "one region for the whole pool");
        }
        assert_eq!(model.outstanding_pages(), before);
    });
}
