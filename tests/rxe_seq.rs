//! PSN arithmetic and message segmentation of the software RoCE device
//! (`src/device/rxe/seq.rs`), as rxe cuts messages (`docs/roce-v2.md` §6.2).

use bareverbs::device::rxe::seq::{
    ACK_EVERY, Kind, MTUS, Segment, packets, psn_add, psn_diff, segment, segment_of, segments,
};
use bareverbs::device::rxe::wire::bth::opcode::*;
use proptest::prelude::*;

fn cut(kind: Kind, len: u32, mtu: u32) -> Vec<(u8, u32, u32, bool)> {
    segments(kind, len, mtu)
        .map(|s: Segment| (s.opcode, s.offset, s.len, s.ack_req))
        .collect()
}

#[test]
fn psns_wrap_at_24_bits_and_compare_within_half_the_space() {
    assert_eq!(psn_add(0xFF_FFFF, 1), 0);
    assert_eq!(psn_add(0xFF_FFF0, 0x20), 0x10);
    assert_eq!(psn_diff(0, 0xFF_FFFF), 1, "0 comes after 0xFFFFFF");
    assert_eq!(psn_diff(0xFF_FFFF, 0), -1);
    assert_eq!(psn_diff(0x7F_FFFF, 0), 0x7F_FFFF);
    assert_eq!(
        psn_diff(0x80_0000, 0),
        -0x80_0000,
        "half the space away: behind"
    );
    assert_eq!(psn_diff(5, 5), 0);
}

#[test]
fn messages_are_cut_as_rxe_cuts_them() {
    // rc_pingpong's 4096 bytes at MTU 1024.
    assert_eq!(
        cut(Kind::Send { imm: false }, 4096, 1024),
        [
            (RC_SEND_FIRST, 0, 1024, false),
            (RC_SEND_MIDDLE, 1024, 1024, false),
            (RC_SEND_MIDDLE, 2048, 1024, false),
            (RC_SEND_LAST, 3072, 1024, true),
        ]
    );
    assert_eq!(
        cut(Kind::Send { imm: false }, 0, 1024),
        [(RC_SEND_ONLY, 0, 0, true)]
    );
    assert_eq!(
        cut(Kind::Send { imm: true }, 1, 256),
        [(RC_SEND_ONLY_IMM, 0, 1, true)]
    );
    assert_eq!(
        cut(Kind::Write { imm: true }, 1025, 1024),
        [
            (RC_WRITE_FIRST, 0, 1024, false),
            (RC_WRITE_LAST_IMM, 1024, 1, true)
        ]
    );
    assert_eq!(
        cut(Kind::Write { imm: false }, 4096, 4096),
        [(RC_WRITE_ONLY, 0, 4096, true)]
    );
    assert_eq!(
        cut(Kind::ReadResponse, 3000, 1024),
        [
            (RC_READ_RESPONSE_FIRST, 0, 1024, false),
            (RC_READ_RESPONSE_MIDDLE, 1024, 1024, false),
            (RC_READ_RESPONSE_LAST, 2048, 952, false),
        ],
        "responses ask for no acknowledge"
    );
    assert_eq!(
        cut(Kind::ReadResponse, 0, 512),
        [(RC_READ_RESPONSE_ONLY, 0, 0, false)]
    );
    assert_eq!(
        packets(3000, 1024),
        Some(3),
        "a READ of 3000 bytes takes 3 PSNs"
    );
    assert_eq!(packets(0, 1024), Some(1));
    for bad in [0, 1, 128, 100, 1000, 1500, 8192, 1 << 31] {
        assert_eq!(packets(10, bad), None, "MTU {bad}");
        assert_eq!(segments(Kind::Send { imm: false }, 10, bad).count(), 0);
    }
}

#[test]
fn long_messages_ask_for_an_acknowledge_periodically_and_at_the_end() {
    // ib_write_bw's 64 KiB at MTU 256: 256 packets.
    let acks: Vec<u32> = segments(Kind::Write { imm: false }, 65536, 256)
        .filter(|s| s.ack_req)
        .map(|s| s.index)
        .collect();
    assert_eq!(
        acks,
        [ACK_EVERY - 1, 2 * ACK_EVERY - 1, 3 * ACK_EVERY - 1, 255]
    );
}

proptest! {
    /// Every cut covers the message exactly, in order: FIRST/MIDDLE packets a full MTU, the
    /// last 0..=MTU, one opcode family, the acknowledge request on the last request packet.
    #[test]
    fn cuts_cover_the_message_exactly(len in 0u32..40_000, m in 0usize..5, k in 0u8..5) {
        let mtu = MTUS[m];
        let kind = match k {
            0 => Kind::Send { imm: false },
            1 => Kind::Send { imm: true },
            2 => Kind::Write { imm: false },
            3 => Kind::Write { imm: true },
            _ => Kind::ReadResponse,
        };
        let segs: Vec<Segment> = segments(kind, len, mtu).collect();
        prop_assert_eq!(segs.len() as u32, packets(len, mtu).unwrap());
        let mut at = 0;
        for (i, s) in segs.iter().enumerate() {
            prop_assert_eq!(s.offset, at);
            prop_assert_eq!(s.index, i as u32);
            let last = i + 1 == segs.len();
            if last {
                prop_assert!(s.len <= mtu);
                prop_assert_eq!(s.ack_req, kind != Kind::ReadResponse);
            } else {
                prop_assert_eq!(s.len, mtu);
            }
            at += s.len;
            // One packet alone is the same packet.
            prop_assert_eq!(segment(kind, len, mtu, i as u32), Some(*s));
            // And from the count kept: the same packet.
            let n = segs.len() as u32;
            prop_assert_eq!(segment_of(kind, len, mtu, n, i as u32), Some(*s));
        }
        // A count that does not cut the message at the MTU gives no packet.
        let n = segs.len() as u32;
        prop_assert_eq!(segment_of(kind, len, mtu, n, n), None);
        prop_assert_eq!(segment_of(kind, len, mtu, 0, 0), None);
        if len > mtu {
            prop_assert_eq!(segment_of(kind, len, mtu, n - 1, n - 2), None);
        }
        prop_assert_eq!(segment_of(kind, len, mtu, n + 1, n - 1), None);
        prop_assert_eq!(at, len);
        prop_assert_eq!(segment(kind, len, mtu, segs.len() as u32), None);
        prop_assert_eq!(segment(kind, len, mtu + 1, 0), None);
    }
}
