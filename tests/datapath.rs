//! The data path on the device model: every operation and QP type moving real bytes in
//! loopback (RC pair, UD, SRQ shared by two RC QPs), with wr_ids, byte counts and immediates
//! checked, batching, and every error the issue names. Also the same traffic under QEMU's own
//! semantics (every opcode runs as SEND).

mod common;

use bareverbs::Error;
use bareverbs::device::pvrdma::Pvrdma;
use bareverbs::error::{Attr, Feature, Op, Param, Queue, Unsupported};
use bareverbs::verbs::*;
use bareverbs_model::{Model, ModelConfig, Semantics};
use common::*;

type P = Pvrdma<Model>;
type RcQp<'a> = QueuePair<'a, P, Rc, Rts, 16, 16>;
type UdQp<'a> = QueuePair<'a, P, Ud, Rts, 16, 16>;

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

fn invalid(param: Param, value: u64, max: u64) -> Error {
    Error::InvalidInput { param, value, max }
}

fn caps(wr: u32, sge: u32) -> QpCaps {
    QpCaps {
        max_send_wr: wr,
        max_recv_wr: wr,
        max_send_sge: sge,
        max_recv_sge: sge,
        max_inline_data: 0,
    }
}

/// Two RC QPs connected to each other, in RTS.
fn rc_pair<'a>(
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    gid: Gid,
    srq: Option<&'a SharedReceiveQueue<'a, P, 64>>,
) -> (RcQp<'a>, RcQp<'a>) {
    let build = || {
        let b = pd.qp_builder(cq, cq).caps(caps(16, 4));
        match srq {
            Some(s) => b.srq(s).build::<Rc, 16, 16>().unwrap(),
            None => b.build::<Rc, 16, 16>().unwrap(),
        }
    };
    let (a, b) = (build(), build());
    let (qa, qb) = (a.qp_num(), b.qp_num());
    let up = |qp: QueuePair<'a, P, Rc, Reset, 16, 16>, peer: u32| {
        let init = ConnectedInit {
            access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            ..Default::default()
        };
        let qp = qp.init(&init).map_err(|(_, e)| e).unwrap();
        let av = AddressVector::new(gid, 0);
        let qp = qp
            .rtr(&ConnectedRtr::new(peer, 0, av))
            .map_err(|(_, e)| e)
            .unwrap();
        qp.rts(&ConnectedRts::new(0)).map_err(|(_, e)| e).unwrap()
    };
    (up(a, qb), up(b, qa))
}

fn with_mr<'a>(pd: &'a ProtectionDomain<'a, P>, bytes: &[u8]) -> MemoryRegion<'a, P> {
    let mut mr = pd.register(4096, RW).unwrap();
    mr.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
    mr
}

fn poll_all(cq: &CompletionQueue<'_, P>) -> Vec<WorkCompletion> {
    let mut wc = [WorkCompletion::default(); 64];
    let n = cq.poll(&mut wc).unwrap();
    wc[..n].to_vec()
}

/// Sets up a context with a bound GID, a PD and a CQ, and runs `f`.
fn lab(
    cfg: ModelConfig,
    f: impl FnOnce(&Model, &Ctx, &ProtectionDomain<'_, P>, &CompletionQueue<'_, P>, Gid)
    + Send
    + 'static,
) {
    big_stack(move || {
        let model = Model::new(cfg);
        let ctx = up(&model);
        let g = ctx.bind_gid(0, Gid::link_local_from_mac(cfg.mac)).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256).unwrap();
        f(&model, &ctx, &pd, &cq, g.gid());
        drop(cq);
        drop(pd);
        drop(g);
        teardown(&model, ctx);
    });
}

