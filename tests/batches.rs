//! The data path's batches on the device model, behaviour by behaviour: every batch method of
//! RC and UD, what an abandoned or failed batch posts, 64-bit wr_ids, and what
//! `Opcodes::SendOnly` refuses to post.
//!
//! Every test runs in `lab`, which ends with every DMA page back and no violation of what QEMU
//! would mishandle.

mod common;

use bareverbs::Error;
use bareverbs::device::pvrdma::{Config, Opcodes, Pvrdma};
use bareverbs::error::{Feature, Param, Queue};
use bareverbs::verbs::*;
use bareverbs_model::{Model, ModelConfig};
use common::*;

type P = Pvrdma<Model>;
type UdQp<'a> = QueuePair<'a, P, Ud, Rts>;

const SIG: SendFlags = SendFlags::SIGNALED;

// ---------------------------------------------------------------------------------------------
// Batches

#[test]
fn every_rc_batch_method_does_what_it_says_in_one_doorbell() {
    lab(|model, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, None);
        let src = with_mr(pd, b"0123456789abcdefghijklmnopqrstuvwxyz");
        let target = with_mr(pd, &[0xEE; 64]);
        let rbuf = pd.register(4096, RW).unwrap();
        let back = pd.register(4096, RW).unwrap();
        let (t, rkey) = (target.addr(), target.rkey());
        // SAFETY: every region outlives the completions polled below; the CPU reads them only
        // after those.
        unsafe {
            let mut rb = b.recv_batch();
            rb.recv(100, &[rbuf.sge(0, 64).unwrap()]).unwrap();
            rb.recv(101, &[rbuf.sge(64, 64).unwrap()]).unwrap();
            rb.recv(102, &[rbuf.sge(128, 64).unwrap()]).unwrap();
            rb.recv(103, &[rbuf.sge(192, 64).unwrap()]).unwrap();
            rb.finish();
        }
        let doorbells = model.counters().0;
        // SAFETY: as above.
        unsafe {
            let mut sb = a.send_batch();
            sb.send(1, SIG, &[src.sge(0, 4).unwrap()]).unwrap();
            sb.send_imm(
                2,
                SIG | SendFlags::SOLICITED,
                0xAABB_CCDD,
                &[src.sge(4, 4).unwrap()],
            )
            .unwrap();
            sb.rdma_write(3, SIG, (t + 8, rkey), &[src.sge(10, 6).unwrap()])
                .unwrap();
            sb.rdma_write_imm(4, SIG, (t + 32, rkey), 0x1234, &[src.sge(20, 2).unwrap()])
                .unwrap();
            sb.rdma_read(
                5,
                SIG | SendFlags::FENCE,
                (t, rkey),
                &[back.sge(0, 40).unwrap()],
            )
            .unwrap();
            // Two gather entries in one SEND.
            sb.send(6, SIG, &[src.sge(0, 2).unwrap(), src.sge(30, 3).unwrap()])
                .unwrap();
            sb.finish();
        }
        assert_eq!(
            model.counters().0,
            doorbells + 1,
            "six requests, one doorbell"
        );
        let wcs = drain(cq);
        let sends: Vec<_> = wcs
            .iter()
            .filter(|w| w.qp_num == a.qp_num())
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect();
        use WcOpcode::*;
        let ok = WcStatus::Success;
        assert_eq!(
            sends,
            [
                (1, ok, Send),
                (2, ok, Send),
                (3, ok, RdmaWrite),
                (4, ok, RdmaWrite),
                (5, ok, RdmaRead),
                (6, ok, Send)
            ]
        );
        let recvs: Vec<_> = wcs
            .iter()
            .filter(|w| w.qp_num == b.qp_num())
            .map(|w| (w.wr_id, w.opcode, w.byte_len, w.imm, w.flags, w.src_qp))
            .collect();
        let (none, imm) = (WcFlags::empty(), WcFlags::WITH_IMM);
        let qa = a.qp_num();
        assert_eq!(
            recvs,
            [
                (100, Recv, 4, 0, none, qa),
                (101, Recv, 4, 0xAABB_CCDD, imm, qa),
                (102, RecvRdmaWithImm, 2, 0x1234, imm, qa),
                (103, Recv, 5, 0, none, qa),
            ],
            "the write with immediate consumed the third receive"
        );
        assert_eq!(&rbuf.as_slice()[..4], b"0123");
        assert_eq!(&rbuf.as_slice()[64..68], b"4567");
        assert!(rbuf.as_slice()[128..192].iter().all(|&x| x == 0));
        assert_eq!(&rbuf.as_slice()[192..197], b"01uvw", "two SGEs gathered");
        let tg = target.as_slice();
        assert_eq!(&tg[8..14], b"abcdef");
        assert_eq!(&tg[32..34], b"kl");
        assert!(tg[..8].iter().all(|&x| x == 0xEE) && tg[14..32].iter().all(|&x| x == 0xEE));
        assert_eq!(
            &back.as_slice()[..40],
            &tg[..40],
            "the read saw the writes before it"
        );
    });
}

