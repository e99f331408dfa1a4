//! The v2 data path, behaviour by behaviour: every batch method, what an abandoned or failed
//! batch posts, 64-bit wr_ids, send/receive credit, completion-queue capacity (reserved at
//! build, released at destroy, not worn down by SRQ traffic), the buffer-pool safe path,
//! flush on ERROR and discard on RESET, `Opcodes::SendOnly`, registration of the embedder's
//! memory, the poll cursor, and the size of every object.
//!
//! Every test runs in `lab`, which ends with every DMA page back and no violation of what QEMU
//! would mishandle.

mod common;

use core::ptr::NonNull;

use bareverbs::Error;
use bareverbs::device::pvrdma::{Config, Opcodes, Pvrdma};
use bareverbs::error::{Feature, Param, Queue, Unsupported};
use bareverbs::hal::Hal;
use bareverbs::verbs::*;
use bareverbs_model::{Model, ModelConfig};
use common::*;

type P = Pvrdma<Model>;
type RcQp<'a> = QueuePair<'a, P, Rc, Rts>;
type UdQp<'a> = QueuePair<'a, P, Ud, Rts>;

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

const SIG: SendFlags = SendFlags::SIGNALED;

fn unsupported(f: Feature) -> Error {
    Error::Unsupported(Unsupported::Feature(f))
}

fn full(queue: Queue, free: u32) -> Error {
    Error::QueueFull { queue, free }
}

fn caps(send: u32, recv: u32, sge: u32) -> QpCaps {
    QpCaps {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: sge,
        max_recv_sge: sge,
        max_inline_data: 0,
    }
}

/// Brings two RC QPs up, connected to each other.
fn connect<'a>(
    a: QueuePair<'a, P, Rc, Reset>,
    b: QueuePair<'a, P, Rc, Reset>,
    gid: Gid,
) -> (RcQp<'a>, RcQp<'a>) {
    let (qa, qb) = (a.qp_num(), b.qp_num());
    let up = |qp, peer| {
        rc_up(
            qp,
            peer,
            gid,
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
    };
    (up(a, qb), up(b, qa))
}

/// Two connected RC QPs on one CQ (16 WRs, 4 SGEs each way), with `pool` for the safe path.
fn rc_pair<'a>(
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    gid: Gid,
    pool: Option<&'a BufferPool<'a, P>>,
) -> (RcQp<'a>, RcQp<'a>) {
    let build = || {
        let b = pd.qp_builder(cq, cq).caps(caps(16, 16, 4));
        match pool {
            Some(p) => b.pool(p).build::<Rc>().unwrap(),
            None => b.build::<Rc>().unwrap(),
        }
    };
    connect(build(), build(), gid)
}

fn with_mr<'a>(pd: &'a ProtectionDomain<'a, P>, bytes: &[u8]) -> MemoryRegion<'a, P> {
    let mut mr = pd.register(4096, RW).unwrap();
    mr.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
    mr
}

fn buf_with<'p>(pool: &'p BufferPool<'p, P>, bytes: &[u8]) -> Buf<'p, P> {
    let mut b = pool.alloc().expect("a free buffer");
    b.set_len(bytes.len() as u32).unwrap();
    b.as_mut_slice().copy_from_slice(bytes);
    b
}

/// Everything the CQ has now, polled a few at a time.
fn drain(cq: &CompletionQueue<'_, P>) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 3];
    loop {
        let n = cq.poll(&mut wc).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&wc[..n]);
    }
}

/// Posts one signaled SEND of `sge` (raw) and publishes it.
///
/// # Safety
///
/// The memory `sge` names stays registered and untouched until the completion is polled.
unsafe fn send1(qp: &mut RcQp<'_>, wr_id: u64, sge: Sge) {
    let mut b = qp.send_batch();
    // SAFETY: forwarded from our caller.
    unsafe { b.send(wr_id, SIG, &[sge]).unwrap() };
    b.finish();
}

/// A context on a fresh model brought up with `config`, a bound GID, a PD and a 256-entry CQ;
/// runs `f` and tears everything down.
fn lab_with(
    cfg: ModelConfig,
    config: Config,
    f: impl FnOnce(&Model, &Ctx, &ProtectionDomain<'_, P>, &CompletionQueue<'_, P>, Gid),
) {
    let model = Model::new(cfg);
    let ctx = bareverbs::Context::new(Pvrdma::probe(model.clone(), &model, config).unwrap());
    let g = ctx.bind_gid(0, Gid::link_local_from_mac(cfg.mac)).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).unwrap();
    f(&model, &ctx, &pd, &cq, g.gid());
    drop(cq);
    drop(pd);
    drop(g);
    teardown(&model, ctx);
}

