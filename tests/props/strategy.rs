//! The generators: scatter/gather counts, send and receive items, steps and whole cases.

use super::*;

pub(crate) fn sges() -> impl Strategy<Value = u8> {
    prop_oneof![6 => 1u8..=2, 1 => Just(0u8), 1 => Just(3u8)]
}

pub(crate) fn send_item() -> impl Strategy<Value = SendItem> {
    let kind = prop_oneof![
        4 => Just(Kind::Send),
        1 => Just(Kind::SendImm),
        1 => Just(Kind::Write),
        1 => Just(Kind::WriteImm),
        1 => Just(Kind::Read),
    ];
    let len = prop_oneof![3 => 0u16..=16, 3 => 0u16..=256, 1 => 200u16..=320];
    let remote = prop_oneof![
        6 => Just(Remote::Good),
        1 => Just(Remote::BadKey),
        1 => Just(Remote::OutOfRange),
    ];
    let to = prop_oneof![
        3 => Just(UdTo::U0),
        3 => Just(UdTo::U1),
        1 => Just(UdTo::Rc0),
        1 => Just(UdTo::Nowhere),
    ];
    let qkey = prop_oneof![4 => Just(Qkey::Right), 1 => Just(Qkey::Wrong), 2 => Just(Qkey::Own)];
    (
        kind,
        len,
        sges(),
        prop::bool::weighted(0.1),
        remote,
        any::<u16>(),
        to,
        qkey,
        any::<u32>(),
        0u8..8,
    )
        .prop_map(
            |(kind, len, sges, bad_lkey, remote, off, to, qkey, imm, flags)| SendItem {
                kind,
                len,
                sges,
                bad_lkey,
                remote,
                off,
                to,
                qkey,
                imm,
                flags,
            },
        )
}

pub(crate) fn recv_item() -> impl Strategy<Value = RecvItem> {
    let room = prop_oneof![2 => 0u16..=64, 3 => 0u16..=320, 3 => Just(320u16)];
    (room, sges(), prop::bool::weighted(0.1)).prop_map(|(room, sges, bad_lkey)| RecvItem {
        room,
        sges,
        bad_lkey,
    })
}

/// A QP for a safe-path step: mostly one built with the pool.
pub(crate) fn safe_qp() -> impl Strategy<Value = usize> {
    prop_oneof![4 => prop::sample::select(vec![0usize, 1, 4, 6]), 1 => 0..N_QP]
}

pub(crate) fn step() -> impl Strategy<Value = Step> {
    let qp = 0..N_QP;
    let cq = 0..N_CQ;
    let to = prop_oneof![
        Just(UdTo::U0),
        Just(UdTo::U1),
        Just(UdTo::Rc0),
        Just(UdTo::Nowhere)
    ];
    let qkey = prop_oneof![4 => Just(Qkey::Right), 1 => Just(Qkey::Wrong), 1 => Just(Qkey::Own)];
    prop_oneof![
        8 => (qp.clone(), prop::collection::vec(send_item(), 1..=4), prop::bool::weighted(0.85))
            .prop_map(|(qp, items, finish)| Step::RawSend { qp, items, finish }),
        8 => (qp.clone(), prop::collection::vec(recv_item(), 1..=4), prop::bool::weighted(0.85), any::<bool>())
            .prop_map(|(qp, items, finish, single)| Step::RawRecv { qp, items, finish, single }),
        6 => (safe_qp(), 0u16..=256, to, qkey, any::<bool>(), prop::bool::weighted(0.05))
            .prop_map(|(qp, len, to, qkey, reuse, no_dest)| Step::SafeSend { qp, len, to, qkey, reuse, no_dest }),
        7 => (safe_qp(), any::<bool>()).prop_map(|(qp, reuse)| Step::SafeRecv { qp, reuse }),
        4 => prop::collection::vec(recv_item(), 0..=3).prop_map(|items| Step::SrqRecv { items }),
        8 => (qp.clone(), 1u8..=4, any::<bool>()).prop_map(|(qp, max, keep)| Step::PollQp { qp, max, keep }),
        6 => (cq.clone(), 1u8..=8).prop_map(|(cq, n)| Step::PollCq { cq, n }),
        4 => (cq, 1u8..=4).prop_map(|(cq, max)| Step::Cursor { cq, max }),
        1 => Just(Step::Drain),
        1 => qp.clone().prop_map(|qp| Step::ToError { qp }),
        1 => qp.clone().prop_map(|qp| Step::Reset { qp }),
        1 => qp.clone().prop_map(|qp| Step::Destroy { qp }),
        1 => qp.clone().prop_map(|qp| Step::Reinit { qp }),
        1 => Just(Step::Hold),
        1 => any::<u8>().prop_map(|i| Step::Release { i }),
        1 => (qp, any::<bool>()).prop_map(|(qp, send)| Step::Foreign { qp, send }),
    ]
}

pub(crate) fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec((1u32..=6, 1u32..=6), N_QP),
        prop::collection::vec(any::<bool>(), N_QP),
        1u32..=8,
        prop::collection::vec(step(), 1..=MAX_STEPS),
    )
        .prop_map(|(caps, sig_all, srq_wr, steps)| Case {
            caps,
            sig_all,
            srq_wr,
            steps,
        })
}
