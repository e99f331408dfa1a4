//! The demo on the second device: software RoCEv2 (bareverbs' `rxe` device) over a plain NIC,
//! what the kernel runs when the bus has no PVRDMA. Two RC queue pairs of the device talk to
//! each other over RoCEv2 (looped back at the interface, as Linux's rxe does), through every
//! operation — SEND of several packets, RDMA WRITE with immediate, RDMA READ, fetch-and-add,
//! compare-and-swap — and two UD queue pairs exchange a datagram; then the connection manager
//! connects the device to its own address (listen, connect, accept: the REQ, REP and RTU
//! looped back too), carries a SEND, an RDMA WRITE and a READ, and disconnects; every byte is
//! checked.

use core::fmt::Write;

use bareverbs::Context;
use bareverbs::cm::{AcceptParams, Cm, CmConfig, CmError, CmEvent, ConnectParams, Service};
use bareverbs::device::rxe::Rxe;
use bareverbs::error::{Error, Op};
use bareverbs::hal::{Clock, Hal, Link};
use bareverbs::verbs::*;

use crate::{DisplayGid, Failure, Step};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
const SIG: SendFlags = SendFlags::SIGNALED;
/// Bytes of the multi-packet SEND, and of the WRITE read back.
const SEND_BYTES: u32 = 3000;
const WRITE_BYTES: u32 = 2000;

fn pattern(i: usize) -> u8 {
    (i * 13 + 5) as u8
}

/// Polls `cq` until it holds `n` completions (into `out`); `idle` waits a little and says
/// whether to go on (the bound).
fn wait_for<P: Provider>(
    cq: &CompletionQueue<'_, P>,
    out: &mut [WorkCompletion],
    idle: &mut dyn FnMut() -> bool,
    step: &'static str,
) -> Result<(), Failure> {
    let mut got = 0;
    while got < out.len() {
        got += cq.poll(&mut out[got..]).at(step)?;
        if got < out.len() && !idle() {
            return Err(Failure {
                step,
                error: Error::Timeout { op: Op::PollCq },
            });
        }
    }
    Ok(())
}

/// Checks that every completion succeeded.
fn all_ok(wcs: &[WorkCompletion], step: &'static str) -> Result<(), Failure> {
    match wcs.iter().find(|w| w.status != WcStatus::Success) {
        None => Ok(()),
        Some(_) => Err(Failure {
            step,
            error: Error::Busy { op: Op::PollCq },
        }),
    }
}

fn mismatch(step: &'static str) -> Failure {
    Failure {
        step,
        error: Error::Busy { op: Op::PostSend },
    }
}

/// Connects an RC QP to `peer` at `av` (RESET → INIT → RTR → RTS).
fn up<'a, P: Provider>(
    qp: QueuePair<'a, P, Rc, Reset>,
    peer: u32,
    av: AddressVector,
    mtu: Mtu,
    (sq_psn, rq_psn): (u32, u32),
) -> Result<QueuePair<'a, P, Rc, Rts>, Failure> {
    let init = ConnectedInit {
        access: ALL,
        ..Default::default()
    };
    let qp = qp.init(&init).at("RC INIT")?;
    let mut rtr = ConnectedRtr::new(peer, rq_psn, av);
    (rtr.path_mtu, rtr.max_dest_rd_atomic) = (mtu, 1);
    let qp = qp.rtr(&rtr).at("RC RTR")?;
    let mut rts = ConnectedRts::new(sq_psn);
    rts.max_rd_atomic = 1;
    qp.rts(&rts).at("RC RTS")
}

