//! A passive peer on the software RoCE device is served while its application only waits.
//!
//! The software device has no thread: its transport runs inside this side's calls. These
//! tests show which calls are enough. Two rxe devices on the model's in-memory segment; A
//! (the active side, on the test's thread) RDMA-WRITEs into B's region and RDMA-READs from
//! it; B (on its own thread) never polls, never calls `progress`: its application only
//! awaits a future, through the crate's executor. The control shows the same READ stalling
//! while B's thread waits on something else, so the tests can fail.

use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use bareverbs::Context;
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};

type R = Rxe<Model, MemLink, TestClock>;

const IP_A: [u8; 4] = [10, 0, 0, 2];
const IP_B: [u8; 4] = [10, 0, 0, 3];
/// Polls of A's CQ before the active side gives up (the served cases take a few).
const TRIES: u32 = 200_000;

fn devices(model: &Model) -> (Context<R>, Context<R>, Segment) {
    let (seg, clk) = (Segment::new(), TestClock::default());
    let la = seg.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    let lb = seg.attach([0x52, 0x54, 0, 0, 0, 3], 1514);
    let a = Context::new(Rxe::new(model.clone(), la, clk.clone(), Config { ip: IP_A }).unwrap());
    let b = Context::new(Rxe::new(model.clone(), lb, clk, Config { ip: IP_B }).unwrap());
    (a, b, seg)
}

/// How B's application waits while A works on its memory.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Wait {
    /// `bareverbs::block_on(cq.next_completion())`: a completion of its own CQ (A's SEND,
    /// posted only after A's READ and WRITE completed).
    NextCompletion,
    /// `ctx.block_on(flag)`: a future that is not the crate's (A's flag), run by the context.
    ContextBlockOn,
    /// `bareverbs::block_on(channel.cq_event())`: its completion channel's event.
    ChannelEvent,
    /// Control: a spin on A's flag that calls nothing of the crate's.
    Nothing,
}

/// What A saw: the WRITE's and READ's status (None: not completed within `TRIES` polls) and
/// the bytes it read.
fn run(wait: Wait) -> (Option<WcStatus>, Option<WcStatus>, [u8; 8]) {
    let model = Model::new(ModelConfig::default());
    let (a, b, _seg) = devices(&model);
    let out = {
        let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let cq_a = a.create_cq(64).unwrap();
        let channel = b.create_comp_channel().unwrap();
        let cq_b = b.create_cq_with_channel(64, &channel).unwrap();
        let qa = pd_a.qp_builder(&cq_a, &cq_a).build::<Rc>().unwrap();
        let qb = pd_b.qp_builder(&cq_b, &cq_b).build::<Rc>().unwrap();
        let (ea, eb) = (qa.endpoint().unwrap(), qb.endpoint().unwrap());
        let mut qa = qa.handshake(&eb).map_err(bareverbs::Error::from).unwrap();
        let mut qb = qb.handshake(&ea).map_err(bareverbs::Error::from).unwrap();

        let mut local = pd_a.register(16, AccessFlags::LOCAL_WRITE).unwrap();
        local.as_mut_slice()[..8].copy_from_slice(b"written!");
        let remote_access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mut theirs = pd_b.register(16, remote_access).unwrap();
        theirs.as_mut_slice()[8..].copy_from_slice(b"read me!");
        let (addr, rkey) = (theirs.addr(), theirs.rkey());
        let recv_buf = pd_b.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        // SAFETY: `recv_buf` is not touched until B's thread has its completion.
        unsafe {
            let mut r = qb.recv_batch();
            r.recv(9, &[recv_buf.sge(0, 64).unwrap()]).unwrap();
            r.finish();
        }
        if wait == Wait::ChannelEvent {
            cq_b.req_notify(false).unwrap();
        }
        let done = AtomicBool::new(false);

        let out = std::thread::scope(|s| {
            let (cq_b, channel, done) = (&cq_b, &channel, &done);
            let b = &b;
            s.spawn(move || match wait {
                Wait::NextCompletion => {
                    let wc = bareverbs::block_on(cq_b.next_completion()).unwrap();
                    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success));
                }
                Wait::ContextBlockOn => b.block_on(std::future::poll_fn(|_| {
                    match done.load(Ordering::Acquire) {
                        true => Poll::Ready(()),
                        false => Poll::Pending,
                    }
                })),
                Wait::ChannelEvent => {
                    let id = bareverbs::block_on(channel.cq_event());
                    assert_eq!(id, cq_b.id());
                    cq_b.ack_events(1);
                }
                Wait::Nothing => {
                    while !done.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                }
            });

            // A: WRITE 8 bytes into B's region, READ 8 back, each waited for on A's CQ only.
            let mut statuses = [None, None];
            // SAFETY: `local` is not touched by the CPU until both completions are polled
            // (or the QP is destroyed, below, when they never come).
            unsafe {
                let mut batch = qa.send_batch();
                let w = [local.sge(0, 8).unwrap()];
                batch
                    .rdma_write(1, SendFlags::SIGNALED, (addr, rkey), &w)
                    .unwrap();
                let r = [local.sge(8, 8).unwrap()];
                batch
                    .rdma_read(2, SendFlags::SIGNALED, (addr + 8, rkey), &r)
                    .unwrap();
                batch.finish();
            }
            let mut wc = [WorkCompletion::default(); 2];
            for _ in 0..TRIES {
                let n = cq_a.poll(&mut wc).unwrap();
                for c in &wc[..n] {
                    statuses[(c.wr_id - 1) as usize] = Some(c.status);
                }
                if statuses.iter().all(Option::is_some) {
                    break;
                }
            }
            // Then the SEND B's completion waits are for, and the flag the others wait for
            // (posted whatever happened, so that B's thread always ends).
            // SAFETY: `local` is left alone until this send's completion (or the QP's end).
            unsafe {
                let mut batch = qa.send_batch();
                batch
                    .send(3, SendFlags::SIGNALED, &[local.sge(0, 4).unwrap()])
                    .unwrap();
                batch.finish();
            }
            if statuses.iter().all(Option::is_some) {
                let wc = bareverbs::block_on(cq_a.next_completion()).unwrap();
                assert_eq!((wc.wr_id, wc.status), (3, WcStatus::Success));
            }
            done.store(true, Ordering::Release);
            let mut read = [0u8; 8];
            read.copy_from_slice(&local.as_slice()[8..16]);
            (statuses[0], statuses[1], read)
        });
        if out.0.is_some() {
            assert_eq!(&theirs.as_slice()[..8], b"written!");
        }
        drop((qa, qb));
        out
    };
    drop((a, b));
    assert_eq!(model.outstanding_pages(), 0);
    out
}

