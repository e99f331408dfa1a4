//! rdma-core's own memory-window cases (its `tests/test_mr.py` `MWTest`, the API cases of
//! its earlier `MWTest` and `test_qpex.py`'s `test_qp_ex_rc_bind_mw`), translated onto the
//! public API with their fixtures and assertions, run on two software RoCE devices on the
//! in-memory segment and on the PVRDMA model (one device, in loopback).
//!
//! The fixtures are `MWRC`'s: per player a region of `msg_size` (1024) bytes with local write
//! and `MW_BIND`, a window over all of it granting remote and local write, a CQ of `num_msgs`
//! (1000) entries, 10 iterations of `rdma_traffic` with RDMA WRITE (each side fills its region
//! with its letter, 'c' or 's', writes the peer's, and the peer's bytes are checked). The QPs
//! are the window tests' pairs (`mw_common::pair`: every remote right on the QP, a superset
//! of `MWRC`'s remote write; 16 WRs each way, of which these cases use at most two).
//!
//! A typed `Unsupported` counts as rdma-core's `SkipTest` (its `EOPNOTSUPP`). The classic and
//! the extended post API post the same work requests: here both are the batch API. Cases
//! rdma-core has that are not translated here: device-memory and dma-buf regions (no such
//! objects); a window type other than 1 or 2 is refused when the number becomes a
//! [`MwType`], before any device is asked, so that case passes on both devices.

mod common;
mod mw_common;
mod pair;

use bareverbs::error::{Error, ErrorKind, Param};
use bareverbs::verbs::*;
use bareverbs_model::ModelConfig;
use mw_common::{Cq, Pd, RcQp, SIG, one, pair, wait, write};
use pair::{Ends, on_pvrdma, on_rxe};

/// `RCResources.msg_size`.
const MSG_SIZE: usize = 1024;
/// `MWTest.iters`.
const ITERS: usize = 10;
/// `BaseResources.num_msgs`: the CQ's entries.
const NUM_MSGS: u32 = 1000;
/// `MWRC.create_mr`'s access.
const MWRC_MR: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::MW_BIND);
/// `MWRC`'s bind: remote and local write.
const MWRC_BIND: AccessFlags = AccessFlags::REMOTE_WRITE.union(AccessFlags::LOCAL_WRITE);

/// Cases the software device skips, with the reason (none: it has every feature they use).
const RXE_SKIPS: &[(&str, &str)] = &[];

/// Cases that pass on the PVRDMA model although it has no windows, with the reason (every
/// other case meets a typed `Unsupported` for windows and is skipped, as rdma-core skips on
/// `EOPNOTSUPP`).
const PVRDMA_PASSES: &[(&str, &str)] = &[(
    "test_mr::test_reg_mw_wrong_type",
    "the type number is refused when it becomes an MwType, before the device is asked",
)];

