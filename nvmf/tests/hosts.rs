//! What one host may hold, and for how long: keep-alive timeouts within the target's bounds,
//! hosts that vanish (their controllers and queues freed within the bound, 200 times over),
//! a queue that belongs to its controller's station and host ID (a stranger naming a live
//! controller gets nothing, the victim keeps everything), and the error log each controller
//! keeps of the commands it failed.

mod common;

use bareverbs::cm::{Cm, CmConfig, Service};
use std::sync::{Arc, Mutex};

use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::hal::Clock;
use bareverbs::hal::{Link, LinkError};
use bareverbs_model::Model;
use bareverbs_model::link::MemLink;
use bareverbs_model::link::TestClock;
use bareverbs_nvmf::host::Host;
use bareverbs_nvmf::host::{Data, HostError};
use bareverbs_nvmf::target::{
    DEFAULT_KATO_MS, ERROR_LOG_ENTRIES, KATO_GRACE_MAX_MS, MAX_KATO_MS, TargetConfig, kato_grace_ms,
};
use bareverbs_nvmf::wire::fabrics::{CONNECT_DATA_LEN, Connect, ConnectData, Nqn, invalid};
use bareverbs_nvmf::wire::identify::cns;
use bareverbs_nvmf::wire::log::{self, ERROR_ENTRY_LEN, ErrorEntry, NO_LOCATION};
use bareverbs_nvmf::wire::{Cqe, Sqe, Status, feature, opcode};
use common::*;

/// A round of the test's idle time (20 µs, a poll of the target), made afresh at each use so
/// that the target is borrowed for that call only.
macro_rules! idle {
    ($clk:expr, $t:ident, $cmb:ident) => {
        &mut || {
            $clk.advance(20);
            $t.poll(&mut $cmb);
        }
    };
}

const HOSTID_A: [u8; 16] = [0xA1; 16];

/// The keep-alive timeout in force (Get Features, Keep Alive Timer).
fn kato_in_force(h: &mut H<'_, '_>, idle: &mut dyn FnMut()) -> u32 {
    let mut s = Sqe::new(opcode::GET_FEATURES, 0);
    s.set_cdw(10, u32::from(feature::KEEP_ALIVE));
    h.exec(0, s, Data::None, &mut [], idle).unwrap().result as u32
}

fn set_kato(h: &mut H<'_, '_>, ms: u32, idle: &mut dyn FnMut()) {
    let mut s = Sqe::new(opcode::SET_FEATURES, 0);
    s.set_cdw(10, u32::from(feature::KEEP_ALIVE));
    s.set_cdw(11, ms);
    h.exec(0, s, Data::None, &mut [], idle).unwrap();
}

/// Lets `secs` seconds pass on the target (one poll per 100 ms).
fn pass<'a, const N: usize>(
    clk: &TestClock,
    t: &mut T<'a, '_>,
    cmb: &mut Cm<'a, R, TestClock, N>,
    secs: u64,
) {
    for _ in 0..secs * 10 {
        clk.advance(100_000);
        t.poll(cmb);
    }
}

#[test]
fn the_keep_alive_granted_is_bounded_and_reported() {
    assert_eq!(TargetConfig::default().default_kato_ms, DEFAULT_KATO_MS);
    assert_eq!(TargetConfig::default().max_kato_ms, MAX_KATO_MS);
    for (asked, granted) in [
        (0, DEFAULT_KATO_MS),
        (u32::MAX, MAX_KATO_MS),
        (MAX_KATO_MS + 1, MAX_KATO_MS),
        (15_000, 15_000),
        (1_234, 2_000),
        (1, 1_000),
    ] {
        let mut cfg = hcfg(HOST_A);
        cfg.kato_ms = asked;
        setup!(l, t, h, cma, cmb, disk, tcfg(), cfg);
        let clk = l.clk.clone();
        h.connect(&mut cma, idle!(clk, t, cmb)).unwrap();
        assert_eq!(
            kato_in_force(&mut h, idle!(clk, t, cmb)),
            granted,
            "asked {asked}"
        );
        assert_eq!(t.controllers().next().unwrap().kato_ms, granted);
        // Set Features is held to the same bounds.
        set_kato(&mut h, 0, idle!(clk, t, cmb));
        assert_eq!(kato_in_force(&mut h, idle!(clk, t, cmb)), DEFAULT_KATO_MS);
        set_kato(&mut h, u32::MAX, idle!(clk, t, cmb));
        assert_eq!(kato_in_force(&mut h, idle!(clk, t, cmb)), MAX_KATO_MS);
        set_kato(&mut h, 5_000, idle!(clk, t, cmb));
        assert_eq!(kato_in_force(&mut h, idle!(clk, t, cmb)), 5_000);
        let _ = (&disk, &l);
    }
}

