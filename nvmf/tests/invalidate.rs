//! SEND with Invalidate: a command whose keyed descriptor asks for its key to be invalidated
//! (Linux's host asks so for its fast-registered keys) is answered with a SEND with
//! Invalidate of that key, and the key is dead at the host once the response has arrived.

mod common;

use bareverbs::verbs::*;
use bareverbs_nvmf::block::{BlockDevice, RamDisk};
use bareverbs_nvmf::target::Subsystem;
use bareverbs_nvmf::wire::{Sgl, Sqe, Status, opcode};
use common::*;

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);
const IOVA: u64 = 0x7000_0000;

/// `qp` (device of `ip`) to RTS, connected to QP `peer` at `peer_ip`.
fn rc_up<'a>(
    qp: QueuePair<'a, R, Rc, Reset>,
    peer: u32,
    peer_ip: [u8; 4],
) -> QueuePair<'a, R, Rc, Rts> {
    let init = ConnectedInit {
        access: RW,
        ..Default::default()
    };
    let qp = qp.init(&init).unwrap();
    let av = AddressVector::new(Gid::from_ipv4(peer_ip), 1);
    let qp = qp.rtr(&ConnectedRtr::new(peer, 0, av)).unwrap();
    qp.rts(&ConnectedRts::new(0)).unwrap()
}

/// Polls `cq` (advancing time, running the target) until one completion arrives.
#[track_caller]
fn one(cq: &CompletionQueue<'_, R>, idle: &mut dyn FnMut()) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    for _ in 0..10_000 {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        idle();
    }
    panic!("no completion");
}

#[test]
fn a_key_the_host_asks_to_invalidate_dies_with_the_response() {
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
    // The target's count of responses sent with Invalidate, as of the last poll.
    let invalidated = std::cell::Cell::new(0);
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
        invalidated.set(t.counts().invalidated);
        // The host's device and the third station run too.
        l.a.process_events();
        l.c.process_events();
    };
    h.connect(&mut cma, &mut idle).unwrap();
    let data = pattern(4096, 9);
    h.write(1, 1, 0, 8, &data, &mut idle).unwrap();

    // The host's memory for the read: a fast registration, in the host's PD, over a region
    // of its own, registered through a QP of that PD; a third station (device C) holds the
    // other end of that QP and tries the key before and after.
    let (ca, cc) = (l.a.create_cq(16).unwrap(), l.c.create_cq(16).unwrap());
    let pc = l.c.alloc_pd().unwrap();
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qa = sa.pd.qp_builder(&ca, &ca).caps(caps).build::<Rc>().unwrap();
    let qc = pc.qp_builder(&cc, &cc).caps(caps).build::<Rc>().unwrap();
    let (na, nc) = (qa.qp_num(), qc.qp_num());
    let (mut qa, mut qc) = (rc_up(qa, nc, IP_C), rc_up(qc, na, IP_A));
    let region = sa.pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut fr = sa.pd.alloc_fast_reg_mr(1).unwrap();
    let reg = FastReg {
        sge: region.sge(0, 4096).unwrap(),
        iova: IOVA,
        access: RW,
    };
    let mut b = qa.send_batch();
    let key = b
        .reg_mr(1, SendFlags::SIGNALED, &mut fr, 0x42, &reg)
        .unwrap();
    b.finish();
    let c = one(&ca, &mut idle);
    assert_eq!((c.opcode, c.status), (WcOpcode::RegMr, WcStatus::Success));
    // C can write through the key while it lives.
    let src = pc.register(64, RW).unwrap();
    let mut b = qc.send_batch();
    // SAFETY: `src` outlives the request and its completion.
    unsafe {
        b.rdma_write(
            2,
            SendFlags::SIGNALED,
            (IOVA + 4032, key),
            &[src.sge(0, 64).unwrap()],
        )
    }
    .unwrap();
    b.finish();
    assert_eq!(
        one(&cc, &mut idle).status,
        WcStatus::Success,
        "the key lives"
    );

    // A read of blocks 0..8 into the key, asking for its invalidation.
    let mut s = Sqe::rw(opcode::READ, 0x51, 1, 0, 8);
    s.set_sgl(&Sgl::Keyed {
        addr: IOVA,
        len: 4096,
        key,
        invalidate: true,
    });
    let slot = h.submit_raw(1, &s.0, 0x51).unwrap();
    let cqe = h.wait(1, slot, &mut [], &mut idle).unwrap();
    assert_eq!(cqe.status, Status::SUCCESS);
    assert_eq!(
        region.as_slice(),
        &data[..],
        "the data came through the key"
    );
    assert_eq!(invalidated.get(), 1, "answered with a SEND with Invalidate");

    // The key is dead: C's next write through it fails, and the region is unchanged.
    let mut b = qc.send_batch();
    // SAFETY: as above.
    unsafe {
        b.rdma_write(
            3,
            SendFlags::SIGNALED,
            (IOVA, key),
            &[src.sge(0, 64).unwrap()],
        )
    }
    .unwrap();
    b.finish();
    assert_eq!(
        one(&cc, &mut idle).status,
        WcStatus::RemAccessErr,
        "the key was invalidated"
    );
    assert_eq!(region.as_slice(), &data[..]);

    // The queue goes on: a plain read (no invalidation asked) answers with a plain SEND.
    let mut back = vec![0u8; 4096];
    h.read(1, 1, 0, 8, &mut back, &mut idle).unwrap();
    assert_eq!(back, data);
    assert_eq!(invalidated.get(), 1);
    drop((qa, qc));
}
