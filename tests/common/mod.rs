//! The helpers every test binary may share, one copy each: a model machine and a driver
//! brought up on it, an RC pair on that one device and the lab it runs in, and polling a CQ dry
//! (on any device). Two devices on a segment are `pair`'s; CM set-ups `cm_common`'s; memory
//! windows' `mw_common`'s.
#![allow(dead_code)] // each test binary uses a different subset

use bareverbs::device::pvrdma::{Config, Opcodes, Pvrdma};
use bareverbs::error::{Feature, Queue, Unsupported};
use bareverbs::verbs::CanRecv;
use bareverbs::verbs::{
    AccessFlags, AddressVector, Buf, BufferPool, CompletionQueue, ConnectedInit, ConnectedRtr,
    ConnectedRts, Gid, MemoryRegion, ProtectionDomain, Provider, QpCaps, QueuePair, Rc, Reset, Rts,
    SendFlags, Sge, SharedReceiveQueue, WorkCompletion,
};
use bareverbs::{Context, Error};
use bareverbs_model::{Model, ModelConfig};

pub type Ctx = Context<Pvrdma<Model>>;

/// A poll bound small enough that a silent device fails fast in tests; every opcode posted
/// (the model executes them all under `Semantics::Verbs`).
pub const CONFIG: Config = Config {
    poll_limit: 10_000,
    opcodes: Opcodes::All,
    interrupts: false,
};

/// Pages the driver holds while a device is up and no object exists (measured:
/// `model.outstanding_pages()` right after bring-up): the DSR, the command page, the QP table
/// (2048 entries of 32 bytes — twice the 1024 QPs the driver lets live, for open addressing —
/// 16 pages), and two notification rings of 2 pages, each with a directory and a table page
/// (the DSR and the rings are one block of 9 pages, and one more page of it for the event
/// state), and the page of bound GID values that ends the QP table's block.
pub const DEVICE_PAGES: usize = 1 + 1 + 16 + 2 * (2 + 2) + 1 + 1;

pub fn model() -> Model {
    Model::new(ModelConfig::default())
}

pub fn up(model: &Model) -> Ctx {
    Context::new(Pvrdma::probe(model.clone(), model, CONFIG).expect("bring-up"))
}

/// The machine is clean: nothing QEMU would mishandle happened.
pub fn assert_clean(model: &Model) {
    let v = model.violations();
    assert!(v.is_empty(), "violations: {v:#?}");
}

/// Tears the context down and checks that every DMA page came back and nothing went wrong.
pub fn teardown(model: &Model, ctx: Ctx) {
    drop(ctx);
    assert_eq!(model.outstanding_pages(), 0, "DMA pages leaked");
    assert!(!model.active(), "device not reset at teardown");
    assert_clean(model);
}

/// Runs `f` on a thread with a large stack. Queue pairs no longer need it (their safe-path
/// bookkeeping lives in DMA memory, not inline): the QP tests run on the test thread; kept for
/// the test files that still call it.
pub fn big_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(f)
        .expect("spawn")
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
}

/// The driver on the model.
pub type P = Pvrdma<Model>;

/// Brings an RC QP from RESET through INIT, RTR and RTS with the attributes given: the one
/// bring-up every test's RC set-up (its rights, path, depths and PSNs) goes through, on any
/// device.
pub fn rc_to_rts<'a, Pr: Provider>(
    qp: QueuePair<'a, Pr, Rc, Reset>,
    init: &ConnectedInit,
    rtr: &ConnectedRtr,
    rts: &ConnectedRts,
) -> QueuePair<'a, Pr, Rc, Rts> {
    let qp = qp.init(init).unwrap();
    let qp = qp.rtr(rtr).unwrap();
    qp.rts(rts).unwrap()
}

/// Brings a UD QP from RESET through INIT (Q_Key `qkey`), RTR and RTS (send PSN 0), on any
/// device.
pub fn ud_to_rts<'a, Pr: Provider>(
    qp: QueuePair<'a, Pr, bareverbs::verbs::Ud, Reset>,
    qkey: u32,
) -> QueuePair<'a, Pr, bareverbs::verbs::Ud, Rts> {
    let qp = qp.init(&bareverbs::verbs::DatagramInit::new(qkey)).unwrap();
    let qp = qp.rtr(&()).unwrap();
    qp.rts(&bareverbs::verbs::DatagramRts { sq_psn: 0 })
        .unwrap()
}

