// Set-ups shared by the crate's documentation examples (included, hidden, by each example:
// `# include!("doctests.rs");` with the path from the including file). Not part of the
// library: examples run on the device model, `bareverbs-model`, a development dependency.

/// A model machine and the PVRDMA driver brought up on it, in a context.
#[allow(dead_code)]
fn pvrdma() -> bareverbs::Result<(
    bareverbs_model::Model,
    bareverbs::Context<bareverbs::device::pvrdma::Pvrdma<bareverbs_model::Model>>,
)> {
    let machine = bareverbs_model::Model::default();
    let config = bareverbs::device::pvrdma::Config::default();
    let dev = bareverbs::device::pvrdma::Pvrdma::probe(machine.clone(), &machine, config)?;
    Ok((machine, bareverbs::Context::new(dev)))
}

/// RESET -> INIT -> RTR -> RTS of an RC queue pair towards QP `peer` at `gid` (index 0).
#[allow(dead_code)]
fn connect<'a, P: bareverbs::Provider>(
    qp: bareverbs::verbs::QueuePair<'a, P, bareverbs::verbs::Rc, bareverbs::verbs::Reset>,
    peer: u32,
    gid: bareverbs::verbs::Gid,
) -> bareverbs::Result<
    bareverbs::verbs::QueuePair<'a, P, bareverbs::verbs::Rc, bareverbs::verbs::Rts>,
> {
    connect_at(qp, peer, gid, 0)
}

/// As `connect`, from the source GID at `index`.
#[allow(dead_code)]
fn connect_at<'a, P: bareverbs::Provider>(
    qp: bareverbs::verbs::QueuePair<'a, P, bareverbs::verbs::Rc, bareverbs::verbs::Reset>,
    peer: u32,
    gid: bareverbs::verbs::Gid,
    index: u8,
) -> bareverbs::Result<
    bareverbs::verbs::QueuePair<'a, P, bareverbs::verbs::Rc, bareverbs::verbs::Rts>,
> {
    use bareverbs::verbs::{AddressVector, ConnectedInit, ConnectedRtr, ConnectedRts};
    // The software device's pairs let peers read and write (the keys decide); the model's
    // grant nothing remote, as before.
    let access = if index == 1 {
        bareverbs::verbs::AccessFlags::REMOTE_READ | bareverbs::verbs::AccessFlags::REMOTE_WRITE
    } else {
        bareverbs::verbs::AccessFlags::empty()
    };
    let init = ConnectedInit {
        access,
        ..ConnectedInit::default()
    };
    let qp = qp.init(&init)?;
    let rtr = ConnectedRtr::new(peer, 0, AddressVector::new(gid, index));
    let qp = qp.rtr(&rtr)?;
    Ok(qp.rts(&ConnectedRts::new(0))?)
}

/// Two RC queue pairs on `cq` (64 entries or more) with `pool`, 16 requests of 2 entries each
/// way, connected to each other over `gid`, in RTS.
#[allow(dead_code, clippy::type_complexity)]
fn rc_pair<'a, P: bareverbs::Provider>(
    pd: &'a bareverbs::verbs::ProtectionDomain<'a, P>,
    cq: &'a bareverbs::verbs::CompletionQueue<'a, P>,
    pool: &'a bareverbs::verbs::BufferPool<'a, P>,
    gid: bareverbs::verbs::Gid,
) -> bareverbs::Result<(
    bareverbs::verbs::QueuePair<'a, P, bareverbs::verbs::Rc, bareverbs::verbs::Rts>,
    bareverbs::verbs::QueuePair<'a, P, bareverbs::verbs::Rc, bareverbs::verbs::Rts>,
)> {
    let caps = bareverbs::verbs::QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    };
    let build = || pd.qp_builder(cq, cq).caps(caps).pool(pool);
    let a = build().build::<bareverbs::verbs::Rc>()?;
    let b = build().build::<bareverbs::verbs::Rc>()?;
    let (qa, qb) = (a.qp_num(), b.qp_num());
    // The software device's IPv4 GID is at index 1 (rxe's table); the model's at 0.
    let index = u8::from(gid.ipv4().is_some());
    Ok((connect_at(a, qb, gid, index)?, connect_at(b, qa, gid, index)?))
}


/// The software RoCE device alone on an in-memory segment (its QPs talk in loopback), and
/// what moves its time on: call it until what was posted completed.
#[allow(dead_code, clippy::type_complexity)]
fn rxe_loopback() -> bareverbs::Result<(
    bareverbs::Context<
        bareverbs::device::rxe::Rxe<
            bareverbs_model::Model,
            bareverbs_model::link::MemLink,
            bareverbs_model::link::TestClock,
        >,
    >,
    bareverbs_model::link::TestClock,
)> {
    let model = bareverbs_model::Model::new(bareverbs_model::ModelConfig::default());
    let (segment, clock) = (
        bareverbs_model::link::Segment::new(),
        bareverbs_model::link::TestClock::default(),
    );
    let link = segment.attach([2, 0, 0, 0, 0, 1], 1514);
    let config = bareverbs::device::rxe::Config { ip: [10, 0, 0, 1] };
    let dev = bareverbs::device::rxe::Rxe::new(model, link, clock.clone(), config)?;
    let ctx = bareverbs::Context::new(dev);
    Ok((ctx, clock))
}

/// The GID of `rxe_loopback`'s device (its IPv4 address).
#[allow(dead_code)]
fn rxe_gid() -> bareverbs::verbs::Gid {
    bareverbs::verbs::Gid::from_ipv4([10, 0, 0, 1])
}
