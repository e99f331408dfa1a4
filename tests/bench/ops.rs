//! Data-path operations for instruction counting (`tests/bench.sh` runs this under
//! `valgrind --tool=callgrind`, counting only inside the `bench_*` functions).
//!
//! Each `bench_*` function performs one measured operation; the harness around it resets the
//! rings and the CQ budget, outside the count. The device is the model with its doorbells made
//! free (a doorbell write is ignored without entering the model), so the figures are the
//! driver's own instructions. Run without valgrind it only checks that every scenario works.

use std::hint::black_box;

use bareverbs::Context;
use bareverbs::device::pvrdma::{Config, Pvrdma};
use bareverbs::verbs::*;
use bareverbs_model::Model;

type P = Pvrdma<Model>;
type Qp<'a> = QueuePair<'a, P, Rc, Rts, 64, 64>;
type UdQp<'a> = QueuePair<'a, P, Ud, Rts, 64, 64>;

/// Repetitions of each scenario.
pub const REPS: usize = 1000;

struct Bench<'a> {
    model: &'a Model,
    qp: Qp<'a>,
    ud: UdQp<'a>,
    ud_send1: [SendWr<'a>; 1],
    cq: &'a CompletionQueue<'a, P>,
    send1: [SendWr<'a>; 1],
    send16: [SendWr<'a>; 16],
    recv1: [RecvWr<'a>; 1],
    recv16: [RecvWr<'a>; 16],
    wc: [WorkCompletion; 16],
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_post_send_1(b: &mut Bench<'_>) {
    // SAFETY: the buffers live for the whole benchmark and are never written.
    unsafe { b.qp.post_send_raw(black_box(&b.send1)).unwrap() }
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_post_send_ud_1(b: &mut Bench<'_>) {
    // SAFETY: as above.
    unsafe { b.ud.post_send_raw(black_box(&b.ud_send1)).unwrap() }
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_post_send_16(b: &mut Bench<'_>) {
    // SAFETY: as above.
    unsafe { b.qp.post_send_raw(black_box(&b.send16)).unwrap() }
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_post_recv_1(b: &mut Bench<'_>) {
    // SAFETY: as above.
    unsafe { b.qp.post_recv_raw(black_box(&b.recv1)).unwrap() }
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_post_recv_16(b: &mut Bench<'_>) {
    // SAFETY: as above.
    unsafe { b.qp.post_recv_raw(black_box(&b.recv16)).unwrap() }
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_poll_1(b: &mut Bench<'_>) -> usize {
    b.cq.poll(black_box(&mut b.wc[..1])).unwrap()
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_poll_16(b: &mut Bench<'_>) -> usize {
    b.cq.poll(black_box(&mut b.wc[..16])).unwrap()
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_poll_empty(b: &mut Bench<'_>) -> usize {
    b.cq.poll(black_box(&mut b.wc[..16])).unwrap()
}

/// Gives the CQ budget back (the CQEs the posts would produce), outside the count.
fn settle(b: &mut Bench<'_>, cqes: usize) {
    b.model.consume_rings(b.qp.qp_num());
    b.model.consume_rings(b.ud.qp_num());
    let handle = b.cq.raw().handle();
    for i in 0..cqes {
        b.model.inject_cqe(handle, b.qp.raw().handle(), i as u64);
    }
    let mut left = cqes;
    while left > 0 {
        left -= b.cq.poll(&mut b.wc).unwrap();
    }
}

fn main() {
    let scenario = std::env::args()
        .nth(1)
        .filter(|a| !a.starts_with("--"))
        .unwrap_or_else(|| "all".into());
    let model = Model::default();
    let ctx = Context::new(Pvrdma::probe(model.clone(), &model, Config::default()).unwrap());
    let gid = ctx
        .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
        .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    // An RC QP connected to itself (the doorbells are free: nothing runs), and a UD QP.
    let qp = pd
        .qp_builder(&cq, &cq)
        .caps(caps)
        .build::<Rc, 64, 64>()
        .unwrap();
    let qpn = qp.qp_num();
    let qp = qp
        .init(&ConnectedInit::default())
        .map_err(|(_, e)| e)
        .unwrap();
    let av = AddressVector::new(gid.gid(), 0);
    let qp = qp
        .rtr(&ConnectedRtr::new(qpn, 0, av))
        .map_err(|(_, e)| e)
        .unwrap();
    let qp = qp.rts(&ConnectedRts::new(0)).map_err(|(_, e)| e).unwrap();
    let udqp = pd
        .qp_builder(&cq, &cq)
        .caps(caps)
        .build::<Ud, 64, 64>()
        .unwrap();
    let udqp = udqp.ready(0x1111, 0).map_err(|(_, e)| e).unwrap();
    let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let sges: Vec<Sge> = (0..16).map(|i| mr.sge(i * 64, 64).unwrap()).collect();
    let sges: &'static [Sge] = Box::leak(sges.into_boxed_slice());
    let ud = Some(UdDest {
        av: AddressVector::new(gid.gid(), 0),
        remote_qpn: udqp.qp_num(),
        remote_qkey: 0x1111,
    });
    let send = |i: usize| SendWr {
        wr_id: i as u64,
        sg_list: &sges[i..=i],
        op: SendOp::Send,
        flags: SendFlags::SIGNALED,
        ud: None,
    };
    let recv = |i: usize| RecvWr {
        wr_id: i as u64,
        sg_list: &sges[i..=i],
    };
    let mut b = Bench {
        model: &model,
        qp,
        ud: udqp,
        ud_send1: [SendWr { ud, ..send(0) }],
        cq: &cq,
        send1: [send(0)],
        send16: core::array::from_fn(send),
        recv1: [recv(0)],
        recv16: core::array::from_fn(recv),
        wc: [WorkCompletion::default(); 16],
    };
    model.set_free_doorbells(true);
    let run = |name: &str| scenario == "all" || scenario == name;
    if run("post_send_1") {
        for _ in 0..REPS {
            bench_post_send_1(&mut b);
            settle(&mut b, 1);
        }
    }
    if run("post_send_ud_1") {
        for _ in 0..REPS {
            bench_post_send_ud_1(&mut b);
            settle(&mut b, 1);
        }
    }
    if run("post_send_16") {
        for _ in 0..REPS {
            bench_post_send_16(&mut b);
            settle(&mut b, 16);
        }
    }
    if run("post_recv_1") {
        for _ in 0..REPS {
            bench_post_recv_1(&mut b);
            settle(&mut b, 1);
        }
    }
    if run("post_recv_16") {
        for _ in 0..REPS {
            bench_post_recv_16(&mut b);
            settle(&mut b, 16);
        }
    }
    let handle = cq.raw().handle();
    let qph = b.qp.raw().handle();
    if run("poll_1") {
        for i in 0..REPS {
            model.inject_cqe(handle, qph, i as u64);
            assert_eq!(bench_poll_1(&mut b), 1);
        }
    }
    if run("poll_16") {
        for _ in 0..REPS {
            for i in 0..16 {
                model.inject_cqe(handle, qph, i);
            }
            assert_eq!(bench_poll_16(&mut b), 16);
        }
    }
    if run("poll_empty") {
        for _ in 0..REPS {
            assert_eq!(bench_poll_empty(&mut b), 0);
        }
    }
    model.set_free_doorbells(false);
    drop(b);
    drop(mr);
    drop(cq);
    drop(pd);
    drop(gid);
    drop(ctx);
    assert_eq!(model.outstanding_pages(), 0);
    assert!(model.violations().is_empty(), "{:?}", model.violations());
    println!("scenario {scenario}: ok");
}
