//! The extended queries and the rest of the surface: GID entries with their type and "no
//! entry" for an empty index (`ibv_query_gid_ex`), the whole GID table refused into a buffer
//! too small (`ibv_query_gid_table`), a P_Key's index, the port's link layer, the device's
//! vendor id / page sizes / READ scatter limit, CQs on a completion vector, and
//! `ibv_rereg_mr`'s access change — on the software RoCE device and the PVRDMA model.

mod common;

use bareverbs::Context;
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::error::{Error, Feature, NotFound, Param, Unsupported};
use bareverbs::verbs::*;
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};
use common::rc_to_rts;

type R = Rxe<Model, MemLink, TestClock>;
const IP: [u8; 4] = [10, 0, 0, 2];

fn rxe() -> (Context<R>, Segment) {
    let seg = Segment::new();
    let link = seg.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    let model = Model::new(ModelConfig::default());
    let rxe = Rxe::new(model, link, TestClock::default(), Config { ip: IP }).unwrap();
    (Context::new(rxe), seg)
}

#[test]
fn rxe_gid_entries_carry_their_type_and_the_table_refuses_a_short_buffer() {
    let (ctx, _seg) = rxe();
    let e = ctx.query_gid_ex(1, 1).unwrap();
    assert_eq!(
        e,
        GidEntry {
            gid: Gid::from_ipv4(IP),
            gid_index: 1,
            port_num: 1,
            gid_type: GidType::RoceV2
        }
    );
    let mut all = [GidEntry::default(); 4];
    assert_eq!(ctx.query_gid_table(&mut all), Ok(2));
    assert_eq!(all[1], e);
    assert_eq!(all[0].gid_index, 0);
    let mut short = [GidEntry::default(); 1];
    let err = ctx.query_gid_table(&mut short).err();
    assert_eq!(
        err,
        Some(Error::InvalidInput {
            param: Param::GidTableBuffer,
            value: 1,
            max: 2
        })
    );
    assert_eq!(
        err.unwrap().to_string(),
        "a GID table buffer of 1 entries is too small: the device has 2 valid entries"
    );
}

#[test]
fn rxe_port_device_pkey_and_vectors() {
    let (ctx, _seg) = rxe();
    assert_eq!(ctx.query_port(1).unwrap().link_layer, LinkLayer::Ethernet);
    let c = ctx.caps();
    assert_eq!(c.vendor_id, 0x00FF_FFFF);
    assert!(c.page_size_cap & 0x1000 != 0, "4 KiB pages");
    assert!(c.max_sge_rd >= 1 && c.max_sge_rd <= c.max_sge);
    assert_eq!(ctx.pkey_index(1, 0xFFFF), Ok(0));
    assert_eq!(
        ctx.pkey_index(1, 0x8001),
        Err(Error::NotFound(NotFound::Pkey {
            port: 1,
            pkey: 0x8001
        }))
    );
    assert_eq!(ctx.num_comp_vectors(), 1);
    assert!(ctx.create_cq_on_vector(8, 0).is_ok());
    assert_eq!(
        ctx.create_cq_on_vector(8, 1).err(),
        Some(Error::InvalidInput {
            param: Param::CompVector,
            value: 1,
            max: 0
        })
    );
}

#[test]
fn pvrdma_gid_entries_say_no_entry_for_an_empty_index() {
    let model = common::model();
    let ctx = common::up(&model);
    assert_eq!(
        ctx.query_gid_ex(1, 0).err(),
        Some(Error::NotFound(NotFound::GidEntry { port: 1, index: 0 }))
    );
    let g = Gid::from_ipv4([10, 0, 2, 15]);
    let b = ctx.bind_gid(3, g).unwrap();
    let e = ctx.query_gid_ex(1, 3).unwrap();
    assert_eq!((e.gid, e.gid_index, e.port_num), (g, 3, 1));
    let mut out = [GidEntry::default(); 1];
    assert_eq!(ctx.query_gid_table(&mut out), Ok(1));
    assert_eq!(out[0], e);
    assert_eq!(
        ctx.query_gid_table(&mut []).err().map(|e| e.kind()),
        Some(bareverbs::error::ErrorKind::InvalidInput)
    );
    assert_eq!(ctx.query_port(1).unwrap().link_layer, LinkLayer::Ethernet);
    // PVRDMA has no in-place re-registration: a typed Unsupported.
    let pd = ctx.alloc_pd().unwrap();
    let mut mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(
        mr.rereg_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE),
        Err(Error::Unsupported(Unsupported::Feature(Feature::ReregMr)))
    );
    drop(mr);
    drop(pd);
    b.unbind().unwrap();
    common::teardown(&model, ctx);
}

/// Brings `q` to RTS towards `peer` through the device's loopback.
fn up<'a>(q: QueuePair<'a, R, Rc, Reset>, peer: u32) -> QueuePair<'a, R, Rc, Rts> {
    let init = ConnectedInit {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        ..Default::default()
    };
    let av = AddressVector::new(Gid::from_ipv4(IP), 1);
    let mut rts = ConnectedRts::new(0);
    rts.timeout = 8;
    rc_to_rts(q, &init, &ConnectedRtr::new(peer, 0, av), &rts)
}

#[test]
fn rxe_rereg_mr_changes_the_rights_a_peer_meets() {
    let (ctx, _seg) = rxe();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let build = || {
        let caps = QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        pd.qp_builder(&cq, &cq).caps(caps).build::<Rc>().unwrap()
    };
    let (a, b) = (build(), build());
    let (na, nb) = (a.qp_num(), b.qp_num());
    let (mut a, _b) = (up(a, nb), up(b, na));
    let src = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut dst = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let write = |a: &mut QueuePair<'_, R, Rc, Rts>, dst: &MemoryRegion<'_, R>| {
        let mut s = a.send_batch();
        // SAFETY: both regions outlive the QPs.
        unsafe {
            s.rdma_write(
                1,
                SendFlags::SIGNALED,
                (dst.addr(), dst.rkey()),
                &[src.sge(0, 64).unwrap()],
            )
        }
        .unwrap();
        s.finish();
        let mut wc = [WorkCompletion::default(); 1];
        for _ in 0..1000 {
            if cq.poll(&mut wc).unwrap() == 1 {
                return wc[0].status;
            }
        }
        panic!("no completion");
    };
    // Not remotely writable: refused by the responder.
    assert_eq!(write(&mut a, &dst), WcStatus::RemAccessErr);
    // The QP is in ERROR after a remote error: a new pair, and the region made writable.
    drop(a);
    let rkey = dst.rkey();
    dst.rereg_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    assert_eq!(dst.rkey(), rkey, "the keys stay");
    let (c, d) = (build(), build());
    let (nc, nd) = (c.qp_num(), d.qp_num());
    let (mut c, _d) = (up(c, nd), up(d, nc));
    assert_eq!(write(&mut c, &dst), WcStatus::Success);
    // The bad flow of a registration: remote write without local write.
    assert!(matches!(
        dst.rereg_access(AccessFlags::REMOTE_WRITE),
        Err(Error::MissingAttribute { .. })
    ));
}