#[test]
fn a_target_refuses_keep_alive_bounds_it_cannot_keep() {
    let l = lab();
    let sb = side(&l.b);
    let bad = |default_kato_ms, max_kato_ms| TargetConfig {
        default_kato_ms,
        max_kato_ms,
        ..tcfg()
    };
    for (cfg, what) in [
        (bad(1_000, 0), Some("max_kato_ms")),
        (bad(0, 1_000), Some("default_kato_ms")),
        (bad(2_000, 1_000), Some("default_kato_ms")),
        (bad(1_000, 1_000), None),
    ] {
        let mut mem = vec![0u8; 4096];
        let mut d = bareverbs_nvmf::block::RamDisk::new(&mut mem, 512);
        let mut nss: [&mut dyn bareverbs_nvmf::block::BlockDevice; 1] = [&mut d];
        let mut subs = [bareverbs_nvmf::target::Subsystem::new(NQN, &mut nss)];
        let r = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, cfg, &mut subs);
        assert_eq!(
            r.err(),
            what.map(bareverbs_nvmf::target::TargetError::Config)
        );
    }
}

/// An I/O controller whose host asked for no keep-alive, and then fell silent, is lost after
/// the default timeout and its grace (10 s at that length), not kept forever.
#[test]
fn a_silent_host_that_asked_for_no_keep_alive_is_dropped_after_the_default() {
    let mut cfg = hcfg(HOST_A);
    cfg.kato_ms = 0;
    setup!(l, t, h, cma, cmb, disk, tcfg(), cfg);
    let clk = l.clk.clone();
    h.connect(&mut cma, idle!(clk, t, cmb)).unwrap();
    assert_eq!(t.queues_in_use(), 3);
    pass(
        &l.clk,
        &mut t,
        &mut cmb,
        u64::from((DEFAULT_KATO_MS + kato_grace_ms(DEFAULT_KATO_MS)) / 1000) - 1,
    );
    assert_eq!(kato_grace_ms(DEFAULT_KATO_MS), KATO_GRACE_MAX_MS);
    assert_eq!(
        t.controllers().count(),
        1,
        "just before the timeout and its grace"
    );
    pass(&l.clk, &mut t, &mut cmb, 2);
    assert_eq!(t.controllers().count(), 0);
    assert_eq!(t.queues_in_use(), 0, "its three queues with it");
    assert_eq!(t.counts().kato_expired, 1);
    let _ = &disk;
}

/// A machine's NIC: its own MAC, on one of a few links attached to the segment once (the
/// segment is a hub; a port keeps the frames to its own MAC), so that two hundred machines
/// do not leave two hundred links behind, each queueing every broadcast for ever.
struct PoolLink {
    link: Arc<Mutex<MemLink>>,
    mac: [u8; 6],
}

impl Link for PoolLink {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }
    fn max_frame(&self) -> usize {
        self.link.lock().unwrap().max_frame()
    }
    fn transmit(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        self.link.lock().unwrap().transmit(frame)
    }
    fn tx_ready(&mut self) -> bool {
        self.link.lock().unwrap().tx_ready()
    }
    fn receive(&mut self, buf: &mut [u8]) -> Option<usize> {
        self.link.lock().unwrap().receive(buf)
    }
}

type V = Rxe<Model, PoolLink, TestClock>;
type VHost<'a, 'n> = Host<'a, 'n, V, TestClock, 3, 32>;

