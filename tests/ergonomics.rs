//! What a new user meets first: `?` on the calls that hand an object back with their error,
//! the default queue depths and the errors that name the builder call to change, a GID
//! table read into a buffer too short, and the address that answers a UD datagram.

use bareverbs::Context;
use bareverbs::cm::CmError;
use bareverbs::device::pvrdma::{self, Pvrdma};
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::error::{Attr, Feature, NotFound, Op, Param, Queue, Unsupported};
use bareverbs::verbs::*;
use bareverbs::{Error, Result};
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};

type R = Rxe<Model, MemLink, TestClock>;

fn pvrdma(model: &Model) -> Context<Pvrdma<Model>> {
    Context::new(Pvrdma::probe(model.clone(), model, pvrdma::Config::default()).unwrap())
}

/// The software device at 10.0.0.1 (GID 0 link-local, GID 1 its IPv4 address), with its
/// segment (which must outlive it).
fn rxe(model: &Model) -> (Context<R>, Segment) {
    let seg = Segment::new();
    let link = seg.attach([2, 0, 0, 0, 0, 1], 1514);
    let dev = Rxe::new(
        model.clone(),
        link,
        TestClock::default(),
        Config { ip: [10, 0, 0, 1] },
    );
    (Context::new(dev.unwrap()), seg)
}

// --- `?` on hand-backs.

/// RESET -> RTR with `?` alone, towards a path whose source GID index is not bound.
fn connect_to_nowhere<'a, P: Provider>(qp: QueuePair<'a, P, Rc, Reset>) -> Result<()> {
    let qp = qp.init(&ConnectedInit::default())?;
    let av = AddressVector::new(Gid::from_ipv4([10, 9, 9, 9]), 5);
    let _rts = qp.rtr(&ConnectedRtr::new(0x20, 0, av))?;
    Ok(())
}

#[test]
fn question_mark_takes_a_failed_transitions_error_and_the_qp_is_destroyed() {
    let model = Model::new(ModelConfig::default());
    let ctx = pvrdma(&model);
    {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let qp = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
        assert_eq!(model.objects().qps, 1);
        let e = connect_to_nowhere(qp).unwrap_err();
        assert_eq!(
            e,
            Error::MissingAttribute {
                op: Op::ModifyQp,
                attr: Attr::BoundGid { index: 5 }
            }
        );
        // The QP the conversion took was dropped, as `Drop` does: destroyed on the device.
        assert_eq!(model.objects().qps, 0);
    }
    drop(ctx);
    assert_eq!(model.outstanding_pages(), 0);
}

