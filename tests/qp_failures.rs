//! Queue pairs' failure paths on the device model: every failure of QP creation leaves nothing
//! behind, a failed destroy hands the QP back and drop never panics, garbage from the device's
//! create is refused and never trusted (names nothing, keeps its PD and CQ in use), a PD, CQ or
//! SRQ a leaked QP or SRQ uses refuses destroy with `Busy`, GSI can be created after its
//! control block's allocation failed, and a version-20 device answers with a separate handle.

mod common;

use bareverbs::Error;
use bareverbs::error::{DeviceStatus, Fault, Feature, Op, Resource};
use bareverbs::verbs::*;
use bareverbs_model::{Garbage, Model, ModelConfig};
use common::*;

#[test]
fn every_failure_of_qp_creation_leaves_nothing_behind() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(128).unwrap(); // room for the 64 + 64 of the create
    let other = ctx.create_cq(1).unwrap();
    let base = model.outstanding_pages();
    let build = || pd.qp_builder(&cq, &cq).caps(caps(64, 64, 2)).build::<Rc>();
    // Each DMA allocation of the create: the ring pages, then their directory (before the
    // device is asked), then the control block (after: the device's QP is destroyed again).
    for (nth, commands) in [(1, 0), (2, 0), (3, 2)] {
        let before = model.commands();
        model.fail_dma_alloc(nth);
        assert!(matches!(
            build().err(),
            Some(Error::Resource(Resource::Dma { .. }))
        ));
        assert_eq!(model.outstanding_pages(), base, "allocation {nth}");
        assert_eq!(model.commands() - before, commands, "allocation {nth}");
        assert_eq!(model.objects().qps, 0);
        assert_eq!(reserved(&pd, &cq, &other), 0, "CQ entries given back");
    }
    // The one command of the create, with each errno.
    for (errno, want) in [
        (
            22,
            Error::Device {
                op: Op::CreateQp,
                status: DeviceStatus::Errno(22),
            },
        ),
        (
            5,
            Error::Device {
                op: Op::CreateQp,
                status: DeviceStatus::Errno(5),
            },
        ),
        (
            12,
            Error::Resource(Resource::Device {
                op: Op::CreateQp,
                errno: 12,
            }),
        ),
        (1, Error::Permission { op: Op::CreateQp }),
    ] {
        model.fail_command(1, errno);
        assert_eq!(build().err(), Some(want));
        assert_eq!(model.outstanding_pages(), base);
        assert_eq!(model.objects().qps, 0);
        assert_eq!(reserved(&pd, &cq, &other), 0, "CQ entries given back");
    }
    // The same for an SRQ.
    for nth in 1..=2 {
        model.fail_dma_alloc(nth);
        let e = pd.create_srq(SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        });
        assert!(matches!(
            e.err(),
            Some(Error::Resource(Resource::Dma { .. }))
        ));
    }
    model.fail_command(1, 22);
    assert!(
        pd.create_srq(SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0
        })
        .is_err()
    );
    assert_eq!((model.outstanding_pages(), model.objects().srqs), (base, 0));
    // A create that still succeeds afterwards: the driver's counts are right.
    drop(build().unwrap());
    drop(other);
    drop(cq);
    drop(pd);
    teardown(&model, ctx);
}