/// `cycles` hosts, each a machine of its own (its own device, MAC, IPv4 address, QPs, CM),
/// each asking for keep-alive `kato_ms`, connect (an
/// admin and two I/O queues) and vanish: their QPs, CM and device gone without a word. The
/// target (8 queues: room for two such hosts) frees each within the keep-alive bound (the
/// longest timeout and its grace), so
/// every cycle gets its controller within that bound, and afterwards another host is served.
fn connect_and_vanish(kato_ms: u32, cycles: u32) {
    let l = lab();
    let sa = side(&l.a);
    let sb = side(&l.b);
    let mut cma = cm(&sa, &l.clk);
    // The target's CM tracks twice as many connections as the target has queues (as the
    // appliance's): a connection whose controller expired keeps its entry while its DREQ goes
    // unanswered (16 sends, 6.144 s apart), and new hosts need entries meanwhile.
    let mut cmb: Cm<'_, R, TestClock, 16> =
        Cm::new(&sb.pd, &sb.mcq, l.clk.clone(), CmConfig::default()).unwrap();
    cmb.listen(None, 4420, Service::Rc).unwrap();
    let mut mem = vec![0u8; 1 << 20];
    let mut disk = bareverbs_nvmf::block::RamDisk::new(&mut mem, 512);
    let mut nss: [&mut dyn bareverbs_nvmf::block::BlockDevice; 1] = [&mut disk];
    let mut subs = [bareverbs_nvmf::target::Subsystem::new(NQN, &mut nss)];
    let mut t: T = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
    let mut h: H = H::new(&sa.pd, &sa.dcq, l.clk.clone(), hcfg(HOST_A));
    let pool: Vec<Arc<Mutex<MemLink>>> = (0..4u8)
        .map(|k| Arc::new(Mutex::new(l.seg.attach([0x52, 0x54, 0, 9, 0, k], 1514))))
        .collect();
    let bound_us = u64::from(MAX_KATO_MS + kato_grace_ms(MAX_KATO_MS)) * 1000;
    let mut refused = 0u32;
    for cycle in 0..cycles {
        let start = l.clk.now_us();
        let [_, _, hi, lo] = (cycle + 1).to_be_bytes();
        let nic = PoolLink {
            link: pool[(cycle % 4) as usize].clone(),
            mac: [0x52, 0x54, 0, 1, hi, lo],
        };
        let ip = [10, 1, hi, lo];
        let ctx = bareverbs::Context::new(
            V::new(l.model.clone(), nic, l.clk.clone(), Config { ip }).unwrap(),
        );
        let pd = ctx.alloc_pd().unwrap();
        let mcq = ctx.create_cq(64).unwrap();
        let dcq = ctx.create_cq(1024).unwrap();
        let mut cmv: Cm<'_, V, TestClock, 8> =
            Cm::new(&pd, &mcq, l.clk.clone(), CmConfig::default()).unwrap();
        let mut vcfg = hcfg(HOST_C);
        vcfg.kato_ms = kato_ms;
        vcfg.timeout_ms = 2000;
        let mut v: VHost = VHost::new(&pd, &dcq, l.clk.clone(), vcfg);
        loop {
            let up = v.connect(&mut cmv, idle!(l.clk, t, cmb));
            if up.is_ok() {
                break;
            }
            refused += 1;
            // The table is full of vanished hosts: time passes (the next try 3 s later).
            pass(&l.clk, &mut t, &mut cmb, 3);
            let waited = l.clk.now_us() - start;
            assert!(
                waited <= bound_us + 4_000_000,
                "cycle {cycle}: no room after {} s ({:?})",
                waited / 1_000_000,
                up
            );
        }
        let granted = t
            .controllers()
            .find(|c| c.cntlid == v.cntlid())
            .map(|c| (c.kato_ms, c.station));
        let want = if kato_ms == 0 {
            DEFAULT_KATO_MS
        } else {
            kato_ms.min(MAX_KATO_MS)
        };
        assert_eq!(granted, Some((want, ip)), "cycle {cycle}");
        // And it vanishes: its host, CM and device dropped without a word.
    }
    assert!(refused > 0 && t.counts().rejected > 0, "the table did fill");
    // Within the bound, everything the vanished hosts held is free.
    pass(&l.clk, &mut t, &mut cmb, bound_us / 1_000_000 + 1);
    assert_eq!(t.controllers().count(), 0);
    assert_eq!(t.queues_in_use(), 0);
    let c = t.counts();
    assert!(c.kato_expired >= u64::from(cycles), "{c:?}");
    assert_eq!(c.lost, c.controllers);
    println!(
        "vanish (keep-alive asked {kato_ms} ms): {cycles} hosts served, {refused} attempts refused meanwhile; {} s of clock; target: {} controllers made, {} lost to keep-alive expiry, {} connections refused",
        l.clk.now_us() / 1_000_000,
        c.controllers,
        c.kato_expired,
        c.rejected
    );
    // And a new host is served.
    let clk = l.clk.clone();
    h.connect(&mut cma, idle!(clk, t, cmb)).unwrap();
    let data = pattern(4096, 77);
    h.write(1, 1, 8, 8, &data, idle!(clk, t, cmb)).unwrap();
    let mut back = vec![0u8; 4096];
    h.read(2, 1, 8, 8, &mut back, idle!(clk, t, cmb)).unwrap();
    assert_eq!(back, data);
}

