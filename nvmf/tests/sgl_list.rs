//! Several SGL descriptors per command: a Last Segment descriptor (offset form) pointing to a
//! list of keyed data blocks in the capsule, for writes (one RDMA READ per descriptor) and
//! reads (one RDMA WRITE per descriptor, then the response); malformed lists answered with
//! their statuses, the queue kept.

mod common;

use bareverbs_nvmf::host::{Data, HostError};
use bareverbs_nvmf::target::MSDBD;
use bareverbs_nvmf::wire::identify::{IDENTIFY_LEN, cns};
use bareverbs_nvmf::wire::{Sgl, Sqe, Status, opcode};
use common::*;

/// A Read or Write capsule of `nlb` blocks at `slba` whose data pointer is a Last Segment at
/// in-capsule offset `offset` naming `list` (raw descriptors, 16 bytes each).
fn capsule(
    op: u8,
    cid: u16,
    slba: u64,
    nlb: u32,
    offset: u64,
    len: u32,
    list: &[[u8; 16]],
) -> Vec<u8> {
    let mut s = Sqe::rw(op, cid, 1, slba, nlb);
    s.set_sgl(&Sgl::LastSegment { offset, len });
    let mut cap = s.0.to_vec();
    cap.resize(64 + offset.min(1024) as usize, 0); // (an offset past the capsule: no padding)
    for d in list {
        cap.extend_from_slice(d);
    }
    cap
}

fn keyed(addr: u64, len: u32, key: u32) -> [u8; 16] {
    Sgl::Keyed {
        addr,
        len,
        key,
        invalidate: false,
    }
    .to_bytes()
}

fn status(r: Result<bareverbs_nvmf::wire::Cqe, HostError>) -> Status {
    match r {
        Ok(c) => c.status,
        Err(HostError::Status(s)) => s,
        Err(e) => panic!("{e:?}"),
    }
}

#[test]
fn a_descriptor_list_moves_each_piece_to_its_place() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A); idle);
    h.connect(&mut cma, &mut idle).unwrap();
    let mut id = [0u8; IDENTIFY_LEN];
    h.identify(cns::CONTROLLER, 0, &mut id, &mut idle).unwrap();
    assert_eq!(id[1803], MSDBD, "MSDBD");
    // P on blocks 0..8, then read back: slot 0's data buffer on queue 1 holds P.
    let p = pattern(4096, 5);
    h.write(1, 1, 0, 8, &p, &mut idle).unwrap();
    let mut back = vec![0u8; 4096];
    h.read(1, 1, 0, 8, &mut back, &mut idle).unwrap();
    assert_eq!(back, p);
    let (addr, key) = h.data_key(1, 0).unwrap();

    // A write of blocks 100..108 from three pieces of that buffer, out of order: the disk
    // gets P[3072..] ++ P[1024..3072] ++ P[..1024]. The command's own slot is slot 0 too
    // (the first free): its capsule buffer, not its data buffer.
    let list = [
        keyed(addr + 3072, 1024, key),
        keyed(addr + 1024, 2048, key),
        keyed(addr, 1024, key),
    ];
    let cap = capsule(opcode::WRITE, 0x201, 100, 8, 0, 48, &list);
    let s = h.submit_raw(1, &cap, 0x201).unwrap();
    assert_eq!(status(h.wait(1, s, &mut [], &mut idle)), Status::SUCCESS);
    let want: Vec<u8> = [&p[3072..], &p[1024..3072], &p[..1024]].concat();
    h.read(1, 1, 100, 8, &mut back, &mut idle).unwrap();
    assert_eq!(back, want, "each piece read from its place, in order");

    // A read of blocks 100..108 into two pieces, the list at an offset in the capsule: slot
    // 0's buffer gets want[2048..] at 0 and want[..2048] at 2048.
    let list = [keyed(addr + 2048, 2048, key), keyed(addr, 2048, key)];
    let cap = capsule(opcode::READ, 0x202, 100, 8, 32, 32, &list);
    let s = h.submit_raw(1, &cap, 0x202).unwrap();
    assert_eq!(status(h.wait(1, s, &mut [], &mut idle)), Status::SUCCESS);
    // What the buffer holds now, written to blocks 200..208 by a plain keyed write of it.
    let mut w = Sqe::rw(opcode::WRITE, 0x203, 1, 200, 8);
    w.set_sgl(&Sgl::Keyed {
        addr,
        len: 4096,
        key,
        invalidate: false,
    });
    let s = h.submit_raw(1, &w.0, 0x203).unwrap();
    assert_eq!(status(h.wait(1, s, &mut [], &mut idle)), Status::SUCCESS);
    h.read(1, 1, 200, 8, &mut back, &mut idle).unwrap();
    let got: Vec<u8> = [&want[2048..], &want[..2048]].concat();
    assert_eq!(back, got, "each piece written to its place");
    let _ = &disk;
}

