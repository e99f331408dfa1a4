//! QP1 on the software RoCE device: a GSI queue pair numbered 1, datagrams over UDP 4791 with
//! Q_Key 0x80010000 and P_Key 0xFFFF from source QP 1, as Linux's rdma_rxe sends and takes
//! management datagrams; one per device; a datagram to QP1 with another Q_Key is dropped.

use bareverbs::Context;
use bareverbs::device::rxe::{Config, GSI_QKEY, Rxe};
use bareverbs::error::{Object, Resource};
use bareverbs::verbs::*;
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};

type R = Rxe<Model, MemLink, TestClock>;

const IP_A: [u8; 4] = [10, 0, 0, 2];
const IP_B: [u8; 4] = [10, 0, 0, 3];

fn lab() -> (Model, Segment, TestClock, Context<R>, Context<R>) {
    let model = Model::new(ModelConfig::default());
    let seg = Segment::new();
    let clk = TestClock::default();
    let la = seg.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    let lb = seg.attach([0x52, 0x54, 0, 0, 0, 3], 1514);
    let a = Context::new(Rxe::new(model.clone(), la, clk.clone(), Config { ip: IP_A }).unwrap());
    let b = Context::new(Rxe::new(model.clone(), lb, clk.clone(), Config { ip: IP_B }).unwrap());
    (model, seg, clk, a, b)
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

#[test]
fn a_mad_goes_from_qp1_to_qp1_with_the_gsi_keys_and_another_qkey_is_dropped() {
    let (model, seg, clk, a, b) = lab();
    {
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (a.create_cq(32).unwrap(), b.create_cq(32).unwrap());
        let qa = pa.qp_builder(&ca, &ca).caps(caps()).build::<Gsi>().unwrap();
        let qb = pb.qp_builder(&cb, &cb).caps(caps()).build::<Gsi>().unwrap();
        assert_eq!((qa.qp_num(), qb.qp_num()), (1, 1));
        // The Q_Key given at INIT does not matter: QP1 always uses 0x80010000.
        let mut qa = qa.ready(0x1234, 0).unwrap();
        let mut qb = qb.ready(GSI_QKEY, 0).unwrap();
        // A UD QP on A too, to send a datagram with the wrong Q_Key to B's QP1.
        let ud = pa.qp_builder(&ca, &ca).caps(caps()).build::<Ud>().unwrap();
        let mut ud = ud.ready(0x5555, 0).unwrap();
        let mut ma = pa.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mb = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mad: Vec<u8> = (0..256u32).map(|i| (i * 3 + 5) as u8).collect();
        ma.as_mut_slice()[..256].copy_from_slice(&mad);
        let ah = pa
            .create_ah(&AddressVector::new(Gid::from_ipv4(IP_B), 1))
            .unwrap();
        // SAFETY: the regions stay registered and untouched until the completions.
        unsafe {
            let mut r = qb.recv_batch();
            r.recv(10, &[mb.sge(0, 296).unwrap()]).unwrap();
            r.recv(11, &[mb.sge(512, 296).unwrap()]).unwrap();
            r.finish();
            let mut s = ud.send_batch();
            s.send_to(
                1,
                SendFlags::SIGNALED,
                (&ah, 1, 0x8001_0001),
                &[ma.sge(0, 256).unwrap()],
            )
            .unwrap();
            s.finish();
            let mut s = qa.send_batch();
            // The work request names another Q_Key; QP1 sends with its own.
            s.send_to(
                2,
                SendFlags::SIGNALED,
                (&ah, 1, 0x0000_0001),
                &[ma.sge(0, 256).unwrap()],
            )
            .unwrap();
            s.finish();
        }
        let mut wb = Vec::new();
        let mut wa = Vec::new();
        let mut wc = [WorkCompletion::default(); 4];
        for _ in 0..2000 {
            clk.advance(100);
            a.process_events();
            b.process_events();
            let n = ca.poll(&mut wc).unwrap();
            wa.extend_from_slice(&wc[..n]);
            let n = cb.poll(&mut wc).unwrap();
            wb.extend_from_slice(&wc[..n]);
        }
        assert_eq!(wa.len(), 2, "{wa:?}");
        assert!(wa.iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(wb.len(), 1, "only the datagram with QP1's Q_Key: {wb:?}");
        let r = wb[0];
        assert_eq!(
            (r.wr_id, r.status, r.byte_len, r.src_qp),
            (10, WcStatus::Success, 296, 1)
        );
        assert_eq!(&mb.as_slice()[40..296], &mad[..]);
        assert_eq!(&mb.as_slice()[32..36], &IP_A);
        // On the wire: UDP 4791 from 0xD872, BTH opcode UD SEND_ONLY, P_Key 0xFFFF, DestQP 1,
        // DETH Q_Key 0x80010000 and source QP 1.
        let frames: Vec<Vec<u8>> = seg
            .sent()
            .into_iter()
            .filter(|(from, f)| *from == 0 && f.len() > 42 && f[12..14] == [8, 0] && f[23] == 17)
            .map(|(_, f)| f)
            .collect();
        let gsi = frames
            .iter()
            .find(|f| f[42 + 4..42 + 8] == [0, 0, 0, 1] && f[42 + 12..42 + 16] == [0x80, 1, 0, 0])
            .expect("QP1's frame");
        let udp = &gsi[34..42];
        assert_eq!(&udp[..4], &[0xD8, 0x72, 0x12, 0xB7]);
        let bth = &gsi[42..54];
        assert_eq!(bth[0], 0x64);
        assert_eq!(&bth[2..4], &[0xFF, 0xFF]);
        let deth = &gsi[54..62];
        assert_eq!(deth, &[0x80, 0x01, 0, 0, 0, 0, 0, 1]);
        assert_eq!(&gsi[62..62 + 256], &mad[..]);
        drop((qa, qb, ud));
    }
    drop((a, b));
    assert_eq!(model.outstanding_pages(), 0);
}

#[test]
fn a_device_has_one_gsi_qp_and_its_number_comes_back_when_destroyed() {
    let (_model, _seg, _clk, a, _b) = lab();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(64).unwrap();
    let g = pd.qp_builder(&cq, &cq).caps(caps()).build::<Gsi>().unwrap();
    let again = pd.qp_builder(&cq, &cq).caps(caps()).build::<Gsi>();
    assert_eq!(
        again.err(),
        Some(bareverbs::Error::Resource(Resource::Objects {
            object: Object::Qp,
            limit: 1
        }))
    );
    // Other QPs are numbered as before.
    let rc = pd.qp_builder(&cq, &cq).caps(caps()).build::<Rc>().unwrap();
    assert_eq!(rc.qp_num(), 16);
    drop(g);
    let g = pd.qp_builder(&cq, &cq).caps(caps()).build::<Gsi>().unwrap();
    assert_eq!(g.qp_num(), 1);
}