/// 200 connect-and-vanish cycles; 20 under memcheck (`tests/memcheck.sh` sets
/// `BAREVERBS_MEMCHECK`: valgrind runs a test about forty times slower), still more than the
/// tables hold.
fn cycles() -> u32 {
    if std::env::var_os("BAREVERBS_MEMCHECK").is_some() {
        20
    } else {
        200
    }
}

#[test]
fn two_hundred_hosts_that_asked_for_no_keep_alive_vanish() {
    connect_and_vanish(0, cycles());
}

#[test]
fn two_hundred_hosts_that_asked_for_the_longest_keep_alive_vanish() {
    connect_and_vanish(u32::MAX, cycles());
}

/// Sends a Connect for I/O queue `qid` (already open at the transport level) naming
/// `cntlid`, `hostnqn` and `hostid`; returns the response.
fn raw_connect(
    h: &mut H<'_, '_>,
    qid: u16,
    cntlid: u16,
    hostnqn: &str,
    hostid: [u8; 16],
    idle: &mut dyn FnMut(),
) -> Cqe {
    let mut d = vec![0u8; CONNECT_DATA_LEN];
    ConnectData {
        hostid,
        cntlid,
        subnqn: Nqn::new(NQN).unwrap(),
        hostnqn: Nqn::new(hostnqn).unwrap(),
    }
    .write(&mut d);
    let c = Connect {
        recfmt: 0,
        qid,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    };
    let s = h.submit(qid, c.to_sqe(0), Data::Out(&d)).unwrap();
    for _ in 0..100_000 {
        h.poll();
        idle();
        if let Some((cqe, _)) = h.take(qid, s) {
            return cqe;
        }
    }
    panic!("no answer to the Connect");
}

/// What a refused I/O-queue Connect carries: Connect Invalid Parameters (DNR), pointing at
/// the Connect data's controller ID (Linux: "Connect Invalid Data Parameter, cntlid: N").
fn refused_as_unknown(cqe: &Cqe) {
    assert_eq!(cqe.status, Status::CONNECT_INVALID_PARAM);
    assert!(cqe.status.dnr());
    assert_eq!(cqe.result as u32, invalid::data(invalid::CNTLID));
    assert_eq!(cqe.result as u32, (1 << 16) | 16);
}

