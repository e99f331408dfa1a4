//! Two appliances, one namespace: two targets (on B and C) serve one subsystem over one
//! shared medium, and host A reaches it by both paths. Each target takes controller IDs
//! from its own range and reports the same namespace identity; the ANA log, its change
//! counts and the ANA change notice follow the states the targets are given; a path whose
//! target dies, or whose group is made inaccessible, is left for the other with no write
//! lost.

mod common;

use std::cell::Cell;

use bareverbs::hal::Clock;

use bareverbs_nvmf::block::{BlockDevice, SharedRam};
use bareverbs_nvmf::host::{Data, HostConfig, HostError};
use bareverbs_nvmf::target::{Multipath, NsIds, Peer, Subsystem, TargetConfig, TargetError};
use bareverbs_nvmf::wire::ana::{self, AnaState};
use bareverbs_nvmf::wire::fabrics::DISCOVERY_NQN;
use bareverbs_nvmf::wire::identify::{CtrlInfo, IDENTIFY_LEN, cns, discovery, nidt};
use bareverbs_nvmf::wire::{Sqe, Status, feature, log, opcode};
use common::*;

const NGUID: [u8; 16] = *b"bareverbs-shared";
const EUI64: [u8; 8] = [0x02, 0xBA, 0x2E, 0, 0, 0, 0, 1];
const UUID: [u8; 16] = [
    0x6b, 0x0e, 0x57, 0xa1, 0x3c, 0x21, 0x4f, 0x0e, 0x9d, 0x5e, 0x1a, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f,
];
/// The shared namespace: ANA group 2.
static IDS: [NsIds; 1] = [NsIds {
    nguid: Some(NGUID),
    eui64: Some(EUI64),
    uuid: Some(UUID),
    anagrpid: 2,
}];
const RANGE_B: (u16, u16) = (1, 0x7FFF);
const RANGE_C: (u16, u16) = (0x8000, 0xFFEF);

/// Appliance B's configuration: its controller IDs, appliance C as its peer.
fn cfg_of(range: (u16, u16), peer: [u8; 4], port_id: u16) -> TargetConfig {
    let mut peers = [None; bareverbs_nvmf::target::MAX_PEERS];
    peers[0] = Some(Peer {
        addr: peer,
        port: 4420,
        port_id: if port_id == 1 { 2 } else { 1 },
    });
    TargetConfig {
        cntlid_min: range.0,
        cntlid_max: range.1,
        port_id,
        peers,
        ..tcfg()
    }
}

/// One round of idle time: the clock moves 20 µs and every live target polls (`$alive`: B
/// is; C always is).
macro_rules! idle {
    ($clk:expr, $tb:ident, $cmb:ident, $tc:ident, $cmc:ident, $alive:ident) => {
        &mut || {
            $clk.advance(20);
            if $alive.get() {
                $tb.poll(&mut $cmb);
            }
            $tc.poll(&mut $cmc);
        }
    };
}

