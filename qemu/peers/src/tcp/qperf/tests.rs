//! The wire format's unit tests: qperf 0.4.11's bytes, field by field.

use super::*;

fn request(index: u16) -> Request {
    Request {
        version: (0, 4, 11),
        index,
        access_recv: 0,
        affinity: 0,
        alt_port: 0,
        flip: 0,
        msg_size: 65536,
        mtu_size: 0,
        no_msgs: 0,
        poll_mode: 0,
        port: 0,
        rd_atomic: 0,
        sl: 0,
        sock_buf_size: 0,
        src_path_bits: 0,
        time: 2,
        timeout: 20,
        use_cm: 1,
        id: [0; 64],
        static_rate: [0; 64],
    }
}

#[test]
fn request_bytes_are_little_endian_in_qperfs_order() {
    let b = request(13).encode();
    assert_eq!(&b[..8], &[0, 0, 4, 0, 11, 0, 13, 0]);
    // msg_size is the fifth u32 after the four u16s; time the 14th, timeout, use_cm.
    assert_eq!(&b[8 + 4 * 4..8 + 4 * 5], &65536u32.to_le_bytes());
    assert_eq!(&b[8 + 4 * 13..8 + 4 * 14], &2u32.to_le_bytes());
    assert_eq!(&b[8 + 4 * 14..8 + 4 * 15], &20u32.to_le_bytes());
    assert_eq!(&b[8 + 4 * 15..8 + 4 * 16], &1u32.to_le_bytes());
    assert_eq!(Request::decode(&b), request(13));
    assert_eq!(request(13).test(), Ok(Test::RcBw));
}

#[test]
fn the_table_names_each_test_the_peer_runs() {
    for (i, want) in [
        (1, Test::Quit),
        (13, Test::RcBw),
        (16, Test::RcLat),
        (17, Test::RcRdmaReadBw),
        (19, Test::RcRdmaWriteBw),
        (12, Test::RcBiBw),
        (14, Test::RcCompareSwapMr),
        (15, Test::RcFetchAddMr),
        (18, Test::RcRdmaReadLat),
        (20, Test::RcRdmaWriteLat),
        (21, Test::RcRdmaWritePollLat),
    ] {
        assert_eq!(request(i).test(), Ok(want));
        assert_eq!(TESTS[usize::from(i)], want.name());
        assert_eq!(Test::from_name(want.name()), Some(want));
        // What the peer's client sends without -m: qperf's client's default size.
        let mine = Request::new(want, want.default_size(), 2, 5);
        assert_eq!((mine.index, mine.test()), (i, Ok(want)));
    }
}

#[test]
fn the_atomics_request_carries_no_size_the_others_need_one() {
    for (i, size, ok) in [
        (14, 0, true),
        (15, 0, true),
        (15, 8, true),
        (12, 0, false),
        (18, 0, false),
        (21, 0, false),
        (15, MAX_MSG + 1, false),
    ] {
        let mut r = request(i);
        r.msg_size = size;
        assert_eq!(r.test().is_ok(), ok, "{} -m {size}", TESTS[usize::from(i)]);
    }
    assert_eq!(Test::RcFetchAddMr.default_size(), 0);
    assert_eq!(Test::RcBiBw.default_size(), 65536);
    assert_eq!(Test::RcRdmaWritePollLat.default_size(), 1);
    assert!(Test::RcCompareSwapMr.atomic() && !Test::RcRdmaReadLat.atomic());
}

#[test]
fn requests_the_peer_does_not_run_are_refused_by_kind() {
    let mut r = request(13);
    r.version = (0, 5, 0);
    assert_eq!(r.test(), Err(Error::Version(0, 5, 0)));
    assert_eq!(request(29).test(), Err(Error::Unsupported("ud_bw")));
    assert_eq!(request(22).test(), Err(Error::Unsupported("uc_bi_bw")));
    assert_eq!(
        request(32).test(),
        Err(Error::Unsupported("ver_rc_fetch_add"))
    );
    assert_eq!(request(8).test(), Err(Error::Unsupported("tcp_bw")));
    assert_eq!(request(33).test(), Err(Error::Index(33)));
    assert_eq!(request(u16::MAX).test(), Err(Error::Index(u16::MAX)));
    let mut r = request(13);
    r.use_cm = 0;
    assert_eq!(r.test(), Err(Error::NoCm));
    let mut r = request(13);
    r.flip = 1;
    assert_eq!(r.test(), Err(Error::Option("-f (flip)")));
    for size in [0, MAX_MSG + 1, u32::MAX] {
        let mut r = request(13);
        r.msg_size = size;
        assert_eq!(r.test(), Err(Error::Option("-m (message size)")));
    }
    for time in [0, MAX_TIME_S + 1] {
        let mut r = request(16);
        r.time = time;
        assert_eq!(r.test(), Err(Error::Option("-t (seconds)")));
    }
    // -n: counted rc_bw runs (any time), the other tests are refused.
    let mut r = request(13);
    (r.no_msgs, r.time) = (100, 0);
    assert_eq!(r.test(), Ok(Test::RcBw));
    for i in [19, 12] {
        let mut r = request(i);
        r.no_msgs = 100;
        assert!(matches!(r.test(), Err(Error::Option(_))));
    }
    // quit needs nothing else.
    let mut q = request(1);
    (q.use_cm, q.msg_size, q.time) = (0, 0, 0);
    assert_eq!(q.test(), Ok(Test::Quit));
}

#[test]
fn node_round_trip_with_its_padding() {
    let n = Node {
        vaddr: 0x0102_0304_0506_0708,
        lid: 0,
        qpn: 0x11,
        psn: 0x22,
        srqn: 0,
        rkey: 0xAABB_CCDD,
        alt_lid: 0,
        rd_atomic: 128,
    };
    let b = n.encode();
    assert_eq!(&b[..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
    // LID, QPN, PSN, SRQN, then the R_Key at 24.
    assert_eq!(&b[12..16], &[0x11, 0, 0, 0]);
    assert_eq!(&b[24..28], &[0xDD, 0xCC, 0xBB, 0xAA]);
    assert_eq!(&b[32..36], &[128, 0, 0, 0]);
    assert_eq!(&b[36..], &[0; 4]);
    let mut padded = b;
    padded[36..].copy_from_slice(&[0xFF; 4]);
    assert_eq!(Node::decode(&padded), n);
}

#[test]
fn stat_layout() {
    let s = Stat {
        max_cqes: 3,
        elapsed_ms: 2_000,
        sent: Counts {
            bytes: 5,
            msgs: 6,
            errs: 0,
        },
        received: Counts {
            bytes: 65536 * 7,
            msgs: 7,
            errs: 0,
        },
    };
    let b = s.encode();
    assert_eq!(&b[..12], &[1, 0, 0, 0, 100, 0, 0, 0, 3, 0, 0, 0]);
    // time_s all zero, time_e[real] 200 ticks, the other end times zero.
    assert!(b[12..84].iter().all(|&x| x == 0));
    assert_eq!(&b[84..92], &200u64.to_le_bytes());
    assert!(b[92..156].iter().all(|&x| x == 0));
    assert_eq!(&b[156..164], &5u64.to_le_bytes());
    assert_eq!(&b[164..172], &6u64.to_le_bytes());
    assert_eq!(&b[180..188], &(65536u64 * 7).to_le_bytes());
    assert_eq!(&b[188..196], &7u64.to_le_bytes());
    // Remote counts and padding zero.
    assert!(b[204..].iter().all(|&x| x == 0));
}