#[test]
fn a_stranger_naming_a_live_controller_gets_nothing() {
    let mut cfg = hcfg(HOST_A);
    cfg.hostid = HOSTID_A;
    cfg.kato_ms = 1000;
    setup!(l, t, h, cma, cmb, disk, tcfg(), cfg);
    // The stranger, on C, knows everything but the station: the allowed host NQN, the
    // victim's host ID and controller ID.
    let sc = side(&l.c);
    let mut cmc = cm(&sc, &l.clk);
    let mut s: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), cfg);
    let clk = l.clk.clone();
    h.connect(&mut cma, idle!(clk, t, cmb)).unwrap();
    let victim = h.cntlid();
    // The victim's queue 2 ends (it will reconnect it).
    h.close_queue(&mut cma, 2);
    for _ in 0..200 {
        (idle!(clk, t, cmb))();
    }
    assert_eq!(t.queues_in_use(), 2);
    let last = t.controllers().next().unwrap().last_us;

    // The stranger's Connects for queue 2 (free in the victim's controller) and for queue 1
    // (taken): refused alike, as for a controller that does not exist.
    for qid in [2, 1] {
        s.open_queue(&mut cmc, qid, 32, idle!(clk, t, cmb)).unwrap();
        let cqe = raw_connect(&mut s, qid, victim, HOST_A, HOSTID_A, idle!(clk, t, cmb));
        refused_as_unknown(&cqe);
        // Nor does a controller ID the victim does not have say anything else.
        let cqe = raw_connect(
            &mut s,
            qid,
            victim ^ 0x40,
            HOST_A,
            HOSTID_A,
            idle!(clk, t, cmb),
        );
        refused_as_unknown(&cqe);
        // Its commands there are sequence errors, in nobody's log.
        let r = s.exec(
            qid,
            Sqe::rw(opcode::READ, 0, 1, 0, 1),
            Data::In(512),
            &mut [],
            idle!(clk, t, cmb),
        );
        assert_eq!(r, Err(HostError::Status(Status::SEQUENCE_ERROR)));
    }
    let ctrl = *t.controllers().next().unwrap();
    assert_eq!(t.controllers().count(), 1);
    assert_eq!(ctrl.cntlid, victim);
    assert_eq!((ctrl.io_queues, ctrl.last_us), (1, last), "untouched");
    assert_eq!(ctrl.errors.count(), 0, "no entry in the victim's error log");

    // The victim: its queue back under the same ID, I/O on both, its log empty.
    let clk = l.clk.clone();
    h.reconnect_io(&mut cma, 2, idle!(clk, t, cmb)).unwrap();
    let data = pattern(4096, 5);
    h.write(1, 1, 0, 8, &data, idle!(clk, t, cmb)).unwrap();
    let mut back = vec![0u8; 4096];
    h.read(2, 1, 0, 8, &mut back, idle!(clk, t, cmb)).unwrap();
    assert_eq!(back, data);
    let mut page = [0u8; 64];
    h.get_log_page(log::ERROR, 0, &mut page, idle!(clk, t, cmb))
        .unwrap();
    assert_eq!(ErrorEntry::parse(&page).unwrap().count, 0);

    // The stranger's traffic does not keep the victim's controller alive: the victim falls
    // silent, the stranger keeps sending, and the victim's controller expires on time.
    let mut sent = 0;
    for _ in 0..30 {
        let _ = s.submit(2, Sqe::new(opcode::KEEP_ALIVE, 0), Data::None);
        sent += 1;
        for _ in 0..100 {
            l.clk.advance(1000);
            t.poll(&mut cmb);
            s.poll();
            while let Some(e) = cmc.poll() {
                s.on_cm_event(e);
            }
        }
        for slot in 0..32 {
            let _ = s.take(2, slot);
        }
    }
    assert_eq!(sent, 30);
    assert_eq!(
        t.controllers().count(),
        0,
        "expired 1 s after the victim's last command"
    );
    assert_eq!(t.counts().kato_expired, 1);
    let _ = &disk;
}

