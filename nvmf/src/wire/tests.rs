//! The wire structures: encodings against hand-written bytes, bounded parsing of short or
//! hostile input.

use super::cm::{CmRejStatus, CmRep, CmReq};
use super::fabrics::{Connect, ConnectData, Nqn, Property};
use super::identify::{CtrlInfo, IdCtrl, IdNs, discovery};
use super::*;

#[test]
fn sgl_descriptors_encode_and_decode() {
    let k = Sgl::Keyed {
        addr: 0x1122_3344_5566_7788,
        len: 0x00AB_CDEF,
        key: 0xDEAD_BEEF,
        invalidate: true,
    };
    let b = k.to_bytes();
    assert_eq!(
        b,
        [
            0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0xEF, 0xCD, 0xAB, 0xEF, 0xBE, 0xAD,
            0xDE, 0x4F
        ]
    );
    assert_eq!(Sgl::parse(&b), Ok(k));
    let c = Sgl::InCapsule {
        offset: 16,
        len: 4096,
    };
    let b = c.to_bytes();
    assert_eq!(b[15], 0x01);
    assert_eq!(Sgl::parse(&b), Ok(c));
    assert_eq!(Sgl::parse(&Sgl::Null.to_bytes()), Ok(Sgl::Null));
    let ls = Sgl::LastSegment {
        offset: 0x20,
        len: 48,
    };
    let b = ls.to_bytes();
    assert_eq!((b[15], b[0], b[8]), (0x31, 0x20, 48));
    assert_eq!(Sgl::parse(&b), Ok(ls));
    // Every other identifier is refused.
    for id in 0..=255u8 {
        let mut d = [0u8; 16];
        d[8] = 1;
        d[15] = id;
        let ok = matches!(id, 0x40 | 0x4F | 0x01 | 0x31);
        assert_eq!(Sgl::parse(&d).is_ok(), ok, "{id:#x}");
        if !ok {
            assert_eq!(Sgl::parse(&d), Err(Status::SGL_TYPE_INVALID));
        }
    }
}

#[test]
fn cqe_status_is_shifted_over_the_phase_bit() {
    let c = Cqe {
        result: 0x0102_0304_0506_0708,
        sq_head: 5,
        sq_id: 2,
        cid: 0xBEEF,
        status: Status::LBA_RANGE,
    };
    let b = c.to_bytes();
    assert_eq!(&b[14..16], &((0x4080u16) << 1).to_le_bytes());
    assert_eq!(Cqe::parse(&b), Some(c));
    assert_eq!(Cqe::parse(&b[..15]), None);
    assert!(Status::LBA_RANGE.dnr() && !Status::LBA_RANGE.is_ok());
    assert_eq!(Status::LBA_RANGE.code(), 0x80);
    assert!(Status(0x4000).is_ok(), "DNR alone is not an error code");
}

#[test]
fn sqe_fields() {
    assert_eq!(Sqe::parse(&[0u8; 63]), None);
    let s = Sqe::rw(opcode::WRITE, 7, 1, 0x1_0000_0002, 65536);
    assert_eq!((s.opcode(), s.flags(), s.cid(), s.nsid()), (1, 0x40, 7, 1));
    assert_eq!((s.slba(), s.nlb()), (0x1_0000_0002, 65536));
    assert_eq!(&s.0[48..50], &[0xFF, 0xFF]);
    let mut s = s;
    s.set_cdw(15, 9);
    assert_eq!(s.cdw(15), 9);
    assert_eq!(&s.0[60..64], &[9, 0, 0, 0]);
}

#[test]
fn cm_private_data() {
    let r = CmReq {
        recfmt: 0,
        qid: 3,
        hrqsize: 128,
        hsqsize: 127,
        cntlid: 0,
    };
    let b = r.to_bytes();
    assert_eq!(&b[..8], &[0, 0, 3, 0, 128, 0, 127, 0]);
    assert_eq!(CmReq::parse(&b), Some(r));
    assert_eq!(CmReq::parse(&b[..31]), None);
    let p = CmRep {
        recfmt: 0,
        crqsize: 32,
    };
    assert_eq!(CmRep::parse(&p.to_bytes()), Some(p));
    assert_eq!(CmRejStatus::InvalidHsqsize.to_bytes(), [0, 0, 4, 0]);
    assert_eq!(CmRejStatus::parse(&[0, 0, 6, 0]), Some(6));
    assert_eq!(CmRejStatus::from_raw(9), Some(CmRejStatus::InvalidCntlid));
    assert_eq!(CmRejStatus::from_raw(10), None);
}

