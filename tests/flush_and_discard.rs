//! Flush on ERROR and discard on RESET on the device model: every outstanding request
//! completes once as flushed (through the QP's own poll too, with its buffer), a late CQE in
//! a flush is dropped, a safe buffer is not written after it came back, and RESET discards
//! without a completion.
//!
//! Every test runs in `lab`, which ends with every DMA page back and no violation of what QEMU
//! would mishandle.

mod common;

use bareverbs::device::pvrdma::Pvrdma;
use bareverbs::error::Feature;
use bareverbs::verbs::*;
use bareverbs_model::Model;
use common::*;

type P = Pvrdma<Model>;
type RcQp<'a> = QueuePair<'a, P, Rc, Rts>;

const SIG: SendFlags = SendFlags::SIGNALED;

// ---------------------------------------------------------------------------------------------
// Flush (ERROR) and discard (RESET)

/// Leaves `b` with three safe and three raw receives (held by the device), and three safe and
/// three raw sends the device has not run; returns the raw region.
fn outstanding<'a>(
    model: &Model,
    pd: &'a ProtectionDomain<'a, P>,
    pool: &'a BufferPool<'a, P>,
    b: &mut RcQp<'a>,
) -> MemoryRegion<'a, P> {
    let mr = with_mr(pd, b"raw bytes");
    for i in 0..3 {
        b.post_recv(100 + i, pool.alloc().unwrap()).unwrap();
    }
    // SAFETY: the region outlives the QP (the caller keeps it until after).
    unsafe {
        let mut rb = b.recv_batch();
        for i in 0..3 {
            rb.recv(200 + i, &[mr.sge(1024 + i as u32 * 64, 64).unwrap()])
                .unwrap();
        }
        rb.finish();
    }
    model.set_free_doorbells(true);
    for i in 0..3 {
        b.post_send(300 + i, buf_with(pool, b"safe send")).unwrap();
    }
    // SAFETY: as above.
    unsafe {
        let mut sb = b.send_batch();
        for i in 0..3 {
            sb.send(400 + i, SIG, &[mr.sge(0, 9).unwrap()]).unwrap();
        }
        sb.finish();
    }
    model.set_free_doorbells(false);
    mr
}

#[test]
fn to_error_completes_every_outstanding_wr_once_as_flushed() {
    lab(|model, _, pd, cq, gid| {
        let pool = pd.buffer_pool(16, 64).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
        let mr = outstanding(model, pd, &pool, &mut b);
        assert_eq!(pool.free_count(), 10);
        assert_eq!(drain(cq), [], "nothing completed yet");
        let qb = b.qp_num();
        let b = b.to_error().unwrap();
        let wcs = drain(cq);
        assert!(
            wcs.iter()
                .all(|w| w.status == WcStatus::WrFlushErr && w.qp_num == qb),
            "{wcs:?}"
        );
        let by = |op| {
            wcs.iter()
                .filter(|w| w.opcode == op)
                .map(|w| w.wr_id)
                .collect::<Vec<_>>()
        };
        assert_eq!(by(WcOpcode::Send), [300, 301, 302, 400, 401, 402]);
        assert_eq!(by(WcOpcode::Recv), [100, 101, 102, 200, 201, 202]);
        assert_eq!(wcs.len(), 12, "each once");
        // The send buffers are back; the three receive buffers the device took stay parked
        // (QEMU's host QP still holds the receives and may write them) until b is destroyed.
        assert_eq!(
            pool.free_count(),
            13,
            "send buffers back, taken receive buffers parked"
        );
        assert_eq!(drain(cq), []);
        let cqes = model.counters().1;
        // A late CQE from the device for a flushed receive (the host QP still held it: QEMU
        // only records ERROR), and one for a flushed send: dropped, not a second completion.
        let src = with_mr(pd, b"late");
        // SAFETY: the region outlives the completion polled below.
        unsafe { send1(&mut a, 7, src.sge(0, 4).unwrap()) };
        model.inject_cqe(cq.raw().handle(), b.raw().handle(), 300);
        assert_eq!(
            model.counters().1 - cqes,
            3,
            "the device posted a's and b's, one was injected"
        );
        let wcs = drain(cq);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.qp_num)).collect::<Vec<_>>(),
            [(7, a.qp_num())],
            "only the sender's own completion"
        );
        drop((a, b));
        assert_eq!(
            pool.free_count(),
            16,
            "every safe buffer back once b is destroyed"
        );
        drop(mr);
    });
}

