//! Every error path of the target comes back as an NVMe status on a queue that stays up:
//! invalid opcodes, fields, namespaces, log pages, LBA ranges, SGL types, lengths and
//! offsets, a capsule shorter than an SQE, a Connect out of sequence. Then a key the host
//! never gave: that queue's transport fails, only it ends, the controller and other hosts'
//! work go on, and the queue reconnects.

mod common;

use bareverbs_nvmf::host::{Data, HostError};
use bareverbs_nvmf::wire::fabrics::{CONNECT_DATA_LEN, Connect};
use bareverbs_nvmf::wire::{Sgl, Sqe, Status, feature, opcode, prop};
use common::*;

fn status(r: Result<bareverbs_nvmf::Cqe, HostError>) -> Status {
    match r {
        Err(HostError::Status(s)) => s,
        other => panic!("expected an error status, got {other:?}"),
    }
}

#[test]
fn every_error_is_a_status_and_the_queues_stay_up() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A); idle);
    h.connect(&mut cma, &mut idle).unwrap();
    let mut none: [u8; 0] = [];
    let run = |h: &mut H, qid: u16, s: Sqe, d: Data<'_>, idle: &mut dyn FnMut()| {
        status(h.exec(qid, s, d, &mut [], idle))
    };
    // Opcodes.
    assert_eq!(
        run(&mut h, 0, Sqe::new(0xFE, 0), Data::None, &mut idle),
        Status::INVALID_OPCODE
    );
    assert_eq!(
        run(&mut h, 1, Sqe::new(0x7E, 0), Data::None, &mut idle),
        Status::INVALID_OPCODE
    );
    assert_eq!(
        run(
            &mut h,
            1,
            Sqe::new(opcode::IDENTIFY, 0),
            Data::None,
            &mut idle
        ),
        Status::INVALID_OPCODE
    );
    let mut fab = Sqe::new(opcode::FABRICS, 0);
    fab.0[4] = 0x33;
    assert_eq!(
        run(&mut h, 0, fab, Data::None, &mut idle),
        Status::INVALID_OPCODE
    );
    // Identify: an unknown CNS, a namespace that does not exist.
    let mut s = Sqe::new(opcode::IDENTIFY, 0);
    s.set_cdw(10, 0x55);
    assert_eq!(
        run(&mut h, 0, s, Data::In(4096), &mut idle),
        Status::INVALID_FIELD
    );
    let mut s = Sqe::new(opcode::IDENTIFY, 0);
    s.set_nsid(9);
    assert_eq!(
        run(&mut h, 0, s, Data::In(4096), &mut idle),
        Status::INVALID_NS
    );
    // Identify with a buffer of the wrong size.
    let mut s = Sqe::new(opcode::IDENTIFY, 0);
    s.set_cdw(10, 1);
    assert_eq!(
        run(&mut h, 0, s, Data::In(512), &mut idle),
        Status::SGL_LENGTH_INVALID
    );
    // Properties: an unknown offset, a read-only one, a size code that does not exist.
    assert_eq!(
        status(
            h.property_get(0x40, false, &mut idle)
                .map(|_| Default::default())
        ),
        Status::INVALID_FIELD
    );
    assert_eq!(
        status(
            h.property_set(prop::CAP, 1, &mut idle)
                .map(|_| Default::default())
        ),
        Status::INVALID_FIELD
    );
    let mut s = bareverbs_nvmf::wire::fabrics::Property {
        size8: false,
        offset: prop::VS,
        value: 0,
    }
    .to_sqe(0, false);
    s.0[40] = 5;
    assert_eq!(
        run(&mut h, 0, s, Data::None, &mut idle),
        Status::INVALID_FIELD
    );
    // Log pages and features.
    let mut page = [0u8; 512];
    assert_eq!(
        status(
            h.get_log_page(0x33, 0, &mut page, &mut idle)
                .map(|_| Default::default())
        ),
        Status::INVALID_LOG_PAGE
    );
    assert_eq!(
        status(
            h.get_log_page(2, 4096, &mut page, &mut idle)
                .map(|_| Default::default())
        ),
        Status::INVALID_FIELD
    );
    let mut s = Sqe::new(opcode::SET_FEATURES, 0);
    s.set_cdw(10, 0x99);
    assert_eq!(
        run(&mut h, 0, s, Data::None, &mut idle),
        Status::INVALID_FIELD
    );
    let mut s = Sqe::new(opcode::SET_FEATURES, 0);
    s.set_cdw(10, u32::from(feature::KEEP_ALIVE) | (1 << 31));
    assert_eq!(
        run(&mut h, 0, s, Data::None, &mut idle),
        Status::FEATURE_NOT_SAVEABLE
    );
    let mut s = Sqe::new(opcode::GET_FEATURES, 0);
    s.set_cdw(10, 0x99);
    assert_eq!(
        run(&mut h, 0, s, Data::None, &mut idle),
        Status::INVALID_FIELD
    );

    // LBA ranges: the namespace has 2048 blocks.
    let mut buf = vec![0u8; 1024];
    assert_eq!(
        status(
            h.read(1, 1, 2047, 2, &mut buf, &mut idle)
                .map(|_| Default::default())
        ),
        Status::LBA_RANGE
    );
    assert_eq!(
        status(
            h.write(1, 1, 2047, 2, &buf, &mut idle)
                .map(|_| Default::default())
        ),
        Status::LBA_RANGE
    );
    assert_eq!(
        status(
            h.write(2, 1, 4096, 2, &buf, &mut idle)
                .map(|_| Default::default())
        ),
        Status::LBA_RANGE
    );
    assert_eq!(
        status(
            h.write_zeroes(1, 1, 2040, 9, &mut idle)
                .map(|_| Default::default())
        ),
        Status::LBA_RANGE
    );
    assert_eq!(
        status(
            h.read(1, 1, u64::MAX, 2, &mut buf, &mut idle)
                .map(|_| Default::default())
        ),
        Status::LBA_RANGE
    );
    // Namespaces.
    assert_eq!(
        status(
            h.read(1, 2, 0, 2, &mut buf, &mut idle)
                .map(|_| Default::default())
        ),
        Status::INVALID_NS
    );
    assert_eq!(
        status(h.flush(1, 0, &mut idle).map(|_| Default::default())),
        Status::INVALID_NS
    );
    // More than the target moves in one command (16 KiB): raw, the host would refuse.
    let (addr, key) = h.data_key(1, 0).unwrap();
    let mut s = Sqe::rw(opcode::READ, 0x77, 1, 0, 64);
    s.set_sgl(&Sgl::Keyed {
        addr,
        len: 32768,
        key,
        invalidate: false,
    });
    let slot = h.submit_raw(1, &s.0, 0x77).unwrap();
    assert_eq!(
        status(h.wait(1, slot, &mut none, &mut idle)),
        Status::INVALID_FIELD
    );

    // SGLs: a type the transport does not have, a length that is not the command's, an
    // in-capsule offset past the data, in-capsule data for a read, no data for a write.
    let mut s = Sqe::rw(opcode::WRITE, 0x101, 1, 0, 8);
    s.0[24..40].copy_from_slice(&[0; 16]);
    s.0[39] = 0x20; // a segment descriptor
    let slot = h.submit_raw(1, &s.0, 0x101).unwrap();
    assert_eq!(
        status(h.wait(1, slot, &mut none, &mut idle)),
        Status::SGL_TYPE_INVALID
    );
    let mut s = Sqe::rw(opcode::WRITE, 0x102, 1, 0, 8);
    s.set_sgl(&Sgl::Keyed {
        addr,
        len: 1024,
        key,
        invalidate: false,
    });
    let slot = h.submit_raw(1, &s.0, 0x102).unwrap();
    assert_eq!(
        status(h.wait(1, slot, &mut none, &mut idle)),
        Status::SGL_LENGTH_INVALID
    );
    let mut cap = vec![0u8; 64 + 512];
    let mut s = Sqe::rw(opcode::WRITE, 0x103, 1, 0, 1);
    s.set_sgl(&Sgl::InCapsule {
        offset: 256,
        len: 512,
    });
    cap[..64].copy_from_slice(&s.0);
    let slot = h.submit_raw(1, &cap, 0x103).unwrap();
    assert_eq!(
        status(h.wait(1, slot, &mut none, &mut idle)),
        Status::SGL_OFFSET_INVALID
    );
    let mut s = Sqe::rw(opcode::WRITE, 0x104, 1, 0, 1);
    s.set_sgl(&Sgl::InCapsule {
        offset: u64::MAX - 10,
        len: 512,
    });
    cap[..64].copy_from_slice(&s.0);
    let slot = h.submit_raw(1, &cap, 0x104).unwrap();
    assert_eq!(
        status(h.wait(1, slot, &mut none, &mut idle)),
        Status::SGL_OFFSET_INVALID
    );
    let mut s = Sqe::rw(opcode::READ, 0x105, 1, 0, 1);
    s.set_sgl(&Sgl::InCapsule {
        offset: 0,
        len: 512,
    });
    cap[..64].copy_from_slice(&s.0);
    let slot = h.submit_raw(1, &cap, 0x105).unwrap();
    assert_eq!(
        status(h.wait(1, slot, &mut none, &mut idle)),
        Status::INVALID_FIELD
    );
    let s = Sqe::rw(opcode::WRITE, 0x106, 1, 0, 1);
    let slot = h.submit_raw(1, &s.0, 0x106).unwrap();
    assert_eq!(
        status(h.wait(1, slot, &mut none, &mut idle)),
        Status::SGL_LENGTH_INVALID
    );

    // A capsule shorter than an SQE: answered with its command ID, on either queue.
    let mut short = [0u8; 32];
    short[0] = opcode::READ;
    short[2..4].copy_from_slice(&0x1234u16.to_le_bytes());
    let slot = h.submit_raw(1, &short, 0x1234).unwrap();
    assert_eq!(
        status(h.wait(1, slot, &mut none, &mut idle)),
        Status::INVALID_FIELD
    );
    let slot = h.submit_raw(0, &short[..8], 0x1234).unwrap();
    assert_eq!(
        status(h.wait(0, slot, &mut none, &mut idle)),
        Status::INVALID_FIELD
    );
    // A Connect on a queue that is connected.
    let c = Connect {
        recfmt: 0,
        qid: 1,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    };
    let d = vec![0u8; CONNECT_DATA_LEN];
    assert_eq!(
        status(h.exec(1, c.to_sqe(0), Data::Out(&d), &mut [], &mut idle)),
        Status::SEQUENCE_ERROR
    );

    // Every queue still up, and data still moves.
    assert!(h.connected(0) && h.connected(1) && h.connected(2));
    let data = pattern(2048, 9);
    h.write(1, 1, 2044, 4, &data, &mut idle).unwrap();
    let mut back = vec![0u8; 2048];
    h.read(2, 1, 2044, 4, &mut back, &mut idle).unwrap();
    assert_eq!(back, data);
    let c = t.counts();
    assert_eq!(c.errors, 32, "one per command above");
    assert_eq!((c.lost, c.transport_errors), (0, 0));
    assert_eq!(t.queues_in_use(), 3);
    let _ = &disk;
}