#[test]
fn the_same_station_with_another_host_id_gets_nothing() {
    let mut cfg = hcfg(HOST_A);
    cfg.hostid = HOSTID_A;
    let l = lab();
    let sa = side(&l.a);
    // Another host on A's machine (its own PD and CQ; A's CM).
    let sa2 = side(&l.a);
    let sb = side(&l.b);
    let mut cma = cm(&sa, &l.clk);
    let mut cmb = target_cm(&sb, &l.clk);
    let mut mem = vec![0u8; 1 << 20];
    let mut disk = bareverbs_nvmf::block::RamDisk::new(&mut mem, 512);
    let mut nss: [&mut dyn bareverbs_nvmf::block::BlockDevice; 1] = [&mut disk];
    let mut subs = [bareverbs_nvmf::target::Subsystem::new(NQN, &mut nss)];
    let mut t: T = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
    let mut h: H = H::new(&sa.pd, &sa.dcq, l.clk.clone(), cfg);
    let mut cfg2 = cfg;
    cfg2.hostid = [0xB2; 16];
    let mut o: H = H::new(&sa2.pd, &sa2.dcq, l.clk.clone(), cfg2);
    let clk = l.clk.clone();
    h.connect(&mut cma, idle!(clk, t, cmb)).unwrap();
    let victim = h.cntlid();
    h.close_queue(&mut cma, 2);
    for _ in 0..200 {
        (idle!(clk, t, cmb))();
    }
    o.open_queue(&mut cma, 2, 32, idle!(clk, t, cmb)).unwrap();
    let cqe = raw_connect(&mut o, 2, victim, HOST_A, [0xB2; 16], idle!(clk, t, cmb));
    refused_as_unknown(&cqe);
    // With the controller's host ID, from its station, the same Connect binds.
    let cqe = raw_connect(&mut o, 2, victim, HOST_A, HOSTID_A, idle!(clk, t, cmb));
    assert_eq!((cqe.status, cqe.result as u16), (Status::SUCCESS, victim));
    assert_eq!(t.controllers().next().unwrap().io_queues, 2);
}

/// Reads the error log (every entry) of `h`'s controller.
fn error_log(h: &mut H<'_, '_>, idle: &mut dyn FnMut()) -> Vec<ErrorEntry> {
    let mut page = vec![0u8; ERROR_LOG_ENTRIES * ERROR_ENTRY_LEN];
    h.get_log_page(log::ERROR, 0, &mut page, idle).unwrap();
    page.chunks(ERROR_ENTRY_LEN)
        .map(|e| ErrorEntry::parse(e).unwrap())
        .collect()
}

