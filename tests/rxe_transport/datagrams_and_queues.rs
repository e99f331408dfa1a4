//! UD datagrams (the GRH, a wrong Q_Key dropped), two QPs of one device in loopback, the safe
//! path and a shared receive queue, a send from memory it may not read, and the objects' sizes.

use super::*;

#[test]
fn ud_datagrams_carry_a_grh_and_a_wrong_qkey_is_dropped() {
    let l = lab(Faults::default());
    {
        let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let (ca, cb) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
        let mut qa = ud_up(&pa, &ca);
        let mut qb = ud_up(&pb, &cb);
        let mut ma = pa.register(4096, ALL).unwrap();
        let mb = pb.register(4096, ALL).unwrap();
        ma.as_mut_slice()[..100].copy_from_slice(&pattern(1, 100));
        let ah = pa
            .create_ah(&AddressVector::new(Gid::from_ipv4(IP_B), 1))
            .unwrap();
        // SAFETY: the buffers stay registered until the completions.
        unsafe {
            let mut r = qb.recv_batch();
            r.recv(5, &[mb.sge(0, 4096).unwrap()]).unwrap();
            r.finish();
            let mut s = qa.send_batch();
            s.send_to(
                1,
                SIG,
                (&ah, qb.qp_num(), 0x2222_2222),
                &[ma.sge(0, 100).unwrap()],
            )
            .unwrap();
            s.send_to_imm(
                2,
                SIG,
                (&ah, qb.qp_num(), 0x1111_1111),
                77,
                &[ma.sge(0, 100).unwrap()],
            )
            .unwrap();
            s.finish();
        }
        let (mut wa, mut wb) = (Vec::new(), Vec::new());
        assert!(l.pump(100, || {
            wa.extend(drain(&ca));
            wb.extend(drain(&cb));
            wa.len() == 2 && !wb.is_empty()
        }));
        l.run(2000);
        wb.extend(drain(&cb));
        assert_eq!(
            wb.len(),
            1,
            "the wrong Q_Key's datagram was dropped: {wb:?}"
        );
        let r = wb[0];
        assert_eq!(
            (r.wr_id, r.byte_len, r.src_qp, r.imm),
            (5, 140, qa.qp_num(), 77)
        );
        assert!(r.flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
        let b = mb.as_slice();
        assert_eq!(&b[..20], &[0u8; 20], "20 zero bytes, then the IPv4 header");
        assert_eq!(b[20] >> 4, 4);
        assert_eq!(&b[32..36], &IP_A, "the IPv4 source in the GRH slot");
        assert_eq!(&b[40..140], &pattern(1, 100)[..]);
    }
    teardown(l);
}

fn ud_up<'a>(
    pd: &'a ProtectionDomain<'a, R>,
    cq: &'a CompletionQueue<'a, R>,
) -> QueuePair<'a, R, Ud, Rts> {
    let q = pd.qp_builder(cq, cq).caps(caps(8)).build::<Ud>().unwrap();
    ud_to_rts(q, 0x1111_1111)
}

#[test]
fn two_queue_pairs_of_one_device_talk_through_loopback() {
    let l = lab(Faults::default());
    {
        let pd = l.a.alloc_pd().unwrap();
        let cq = l.a.create_cq(64).unwrap();
        let x = pd.qp_builder(&cq, &cq).caps(caps(8)).build::<Rc>().unwrap();
        let y = pd.qp_builder(&cq, &cq).caps(caps(8)).build::<Rc>().unwrap();
        let (nx, ny) = (x.qp_num(), y.qp_num());
        let (p1, p2) = (l.a.random_psn(), l.a.random_psn());
        let mut x = up(x, ny, IP_A, Mtu::Mtu1024, (p1, p2));
        let mut y = up(y, nx, IP_A, Mtu::Mtu1024, (p2, p1));
        let mut m = pd.register(16384, ALL).unwrap();
        m.as_mut_slice()[..3000].copy_from_slice(&pattern(9, 3000));
        // SAFETY: the region stays registered until the completions.
        unsafe {
            let mut r = y.recv_batch();
            r.recv(1, &[m.sge(4096, 4096).unwrap()]).unwrap();
            r.finish();
            let mut s = x.send_batch();
            s.send(2, SIG, &[m.sge(0, 3000).unwrap()]).unwrap();
            s.rdma_read(3, SIG, (m.addr(), m.rkey()), &[m.sge(8192, 3000).unwrap()])
                .unwrap();
            s.finish();
        }
        let mut got = Vec::new();
        assert!(l.pump(10, || {
            got.extend(drain(&cq));
            got.len() == 3
        }));
        got.sort_by_key(|w| w.wr_id);
        let ids: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(
            ids,
            [
                (1, WcStatus::Success),
                (2, WcStatus::Success),
                (3, WcStatus::Success)
            ]
        );
        assert_eq!(&m.as_slice()[4096..7096], &pattern(9, 3000)[..]);
        assert_eq!(&m.as_slice()[8192..11192], &pattern(9, 3000)[..]);
        assert!(
            l.seg.sent().iter().all(|(_, f)| f[12..14] != [8, 0]),
            "nothing on the wire"
        );
    }
    teardown(l);
}