fn lab(f: impl FnOnce(&Model, &Ctx, &ProtectionDomain<'_, P>, &CompletionQueue<'_, P>, Gid)) {
    lab_with(ModelConfig::default(), CONFIG, f)
}

// ---------------------------------------------------------------------------------------------
// Batches

#[test]
fn every_rc_batch_method_does_what_it_says_in_one_doorbell() {
    lab(|model, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
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
        let (mut a, _b) = rc_pair(pd, cq, gid, None);
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
                .map_err(|(_, e)| e)
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
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
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
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
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
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
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
        let mut qp = qp.ready(1, 0).map_err(|(_, e)| e).unwrap();
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
        b.post_recv(18, pool.alloc().unwrap())
            .map_err(|(_, e)| e)
            .unwrap();
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
        let mut ud = ud.ready(7, 0).map_err(|(_, e)| e).unwrap();
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
        let mut other = other.init(&init).map_err(|(_, e)| e).unwrap();
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
        qp2.destroy().map_err(|(_, e)| e).unwrap();
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
        let mut qp4 = qp4.init(&init).map_err(|(_, e)| e).unwrap();
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
        let mut qp5 = qp5.init(&init).map_err(|(_, e)| e).unwrap();
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
        let mut qp = qp.ready(1, 0).map_err(|(_, e)| e).unwrap();
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
        let mut q = q.ready(1, 0).map_err(|(_, e)| e).unwrap();
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
        let mut again = again.ready(1, 0).map_err(|(_, e)| e).unwrap();
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
        let (mut a, mut b) = rc_pair(pd, cq, gid, Some(&pool));
        // Through the QP's poll: the buffer itself, with what arrived.
        b.post_recv(1, pool.alloc().unwrap())
            .map_err(|(_, e)| e)
            .unwrap();
        a.post_send(2, buf_with(&pool, b"first"))
            .map_err(|(_, e)| e)
            .unwrap();
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
            b.post_recv(10 + i, pool.alloc().unwrap())
                .map_err(|(_, e)| e)
                .unwrap();
        }
        for i in 0..4 {
            a.post_send(20 + i, buf_with(&pool, b"raw"))
                .map_err(|(_, e)| e)
                .unwrap();
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
        b.post_recv(30, pool.alloc().unwrap())
            .map_err(|(_, e)| e)
            .unwrap();
        a.post_send(31, buf_with(&pool, b"cursor"))
            .map_err(|(_, e)| e)
            .unwrap();
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
        let (mut a, mut b) = rc_pair(pd, cq, gid, Some(&pool));
        for i in 0..16 {
            b.post_recv(i, pool.alloc().unwrap())
                .map_err(|(_, e)| e)
                .unwrap();
        }
        // Sends the device never runs: outstanding until the end.
        model.set_free_doorbells(true);
        for i in 0..16 {
            a.post_send(100 + i, buf_with(&pool, b"held"))
                .map_err(|(_, e)| e)
                .unwrap();
        }
        model.set_free_doorbells(false);
        assert_eq!(pool.free_count(), 0);
        b.destroy().map_err(|(_, e)| e).unwrap();
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
        let (mut a, mut b) = rc_pair(pd, cq, gid, Some(&mine));
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
        let (mut c, _d) = rc_pair(pd, cq, gid, None);
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
        b.post_recv(100 + i, pool.alloc().unwrap())
            .map_err(|(_, e)| e)
            .unwrap();
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
        b.post_send(300 + i, buf_with(pool, b"safe send"))
            .map_err(|(_, e)| e)
            .unwrap();
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
        let (mut a, mut b) = rc_pair(pd, cq, gid, Some(&pool));
        let mr = outstanding(model, pd, &pool, &mut b);
        assert_eq!(pool.free_count(), 10);
        assert_eq!(drain(cq), [], "nothing completed yet");
        let qb = b.qp_num();
        let b = b.to_error().map_err(|(_, e)| e).unwrap();
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
        let (mut a, mut b) = rc_pair(pd, cq, gid, Some(&pool));
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
        let mut b = b.to_error().map_err(|(_, e)| e).unwrap();
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
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
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
        let b = b.to_error().map_err(|(_, e)| e).unwrap();
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
        let (mut a, mut b) = rc_pair(pd, cq, gid, Some(&pool));
        b.post_recv(1, pool.alloc().unwrap())
            .map_err(|(_, e)| e)
            .unwrap();
        let b = b.to_error().map_err(|(_, e)| e).unwrap();
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
        let (mut a, mut b) = rc_pair(pd, cq, gid, Some(&pool));
        b.post_recv(1, pool.alloc().unwrap())
            .map_err(|(_, e)| e)
            .unwrap();
        let b = b.reset().map_err(|(_, e)| e).unwrap();
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
        let (mut a, mut b) = rc_pair(pd, cq, gid, Some(&pool));
        let mr = outstanding(model, pd, &pool, &mut b);
        let b = b.reset().map_err(|(_, e)| e).unwrap();
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
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
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
        let mut ud = ud.ready(3, 0).map_err(|(_, e)| e).unwrap();
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

// ---------------------------------------------------------------------------------------------
// The embedder's memory

#[test]
fn user_memory_registers_and_takes_rdma_in_place() {
    lab(|model, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
        let block = Hal::dma_alloc(model, 2).unwrap();
        let base = block.vaddr;
        let mrs = model.objects().mrs;
        // SAFETY: the block stays allocated until the regions are gone (dealloc comes last),
        // and the CPU reads its bytes only after the completions that wrote them.
        let user = unsafe { pd.register_user(base, 8192, RW) }.unwrap();
        assert_eq!(
            user.addr(),
            base.as_ptr() as u64,
            "SGEs use the CPU's addresses"
        );
        assert_eq!(user.len(), 8192);
        assert_eq!(model.objects().mrs, mrs + 1);
        // An RDMA WRITE from a driver region lands in the embedder's bytes, across the page
        // boundary.
        let src = with_mr(pd, &(0..200u8).collect::<Vec<_>>());
        // SAFETY: the regions outlive the completions polled right after.
        unsafe {
            let mut sb = a.send_batch();
            sb.rdma_write(
                1,
                SIG,
                (user.addr() + 4000, user.rkey()),
                &[src.sge(0, 200).unwrap()],
            )
            .unwrap();
            sb.finish();
        }
        let wcs = drain(cq);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
        // SAFETY: the block's 8192 bytes, written by the device before the completion.
        let bytes = unsafe { core::slice::from_raw_parts(base.as_ptr(), 8192) };
        assert_eq!(&bytes[4000..4200], &(0..200u8).collect::<Vec<_>>()[..]);
        assert!(bytes[..4000].iter().all(|&x| x == 0) && bytes[4200..].iter().all(|&x| x == 0));
        assert_eq!(
            model.read_phys(block.paddr + 4000, 200).unwrap(),
            (0..200u8).collect::<Vec<_>>(),
            "at the physical address the HAL gave"
        );
        assert_eq!(&user.as_slice()[4000..4200], &bytes[4000..4200]);
        // A region at an unaligned address inside the block: receives and sends by lkey.
        // SAFETY: as above.
        let part =
            unsafe { pd.register_user(NonNull::new(base.as_ptr().add(100)).unwrap(), 300, RW) }
                .unwrap();
        assert_eq!(part.addr(), base.as_ptr() as u64 + 100);
        // SAFETY: as above.
        unsafe {
            b.post_recv_raw(2, &[part.sge(50, 64).unwrap()]).unwrap();
            let mut sb = a.send_batch();
            sb.send(3, SIG, &[src.sge(10, 20).unwrap()]).unwrap();
            sb.finish();
        }
        let wcs = drain(cq);
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
        assert_eq!(&bytes[150..170], &(10..30u8).collect::<Vec<_>>()[..]);
        // SAFETY: as above.
        unsafe {
            let rbuf = pd.register(4096, RW).unwrap();
            a.post_recv_raw(4, &[rbuf.sge(0, 64).unwrap()]).unwrap();
            let mut sb = b.send_batch();
            sb.send(5, SIG, &[part.sge(50, 20).unwrap()]).unwrap();
            sb.finish();
            assert_eq!(drain(cq).len(), 2);
            assert_eq!(&rbuf.as_slice()[..20], &(10..30u8).collect::<Vec<_>>()[..]);
        }
        drop(part);
        drop(user);
        assert_eq!(model.objects().mrs, mrs + 1, "only `src` is left");
        // Memory the HAL cannot translate is refused, and leaves nothing behind.
        let pages = model.outstanding_pages();
        let mut heap = vec![0u8; 4096];
        // SAFETY: refused (never registered).
        let e = unsafe { pd.register_user(NonNull::new(heap.as_mut_ptr()).unwrap(), 4096, RW) };
        assert_eq!(e.err(), Some(unsupported(Feature::UserMemory)));
        let leaked: &'static mut [u8] = Box::leak(vec![0u8; 64].into_boxed_slice());
        let e = pd.register_static(leaked, RW);
        assert_eq!(e.err(), Some(unsupported(Feature::UserMemory)));
        // Memory partly outside the block: refused too.
        // SAFETY: refused.
        let e = unsafe { pd.register_user(base, 3 * 4096, RW) };
        assert_eq!(e.err(), Some(unsupported(Feature::UserMemory)));
        assert_eq!(model.objects().mrs, mrs + 1);
        assert_eq!(model.outstanding_pages(), pages);
        drop((a, b));
        drop(src);
        // SAFETY: allocated above from the model; every region over it is gone.
        unsafe { Hal::dma_dealloc(model, block) };
    });
}

// ---------------------------------------------------------------------------------------------
// The poll cursor

#[test]
fn the_poll_cursor_reads_each_field_when_asked() {
    lab(|_, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
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
        let b = b.to_error().map_err(|(_, e)| e).unwrap();
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

// ---------------------------------------------------------------------------------------------
// Object sizes

#[test]
fn the_context_is_at_most_512_bytes() {
    use core::mem::size_of;
    let parts = [
        ("Context", size_of::<Ctx>()),
        ("Pvrdma", size_of::<P>()),
        ("DeviceCaps", size_of::<DeviceCaps>()),
        ("Model (the HAL handle)", size_of::<Model>()),
        ("ModelMmio", size_of::<bareverbs_model::ModelMmio>()),
    ];
    assert!(size_of::<Ctx>() <= 512, "{parts:?}");
}

#[test]
fn every_object_is_small_whatever_its_depth() {
    use core::mem::size_of;
    let sizes = [
        (
            "QueuePair<Rc, Rts>",
            size_of::<QueuePair<'static, P, Rc, Rts>>(),
        ),
        (
            "QueuePair<Ud, Reset>",
            size_of::<QueuePair<'static, P, Ud, Reset>>(),
        ),
        ("CompletionQueue", size_of::<CompletionQueue<'static, P>>()),
        (
            "SharedReceiveQueue",
            size_of::<SharedReceiveQueue<'static, P>>(),
        ),
        ("MemoryRegion", size_of::<MemoryRegion<'static, P>>()),
        ("BufferPool", size_of::<BufferPool<'static, P>>()),
        ("Buf", size_of::<Buf<'static, P>>()),
        (
            "ProtectionDomain",
            size_of::<ProtectionDomain<'static, P>>(),
        ),
        ("AddressHandle", size_of::<AddressHandle<'static, P>>()),
        ("Completion", size_of::<Completion<'static, P>>()),
        ("PollCursor", size_of::<PollCursor<'static, P>>()),
    ];
    for (name, size) in sizes {
        eprintln!("{name}: {size} bytes");
        assert!(size <= 512, "{name} is {size} bytes");
    }
    assert_eq!(size_of::<Buf<'static, P>>(), 16);
    assert!(
        size_of::<Ctx>() <= 1024,
        "see the_context_is_at_most_512_bytes"
    );
    assert_eq!(size_of::<WorkCompletion>(), 32);
    // The objects themselves, shallow and deep: the same size (their queues live in DMA
    // memory).
    lab(|_, ctx, pd, _, _| {
        let cq1 = ctx.create_cq(2).unwrap();
        let cq2 = ctx.create_cq(2048).unwrap();
        assert_eq!(size_of_val(&cq1), size_of_val(&cq2));
        let shallow = pd
            .qp_builder(&cq1, &cq1)
            .caps(caps(0, 0, 1))
            .build::<Rc>()
            .unwrap();
        let deep = pd
            .qp_builder(&cq2, &cq2)
            .caps(caps(1024, 1024, 4))
            .build::<Rc>()
            .unwrap();
        assert_eq!(deep.caps().max_send_wr, 1024);
        assert_eq!(size_of_val(&shallow), size_of_val(&deep));
        assert!(size_of_val(&deep) <= 512);
        let p1 = pd.buffer_pool(1, 64).unwrap();
        let p2 = pd.buffer_pool(4096, 256).unwrap();
        assert_eq!(size_of_val(&p1), size_of_val(&p2));
        let s1 = pd
            .create_srq(SrqAttr {
                max_wr: 1,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let s2 = pd
            .create_srq(SrqAttr {
                max_wr: 2048,
                max_sge: 4,
                srq_limit: 0,
            })
            .unwrap();
        assert_eq!(size_of_val(&s1), size_of_val(&s2));
        drop((shallow, deep));
        drop((p1, p2, s1, s2));
        drop((cq1, cq2));
    });
}