/// The lab: targets on B (optimized) and C (non-optimized) over one shared 1 MiB medium,
/// host A with a controller on each (`$hb`, `$hc`, sharing A's CM `$cma`).
macro_rules! rig {
    ($l:ident, $tb:ident, $cmb:ident, $tc:ident, $cmc:ident, $hb:ident, $hc:ident, $cma:ident, $alive:ident, $ram:ident) => {
        rig!($l, $tb, $cmb, $tc, $cmc, $hb, $hc, $cma, $alive, $ram, _sd);
    };
    ($l:ident, $tb:ident, $cmb:ident, $tc:ident, $cmc:ident, $hb:ident, $hc:ident, $cma:ident, $alive:ident, $ram:ident, $sd:ident) => {
        let $l = lab();
        let (sa, sa2, $sd) = (side(&$l.a), side(&$l.a), side(&$l.a));
        let (sb, sc) = (side(&$l.b), side(&$l.c));
        let mut $cma = cm(&sa, &$l.clk);
        let mut $cmb = target_cm(&sb, &$l.clk);
        let mut $cmc = target_cm(&sc, &$l.clk);
        let mut mem = vec![0u8; (1 << 20) + 8];
        let off = mem.as_ptr().align_offset(8);
        let $ram = SharedRam::new(&mut mem[off..off + (1 << 20)], 512).unwrap();
        let (mut db, mut dc) = ($ram.handle(), $ram.handle());
        let mut nsb: [&mut dyn BlockDevice; 1] = [&mut db];
        let mut nsc: [&mut dyn BlockDevice; 1] = [&mut dc];
        let mut subb = [Subsystem {
            multipath: Multipath::new(&IDS),
            ..Subsystem::new(NQN, &mut nsb)
        }];
        let mut subc = [Subsystem {
            multipath: Multipath::new(&IDS).with_state(2, AnaState::NonOptimized),
            ..Subsystem::new(NQN, &mut nsc)
        }];
        let cfgb = cfg_of(RANGE_B, IP_C, 1);
        let cfgc = cfg_of(RANGE_C, IP_B, 2);
        let mut $tb: T = T::new(&sb.pd, &sb.dcq, $l.clk.clone(), IP_B, cfgb, &mut subb).unwrap();
        let mut $tc: T = T::new(&sc.pd, &sc.dcq, $l.clk.clone(), IP_C, cfgc, &mut subc).unwrap();
        let hc_cfg = |addr| HostConfig {
            addr,
            timeout_ms: 200,
            ..hcfg(HOST_A)
        };
        let mut $hb: H = H::new(&sa.pd, &sa.dcq, $l.clk.clone(), hc_cfg(IP_B));
        let mut $hc: H = H::new(&sa2.pd, &sa2.dcq, $l.clk.clone(), hc_cfg(IP_C));
        let $alive = Cell::new(true);
        let clk = $l.clk.clone();
        $hb.connect(&mut $cma, idle!(clk, $tb, $cmb, $tc, $cmc, $alive))
            .unwrap();
        $hc.connect(&mut $cma, idle!(clk, $tb, $cmb, $tc, $cmc, $alive))
            .unwrap();
    };
}

/// The namespace identification descriptors of a list, as `(type, value)`.
fn descriptors(b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= b.len() && b[at] != 0 {
        let len = usize::from(b[at + 1]);
        out.push((b[at], b[at + 4..at + 4 + len].to_vec()));
        at += 4 + len;
    }
    out
}

/// Get Log Page ANA with its log specific field and Retain Asynchronous Event bit.
fn ana_sqe(len: u32, rgo: bool, rae: bool) -> Sqe {
    let numd = len / 4 - 1;
    let mut s = Sqe::new(opcode::GET_LOG_PAGE, 0);
    s.set_nsid(0xFFFF_FFFF);
    let lsp = if rgo { u32::from(ana::LSP_RGO) << 8 } else { 0 };
    s.set_cdw(
        10,
        u32::from(log::ANA) | lsp | (u32::from(rae) << 15) | (numd << 16),
    );
    s
}

/// Set Features, Asynchronous Event Configuration.
fn aec_sqe(v: u32) -> Sqe {
    let mut s = Sqe::new(opcode::SET_FEATURES, 0);
    s.set_cdw(10, u32::from(feature::ASYNC_EVENT));
    s.set_cdw(11, v);
    s
}

/// A group descriptor as `(group, change count, state, nsids)`.
type Group = (u32, u64, u8, Vec<u32>);

/// `(change count, groups)` of an ANA log.
fn ana_groups(b: &[u8]) -> (u64, Vec<Group>) {
    let (chg, _) = ana::parse_header(b).unwrap();
    let groups = ana::groups(b)
        .map(|(d, ids)| {
            let ns = ids
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (d.grpid, d.chgcnt, d.state, ns)
        })
        .collect();
    (chg, groups)
}