#[test]
fn atomics_and_inline_are_refused_by_type_and_post_nothing() {
    lab(|model, _, pd, cq, gid| {
        let (mut a, _b) = rc_pair(pd, cq, gid, None, None);
        let mr = pd.register(4096, RW | AccessFlags::REMOTE_ATOMIC).unwrap();
        let sge = mr.sge(0, 8).unwrap();
        let counters = model.counters();
        // SAFETY: nothing is posted (each request is refused, the batch dropped).
        unsafe {
            let mut sb = a.send_batch();
            let remote = (mr.addr(), mr.rkey());
            assert_eq!(
                sb.atomic_cmp_swp(1, SIG, remote, (0, 1), &sge),
                Err(unsupported(Feature::Atomics))
            );
            assert_eq!(
                sb.atomic_fetch_add(2, SIG, remote, 5, &sge),
                Err(unsupported(Feature::Atomics))
            );
            assert_eq!(
                sb.send_inline(3, SIG, b"inline bytes"),
                Err(unsupported(Feature::InlineData))
            );
            sb.finish();
        }
        assert_eq!(model.counters(), counters, "nothing reached the device");
        assert!(mr.as_slice()[..8].iter().all(|&x| x == 0));
        assert_eq!(cq.poll(&mut [WorkCompletion::default(); 4]), Ok(0));
        // The credit of the refused requests was never taken: a full queue still posts.
        let src = with_mr(pd, b"x");
        let max = a.caps().max_send_wr;
        // SAFETY: the region outlives the completions polled below.
        unsafe {
            let mut sb = a.send_batch();
            for i in 0..max {
                sb.rdma_write(
                    u64::from(i),
                    SIG,
                    (mr.addr(), mr.rkey()),
                    &[src.sge(0, 1).unwrap()],
                )
                .unwrap();
            }
            sb.finish();
        }
        assert_eq!(drain(cq).len(), 16);
    });
}

#[test]
fn every_ud_batch_method_does_what_it_says() {
    lab(|model, _, pd, cq, gid| {
        let ud = || {
            pd.qp_builder(cq, cq)
                .caps(caps(8, 8, 2))
                .build::<Ud>()
                .unwrap()
                .ready(0x4242, 0)
                .unwrap()
        };
        let (mut a, mut b): (UdQp<'_>, UdQp<'_>) = (ud(), ud());
        let ah = pd.create_ah(&AddressVector::new(gid, 0)).unwrap();
        let rbuf = pd.register(4096, RW).unwrap();
        let src = with_mr(pd, b"datagram one|two");
        // SAFETY: the regions outlive the completions polled below.
        unsafe {
            let mut rb = b.recv_batch();
            rb.recv(10, &[rbuf.sge(0, 128).unwrap()]).unwrap();
            rb.recv(11, &[rbuf.sge(128, 128).unwrap()]).unwrap();
            rb.finish();
            let doorbells = model.counters().0;
            let mut sb = a.send_batch();
            let to = (&ah, b.qp_num(), 0x4242);
            sb.send_to(1, SIG, to, &[src.sge(0, 12).unwrap()]).unwrap();
            // Bit 31 of the Q_Key: the sender's own (also 0x4242).
            sb.send_to_imm(
                2,
                SIG,
                (&ah, b.qp_num(), 0x8000_0000),
                0x5EED,
                &[src.sge(13, 3).unwrap()],
            )
            .unwrap();
            sb.finish();
            assert_eq!(model.counters().0, doorbells + 1);
        }
        let wcs = drain(cq);
        let mine: Vec<_> = wcs
            .iter()
            .filter(|w| w.qp_num == a.qp_num())
            .map(|w| (w.wr_id, w.status))
            .collect();
        assert_eq!(mine, [(1, WcStatus::Success), (2, WcStatus::Success)]);
        let theirs: Vec<_> = wcs
            .iter()
            .filter(|w| w.qp_num == b.qp_num())
            .map(|w| (w.wr_id, w.byte_len, w.imm, w.flags, w.src_qp))
            .collect();
        let grh = WcFlags::GRH;
        assert_eq!(
            theirs,
            [
                (10, 40 + 12, 0, grh, a.qp_num()),
                (11, 40 + 3, 0x5EED, grh | WcFlags::WITH_IMM, a.qp_num()),
            ]
        );
        assert_eq!(&rbuf.as_slice()[40..52], b"datagram one");
        assert_eq!(&rbuf.as_slice()[128 + 40..128 + 43], b"two");
    });
}

