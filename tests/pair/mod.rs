//! Two ends of a data path on each device: the PVRDMA model (one device, its QPs talking in
//! loopback) and two software RoCE devices on the in-memory Ethernet segment, for tests that
//! run the same program on both.
#![allow(dead_code)] // each test binary uses a different subset

use bareverbs::Context;
use bareverbs::device::pvrdma::Pvrdma;
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::{
    AccessFlags, AddressVector, ConnectedInit, ConnectedRtr, ConnectedRts, Gid, Provider,
    QueuePair, Rc, Reset, Rts,
};
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};

use crate::common::rc_to_rts;

/// The software RoCE device on the model's segment.
pub type R = Rxe<Model, MemLink, TestClock>;
/// The PVRDMA driver on the model.
pub type Pv = Pvrdma<Model>;

pub const IP_A: [u8; 4] = [10, 0, 0, 2];
pub const IP_B: [u8; 4] = [10, 0, 0, 3];

/// The two ends: contexts, the path each way, and how time moves.
pub struct Ends<'a, P: Provider> {
    pub a: &'a Context<P>,
    pub b: &'a Context<P>,
    pub to_b: AddressVector,
    pub to_a: AddressVector,
    /// Runs the devices until what was posted has completed.
    pub settle: &'a dyn Fn(),
}

/// Runs `f` on the PVRDMA model built with `cfg` (the port's GID bound, as a guest's
/// Ethernet driver binds it); then checks that every page came back and nothing went wrong.
pub fn on_pvrdma<T>(cfg: ModelConfig, f: impl FnOnce(&Ends<'_, Pv>) -> T) -> T {
    let model = Model::new(cfg);
    let ctx = crate::common::up(&model);
    let g = ctx.bind_gid(0, Gid::link_local_from_mac(cfg.mac)).unwrap();
    let av = AddressVector::new(g.gid(), 0);
    let ends = Ends {
        a: &ctx,
        b: &ctx,
        to_b: av,
        to_a: av,
        settle: &|| {},
    };
    let out = f(&ends);
    drop(g);
    crate::common::teardown(&model, ctx);
    out
}

/// Runs `f` on two rxe devices on one segment; then checks that every page came back.
pub fn on_rxe<T>(f: impl FnOnce(&Ends<'_, R>) -> T) -> T {
    let model = Model::new(ModelConfig::default());
    let (a, b, clk, _seg) = rxe_devices(&model);
    let settle = || {
        for _ in 0..100 {
            clk.advance(100);
            a.process_events();
            b.process_events();
        }
    };
    let ends = Ends {
        a: &a,
        b: &b,
        to_b: AddressVector::new(Gid::from_ipv4(IP_B), 1),
        to_a: AddressVector::new(Gid::from_ipv4(IP_A), 1),
        settle: &settle,
    };
    let out = f(&ends);
    drop((a, b));
    assert_eq!(model.outstanding_pages(), 0, "rxe: DMA pages leaked");
    out
}

/// Two rxe devices on the model's segment, A at [`IP_A`] and B at [`IP_B`], with their clock
/// (and the segment, which must outlive them).
pub fn rxe_devices(model: &Model) -> (Context<R>, Context<R>, TestClock, Segment) {
    rxe_devices_seeded(model, None)
}

/// [`rxe_devices`], the model's seed set to `seeds.0` before A is made and to `seeds.1` before
/// B (their starting PSNs and key bits) when given.
pub fn rxe_devices_seeded(
    model: &Model,
    seeds: Option<(u64, u64)>,
) -> (Context<R>, Context<R>, TestClock, Segment) {
    let (seg, clk) = (Segment::new(), TestClock::default());
    let la = seg.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    let lb = seg.attach([0x52, 0x54, 0, 0, 0, 3], 1514);
    let dev = |l, ip, seed: Option<u64>| {
        if let Some(s) = seed {
            model.set_seed(s);
        }
        Context::new(Rxe::new(model.clone(), l, clk.clone(), Config { ip }).unwrap())
    };
    let a = dev(la, IP_A, seeds.map(|s| s.0));
    let b = dev(lb, IP_B, seeds.map(|s| s.1));
    (a, b, clk, seg)
}

/// A fresh model and two rxe devices on it ([`rxe_devices_seeded`]), with the clock; the
/// segment lives on in the devices' links.
pub fn rxe_pair(seeds: Option<(u64, u64)>) -> (Model, TestClock, Context<R>, Context<R>) {
    let model = Model::new(ModelConfig::default());
    let (a, b, clk, _seg) = rxe_devices_seeded(&model, seeds);
    (model, clk, a, b)
}

/// Brings an RC QP on an rxe device (local write access) to RTS towards QP `peer` at `ip`.
pub fn rxe_rc_up<'a, P: Provider>(
    q: QueuePair<'a, P, Rc, Reset>,
    peer: u32,
    ip: [u8; 4],
) -> QueuePair<'a, P, Rc, Rts> {
    let init = ConnectedInit {
        access: AccessFlags::LOCAL_WRITE,
        ..Default::default()
    };
    let av = AddressVector::new(Gid::from_ipv4(ip), 1);
    rc_to_rts(
        q,
        &init,
        &ConnectedRtr::new(peer, 0, av),
        &ConnectedRts::new(0),
    )
}
