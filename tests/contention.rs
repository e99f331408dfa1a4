//! Two threads, two queue pairs, one completion queue, on each device (PVRDMA on the model,
//! the software RoCE device over the in-memory segment): polling under contention waits for
//! the poll lock (a bounded number of spins) instead of failing with `Busy`, and no completion
//! is lost or seen twice. Both run under memcheck in CI.

mod common;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bareverbs::Context;
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_model::link::{Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};
use common::rc_to_rts;

const DEPTH: u32 = 16;
/// RDMA WRITEs per thread.
const WRITES: u64 = 20_000;
const RW: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);
/// How long the two threads may take, under valgrind on a slow machine included. Bounded in
/// time, not in rounds: under valgrind's one-thread-at-a-time scheduling one thread spun
/// through 4.85 million empty rounds (0.8 million natively) while the other held the device.
const DEADLINE: Duration = Duration::from_secs(600);

#[test]
fn pvrdma_two_threads_polling_one_cq_never_see_busy_and_lose_or_double_nothing() {
    let cfg = ModelConfig::default();
    let model = Model::new(cfg);
    let ctx = common::up(&model);
    let g = ctx.bind_gid(0, Gid::link_local_from_mac(cfg.mac)).unwrap();
    hammer(&ctx, AddressVector::new(g.gid(), 0), true);
    drop(g);
    common::teardown(&model, ctx);
}

#[test]
fn rxe_two_threads_polling_one_cq_never_see_busy_and_lose_or_double_nothing() {
    const IP: [u8; 4] = [10, 0, 0, 2];
    let seg = Segment::new();
    let link = seg.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    let rxe = Rxe::new(
        Model::new(ModelConfig::default()),
        link,
        TestClock::default(),
        Config { ip: IP },
    );
    let ctx = Context::new(rxe.unwrap());
    // The software device's cursor is not slowed: its threads meet on the device's progress.
    hammer(&ctx, AddressVector::new(Gid::from_ipv4(IP), 1), false);
}

/// Brings `qp` up, connected to `peer` on the same device.
fn rc_up<'a, P: Provider>(
    qp: QueuePair<'a, P, Rc, Reset>,
    peer: u32,
    av: AddressVector,
) -> QueuePair<'a, P, Rc, Rts> {
    let init = ConnectedInit {
        access: RW,
        ..Default::default()
    };
    rc_to_rts(
        qp,
        &init,
        &ConnectedRtr::new(peer, 0, av),
        &ConnectedRts::new(0),
    )
}

/// Everything one cursor poll returns; `slow`: read slowly (an application that works on each
/// completion while its cursor holds the CQ), so that the other thread's polls meet the lock
/// taken.
fn cursor<P: Provider>(
    cq: &CompletionQueue<'_, P>,
    slow: bool,
) -> bareverbs::Result<Vec<WorkCompletion>> {
    let mut got = Vec::new();
    if let Some(mut c) = cq.start_poll()? {
        loop {
            got.push(WorkCompletion {
                wr_id: c.wr_id(),
                status: c.status(),
                qp_num: c.qp_num(),
                ..Default::default()
            });
            if slow {
                for _ in 0..2_000 {
                    std::hint::spin_loop();
                }
            }
            if !c.next_poll()? {
                break;
            }
        }
    }
    Ok(got)
}

/// Two QPs whose send CQ is one shared CQ (their peers complete on another), each driven by
/// its own thread: the thread posts RDMA WRITEs as its QP has room and polls the shared CQ,
/// every other round through the cursor (`ibv_start_poll`), counting completions by the QP
/// they belong to, whichever thread polled them.
fn hammer<P>(ctx: &Context<P>, av: AddressVector, slow: bool)
where
    P: Provider + Sync,
    for<'a> QueuePair<'a, P, Rc, Rts>: Send,
    P::Cq: Sync,
{
    let pd = ctx.alloc_pd().unwrap();
    let shared = ctx.create_cq(64).unwrap();
    let other = ctx.create_cq(64).unwrap();
    let mr = pd.register(4096, RW).unwrap();
    let caps = QpCaps {
        max_send_wr: DEPTH,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let build = |cq| pd.qp_builder(cq, cq).caps(caps).build::<Rc>().unwrap();
    let (q1, p1, q2, p2) = (build(&shared), build(&other), build(&shared), build(&other));
    let (n1, m1, n2, m2) = (q1.qp_num(), p1.qp_num(), q2.qp_num(), p2.qp_num());
    let (q1, p1) = (rc_up(q1, m1, av), rc_up(p1, n1, av));
    let (q2, p2) = (rc_up(q2, m2, av), rc_up(p2, n2, av));
    let qpns = [q1.qp_num(), q2.qp_num()];
    let done = [AtomicU64::new(0), AtomicU64::new(0)];
    let seen = Mutex::new(Vec::new());
    let (sge, raddr) = (mr.sge(0, 64).unwrap(), (mr.addr() + 1024, mr.rkey()));
    std::thread::scope(|s| {
        for (me, mut qp) in [(0usize, q1), (1, q2)] {
            let (done, seen, shared) = (&done, &seen, &shared);
            s.spawn(move || {
                let (mut posted, mut mine) = (0u64, Vec::new());
                let mut wc = [WorkCompletion::default(); 4];
                let start = Instant::now();
                for round in 0u64.. {
                    let all = [0, 1].map(|q| done[q].load(Ordering::Acquire));
                    if all == [WRITES; 2] {
                        break;
                    }
                    assert!(
                        start.elapsed() < DEADLINE,
                        "thread {me}: after {round} rounds, {posted} posted, completions {all:?}"
                    );
                    let n = (u64::from(DEPTH) - (posted - all[me]))
                        .min(WRITES - posted)
                        .min(4);
                    if n > 0 {
                        let mut b = qp.send_batch();
                        for k in 0..n {
                            // SAFETY: the region outlives the QPs and their completions.
                            unsafe { b.rdma_write(posted + k, SendFlags::SIGNALED, raddr, &[sge]) }
                                .unwrap();
                        }
                        b.finish();
                        posted += n;
                    }
                    let got = if round.is_multiple_of(2) {
                        shared.poll(&mut wc).map(|got| wc[..got].to_vec())
                    } else {
                        cursor(shared, slow)
                    };
                    let got = got.unwrap_or_else(|e| panic!("poll under contention: {e}"));
                    for w in &got {
                        assert_eq!(w.status, WcStatus::Success, "{w:?}");
                        let q = qpns.iter().position(|&q| q == w.qp_num).unwrap();
                        done[q].fetch_add(1, Ordering::AcqRel);
                        mine.push((q, w.wr_id));
                    }
                }
                seen.lock().unwrap().extend(mine);
                drop(qp);
            });
        }
    });
    let seen = seen.into_inner().unwrap();
    let unique: BTreeSet<_> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "a completion polled twice");
    let want: BTreeSet<_> = (0..2)
        .flat_map(|q| (0..WRITES).map(move |w| (q, w)))
        .collect();
    assert_eq!(unique, want, "every write completes once");
    drop((p1, p2));
}