#[test]
fn dropping_an_unfinished_batch_posts_nothing_and_gives_the_credit_back() {
    lab(|model, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, None);
        let src = with_mr(pd, b"abandoned");
        let rbuf = pd.register(4096, RW).unwrap();
        let max = a.caps().max_send_wr;
        let rmax = b.caps().max_recv_wr;
        let before = model.counters();
        // SAFETY: nothing is published (the batches are dropped unfinished).
        unsafe {
            let mut sb = a.send_batch();
            for i in 0..max {
                sb.send(1000 + u64::from(i), SIG, &[src.sge(0, 9).unwrap()])
                    .unwrap();
            }
            drop(sb);
            let mut rb = b.recv_batch();
            for i in 0..rmax {
                rb.recv(2000 + u64::from(i), &[rbuf.sge(0, 64).unwrap()])
                    .unwrap();
            }
            drop(rb);
        }
        assert_eq!(model.counters(), before, "no doorbell, no completion");
        // A SEND now finds no receive at the peer (the abandoned ones were never published)
        // and is the only request the device runs: the abandoned WQEs stay unpublished.
        // SAFETY: the region outlives the completion polled below.
        unsafe { send1(&mut a, 1, src.sge(0, 9).unwrap()) };
        let wcs = drain(cq);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::RnrRetryExcErr)]
        );
        // The RNR failed A and moved it to ERROR (as on rxe; B, the responder, stays in RTS).
        // The whole credit is back all the same: max receives and max sends, finished this
        // time; A's sends are flushed, and B's receives stay posted.
        // SAFETY: the regions outlive the completions polled below.
        unsafe {
            let mut rb = b.recv_batch();
            for i in 0..rmax {
                rb.recv(3000 + u64::from(i), &[rbuf.sge(0, 64).unwrap()])
                    .unwrap();
            }
            rb.finish();
            let mut sb = a.send_batch();
            for i in 0..max {
                sb.send(4000 + u64::from(i), SIG, &[src.sge(0, 9).unwrap()])
                    .unwrap();
            }
            sb.finish();
        }
        let wcs = drain(cq);
        let mut recvs: Vec<_> = wcs
            .iter()
            .filter(|w| w.opcode == WcOpcode::Recv)
            .map(|w| w.wr_id)
            .collect();
        let sends: Vec<_> = wcs
            .iter()
            .filter(|w| w.opcode == WcOpcode::Send && w.status == WcStatus::WrFlushErr)
            .map(|w| w.wr_id)
            .collect();
        recvs.sort();
        assert_eq!(recvs, [0u64; 0], "nothing reached B");
        assert_eq!(sends, (4000..4000 + u64::from(max)).collect::<Vec<_>>());
        assert_eq!(wcs.len(), max as usize, "nothing abandoned ran");
        assert_eq!(
            &rbuf.as_slice()[..9],
            &[0; 9],
            "nothing abandoned was received"
        );
    });
}

