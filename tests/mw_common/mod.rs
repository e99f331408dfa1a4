//! What the memory-window and fast-registration tests share: RC pairs between the two rxe
//! devices of `pair::on_rxe` (or on one of them; on the PVRDMA model's one device for the
//! translated rdma-core cases), and waiting for completions.
#![allow(dead_code)] // each test binary uses a different subset

use bareverbs::verbs::*;

use crate::common::{poll_until, rc_to_rts};
use crate::pair::{Ends, R};

pub type RcQp<'a, P = R> = QueuePair<'a, P, Rc, Rts>;
pub type Pd<'a, P = R> = ProtectionDomain<'a, P>;
pub type Cq<'a, P = R> = CompletionQueue<'a, P>;

pub const SIG: SendFlags = SendFlags::SIGNALED;
pub const REMOTE: AccessFlags = AccessFlags::REMOTE_READ
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_ATOMIC);

/// RESET → RTS towards QP `peer` at `av`, every remote right granted by the QP (the keys
/// decide).
fn up<'a, P: Provider>(
    qp: QueuePair<'a, P, Rc, Reset>,
    peer: u32,
    av: AddressVector,
) -> RcQp<'a, P> {
    let init = ConnectedInit {
        access: REMOTE,
        ..Default::default()
    };
    let mut rtr = ConnectedRtr::new(peer, 0, av);
    rtr.max_dest_rd_atomic = 4;
    rtr.path_mtu = Mtu::Mtu1024; // messages of a few KiB take several packets
    let mut rts = ConnectedRts::new(0);
    rts.max_rd_atomic = 4;
    rts.timeout = 8;
    rc_to_rts(qp, &init, &rtr, &rts)
}

/// An RC pair: `a` on device A (PD `pa`, CQ `ca`), `b` on device B, connected.
pub fn pair<'p, P: Provider>(
    e: &Ends<'_, P>,
    (pa, ca): (&'p Pd<'_, P>, &'p Cq<'_, P>),
    (pb, cb): (&'p Pd<'_, P>, &'p Cq<'_, P>),
) -> (RcQp<'p, P>, RcQp<'p, P>) {
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    };
    let a = pa.qp_builder(ca, ca).caps(caps).build::<Rc>().unwrap();
    let b = pb.qp_builder(cb, cb).caps(caps).build::<Rc>().unwrap();
    let (na, nb) = (a.qp_num(), b.qp_num());
    (up(a, nb, e.to_b), up(b, na, e.to_a))
}

/// Completions of `cq` until `n` came (the devices run between polls); fewer if they do not.
pub fn wait<P: Provider>(e: &Ends<'_, P>, cq: &Cq<'_, P>, n: usize) -> Vec<WorkCompletion> {
    poll_until(&mut || (e.settle)(), cq, n, 50)
}

/// Everything `cq` has after the devices settled.
pub fn settle_all<P: Provider>(e: &Ends<'_, P>, cq: &Cq<'_, P>) -> Vec<WorkCompletion> {
    (e.settle)();
    wait(e, cq, usize::MAX)
}

/// The QP's state as the device reports it.
pub fn state<P: Provider>(qp: &RcQp<'_, P>) -> QpState {
    qp.query().unwrap().state
}

/// RDMA READ of `len` bytes at `addr` under `rkey` into `dst[0..len]`, signaled `wr_id`.
pub fn read<P: Provider>(
    qp: &mut RcQp<'_, P>,
    wr_id: u64,
    (addr, rkey): (u64, u32),
    dst: &MemoryRegion<'_, P>,
    len: u32,
) {
    // SAFETY: the tests leave `dst` alone until the completion is polled.
    unsafe {
        let mut b = qp.send_batch();
        b.rdma_read(wr_id, SIG, (addr, rkey), &[dst.sge(0, len).unwrap()])
            .unwrap();
        b.finish();
    }
}

/// RDMA WRITE of `src[0..len]` to `addr` under `rkey`, signaled `wr_id`.
pub fn write<P: Provider>(
    qp: &mut RcQp<'_, P>,
    wr_id: u64,
    (addr, rkey): (u64, u32),
    src: &MemoryRegion<'_, P>,
    len: u32,
) {
    // SAFETY: as in `read`.
    unsafe {
        let mut b = qp.send_batch();
        b.rdma_write(wr_id, SIG, (addr, rkey), &[src.sge(0, len).unwrap()])
            .unwrap();
        b.finish();
    }
}

/// The one completion of `wr_id` among `wcs` (panics when there is not exactly one).
pub fn one(wcs: &[WorkCompletion], wr_id: u64) -> WorkCompletion {
    let found: Vec<_> = wcs.iter().filter(|c| c.wr_id == wr_id).collect();
    assert_eq!(found.len(), 1, "completions of {wr_id} in {wcs:?}");
    *found[0]
}