/// Brings an RC QP through INIT (with `access`), RTR to QP `peer` over the GID at index 0,
/// and RTS, as the tests connect their pairs.
pub fn rc_up<'a>(
    qp: QueuePair<'a, P, Rc, Reset>,
    peer: u32,
    gid: Gid,
    access: AccessFlags,
) -> QueuePair<'a, P, Rc, Rts> {
    let init = ConnectedInit {
        access,
        ..Default::default()
    };
    let av = AddressVector::new(gid, 0);
    rc_to_rts(
        qp,
        &init,
        &ConnectedRtr::new(peer, 0, av),
        &ConnectedRts::new(0),
    )
}

/// Everything `cq` holds now, polled a few entries at a time until a poll comes back empty
/// (several polls, so that a test sees a poll continue where the last one stopped). Any
/// device: the one "poll a CQ into a `Vec`" of the tests.
pub fn drain<Pr: Provider>(cq: &CompletionQueue<'_, Pr>) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 3];
    loop {
        let n = cq.poll(&mut wc).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&wc[..n]);
    }
}

/// Completions of `cq` until `n` came, `tick` (the devices' time and work) run between polls,
/// for `rounds` rounds at most: fewer when they do not come (`usize::MAX`: all that came).
pub fn poll_until<Pr: Provider>(
    tick: &mut dyn FnMut(),
    cq: &CompletionQueue<'_, Pr>,
    n: usize,
    rounds: usize,
) -> Vec<WorkCompletion> {
    let mut got = drain(cq);
    for _ in 0..rounds {
        if got.len() >= n {
            break;
        }
        tick();
        got.extend(drain(cq));
    }
    got
}

/// Capacities of `send` and `recv` requests, `sge` entries each way, no inline data.
pub fn caps(send: u32, recv: u32, sge: u32) -> QpCaps {
    QpCaps {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: sge,
        max_recv_sge: sge,
        max_inline_data: 0,
    }
}

/// Local write and remote read and write: the access the loopback tests register and grant.
pub const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// Brings two RC QPs of the model up, connected to each other over `gid` (remote read and
/// write granted).
pub fn connect<'a>(
    a: QueuePair<'a, P, Rc, Reset>,
    b: QueuePair<'a, P, Rc, Reset>,
    gid: Gid,
) -> (QueuePair<'a, P, Rc, Rts>, QueuePair<'a, P, Rc, Rts>) {
    let (qa, qb) = (a.qp_num(), b.qp_num());
    let up = |qp, peer| {
        rc_up(
            qp,
            peer,
            gid,
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
    };
    (up(a, qb), up(b, qa))
}

/// Two RC QPs of the model connected to each other, in RTS, on one CQ (16 WRs and 4 SGEs each
/// way), receiving from `srq` and posting `pool`'s buffers when given.
pub fn rc_pair<'a>(
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    gid: Gid,
    srq: Option<&'a SharedReceiveQueue<'a, P>>,
    pool: Option<&'a BufferPool<'a, P>>,
) -> (QueuePair<'a, P, Rc, Rts>, QueuePair<'a, P, Rc, Rts>) {
    let build = || {
        let mut b = pd.qp_builder(cq, cq).caps(caps(16, 16, 4));
        if let Some(s) = srq {
            b = b.srq(s);
        }
        if let Some(p) = pool {
            b = b.pool(p);
        }
        b.build::<Rc>().unwrap()
    };
    connect(build(), build(), gid)
}

/// A 4 KiB region of `pd` ([`RW`]) that starts with `bytes`.
pub fn with_mr<'a>(pd: &'a ProtectionDomain<'a, P>, bytes: &[u8]) -> MemoryRegion<'a, P> {
    let mut mr = pd.register(4096, RW).unwrap();
    mr.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
    mr
}

