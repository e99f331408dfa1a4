//! `cmtime` (librdmacm-utils' connection set-up timer, rdma-core 44): many RC connections
//! through the CM at once, then their disconnection, and nothing sent on them.
//!
//! - The client (`cmtime -s <server> -c N`, 100 by default) resolves, makes a QP (one send
//!   and one receive request) and sends a REQ for each of its N connections, all before it
//!   waits for any REP; once all are up it sends a DREQ on each and waits for every DREP.
//!   A connection that is rejected or fails is counted as failed and left out after.
//! - The server (`cmtime`) accepts every request on a new QP, and on each DREQ answers with
//!   a DREP and destroys the connection. It never exits by itself.
//! - Port 7471 (ucmatose's), depths 1/1, no private data but rdma_cm's header.
//!
//! Here the unikernel plays either side. As the client it keeps at most [`WINDOW`]
//! connections between REQ and RTU, and as many disconnections between DREQ and DREP, as
//! rdma_cm's applications pace themselves; as the server it takes the requests as they come.
//! The limits: the device's queue pairs ([`bareverbs::device::rxe::MAX_QP`], 128) and the
//! CM's table of the lab's cases ([`super::CONNS`], 128); `-c` takes at most [`MAX_CONNS`].

use core::fmt::Write;

use bareverbs::Context;
use bareverbs::cm::{
    AcceptParams, Cm, CmAddr, CmConfig, CmCounts, CmEvent, ConnId, ConnectParams,
    Failure as CmFailure, Service,
};
use bareverbs::verbs::*;

use super::{CONNS, CaseError, Ms, RETRY_MS};
use crate::Step;

/// cmtime's port.
pub const CMTIME_PORT: u16 = 7471;
/// Connections of a case, at most (`-c`): the device's 128 queue pairs with room to spare.
pub const MAX_CONNS: u32 = 120;
/// Connections between REQ and RTU (or DREQ and DREP) at once, when the unikernel connects.
pub const WINDOW: usize = 4;

/// A connection of the case: its ID, and its QP once in RTS.
struct Slot<'a, P: Provider> {
    id: Option<ConnId>,
    qp: Option<QueuePair<'a, P, Rc, Rts>>,
    up: bool,
    down: bool,
}

impl<P: Provider> Default for Slot<'_, P> {
    fn default() -> Self {
        Slot {
            id: None,
            qp: None,
            up: false,
            down: false,
        }
    }
}

/// Runs a cmtime case and prints its `roce-uk` line under `name` (with what the CM counted):
/// the unikernel connects `case.count` times when Linux serves, else it serves that many
/// connections. `true` if it passed.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_case<P: Provider>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    linux: ([u8; 4], bool),
    name: &str,
    case: &super::CmCase,
    linux_serves: bool,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
    out: &mut dyn Write,
) -> bool {
    let t0 = clock_ms();
    let mut counts = CmCounts::default();
    let r = run(
        ctx,
        pd,
        linux,
        case,
        linux_serves,
        deadline,
        clock_ms,
        &mut counts,
    );
    let ms = clock_ms() - t0;
    let CmCounts {
        received,
        sent,
        resent,
        send_dropped,
        ..
    } = counts;
    let cm = format_args!(
        "CM messages {received} taken, {sent} sent, {resent} resent, {send_dropped} not sent for want of a buffer"
    );
    match r {
        Ok(up_ms) => {
            let _ = writeln!(
                out,
                "roce-uk {name}: ok {} connections, {}, all up in {up_ms} ms; {ms} ms in all; {cm}",
                case.count,
                if linux_serves {
                    "each made, established and disconnected by this side (DREQ, DREP)"
                } else {
                    "each from Linux accepted, established (RTU) and ended by Linux's DREQ"
                },
            );
            true
        }
        Err(e) => {
            let _ = writeln!(out, "roce-uk {name}: FAIL {e} (after {ms} ms); {cm}");
            false
        }
    }
}

