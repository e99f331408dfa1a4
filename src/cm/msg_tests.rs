//! The messages' layouts checked at Linux's offsets, and every message read back as written.
use super::*;

fn req() -> Req {
    Req {
        local_comm_id: 0x0102_0304,
        service_id: service_id(PS_TCP, 7174),
        local_ca_guid: 0x5254_00FF_FE00_0002,
        local_qpn: 0x11,
        responder_resources: 1,
        initiator_depth: 2,
        remote_cm_response_timeout: 20,
        transport: 0,
        flow_control: false,
        starting_psn: 0xABCDEF,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xFFFF,
        mtu: 3,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        local_gid: [1; 16],
        remote_gid: [2; 16],
        flow_label: 0x12345,
        traffic_class: 0,
        hop_limit: 64,
        local_ack_timeout: 19,
        private: Private::from_slice(&[9; 92]),
    }
}

#[test]
fn a_req_sits_where_linux_reads_it() {
    let r = req();
    let m = r.encode(7);
    assert_eq!(m.u64(32), 0x0000_0000_0106_1C06, "rping's service ID");
    assert_eq!(&m.0[56..60], &[0, 0, 0x11, 1]);
    assert_eq!(m.0[63], 2);
    assert_eq!(m.0[67], 20 << 3);
    assert_eq!(&m.0[68..71], &[0xAB, 0xCD, 0xEF]);
    assert_eq!(m.0[71], (20 << 3) | 7);
    assert_eq!(
        &m.0[72..80],
        &[0xFF, 0xFF, 0x37, 0xF0, 0xFF, 0xFF, 0xFF, 0xFF]
    );
    assert_eq!(&m.0[112..115], &[0x12, 0x34, 0x50]);
    assert_eq!(m.0[117], 64);
    assert_eq!(m.0[119], 19 << 3);
    assert_eq!(&m.0[120..164], &[0u8; 44], "no alternate path");
    let mut back = Req::decode(&m);
    assert_eq!(back.private.len, 92);
    back.private.len = r.private.len;
    assert_eq!(back, r);
}

#[test]
fn every_message_round_trips() {
    let rep = Rep {
        local_comm_id: 5,
        remote_comm_id: 6,
        local_qpn: 0x12,
        starting_psn: 0x77,
        responder_resources: 4,
        initiator_depth: 3,
        target_ack_delay: 15,
        flow_control: true,
        rnr_retry_count: 7,
        srq: true,
        local_ca_guid: 0xAA,
        private: Private::from_slice(&[3; 196]),
    };
    let m = rep.encode(1);
    assert_eq!(m.0[50], (15 << 3) | 1);
    assert_eq!(m.0[51], (7 << 5) | (1 << 4));
    assert_eq!(Rep::decode(&m), rep);
    let rej = Rej {
        ids: Ids {
            local: 0,
            remote: 9,
        },
        rejected: about::REQ,
        ari_len: 0,
        reason: reason::CONSUMER,
        private: Private::from_slice(&[4; 148]),
    };
    let m = rej.encode(2);
    assert_eq!(&m.0[32..36], &[0, 0, 0, 28]);
    assert_eq!(Rej::decode(&m), rej);
    let mra = Mra {
        ids: Ids {
            local: 1,
            remote: 2,
        },
        mraed: about::REP,
        service_timeout: 24,
    };
    let m = mra.encode(3);
    assert_eq!(&m.0[32..34], &[0x40, 24 << 3]);
    assert_eq!(Mra::decode(&m), mra);
    let m = encode_dreq(
        Ids {
            local: 1,
            remote: 2,
        },
        0x33,
        4,
    );
    assert_eq!(dreq_remote_qpn(&m), 0x33);
    assert_eq!(
        Ids::decode(&m),
        Ids {
            local: 1,
            remote: 2
        }
    );
    let s = SidrReq {
        request_id: 8,
        pkey: 0xFFFF,
        service_id: service_id(PS_UDP, 7174),
        private: Private::from_slice(&[1; 216]),
    };
    assert_eq!(SidrReq::decode(&s.encode(5)), s);
    let s = SidrRep {
        request_id: 8,
        status: sidr_status::OK,
        qpn: 0x44,
        service_id: service_id(PS_UDP, 7174),
        qkey: UDP_QKEY,
        private: Private::from_slice(&[2; 136]),
    };
    assert_eq!(SidrRep::decode(&s.encode(5)), s);
}

#[test]
fn the_cma_header_pads_ipv4_with_zeroes() {
    let h = CmaHeader {
        src_port: 0x8001,
        src_ip: [10, 0, 0, 2],
        dst_ip: [10, 0, 0, 3],
    };
    let b = h.to_bytes();
    assert_eq!(&b[..4], &[0, 0x40, 0x80, 0x01]);
    assert_eq!(&b[4..16], &[0; 12]);
    assert_eq!(&b[16..20], &[10, 0, 0, 2]);
    assert_eq!(&b[32..36], &[10, 0, 0, 3]);
    assert_eq!(CmaHeader::parse(&b), Some(h));
    let mut v6 = b;
    v6[1] = 0x60;
    assert_eq!(CmaHeader::parse(&v6), None);
    let mut v1 = b;
    v1[0] = 1;
    assert_eq!(CmaHeader::parse(&v1), None);
    assert_eq!(CmaHeader::parse(&b[..35]), None);
}

#[test]
fn the_cma_header_over_ipv6_holds_both_addresses_whole() {
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    (src[0], src[15], dst[0], dst[15]) = (0xfd, 1, 0xfd, 2);
    let h = CmaHeader6 {
        src_port: 0xC123,
        src_ip: src,
        dst_ip: dst,
    };
    let b = h.to_bytes();
    assert_eq!(&b[..4], &[0, 0x60, 0xC1, 0x23]);
    assert_eq!(&b[4..20], &src);
    assert_eq!(&b[20..36], &dst);
    assert_eq!(CmaHeader6::parse(&b), Some(h));
    // Each family's reader takes its own only.
    assert_eq!(CmaHeader::parse(&b), None);
    let v4 = CmaHeader {
        src_port: 1,
        src_ip: [10, 0, 0, 2],
        dst_ip: [10, 0, 0, 3],
    };
    assert_eq!(CmaHeader6::parse(&v4.to_bytes()), None);
    let mut v1 = b;
    v1[0] = 1;
    assert_eq!(CmaHeader6::parse(&v1), None);
    assert_eq!(CmaHeader6::parse(&b[..35]), None);
}
