//! An SRQ below its limit raising the async event once, and a duplicate atomic answered from
//! the replay cache rather than executed again.

use super::*;

#[test]
fn an_srq_below_its_limit_raises_the_async_event_once() {
    let l = lab(Faults::default());
    {
        let pds = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let cqs = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
        let srq = pds
            .1
            .create_srq(SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let qa = pds
            .0
            .qp_builder(&cqs.0, &cqs.0)
            .caps(caps(8))
            .build::<Rc>()
            .unwrap();
        let qb = pds
            .1
            .qp_builder(&cqs.1, &cqs.1)
            .caps(caps(8))
            .srq(&srq)
            .build::<Rc>()
            .unwrap();
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        let (p1, p2) = (l.a.random_psn(), l.b.random_psn());
        let mut qa = up(qa, nb, IP_B, Mtu::Mtu1024, (p1, p2));
        let _qb = up(qb, na, IP_A, Mtu::Mtu1024, (p2, p1));
        let ma = pds.0.register(4096, ALL).unwrap();
        let mb = pds.1.register(4096, ALL).unwrap();
        let sge = [mb.sge(0, 64).unwrap()];
        let wrs: Vec<_> = (0..4)
            .map(|i| RecvWr {
                wr_id: 100 + i,
                sg_list: &sge,
            })
            .collect();
        // SAFETY: `mb` stays registered until the QPs are gone.
        unsafe { srq.post_recv_raw(&wrs).unwrap() };
        srq.modify(3).unwrap();
        assert_eq!(l.b.get_async_event(), None);
        let send = |qa: &mut RcQp<'_>, id| {
            // SAFETY: `ma` stays registered until the completion.
            unsafe {
                let mut s = qa.send_batch();
                s.send(id, SIG, &[ma.sge(0, 8).unwrap()]).unwrap();
                s.finish();
            }
        };
        // 4 posted, limit 3: the first receive leaves 3 (not below), the second leaves 2.
        let mut got = Vec::new();
        for (id, event) in [(1u64, false), (2, true), (3, false)] {
            send(&mut qa, id);
            assert!(l.pump(50, || {
                got.extend(drain(&cqs.0));
                got.len() == id as usize
            }));
            let want = event.then(|| AsyncEvent::SrqLimitReached(srq.raw().number()));
            assert_eq!(l.b.get_async_event(), want, "after receive {id}");
        }
        assert!(got.iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(
            srq.query().unwrap().srq_limit,
            0,
            "the event disarmed the limit"
        );
    }
    teardown(l);
}

#[test]
fn a_duplicate_atomic_is_answered_from_the_replay_cache_not_executed_again() {
    // RC opcodes (IBA 9.2): FETCH_ADD request, ATOMIC_ACKNOWLEDGE.
    const FETCH_ADD: u8 = 0x14;
    const ATOMIC_ACK: u8 = 0x12;
    let l = lab(Faults::default());
    {
        let pds = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let cqs = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
        let mut ma = pds.0.register(4096, ALL).unwrap();
        let mut rw = pds.1.register(4096, ALL).unwrap();
        rw.as_mut_slice()[..8].copy_from_slice(&40u64.to_le_bytes());
        let mut p = pair(&l, &pds, &cqs, ALL, (7, 7));
        // SAFETY: `ma` stays registered and unread until the completion.
        unsafe {
            let mut s = p.qa.send_batch();
            s.atomic_fetch_add(1, SIG, (rw.addr(), rw.rkey()), 2, &ma.sge(0, 8).unwrap())
                .unwrap();
            s.finish();
        }
        let got = wait_a(&l, &p, 1);
        assert_eq!((got[0].wr_id, got[0].status), (1, WcStatus::Success));
        assert_eq!(
            ma.as_slice()[..8],
            40u64.to_le_bytes(),
            "the original value"
        );
        assert_eq!(rw.as_slice()[..8], 42u64.to_le_bytes(), "added once");

        let sent = l.seg.sent();
        let (from_a, request) = sent
            .iter()
            .find(|(_, f)| f.len() > 60 && bth_of(f).0 == FETCH_ADD)
            .cloned()
            .expect("A's FETCH_ADD on the segment");
        let acks = |sent: &[(usize, Vec<u8>)]| -> Vec<Vec<u8>> {
            sent.iter()
                .filter(|(from, f)| *from != from_a && f.len() > 60 && bth_of(f).0 == ATOMIC_ACK)
                .map(|(_, f)| f.clone())
                .collect()
        };
        let first = acks(&sent);
        assert_eq!(first.len(), 1, "one atomic acknowledgement");
        // The request again, as a retransmission after a lost acknowledgement would bring it.
        ma.as_mut_slice()[..8].fill(0);
        l.seg.inject(from_a, &request);
        l.run(20);
        let again = acks(&l.seg.sent());
        assert_eq!(again.len(), 2, "the duplicate is answered");
        let ack_psn = |f: &[u8]| bth_of(f).1;
        assert_eq!(ack_psn(&again[1]), ack_psn(&first[0]), "for the same PSN");
        // AETH (4 bytes), then AtomicAckETH: the original value, big-endian.
        let orig = |f: &[u8]| {
            let at = bareverbs::device::rxe::wire::packet::ROCE_OFFSET + 12 + 4;
            u64::from_be_bytes(f[at..at + 8].try_into().unwrap())
        };
        assert_eq!(
            orig(&again[1]),
            40,
            "the value the first execution returned"
        );
        assert_eq!(rw.as_slice()[..8], 42u64.to_le_bytes(), "not added twice");
        // A took the duplicate acknowledgement for nothing: no completion, still RTS.
        let mut more = Vec::new();
        more.extend(drain(p.ca));
        assert!(more.is_empty(), "no second completion: {more:?}");
        assert_eq!(ma.as_slice()[..8], [0; 8], "nothing written again");
        assert_eq!(p.qa.query().unwrap().state, QpState::Rts);
        assert_eq!(p.qb.query().unwrap().state, QpState::Rts);
        drop(p);
    }
    teardown(l);
}