/// A hostile host: 600 capsules of random bytes and lengths (never a key the target could
/// use, never a request that changes the controller's timers or holds a slot open), each
/// answered with a status echoing its command ID; every queue stays up, nothing is lost.
#[test]
fn random_capsules_are_each_answered() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A); idle);
    h.connect(&mut cma, &mut idle).unwrap();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut answered = 0;
    for k in 0..600 {
        let qid = (k % 3) as u16;
        let max = if qid == 0 { 64 } else { 64 + 4096 };
        let len = 1 + (rnd() as usize % max);
        let mut cap: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
        if len > 39 && matches!(cap[39], 0x40 | 0x4F) {
            cap[39] = 0x41;
        }
        if qid == 0 && matches!(cap[0], opcode::ASYNC_EVENT | opcode::SET_FEATURES) {
            cap[0] = 0xF0;
        }
        let cid = if len >= 4 {
            u16::from_le_bytes([cap[2], cap[3]])
        } else {
            0
        };
        let s = h.submit_raw(qid, &cap, cid).unwrap();
        match h.wait(qid, s, &mut [], &mut idle) {
            Ok(_) | Err(HostError::Status(_)) => answered += 1,
            Err(e) => panic!("capsule {k} ({len} bytes on queue {qid}): {e:?}"),
        }
    }
    assert_eq!(answered, 600);
    assert!(h.connected(0) && h.connected(1) && h.connected(2));
    let data = pattern(1024, 1);
    h.write(1, 1, 0, 2, &data, &mut idle).unwrap();
    let mut back = vec![0u8; 1024];
    h.read(2, 1, 0, 2, &mut back, &mut idle).unwrap();
    assert_eq!(back, data);
    let c = t.counts();
    assert_eq!((c.lost, c.transport_errors), (0, 0));
    assert!(c.errors > 500, "almost all refused: {c:?}");
    let _ = &disk;
}