#[test]
fn a_passive_peer_awaiting_its_next_completion_serves_write_and_read() {
    let (w, r, read) = run(Wait::NextCompletion);
    assert_eq!((w, r), (Some(WcStatus::Success), Some(WcStatus::Success)));
    assert_eq!(&read, b"read me!");
}

#[test]
fn a_passive_peer_awaiting_its_own_future_through_the_context_serves_write_and_read() {
    let (w, r, read) = run(Wait::ContextBlockOn);
    assert_eq!((w, r), (Some(WcStatus::Success), Some(WcStatus::Success)));
    assert_eq!(&read, b"read me!");
}

#[test]
fn a_passive_peer_awaiting_its_channel_serves_write_and_read() {
    let (w, r, read) = run(Wait::ChannelEvent);
    assert_eq!((w, r), (Some(WcStatus::Success), Some(WcStatus::Success)));
    assert_eq!(&read, b"read me!");
}

#[test]
fn a_passive_peer_that_runs_nothing_of_the_crate_leaves_them_waiting() {
    // The control: B's thread spins on a flag, its device never runs, A's requests stay
    // outstanding (the network delivered them; no one took them off B's NIC).
    let (w, r, read) = run(Wait::Nothing);
    assert_eq!((w, r), (None, None));
    assert_eq!(read, [0; 8]);
}

#[test]
fn the_progress_hook_is_on_provider_and_a_no_op_on_pvrdma() {
    // Generic code reaches it through the context; PVRDMA's device serves peers by itself.
    fn drive<P: Provider>(ctx: &Context<P>) {
        ctx.progress();
        ctx.block_on(std::future::ready(()));
    }
    let model = Model::new(ModelConfig::default());
    let ctx = Context::new(
        bareverbs::device::pvrdma::Pvrdma::probe(model.clone(), &model, Default::default())
            .unwrap(),
    );
    let before = model.commands();
    drive(&ctx);
    assert_eq!(
        model.commands(),
        before,
        "no command for a progress on PVRDMA"
    );
    let (a, _b, _seg) = devices(&model);
    drive(&a);
}