#[test]
fn a_batch_that_fails_midway_can_still_finish_what_came_before() {
    lab(|model, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, None);
        let src = with_mr(pd, b"first|second|third");
        let rbuf = pd.register(4096, RW).unwrap();
        let sges: Vec<_> = (0..5).map(|i| src.sge(i, 1).unwrap()).collect();
        // SAFETY: the regions outlive the completions polled below.
        unsafe {
            let mut rb = b.recv_batch();
            for i in 0..3 {
                rb.recv(100 + i, &[rbuf.sge(i as u32 * 64, 64).unwrap()])
                    .unwrap();
            }
            // A receive with too many SGEs fails; the three before it stay in the batch.
            assert_eq!(
                rb.recv(103, &sges[..5]),
                Err(Error::InvalidInput {
                    param: Param::NumSge,
                    value: 5,
                    max: 4
                })
            );
            rb.finish();
            let doorbells = model.counters().0;
            let mut sb = a.send_batch();
            sb.send(1, SIG, &[src.sge(0, 5).unwrap()]).unwrap();
            sb.send(2, SIG, &[src.sge(6, 6).unwrap()]).unwrap();
            assert_eq!(
                sb.send(3, SIG, &sges[..5]),
                Err(Error::InvalidInput {
                    param: Param::NumSge,
                    value: 5,
                    max: 4
                })
            );
            assert_eq!(
                sb.send_inline(4, SIG, b"no"),
                Err(unsupported(Feature::InlineData))
            );
            // The batch goes on after a refusal.
            sb.send(5, SIG, &[src.sge(13, 5).unwrap()]).unwrap();
            sb.finish();
            assert_eq!(model.counters().0, doorbells + 1);
        }
        let wcs = drain(cq);
        let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
        let ok = WcStatus::Success;
        assert_eq!(
            got,
            [(100, ok), (1, ok), (101, ok), (2, ok), (102, ok), (5, ok)]
        );
        assert_eq!(&rbuf.as_slice()[..5], b"first");
        assert_eq!(&rbuf.as_slice()[64..70], b"second");
        assert_eq!(&rbuf.as_slice()[128..133], b"third");
        // A batch that runs out of credit half-way: the requests that fit are posted.
        // SAFETY: as above.
        unsafe {
            let mut sb = a.send_batch();
            for i in 0..16 {
                sb.send(10 + i, SIG, &sges[..1]).unwrap();
            }
            assert_eq!(sb.send(26, SIG, &sges[..1]), Err(full(Queue::Send, 0)));
            sb.finish();
        }
        let wcs = drain(cq);
        assert_eq!(
            wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            (10..26).collect::<Vec<_>>(),
            "16 ran (RNR: no receives), the 17th was never written"
        );
    });
}

#[test]
fn wr_ids_round_trip_all_64_bits_on_the_raw_path() {
    const IDS: [u64; 6] = [
        0,
        1 << 63,
        u64::MAX,
        (1 << 63) | 1,
        0xDEAD_BEEF_CAFE_F00D,
        0x7FFF_FFFF_FFFF_FFFF,
    ];
    lab(|_, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, None);
        let src = with_mr(pd, b"id");
        let rbuf = pd.register(4096, RW).unwrap();
        // SAFETY: the regions outlive the completions polled below.
        unsafe {
            let mut rb = b.recv_batch();
            for (i, &id) in IDS.iter().enumerate() {
                rb.recv(id, &[rbuf.sge(i as u32 * 8, 8).unwrap()]).unwrap();
            }
            rb.finish();
            let mut sb = a.send_batch();
            for &id in IDS.iter().rev() {
                sb.send(id, SIG, &[src.sge(0, 2).unwrap()]).unwrap();
            }
            sb.finish();
        }
        // Through the raw poll…
        let wcs = drain(cq);
        let recvs: Vec<_> = wcs
            .iter()
            .filter(|w| w.opcode == WcOpcode::Recv)
            .map(|w| w.wr_id)
            .collect();
        let sends: Vec<_> = wcs
            .iter()
            .filter(|w| w.opcode == WcOpcode::Send)
            .map(|w| w.wr_id)
            .collect();
        assert_eq!(recvs, IDS);
        assert_eq!(sends, IDS.iter().rev().copied().collect::<Vec<_>>());
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
        // …through the QP's poll and the cursor.
        // SAFETY: as above.
        unsafe {
            b.post_recv_raw(u64::MAX, &[rbuf.sge(0, 8).unwrap()])
                .unwrap();
            send1(&mut a, 1 << 63, src.sge(0, 2).unwrap());
        }
        assert_eq!(b.poll_one().unwrap().unwrap().wc.wr_id, u64::MAX);
        let mut c = cq.start_poll().unwrap().expect("the send's completion");
        assert_eq!(c.wr_id(), 1 << 63);
        assert!(!c.next_poll().unwrap());
        drop(c);
        // And through an SRQ.
        let srq = pd
            .create_srq(SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let build = || {
            pd.qp_builder(cq, cq)
                .caps(caps(8, 0, 1))
                .srq(&srq)
                .build::<Rc>()
                .unwrap()
        };
        let (mut s, mut r) = connect(build(), build(), gid);
        let sges: Vec<_> = (0..IDS.len())
            .map(|i| rbuf.sge(i as u32 * 8, 8).unwrap())
            .collect();
        let wrs: Vec<_> = IDS
            .iter()
            .zip(&sges)
            .map(|(&wr_id, sge)| RecvWr {
                wr_id,
                sg_list: core::slice::from_ref(sge),
            })
            .collect();
        // SAFETY: as above.
        unsafe { srq.post_recv_raw(&wrs).unwrap() };
        for &id in &IDS {
            // SAFETY: as above.
            unsafe { send1(&mut s, id, src.sge(0, 2).unwrap()) };
        }
        let got: Vec<_> = drain(cq)
            .iter()
            .filter(|w| w.opcode == WcOpcode::Recv)
            .map(|w| (w.wr_id, w.qp_num))
            .collect();
        assert_eq!(
            got,
            IDS.iter().map(|&i| (i, r.qp_num())).collect::<Vec<_>>()
        );
        assert!(r.poll_one().unwrap().is_none());
        drop((s, r));
        drop(srq);
    });
}

