//! The buffer-pool safe path on the device model: a pool hands out each buffer once, buffers
//! come back with their completions whoever polls and at a QP's destroy, and a buffer of
//! another pool is refused and handed back.
//!
//! Every test runs in `lab`, which ends with every DMA page back and no violation of what QEMU
//! would mishandle.

mod common;

use bareverbs::Error;
use bareverbs::error::Param;
use bareverbs::verbs::*;
use common::*;

// ---------------------------------------------------------------------------------------------
// The safe path

#[test]
fn a_pool_hands_out_each_buffer_once_until_it_comes_back() {
    lab(|model, _, pd, _, _| {
        let mrs = model.objects().mrs;
        let pool = pd.buffer_pool(70, 100).unwrap();
        assert_eq!(model.objects().mrs, mrs + 1, "one region for the pool");
        assert_eq!(
            (pool.count(), pool.buf_size()),
            (70, 128),
            "sizes round up to 64"
        );
        assert_eq!(pool.memory_region().len(), 70 * 128);
        let mut held: Vec<_> = (0..70).map(|_| pool.alloc().unwrap()).collect();
        let mut idx: Vec<_> = held.iter().map(|b| b.index()).collect();
        idx.sort();
        assert_eq!(
            idx,
            (0..70).collect::<Vec<_>>(),
            "every buffer once (two map words)"
        );
        assert!(pool.alloc().is_none(), "exhausted");
        assert_eq!(pool.free_count(), 0);
        // Each buffer is its own 128 bytes.
        for (i, b) in held.iter_mut().enumerate() {
            assert_eq!((b.len(), b.capacity()), (128, 128));
            b.as_mut_slice().fill(i as u8);
        }
        for (i, b) in held.iter().enumerate() {
            assert!(b.as_slice().iter().all(|&x| x == i as u8));
        }
        let mut b = held.swap_remove(10);
        assert_eq!(
            b.set_len(129),
            Err(Error::InvalidInput {
                param: Param::BufferRange,
                value: 129,
                max: 128
            })
        );
        b.set_len(0).unwrap();
        assert!(b.is_empty());
        let i = b.index();
        drop(b);
        assert_eq!(pool.free_count(), 1);
        let again = pool.alloc().unwrap();
        assert_eq!(again.index(), i, "the one free buffer");
        assert_eq!(again.len(), 128, "handed out whole again");
        drop(again);
        drop(held);
        assert_eq!(pool.free_count(), 70);
        // Refused shapes.
        assert!(matches!(
            pd.buffer_pool(0, 64).err(),
            Some(Error::InvalidInput {
                param: Param::PoolBuffers,
                ..
            })
        ));
        assert!(matches!(
            pd.buffer_pool(4, 0).err(),
            Some(Error::InvalidInput {
                param: Param::BufferSize,
                ..
            })
        ));
        drop(pool);
        assert_eq!(model.objects().mrs, mrs);
    });
}

