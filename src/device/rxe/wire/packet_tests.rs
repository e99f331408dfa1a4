//! Tests of `packet.rs`: the frames built at fixed offsets against the general build.

use super::*;
use crate::device::rxe::wire::bth::opcode;

/// The acknowledgement built at fixed offsets is the frame the general path builds from the
/// same headers, byte for byte, and parses back as the same headers.
#[test]
fn ack_equals_the_general_build() {
    let route = Route {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        src_ip: [10, 0, 0, 1],
        dst_ip: [10, 0, 0, 2],
        tos: 0x12,
        ttl: 63,
        src_port: 0xC123,
    };
    for (i, (syn, msn, psn)) in [(0x1F, 0, 0), (0x60, 0xFF_FFFF, 0xAB_CDEF), (0x21, 7, 1)]
        .into_iter()
        .enumerate()
    {
        let bth = Bth {
            opcode: opcode::RC_ACK,
            se: false,
            pad: 0,
            pkey: 0xFFFF,
            dest_qp: 0x12_3456 + i as u32,
            ack_req: false,
            psn,
        };
        let aeth = Aeth { syndrome: syn, msn };
        let mut h = Headers::new(bth);
        h.aeth = Some(aeth);
        let id = 0x8000 + i as u16;
        let (mut a, mut b) = ([0xEEu8; 128], [0x55u8; 128]);
        let outer = Template::new(&route, bth.dest_qp);
        let n = ack(&mut a, &outer, id, psn, aeth).unwrap();
        assert_eq!(begin(&mut b, &route, id, &h, 0), Some(ROCE_OFFSET + 16));
        assert_eq!(finish(&mut b), Some(n));
        assert_eq!(a[..n], b[..n]);
        match parse(&a[..n]) {
            Ok(Frame::Roce(p)) => assert_eq!(p.headers, h),
            other => panic!("{other:?}"),
        }
        assert_eq!(ack(&mut a[..n - 1], &outer, id, psn, aeth), None);
    }
}