#[test]
fn flushes_come_through_the_qps_own_poll_with_their_buffers() {
    lab(|model, _, pd, cq, gid| {
        let pool = pd.buffer_pool(16, 64).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
        // One request that did run (its completion waits in the CQ) before the rest: a WRITE
        // (a SEND would find no receive and fail b, moving it to ERROR on the device).
        let src = with_mr(pd, b"ran");
        let dst = pd.register(4096, RW).unwrap();
        // SAFETY: the regions outlive the completion polled below.
        unsafe {
            let mut sb = b.send_batch();
            sb.rdma_write(1, SIG, (dst.addr(), dst.rkey()), &[src.sge(0, 3).unwrap()])
                .unwrap();
            sb.finish();
        }
        let mr = outstanding(model, pd, &pool, &mut b);
        let mut b = b.to_error().unwrap();
        assert!(a.poll_one().unwrap().is_none(), "not a's to take");
        let mut got = Vec::new();
        while let Some(c) = b.poll_one().unwrap() {
            got.push((c.wc.wr_id, c.wc.status, c.wc.opcode, c.buf.is_some()));
        }
        use WcOpcode::*;
        use WcStatus::*;
        assert_eq!(
            got,
            [
                (1, Success, RdmaWrite, false),
                (300, WrFlushErr, Send, true),
                (301, WrFlushErr, Send, true),
                (302, WrFlushErr, Send, true),
                (400, WrFlushErr, Send, false),
                (401, WrFlushErr, Send, false),
                (402, WrFlushErr, Send, false),
                // Taken by the device (it may still write them): parked until b goes.
                (100, WrFlushErr, Recv, false),
                (101, WrFlushErr, Recv, false),
                (102, WrFlushErr, Recv, false),
                (200, WrFlushErr, Recv, false),
                (201, WrFlushErr, Recv, false),
                (202, WrFlushErr, Recv, false),
            ],
            "the device's completion first, then the flushes in posting order"
        );
        // The send buffers came back through b's poll; the receive buffers are parked.
        drop(got);
        assert_eq!(pool.free_count(), 13);
        assert_eq!(drain(cq), []);
        drop((a, b));
        assert_eq!(
            pool.free_count(),
            16,
            "parked buffers back once b is destroyed"
        );
        drop(mr);
    });
}

#[test]
fn a_late_cqe_in_the_middle_of_a_flush_is_dropped() {
    lab(|_, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, None);
        let rbuf = pd.register(4096, RW).unwrap();
        // SAFETY: the region outlives the QPs.
        unsafe {
            let mut rb = b.recv_batch();
            for i in 0..3 {
                rb.recv(10 + i, &[rbuf.sge(i as u32 * 64, 64).unwrap()])
                    .unwrap();
            }
            rb.finish();
        }
        let b = b.to_error().unwrap();
        let mut one = [WorkCompletion::default(); 1];
        assert_eq!(cq.poll(&mut one), Ok(1));
        assert_eq!((one[0].wr_id, one[0].status), (10, WcStatus::WrFlushErr));
        // The host QP still holds receive 10: a message completes it, late.
        let src = with_mr(pd, b"late");
        // SAFETY: the region outlives the completion polled below.
        unsafe { send1(&mut a, 7, src.sge(0, 4).unwrap()) };
        let mut got = Vec::new();
        let mut wc = [WorkCompletion::default(); 8];
        for _ in 0..4 {
            match cq.poll(&mut wc) {
                Ok(n) => got.extend(wc[..n].iter().map(|w| (w.wr_id, w.status))),
                Err(e) => panic!("a late CQE is not garbage: {e:?} (after {got:?})"),
            }
        }
        assert_eq!(
            got,
            [
                (7, WcStatus::Success),
                (11, WcStatus::WrFlushErr),
                (12, WcStatus::WrFlushErr)
            ]
        );
        drop((a, b));
    });
}