/// Runs the RoCE demo on `dev`, its CM's timers on `clock`; `idle` is called while waiting
/// (halt until the next tick, `false` once the wait has lasted too long).
pub fn demo<H: Hal, L: Link, C: Clock, K: Clock, W: Write>(
    dev: Rxe<H, L, C>,
    clock: K,
    out: &mut W,
    idle: &mut dyn FnMut() -> bool,
) -> Result<(), Failure> {
    let ctx = Context::new(dev);
    let rxe = ctx.provider();
    let ip = rxe.ip();
    let gid = ctx.query_gid(1, 1).at("query GID 1")?;
    let _ = writeln!(
        out,
        "roce: software RoCEv2, IPv4 {}.{}.{}.{}, active MTU {}, GID[1] {}",
        ip[0],
        ip[1],
        ip[2],
        ip[3],
        rxe.active_mtu(),
        DisplayGid(gid)
    );
    let mtu = ctx.query_port(1).at("query port")?.active_mtu;
    let pd = ctx.alloc_pd().at("alloc PD")?;
    let cq = ctx.create_cq(64).at("create CQ")?;
    let mut mr = pd.register(16384, ALL).at("register")?;
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let x = pd
        .qp_builder(&cq, &cq)
        .caps(caps)
        .build::<Rc>()
        .at("create RC x")?;
    let y = pd
        .qp_builder(&cq, &cq)
        .caps(caps)
        .build::<Rc>()
        .at("create RC y")?;
    let (nx, ny) = (x.qp_num(), y.qp_num());
    let av = AddressVector::new(gid, 1);
    // Starting PSNs drawn from the device's seed (docs/security.md: a blind spoofer must
    // guess them).
    let (px, py) = (ctx.random_psn(), ctx.random_psn());
    let mut x = up(x, ny, av, mtu, (px, py))?;
    let mut y = up(y, nx, av, mtu, (py, px))?;
    let m = mr.as_mut_slice();
    for (i, b) in m[..SEND_BYTES as usize].iter_mut().enumerate() {
        *b = pattern(i);
    }
    m[4096..16384].fill(0);
    let base = mr.addr();
    let sge = |off, len| mr.sge(off, len);
    let mut wcs = [WorkCompletion::default(); 3];
    // SEND of three packets into a posted receive; WRITE with immediate (a receive too).
    // SAFETY: the region stays registered and untouched by the CPU until the completions.
    unsafe {
        let mut r = y.recv_batch();
        r.recv(1, &[sge(4096, 4096).at("sge")?]).at("post recv")?;
        r.recv(2, &[]).at("post recv")?;
        r.finish();
        let mut s = x.send_batch();
        s.send(3, SIG, &[sge(0, SEND_BYTES).at("sge")?])
            .at("post SEND")?;
        s.rdma_write_imm(
            4,
            SIG,
            (base + 8192, mr.rkey()),
            0x5EED,
            &[sge(0, WRITE_BYTES).at("sge")?],
        )
        .at("post WRITE")?;
        s.finish();
    }
    let mut four = [WorkCompletion::default(); 4];
    wait_for(&cq, &mut four, idle, "RC SEND and WRITE completions")?;
    all_ok(&four, "RC SEND and WRITE status")?;
    let m = mr.as_slice();
    let same = |at: usize, n: u32| (0..n as usize).all(|i| m[at + i] == pattern(i));
    if !same(4096, SEND_BYTES) {
        return Err(mismatch("RC SEND payload"));
    }
    if !same(8192, WRITE_BYTES) {
        return Err(mismatch("RC WRITE payload"));
    }
    let imm = four.iter().find(|w| w.opcode == WcOpcode::RecvRdmaWithImm);
    if imm.map(|w| (w.imm, w.byte_len)) != Some((0x5EED, WRITE_BYTES)) {
        return Err(mismatch("RC WRITE immediate"));
    }
    // READ the written bytes back; then the atomics on 8 bytes of the region.
    mr.as_mut_slice()[12288..12296].copy_from_slice(&40u64.to_ne_bytes());
    // SAFETY: as above.
    unsafe {
        let mut s = x.send_batch();
        s.rdma_read(
            5,
            SIG,
            (base + 8192, mr.rkey()),
            &[mr.sge(14336, WRITE_BYTES).at("sge")?],
        )
        .at("post READ")?;
        s.atomic_fetch_add(
            6,
            SIG,
            (base + 12288, mr.rkey()),
            2,
            &mr.sge(12304, 8).at("sge")?,
        )
        .at("post FETCH_ADD")?;
        s.atomic_cmp_swp(
            7,
            SIG,
            (base + 12288, mr.rkey()),
            (42, 7),
            &mr.sge(12312, 8).at("sge")?,
        )
        .at("post CMP_SWAP")?;
        s.finish();
    }
    wait_for(&cq, &mut wcs, idle, "RC READ and atomic completions")?;
    all_ok(&wcs, "RC READ and atomic status")?;
    let m = mr.as_slice();
    let word = |at: usize| {
        u64::from_ne_bytes([
            m[at],
            m[at + 1],
            m[at + 2],
            m[at + 3],
            m[at + 4],
            m[at + 5],
            m[at + 6],
            m[at + 7],
        ])
    };
    if !(0..WRITE_BYTES as usize).all(|i| m[14336 + i] == pattern(i)) {
        return Err(mismatch("RC READ payload"));
    }
    if (word(12304), word(12312), word(12288)) != (40, 42, 7) {
        return Err(mismatch("RC atomics"));
    }
    let _ = writeln!(
        out,
        "roce: RC {nx} <-> {ny} at MTU {}: SEND {SEND_BYTES} B, WRITE+imm {WRITE_BYTES} B, READ {WRITE_BYTES} B, fetch-add 40+2, compare-swap 42->7: checked",
        mtu.bytes()
    );
    x.destroy().at("destroy RC x")?;
    y.destroy().at("destroy RC y")?;

    // UD: a datagram after its 40-byte GRH slot.
    let ud = |qkey| {
        let q = pd
            .qp_builder(&cq, &cq)
            .caps(caps)
            .build::<Ud>()
            .at("create UD")?;
        q.ready(qkey, 0).at("UD to RTS")
    };
    let mut u = ud(0x1111_1111)?;
    let mut v = ud(0x1111_1111)?;
    let ah = pd.create_ah(&av).at("create AH")?;
    // SAFETY: as above.
    unsafe {
        let mut r = v.recv_batch();
        r.recv(8, &[mr.sge(4096, 1024).at("sge")?])
            .at("post UD recv")?;
        r.finish();
        let mut s = u.send_batch();
        s.send_to(
            9,
            SIG,
            (&ah, v.qp_num(), 0x1111_1111),
            &[mr.sge(0, 512).at("sge")?],
        )
        .at("post UD send")?;
        s.finish();
    }
    let mut two = [WorkCompletion::default(); 2];
    wait_for(&cq, &mut two, idle, "UD completions")?;
    all_ok(&two, "UD status")?;
    let m = mr.as_slice();
    let got = two
        .iter()
        .find(|w| w.opcode == WcOpcode::Recv)
        .map(|w| (w.byte_len, w.src_qp));
    if got != Some((552, u.qp_num()))
        || m[4096 + 32..4096 + 36] != ip
        || !(0..512).all(|i| m[4136 + i] == pattern(i))
    {
        return Err(mismatch("UD datagram"));
    }
    let _ = writeln!(
        out,
        "roce: UD {} -> {}: 40 GRH + 512 B, source {}.{}.{}.{} in the GRH: checked",
        u.qp_num(),
        v.qp_num(),
        ip[0],
        ip[1],
        ip[2],
        ip[3]
    );
    u.destroy().at("destroy UD")?;
    v.destroy().at("destroy UD")?;

    let checked = cm_to_itself(&pd, &cq, &mut mr, clock, idle)?;
    let _ = writeln!(
        out,
        "cm: connected to {}.{}.{}.{}:{CM_PORT} on the software RoCE device (loopback): SEND, WRITE, READ {CM_BYTES} B; {checked} bytes checked; disconnected",
        ip[0], ip[1], ip[2], ip[3]
    );
    drop((mr, ah));
    cq.destroy().at("destroy CQ")?;
    pd.destroy().at("destroy PD")?;
    Ok(())
}