/// A buffer of `pool` holding `bytes`.
pub fn buf_with<'p>(pool: &'p BufferPool<'p, P>, bytes: &[u8]) -> Buf<'p, P> {
    let mut b = pool.alloc().expect("a free buffer");
    b.set_len(bytes.len() as u32).unwrap();
    b.as_mut_slice().copy_from_slice(bytes);
    b
}

/// A context on a fresh model built with `cfg` and brought up with `config`, a bound GID, a
/// PD and a 256-entry CQ; runs `f` and tears everything down (every DMA page back, no
/// violation).
pub fn lab_with(
    cfg: ModelConfig,
    config: Config,
    f: impl FnOnce(&Model, &Ctx, &ProtectionDomain<'_, P>, &CompletionQueue<'_, P>, Gid),
) {
    let model = Model::new(cfg);
    let ctx = Context::new(Pvrdma::probe(model.clone(), &model, config).unwrap());
    let g = ctx.bind_gid(0, Gid::link_local_from_mac(cfg.mac)).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).unwrap();
    f(&model, &ctx, &pd, &cq, g.gid());
    drop(cq);
    drop(pd);
    drop(g);
    teardown(&model, ctx);
}

/// [`lab_with`] the default machine and [`CONFIG`].
pub fn lab(f: impl FnOnce(&Model, &Ctx, &ProtectionDomain<'_, P>, &CompletionQueue<'_, P>, Gid)) {
    lab_with(ModelConfig::default(), CONFIG, f)
}

/// The error of an argument `param` of `value`, above `max`.
pub fn invalid(param: bareverbs::error::Param, value: u64, max: u64) -> Error {
    Error::InvalidInput { param, value, max }
}

/// The error of a post the device does not support.
pub fn unsupported(f: Feature) -> Error {
    Error::Unsupported(Unsupported::Feature(f))
}

/// The error of a post to a full queue with `free` entries left.
pub fn full(queue: Queue, free: u32) -> Error {
    Error::QueueFull { queue, free }
}

/// Posts one signaled SEND of `sge` (raw) and publishes it.
///
/// # Safety
///
/// The memory `sge` names stays registered and untouched until the completion is polled.
pub unsafe fn send1<Pr: Provider>(qp: &mut QueuePair<'_, Pr, Rc, Rts>, wr_id: u64, sge: Sge) {
    let mut b = qp.send_batch();
    // SAFETY: forwarded from our caller.
    unsafe { b.send(wr_id, SendFlags::SIGNALED, &[sge]).unwrap() };
    b.finish();
}

/// Posts `n` receives (ids from `first`) of `sge` in one batch: the error of the first refused.
pub fn recvs<Pr: Provider, S: CanRecv>(
    q: &mut QueuePair<'_, Pr, Rc, S>,
    first: u64,
    n: u64,
    sge: Sge,
) -> Result<(), Error> {
    let mut b = q.recv_batch();
    for i in first..first + n {
        // SAFETY: the callers' regions outlive the QPs of their tests.
        unsafe { b.recv(i, &[sge]) }?;
    }
    b.finish();
    Ok(())
}

/// The CQ entries the live QPs completing to `cq` hold, read off the receives a new QP
/// receiving there can post before the CQ is full (a QP is never refused for its CQ's room:
/// its requests are).
pub fn reserved(
    pd: &ProtectionDomain<'_, P>,
    cq: &CompletionQueue<'_, P>,
    other: &CompletionQueue<'_, P>,
) -> u32 {
    let whole = caps(1, cq.entries(), 1);
    let qp = pd.qp_builder(other, cq).caps(whole).build::<Rc>().unwrap();
    let mut qp = qp.init(&ConnectedInit::default()).unwrap();
    let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = [mr.sge(0, 64).unwrap()];
    let mut n = 0;
    while n < cq.entries() {
        // SAFETY: the region outlives the QP (dropped first, below).
        match unsafe { qp.post_recv_raw(u64::from(n), &sge) } {
            Ok(()) => n += 1,
            Err(Error::QueueFull {
                queue: bareverbs::error::Queue::Cq,
                ..
            }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    drop(qp);
    cq.entries() - n
}