#[test]
fn nqns_are_bounded_and_printable() {
    assert!(Nqn::new("").is_none());
    assert!(Nqn::new(&"a".repeat(223)).is_some());
    assert!(Nqn::new(&"a".repeat(224)).is_none());
    assert!(Nqn::new("nqn\u{7}bell").is_none());
    assert!(Nqn::new("with\0nul").is_none());
    // A field with no NUL in 256 bytes is refused (longer than 223).
    assert!(Nqn::from_field(&[b'x'; 256]).is_none());
    let mut f = [0u8; 256];
    f[..5].copy_from_slice(b"nqn.x");
    assert_eq!(Nqn::from_field(&f).unwrap().as_str(), "nqn.x");
    assert!(Nqn::from_field(&[]).is_none());
}

#[test]
fn connect_command_and_data() {
    let c = Connect {
        recfmt: 0,
        qid: 2,
        sqsize: 127,
        cattr: 4,
        kato_ms: 5000,
    };
    let s = c.to_sqe(3);
    assert_eq!((s.opcode(), s.fctype()), (0x7F, 0x01));
    assert_eq!(&s.0[40..52], &[0, 0, 2, 0, 127, 0, 4, 0, 0x88, 0x13, 0, 0]);
    assert_eq!(Connect::parse(&s), c);
    let d = ConnectData {
        hostid: [7; 16],
        cntlid: 0xFFFF,
        subnqn: Nqn::new("nqn.sub").unwrap(),
        hostnqn: Nqn::new("nqn.host").unwrap(),
    };
    let mut b = [0xEEu8; 1024];
    d.write(&mut b);
    assert_eq!(&b[16..18], &[0xFF, 0xFF]);
    assert_eq!(&b[256..264], b"nqn.sub\0");
    assert_eq!(&b[512..521], b"nqn.host\0");
    assert!(b[768..].iter().all(|&x| x == 0));
    assert_eq!(ConnectData::parse(&b), Some(d));
    assert_eq!(ConnectData::parse(&b[..1023]), None);
    b[512] = 0;
    assert_eq!(ConnectData::parse(&b), None, "empty host NQN");
}

#[test]
fn property_commands() {
    let p = Property {
        size8: true,
        offset: prop::CAP,
        value: 0,
    };
    let s = p.to_sqe(1, false);
    assert_eq!((s.fctype(), s.0[40]), (0x04, 1));
    assert_eq!(Property::parse(&s), Some(p));
    let mut s = s;
    s.0[40] = 2;
    assert_eq!(Property::parse(&s), None);
}

#[test]
fn identify_structures_round_trip() {
    let mut b = [0u8; 4096];
    IdCtrl {
        cntlid: 0x1234,
        mdts: 5,
        kas: 10,
        maxcmd: 128,
        nn: 3,
        sgls: 0x0010_0005,
        ioccsz: 260,
        subnqn: b"nqn.s",
        serial: "sn",
        ..IdCtrl::default()
    }
    .write(&mut b);
    let c = CtrlInfo::parse(&b).unwrap();
    assert_eq!(
        (c.cntlid, c.mdts, c.kas, c.maxcmd, c.nn),
        (0x1234, 5, 10, 128, 3)
    );
    assert_eq!((c.sgls, c.ioccsz, c.icdoff), (0x0010_0005, 260, 0));
    assert_eq!(&b[4..8], b"sn  ", "space-padded");
    assert_eq!(&b[768..774], b"nqn.s\0");
    assert_eq!((b[512], b[513]), (0x66, 0x44));
    assert!(CtrlInfo::parse(&b[..4095]).is_none());
    let n = IdNs {
        nsze: 100,
        ncap: 100,
        nuse: 100,
        lbads: 12,
        nmic: 1,
        anagrpid: 2,
        nguid: [3; 16],
        eui64: [4; 8],
    };
    n.write(&mut b);
    assert_eq!(IdNs::parse(&b), Some(n));
    // A hostile format index stays within the 64 formats.
    b[26] = 0xFF;
    assert!(IdNs::parse(&b).is_some());
}

