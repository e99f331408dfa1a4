//! Who may connect, and to what: the allowed-host list (a Connect rejection for others), an
//! unknown subsystem, the discovery controller and its log page (only the subsystems the
//! host may use), the CM's REJ for private data NVMe/RDMA refuses, and I/O queue Connects
//! the controller refuses.

mod common;

use bareverbs::cm::{CmEvent, ConnectParams, Failure};
use bareverbs::verbs::{QpCaps, Rc};
use bareverbs_nvmf::block::{BlockDevice, RamDisk};
use bareverbs_nvmf::host::{Data, HostError};
use bareverbs_nvmf::target::Subsystem;
use bareverbs_nvmf::wire::cm::{CmRejStatus, CmReq};
use bareverbs_nvmf::wire::fabrics::{CONNECT_DATA_LEN, Connect, ConnectData, DISCOVERY_NQN, Nqn};
use bareverbs_nvmf::wire::identify::{cntrltype, discovery};
use bareverbs_nvmf::wire::{Sqe, Status, feature, opcode};
use common::*;

const NQN2: &str = "nqn.2026-11.io.bareverbs:restricted";

#[test]
fn allowed_hosts_discovery_and_unknown_subsystems() {
    let l = lab();
    let (sa, sb, sc) = (side(&l.a), side(&l.b), side(&l.c));
    let (mut cma, mut cmb, mut cmc) = (cm(&sa, &l.clk), target_cm(&sb, &l.clk), cm(&sc, &l.clk));
    let (mut m1, mut m2) = (vec![0u8; 1 << 20], vec![0u8; 1 << 19]);
    let mut d1 = RamDisk::new(&mut m1, 512);
    let mut d2 = RamDisk::new(&mut m2, 4096);
    let mut n1: [&mut dyn BlockDevice; 1] = [&mut d1];
    let mut n2: [&mut dyn BlockDevice; 1] = [&mut d2];
    let allowed = [HOST_C];
    let mut subs = [
        Subsystem::new(NQN, &mut n1),
        Subsystem {
            nqn: NQN2,
            serial: "restricted",
            allowed_hosts: &allowed,
            namespaces: &mut n2,
            multipath: Default::default(),
        },
    ];
    let mut t: T = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    // A host not on the list: the Connect fails with Invalid Host.
    let mut cfg = hcfg(HOST_A);
    cfg.subnqn = NQN2;
    let mut ha: H = H::new(&sa.pd, &sa.dcq, l.clk.clone(), cfg);
    assert_eq!(
        ha.connect(&mut cma, &mut idle),
        Err(HostError::Status(Status::CONNECT_INVALID_HOST))
    );
    assert!(
        !ha.connected(0),
        "the failed connect closed its admin queue"
    );
    // An unknown subsystem: Invalid Parameters.
    let mut cfg = hcfg(HOST_A);
    cfg.subnqn = "nqn.2026-11.io.bareverbs:nobody";
    let mut hx: H = H::new(&sa.pd, &sa.dcq, l.clk.clone(), cfg);
    assert_eq!(
        hx.connect(&mut cma, &mut idle),
        Err(HostError::Status(Status::CONNECT_INVALID_PARAM))
    );
    assert!(!hx.connected(0));
    // The listed host gets in, and sees the 4 KiB-block namespace.
    let mut cfg = hcfg(HOST_C);
    cfg.subnqn = NQN2;
    cfg.io_queues = 1;
    let mut hc: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), cfg);
    hc.connect(&mut cmc, &mut idle).unwrap();
    let ns = hc.identify_namespace(1, &mut idle).unwrap();
    assert_eq!((ns.nsze, ns.lbads), (128, 12));
    let data = pattern(8192, 4);
    hc.write(1, 1, 126, 2, &data, &mut idle).unwrap();
    assert_eq!(
        hc.write(1, 1, 127, 2, &data, &mut idle),
        Err(HostError::Status(Status::LBA_RANGE))
    );

    // Discovery, as host A: only the open subsystem.
    let disc = |hostnqn| {
        let mut c = hcfg(hostnqn);
        c.subnqn = DISCOVERY_NQN;
        c.io_queues = 0;
        c.kato_ms = 0;
        c
    };
    let mut da: H = H::new(&sa.pd, &sa.dcq, l.clk.clone(), disc(HOST_A));
    da.connect(&mut cma, &mut idle).unwrap();
    assert_eq!(da.controller().cntrltype, cntrltype::DISCOVERY);
    let mut page = vec![0u8; 3072];
    let (_, numrec) = da.discovery_log(&mut page, &mut idle).unwrap();
    assert_eq!(numrec, 1);
    let (trtype, subtype, subnqn) = discovery::parse_entry(&page[1024..]).unwrap();
    assert_eq!((trtype, subtype), (1, 2));
    assert_eq!(Nqn::from_field(subnqn).unwrap().as_str(), NQN);
    let e = &page[1024..2048];
    assert_eq!((e[1], e[3]), (1, 0), "IPv4, no requirements");
    assert_eq!(
        &e[4..10],
        &[1, 0, 0xFF, 0xFF, 32, 0],
        "port 1, dynamic cntlid, asqsz 32"
    );
    assert_eq!(&e[32..37], b"4420\0");
    assert_eq!(&e[512..521], b"10.0.0.3\0");
    assert_eq!(
        &e[768..771],
        &[1, 1, 1],
        "connected QP, no provider type, rdma_cm"
    );
    assert!(page[2048..].iter().all(|&x| x == 0), "past the last record");
    // The same page in pieces, from an offset.
    let mut piece = vec![0u8; 1024];
    da.get_log_page(0x70, 1024, &mut piece, &mut idle).unwrap();
    assert_eq!(&piece[..], &page[1024..2048]);
    let mut hdr = vec![0u8; 20];
    da.get_log_page(0x70, 0, &mut hdr, &mut idle).unwrap();
    assert_eq!(&hdr[..], &page[..20]);
    // What a discovery controller does not do.
    let mut s = Sqe::new(opcode::SET_FEATURES, 0);
    s.set_cdw(10, u32::from(feature::NUM_QUEUES));
    assert_eq!(
        da.exec(0, s, Data::None, &mut [], &mut idle),
        Err(HostError::Status(Status::INVALID_FIELD))
    );
    assert_eq!(
        da.identify_namespace(1, &mut idle),
        Err(HostError::Status(Status::INVALID_FIELD))
    );
    assert_eq!(
        da.get_log_page(2, 0, &mut hdr, &mut idle),
        Err(HostError::Status(Status::INVALID_LOG_PAGE))
    );
    assert_eq!(
        da.reconnect_io(&mut cma, 1, &mut idle),
        Err(HostError::Status(Status::CONNECT_INVALID_PARAM)),
        "no I/O queues on a discovery controller"
    );
    da.disconnect(&mut cma, &mut idle).unwrap();
    // As host C: both.
    let mut dc: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), disc(HOST_C));
    dc.connect(&mut cmc, &mut idle).unwrap();
    let (_, numrec) = dc.discovery_log(&mut page, &mut idle).unwrap();
    assert_eq!(numrec, 2);
    let (_, _, second) = discovery::parse_entry(&page[2048..]).unwrap();
    assert_eq!(Nqn::from_field(second).unwrap().as_str(), NQN2);
    assert_eq!(
        t.counts().controllers,
        3,
        "host C's, two discovery controllers"
    );
}