#[test]
fn question_mark_takes_a_refused_safe_post_and_the_buffer_goes_back_to_its_pool() {
    fn post<'a, P: Provider>(qp: &mut QueuePair<'a, P, Rc, Init>, buf: Buf<'a, P>) -> Result<()> {
        qp.post_recv(1, buf)?;
        Ok(())
    }
    let model = Model::new(ModelConfig::default());
    let ctx = pvrdma(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let pool = pd.buffer_pool(2, 64).unwrap();
    // No `.pool(&pool)`: the safe path refuses the buffer.
    let qp = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let mut qp = qp
        .init(&ConnectedInit::default())
        .map_err(Error::from)
        .unwrap();
    let e = post(&mut qp, pool.alloc().unwrap()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidInput {
                param: Param::Pool,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(pool.free_count(), 2, "the buffer is back in its pool");
    let text = e.to_string();
    assert!(
        text.contains(".pool(&pool)") && text.contains("QpBuilder::pool"),
        "{text}"
    );
    assert!(!text.contains("of 0 asked"), "{text}");
}

#[test]
fn question_mark_takes_the_cms_hand_backs_and_a_verbs_hand_back_into_a_cm_error() {
    fn cm_hand_back() -> core::result::Result<(), CmError> {
        Err((String::from("a queue pair"), CmError::WrongState))?
    }
    fn verbs_hand_back() -> core::result::Result<(), CmError> {
        Err((7u32, Error::Busy { op: Op::DestroyQp }))?
    }
    assert_eq!(cm_hand_back(), Err(CmError::WrongState));
    assert_eq!(
        verbs_hand_back(),
        Err(CmError::Verbs(Error::Busy { op: Op::DestroyQp }))
    );
    // And the plain conversion, for a caller whose error type is not the crate's.
    let e: Error = (vec![1u8], Error::Timeout { op: Op::CreateQp }).into();
    assert_eq!(e, Error::Timeout { op: Op::CreateQp });
}

// --- Default depths.

#[test]
fn the_builders_default_depths_are_qp_caps_default() {
    let want = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    assert_eq!(QpCaps::default(), want);
    assert_eq!(QpCaps::DEFAULT, want);
    let model = Model::new(ModelConfig::default());
    let pv = pvrdma(&model);
    let (rx, _seg) = rxe(&model);
    fn check<P: Provider>(ctx: &Context<P>, want: QpCaps) {
        let pd = ctx.alloc_pd().unwrap();
        // 16 + 16 completions reserved on PVRDMA: a CQ of 32 takes one default QP.
        let cq = ctx.create_cq(32).unwrap();
        let caps = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap().caps();
        assert!(caps.max_send_wr >= want.max_send_wr, "{caps:?}");
        assert!(caps.max_recv_wr >= want.max_recv_wr, "{caps:?}");
        assert!(caps.max_send_sge >= want.max_send_sge, "{caps:?}");
        assert!(caps.max_recv_sge >= want.max_recv_sge, "{caps:?}");
    }
    check(&pv, want);
    check(&rx, want);
}

/// Posts receives on a default QP until refused: how many fit, and the refusal.
fn fill_default<P: Provider>(ctx: &Context<P>) -> (u32, Error) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let pool = pd.buffer_pool(40, 64).unwrap();
    let qp = pd.qp_builder(&cq, &cq).pool(&pool).build::<Rc>().unwrap();
    let depth = qp.caps().max_recv_wr;
    let mut qp = qp
        .init(&ConnectedInit::default())
        .map_err(Error::from)
        .unwrap();
    for i in 0..40 {
        if let Err((_, e)) = qp.post_recv(i, pool.alloc().unwrap()) {
            assert_eq!(u32::try_from(i).unwrap(), depth);
            return (depth, e);
        }
    }
    panic!("40 receives posted on a queue of {depth}");
}

#[test]
fn a_default_queue_takes_sixteen_requests_and_its_queue_full_names_caps() {
    let model = Model::new(ModelConfig::default());
    let pv = pvrdma(&model);
    let (rx, _seg) = rxe(&model);
    for (depth, e) in [fill_default(&pv), fill_default(&rx)] {
        assert_eq!(depth, 16);
        assert_eq!(
            e,
            Error::QueueFull {
                queue: Queue::Recv,
                free: 0
            }
        );
        let text = e.to_string();
        assert!(text.contains(".caps(...)"), "{text}");
        assert!(text.contains("default depth of 16"), "{text}");
    }
    // A completion queue's own refusal names no builder call.
    let cq_full = Error::QueueFull {
        queue: Queue::Cq,
        free: 0,
    };
    assert!(!cq_full.to_string().contains(".caps("));
}

// --- bound_gids.

#[test]
fn bound_gids_tells_a_short_buffer_from_an_empty_table() {
    let model = Model::new(ModelConfig::default());
    let ctx = pvrdma(&model);
    let mut none: [(u32, Gid); 0] = [];
    // Nothing bound: an empty buffer holds the whole table.
    assert_eq!(ctx.bound_gids(1, &mut none), Ok(0));
    let g0 = ctx
        .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
        .unwrap();
    let g1 = ctx.bind_gid(3, Gid::from_ipv4([10, 0, 0, 1])).unwrap();
    let short = |len| Error::InvalidInput {
        param: Param::GidTableBuffer,
        value: len,
        max: 2,
    };
    assert_eq!(ctx.bound_gids(1, &mut none), Err(short(0)));
    let mut one = [(0, Gid::default()); 1];
    assert_eq!(ctx.bound_gids(1, &mut one), Err(short(1)));
    assert_eq!(one, [(0, g0.gid())], "what fits is written");
    let mut two = [(0, Gid::default()); 2];
    assert_eq!(ctx.bound_gids(1, &mut two), Ok(2));
    assert_eq!(two, [(0, g0.gid()), (3, g1.gid())]);
    assert!(short(0).to_string().contains("too small"));
    drop((g0, g1));
    assert_eq!(ctx.bound_gids(1, &mut none), Ok(0));

    // The software device's table has its two GIDs from the start.
    let (rx, _seg) = rxe(&model);
    assert_eq!(rx.bound_gids(1, &mut none), Err(short(0)));
    assert_eq!(rx.bound_gids(1, &mut two), Ok(2));
    assert_eq!(two[1], (1, Gid::from_ipv4([10, 0, 0, 1])));
}

// --- The address that answers a UD datagram.

fn ud_wc() -> WorkCompletion {
    WorkCompletion {
        opcode: WcOpcode::Recv,
        flags: WcFlags::GRH,
        src_qp: 0x33,
        ..WorkCompletion::default()
    }
}

/// The GRH slot of a RoCEv2 datagram over IPv4: 20 unspecified bytes, then the IPv4 header
/// (checksum computed here).
fn ipv4_grh(src: [u8; 4], dst: [u8; 4], ttl: u8, tos: u8) -> [u8; 40] {
    let mut g = [0xEEu8; 40]; // the unspecified half: anything
    let ip = &mut g[20..];
    ip.copy_from_slice(&[0; 20]);
    ip[0] = 0x45;
    ip[1] = tos;
    ip[2..4].copy_from_slice(&(20u16 + 8 + 12 + 64 + 4).to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = ttl;
    ip[9] = 17; // UDP
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&dst);
    let mut sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    g
}

/// An IPv6 GRH proper: version 6, `tclass`, `flow`, `next`, `hop`, source and destination.
fn ipv6_grh(sgid: Gid, dgid: Gid, tclass: u8, flow: u32, next: u8, hop: u8) -> [u8; 40] {
    let mut g = [0u8; 40];
    let vtf = (6u32 << 28) | (u32::from(tclass) << 20) | flow;
    g[..4].copy_from_slice(&vtf.to_be_bytes());
    g[4..6].copy_from_slice(&76u16.to_be_bytes());
    g[6] = next;
    g[7] = hop;
    g[8..24].copy_from_slice(&sgid.0);
    g[24..40].copy_from_slice(&dgid.0);
    g
}

#[test]
fn the_address_of_a_roce_v2_ipv4_datagrams_sender_is_its_ipv4_mapped_gid() {
    let model = Model::new(ModelConfig::default());
    let (ctx, _seg) = rxe(&model);
    let grh = ipv4_grh([10, 0, 0, 9], [10, 0, 0, 1], 61, 0x28);
    let av = ctx.init_ah_from_wc(1, &ud_wc(), &grh).unwrap();
    assert_eq!(
        av,
        AddressVector {
            dgid: Gid::from_ipv4([10, 0, 0, 9]),
            sgid_index: 1, // the device's IPv4 GID, the datagram's destination
            hop_limit: 61,
            traffic_class: 0x28,
            flow_label: 0,
            sl: 0,
        }
    );
    // A longer slice (the whole receive buffer) is read for its first 40 bytes.
    let mut buf = [0u8; 104];
    buf[..40].copy_from_slice(&grh);
    assert_eq!(ctx.init_ah_from_wc(1, &ud_wc(), &buf), Ok(av));
    // And the handle made from it in one call.
    let pd = ctx.alloc_pd().unwrap();
    assert!(pd.create_ah_from_wc(1, &ud_wc(), &grh).is_ok());
}

#[test]
fn the_address_of_an_ipv6_grhs_sender_is_its_source_gid_with_its_flow() {
    let model = Model::new(ModelConfig::default());
    let ctx = pvrdma(&model);
    let mine = ctx
        .bind_gid(2, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
        .unwrap();
    let peer = Gid::link_local_from_mac([2, 0, 0, 0, 0, 7]);
    let grh = ipv6_grh(peer, mine.gid(), 0xAB, 0x1_2345, 17, 9);
    let av = ctx.init_ah_from_wc(1, &ud_wc(), &grh).unwrap();
    assert_eq!(
        av,
        AddressVector {
            dgid: peer,
            sgid_index: 2,
            hop_limit: 9,
            traffic_class: 0xAB,
            flow_label: 0x1_2345,
            sl: 0,
        }
    );
}

#[test]
fn a_datagram_that_cannot_be_answered_gets_a_typed_error() {
    let model = Model::new(ModelConfig::default());
    let (ctx, _seg) = rxe(&model);
    let no_grh = Error::MissingAttribute {
        op: Op::CreateAh,
        attr: Attr::Grh,
    };
    let good = ipv4_grh([10, 0, 0, 9], [10, 0, 0, 1], 64, 0);
    // No GRH flag on the completion.
    let wc = WorkCompletion {
        flags: WcFlags::empty(),
        ..ud_wc()
    };
    assert_eq!(ctx.init_ah_from_wc(1, &wc, &good), Err(no_grh));
    // A slot shorter than a GRH.
    assert_eq!(
        ctx.init_ah_from_wc(1, &ud_wc(), &good[..39]),
        Err(Error::InvalidInput {
            param: Param::Grh,
            value: 39,
            max: 40
        })
    );
    // An IPv4 header whose checksum does not hold, and no IPv6 version either.
    let mut bad = good;
    bad[30] ^= 1;
    bad[0] = 0;
    assert_eq!(ctx.init_ah_from_wc(1, &ud_wc(), &bad), Err(no_grh));
    // Sent to a multicast address.
    let mc = ipv4_grh([10, 0, 0, 9], [224, 0, 0, 1], 64, 0);
    assert_eq!(
        ctx.init_ah_from_wc(1, &ud_wc(), &mc),
        Err(Error::Unsupported(Unsupported::Feature(Feature::Multicast)))
    );
    // Sent to an address the table has no GID for.
    let other = ipv4_grh([10, 0, 0, 9], [10, 0, 0, 77], 64, 0);
    let e = ctx.init_ah_from_wc(1, &ud_wc(), &other).unwrap_err();
    assert_eq!(
        e,
        Error::NotFound(NotFound::Gid {
            port: 1,
            gid: Gid::from_ipv4([10, 0, 0, 77])
        })
    );
    assert!(e.to_string().contains("10.0.0.77"), "{e}");
    // An IPv6 GRH whose next header is neither RoCE's.
    let own = ctx.query_gid(1, 0).unwrap();
    let tcp = ipv6_grh(Gid::from_ipv4([10, 0, 0, 9]), own, 0, 0, 6, 64);
    assert_eq!(ctx.init_ah_from_wc(1, &ud_wc(), &tcp), Err(no_grh));
    // A port out of range.
    assert!(matches!(
        ctx.init_ah_from_wc(2, &ud_wc(), &good),
        Err(Error::InvalidInput {
            param: Param::Port,
            ..
        })
    ));
    // The texts say what the call takes.
    assert!(no_grh.to_string().contains("a GRH"), "{no_grh}");
    let short = Error::InvalidInput {
        param: Param::Grh,
        value: 39,
        max: 40,
    };
    assert!(short.to_string().contains("is 40 bytes"), "{short}");
}

#[test]
fn a_hand_back_unwraps_and_prints_the_queue_pair_with_its_error() {
    let model = Model::new(ModelConfig::default());
    let ctx = pvrdma(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let qpn = qp.qp_num();
    // `expect` takes a hand-back as it is: the queue pair prints.
    let qp = qp.init(&ConnectedInit::default()).expect("RESET -> INIT");
    let av = AddressVector::new(Gid::from_ipv4([10, 9, 9, 9]), 5);
    let (qp, e) = qp.rtr(&ConnectedRtr::new(0x20, 0, av)).unwrap_err();
    let text = format!("{:?}", (&qp, e));
    assert!(text.contains(&format!("qp_num: {qpn}")), "{text}");
    assert!(
        text.contains("qp_type: Rc") && text.contains("state: Init"),
        "{text}"
    );
    assert!(text.contains("BoundGid"), "{text}");
}
