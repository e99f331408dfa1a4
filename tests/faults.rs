//! Fault injection: every command failing with each errno, every DMA allocation failing, a
//! device that stops answering, a device that answers garbage. Each yields its typed error,
//! never a panic, and nothing leaks.

mod common;

use bareverbs::Error;
use bareverbs::error::{DeviceStatus, Fault, Op, Resource};
use bareverbs::{CompletionQueue, Gid};
use bareverbs_model::Garbage;
use common::*;

type Cq<'a> = CompletionQueue<'a, bareverbs::device::pvrdma::Pvrdma<bareverbs_model::Model>>;

/// The error each injected errno must become, for an operation `op`.
fn expected(op: Op, errno: u32) -> Error {
    match errno {
        1 => Error::Permission { op },
        12 => Error::Resource(Resource::Device { op, errno }),
        16 => Error::Busy { op },
        _ => Error::Device {
            op,
            status: DeviceStatus::Errno(errno),
        },
    }
}

const ERRNOS: [u32; 6] = [1, 5, 12, 16, 22, 95];

#[test]
fn each_command_failing_with_each_errno_gives_its_typed_error_and_leaks_nothing() {
    for errno in ERRNOS {
        let model = model();
        let ctx = up(&model);

        model.fail_command(1, errno);
        assert_eq!(
            ctx.query_port(1).err(),
            Some(expected(Op::QueryPort, errno))
        );
        model.fail_command(1, errno);
        assert_eq!(
            ctx.query_pkey(1, 0).err(),
            Some(expected(Op::QueryPkey, errno))
        );

        model.fail_command(1, errno);
        assert_eq!(ctx.alloc_pd().err(), Some(expected(Op::CreatePd, errno)));
        model.fail_command(1, errno);
        assert_eq!(
            ctx.create_cq(100).err(),
            Some(expected(Op::CreateCq, errno))
        );
        assert_eq!(model.outstanding_pages(), DEVICE_PAGES, "CQ ring returned");
        model.fail_command(1, errno);
        assert_eq!(
            ctx.bind_gid(3, Gid([1; 16])).err(),
            Some(expected(Op::BindGid, errno))
        );
        assert_eq!(model.objects().gids, 0);

        // Destroys that fail hand the object back; a retry succeeds.
        let pd = ctx.alloc_pd().unwrap();
        model.fail_command(1, errno);
        let (pd, e) = pd.destroy().expect_err("destroy must fail");
        assert_eq!(e, expected(Op::DestroyPd, errno));
        pd.destroy().unwrap();

        let cq = ctx.create_cq(100).unwrap();
        model.fail_command(1, errno);
        let (cq, e) = cq.destroy().expect_err("destroy must fail");
        assert_eq!(e, expected(Op::DestroyCq, errno));
        assert_eq!(model.objects().cqs, 1, "still on the device");
        cq.destroy().unwrap();

        let gid = ctx.bind_gid(4, Gid([2; 16])).unwrap();
        model.fail_command(1, errno);
        assert_eq!(gid.unbind().err(), Some(expected(Op::UnbindGid, errno)));

        assert_eq!(model.objects().pds + model.objects().cqs, 0);
        teardown(&model, ctx);
    }
}

#[test]
fn the_driver_still_counts_right_after_failures() {
    // A failed create must not count against the table, a failed destroy must not free a slot.
    let mut cfg = bareverbs_model::ModelConfig::default();
    cfg.caps.max_pd = 2;
    let model = bareverbs_model::Model::new(cfg);
    let ctx = up(&model);
    model.fail_command(1, 12);
    assert!(ctx.alloc_pd().is_err());
    let a = ctx.alloc_pd().unwrap();
    let b = ctx.alloc_pd().unwrap();
    model.fail_command(1, 5);
    let (a, _) = a.destroy().err().unwrap();
    assert!(matches!(ctx.alloc_pd(), Err(Error::Resource(_))));
    drop((a, b));
    teardown(&model, ctx);
}

#[test]
fn dma_exhaustion_at_each_cq_allocation_leaks_nothing() {
    let model = model();
    let ctx = up(&model);
    for nth in 1..=2 {
        model.fail_dma_alloc(nth);
        let e = ctx.create_cq(512).err();
        assert!(
            matches!(e, Some(Error::Resource(Resource::Dma { .. }))),
            "allocation {nth}: {e:?}"
        );
        assert_eq!(model.outstanding_pages(), DEVICE_PAGES);
        assert_eq!(model.objects().cqs, 0, "the device was not asked");
    }
    teardown(&model, ctx);
}

