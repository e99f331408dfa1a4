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
    use bareverbs::verbs::{AddressVector, ConnectedInit, ConnectedRtr, ConnectedRts};
    let qp = qp.init(&ConnectedInit::default()).map_err(|(_, e)| e)?;
    let rtr = ConnectedRtr::new(peer, 0, AddressVector::new(gid, 0));
    let qp = qp.rtr(&rtr).map_err(|(_, e)| e)?;
    qp.rts(&ConnectedRts::new(0)).map_err(|(_, e)| e)
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
    Ok((connect(a, qb, gid)?, connect(b, qa, gid)?))
}