#[test]
fn discovery_entries() {
    let mut b = [0xEEu8; 1024];
    discovery::Entry {
        subtype: 2,
        portid: 1,
        cntlid: 0xFFFF,
        asqsz: 32,
        trsvcid: 4420,
        subnqn: b"nqn.sub",
        traddr: [192, 168, 100, 255],
    }
    .write(&mut b);
    assert_eq!(&b[..10], &[1, 1, 2, 0, 1, 0, 0xFF, 0xFF, 32, 0]);
    assert_eq!(&b[32..37], b"4420\0");
    assert_eq!(&b[512..528], b"192.168.100.255\0");
    assert_eq!(discovery::parse_entry(&b).map(|e| (e.0, e.1)), Some((1, 2)));
    discovery::write_header(&mut b, 7, 2);
    assert_eq!(discovery::parse_header(&b), Some((7, 2)));
    assert_eq!(discovery::parse_header(&b[..15]), None);
}

/// Every parser over random bytes of random lengths: bounded, no panic, and what it accepts
/// is well-formed.
#[test]
fn parsers_take_any_bytes() {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut buf = [0u8; 4200];
    for _ in 0..3000 {
        let len = rnd() as usize % buf.len();
        for b in buf.iter_mut().take(len) {
            *b = rnd() as u8;
        }
        let b = &buf[..len];
        if let Some(s) = Sqe::parse(b) {
            let _ = (s.sgl(), s.slba(), s.nlb(), s.cdw(15), Property::parse(&s));
            let _ = Connect::parse(&s);
        }
        let _ = (
            Cqe::parse(b),
            CmReq::parse(b),
            CmRep::parse(b),
            CmRejStatus::parse(b),
        );
        if let Some(d) = ConnectData::parse(b) {
            assert!(d.subnqn.as_str().len() <= 223 && !d.hostnqn.as_str().is_empty());
        }
        if let Some(n) = Nqn::from_field(b) {
            assert!(n.as_str().bytes().all(|c| (0x20..0x7F).contains(&c)));
        }
        let _ = (CtrlInfo::parse(b), IdNs::parse(b));
        let _ = (discovery::parse_header(b), discovery::parse_entry(b));
        let _ = discovery::parse_address(b);
        // A hostile count and hostile descriptor lengths stay within the bytes read.
        let mut walked = 0usize;
        for (d, ids) in ana::groups(b) {
            assert_eq!(ids.len() as u64, u64::from(d.nnsids) * 4);
            walked += ana::DESC_LEN + ids.len();
        }
        assert!(walked <= b.len());
        let mut d = [0u8; 16];
        d.copy_from_slice(&buf[..16]);
        if let Ok(Sgl::Keyed { len, .. }) = Sgl::parse(&d) {
            assert!(len > 0 && len < 1 << 24);
        }
    }
}