// ---------------------------------------------------------------------------------------------
// Opcodes::SendOnly

#[test]
fn send_only_refuses_what_qemu_would_fake() {
    assert_eq!(Config::default().opcodes, Opcodes::SendOnly, "the default");
    let config = Config {
        opcodes: Opcodes::SendOnly,
        ..CONFIG
    };
    lab_with(ModelConfig::default(), config, |model, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, None);
        let mr = with_mr(pd, b"only sends");
        let sge = [mr.sge(0, 10).unwrap()];
        let remote = (mr.addr(), mr.rkey());
        let faked = unsupported(Feature::NotExecutedByDevice);
        let before = model.counters();
        // SAFETY: every request here is refused; the batch is dropped.
        unsafe {
            let mut sb = a.send_batch();
            assert_eq!(sb.send_imm(1, SIG, 5, &sge), Err(faked));
            assert_eq!(sb.rdma_write(2, SIG, remote, &sge), Err(faked));
            assert_eq!(sb.rdma_write_imm(3, SIG, remote, 5, &sge), Err(faked));
            assert_eq!(sb.rdma_read(4, SIG, remote, &sge), Err(faked));
            assert_eq!(
                sb.atomic_cmp_swp(5, SIG, remote, (0, 1), &sge[0]),
                Err(unsupported(Feature::Atomics))
            );
            assert_eq!(
                sb.atomic_fetch_add(6, SIG, remote, 1, &sge[0]),
                Err(unsupported(Feature::Atomics))
            );
        }
        assert_eq!(model.counters(), before, "nothing reached the device");
        // A plain SEND goes, even in a batch with refusals.
        let rbuf = pd.register(4096, RW).unwrap();
        // SAFETY: the regions outlive the completions polled below.
        unsafe {
            b.post_recv_raw(10, &[rbuf.sge(0, 64).unwrap()]).unwrap();
            let mut sb = a.send_batch();
            assert_eq!(sb.rdma_write(11, SIG, remote, &sge), Err(faked));
            sb.send(12, SIG, &sge).unwrap();
            sb.finish();
        }
        let wcs = drain(cq);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(10, WcStatus::Success), (12, WcStatus::Success)]
        );
        assert_eq!(&rbuf.as_slice()[..10], b"only sends");
        // UD: send_to goes, send_to_imm is refused.
        let ud = pd
            .qp_builder(cq, cq)
            .caps(caps(4, 4, 1))
            .build::<Ud>()
            .unwrap();
        let mut ud = ud.ready(3, 0).unwrap();
        let ah = pd.create_ah(&AddressVector::new(gid, 0)).unwrap();
        // SAFETY: as above.
        unsafe {
            let mut sb = ud.send_batch();
            assert_eq!(
                sb.send_to_imm(20, SIG, (&ah, 0xFFFF, 3), 9, &sge),
                Err(faked)
            );
            sb.send_to(21, SIG, (&ah, 0xFFFF, 3), &sge).unwrap();
            sb.finish();
        }
        assert_eq!(drain(cq).iter().map(|w| w.wr_id).collect::<Vec<_>>(), [21]);
    });
}