/// The case: `Ok` with the milliseconds until the last connection came up; what the CM
/// counted in `counts` either way.
#[allow(clippy::too_many_arguments)]
fn run<P: Provider>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    (linux, v6): ([u8; 4], bool),
    case: &super::CmCase,
    linux_serves: bool,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
    counts: &mut CmCounts,
) -> Result<u64, CaseError> {
    // 80 entries: QP1 takes 64 receive buffers, for Linux's hundred REQs in one burst.
    let cm_cq = ctx.create_cq(80).at("cm: create CM CQ")?;
    // No request is ever posted on the connections' QPs: one small CQ for all, as cmtime.
    let cq = ctx.create_cq(4).at("cm: create CQ")?;
    let mut cm: Cm<'_, P, Ms<'_>, CONNS> = Cm::new(pd, &cm_cq, Ms(clock_ms), CmConfig::default())
        .map_err(|e| CaseError::Cm("CM over QP1", e))?;
    let linux = super::linux_addr(&cm, linux, v6)?;
    let n = case.count as usize;
    let mut slots: [Slot<'_, P>; MAX_CONNS as usize] = core::array::from_fn(|_| Slot::default());
    let mut t = Times {
        start: clock_ms(),
        up: 0,
    };
    let r = if linux_serves {
        connect_all(
            &mut cm,
            pd,
            &cq,
            linux,
            &mut slots[..n],
            deadline,
            clock_ms,
            &mut t,
        )
    } else {
        serve_all(
            &mut cm,
            pd,
            &cq,
            linux,
            &mut slots[..n],
            deadline,
            clock_ms,
            &mut t,
        )
    };
    // Whatever happened: every QP still held goes (the CM's entries go with it).
    for s in slots.iter_mut() {
        if let Some(q) = s.qp.take() {
            let _ = q.to_error().map(|q| q.destroy());
        }
    }
    *counts = cm.counts();
    r.map(|()| t.up - t.start)
}

/// When the case started and when the last connection came up (ms).
struct Times {
    start: u64,
    up: u64,
}

fn qp<'a, P: Provider>(
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
) -> Result<QueuePair<'a, P, Rc, Reset>, CaseError> {
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    Ok(pd
        .qp_builder(cq, cq)
        .caps(caps)
        .build::<Rc>()
        .at("cm: create QP")?)
}

