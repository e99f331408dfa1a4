//! The NVMe/RDMA target driven by the host between two software RoCE devices: bring-up,
//! every admin and I/O command, data both ways (keyed and in-capsule).

mod common;

use bareverbs::hal::Clock;
use bareverbs_nvmf::block::{BlockDevice, RamDisk};
use bareverbs_nvmf::host::Data;
use bareverbs_nvmf::target::Subsystem;
use bareverbs_nvmf::wire::identify::{IdNs, cns, cntrltype};
use bareverbs_nvmf::wire::{Sgl, Sqe, Status, feature, opcode, prop};
use common::*;

#[test]
fn connect_identify_write_read_flush_zeroes() {
    let l = lab();
    let (sa, sb) = (side(&l.a), side(&l.b));
    let (mut cma, mut cmb) = (cm(&sa, &l.clk), target_cm(&sb, &l.clk));
    let mut mem = vec![0u8; 1 << 20];
    let mut disk = RamDisk::new(&mut mem, 512);
    let mut nss: [&mut dyn BlockDevice; 1] = [&mut disk];
    let mut subs = [Subsystem::new(NQN, &mut nss)];
    let mut t: T = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
    let mut h: H = H::new(&sa.pd, &sa.dcq, l.clk.clone(), hcfg(HOST_A));
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.connect(&mut cma, &mut idle).unwrap();
    assert_eq!(h.io_queues(), 2);
    let info = *h.controller();
    assert_eq!(info.cntlid, h.cntlid());
    assert_eq!(info.cntrltype, cntrltype::IO);
    assert_eq!(info.kas, 10);
    assert_eq!(info.maxcmd, 128);
    assert_eq!(info.nn, 1);
    assert_eq!(info.sgls, 0x0010_0005);
    assert_eq!(info.ioccsz, (64 + 4096) / 16);
    assert_eq!(info.mdts, 2, "16 KiB = 2^2 x 4 KiB");

    // Properties.
    assert_eq!(
        h.property_get(prop::VS, false, &mut idle).unwrap(),
        0x0001_0300
    );
    let cap = h.property_get(prop::CAP, true, &mut idle).unwrap();
    assert_eq!(cap & 0xFFFF, 127, "MQES");
    assert_eq!((cap >> 37) & 1, 1, "NVM command set");
    assert_eq!(h.property_get(prop::CSTS, false, &mut idle).unwrap() & 1, 1);
    let cc = h.property_get(prop::CC, false, &mut idle).unwrap();
    assert_eq!(cc & 1, 1);

    // Identify: namespace, active list, descriptors.
    let ns = h.identify_namespace(1, &mut idle).unwrap();
    assert_eq!((ns.nsze, ns.ncap, ns.lbads), (2048, 2048, 9));
    let mut b = [0u8; 4096];
    h.identify(cns::ACTIVE_NS_LIST, 0, &mut b, &mut idle)
        .unwrap();
    assert_eq!(&b[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    h.identify(cns::NS_DESC_LIST, 1, &mut b, &mut idle).unwrap();
    assert_eq!((b[0], b[1]), (2, 16), "NGUID descriptor");
    assert_eq!(&b[4..20], &ns.nguid);
    assert_ne!(ns.nguid, [0; 16]);
    assert_eq!((b[20], b[21], b[24]), (4, 1, 0), "CSI descriptor: NVM");
    let again: IdNs = h.identify_namespace(1, &mut idle).unwrap();
    assert_eq!(again, ns);

    // Features and keep-alive.
    let mut s = Sqe::new(opcode::GET_FEATURES, 0);
    s.set_cdw(10, u32::from(feature::NUM_QUEUES));
    let r = h.exec(0, s, Data::None, &mut [], &mut idle).unwrap();
    assert_eq!(r.result, 1 | (1 << 16), "two I/O queues, 0's based");
    let mut s = Sqe::new(opcode::SET_FEATURES, 0);
    s.set_cdw(10, u32::from(feature::KEEP_ALIVE));
    s.set_cdw(11, 7000);
    h.exec(0, s, Data::None, &mut [], &mut idle).unwrap();
    let mut s = Sqe::new(opcode::GET_FEATURES, 0);
    s.set_cdw(10, u32::from(feature::KEEP_ALIVE));
    let r = h.exec(0, s, Data::None, &mut [], &mut idle).unwrap();
    assert_eq!(r.result, 7000);
    h.exec(
        0,
        Sqe::new(opcode::KEEP_ALIVE, 0),
        Data::None,
        &mut [],
        &mut idle,
    )
    .unwrap();
    let mut smart = [0xAAu8; 512];
    h.get_log_page(2, 0, &mut smart, &mut idle).unwrap();
    assert!(smart.iter().all(|&x| x == 0));

    // Writes: in the capsule (4 KiB fits), keyed (16 KiB), on both I/O queues.
    let small = pattern(4096, 1);
    let big = pattern(16384, 2);
    h.write(1, 1, 8, 8, &small, &mut idle).unwrap();
    h.write(2, 1, 100, 32, &big, &mut idle).unwrap();
    let mut back = vec![0u8; 16384];
    h.read(2, 1, 8, 8, &mut back[..4096], &mut idle).unwrap();
    assert_eq!(&back[..4096], &small[..]);
    h.read(1, 1, 100, 32, &mut back, &mut idle).unwrap();
    assert_eq!(back, big);
    // Write Zeroes in the middle of the big write, then Flush.
    h.write_zeroes(1, 1, 104, 4, &mut idle).unwrap();
    h.read(1, 1, 100, 32, &mut back, &mut idle).unwrap();
    assert_eq!(&back[..2048], &big[..2048]);
    assert!(back[2048..4096].iter().all(|&x| x == 0));
    assert_eq!(&back[4096..], &big[4096..]);
    h.flush(2, 1, &mut idle).unwrap();

    // Shutdown and disconnect.
    h.disconnect(&mut cma, &mut idle).unwrap();
    for _ in 0..2000 {
        idle();
        while let Some(e) = cma.poll() {
            h.on_cm_event(e);
        }
    }
    let counts = t.counts();
    assert_eq!(t.queues_in_use(), 0);
    assert_eq!(t.controllers().count(), 0);
    assert_eq!(counts.accepted, 3);
    assert_eq!(counts.errors, 0);
    assert_eq!(counts.lost, 1);
    drop(t);
    assert_eq!(disk.flushes(), 1);
    assert_eq!(&disk.bytes()[8 * 512..16 * 512], &small[..]);
    assert_eq!(&disk.bytes()[100 * 512..104 * 512], &big[..2048]);
    assert!(disk.bytes()[104 * 512..108 * 512].iter().all(|&x| x == 0));
    let _ = (Status::SUCCESS, l.clk.now_us());
}

/// CAP.MQES and MAXCMD say the I/O queue depth the target accepts, so a host that asks
/// for more (Linux asks for 128) clamps to it and its queue's REQ is not refused.
#[test]
fn cap_and_maxcmd_follow_the_io_depth() {
    let mut cfg = tcfg();
    cfg.io_depth = 16;
    setup!(l, t, h, cma, cmb, disk, cfg, hcfg(HOST_A); idle);
    h.connect(&mut cma, &mut idle).unwrap();
    let cap = h.property_get(prop::CAP, true, &mut idle).unwrap();
    assert_eq!(cap & 0xFFFF, 15, "MQES, 0's based");
    assert_eq!(h.controller().maxcmd, 16);
    assert_eq!(h.io_queues(), 2);
    let slots: Vec<u16> = (0..16u64)
        .map(|k| {
            h.submit(1, Sqe::rw(opcode::READ, 0, 1, k, 1), Data::In(512))
                .unwrap()
        })
        .collect();
    assert_eq!(
        h.submit(1, Sqe::rw(opcode::READ, 0, 1, 0, 1), Data::In(512)),
        Err(bareverbs_nvmf::HostError::Busy),
        "the queue is 16 deep"
    );
    for s in slots {
        h.wait(1, s, &mut [], &mut idle).unwrap();
    }
    let _ = &disk;
}

/// What Linux's host does beyond this crate's host: keyed SGLs asking for invalidation
/// (subtype 0xF, answered with a plain SEND), CC written with EN = 0 and read back before
/// EN = 1 (a reset: the I/O queues connect again), Identify CNS 0x06 (refused, which Linux
/// tolerates), the SMART log for every namespace (NSID 0xFFFFFFFF), the active list from an
/// NSID past the last.
#[test]
fn what_linux_sends_besides() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A); idle);
    h.connect(&mut cma, &mut idle).unwrap();
    let cfg = (6 << 16) | (4 << 20);
    h.property_set(prop::CC, cfg, &mut idle).unwrap();
    assert_eq!(
        h.property_get(prop::CC, false, &mut idle).unwrap(),
        u64::from(cfg)
    );
    assert_eq!(h.property_get(prop::CSTS, false, &mut idle).unwrap() & 1, 0);
    // Disabled, the controller refuses everything but the fabrics commands.
    let refused = Err(bareverbs_nvmf::HostError::Status(Status::SEQUENCE_ERROR));
    assert_eq!(h.identify_namespace(1, &mut idle).map(|_| ()), refused);
    // Clearing EN reset the controller: its I/O queues ended (tests/reset.rs has the rest).
    for _ in 0..500 {
        idle();
        h.poll();
        while let Some(e) = cma.poll() {
            h.on_cm_event(e);
        }
    }
    assert!(!h.connected(1) && !h.connected(2));
    h.property_set(prop::CC, cfg | 1, &mut idle).unwrap();
    assert_eq!(h.property_get(prop::CSTS, false, &mut idle).unwrap() & 1, 1);
    h.reconnect_io(&mut cma, 1, &mut idle).unwrap();
    h.reconnect_io(&mut cma, 2, &mut idle).unwrap();
    let mut b = [0xAAu8; 4096];
    assert_eq!(
        h.identify(0x06, 0, &mut b, &mut idle),
        Err(bareverbs_nvmf::HostError::Status(Status::INVALID_FIELD))
    );
    h.identify(cns::ACTIVE_NS_LIST, 1, &mut b, &mut idle)
        .unwrap();
    assert!(b.iter().all(|&x| x == 0), "no NSID above 1");
    let mut s = Sqe::new(opcode::GET_LOG_PAGE, 0);
    s.set_nsid(0xFFFF_FFFF);
    s.set_cdw(10, 2 | (127 << 16));
    h.exec(0, s, Data::In(512), &mut b, &mut idle).unwrap();
    // A write and a read with keyed descriptors, from and into slot 0's data buffer of
    // queue 1: a read fills it first (the target writes the disk's bytes). (Linux asks for
    // its fast-registered keys to be invalidated with the response; this buffer's key is a
    // plain registration, which cannot be: tests/invalidate.rs has that case.)
    let (addr, key) = h.data_key(1, 0).unwrap();
    let data = pattern(4096, 77);
    h.write(1, 1, 1000, 8, &data, &mut idle).unwrap();
    let mut back = vec![0u8; 4096];
    h.read(1, 1, 1000, 8, &mut back, &mut idle).unwrap();
    let mut s = Sqe::rw(opcode::WRITE, 0x31, 1, 40, 8);
    s.set_sgl(&Sgl::Keyed {
        addr,
        len: 4096,
        key,
        invalidate: false,
    });
    let slot = h.submit_raw(1, &s.0, 0x31).unwrap();
    assert_eq!(slot, 0, "the buffer named is the slot's own");
    h.wait(1, slot, &mut [], &mut idle).unwrap();
    let mut s = Sqe::rw(opcode::READ, 0x32, 1, 40, 8);
    s.set_sgl(&Sgl::Keyed {
        addr,
        len: 4096,
        key,
        invalidate: false,
    });
    let slot = h.submit_raw(1, &s.0, 0x32).unwrap();
    h.wait(1, slot, &mut [], &mut idle).unwrap();
    back.fill(0);
    h.read(2, 1, 40, 8, &mut back, &mut idle).unwrap();
    assert_eq!(back, data);
    let _ = &disk;
}