#[test]
fn destroy_failures_hand_the_qp_back_and_drop_never_panics() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(32).unwrap();
    let qp = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let qpn = qp.qp_num();
    model.fail_command(1, 16);
    let (qp, e) = qp.destroy().expect_err("busy");
    assert_eq!(e, Error::Busy { op: Op::DestroyQp });
    assert_eq!(qp.qp_num(), qpn);
    qp.destroy().unwrap();
    assert_eq!(model.objects().qps, 0);

    // Multicast does not exist on PVRDMA, so a QP is never attached.
    let mut qp = pd.qp_builder(&cq, &cq).build::<Ud>().unwrap();
    assert_eq!(
        qp.attach_mcast(Gid([0xFF; 16]), 0).err(),
        Some(unsupported(Feature::Multicast))
    );
    // A silent device: Drop cannot destroy, keeps the QP's memory (rings, their directory and
    // table, the control block), and does not panic.
    let kept_qp = qp.raw().pages() + 2 + 1;
    let kept_cq = cq.raw().pages() + 2;
    model.set_silent(true);
    drop(qp);
    model.set_silent(false);
    assert_eq!(model.objects().qps, 1);
    // The device still has the QP, so its CQ and PD are still in use: destroying them is Busy
    // (the device is not asked, and so never drops them under the QP), and Drop keeps them.
    let commands = model.commands();
    let (cq, e) = cq.destroy().expect_err("in use");
    assert!(
        matches!(
            e,
            Error::InUse {
                op: Op::DestroyCq,
                holder: bareverbs::error::Holder::Qps,
                ..
            }
        ),
        "{e:?}"
    );
    let (pd, e) = pd.destroy().expect_err("in use");
    assert!(
        matches!(
            e,
            Error::InUse {
                op: Op::DestroyPd,
                holder: bareverbs::error::Holder::PdObjects,
                ..
            }
        ),
        "{e:?}"
    );
    drop(cq);
    drop(pd);
    assert_eq!(model.commands(), commands, "the device was not asked");
    drop(ctx);
    assert_eq!(
        model.outstanding_pages(),
        kept_qp + kept_cq,
        "only the undestroyable QP's memory, and its CQ's ring, are kept"
    );
    assert_clean(&model);
}

#[test]
fn garbage_from_create_qp_is_refused_and_never_trusted() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(32).unwrap();
    let pages = model.outstanding_pages();
    model.garbage_next(Garbage::Payload);
    let e = pd.qp_builder(&cq, &cq).build::<Rc>().err();
    // The answer's QP number, handle and caps are all 0xA5A5A5A5; the driver names the first
    // it checks (now the echoed caps; the QP number before data path v2).
    assert!(
        matches!(
            e,
            Some(Error::Protocol {
                op: Op::CreateQp,
                fault: Fault::Value {
                    value: 0xA5A5_A5A5,
                    ..
                }
            })
        ),
        "{e:?}"
    );
    // The device made a QP the driver cannot name: its memory stays (rings, their directory
    // and table, the control block), never handed back while the device may use it.
    assert_eq!(model.outstanding_pages() - pages, 3 + 2 + 1);
    assert_eq!(model.objects().qps, 1);
    // A garbled query is refused too.
    let qp = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    model.garbage_next(Garbage::Payload);
    assert!(matches!(
        qp.query(),
        Err(Error::Protocol {
            op: Op::QueryQp,
            ..
        })
    ));
    drop(qp);
    drop(cq);
    drop(pd);
    drop(ctx);
    // The garbled QP stays on the device; nothing but its PD and CQ can be affected (whether
    // they may be destroyed under it: the ignored driver-bug test below).
    assert_eq!(model.objects().qps, 1);
    assert!(
        model
            .violations()
            .iter()
            .all(|v| v == "CQ 0 destroyed while a QP uses it"
                || v == "PD 0 destroyed while a QP or SRQ uses it"),
        "{:?}",
        model.violations()
    );
}

/// What a garbled CREATE_QP answer should leave, as the driver does for a garbled handle with
/// sane caps (and for memory regions): no command naming the garbage, and the PD and CQ kept in
/// use by the QP the device still has.
#[test]
fn garbage_from_create_qp_names_nothing_and_keeps_its_pd_and_cq_in_use() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(32).unwrap();
    let commands = model.commands();
    model.garbage_next(Garbage::Payload);
    assert!(pd.qp_builder(&cq, &cq).build::<Rc>().is_err());
    assert_eq!(
        model.commands(),
        commands + 1,
        "no command names the garbage handle"
    );
    let (cq, e) = cq.destroy().expect_err("the device's QP completes to it");
    assert!(
        matches!(
            e,
            Error::InUse {
                op: Op::DestroyCq,
                holder: bareverbs::error::Holder::Qps,
                ..
            }
        ),
        "{e:?}"
    );
    let (pd, e) = pd.destroy().expect_err("the device's QP is in it");
    let holder = bareverbs::error::Holder::PdObjects;
    assert_eq!(
        e,
        Error::InUse {
            op: Op::DestroyPd,
            holder,
            count: 1
        }
    );
    drop((cq, pd));
    drop(ctx);
    assert_clean(&model);
}