/// What a case did.
#[derive(Debug, PartialEq)]
enum Outcome {
    Pass,
    Skip(&'static str),
}

/// `r`'s value; a typed `Unsupported` is rdma-core's skip (`why`), any other error a failure.
fn supported<T>(r: Result<T, Error>, why: &'static str) -> Result<T, &'static str> {
    match r {
        Ok(v) => Ok(v),
        Err(e) if e.kind() == ErrorKind::Unsupported => Err(why),
        Err(e) => panic!("{why}: {e}"),
    }
}

/// The key `ibv_inc_rkey` makes of `k`: its low byte one more.
fn inc_rkey(k: u32) -> u8 {
    (k as u8).wrapping_add(1)
}

// --- test_mr.py: the API cases

fn alloc<P: Provider>(e: &Ends<'_, P>, kind: MwType, dealloc: bool) -> Result<(), &'static str> {
    let pd = e.a.alloc_pd().unwrap();
    let mw = supported(pd.alloc_mw(kind), "memory windows unsupported")?;
    assert_eq!(mw.kind(), kind);
    if dealloc {
        mw.dealloc().unwrap();
    }
    Ok(())
}

fn test_reg_mw_wrong_type<P: Provider>(e: &Ends<'_, P>) -> Result<(), &'static str> {
    assert_eq!(MwType::try_from(1), Ok(MwType::Type1));
    assert_eq!(MwType::try_from(2), Ok(MwType::Type2));
    let pd = e.a.alloc_pd().unwrap();
    // Its earlier version drew a type from 3..=100, its current one asks 3.
    for t in 3..=100u32 {
        let r = MwType::try_from(t).and_then(|k| pd.alloc_mw(k).map(|_| ()));
        match r {
            Err(Error::InvalidInput {
                param: Param::MwType,
                value,
                ..
            }) => assert_eq!(value, u64::from(t)),
            other => panic!("a window of type {t}: {other:?}"),
        }
    }
    Ok(())
}

// --- test_mr.py: MWRC and MWTest

/// Each player's PD and CQ (`BaseResources`).
struct Base<'c, P: Provider> {
    pd: [Pd<'c, P>; 2],
    cq: [Cq<'c, P>; 2],
}

impl<'c, P: Provider> Base<'c, P> {
    fn new(e: &Ends<'c, P>) -> Self {
        Base {
            pd: [e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap()],
            cq: [
                e.a.create_cq(NUM_MSGS).unwrap(),
                e.b.create_cq(NUM_MSGS).unwrap(),
            ],
        }
    }
}

/// One player: its QP, window, region and CQ, and where it writes (the peer's region
/// through the peer's window: `raddr`, `rkey`).
struct Side<'p, P: Provider> {
    qp: RcQp<'p, P>,
    mw: Option<MemoryWindow<'p, P>>,
    mr: MemoryRegion<'p, P>,
    cq: &'p Cq<'p, P>,
    remote: (u64, u32),
}

/// The client (device A) and the server (device B), connected; each with a region of
/// `access` and, when `kind` is given, a window of that type (`MWRC.__init__`).
fn players<'p, P: Provider>(
    e: &Ends<'_, P>,
    base: &'p Base<'_, P>,
    access: AccessFlags,
    kind: Option<MwType>,
) -> Result<(Side<'p, P>, Side<'p, P>), &'static str> {
    let mut mrs = Vec::new();
    for pd in &base.pd {
        mrs.push(supported(
            pd.register(MSG_SIZE, access),
            "reg MR with MW access unsupported",
        )?);
    }
    let (qc, qs) = pair(e, (&base.pd[0], &base.cq[0]), (&base.pd[1], &base.cq[1]));
    let mut mws = Vec::new();
    for pd in &base.pd {
        mws.push(match kind {
            Some(k) => Some(supported(pd.alloc_mw(k), "create MW unsupported")?),
            None => None,
        });
    }
    let (ms, mc) = (mrs.pop().unwrap(), mrs.pop().unwrap());
    let (ws, wc) = (mws.pop().unwrap(), mws.pop().unwrap());
    let side = |qp, mw, mr, cq| Side {
        qp,
        mw,
        mr,
        cq,
        remote: (0, 0),
    };
    Ok((side(qc, wc, mc, &base.cq[0]), side(qs, ws, ms, &base.cq[1])))
}

/// `u.poll_cq`: one completion, `wr_id`'s, a success of `op`.
fn poll_ok<P: Provider>(e: &Ends<'_, P>, cq: &Cq<'_, P>, wr_id: u64, op: WcOpcode) {
    let c = wait(e, cq, 1);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(
        (c[0].wr_id, c[0].opcode, c[0].status),
        (wr_id, op, WcStatus::Success)
    );
}

/// Each side's window key and region address, given to the other (the last lines of
/// `bind_mw_type_1` and `bind_mw_type_2`).
fn exchange<'p, P: Provider>(c: &mut Side<'p, P>, s: &mut Side<'p, P>, (kc, ks): (u32, u32)) {
    c.remote = (s.mr.addr(), ks);
    s.remote = (c.mr.addr(), kc);
}

/// `bind_mw_type_1`: each binds its type 1 window over its region (`ibv_bind_mw`).
fn bind_mw_type_1<'p, P: Provider>(e: &Ends<'_, P>, c: &mut Side<'p, P>, s: &mut Side<'p, P>) {
    let mut keys = [0; 2];
    for (k, p) in keys.iter_mut().zip([&mut *s, &mut *c]) {
        let bind = p.mr.window(0, MSG_SIZE as u64, MWRC_BIND).unwrap();
        *k = p.qp.bind_mw(1, SIG, p.mw.as_mut().unwrap(), &bind).unwrap();
        assert_eq!(*k, p.mw.as_ref().unwrap().rkey());
    }
    poll_ok(e, s.cq, 1, WcOpcode::BindMw);
    poll_ok(e, c.cq, 1, WcOpcode::BindMw);
    exchange(c, s, (keys[1], keys[0]));
}