/// The port the CM demo listens on, and the bytes of each of its transfers.
const CM_PORT: u16 = 7471;
const CM_BYTES: u32 = 1500;

/// A CM failure as the demo reports it (a refusal that is not the verbs' is a protocol error
/// of the demo).
fn cm_err(step: &'static str) -> impl Fn(CmError) -> Failure {
    move |e| match e {
        CmError::Verbs(error) => Failure { step, error },
        _ => mismatch(step),
    }
}

/// Polls the CM until its next event.
fn next_event<'a, P: Provider, K: Clock>(
    cm: &mut Cm<'a, P, K, 2>,
    idle: &mut dyn FnMut() -> bool,
    step: &'static str,
) -> Result<CmEvent<'a, P>, Failure> {
    loop {
        if let Some(e) = cm.poll() {
            return Ok(e);
        }
        if !idle() {
            return Err(Failure {
                step,
                error: Error::Timeout { op: Op::PollCq },
            });
        }
    }
}

/// The connection manager on the device, connecting to its own address: a listener, a
/// connection to it, a SEND into a posted receive, an RDMA WRITE and a READ of it back, every
/// byte checked, and a disconnection on both ends. Returns the bytes checked.
fn cm_to_itself<P: Provider, K: Clock>(
    pd: &ProtectionDomain<'_, P>,
    cq: &CompletionQueue<'_, P>,
    mr: &mut MemoryRegion<'_, P>,
    clock: K,
    idle: &mut dyn FnMut() -> bool,
) -> Result<u32, Failure> {
    let cm_cq = pd.context().create_cq(32).at("create CM CQ")?;
    let mut cm: Cm<'_, P, K, 2> =
        Cm::new(pd, &cm_cq, clock, CmConfig::default()).map_err(cm_err("CM"))?;
    let ip = cm.ip();
    cm.listen(None, CM_PORT, Service::Rc)
        .map_err(cm_err("listen"))?;
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = || pd.qp_builder(cq, cq).caps(caps).build::<Rc>();
    let qa = qp().at("create CM QP")?;
    let id = cm
        .connect(qa, ip, CM_PORT, &ConnectParams::default())
        .map_err(|(_, e)| cm_err("connect")(e))?;
    let CmEvent::ConnectRequest(req) = next_event(&mut cm, idle, "CM request")? else {
        return Err(mismatch("CM request"));
    };
    let qb = qp().at("create CM QP")?;
    let mut qb = cm
        .accept(req.id, qb, &AcceptParams::default())
        .map_err(|(_, e)| cm_err("accept")(e))?;
    // Both ends established: the active one with its QP, the passive one (the RTU arrived).
    let mut qa = None;
    for _ in 0..2 {
        match next_event(&mut cm, idle, "CM established")? {
            CmEvent::Established { qp: Some(q), .. } => qa = Some(q),
            CmEvent::Established { qp: None, .. } => {}
            _ => return Err(mismatch("CM established")),
        }
    }
    let mut qa = qa.ok_or_else(|| mismatch("CM established"))?;
    // SEND into the passive QP's receive, WRITE the same bytes, READ them back.
    let n = CM_BYTES as usize;
    mr.as_mut_slice()[4096..16384].fill(0);
    let base = mr.addr();
    let mut wcs = [WorkCompletion::default(); 3];
    // SAFETY: the region stays registered and untouched by the CPU until the completions.
    unsafe {
        let mut r = qb.recv_batch();
        r.recv(1, &[mr.sge(4096, 4096).at("sge")?])
            .at("post CM recv")?;
        r.finish();
        let mut s = qa.send_batch();
        s.send(2, SIG, &[mr.sge(0, CM_BYTES).at("sge")?])
            .at("post CM SEND")?;
        s.rdma_write(
            3,
            SIG,
            (base + 8192, mr.rkey()),
            &[mr.sge(0, CM_BYTES).at("sge")?],
        )
        .at("post CM WRITE")?;
        s.finish();
    }
    wait_for(cq, &mut wcs, idle, "CM SEND and WRITE completions")?;
    all_ok(&wcs, "CM SEND and WRITE status")?;
    // SAFETY: as above.
    unsafe {
        let mut s = qa.send_batch();
        s.rdma_read(
            4,
            SIG,
            (base + 8192, mr.rkey()),
            &[mr.sge(12288, CM_BYTES).at("sge")?],
        )
        .at("post CM READ")?;
        s.finish();
    }
    wait_for(cq, &mut wcs[..1], idle, "CM READ completion")?;
    all_ok(&wcs[..1], "CM READ status")?;
    let m = mr.as_slice();
    for (at, step) in [
        (4096, "CM SEND payload"),
        (8192, "CM WRITE payload"),
        (12288, "CM READ payload"),
    ] {
        if !(0..n).all(|i| m[at + i] == pattern(i)) {
            return Err(mismatch(step));
        }
    }
    // Disconnect: both ends see it, then leave TIME_WAIT.
    cm.disconnect(id).map_err(cm_err("disconnect"))?;
    for _ in 0..4 {
        match next_event(&mut cm, idle, "CM disconnect")? {
            CmEvent::Disconnected { .. } | CmEvent::TimeWaitExit { .. } => {}
            _ => return Err(mismatch("CM disconnect")),
        }
    }
    if cm.in_use() != 0 {
        return Err(mismatch("CM disconnect"));
    }
    qa.destroy().at("destroy CM QP")?;
    qb.destroy().at("destroy CM QP")?;
    drop(cm);
    cm_cq.destroy().at("destroy CM CQ")?;
    Ok(3 * CM_BYTES)
}