#[test]
fn rc_send_recv_moves_bytes_and_hands_buffers_back() {
    lab(ModelConfig::default(), |model, _ctx, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
        b.post_recv(RecvRequest {
            wr_id: 7,
            mr: pd.register(4096, RW).unwrap(),
            offset: 100,
            len: 200,
        })
        .map_err(|(_, e)| e)
        .unwrap();
        let msg = b"hello, remote memory";
        a.post_send(SendRequest::send(42, with_mr(pd, msg), 0, msg.len() as u32))
            .map_err(|(_, e)| e)
            .unwrap();
        // One CQ for both: the receive completion is at its head, so b polls first (a safe
        // poll leaves other QPs' completions where they are).
        assert!(
            a.poll_one().unwrap().is_none(),
            "a does not take b's completion"
        );
        let r = b.poll_one().unwrap().expect("recv completion");
        assert_eq!(
            (r.wc.wr_id, r.wc.opcode, r.wc.byte_len),
            (7, WcOpcode::Recv, msg.len() as u32)
        );
        assert_eq!((r.wc.src_qp, r.wc.qp_num), (a.qp_num(), b.qp_num()));
        let buf = r.mr.expect("buffer back");
        assert_eq!(
            &buf.as_slice()[100..100 + msg.len()],
            msg,
            "byte for byte at the offset"
        );
        assert!(buf.as_slice()[..100].iter().all(|&x| x == 0));
        let s = a.poll_one().unwrap().expect("send completion");
        assert_eq!(
            (s.wc.wr_id, s.wc.status, s.wc.opcode),
            (42, WcStatus::Success, WcOpcode::Send)
        );
        assert_eq!(s.wc.qp_num, a.qp_num());
        assert_eq!(&s.mr.expect("buffer back").as_slice()[..msg.len()], msg);
        assert!(a.poll_one().unwrap().is_none() && b.poll_one().unwrap().is_none());
        assert_eq!(model.violations(), Vec::<String>::new());
    });
}

#[test]
fn send_with_imm_delivers_the_immediate() {
    lab(ModelConfig::default(), |_, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
        b.post_recv(RecvRequest {
            wr_id: 1,
            mr: pd.register(64, RW).unwrap(),
            offset: 0,
            len: 64,
        })
        .map_err(|(_, e)| e)
        .unwrap();
        let mut req = SendRequest::send(2, with_mr(pd, b"imm"), 0, 3);
        req.op = SendOp::SendWithImm(0xC0FF_EE00);
        a.post_send(req).map_err(|(_, e)| e).unwrap();
        let r = b.poll_one().unwrap().unwrap();
        assert_eq!((r.wc.imm, r.wc.byte_len), (0xC0FF_EE00, 3));
        assert!(r.wc.flags.contains(WcFlags::WITH_IMM));
        assert!(a.poll_one().unwrap().is_some());
    });
}

#[test]
fn rdma_write_read_and_write_with_imm() {
    lab(ModelConfig::default(), |_, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
        let target = pd.register(8192, RW).unwrap();
        let (raddr, rkey) = (target.addr(), target.rkey());
        // RDMA WRITE across a page boundary of the target.
        let src = with_mr(pd, &[0x5A; 300]);
        let mut w = SendRequest::send(1, src, 0, 300);
        w.op = SendOp::RdmaWrite {
            remote_addr: raddr + 4000,
            rkey,
        };
        a.post_send(w).map_err(|(_, e)| e).unwrap();
        let c = a.poll_one().unwrap().unwrap();
        assert_eq!(
            (c.wc.status, c.wc.opcode),
            (WcStatus::Success, WcOpcode::RdmaWrite)
        );
        assert!(target.as_slice()[4000..4300].iter().all(|&x| x == 0x5A));
        assert!(target.as_slice()[3999] == 0 && target.as_slice()[4300] == 0);
        // RDMA READ back into a fresh buffer.
        let mut r = SendRequest::send(2, pd.register(4096, RW).unwrap(), 10, 300);
        r.op = SendOp::RdmaRead {
            remote_addr: raddr + 4000,
            rkey,
        };
        a.post_send(r).map_err(|(_, e)| e).unwrap();
        let c = a.poll_one().unwrap().unwrap();
        assert_eq!((c.wc.opcode, c.wc.byte_len), (WcOpcode::RdmaRead, 300));
        let back = c.mr.unwrap();
        assert!(back.as_slice()[10..310].iter().all(|&x| x == 0x5A));
        // RDMA WRITE with immediate consumes a receive at the peer.
        b.post_recv(RecvRequest {
            wr_id: 9,
            mr: pd.register(64, RW).unwrap(),
            offset: 0,
            len: 64,
        })
        .map_err(|(_, e)| e)
        .unwrap();
        let mut wi = SendRequest::send(3, with_mr(pd, b"xyz"), 0, 3);
        wi.op = SendOp::RdmaWriteWithImm {
            remote_addr: raddr,
            rkey,
            imm: 77,
        };
        a.post_send(wi).map_err(|(_, e)| e).unwrap();
        let r = b.poll_one().unwrap().unwrap();
        assert_eq!(
            (r.wc.wr_id, r.wc.opcode, r.wc.imm, r.wc.byte_len),
            (9, WcOpcode::RecvRdmaWithImm, 77, 3)
        );
        assert_eq!(&target.as_slice()[..3], b"xyz");
        assert!(a.poll_one().unwrap().is_some());
    });
}

