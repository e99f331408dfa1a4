//! Protection domains, completion queues and GID bindings on the device model: sizes, limits,
//! create/destroy loops with no DMA page left behind.

mod common;

use bareverbs::Error;
use bareverbs::error::{Object, Param, Resource};
use bareverbs::{Gid, Provider};
use bareverbs_model::{Model, ModelConfig};
use common::*;

#[test]
fn pd_create_destroy_loops_of_1_to_200_leave_nothing() {
    let model = model();
    let ctx = up(&model);
    for n in 1..=200 {
        let pds: Vec<_> = (0..n).map(|_| ctx.alloc_pd().unwrap()).collect();
        assert_eq!(model.objects().pds, n);
        // Handles are distinct.
        let mut h: Vec<_> = pds.iter().map(|p| p.raw().handle()).collect();
        h.sort();
        h.dedup();
        assert_eq!(h.len(), n);
        for pd in pds {
            pd.destroy().unwrap();
        }
        assert_eq!(model.objects().pds, 0);
        assert_eq!(model.outstanding_pages(), DEVICE_PAGES);
    }
    teardown(&model, ctx);
}

#[test]
fn cq_create_destroy_loops_of_1_to_200_leave_nothing() {
    let model = model();
    let ctx = up(&model);
    for n in 1..=200u32 {
        // Sizes vary with the loop: 1 to 256 entries.
        let cqs: Vec<_> = (0..n)
            .map(|i| ctx.create_cq(1 + (i * 37 + n) % 256).unwrap())
            .collect();
        assert_eq!(model.objects().cqs, n as usize);
        drop(cqs); // Drop destroys, too
        assert_eq!(model.objects().cqs, 0);
        assert_eq!(model.outstanding_pages(), DEVICE_PAGES, "loop {n}");
    }
    teardown(&model, ctx);
}

#[test]
fn cq_sizes_round_to_powers_of_two_with_pages_to_match() {
    let model = model();
    let ctx = up(&model);
    // (requested, actual entries, ring pages including the ring-state page)
    for (req, entries, pages) in [
        (0, 1, 2),
        (1, 1, 2),
        (3, 4, 2),
        (64, 64, 2),
        (65, 128, 3),
        (1000, 1024, 17),
        (4096, 4096, 65),
    ] {
        let before = model.outstanding_pages();
        let cq = ctx.create_cq(req).unwrap();
        assert_eq!(cq.entries(), entries, "request {req}");
        assert!(cq.entries() >= req);
        assert_eq!(cq.raw().pages(), pages, "request {req}");
        // Ring pages + one directory page + one table page.
        assert_eq!(model.outstanding_pages() - before, pages + 2);
        cq.destroy().unwrap();
    }
    assert_eq!(
        ctx.create_cq(4097).err(),
        Some(Error::InvalidInput {
            param: Param::CqEntries,
            value: 4097,
            max: 4096
        })
    );
    assert_eq!(
        ctx.create_cq(u32::MAX).err().map(|e| e.kind()),
        Some(bareverbs::ErrorKind::InvalidInput)
    );
    teardown(&model, ctx);
}

#[test]
fn cq_limit_follows_a_smaller_max_cqe() {
    let mut cfg = ModelConfig::default();
    cfg.caps.max_cqe = 100;
    let model = Model::new(cfg);
    let ctx = up(&model);
    assert_eq!(ctx.provider().max_cq_entries(), 64);
    assert!(ctx.create_cq(64).is_ok());
    assert_eq!(
        ctx.create_cq(65).err(),
        Some(Error::InvalidInput {
            param: Param::CqEntries,
            value: 65,
            max: 64
        })
    );
    teardown(&model, ctx);
}

#[test]
fn tables_fill_to_the_device_limit_and_no_further() {
    let mut cfg = ModelConfig::default();
    cfg.caps.max_pd = 4;
    cfg.caps.max_cq = 3;
    let model = Model::new(cfg);
    let ctx = up(&model);
    let pds: Vec<_> = (0..4).map(|_| ctx.alloc_pd().unwrap()).collect();
    let commands = model.commands();
    assert_eq!(
        ctx.alloc_pd().err(),
        Some(Error::Resource(Resource::Objects {
            object: Object::Pd,
            limit: 4
        }))
    );
    let cqs: Vec<_> = (0..3).map(|_| ctx.create_cq(8).unwrap()).collect();
    let pages = model.outstanding_pages();
    assert_eq!(
        ctx.create_cq(8).err(),
        Some(Error::Resource(Resource::Objects {
            object: Object::Cq,
            limit: 3
        }))
    );
    assert_eq!(
        model.outstanding_pages(),
        pages,
        "refused before allocating"
    );
    assert_eq!(
        model.commands(),
        commands + 3,
        "the device was never asked for a 5th PD or 4th CQ"
    );
    // Freeing one makes room again.
    drop(pds.into_iter().next());
    assert!(ctx.alloc_pd().is_ok());
    drop(cqs);
    teardown(&model, ctx);
}