#[test]
fn two_appliances_serve_one_namespace_as_one_subsystem() {
    rig!(l, tb, cmb, tc, cmc, hb, hc, cma, alive, _ram);
    let clk = l.clk.clone();
    // Distinct controller IDs, each from its target's range.
    let (ib, ic) = (hb.cntlid(), hc.cntlid());
    assert!((RANGE_B.0..=RANGE_B.1).contains(&ib), "B's ID {ib:#x}");
    assert!((RANGE_C.0..=RANGE_C.1).contains(&ic), "C's ID {ic:#x}");
    assert_ne!(ib, ic);
    // Identify Controller: several ports and controllers, ANA reported and announced.
    let mut b = [0u8; IDENTIFY_LEN];
    let mut nqns = Vec::new();
    for h in [&mut hb, &mut hc] {
        h.identify(
            cns::CONTROLLER,
            0,
            &mut b,
            idle!(clk, tb, cmb, tc, cmc, alive),
        )
        .unwrap();
        let c = CtrlInfo::parse(&b).unwrap();
        assert_eq!(c.cmic, 0x0B);
        assert_eq!(c.oaes & ana::AEN_ANA_CHANGE, ana::AEN_ANA_CHANGE);
        assert_eq!((c.anagrpmax, c.nanagrpid, c.mnan, c.nn), (4, 4, 1, 1));
        assert_eq!(
            c.anacap & 0x07,
            0x07,
            "optimized, non-optimized, inaccessible"
        );
        assert_eq!((b[342], b[343]), (10, 0x47), "ANATT, ANACAP");
        nqns.push(b[768..1024].to_vec());
    }
    assert_eq!(nqns[0], nqns[1], "one subsystem NQN");
    // Identify Namespace and the descriptors: shared, group 2, the configured identity on
    // both paths.
    let mut descs = Vec::new();
    for h in [&mut hb, &mut hc] {
        let ns = h
            .identify_namespace(1, idle!(clk, tb, cmb, tc, cmc, alive))
            .unwrap();
        assert_eq!((ns.nmic, ns.anagrpid), (1, 2));
        assert_eq!((ns.nguid, ns.eui64), (NGUID, EUI64));
        h.identify(
            cns::NS_DESC_LIST,
            1,
            &mut b,
            idle!(clk, tb, cmb, tc, cmc, alive),
        )
        .unwrap();
        descs.push(descriptors(&b));
    }
    assert_eq!(descs[0], descs[1]);
    assert_eq!(
        descs[0],
        vec![
            (nidt::EUI64, EUI64.to_vec()),
            (nidt::NGUID, NGUID.to_vec()),
            (nidt::UUID, UUID.to_vec()),
            (nidt::CSI, vec![0]),
        ]
    );
    // One medium: written through B, read through C, and the other way.
    let data = pattern(4096, 1);
    hb.write(1, 1, 100, 8, &data, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    let mut back = vec![0u8; 4096];
    hc.read(1, 1, 100, 8, &mut back, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    assert_eq!(back, data);
    let data2 = pattern(1024, 2);
    hc.write(2, 1, 7, 2, &data2, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    hb.flush(1, 1, idle!(clk, tb, cmb, tc, cmc, alive)).unwrap();
    hb.read(
        2,
        1,
        7,
        2,
        &mut back[..1024],
        idle!(clk, tb, cmb, tc, cmc, alive),
    )
    .unwrap();
    assert_eq!(&back[..1024], &data2[..]);
}

#[test]
fn ana_log_gives_groups_states_and_change_counts() {
    rig!(l, tb, cmb, tc, cmc, hb, hc, cma, alive, _ram);
    let clk = l.clk.clone();
    let mut page = vec![0u8; 64];
    hb.get_log_page(log::ANA, 0, &mut page, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    assert_eq!(
        ana_groups(&page),
        (0, vec![(2, 0, 1, vec![1])]),
        "B: optimized"
    );
    hc.get_log_page(log::ANA, 0, &mut page, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    assert_eq!(
        ana_groups(&page),
        (0, vec![(2, 0, 2, vec![1])]),
        "C: non-optimized"
    );
    // Return Groups Only: the descriptor without its NSIDs.
    let mut out = [0u8; 64];
    hb.exec(
        0,
        ana_sqe(64, true, false),
        Data::In(64),
        &mut out,
        idle!(clk, tb, cmb, tc, cmc, alive),
    )
    .unwrap();
    assert_eq!(ana_groups(&out), (0, vec![(2, 0, 1, vec![])]));
    // A change: the log's change count and the group's go up, on B only.
    assert_eq!(tb.set_ana_state(0, 2, AnaState::NonOptimized), Ok(0));
    assert_eq!(tb.ana_state(0, 2), Some(AnaState::NonOptimized));
    hb.get_log_page(log::ANA, 0, &mut page, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    assert_eq!(ana_groups(&page), (1, vec![(2, 1, 2, vec![1])]));
    // The same state again is no change.
    assert_eq!(tb.set_ana_state(0, 2, AnaState::NonOptimized), Ok(0));
    hb.get_log_page(log::ANA, 0, &mut page, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    assert_eq!(ana_groups(&page).0, 1);
    // From an offset: the descriptor's bytes where the page has them.
    let mut tail = [0u8; 36];
    hb.get_log_page(log::ANA, 16, &mut tail, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    assert_eq!(&tail[..4], &2u32.to_le_bytes());
    assert_eq!((tail[16], &tail[32..36]), (2, &1u32.to_le_bytes()[..]));
    // Past the page's end: an invalid field.
    assert_eq!(
        hb.get_log_page(
            log::ANA,
            4096,
            &mut tail,
            idle!(clk, tb, cmb, tc, cmc, alive)
        ),
        Err(HostError::Status(Status::INVALID_FIELD))
    );
    // What the target refuses to set.
    for (g, s) in [
        (0, AnaState::Optimized),
        (5, AnaState::Optimized),
        (1, AnaState::PersistentLoss),
        (1, AnaState::Change),
    ] {
        assert!(matches!(
            tb.set_ana_state(0, g, s),
            Err(TargetError::Config(_))
        ));
    }
    assert!(
        tb.set_ana_state(1, 1, AnaState::Optimized).is_err(),
        "no subsystem 1"
    );
}

#[test]
fn an_ana_change_is_announced_to_hosts_that_enabled_the_notice() {
    rig!(l, tb, cmb, tc, cmc, hb, hc, cma, alive, _ram);
    let clk = l.clk.clone();
    let none = &mut [0u8; 0][..];
    // B's host enables ANA change notices; C's host enables none.
    hb.exec(
        0,
        aec_sqe(ana::AEN_ANA_CHANGE),
        Data::None,
        none,
        idle!(clk, tb, cmb, tc, cmc, alive),
    )
    .unwrap();
    let aer = Sqe::new(opcode::ASYNC_EVENT, 0);
    let sb1 = hb.submit(0, aer, Data::None).unwrap();
    let sc1 = hc.submit(0, aer, Data::None).unwrap();
    for _ in 0..50 {
        (idle!(clk, tb, cmb, tc, cmc, alive))();
        hb.poll();
        hc.poll();
    }
    assert!(
        hb.take(0, sb1).is_none() && hc.take(0, sc1).is_none(),
        "held"
    );
    // C's group changes: its host asked for no notice, so its request stays held.
    assert_eq!(tc.set_ana_state(0, 2, AnaState::Optimized), Ok(0));
    // B's group becomes inaccessible: the notice, type Notice, ANA change, log 0x0C.
    assert_eq!(tb.set_ana_state(0, 2, AnaState::Inaccessible), Ok(1));
    let mut got = None;
    for _ in 0..50 {
        (idle!(clk, tb, cmb, tc, cmc, alive))();
        hb.poll();
        hc.poll();
        got = got.or_else(|| hb.take(0, sb1).map(|(c, _)| c));
    }
    let cqe = got.expect("the ANA change notice");
    assert!(cqe.status.is_ok());
    assert_eq!(cqe.result as u32, 0x000C_0302);
    assert!(
        hc.take(0, sc1).is_none(),
        "no notice to a host that did not enable it"
    );
    // I/O through B now fails with the path status, which a multipath host retries
    // elsewhere (no DNR).
    let mut buf = [0u8; 512];
    let r = hb.read(1, 1, 0, 1, &mut buf, idle!(clk, tb, cmb, tc, cmc, alive));
    assert_eq!(r, Err(HostError::Status(Status::ANA_INACCESSIBLE)));
    assert_eq!(Status::ANA_INACCESSIBLE.0 & Status::DNR, 0);
    hc.read(1, 1, 0, 1, &mut buf, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    // Until B's host reads the log, further changes are not announced.
    let sb2 = hb.submit(0, aer, Data::None).unwrap();
    assert_eq!(tb.set_ana_state(0, 2, AnaState::NonOptimized), Ok(1));
    for _ in 0..50 {
        (idle!(clk, tb, cmb, tc, cmc, alive))();
        hb.poll();
    }
    assert!(hb.take(0, sb2).is_none(), "masked until the log is read");
    // Read with Retain Asynchronous Event: still masked.
    let mut page = [0u8; 64];
    hb.exec(
        0,
        ana_sqe(64, false, true),
        Data::In(64),
        &mut page,
        idle!(clk, tb, cmb, tc, cmc, alive),
    )
    .unwrap();
    assert_eq!(ana_groups(&page), (2, vec![(2, 2, 2, vec![1])]));
    assert_eq!(tb.set_ana_state(0, 2, AnaState::Optimized), Ok(1));
    for _ in 0..50 {
        (idle!(clk, tb, cmb, tc, cmc, alive))();
        hb.poll();
    }
    assert!(hb.take(0, sb2).is_none(), "still masked");
    // Read without it: the next change is announced on the request held.
    hb.get_log_page(log::ANA, 0, &mut page, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    assert_eq!(ana_groups(&page), (3, vec![(2, 3, 1, vec![1])]));
    assert_eq!(tb.set_ana_state(0, 2, AnaState::NonOptimized), Ok(1));
    let mut got = None;
    for _ in 0..50 {
        (idle!(clk, tb, cmb, tc, cmc, alive))();
        hb.poll();
        got = got.or_else(|| hb.take(0, sb2).map(|(c, _)| c));
    }
    assert_eq!(got.map(|c| c.result as u32), Some(ana::AEN_RESULT));
    // A change while no request is held waits for the next request, which carries it at
    // once.
    hb.get_log_page(log::ANA, 0, &mut page, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    assert_eq!(tb.set_ana_state(0, 2, AnaState::Optimized), Ok(1));
    let sb3 = hb.submit(0, aer, Data::None).unwrap();
    let mut got = None;
    for _ in 0..50 {
        (idle!(clk, tb, cmb, tc, cmc, alive))();
        hb.poll();
        got = got.or_else(|| hb.take(0, sb3).map(|(c, _)| c));
    }
    assert_eq!(got.map(|c| c.result as u32), Some(ana::AEN_RESULT));
}

/// Host A's multipath over its two controllers: each write goes to the first live path
/// (B's, optimized); a path that times out, ends or answers with a path status is marked
/// down and the write is sent down the next. Returns the writes that went through C.
fn write_with_failover(
    paths: &mut [&mut H; 2],
    down: &mut [bool; 2],
    lba: u64,
    data: &[u8],
    idle: &mut dyn FnMut(),
    failovers: &mut u32,
) -> usize {
    for p in 0..2 {
        if down[p] {
            continue;
        }
        match paths[p].write(1, 1, lba, (data.len() / 512) as u32, data, idle) {
            Ok(()) => return p,
            Err(HostError::Timeout | HostError::NotConnected) => {}
            Err(HostError::Status(s)) if s.0 & 0x700 == 0x300 && s.0 & Status::DNR == 0 => {}
            Err(e) => panic!("write {lba}: {e:?}"),
        }
        down[p] = true;
        *failovers += 1;
    }
    panic!("write {lba}: no path left");
}

#[test]
fn the_host_fails_over_when_an_appliance_dies() {
    rig!(l, tb, cmb, tc, cmc, hb, hc, cma, alive, _ram);
    let clk = l.clk.clone();
    let mut down = [false; 2];
    let (mut failovers, mut via_c) = (0, 0);
    let mut stall_us = 0;
    for k in 0..64u64 {
        if k == 20 {
            // Appliance B dies (no more polls: nothing it holds answers again).
            alive.set(false);
        }
        let data = pattern(2048, k as u32);
        let t0 = clk.now_us();
        let mut paths = [&mut hb, &mut hc];
        let p = write_with_failover(
            &mut paths,
            &mut down,
            k * 4,
            &data,
            idle!(clk, tb, cmb, tc, cmc, alive),
            &mut failovers,
        );
        stall_us = stall_us.max(clk.now_us() - t0);
        via_c += p;
        assert_eq!(p, usize::from(k >= 20), "write {k} went by path {p}");
    }
    assert_eq!((failovers, via_c), (1, 44));
    assert_eq!(down, [true, false]);
    // The longest write: the dead path's command timeout (200 ms), then the retry.
    assert!(
        (200_000..300_000).contains(&stall_us),
        "stall {stall_us} µs"
    );
    // Every write is on the medium, read through the survivor.
    hc.flush(1, 1, idle!(clk, tb, cmb, tc, cmc, alive)).unwrap();
    let mut back = vec![0u8; 2048];
    for k in 0..64u64 {
        hc.read(
            1,
            1,
            k * 4,
            4,
            &mut back,
            idle!(clk, tb, cmb, tc, cmc, alive),
        )
        .unwrap();
        assert_eq!(back, pattern(2048, k as u32), "block {}", k * 4);
    }
}

#[test]
fn an_inaccessible_path_is_left_without_losing_a_write() {
    rig!(l, tb, cmb, tc, cmc, hb, hc, cma, alive, _ram);
    let clk = l.clk.clone();
    let mut down = [false; 2];
    let mut failovers = 0;
    for k in 0..16u64 {
        if k == 5 {
            assert_eq!(tb.set_ana_state(0, 2, AnaState::Inaccessible), Ok(0));
            assert_eq!(tc.set_ana_state(0, 2, AnaState::Optimized), Ok(0));
        }
        let data = pattern(512, 100 + k as u32);
        let mut paths = [&mut hb, &mut hc];
        let p = write_with_failover(
            &mut paths,
            &mut down,
            k,
            &data,
            idle!(clk, tb, cmb, tc, cmc, alive),
            &mut failovers,
        );
        assert_eq!(p, usize::from(k >= 5));
    }
    assert_eq!(failovers, 1);
    // The inaccessible path's controller is alive (only its I/O is refused): its host
    // still reads the ANA log through it.
    let mut page = [0u8; 64];
    hb.get_log_page(log::ANA, 0, &mut page, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    assert_eq!(ana_groups(&page).1[0].2, AnaState::Inaccessible as u8);
    let mut back = [0u8; 512];
    for k in 0..16u64 {
        hc.read(1, 1, k, 1, &mut back, idle!(clk, tb, cmb, tc, cmc, alive))
            .unwrap();
        assert_eq!(back.to_vec(), pattern(512, 100 + k as u32));
    }
}

#[test]
fn discovery_lists_the_peer_appliance_port() {
    rig!(l, tb, cmb, tc, cmc, hb, hc, cma, alive, _ram, sd);
    let clk = l.clk.clone();
    let mut d: H = H::new(
        &sd.pd,
        &sd.dcq,
        l.clk.clone(),
        HostConfig {
            addr: IP_B,
            subnqn: DISCOVERY_NQN,
            io_queues: 0,
            kato_ms: 0,
            ..hcfg(HOST_A)
        },
    );
    d.connect(&mut cma, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    assert!((RANGE_B.0..=RANGE_B.1).contains(&d.cntlid()));
    let mut page = vec![0u8; 3 * 1024];
    let (_, numrec) = d
        .discovery_log(&mut page, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    assert_eq!(numrec, 2, "its own port and its peer's");
    let entry = |k: usize| {
        let r = &page[k * 1024..(k + 1) * 1024];
        let (_, subtype, nqn) = discovery::parse_entry(r).unwrap();
        let (portid, traddr, svc) = discovery::parse_address(r).unwrap();
        let nqn = nqn.iter().position(|&c| c == 0).map_or(nqn, |n| &nqn[..n]);
        (subtype, portid, traddr.to_vec(), svc.to_vec(), nqn.to_vec())
    };
    let nqn = NQN.as_bytes().to_vec();
    assert_eq!(
        entry(1),
        (2, 1, b"10.0.0.3".to_vec(), b"4420".to_vec(), nqn.clone())
    );
    assert_eq!(
        entry(2),
        (2, 2, b"10.0.0.4".to_vec(), b"4420".to_vec(), nqn)
    );
    d.disconnect(&mut cma, idle!(clk, tb, cmb, tc, cmc, alive))
        .unwrap();
    drop((hb, hc));
}