/// `bind_mw_type_2`: each posts an `IBV_WR_BIND_MW` of its type 2 window, the key
/// `ibv_inc_rkey` of the window's.
fn bind_mw_type_2<'p, P: Provider>(e: &Ends<'_, P>, c: &mut Side<'p, P>, s: &mut Side<'p, P>) {
    let mut keys = [0; 2];
    for (k, p) in keys.iter_mut().zip([&mut *s, &mut *c]) {
        let bind = p.mr.window(0, MSG_SIZE as u64, MWRC_BIND).unwrap();
        let mw = p.mw.as_mut().unwrap();
        let key = inc_rkey(mw.rkey());
        let mut b = p.qp.send_batch();
        *k = b.bind_mw(1, SIG, mw, key, &bind).unwrap();
        b.finish();
        assert_eq!(*k & 0xFF, u32::from(key));
    }
    poll_ok(e, s.cq, 1, WcOpcode::BindMw);
    poll_ok(e, c.cq, 1, WcOpcode::BindMw);
    exchange(c, s, (keys[1], keys[0]));
}

/// `prepare_validate_data`: the client's region all 'c', the server's all 's'.
fn prepare<'p, P: Provider>(c: &mut Side<'p, P>, s: &mut Side<'p, P>) {
    c.mr.as_mut_slice().fill(b'c');
    s.mr.as_mut_slice().fill(b's');
}

/// One side writes its region to the peer's through the peer's window; `Err` with the
/// status of a completion that is not a success (the peer's bytes untouched then).
fn write_turn<P: Provider>(
    e: &Ends<'_, P>,
    from: &mut Side<'_, P>,
    to: &Side<'_, P>,
) -> Result<(), WcStatus> {
    let theirs = to.mr.as_slice()[0];
    write(&mut from.qp, 2, from.remote, &from.mr, MSG_SIZE as u32);
    let c = wait(e, from.cq, 1);
    let c = one(&c, 2);
    if c.status != WcStatus::Success {
        assert!(to.mr.as_slice().iter().all(|&b| b == theirs), "written");
        return Err(c.status);
    }
    assert_eq!(c.opcode, WcOpcode::RdmaWrite);
    let mine = from.mr.as_slice()[0];
    assert!(to.mr.as_slice().iter().all(|&b| b == mine), "validate");
    Ok(())
}

/// `rdma_traffic` with `IBV_WR_RDMA_WRITE`: `ITERS` rounds, the client's write then the
/// server's, each checked at the peer; the status of the first that fails.
fn rdma_traffic<'p, P: Provider>(
    e: &Ends<'_, P>,
    c: &mut Side<'p, P>,
    s: &mut Side<'p, P>,
) -> Result<(), WcStatus> {
    for _ in 0..ITERS {
        prepare(c, s);
        write_turn(e, c, s)?;
        prepare(c, s);
        write_turn(e, s, c)?;
    }
    Ok(())
}

/// `assertRaisesRegex(PyverbsRDMAError, 'Remote access error')` around `rdma_traffic`.
fn traffic_fails<'p, P: Provider>(e: &Ends<'_, P>, c: &mut Side<'p, P>, s: &mut Side<'p, P>) {
    assert_eq!(rdma_traffic(e, c, s), Err(WcStatus::RemAccessErr));
}

/// What a case does between its traffic and the traffic that must fail.
type Then<P> = for<'p> fn(&Ends<'_, P>, &mut Side<'p, P>, &mut Side<'p, P>);

/// `test_mw_type1` and the cases built on it: the players bound and their traffic run;
/// then `after` (the invalidation) and the traffic that must fail.
fn mw_case<P: Provider>(
    e: &Ends<'_, P>,
    kind: MwType,
    after: Option<Then<P>>,
) -> Result<(), &'static str> {
    let base = Base::new(e);
    let (mut c, mut s) = players(e, &base, MWRC_MR, Some(kind))?;
    match kind {
        MwType::Type1 => bind_mw_type_1(e, &mut c, &mut s),
        MwType::Type2 => bind_mw_type_2(e, &mut c, &mut s),
    }
    rdma_traffic(e, &mut c, &mut s).unwrap();
    if let Some(after) = after {
        after(e, &mut c, &mut s);
        traffic_fails(e, &mut c, &mut s);
    }
    Ok(())
}