#[test]
fn safe_buffers_come_back_with_their_completions_whoever_polls() {
    lab(|_, _, pd, cq, gid| {
        let pool = pd.buffer_pool(8, 64).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
        // Through the QP's poll: the buffer itself, with what arrived.
        b.post_recv(1, pool.alloc().unwrap()).unwrap();
        a.post_send(2, buf_with(&pool, b"first")).unwrap();
        assert_eq!(pool.free_count(), 6);
        let r = b.poll_one().unwrap().unwrap();
        let rb = r.buf.unwrap();
        assert_eq!((rb.as_slice(), rb.len()), (&b"first"[..], 5));
        let s = a.poll_one().unwrap().unwrap();
        let sb = s.buf.unwrap();
        assert_eq!(sb.len(), 64, "a send's buffer comes back whole");
        assert_eq!(pool.free_count(), 6, "held by the completions");
        drop((rb, sb));
        assert_eq!(pool.free_count(), 8);
        // Through the raw poll of the CQ: back to the pool at once.
        for i in 0..4 {
            b.post_recv(10 + i, pool.alloc().unwrap()).unwrap();
        }
        for i in 0..4 {
            a.post_send(20 + i, buf_with(&pool, b"raw")).unwrap();
        }
        assert_eq!(pool.free_count(), 0);
        let mut wc = [WorkCompletion::default(); 3];
        assert_eq!(cq.poll(&mut wc), Ok(3));
        assert_eq!(pool.free_count(), 3, "each polled completion's buffer");
        let rest = drain(cq);
        assert_eq!(rest.len(), 5);
        assert_eq!(pool.free_count(), 8);
        let mut ids: Vec<_> = wc.iter().chain(&rest).map(|w| w.wr_id).collect();
        ids.sort();
        assert_eq!(ids, [10, 11, 12, 13, 20, 21, 22, 23]);
        // Through the cursor: back when it moves on, or ends.
        b.post_recv(30, pool.alloc().unwrap()).unwrap();
        a.post_send(31, buf_with(&pool, b"cursor")).unwrap();
        let mut c = cq.start_poll().unwrap().unwrap();
        assert_eq!(c.wr_id(), 30);
        assert_eq!(
            pool.free_count(),
            6,
            "the current completion still holds its buffer"
        );
        assert!(c.next_poll().unwrap());
        assert_eq!(c.wr_id(), 31);
        assert_eq!(pool.free_count(), 7);
        drop(c);
        assert_eq!(pool.free_count(), 8);
    });
}

#[test]
fn destroying_a_qp_returns_every_posted_buffer() {
    lab(|model, _, pd, cq, gid| {
        let pool = pd.buffer_pool(32, 64).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&pool));
        for i in 0..16 {
            b.post_recv(i, pool.alloc().unwrap()).unwrap();
        }
        // Sends the device never runs: outstanding until the end.
        model.set_free_doorbells(true);
        for i in 0..16 {
            a.post_send(100 + i, buf_with(&pool, b"held")).unwrap();
        }
        model.set_free_doorbells(false);
        assert_eq!(pool.free_count(), 0);
        b.destroy().unwrap();
        assert_eq!(pool.free_count(), 16, "b's receives");
        drop(a);
        assert_eq!(pool.free_count(), 32, "a's sends");
        assert_eq!(drain(cq), [], "no completion for any of them");
    });
}

#[test]
fn a_buffer_of_another_pool_is_refused_and_handed_back() {
    lab(|model, _, pd, cq, gid| {
        let mine = pd.buffer_pool(4, 64).unwrap();
        let other = pd.buffer_pool(4, 64).unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, Some(&mine));
        let doorbells = model.counters().0;
        let foreign = buf_with(&other, b"not yours");
        let i = foreign.index();
        let (back, e) = a.post_send(1, foreign).err().unwrap();
        assert_eq!(
            e,
            Error::InvalidInput {
                param: Param::Pool,
                value: u64::from(i),
                max: 0
            }
        );
        assert_eq!((back.index(), back.as_slice()), (i, &b"not yours"[..]));
        assert!(core::ptr::eq(back.pool(), &other));
        let (back, e) = b.post_recv(2, back).err().unwrap();
        assert!(matches!(
            e,
            Error::InvalidInput {
                param: Param::Pool,
                ..
            }
        ));
        assert_eq!(other.free_count(), 3, "still the caller's");
        drop(back);
        assert_eq!(other.free_count(), 4);
        // A QP without a pool refuses every buffer.
        let (mut c, _d) = rc_pair(pd, cq, gid, None, None);
        let (back, e) = c.post_send(3, buf_with(&mine, b"x")).err().unwrap();
        assert!(matches!(
            e,
            Error::InvalidInput {
                param: Param::Pool,
                ..
            }
        ));
        drop(back);
        assert_eq!(model.counters().0, doorbells, "nothing posted");
        assert_eq!(mine.free_count(), 4);
    });
}