fn slot_of<P: Provider>(slots: &[Slot<'_, P>], id: ConnId) -> Option<usize> {
    slots.iter().position(|s| s.id == Some(id))
}

/// The unikernel as cmtime's client: connects every slot (at most [`WINDOW`] at once, again
/// while Linux does not listen yet), then disconnects every one.
#[allow(clippy::too_many_arguments)]
fn connect_all<'a, P: Provider, const N: usize>(
    cm: &mut Cm<'a, P, Ms<'_>, N>,
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    linux: CmAddr,
    slots: &mut [Slot<'a, P>],
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
    t: &mut Times,
) -> Result<(), CaseError> {
    let n = slots.len();
    let mut up = 0;
    let mut waiting_until = 0;
    while up < n {
        if clock_ms() > deadline {
            return Err(CaseError::Deadline("the connections' REPs"));
        }
        let in_flight = slots.iter().filter(|s| s.id.is_some() && !s.up).count();
        let next = slots.iter().position(|s| s.id.is_none());
        if let Some(i) = next
            && in_flight < WINDOW
            && clock_ms() >= waiting_until
        {
            let q = qp(pd, cq)?;
            let id = cm
                .connect(q, linux, CMTIME_PORT, &ConnectParams::default())
                .map_err(|(_, e)| CaseError::Cm("connect", e))?;
            slots[i].id = Some(id);
        }
        match cm.poll() {
            Some(CmEvent::Established {
                id, qp: Some(q), ..
            }) => {
                let i = slot_of(slots, id).ok_or(CaseError::Request("an unknown connection"))?;
                slots[i].qp = Some(q);
                slots[i].up = true;
                up += 1;
            }
            Some(CmEvent::Failed {
                id,
                failure: CmFailure::Rejected { reason: 8 },
                ..
            }) if up == 0 => {
                // Nobody listens yet (before the first connection only): that slot again,
                // a little later (its QP, handed back, goes).
                if let Some(i) = slot_of(slots, id) {
                    slots[i].id = None;
                }
                waiting_until = clock_ms() + RETRY_MS;
            }
            Some(CmEvent::Failed { failure, .. }) => return Err(CaseError::Connect(failure)),
            _ => {}
        }
    }
    t.up = clock_ms();
    // Disconnect every one: the QP to ERROR first (as Linux), at most WINDOW DREQs at once.
    let (mut asked, mut down) = (0, 0);
    while down < n {
        if clock_ms() > deadline {
            return Err(CaseError::Deadline("the DREPs"));
        }
        if asked < n && asked - down < WINDOW {
            let s = &mut slots[asked];
            if let (Some(id), Some(q)) = (s.id, s.qp.take()) {
                let q = q.to_error().at("cm: QP to ERROR")?;
                cm.disconnect(id)
                    .map_err(|e| CaseError::Cm("disconnect", e))?;
                q.destroy().at("cm: destroy QP")?;
            }
            asked += 1;
        }
        if let Some(CmEvent::Disconnected { id }) = cm.poll()
            && let Some(i) = slot_of(slots, id)
            && !slots[i].down
        {
            slots[i].down = true;
            down += 1;
        }
    }
    Ok(())
}

/// The unikernel as cmtime's server: accepts requests from `linux` until every slot is taken
/// and each has come up and been disconnected by Linux.
#[allow(clippy::too_many_arguments)]
fn serve_all<'a, P: Provider, const N: usize>(
    cm: &mut Cm<'a, P, Ms<'_>, N>,
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    linux: CmAddr,
    slots: &mut [Slot<'a, P>],
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
    t: &mut Times,
) -> Result<(), CaseError> {
    cm.listen(None, CMTIME_PORT, Service::Rc)
        .map_err(|e| CaseError::Cm("listen", e))?;
    let n = slots.len();
    let (mut taken, mut up, mut down) = (0, 0, 0);
    while down < n {
        if clock_ms() > deadline {
            return Err(CaseError::Deadline(if taken < n {
                "the requests"
            } else if up < n {
                "the RTUs"
            } else {
                "the DREQs"
            }));
        }
        match cm.poll() {
            Some(CmEvent::ConnectRequest(r)) => {
                // Another station's, another port's, or one beyond -c (a REQ Linux sent
                // again after its first one's connection had come and gone): rejected.
                if r.src_addr != linux || r.dst_port != CMTIME_PORT || taken == n {
                    let _ = cm.reject(r.id, &[]);
                    continue;
                }
                let q = qp(pd, cq)?;
                let q = cm
                    .accept(r.id, q, &AcceptParams::default())
                    .map_err(|(_, e)| CaseError::Cm("accept", e))?;
                slots[taken].id = Some(r.id);
                slots[taken].qp = Some(q);
                taken += 1;
            }
            Some(CmEvent::Established { id, qp: None, .. }) => {
                if let Some(i) = slot_of(slots, id)
                    && !slots[i].up
                {
                    slots[i].up = true;
                    up += 1;
                    if up == n {
                        t.up = clock_ms();
                    }
                }
            }
            Some(CmEvent::Disconnected { id }) => {
                let i = slot_of(slots, id).ok_or(CaseError::Request("an unknown connection"))?;
                if let Some(q) = slots[i].qp.take() {
                    q.to_error()
                        .at("cm: QP to ERROR")?
                        .destroy()
                        .at("cm: destroy QP")?;
                }
                if !slots[i].down {
                    slots[i].down = true;
                    down += 1;
                }
            }
            Some(CmEvent::Failed { failure, .. }) => return Err(CaseError::Connect(failure)),
            _ => {}
        }
    }
    if up < n {
        return Err(CaseError::Disconnected("every RTU"));
    }
    Ok(())
}