#[test]
fn malformed_descriptor_lists_get_their_statuses_and_the_queue_stays() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A); idle);
    h.connect(&mut cma, &mut idle).unwrap();
    let (addr, key) = h.data_key(1, 0).unwrap();
    let k = |len| keyed(addr, len, key);
    let mut other = k(512);
    other[15] = 0x01; // a data block (offset) inside the list
    let mut nested = k(512);
    nested[15] = 0x31; // a Last Segment inside the list
    let five = [k(512), k(512), k(512), k(512), k(1024)];
    // (capsule, expected status)
    let cases: Vec<(Vec<u8>, Status, &str)> = vec![
        (
            capsule(opcode::WRITE, 1, 0, 8, 0, 0, &[]),
            Status::SGL_COUNT_INVALID,
            "no descriptor",
        ),
        (
            capsule(opcode::WRITE, 2, 0, 8, 0, 24, &[k(2048), k(2048)]),
            Status::SGL_COUNT_INVALID,
            "a part of one",
        ),
        (
            capsule(opcode::READ, 3, 0, 8, 0, 80, &five),
            Status::SGL_COUNT_INVALID,
            "more than MSDBD",
        ),
        (
            capsule(opcode::WRITE, 4, 0, 8, 0, 32, &[k(4096)]),
            Status::SGL_OFFSET_INVALID,
            "past the bytes sent",
        ),
        (
            capsule(opcode::WRITE, 5, 0, 8, u64::MAX - 8, 16, &[]),
            Status::SGL_OFFSET_INVALID,
            "an offset that overflows",
        ),
        (
            capsule(opcode::WRITE, 6, 0, 8, 0, 32, &[k(2048), other]),
            Status::SGL_TYPE_INVALID,
            "not a keyed block",
        ),
        (
            capsule(opcode::READ, 7, 0, 8, 0, 32, &[nested, k(2048)]),
            Status::SGL_TYPE_INVALID,
            "a segment in the list",
        ),
        (
            capsule(opcode::WRITE, 8, 0, 8, 0, 32, &[k(2048), k(1024)]),
            Status::SGL_LENGTH_INVALID,
            "short of the command's length",
        ),
        (
            capsule(opcode::READ, 9, 0, 8, 0, 32, &[k(4096), k(0)]),
            Status::SGL_LENGTH_INVALID,
            "an empty descriptor",
        ),
    ];
    for (cap, want, what) in cases {
        let cid = u16::from_le_bytes([cap[2], cap[3]]);
        let s = h.submit_raw(1, &cap, cid).unwrap();
        assert_eq!(status(h.wait(1, s, &mut [], &mut idle)), want, "{what}");
    }
    // The Last Segment's address form (the list in the host's memory) is not taken.
    let mut s = Sqe::rw(opcode::WRITE, 10, 1, 0, 8);
    s.0[24..40].copy_from_slice(&k(16));
    s.0[39] = 0x30;
    let slot = h.submit_raw(1, &s.0, 10).unwrap();
    assert_eq!(
        status(h.wait(1, slot, &mut [], &mut idle)),
        Status::SGL_TYPE_INVALID
    );
    // On the admin queue (64-byte capsules) there is no room for a list.
    let mut s = Sqe::new(opcode::IDENTIFY, 11);
    s.set_cdw(10, u32::from(cns::CONTROLLER));
    s.set_sgl(&Sgl::LastSegment { offset: 0, len: 16 });
    let slot = h.submit_raw(0, &s.0, 11).unwrap();
    assert_eq!(
        status(h.wait(0, slot, &mut [], &mut idle)),
        Status::SGL_OFFSET_INVALID
    );
    // The queues go on.
    let p = pattern(4096, 11);
    h.write(1, 1, 8, 8, &p, &mut idle).unwrap();
    let mut back = vec![0u8; 4096];
    h.read(1, 1, 8, 8, &mut back, &mut idle).unwrap();
    assert_eq!(back, p);
    assert!(h.connected(0) && h.connected(1));
    let _ = (&disk, Data::None);
}
