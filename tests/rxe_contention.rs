//! Two threads, two queue pairs, one completion queue on the software RoCE device: polling
//! under contention waits for the poll lock (a bounded number of spins) instead of failing,
//! and no completion is lost or seen twice.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bareverbs::Context;
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};

type R = Rxe<Model, MemLink, TestClock>;

const IP: [u8; 4] = [10, 0, 0, 2];
const DEPTH: u32 = 16;
/// RDMA WRITEs per thread.
const WRITES: u64 = 20_000;

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: DEPTH,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Connects `a` and `b` (of one device) to each other through its loopback.
fn connect<'a>(
    a: QueuePair<'a, R, Rc, Reset>,
    b: QueuePair<'a, R, Rc, Reset>,
) -> (QueuePair<'a, R, Rc, Rts>, QueuePair<'a, R, Rc, Rts>) {
    let (na, nb) = (a.qp_num(), b.qp_num());
    let up = |q: QueuePair<'a, R, Rc, Reset>, peer| {
        let init = ConnectedInit {
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            ..Default::default()
        };
        let q = q.init(&init).map_err(|(_, e)| e).unwrap();
        let av = AddressVector::new(Gid::from_ipv4(IP), 1);
        let q = q
            .rtr(&ConnectedRtr::new(peer, 0, av))
            .map_err(|(_, e)| e)
            .unwrap();
        q.rts(&ConnectedRts::new(0)).map_err(|(_, e)| e).unwrap()
    };
    (up(a, nb), up(b, na))
}

/// Everything one cursor poll returns.
fn cursor(cq: &CompletionQueue<'_, R>) -> bareverbs::Result<Vec<WorkCompletion>> {
    let mut got = Vec::new();
    if let Some(mut c) = cq.start_poll()? {
        loop {
            got.push(WorkCompletion {
                wr_id: c.wr_id(),
                status: c.status(),
                qp_num: c.qp_num(),
                ..Default::default()
            });
            if !c.next_poll()? {
                break;
            }
        }
    }
    Ok(got)
}

#[test]
fn two_threads_polling_one_cq_never_see_busy_and_lose_or_double_nothing() {
    let seg = Segment::new();
    let link = seg.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    let rxe = Rxe::new(
        Model::new(ModelConfig::default()),
        link,
        TestClock::default(),
        Config { ip: IP },
    );
    let ctx = Context::new(rxe.unwrap());
    let pd = ctx.alloc_pd().unwrap();
    let shared = ctx.create_cq(64).unwrap();
    let other = ctx.create_cq(64).unwrap();
    let mr = pd
        .register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let build = |cq| pd.qp_builder(cq, cq).caps(caps()).build::<Rc>().unwrap();
    let (q1, p1) = connect(build(&shared), build(&other));
    let (q2, p2) = connect(build(&shared), build(&other));
    let qpns = [q1.qp_num(), q2.qp_num()];
    // Completions seen per QP (by whichever thread polled them), and every one polled.
    let done = [AtomicU64::new(0), AtomicU64::new(0)];
    let seen = Mutex::new(Vec::new());
    let busy = AtomicU64::new(0);
    let (sge, raddr) = (mr.sge(0, 64).unwrap(), (mr.addr() + 1024, mr.rkey()));
    std::thread::scope(|s| {
        for (me, mut qp) in [(0usize, q1), (1, q2)] {
            let (done, seen, busy, shared) = (&done, &seen, &busy, &shared);
            s.spawn(move || {
                let mut posted = 0u64;
                let mut mine = Vec::new();
                let mut wc = [WorkCompletion::default(); 4];
                // Bounded in time, not rounds: under valgrind's one-thread-at-a-time
                // scheduling a thread may spin through many empty rounds while the other
                // holds the device. Each round posts or polls; the writes complete through
                // loopback.
                let start = std::time::Instant::now();
                let mut rounds = 0u64;
                loop {
                    let all = [0, 1].map(|q| done[q].load(Ordering::Acquire));
                    if all == [WRITES; 2] {
                        break;
                    }
                    assert!(
                        start.elapsed() < std::time::Duration::from_secs(600),
                        "thread {me}: after {rounds} rounds, {posted} posted, completions {all:?}"
                    );
                    rounds += 1;
                    let room = u64::from(DEPTH) - (posted - done[me].load(Ordering::Acquire));
                    let n = room.min(WRITES - posted).min(4);
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
                    // Every other round through the cursor (`ibv_start_poll`), which holds
                    // the poll for as long as the caller reads.
                    let r = if rounds.is_multiple_of(2) {
                        shared.poll(&mut wc).map(|got| wc[..got].to_vec())
                    } else {
                        cursor(shared)
                    };
                    match r {
                        Ok(got) => {
                            for w in &got {
                                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                                let q = qpns.iter().position(|&q| q == w.qp_num).unwrap();
                                done[q].fetch_add(1, Ordering::AcqRel);
                                mine.push((q, w.wr_id));
                            }
                        }
                        Err(e) => {
                            busy.fetch_add(1, Ordering::Relaxed);
                            panic!("poll under contention: {e}");
                        }
                    }
                }
                seen.lock().unwrap().extend(mine);
                drop(qp);
            });
        }
    });
    assert_eq!(busy.load(Ordering::Relaxed), 0);
    let seen = seen.into_inner().unwrap();
    let unique: BTreeSet<_> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "a completion polled twice");
    let want: BTreeSet<_> = (0..2)
        .flat_map(|q| (0..WRITES).map(move |w| (q, w)))
        .collect();
    assert_eq!(unique, want, "every write completes once");
    drop((p1, p2));
}