/// `invalidate_mw_type1`: each rebinds its window with length 0 and no access.
fn invalidate_mw_type1<'p, P: Provider>(e: &Ends<'_, P>, c: &mut Side<'p, P>, s: &mut Side<'p, P>) {
    for p in [s, c] {
        let bind = p.mr.window(0, 0, AccessFlags::empty()).unwrap();
        p.qp.bind_mw(3, SIG, p.mw.as_mut().unwrap(), &bind).unwrap();
        poll_ok(e, p.cq, 3, WcOpcode::BindMw);
    }
}

/// `invalidate_mw_type2_local`: each posts `IBV_WR_LOCAL_INV` of its own window's key (the
/// key the peer writes with).
fn invalidate_mw_type2_local<'p, P: Provider>(
    e: &Ends<'_, P>,
    c: &mut Side<'p, P>,
    s: &mut Side<'p, P>,
) {
    let (kc, ks) = (s.remote.1, c.remote.1);
    for (p, k) in [(&mut *c, kc), (&mut *s, ks)] {
        let mut b = p.qp.send_batch();
        b.local_inv(3, SIG, k).unwrap();
        b.finish();
    }
    poll_ok(e, s.cq, 3, WcOpcode::LocalInv);
    poll_ok(e, c.cq, 3, WcOpcode::LocalInv);
}

/// `invalidate_mw_type2_remote`: each posts a receive of `msg_size`, then a SEND with
/// invalidate (no data) naming the peer's window; both sends and both receives succeed.
fn invalidate_mw_type2_remote<'p, P: Provider>(
    e: &Ends<'_, P>,
    c: &mut Side<'p, P>,
    s: &mut Side<'p, P>,
) {
    for p in [&mut *s, &mut *c] {
        let sge = p.mr.sge(0, MSG_SIZE as u32).unwrap();
        // SAFETY: the region outlives the QP; the CPU reads it only after the completion.
        unsafe { p.qp.post_recv_raw(4, &[sge]).unwrap() };
    }
    for p in [&mut *c, &mut *s] {
        let mut b = p.qp.send_batch();
        // SAFETY: no memory named.
        unsafe { b.send_with_inv(5, SIG, p.remote.1, &[]).unwrap() };
        b.finish();
    }
    for (p, own) in [(&*s, c.remote.1), (&*c, s.remote.1)] {
        let wcs = wait(e, p.cq, 2);
        assert_eq!(wcs.len(), 2, "{wcs:?}");
        let send = one(&wcs, 5);
        assert_eq!(
            (send.opcode, send.status),
            (WcOpcode::Send, WcStatus::Success)
        );
        let recv = one(&wcs, 4);
        assert_eq!(
            (recv.opcode, recv.status),
            (WcOpcode::Recv, WcStatus::Success)
        );
        assert_eq!(recv.invalidated_rkey(), Some(own), "{recv:?}");
    }
}

/// `test_mw_type2_invalidate_dealloc`: both windows deallocated (`ibv_dealloc_mw`).
fn dealloc_mws<'p, P: Provider>(_: &Ends<'_, P>, c: &mut Side<'p, P>, s: &mut Side<'p, P>) {
    for p in [s, c] {
        let mw = p.mw.take().unwrap();
        mw.dealloc().unwrap();
    }
}

// --- test_qpex.py

