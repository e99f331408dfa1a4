//! What the errors say: each `Display` text names what was asked, what was possible and what
//! holds what, in prose (no `Debug` names), on the software RoCE device.

mod common;

use bareverbs::Context;
use bareverbs::device::rxe::{Config, MAX_INLINE, MAX_WR, Rxe};
use bareverbs::error::{Error, ErrorKind, Feature, Holder, Op, Param, Unsupported};
use bareverbs::verbs::*;
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};
use common::rc_to_rts;

type R = Rxe<Model, MemLink, TestClock>;

fn ctx() -> Context<R> {
    let seg = Segment::new();
    let link = seg.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    let model = Model::new(ModelConfig::default());
    let rxe = Rxe::new(
        model,
        link,
        TestClock::default(),
        Config { ip: [10, 0, 0, 2] },
    );
    Context::new(rxe.unwrap())
}

/// An RC QP at RTS, connected to itself through the device's loopback.
fn loopback(qp: QueuePair<'_, R, Rc, Reset>) -> QueuePair<'_, R, Rc, Rts> {
    let me = qp.qp_num();
    let av = AddressVector::new(Gid::from_ipv4([10, 0, 0, 2]), 1);
    rc_to_rts(
        qp,
        &ConnectedInit::default(),
        &ConnectedRtr::new(me, 0, av),
        &ConnectedRts::new(0),
    )
}

#[test]
fn a_completion_queue_in_use_says_how_many_queue_pairs_hold_it() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let other = ctx.create_cq(16).unwrap();
    // Two QPs complete on `cq` (one of them receives on `other`): leaked, so they hold it.
    core::mem::forget(pd.qp_builder(&cq, &cq).build::<Rc>().unwrap());
    core::mem::forget(pd.qp_builder(&cq, &other).build::<Rc>().unwrap());
    let (cq, e) = cq.destroy().err().unwrap();
    assert_eq!(
        e,
        Error::InUse {
            op: Op::DestroyCq,
            holder: Holder::Qps,
            count: 2
        }
    );
    assert_eq!(e.kind(), ErrorKind::Busy);
    assert_eq!(
        e.to_string(),
        "destroying a completion queue: still used by 2 queue pair(s); destroy those queue \
         pairs first"
    );
    let (_, e) = other.destroy().err().unwrap();
    assert_eq!(
        e.to_string(),
        "destroying a completion queue: still used by 1 queue pair(s); destroy those queue \
         pairs first"
    );
    core::mem::forget(cq);
}

#[test]
fn a_protection_domain_in_use_says_what_holds_it() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    core::mem::forget(pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap());
    let (pd, e) = pd.destroy().err().unwrap();
    assert_eq!(
        e.to_string(),
        "destroying a protection domain: still used by 1 object(s) of the protection domain \
         (queue pairs, shared receive queues, memory regions); destroy them first"
    );
    core::mem::forget(pd);
}

#[test]
fn a_depth_beyond_the_device_names_the_parameter_the_ask_and_the_limit() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let e = pd
        .qp_builder(&cq, &cq)
        .caps(QpCaps {
            max_send_wr: MAX_WR + 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .build::<Rc>()
        .err()
        .unwrap();
    assert_eq!(
        e,
        Error::InvalidInput {
            param: Param::MaxSendWr,
            value: u64::from(MAX_WR + 1),
            max: u64::from(MAX_WR)
        }
    );
    assert_eq!(
        e.to_string(),
        format!(
            "max_send_wr of {} asked, at most {MAX_WR} possible",
            MAX_WR + 1
        )
    );
}

#[test]
fn unsupported_features_read_as_prose() {
    let e = Error::Unsupported(Unsupported::Feature(Feature::InlineData));
    assert_eq!(
        e.to_string(),
        "unsupported: inline data beyond the queue pair's max_inline_data (or on a READ/atomic)"
    );
    assert!(!e.to_string().contains("Feature("), "no Debug output");
    // As the device reports it: a send longer than the QP's inline room.
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qp = pd
        .qp_builder(&cq, &cq)
        .caps(QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 1,
        })
        .build::<Rc>()
        .unwrap();
    let mut qp = loopback(qp);
    let big = [0u8; MAX_INLINE as usize + 1];
    let mut b = qp.send_batch();
    let e = b.send_inline(1, SendFlags::SIGNALED, &big).err();
    drop(b);
    assert_eq!(
        e,
        Some(Error::Unsupported(Unsupported::Feature(
            Feature::InlineData
        )))
    );
}

#[test]
fn every_text_is_prose() {
    // No `Debug` spelling (a CamelCase name or a brace) in any error the crate makes.
    let all = [
        Error::InvalidInput {
            param: Param::CqEntries,
            value: 20000,
            max: 16384,
        },
        Error::Busy { op: Op::PollCq },
        Error::Busy { op: Op::DestroySrq },
        Error::QueueFull {
            queue: bareverbs::error::Queue::Cq,
            free: 3,
        },
        Error::QueueFull {
            queue: bareverbs::error::Queue::Send,
            free: 0,
        },
        Error::Resource(bareverbs::error::Resource::Objects {
            object: bareverbs::error::Object::Qp,
            limit: 64,
        }),
        Error::Timeout { op: Op::CreateQp },
    ];
    for e in all {
        let t = e.to_string();
        assert!(
            !t.contains('{') && !t.contains("Op") && !t.contains("Param") && !t.contains("Cq "),
            "{t}"
        );
    }
    assert_eq!(
        all[3].to_string(),
        "completion queue full: room for 3 more completions (each request outstanding needs \
         one until its completion is polled); nothing was posted: poll the completion queue, \
         or create it larger"
    );
    assert_eq!(
        all[1].to_string(),
        "polling a completion queue: another thread is polling it; poll again"
    );
    // What a PVRDMA QP on a shared receive queue needs on its receive CQ, and what else holds
    // a completion queue.
    let srq = Error::InvalidInput {
        param: Param::SrqCqRoom,
        value: 2048,
        max: 16,
    };
    assert_eq!(
        srq.to_string(),
        "creating a queue pair: its shared receive queue's 2048 receives may all complete on \
         its receive completion queue, which has room for 16 more; create that completion \
         queue larger, or the shared receive queue smaller"
    );
    // A resize below the receives a shared receive queue holds.
    let in_use = Error::InvalidInput {
        param: Param::SrqWrInUse,
        value: 10,
        max: 4,
    };
    assert_eq!(
        in_use.to_string(),
        "modifying a shared receive queue: 4 receives asked, but 10 are posted and not yet \
         taken; ask for at least 10, or resize once they have completed"
    );
    let unacked = Error::InUse {
        op: Op::DestroyCq,
        holder: Holder::UnackedEvents,
        count: 2,
    };
    assert_eq!(
        unacked.to_string(),
        "destroying a completion queue: still used by 2 completion event(s) taken and not \
         acknowledged; acknowledge them first (ack_events)"
    );
}