#[test]
fn an_error_log_entry_round_trips_in_its_64_bytes() {
    use super::log::{ERROR_ENTRY_LEN, ErrorEntry, NO_LOCATION};
    let e = ErrorEntry {
        count: 0x0102_0304_0506_0708,
        sqid: 2,
        cid: 0xBEEF,
        status: Status::LBA_RANGE,
        location: 40,
        lba: 0x1122_3344_5566_7788,
        nsid: 9,
    };
    let mut b = [0xEEu8; ERROR_ENTRY_LEN + 4];
    e.write(&mut b);
    assert_eq!(ErrorEntry::parse(&b).unwrap(), e);
    assert_eq!(&b[0..8], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(&b[8..12], &[2, 0, 0xEF, 0xBE]);
    // The status above the phase bit, as in a CQE: 0x4080 << 1.
    assert_eq!(&b[12..14], &0x8100u16.to_le_bytes());
    assert_eq!(&b[14..16], &[40, 0]);
    assert_eq!(&b[24..28], &[9, 0, 0, 0]);
    assert!(b[28..64].iter().all(|&x| x == 0), "the rest zero");
    assert_eq!(&b[64..], &[0xEE; 4], "nothing past the entry");
    assert!(ErrorEntry::parse(&b[..63]).is_none());
    assert_eq!(NO_LOCATION, 0xFFFF);
}

#[test]
fn a_connect_refusal_names_its_field_as_linux_reads_it() {
    use super::fabrics::invalid;
    // Bit 16 set: the offset is in the Connect data (Linux: "Connect Invalid Data Parameter").
    assert_eq!(invalid::data(invalid::CNTLID), 0x1_0010);
    assert_eq!(invalid::data(invalid::HOSTNQN), 0x1_0200);
    // Clear: in the command ("Connect Invalid SQE Parameter, qid …").
    assert_eq!(invalid::sqe(invalid::QID), 42);
}

/// Identify Controller's and Namespace's multipath and ANA fields at the byte offsets of the
/// base specification (and of Linux's `struct nvme_id_ctrl` / `nvme_id_ns`).
#[test]
fn multipath_identify_fields_at_their_offsets() {
    let mut b = [0u8; 4096];
    IdCtrl {
        cmic: 0x0B,
        oaes: ana::AEN_ANA_CHANGE,
        anatt: 10,
        anacap: 0x47,
        anagrpmax: 0x0102_0304,
        nanagrpid: 0x0506_0708,
        mnan: 0x0A0B_0C0D,
        ..IdCtrl::default()
    }
    .write(&mut b);
    assert_eq!(b[76], 0x0B);
    assert_eq!(&b[92..96], &[0x00, 0x08, 0, 0], "OAES bit 11");
    assert_eq!((b[342], b[343]), (10, 0x47));
    assert_eq!(&b[344..352], &[4, 3, 2, 1, 8, 7, 6, 5]);
    assert_eq!(&b[540..544], &[0x0D, 0x0C, 0x0B, 0x0A]);
    let c = CtrlInfo::parse(&b).unwrap();
    assert_eq!(
        (c.cmic, c.oaes, c.anacap, c.anagrpmax, c.nanagrpid, c.mnan),
        (0x0B, 1 << 11, 0x47, 0x0102_0304, 0x0506_0708, 0x0A0B_0C0D)
    );
    IdNs {
        nmic: 1,
        anagrpid: 0x1122_3344,
        eui64: [9; 8],
        ..IdNs::default()
    }
    .write(&mut b);
    assert_eq!(b[30], 1);
    assert_eq!(&b[92..96], &[0x44, 0x33, 0x22, 0x11]);
    assert_eq!(&b[120..128], &[9; 8]);
}

/// The ANA log: header and descriptor bytes, the walk over them, the notice's dword 0.
#[test]
fn ana_log_encodes_and_walks() {
    let mut b = [0xEEu8; 16 + 32 + 8 + 32];
    ana::write_header(&mut b, 0x0102_0304_0506_0708, 2);
    assert_eq!(&b[..16], &[8, 7, 6, 5, 4, 3, 2, 1, 2, 0, 0, 0, 0, 0, 0, 0]);
    let d = ana::GroupDesc {
        grpid: 1,
        nnsids: 2,
        chgcnt: 5,
        state: ana::AnaState::NonOptimized as u8,
    };
    d.write(&mut b[16..]);
    assert_eq!(
        &b[16..33],
        &[1, 0, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 2]
    );
    assert!(b[33..48].iter().all(|&x| x == 0), "reserved bytes zero");
    b[48..56].copy_from_slice(&[1, 0, 0, 0, 3, 0, 0, 0]);
    ana::GroupDesc {
        grpid: 2,
        nnsids: 0,
        chgcnt: 1,
        state: 3,
    }
    .write(&mut b[56..]);
    let mut walk = ana::groups(&b);
    assert_eq!(walk.next(), Some((d, &[1, 0, 0, 0, 3, 0, 0, 0][..])));
    let second = walk.next().map(|(g, ids)| (g.grpid, g.state, ids.len()));
    assert_eq!(second, Some((2, 3, 0)));
    assert_eq!(walk.next(), None);
    drop(walk);
    // A count beyond the bytes: the walk stops where they end.
    ana::write_header(&mut b, 1, 9);
    assert_eq!(ana::groups(&b).count(), 2);
    assert_eq!(ana::AEN_RESULT, 0x000C_0302);
    for s in [
        ana::AnaState::Optimized,
        ana::AnaState::NonOptimized,
        ana::AnaState::Inaccessible,
        ana::AnaState::PersistentLoss,
        ana::AnaState::Change,
    ] {
        assert_eq!(ana::AnaState::from_code(s as u8), Some(s));
        assert_eq!(ana::AnaState::from_name(s.name()), Some(s));
    }
    assert_eq!(ana::AnaState::from_code(0), None);
    assert_eq!(ana::AnaState::from_name("optimised"), None);
}

#[test]
fn discovery_entry_address_reads_back() {
    let mut b = [0u8; 1024];
    discovery::Entry {
        subtype: 2,
        portid: 7,
        cntlid: 0xFFFF,
        asqsz: 32,
        trsvcid: 4420,
        subnqn: b"nqn.sub",
        traddr: [10, 0, 0, 4],
    }
    .write(&mut b);
    assert_eq!(
        discovery::parse_address(&b),
        Some((7, &b"10.0.0.4"[..], &b"4420"[..]))
    );
}