#[test]
fn ud_sends_carry_a_grh_and_check_the_qkey() {
    lab(ModelConfig::default(), |_, _, pd, cq, gid| {
        let ud = || {
            pd.qp_builder(cq, cq)
                .caps(caps(16, 2))
                .build::<Ud, 16, 16>()
                .unwrap()
        };
        let mut a: UdQp<'_> = ud().ready(0x1111, 0).map_err(|(_, e)| e).unwrap();
        let mut b: UdQp<'_> = ud().ready(0x2222, 0).map_err(|(_, e)| e).unwrap();
        b.post_recv(RecvRequest {
            wr_id: 5,
            mr: pd.register(4096, RW).unwrap(),
            offset: 0,
            len: 4096,
        })
        .map_err(|(_, e)| e)
        .unwrap();
        let bq = b.qp_num();
        let dest = |qkey| UdDest {
            av: AddressVector::new(gid, 0),
            remote_qpn: bq,
            remote_qkey: qkey,
        };
        // Wrong Q_Key: dropped on the wire, the sender still completes.
        let mut s = SendRequest::send(1, with_mr(pd, b"lost"), 0, 4);
        s.ud = Some(dest(0x9999));
        a.post_send(s).map_err(|(_, e)| e).unwrap();
        assert_eq!(a.poll_one().unwrap().unwrap().wc.status, WcStatus::Success);
        assert!(b.poll_one().unwrap().is_none());
        // Right Q_Key.
        let mut s = SendRequest::send(2, with_mr(pd, b"datagram"), 0, 8);
        s.ud = Some(dest(0x2222));
        a.post_send(s).map_err(|(_, e)| e).unwrap();
        let r = b.poll_one().unwrap().unwrap();
        assert_eq!(
            (r.wc.wr_id, r.wc.byte_len, r.wc.src_qp),
            (5, 40 + 8, a.qp_num())
        );
        assert!(r.wc.flags.contains(WcFlags::GRH));
        let buf = r.mr.unwrap();
        assert_eq!(buf.as_slice()[0] >> 4, 6, "an IPv6 GRH first");
        assert_eq!(&buf.as_slice()[40..48], b"datagram");
        // RDMA on UD, a UD send without a destination.
        let mut w = SendRequest::send(3, with_mr(pd, b"x"), 0, 1);
        w.op = SendOp::RdmaWrite {
            remote_addr: 0,
            rkey: 0,
        };
        let (_, e) = a.post_send(w).err().unwrap();
        assert_eq!(
            e,
            Error::Unsupported(Unsupported::Feature(Feature::OpcodeForQpType))
        );
        let (_, e) = a
            .post_send(SendRequest::send(4, with_mr(pd, b"x"), 0, 1))
            .err()
            .unwrap();
        assert_eq!(
            e,
            Error::MissingAttribute {
                op: Op::PostSend,
                attr: Attr::UdDest
            }
        );
        assert!(a.poll_one().unwrap().is_some());
    });
}

