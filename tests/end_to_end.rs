//! One pass through the new data path on the model: the safe path with a buffer pool, the raw
//! batches, a flush on ERR, and every buffer and DMA page back at the end.
mod common;
use bareverbs::Context;
use bareverbs::device::pvrdma::{Config, Opcodes, Pvrdma};
use bareverbs::verbs::*;
use bareverbs_model::Model;
use common::*;

type P = Pvrdma<Model>;

#[test]
fn safe_raw_and_flush_end_to_end() {
    fn up_ctx(m: &Model) -> Context<P> {
        Context::new(
            Pvrdma::probe(
                m.clone(),
                m,
                Config {
                    opcodes: Opcodes::All,
                    ..CONFIG
                },
            )
            .unwrap(),
        )
    }
    let model = model();
    let ctx = up_ctx(&model);
    let gid = ctx
        .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
        .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let pool = pd.buffer_pool(16, 256).unwrap();
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let a = pd
        .qp_builder(&cq, &cq)
        .caps(caps)
        .pool(&pool)
        .build::<Rc>()
        .unwrap();
    let b = pd
        .qp_builder(&cq, &cq)
        .caps(caps)
        .pool(&pool)
        .build::<Rc>()
        .unwrap();
    eprintln!("QueuePair size {}", size_of_val(&a));
    let (qa, qb) = (a.qp_num(), b.qp_num());
    fn up<'a>(qp: QueuePair<'a, P, Rc, Reset>, peer: u32, g: Gid) -> QueuePair<'a, P, Rc, Rts> {
        let qp = qp.init(&ConnectedInit::default()).unwrap();
        let qp = qp
            .rtr(&ConnectedRtr::new(peer, 0, AddressVector::new(g, 0)))
            .unwrap();
        qp.rts(&ConnectedRts::new(0)).unwrap()
    }
    let (mut a, mut b) = (up(a, qb, gid.gid()), up(b, qa, gid.gid()));
    let r = pool.alloc().unwrap();
    b.post_recv(7, r).unwrap();
    let mut s = pool.alloc().unwrap();
    s.set_len(5).unwrap();
    s.as_mut_slice().copy_from_slice(b"hello");
    a.post_send(9, s).unwrap();
    assert_eq!(pool.free_count(), 14);
    let c = b.poll_one().unwrap().unwrap();
    assert_eq!(c.wc.wr_id, 7);
    assert_eq!(c.wc.byte_len, 5);
    assert_eq!(c.buf.as_ref().unwrap().as_slice(), b"hello");
    drop(c);
    let c = a.poll_one().unwrap().unwrap();
    assert_eq!(c.wc.wr_id, 9);
    assert!(c.buf.is_some());
    drop(c);
    assert_eq!(pool.free_count(), 16);
    // raw path
    let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = mr.sge(0, 64).unwrap();
    unsafe {
        b.post_recv_raw(11, &[sge]).unwrap();
        let mut batch = a.send_batch();
        batch.send(12, SendFlags::SIGNALED, &[sge]).unwrap();
        batch.finish();
    }
    let mut wc = [WorkCompletion::default(); 8];
    let n = cq.poll(&mut wc).unwrap();
    assert_eq!(n, 2, "{wc:?}");
    // flush: post receives, go to error, they flush
    let r = pool.alloc().unwrap();
    b.post_recv(21, r).unwrap();
    unsafe { b.post_recv_raw(22, &[sge]).unwrap() };
    let b = b.to_error().unwrap();
    let n = cq.poll(&mut wc).unwrap();
    assert_eq!(n, 2, "{wc:?}");
    assert_eq!(wc[0].status, WcStatus::WrFlushErr);
    assert_eq!((wc[0].wr_id, wc[1].wr_id), (21, 22));
    assert_eq!(
        pool.free_count(),
        15,
        "the receive buffer the device took is parked"
    );
    assert_eq!(cq.poll(&mut wc).unwrap(), 0);
    drop((a, b));
    assert_eq!(pool.free_count(), 16);
    drop(mr);
    drop(pool);
    drop((cq, pd, gid));
    teardown(&model, ctx);
}