#[test]
fn the_error_log_holds_the_commands_answered_with_an_error() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A));
    let clk = l.clk.clone();
    h.connect(&mut cma, idle!(clk, t, cmb)).unwrap();
    let mut id = [0u8; 4096];
    h.identify(cns::CONTROLLER, 0, &mut id, idle!(clk, t, cmb))
        .unwrap();
    assert_eq!(usize::from(id[262]) + 1, ERROR_LOG_ENTRIES, "ELPE");
    assert!(
        error_log(&mut h, idle!(clk, t, cmb))
            .iter()
            .all(|e| e.count == 0)
    );

    // Three failures: past the namespace's end (2048 blocks), an unknown admin opcode, a
    // namespace that does not exist.
    let mut back = vec![0u8; 1024];
    let r = h.exec(
        1,
        Sqe::rw(opcode::READ, 0x71, 1, 2047, 2),
        Data::In(1024),
        &mut back,
        idle!(clk, t, cmb),
    );
    assert_eq!(r, Err(HostError::Status(Status::LBA_RANGE)));
    let slot = h.submit_raw(0, &Sqe::new(0xC5, 0x72).0, 0x72).unwrap();
    let r = h.wait(0, slot, &mut [], idle!(clk, t, cmb));
    assert_eq!(r, Err(HostError::Status(Status::INVALID_OPCODE)));
    let r = h.exec(
        2,
        Sqe::rw(opcode::WRITE_ZEROES, 0x73, 9, 5, 1),
        Data::None,
        &mut [],
        idle!(clk, t, cmb),
    );
    assert_eq!(r, Err(HostError::Status(Status::INVALID_NS)));
    let log = error_log(&mut h, idle!(clk, t, cmb));
    let want = [
        ErrorEntry {
            count: 3,
            sqid: 2,
            cid: log[0].cid,
            status: Status::INVALID_NS,
            location: 4,
            lba: 5,
            nsid: 9,
        },
        ErrorEntry {
            count: 2,
            sqid: 0,
            cid: 0x72,
            status: Status::INVALID_OPCODE,
            location: 0,
            lba: 0,
            nsid: 0,
        },
        ErrorEntry {
            count: 1,
            sqid: 1,
            cid: log[2].cid,
            status: Status::LBA_RANGE,
            location: 40,
            lba: 2047,
            nsid: 1,
        },
    ];
    assert_eq!(&log[..3], &want, "newest first");
    assert!(log[3..].iter().all(|e| *e == ErrorEntry::default()));
    assert_eq!(t.controllers().next().unwrap().errors.count(), 3);
    // A status no single field explains: no location.
    let mut s = Sqe::new(opcode::GET_FEATURES, 0);
    s.set_cdw(10, 0x55);
    let r = h.exec(0, s, Data::None, &mut [], idle!(clk, t, cmb));
    assert_eq!(r, Err(HostError::Status(Status::INVALID_FIELD)));
    let e = error_log(&mut h, idle!(clk, t, cmb))[0];
    assert_eq!((e.count, e.sqid, e.location), (4, 0, NO_LOCATION));

    // Twelve more: the ring keeps the newest eight, numbered on.
    for k in 0..12u64 {
        let r = h.exec(
            1,
            Sqe::rw(opcode::READ, 0, 1, 3000 + k, 1),
            Data::In(512),
            &mut back,
            idle!(clk, t, cmb),
        );
        assert_eq!(r, Err(HostError::Status(Status::LBA_RANGE)));
    }
    let log = error_log(&mut h, idle!(clk, t, cmb));
    let counts: Vec<u64> = log.iter().map(|e| e.count).collect();
    assert_eq!(counts, (9..=16).rev().collect::<Vec<u64>>());
    assert_eq!(log[0].lba, 3011);
    assert_eq!(log[7].lba, 3004);
    // From an offset: the third entry on.
    let mut part = [0u8; 128];
    h.get_log_page(
        log::ERROR,
        2 * ERROR_ENTRY_LEN as u64,
        &mut part,
        idle!(clk, t, cmb),
    )
    .unwrap();
    assert_eq!(ErrorEntry::parse(&part).unwrap(), log[2]);
    // Past the log: an invalid field (the seventeenth error).
    assert_eq!(
        h.get_log_page(log::ERROR, 513 * 4, &mut part, idle!(clk, t, cmb)),
        Err(HostError::Status(Status::INVALID_FIELD))
    );
    // The SMART log counts them all.
    let mut smart = [0u8; 512];
    h.get_log_page(log::SMART, 0, &mut smart, idle!(clk, t, cmb))
        .unwrap();
    let n = log::SMART_ERROR_ENTRIES;
    assert_eq!(u64::from_le_bytes(smart[n..n + 8].try_into().unwrap()), 17);
    assert_eq!(t.counts().errors, 17);
    let _ = &disk;
}

/// Each controller logs its own failures only.
#[test]
fn another_hosts_errors_stay_in_its_own_log() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A));
    let sc = side(&l.c);
    let mut cmc = cm(&sc, &l.clk);
    let mut h2: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), hcfg(HOST_C));
    let clk = l.clk.clone();
    h.connect(&mut cma, idle!(clk, t, cmb)).unwrap();
    h2.connect(&mut cmc, idle!(clk, t, cmb)).unwrap();
    for _ in 0..5 {
        let r = h2.exec(
            0,
            Sqe::new(0xC5, 0),
            Data::None,
            &mut [],
            idle!(clk, t, cmb),
        );
        assert_eq!(r, Err(HostError::Status(Status::INVALID_OPCODE)));
    }
    assert_eq!(error_log(&mut h2, idle!(clk, t, cmb))[0].count, 5);
    assert!(
        error_log(&mut h, idle!(clk, t, cmb))
            .iter()
            .all(|e| e.count == 0)
    );
    let _ = (&disk, &l);
}