#[test]
fn an_srq_feeds_two_rc_qps() {
    lab(ModelConfig::default(), |_, _, pd, cq, gid| {
        let srq = pd
            .create_srq::<64>(SrqAttr {
                max_wr: 64,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let (mut a, mut b) = rc_pair(pd, cq, gid, Some(&srq));
        let bufs: Vec<_> = (0..4).map(|_| pd.register(4096, RW).unwrap()).collect();
        let sges: Vec<_> = bufs.iter().map(|m| m.sge(0, 64).unwrap()).collect();
        let wrs: Vec<_> = (0..4)
            .map(|i| RecvWr {
                wr_id: 100 + i as u64,
                sg_list: &sges[i..=i],
            })
            .collect();
        // SAFETY: the buffers live until the end of the test, after their completions, and are
        // only read after those.
        unsafe { srq.post_recv_raw(&wrs).unwrap() };
        for (qp, text) in [(&mut a, &b"from a"[..]), (&mut b, &b"from b"[..])] {
            qp.post_send(SendRequest::send(
                1,
                with_mr(pd, text),
                0,
                text.len() as u32,
            ))
            .map_err(|(_, e)| e)
            .unwrap();
        }
        let wcs = poll_all(cq);
        let recvs: Vec<_> = wcs.iter().filter(|w| w.opcode == WcOpcode::Recv).collect();
        assert_eq!(recvs.len(), 2);
        assert_eq!(
            (recvs[0].wr_id, recvs[0].qp_num, recvs[0].src_qp),
            (100, b.qp_num(), a.qp_num())
        );
        assert_eq!(
            (recvs[1].wr_id, recvs[1].qp_num, recvs[1].src_qp),
            (101, a.qp_num(), b.qp_num())
        );
        assert_eq!(&bufs[0].as_slice()[..6], b"from a");
        assert_eq!(&bufs[1].as_slice()[..6], b"from b");
        // The send completions were taken by the raw poll: their buffers stay in the QPs until
        // the QPs are destroyed (safe, just not handed back).
        drop((a, b));
        srq.destroy().map_err(|(_, e)| e).unwrap();
    });
}

#[test]
fn a_batch_is_one_doorbell_and_a_full_queue_posts_nothing() {
    lab(ModelConfig::default(), |model, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
        let rbuf = pd.register(16 * 64, RW).unwrap();
        let rsges: Vec<_> = (0..16).map(|i| rbuf.sge(i * 64, 64).unwrap()).collect();
        let rwrs: Vec<_> = (0..16)
            .map(|i| RecvWr {
                wr_id: 1000 + i as u64,
                sg_list: &rsges[i..=i],
            })
            .collect();
        let sbuf = with_mr(pd, &(0..=255u8).collect::<Vec<_>>());
        let ssges: Vec<_> = (0..17).map(|i| sbuf.sge(i, 16).unwrap()).collect();
        let swrs: Vec<_> = (0..17)
            .map(|i| SendWr {
                wr_id: i as u64,
                sg_list: &ssges[i..=i],
                op: SendOp::Send,
                flags: SendFlags::empty(),
                ud: None,
            })
            .collect();
        let (doorbells, _, _) = model.counters();
        // SAFETY: the buffers outlive the completions polled below and are not written.
        unsafe {
            b.post_recv_raw(&rwrs).unwrap();
            assert_eq!(
                a.post_send_raw(&swrs).err(),
                Some(Error::QueueFull {
                    queue: Queue::Send,
                    free: 16
                })
            );
            assert_eq!(
                model.counters().0,
                doorbells + 1,
                "the full batch rang nothing"
            );
            a.post_send_raw(&swrs[..16]).unwrap();
        }
        assert_eq!(model.counters().0, doorbells + 2, "16 WRs, one doorbell");
        let wcs = poll_all(cq);
        let sends: Vec<_> = wcs
            .iter()
            .filter(|w| w.opcode == WcOpcode::Send)
            .map(|w| w.wr_id)
            .collect();
        let recvs: Vec<_> = wcs
            .iter()
            .filter(|w| w.opcode == WcOpcode::Recv)
            .map(|w| (w.wr_id, w.byte_len))
            .collect();
        assert_eq!(sends, (0..16).collect::<Vec<_>>());
        assert_eq!(recvs, (0..16).map(|i| (1000 + i, 16)).collect::<Vec<_>>());
        for i in 0..16 {
            let want: Vec<u8> = (i as u8..i as u8 + 16).collect();
            assert_eq!(&rbuf.as_slice()[i * 64..i * 64 + 16], &want[..]);
        }
        // The ring is free again: the same 16 post once more.
        // SAFETY: as above; nothing is received, the completions are polled.
        unsafe { a.post_send_raw(&swrs[..16]).unwrap() };
        let wcs = poll_all(cq);
        assert_eq!(
            wcs.iter()
                .filter(|w| w.status == WcStatus::RnrRetryExcErr)
                .count(),
            16,
            "no receives posted: RNR"
        );
    });
}

#[test]
fn posting_errors_are_typed_and_lose_nothing() {
    lab(ModelConfig::default(), |model, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
        let buf = pd.register(4096, RW).unwrap();
        let sges: Vec<_> = (0..5).map(|i| buf.sge(i * 8, 8).unwrap()).collect();
        let send = |wr_id, n: usize| SendWr {
            wr_id,
            sg_list: &sges[..n],
            op: SendOp::Send,
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        let doorbells = model.counters().0;
        // SAFETY: nothing in this block is posted successfully except where polled below.
        unsafe {
            assert_eq!(
                a.post_send_raw(&[send(1, 5)]).err(),
                Some(invalid(Param::NumSge, 5, 4))
            );
            assert_eq!(
                b.post_recv_raw(&[RecvWr {
                    wr_id: 1,
                    sg_list: &sges[..5]
                }])
                .err(),
                Some(invalid(Param::NumSge, 5, 4)),
                "case 8: max_recv_sge + 1 SGEs"
            );
            assert_eq!(
                a.post_send_raw(&[send(1 << 63, 1)]).err(),
                Some(invalid(Param::WrId, 1 << 63, (1 << 63) - 1))
            );
            let mut inline = send(1, 1);
            inline.flags |= SendFlags::INLINE;
            assert_eq!(
                a.post_send_raw(&[inline]).err(),
                Some(Error::Unsupported(Unsupported::Feature(
                    Feature::InlineData
                )))
            );
            let mut atomic = send(1, 1);
            atomic.op = SendOp::AtomicFetchAdd {
                remote_addr: buf.addr(),
                rkey: buf.rkey(),
                add: 1,
            };
            assert_eq!(
                a.post_send_raw(&[atomic]).err(),
                Some(Error::Unsupported(Unsupported::Feature(Feature::Atomics)))
            );
            // Case 8: the receive queue takes its queried max_recv_wr and not one more.
            let max = b.caps().max_recv_wr as usize;
            let recvs: Vec<_> = (0..=max)
                .map(|i| RecvWr {
                    wr_id: i as u64,
                    sg_list: &sges[..1],
                })
                .collect();
            assert_eq!(
                b.post_recv_raw(&recvs).err(),
                Some(Error::QueueFull {
                    queue: Queue::Recv,
                    free: max as u32
                })
            );
        }
        assert_eq!(
            model.counters().0,
            doorbells,
            "no refused post reached the device"
        );
        // A bad lkey and a bad rkey complete with typed error statuses.
        let bad_lkey = Sge {
            lkey: 0xDEAD,
            ..buf.sge(0, 8).unwrap()
        };
        let mut bad_rkey = send(2, 1);
        bad_rkey.op = SendOp::RdmaWrite {
            remote_addr: buf.addr(),
            rkey: 0xBAD,
        };
        // SAFETY: the buffer outlives the completions polled right after.
        unsafe {
            a.post_send_raw(&[
                SendWr {
                    wr_id: 3,
                    sg_list: &[bad_lkey],
                    op: SendOp::Send,
                    flags: SendFlags::SIGNALED,
                    ud: None,
                },
                bad_rkey,
            ])
            .unwrap();
        }
        let wcs = poll_all(cq);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(3, WcStatus::LocProtErr), (2, WcStatus::RemAccessErr)]
        );
        // A receive too small for the message.
        b.post_recv(RecvRequest {
            wr_id: 4,
            mr: pd.register(64, RW).unwrap(),
            offset: 0,
            len: 4,
        })
        .map_err(|(_, e)| e)
        .unwrap();
        a.post_send(SendRequest::send(5, with_mr(pd, b"too long"), 0, 8))
            .map_err(|(_, e)| e)
            .unwrap();
        let r = b.poll_one().unwrap().unwrap();
        assert_eq!((r.wc.wr_id, r.wc.status), (4, WcStatus::LocLenErr));
        assert!(
            r.mr.is_some(),
            "the buffer comes back with an error completion too"
        );
        assert_eq!(
            a.poll_one().unwrap().unwrap().wc.status,
            WcStatus::RemInvReqErr
        );
        // A safe post into a full queue hands the request back, buffer and all.
        let mut held = Vec::new();
        for i in 0..16 {
            held.push(
                b.post_recv(RecvRequest {
                    wr_id: i,
                    mr: pd.register(64, RW).unwrap(),
                    offset: 0,
                    len: 64,
                })
                .is_ok(),
            );
        }
        assert!(held.iter().all(|&ok| ok));
        let (back, e) = b
            .post_recv(RecvRequest {
                wr_id: 99,
                mr: with_mr(pd, b"mine"),
                offset: 0,
                len: 64,
            })
            .err()
            .unwrap();
        assert_eq!(
            e,
            Error::QueueFull {
                queue: Queue::Recv,
                free: 0
            }
        );
        assert_eq!((back.wr_id, &back.mr.as_slice()[..4]), (99, &b"mine"[..]));
    });
}