/// Two namespaces of different block sizes in one subsystem: the lists, each namespace's
/// own geometry and data.
#[test]
fn two_namespaces() {
    let l = lab();
    let (sa, sb) = (side(&l.a), side(&l.b));
    let (mut cma, mut cmb) = (cm(&sa, &l.clk), target_cm(&sb, &l.clk));
    let (mut m1, mut m2) = (vec![0u8; 1 << 18], vec![0u8; 1 << 18]);
    let mut d1 = RamDisk::new(&mut m1, 512);
    let mut d2 = RamDisk::new(&mut m2, 4096);
    let mut nss: [&mut dyn BlockDevice; 2] = [&mut d1, &mut d2];
    let mut subs = [Subsystem::new(NQN, &mut nss)];
    let mut t: T = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
    let mut h: H = H::new(&sa.pd, &sa.dcq, l.clk.clone(), hcfg(HOST_A));
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.connect(&mut cma, &mut idle).unwrap();
    assert_eq!(h.controller().nn, 2);
    let mut b = [0u8; 4096];
    h.identify(cns::ACTIVE_NS_LIST, 0, &mut b, &mut idle)
        .unwrap();
    assert_eq!(&b[..12], &[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    h.identify(cns::ACTIVE_NS_LIST, 1, &mut b, &mut idle)
        .unwrap();
    assert_eq!(&b[..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
    let n1 = h.identify_namespace(1, &mut idle).unwrap();
    let n2 = h.identify_namespace(2, &mut idle).unwrap();
    assert_eq!((n1.nsze, n1.lbads, n2.nsze, n2.lbads), (512, 9, 64, 12));
    assert_ne!(n1.nguid, n2.nguid);
    let data = pattern(8192, 12);
    h.write(1, 2, 62, 2, &data, &mut idle).unwrap();
    let mut back = vec![0u8; 8192];
    h.read(2, 2, 62, 2, &mut back, &mut idle).unwrap();
    assert_eq!(back, data);
    h.read(2, 1, 496, 16, &mut back, &mut idle).unwrap();
    assert!(back.iter().all(|&x| x == 0), "namespace 1 untouched");
    assert_eq!(
        h.read(1, 2, 63, 2, &mut back, &mut idle),
        Err(bareverbs_nvmf::HostError::Status(Status::LBA_RANGE))
    );
}