#[test]
fn a_device_that_stops_answering_times_out_everywhere() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    model.set_silent(true);
    assert_eq!(
        ctx.query_port(1).err(),
        Some(Error::Timeout { op: Op::QueryPort })
    );
    assert_eq!(
        ctx.alloc_pd().err(),
        Some(Error::Timeout { op: Op::CreatePd })
    );
    let before = model.outstanding_pages();
    assert_eq!(
        ctx.create_cq(16).err(),
        Some(Error::Timeout { op: Op::CreateCq })
    );
    // Unknown outcome: the device may have created the CQ, so its ring is kept, not freed.
    let kept = model.outstanding_pages() - before;
    assert_eq!(kept, 2 + 2);
    assert_eq!(
        ctx.bind_gid(1, Gid([3; 16])).err(),
        Some(Error::Timeout { op: Op::BindGid })
    );
    assert_eq!(
        model.outstanding_pages(),
        DEVICE_PAGES + cq.raw().pages() + 2 + kept
    );
    let (pd, e) = pd.destroy().err().unwrap();
    assert_eq!(e, Error::Timeout { op: Op::DestroyPd });
    let (cq, e): (Cq<'_>, _) = cq.destroy().err().unwrap();
    assert_eq!(e, Error::Timeout { op: Op::DestroyCq });
    // The device comes back: the objects handed back can be destroyed.
    model.set_silent(false);
    drop(pd);
    cq.destroy().unwrap();
    drop(ctx);
    assert_eq!(
        model.outstanding_pages(),
        kept,
        "only the timed-out create's ring is kept"
    );
    assert_clean(&model);
}

#[test]
fn dropping_while_the_device_is_silent_never_panics_and_keeps_the_ring() {
    let model = model();
    let ctx = up(&model);
    let cq = ctx.create_cq(64).unwrap();
    let ring_pages = cq.raw().pages() + 2;
    model.set_silent(true);
    drop(cq); // cannot be destroyed: its memory must not go back while the device may use it
    assert_eq!(model.outstanding_pages(), DEVICE_PAGES + ring_pages);
    assert_eq!(model.objects().cqs, 1);
    drop(ctx);
    assert_eq!(
        model.outstanding_pages(),
        ring_pages,
        "only the undestroyable CQ's ring is kept"
    );
    assert_clean(&model);
}

#[test]
fn a_rejected_command_is_a_typed_error() {
    let model = model();
    let ctx = up(&model);
    model.reject_next();
    assert_eq!(
        ctx.alloc_pd().err(),
        Some(Error::Device {
            op: Op::CreatePd,
            status: DeviceStatus::Rejected
        })
    );
    assert!(ctx.alloc_pd().is_ok(), "the next command runs");
    teardown(&model, ctx);
}

#[test]
fn garbage_responses_are_refused_cleanly() {
    let model = model();
    let ctx = up(&model);
    let ack = |op, code: u32| Error::Protocol {
        op,
        fault: Fault::Ack {
            expected: 0x8000_0000 | code,
            found: 0xA5A5_A5A5,
        },
    };
    let value = |op, field, value| Error::Protocol {
        op,
        fault: Fault::Value { field, value },
    };

    model.garbage_next(Garbage::Everything);
    assert_eq!(ctx.query_port(1).err(), Some(ack(Op::QueryPort, 0)));
    model.garbage_next(Garbage::Payload);
    assert_eq!(
        ctx.query_port(1).err(),
        Some(value(Op::QueryPort, &"port state", 0xA5A5_A5A5))
    );

    model.garbage_next(Garbage::Everything);
    assert_eq!(ctx.alloc_pd().err(), Some(ack(Op::CreatePd, 2)));
    model.garbage_next(Garbage::Payload);
    assert_eq!(
        ctx.alloc_pd().err(),
        Some(value(Op::CreatePd, &"pd_handle", 0xA5A5_A5A5))
    );

    // A 32-entry CQ: 2 ring pages + directory + table.
    let cq_pages = 4;
    model.garbage_next(Garbage::Everything);
    assert_eq!(ctx.create_cq(32).err(), Some(ack(Op::CreateCq, 6)));
    assert_eq!(
        model.outstanding_pages(),
        DEVICE_PAGES + cq_pages,
        "ring kept: the device made the CQ"
    );
    model.garbage_next(Garbage::Payload);
    assert_eq!(
        ctx.create_cq(32).err(),
        Some(value(Op::CreateCq, &"cqe", 0xA5A5_A5A5))
    );
    // The garbled handle cannot be destroyed either: that ring is kept too.
    assert_eq!(model.outstanding_pages(), DEVICE_PAGES + 2 * cq_pages);

    // A P_Key is any 16-bit value: garbage there cannot be told from an answer.
    model.garbage_next(Garbage::Payload);
    assert_eq!(ctx.query_pkey(1, 0), Ok(0xA5A5));

    // A garbled destroy hands the object back; the retry works.
    let pd = ctx.alloc_pd().unwrap();
    model.garbage_next(Garbage::Everything);
    let (pd, e) = pd.destroy().err().unwrap();
    assert_eq!(e, ack(Op::DestroyPd, 3));
    pd.destroy().unwrap();

    // The device keeps the objects whose handle was garbled away (2 PDs, 2 CQs) — the driver
    // cannot name them — and the host keeps exactly those CQs' rings, nothing else.
    assert_eq!(model.objects().pds, 2);
    assert_eq!(model.objects().cqs, 2);
    drop(ctx);
    assert_eq!(model.outstanding_pages(), 2 * cq_pages);
    assert_clean(&model);
}