#[test]
fn a_cq_that_would_overflow_is_refused_at_post() {
    lab(ModelConfig::default(), |model, ctx, pd, _cq, gid| {
        let small = ctx.create_cq(4).unwrap();
        let qp = pd
            .qp_builder(&small, &small)
            .caps(caps(8, 1))
            .build::<Ud, 16, 16>()
            .unwrap();
        let mut qp = qp.ready(1, 0).map_err(|(_, e)| e).unwrap();
        let buf = pd.register(4096, RW).unwrap();
        let sge = [buf.sge(0, 8).unwrap()];
        let ud = Some(UdDest {
            av: AddressVector::new(gid, 0),
            remote_qpn: 0xFFFF,
            remote_qkey: 1,
        });
        let wr = |i| SendWr {
            wr_id: i,
            sg_list: &sge,
            op: SendOp::Send,
            flags: SendFlags::empty(),
            ud,
        };
        // SAFETY: the buffer outlives the completions polled below.
        unsafe {
            qp.post_send_raw(&[wr(0), wr(1), wr(2)]).unwrap();
            assert_eq!(
                qp.post_send_raw(&[wr(3), wr(4)]).err(),
                Some(Error::QueueFull {
                    queue: Queue::Cq,
                    free: 1
                })
            );
            qp.post_send_raw(&[wr(3)]).unwrap();
        }
        let mut wc = [WorkCompletion::default(); 8];
        assert_eq!(
            small.poll(&mut wc).unwrap(),
            4,
            "every send completes on PVRDMA, even unsignaled"
        );
        assert!(
            model.violations().is_empty(),
            "the device never had to drop a CQE"
        );
        drop(qp);
        drop(buf);
        drop(small);
    });
}