#[test]
fn gid_bindings_reach_the_device_and_are_removed_on_drop() {
    let model = model();
    let ctx = up(&model);
    let gid = Gid::link_local_from_mac([0x52, 0x54, 0x00, 0x12, 0x34, 0x57]);
    assert_eq!(
        gid.0,
        [
            0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0x00, 0xFF, 0xFE, 0x12, 0x34, 0x57
        ]
    );
    let b = ctx.bind_gid(1, gid).unwrap();
    assert_eq!((b.index(), b.gid()), (1, gid));
    assert_eq!(model.gid(1), Some(gid.0));
    assert_eq!(
        ctx.bind_gid(1, gid).err(),
        Some(Error::Busy {
            op: bareverbs::error::Op::BindGid
        })
    );
    let v4 = ctx.bind_gid(2, Gid::from_ipv4([10, 0, 2, 15])).unwrap();
    assert_eq!(model.gid(2).unwrap()[10..], [0xFF, 0xFF, 10, 0, 2, 15]);
    v4.unbind().unwrap();
    assert_eq!(model.gid(2), None);
    assert_eq!(
        ctx.bind_gid(255, gid).err(),
        Some(Error::InvalidInput {
            param: Param::GidIndex,
            value: 255,
            max: 254
        })
    );
    drop(b);
    assert_eq!(model.gid(1), None);
    assert_eq!(model.objects().gids, 0);
    teardown(&model, ctx);
}

#[test]
fn the_provider_reports_the_same_caps_as_the_context() {
    let model = model();
    let ctx = up(&model);
    assert_eq!(ctx.caps(), Provider::caps(ctx.provider()));
    let dev = ctx.into_provider();
    assert_eq!(dev.version(), 17);
    drop(dev);
    assert_eq!(model.outstanding_pages(), 0);
    assert_clean(&model);
}

/// The verbs objects can be shared between threads, as `ibverbs` users expect (`Send + Sync`):
/// checked at compile time.
#[test]
fn verbs_objects_are_send_and_sync() {
    use bareverbs::device::pvrdma::Pvrdma;
    use bareverbs::verbs::*;
    fn send_sync<T: Send + Sync>() {}
    type P = Pvrdma<Model>;
    send_sync::<Context<P>>();
    send_sync::<ProtectionDomain<'static, P>>();
    send_sync::<CompletionQueue<'static, P>>();
    send_sync::<QueuePair<'static, P, Rc, Rts>>();
    send_sync::<QueuePair<'static, P, Ud, Reset>>();
    send_sync::<SharedReceiveQueue<'static, P>>();
    send_sync::<MemoryRegion<'static, P>>();
    send_sync::<BufferPool<'static, P>>();
    send_sync::<AddressHandle<'static, P>>();
    send_sync::<GidBinding<'static, P>>();
    send_sync::<bareverbs::Error>();
    // A buffer of the safe path moves between threads (one owner at a time): Send only.
    fn send<T: Send>() {}
    send::<Buf<'static, P>>();
    // Both devices meet the one bound multi-core code names.
    fn shared<T: SharedProvider>() {}
    shared::<P>();
    use bareverbs::device::rxe::Rxe;
    use bareverbs_model::link::{MemLink, TestClock};
    shared::<Rxe<Model, MemLink, TestClock>>();
}

/// A PD still used by a memory region is refused destruction with `Busy`, before the device is
/// asked — even when the region was leaked (`mem::forget`), where the borrow checker cannot see
/// the use: the device would otherwise drop a PD under a region it still maps.
#[test]
fn a_pd_used_by_a_leaked_memory_region_refuses_destroy_with_busy() {
    use bareverbs::error::Op;
    use bareverbs::verbs::AccessFlags;
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    std::mem::forget(mr);
    let commands = model.commands();
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
    assert_eq!(model.commands(), commands, "the device was not asked");
    drop(pd); // Drop cannot destroy it either: logged and leaked, no panic
    assert_eq!(model.commands(), commands);
    assert_eq!(model.objects().pds, 1);
    drop(ctx);
    assert_eq!(
        model.outstanding_pages(),
        1 + 2,
        "only the leaked region's page and its directory and table are kept"
    );
    assert_clean(&model);
}