/// A frame with a RETH or an AETH after its BTH built at fixed offsets is the one the
/// general path builds from the same headers, byte for byte, for every opcode that has
/// that header alone, at every pad count, and parses back as those headers; one byte short
/// of room is refused.
#[test]
fn extended_headers_equal_the_general_build() {
    let route = Route {
        src_mac: [2, 0, 0, 0, 0, 7],
        dst_mac: [2, 0, 0, 0, 0, 9],
        src_ip: [10, 0, 0, 7],
        dst_ip: [10, 0, 0, 9],
        tos: 0,
        ttl: 64,
        src_port: 0xD00D,
    };
    let outer = Template::new(&route, 0x00_0123);
    let reth = Reth {
        va: 0x0123_4567_89AB_CDEF,
        rkey: 0xFEDC_BA98,
        len: 0x8000_0001,
    };
    let aeth = Aeth {
        syndrome: 0x1F,
        msn: 0xAB_CDEF,
    };
    let with_reth = [
        opcode::RC_WRITE_FIRST,
        opcode::RC_WRITE_ONLY,
        opcode::RC_READ_REQUEST,
    ];
    let with_aeth = [
        opcode::RC_READ_RESPONSE_FIRST,
        opcode::RC_READ_RESPONSE_LAST,
        opcode::RC_READ_RESPONSE_ONLY,
    ];
    let ops = with_reth.iter().map(|&o| (o, true));
    for (op, is_reth) in ops.chain(with_aeth.iter().map(|&o| (o, false))) {
        let payload = if op == opcode::RC_READ_REQUEST {
            0..1
        } else {
            0..9
        };
        for len in payload {
            let bth = Bth {
                opcode: op,
                se: false,
                pad: 0,
                pkey: 0xFFFF,
                dest_qp: 0x00_0123,
                ack_req: is_reth,
                psn: 0x7F_FFFE + len as u32,
            };
            let mut h = Headers::new(bth);
            let (mut a, mut b) = ([0xEEu8; 128], [0x55u8; 128]);
            let (ext, ext_len) = if is_reth {
                h.reth = Some(reth);
                (reth_bytes(&reth), 16)
            } else {
                h.aeth = Some(aeth);
                (aeth_bytes(&aeth), AETH_LEN)
            };
            let at = begin_ext(&mut a, &outer, 5, &bth, &ext, ext_len, len).unwrap();
            assert_eq!(begin_with(&mut b, &outer, 5, &h, len), Some(at), "{op:#x}");
            a[at..at + len].fill(len as u8 ^ 0x5A);
            b[at..at + len].fill(len as u8 ^ 0x5A);
            let n = finish(&mut a).unwrap();
            assert_eq!(finish(&mut b), Some(n));
            assert_eq!(a[..n], b[..n], "{op:#x} len {len}");
            match parse(&a[..n]) {
                Ok(Frame::Roce(p)) => {
                    h.bth.pad = (len.wrapping_neg() & 3) as u8;
                    assert_eq!(p.headers, h);
                    assert_eq!(p.payload.len(), len);
                }
                other => panic!("{other:?}"),
            }
            // In a buffer of the frame's size exactly (shorter than the headers' array,
            // for a short frame), the same frame.
            let mut exact = std::vec![0xA5u8; n];
            assert_eq!(
                begin_ext(&mut exact, &outer, 5, &bth, &ext, ext_len, len),
                Some(at)
            );
            exact[at..at + len].fill(len as u8 ^ 0x5A);
            assert_eq!(finish(&mut exact), Some(n));
            assert_eq!(exact[..], a[..n], "{op:#x} len {len} exact");
            let short = &mut a[..n - 1];
            assert_eq!(begin_ext(short, &outer, 5, &bth, &ext, ext_len, len), None);
            assert_eq!(
                begin_ext(&mut b, &outer, 5, &bth, &ext, EXT_MAX + 1, len),
                None
            );
        }
    }
}

/// A frame with a BTH alone built at fixed offsets is the one the general path builds from
/// the same header, byte for byte, at every pad count; one byte short of room is refused.
#[test]
fn a_bth_alone_equals_the_general_build() {
    let route = Route {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        src_ip: [10, 0, 0, 1],
        dst_ip: [10, 0, 0, 2],
        tos: 0x20,
        ttl: 9,
        src_port: 0xC321,
    };
    let outer = Template::new(&route, 0xAB_CDEF);
    for len in 0..9 {
        let bth = Bth {
            opcode: opcode::RC_SEND_ONLY,
            se: len % 2 == 1,
            pad: 0,
            pkey: 0xFFFF,
            dest_qp: 0xAB_CDEF,
            ack_req: true,
            psn: 0xFF_FFF0 + len as u32,
        };
        let (mut a, mut b) = ([0xEEu8; 128], [0x55u8; 128]);
        let at = begin_bth(&mut a, &outer, 77, &bth, len).unwrap();
        assert_eq!(
            begin_with(&mut b, &outer, 77, &Headers::new(bth), len),
            Some(at)
        );
        a[at..at + len].fill(len as u8);
        b[at..at + len].fill(len as u8);
        let n = finish(&mut a).unwrap();
        assert_eq!(finish(&mut b), Some(n));
        assert_eq!(a[..n], b[..n]);
        // The frame finished from the offsets its sender knows is the same one.
        b[at + len..].fill(0x77);
        let end = at + len + (len.wrapping_neg() & 3) + ICRC_LEN;
        assert_eq!(finish_at(&mut b, at + len, end), Some(n));
        assert_eq!(a[..n], b[..n]);
        assert_eq!(finish_at(&mut b[..n - 1], at + len, end), None);
        assert_eq!(finish_at(&mut b, end - ICRC_LEN + 1, end), None);
        assert_eq!(begin_bth(&mut a[..n - 1], &outer, 77, &bth, len), None);
    }
}