/// Connects a bare QP from A with `req` as private data; returns the REJ's NVMe/RDMA status.
fn rejected(req: &[u8]) -> Option<u16> {
    let l = lab();
    let (sa, sb) = (side(&l.a), side(&l.b));
    let (mut cma, mut cmb) = (cm(&sa, &l.clk), target_cm(&sb, &l.clk));
    let mut mem = vec![0u8; 1 << 16];
    let mut disk = RamDisk::new(&mut mem, 512);
    let mut nss: [&mut dyn BlockDevice; 1] = [&mut disk];
    let mut subs = [Subsystem::new(NQN, &mut nss)];
    let mut t: T = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = sa
        .pd
        .qp_builder(&sa.dcq, &sa.dcq)
        .caps(caps)
        .build::<Rc>()
        .unwrap();
    let params = ConnectParams {
        private_data: req,
        ..ConnectParams::default()
    };
    let id = cma.connect(qp, IP_B, 4420, &params).unwrap();
    for _ in 0..10_000 {
        l.clk.advance(100);
        t.poll(&mut cmb);
        if let Some(ev) = cma.poll() {
            let CmEvent::Failed {
                id: got,
                failure,
                private_data,
                ..
            } = ev
            else {
                panic!("not a rejection: {ev:?}")
            };
            assert_eq!(got, id);
            assert_eq!(failure, Failure::Rejected { reason: 28 });
            assert_eq!(t.counts().rejected, 1);
            assert_eq!(t.queues_in_use(), 0);
            return CmRejStatus::parse(private_data.as_slice());
        }
    }
    None
}