/// `test_qp_ex_rc_bind_mw`: the server's region grants remote write; a type 2 window over
/// all of it, bound (wr_id 0x123) with local write only, refuses the client's write (wr_id
/// 0x124) through it with a remote access error.
fn test_qp_ex_rc_bind_mw<P: Provider>(e: &Ends<'_, P>) -> Result<(), &'static str> {
    let base = Base::new(e);
    let access = MWRC_MR | AccessFlags::REMOTE_WRITE; // create_custom_mr adds local write
    let (mut c, mut s) = players(e, &base, access, None)?;
    let bind =
        s.mr.window(0, MSG_SIZE as u64, AccessFlags::LOCAL_WRITE)
            .unwrap();
    let mut mw = supported(
        base.pd[1].alloc_mw(MwType::Type2),
        "memory window allocation unsupported",
    )?;
    let key = inc_rkey(mw.rkey());
    let mut b = s.qp.send_batch();
    let new_key = b.bind_mw(0x123, SIG, &mut mw, key, &bind).unwrap();
    b.finish();
    poll_ok(e, s.cq, 0x123, WcOpcode::BindMw);
    s.mr.as_mut_slice().fill(b's');
    write(
        &mut c.qp,
        0x124,
        (s.mr.addr(), new_key),
        &c.mr,
        MSG_SIZE as u32,
    );
    let wcs = wait(e, c.cq, 1);
    assert_eq!(one(&wcs, 0x124).status, WcStatus::RemAccessErr);
    assert!(s.mr.as_slice().iter().all(|&b| b == b's'), "written");
    drop((c, s));
    drop(mw);
    Ok(())
}

type Case<P> = (&'static str, fn(&Ends<'_, P>) -> Result<(), &'static str>);

fn cases<P: Provider>() -> Vec<Case<P>> {
    vec![
        ("test_mr::test_reg_mw_type1", |e| {
            alloc(e, MwType::Type1, false)
        }),
        ("test_mr::test_reg_mw_type2", |e| {
            alloc(e, MwType::Type2, false)
        }),
        ("test_mr::test_dereg_mw_type1", |e| {
            alloc(e, MwType::Type1, true)
        }),
        ("test_mr::test_dereg_mw_type2", |e| {
            alloc(e, MwType::Type2, true)
        }),
        ("test_mr::test_reg_mw_wrong_type", test_reg_mw_wrong_type),
        ("test_mr::test_mw_type1", |e| {
            mw_case(e, MwType::Type1, None)
        }),
        ("test_mr::test_invalidate_mw_type1", |e| {
            mw_case(e, MwType::Type1, Some(invalidate_mw_type1))
        }),
        ("test_mr::test_mw_type2", |e| {
            mw_case(e, MwType::Type2, None)
        }),
        ("test_mr::test_mw_type2_invalidate_local", |e| {
            mw_case(e, MwType::Type2, Some(invalidate_mw_type2_local))
        }),
        ("test_mr::test_mw_type2_invalidate_remote", |e| {
            mw_case(e, MwType::Type2, Some(invalidate_mw_type2_remote))
        }),
        ("test_mr::test_mw_type2_invalidate_dealloc", |e| {
            mw_case(e, MwType::Type2, Some(dealloc_mws))
        }),
        ("test_qpex::test_qp_ex_rc_bind_mw", test_qp_ex_rc_bind_mw),
    ]
}

/// Runs every case, each on fresh devices from `run`; returns (passed, skipped) by name
/// after printing each skip.
fn run_all<P: Provider>(
    dev: &str,
    run: impl Fn(&dyn Fn(&Ends<'_, P>) -> Outcome) -> Outcome,
) -> (Vec<&'static str>, Vec<&'static str>) {
    let (mut pass, mut skip) = (Vec::new(), Vec::new());
    for (name, case) in cases::<P>() {
        match run(&|e| case(e).map_or_else(Outcome::Skip, |()| Outcome::Pass)) {
            Outcome::Pass => pass.push(name),
            Outcome::Skip(why) => {
                println!("{dev}: {name}: skipped ({why})");
                skip.push(name);
            }
        }
    }
    (pass, skip)
}

/// The names of `list`.
fn names(list: &[(&'static str, &str)]) -> Vec<&'static str> {
    list.iter().map(|&(n, _)| n).collect()
}

#[test]
fn rdma_cores_memory_window_cases_on_both_devices() {
    let (rxe_pass, rxe_skip) = run_all("rxe", |case| on_rxe(|e| case(e)));
    let (pv_pass, pv_skip) = run_all("pvrdma", |case| {
        on_pvrdma(ModelConfig::default(), |e| case(e))
    });
    println!(
        "rdma-core mw cases: rxe {}/{}, pvrdma {}/{}",
        rxe_pass.len(),
        rxe_skip.len(),
        pv_pass.len(),
        pv_skip.len()
    );
    let all = cases::<pair::R>().len();
    assert_eq!(rxe_pass.len() + rxe_skip.len(), all);
    assert_eq!(pv_pass.len() + pv_skip.len(), all);
    assert_eq!(rxe_skip, names(RXE_SKIPS), "the software device's skips");
    assert_eq!(pv_pass, names(PVRDMA_PASSES), "PVRDMA has no windows");
}