#[test]
fn the_safe_path_and_a_shared_receive_queue_work_over_rxe() {
    let l = lab(Faults::default());
    {
        let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let (ca, cb) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
        // A: the safe path (a buffer pool); B: receives through an SRQ, posted raw.
        let pool = pa.buffer_pool(4, 2048).unwrap();
        let srq = pb
            .create_srq(SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let qa = pa
            .qp_builder(&ca, &ca)
            .caps(caps(8))
            .pool(&pool)
            .build::<Rc>()
            .unwrap();
        let qb = pb
            .qp_builder(&cb, &cb)
            .caps(caps(8))
            .srq(&srq)
            .build::<Rc>()
            .unwrap();
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        let (p1, p2) = (l.a.random_psn(), l.b.random_psn());
        let mut qa = up(qa, nb, IP_B, Mtu::Mtu1024, (p1, p2));
        let _qb = up(qb, na, IP_A, Mtu::Mtu1024, (p2, p1));
        let mb = pb.register(8192, ALL).unwrap();
        let sges = [mb.sge(0, 4096).unwrap(), mb.sge(4096, 4096).unwrap()];
        // SAFETY: `mb` stays registered until the completions.
        unsafe {
            srq.post_recv_raw(&[
                RecvWr {
                    wr_id: 70,
                    sg_list: &sges[..1],
                },
                RecvWr {
                    wr_id: 71,
                    sg_list: &sges[1..],
                },
            ])
            .unwrap();
        }
        for (i, len) in [(0u64, 1500usize), (1, 2048)] {
            let mut b = pool.alloc().unwrap();
            b.set_len(len as u32).unwrap();
            b.as_mut_slice().copy_from_slice(&pattern(i as u32, len));
            qa.post_send(i, b).unwrap();
        }
        assert_eq!(pool.free_count(), 2, "two buffers moved into the QP");
        let mut got_a = Vec::new();
        let mut got_b = Vec::new();
        assert!(l.pump(50, || {
            while let Some(c) = qa.poll_one().unwrap() {
                assert_eq!(c.wc.status, WcStatus::Success);
                got_a.push((c.wc.wr_id, c.buf.is_some()));
            }
            got_b.extend(drain(&cb));
            got_a.len() == 2 && got_b.len() == 2
        }));
        assert_eq!(
            got_a,
            [(0, true), (1, true)],
            "each send's buffer came back with it"
        );
        assert_eq!(pool.free_count(), 4, "and went back to the pool");
        let r: Vec<_> = got_b.iter().map(|w| (w.wr_id, w.byte_len)).collect();
        assert_eq!(r, [(70, 1500), (71, 2048)]);
        assert_eq!(&mb.as_slice()[..1500], &pattern(0, 1500)[..]);
        assert_eq!(&mb.as_slice()[4096..4096 + 2048], &pattern(1, 2048)[..]);
    }
    teardown(l);
}

#[test]
fn a_send_from_memory_it_may_not_read_fails_in_order_with_a_local_protection_error() {
    let l = lab(Faults::default());
    {
        let pds = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let cqs = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
        let ma = pds.0.register(4096, ALL).unwrap();
        let mb = pds.1.register(4096, ALL).unwrap();
        let mut p = pair(&l, &pds, &cqs, ALL, (7, 7));
        let mut bad = ma.sge(0, 64).unwrap();
        bad.lkey ^= 0x100; // nobody's key
        // SAFETY: the regions stay registered until the completions.
        unsafe {
            let mut s = p.qa.send_batch();
            s.rdma_write(1, SIG, (mb.addr(), mb.rkey()), &[ma.sge(0, 64).unwrap()])
                .unwrap();
            s.rdma_write(2, SIG, (mb.addr(), mb.rkey()), &[bad])
                .unwrap();
            s.rdma_write(3, SIG, (mb.addr(), mb.rkey()), &[ma.sge(0, 64).unwrap()])
                .unwrap();
            s.finish();
        }
        let got = wait_a(&l, &p, 3);
        let ids: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(
            ids,
            [
                (1, WcStatus::WrFlushErr),
                (2, WcStatus::LocProtErr),
                (3, WcStatus::WrFlushErr)
            ]
        );
        assert_eq!(p.qa.query().unwrap().state, QpState::Err);
    }
    teardown(l);
}

#[test]
fn the_devices_objects_fit_any_stack() {
    use core::mem::size_of;
    let sizes = [
        ("Rxe", size_of::<R>()),
        ("Context", size_of::<Ctx>()),
        ("QueuePair", size_of::<QueuePair<'static, R, Rc, Rts>>()),
        ("CompletionQueue", size_of::<CompletionQueue<'static, R>>()),
        ("MemoryRegion", size_of::<MemoryRegion<'static, R>>()),
        (
            "SharedReceiveQueue",
            size_of::<SharedReceiveQueue<'static, R>>(),
        ),
    ];
    for (what, n) in sizes {
        assert!(n <= 512, "{what} is {n} bytes: {sizes:?}");
        println!("size {what} {n}");
    }
}