#[test]
fn a_flushed_safe_buffer_is_not_written_after_it_came_back() {
    lab(|_, _, pd, cq, gid| {
        let pool = pd.buffer_pool(2, 64).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
        b.post_recv(1, pool.alloc().unwrap()).unwrap();
        let b = b.to_error().unwrap();
        assert_eq!(drain(cq).len(), 1, "flushed");
        // Every buffer the pool hands out is the caller's; fill them. (The flushed receive's
        // buffer is parked: the device took it.)
        let mut mine: Vec<_> = std::iter::from_fn(|| pool.alloc())
            .map(|mut b| {
                b.as_mut_slice().fill(0xAB);
                b
            })
            .collect();
        assert_eq!(mine.len(), 1, "the parked buffer is not handed out");
        // The peer sends: the host QP completes the receive it still holds.
        let src = with_mr(pd, b"overwrites you");
        // SAFETY: the region outlives the completion polled below.
        unsafe { send1(&mut a, 2, src.sge(0, 14).unwrap()) };
        drain(cq);
        for m in &mut mine {
            assert!(
                m.as_slice().iter().all(|&x| x == 0xAB),
                "buffer {} written by the device after it came back: {:?}",
                m.index(),
                &m.as_slice()[..14]
            );
        }
        drop(mine);
        drop((a, b));
    });
}

#[test]
fn a_reset_safe_buffer_is_not_written_after_it_came_back() {
    lab(|_, _, pd, cq, gid| {
        let pool = pd.buffer_pool(2, 64).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
        b.post_recv(1, pool.alloc().unwrap()).unwrap();
        let b = b.reset().unwrap();
        let mut mine: Vec<_> = std::iter::from_fn(|| pool.alloc())
            .map(|mut b| {
                b.as_mut_slice().fill(0xAB);
                b
            })
            .collect();
        assert_eq!(mine.len(), 1, "the parked buffer is not handed out");
        let src = with_mr(pd, b"overwrites you");
        // SAFETY: the region outlives the completion polled below.
        unsafe { send1(&mut a, 2, src.sge(0, 14).unwrap()) };
        drain(cq);
        for m in &mut mine {
            assert!(
                m.as_slice().iter().all(|&x| x == 0xAB),
                "buffer {} written by the device after it came back: {:?}",
                m.index(),
                &m.as_slice()[..14]
            );
        }
        drop(mine);
        drop((a, b));
    });
}

#[test]
fn reset_discards_every_outstanding_wr_without_a_completion() {
    lab(|model, _, pd, cq, gid| {
        let pool = pd.buffer_pool(16, 64).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
        let mr = outstanding(model, pd, &pool, &mut b);
        let b = b.reset().unwrap();
        assert_eq!(b.state(), QpState::Reset);
        assert_eq!(
            pool.free_count(),
            13,
            "send buffers back; the receive buffers the device took are parked"
        );
        assert_eq!(drain(cq), [], "discarded: no completion");
        // A late CQE for a discarded receive: dropped.
        let src = with_mr(pd, b"late");
        // SAFETY: the region outlives the completion polled below.
        unsafe { send1(&mut a, 7, src.sge(0, 4).unwrap()) };
        let wcs = drain(cq);
        assert_eq!(
            wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            [7],
            "only the sender's"
        );
        // QEMU cannot bring a reset QP back: refused before the device.
        let (b, e) = b.init(&ConnectedInit::default()).err().unwrap();
        assert_eq!(e, unsupported(Feature::ReinitAfterReset));
        drop((a, b));
        drop(mr);
    });
}