/// A QP that was leaked (`mem::forget`: safe code, the borrow checker no longer sees it) still
/// uses its PD, CQ and SRQ on the device: destroying them is refused (`InUse`, naming the QPs
/// or the PD's objects that hold them), before the device is asked,
/// and each is handed back; their Drop keeps them (logged), never panics.
#[test]
fn a_pd_cq_and_srq_used_by_a_leaked_qp_refuse_destroy_with_busy() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(32).unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let qp = pd.qp_builder(&cq, &cq).srq(&srq).build::<Rc>().unwrap();
    std::mem::forget(qp);
    let commands = model.commands();
    let (srq, e) = srq.destroy().expect_err("in use");
    let holder = bareverbs::error::Holder::Qps;
    assert_eq!(
        e,
        Error::InUse {
            op: Op::DestroySrq,
            holder,
            count: 1
        }
    );
    drop(srq);
    let (cq, e) = cq.destroy().expect_err("in use");
    assert!(
        matches!(
            e,
            Error::InUse {
                op: Op::DestroyCq,
                holder: bareverbs::error::Holder::Qps,
                ..
            }
        ),
        "{e:?}"
    );
    drop(cq);
    let (pd, e) = pd.destroy().expect_err("in use");
    assert!(
        matches!(
            e,
            Error::InUse {
                op: Op::DestroyPd,
                holder: bareverbs::error::Holder::PdObjects,
                ..
            }
        ),
        "{e:?}"
    );
    drop(pd);
    assert_eq!(model.commands(), commands, "the device was not asked");
    let o = model.objects();
    assert_eq!((o.pds, o.cqs, o.srqs, o.qps), (1, 1, 1, 1));
    drop(ctx);
    assert_clean(&model);
}

/// The same for a leaked SRQ and its PD.
#[test]
fn a_pd_used_by_a_leaked_srq_refuses_destroy_with_busy() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    std::mem::forget(srq);
    let (pd, e) = pd.destroy().expect_err("in use");
    assert!(
        matches!(
            e,
            Error::InUse {
                op: Op::DestroyPd,
                holder: bareverbs::error::Holder::PdObjects,
                ..
            }
        ),
        "{e:?}"
    );
    drop(pd);
    drop(ctx);
    assert_clean(&model);
}

/// QP1 whose control block cannot be allocated (after the device made it) is destroyed on the
/// device again: a later QP1 create must be possible.
#[test]
fn gsi_can_be_created_after_its_control_block_allocation_failed() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(32).unwrap();
    model.fail_dma_alloc(3); // rings, directory, then the control block
    let e = pd.qp_builder(&cq, &cq).build::<Gsi>().err();
    assert!(matches!(e, Some(Error::Resource(Resource::Dma { .. }))));
    assert_eq!(model.objects().qps, 0, "destroyed on the device");
    let gsi = pd
        .qp_builder(&cq, &cq)
        .build::<Gsi>()
        .map_err(|e| e.to_string());
    assert_eq!(gsi.map(|q| q.qp_num()), Ok(1));
    drop(cq);
    drop(pd);
    teardown(&model, ctx);
}

#[test]
fn version_20_devices_answer_with_a_separate_handle() {
    let model = Model::new(ModelConfig {
        version: 20,
        ..Default::default()
    });
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(32).unwrap();
    let qp = pd
        .qp_builder(&cq, &cq)
        .caps(caps(8, 8, 2))
        .build::<Rc>()
        .unwrap();
    assert_eq!(qp.raw().handle(), qp.qp_num());
    assert_eq!(qp.caps(), caps(8, 8, 2));
    drop(qp);
    drop(cq);
    drop(pd);
    teardown(&model, ctx);
}