#[test]
fn garbage_in_the_cq_is_an_error_not_an_index() {
    lab(ModelConfig::default(), |model, _, pd, cq, gid| {
        let (mut a, _b) = rc_pair(pd, cq, gid, None);
        let h = cq.raw().handle();
        let mut wc = [WorkCompletion::default(); 4];
        // An opcode outside the ABI: reported, and consumed so that the CQ goes on.
        let mut bad = [0u8; 64];
        bad[0x10] = 77;
        model.inject_raw_cqe(h, bad);
        assert!(matches!(
            cq.poll(&mut wc),
            Err(Error::Protocol { op: Op::PollCq, .. })
        ));
        assert_eq!(cq.poll(&mut wc), Ok(0));
        // A status outside the ABI, behind a good completion: the good one first, then the
        // error.
        model.inject_cqe(h, a.raw().handle(), 5);
        let mut bad = [0u8; 64];
        bad[0x14] = 200;
        model.inject_raw_cqe(h, bad);
        assert_eq!(cq.poll(&mut wc), Ok(1));
        assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::Success));
        assert!(matches!(cq.poll(&mut wc), Err(Error::Protocol { .. })));
        // A safe-path completion for `a` naming a slot that does not exist: an error, not an
        // index into a's storage.
        let mut forged = [0u8; 64];
        forged[0..8].copy_from_slice(&((1u64 << 63) | 9999).to_le_bytes());
        forged[8..12].copy_from_slice(&a.raw().handle().to_le_bytes());
        model.inject_raw_cqe(h, forged);
        assert!(matches!(
            a.poll_one(),
            Err(Error::Protocol { op: Op::PollCq, .. })
        ));
        // One naming a slot in range that holds nothing.
        forged[0..8].copy_from_slice(&((1u64 << 63) | 3).to_le_bytes());
        model.inject_raw_cqe(h, forged);
        assert!(matches!(a.poll_one(), Err(Error::Protocol { .. })));
        assert!(a.poll_one().unwrap().is_none());
        // A producer index outside the ring.
        model.set_cq_prod(h, 0xFFFF_0000);
        assert!(matches!(
            cq.poll(&mut wc),
            Err(Error::Protocol { op: Op::PollCq, .. })
        ));
        model.set_cq_prod(h, 5); // back where it was: five CQEs were injected
        assert_eq!(cq.poll(&mut wc), Ok(0));
    });
}