#[test]
fn the_cm_rejects_private_data_nvme_rdma_refuses() {
    let req = |recfmt, qid, hrqsize, hsqsize| {
        CmReq {
            recfmt,
            qid,
            hrqsize,
            hsqsize,
            cntlid: 0,
        }
        .to_bytes()
    };
    assert_eq!(
        rejected(&req(1, 0, 32, 31)),
        Some(CmRejStatus::InvalidRecfmt as u16)
    );
    assert_eq!(
        rejected(&req(0, 3, 32, 31)),
        Some(CmRejStatus::InvalidQid as u16),
        "2 I/O queues"
    );
    assert_eq!(
        rejected(&req(0, 0, 64, 63)),
        Some(CmRejStatus::InvalidHsqsize as u16),
        "admin: 32"
    );
    assert_eq!(
        rejected(&req(0, 1, 200, 199)),
        Some(CmRejStatus::InvalidHsqsize as u16),
        "I/O: 128"
    );
    assert_eq!(
        rejected(&req(0, 1, 200, 0)),
        Some(CmRejStatus::InvalidHsqsize as u16),
        "one entry"
    );
    assert_eq!(
        rejected(&req(0, 1, 16, 31)),
        Some(CmRejStatus::InvalidHrqsize as u16)
    );
    assert_eq!(
        rejected(&[]),
        Some(CmRejStatus::InvalidHsqsize as u16),
        "no private data: zeroes, an admin queue of one entry"
    );
}

#[test]
fn io_queue_connects_the_controller_refuses() {
    let mut cfg = hcfg(HOST_A);
    cfg.io_queues = 1;
    setup!(l, t, h, cma, cmb, disk, tcfg(), cfg; idle);
    h.connect(&mut cma, &mut idle).unwrap();
    assert_eq!(h.io_queues(), 1);
    // Queue 2 at the transport level, not granted by Number of Queues.
    h.open_queue(&mut cma, 2, 32, &mut idle).unwrap();
    let mut s = Sqe::rw(opcode::READ, 0, 1, 0, 1);
    s.set_nsid(1);
    assert_eq!(
        h.exec(2, s, Data::In(512), &mut [], &mut idle),
        Err(HostError::Status(Status::SEQUENCE_ERROR)),
        "I/O before Connect"
    );
    let connect = |h: &mut H, c: Connect, cntlid: u16, hostnqn: &str, idle: &mut dyn FnMut()| {
        let mut d = vec![0u8; CONNECT_DATA_LEN];
        ConnectData {
            hostid: [0; 16],
            cntlid,
            subnqn: Nqn::new(NQN).unwrap(),
            hostnqn: Nqn::new(hostnqn).unwrap(),
        }
        .write(&mut d);
        h.exec(2, c.to_sqe(0), Data::Out(&d), &mut [], idle)
    };
    let ok = Connect {
        recfmt: 0,
        qid: 2,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    };
    let me = h.cntlid();
    let bad = Err(HostError::Status(Status::CONNECT_INVALID_PARAM));
    assert_eq!(
        connect(&mut h, ok, me, HOST_A, &mut idle),
        bad,
        "qid 2 > 1 granted"
    );
    assert_eq!(
        connect(&mut h, Connect { qid: 1, ..ok }, me, HOST_A, &mut idle),
        bad,
        "qid of another queue"
    );
    assert_eq!(
        connect(
            &mut h,
            Connect { qid: 1, ..ok },
            me ^ 0x40,
            HOST_A,
            &mut idle
        ),
        bad,
        "another cntlid"
    );
    assert_eq!(
        connect(&mut h, Connect { qid: 1, ..ok }, me, HOST_C, &mut idle),
        bad,
        "another host"
    );
    assert_eq!(
        connect(&mut h, Connect { sqsize: 0, ..ok }, me, HOST_A, &mut idle),
        bad,
        "sqsize 0"
    );
    assert_eq!(
        connect(&mut h, Connect { sqsize: 32, ..ok }, me, HOST_A, &mut idle),
        bad,
        "past the depth"
    );
    assert_eq!(
        connect(&mut h, Connect { recfmt: 1, ..ok }, me, HOST_A, &mut idle),
        Err(HostError::Status(Status::CONNECT_FORMAT))
    );
    // Granting a second queue makes the same Connect work.
    let mut s = Sqe::new(opcode::SET_FEATURES, 0);
    s.set_cdw(10, u32::from(feature::NUM_QUEUES));
    s.set_cdw(11, 1 | (1 << 16));
    h.exec(0, s, Data::None, &mut [], &mut idle).unwrap();
    let r = connect(&mut h, ok, me, HOST_A, &mut idle).unwrap();
    assert_eq!(r.result as u16, me);
    let mut back = vec![0u8; 512];
    h.read(2, 1, 0, 1, &mut back, &mut idle).unwrap();
    let _ = &disk;
}