#[test]
fn arming_raises_one_interrupt_per_arm() {
    lab(ModelConfig::default(), |model, _, pd, cq, gid| {
        let (mut a, _b) = rc_pair(pd, cq, gid, None);
        cq.arm(false);
        for i in 0..2 {
            let mut w = SendRequest::send(i, with_mr(pd, b"x"), 0, 1);
            w.op = SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: 0,
            }; // fails remotely, still completes
            a.post_send(w).map_err(|(_, e)| e).unwrap();
        }
        assert_eq!(model.counters().2, 1, "armed once, one interrupt");
        while a.poll_one().unwrap().is_some() {}
    });
}

#[test]
fn qemu_semantics_run_every_opcode_as_send() {
    let cfg = ModelConfig {
        semantics: Semantics::Qemu,
        ..Default::default()
    };
    lab(cfg, |model, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None);
        let target = pd.register(4096, RW).unwrap();
        assert_eq!(target.rkey(), 0xFFFF_FFFF, "QEMU's rkey");
        b.post_recv(RecvRequest {
            wr_id: 1,
            mr: pd.register(64, RW).unwrap(),
            offset: 0,
            len: 64,
        })
        .map_err(|(_, e)| e)
        .unwrap();
        let mut w = SendRequest::send(2, with_mr(pd, b"as a send"), 0, 9);
        w.op = SendOp::RdmaWriteWithImm {
            remote_addr: target.addr(),
            rkey: target.rkey(),
            imm: 5,
        };
        a.post_send(w).map_err(|(_, e)| e).unwrap();
        let r = b.poll_one().unwrap().unwrap();
        assert_eq!(
            (r.wc.opcode, r.wc.imm, r.wc.byte_len),
            (WcOpcode::Recv, 0, 9),
            "no immediate on QEMU"
        );
        assert_eq!(&r.mr.unwrap().as_slice()[..9], b"as a send");
        let s = a.poll_one().unwrap().unwrap();
        assert_eq!(
            (s.wc.opcode, s.wc.status),
            (WcOpcode::Send, WcStatus::Success)
        );
        assert!(
            target.as_slice()[..9].iter().all(|&x| x == 0),
            "nothing was RDMA-written"
        );
        assert!(model.violations().is_empty());
    });
}

#[test]
fn dropping_a_qp_with_posted_buffers_returns_every_page() {
    lab(ModelConfig::default(), |model, _, pd, cq, gid| {
        let before = model.outstanding_pages();
        {
            let (_a, mut b) = rc_pair(pd, cq, gid, None);
            for i in 0..8 {
                b.post_recv(RecvRequest {
                    wr_id: i,
                    mr: pd.register(4096, RW).unwrap(),
                    offset: 0,
                    len: 64,
                })
                .map_err(|(_, e)| e)
                .unwrap();
            }
            assert_eq!(model.objects().mrs, 8);
        }
        assert_eq!(model.objects().mrs, 0, "the held buffers went after the QP");
        assert_eq!(model.outstanding_pages(), before);
    });
}
