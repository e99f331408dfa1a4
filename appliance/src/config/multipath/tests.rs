//! The multipath words: what they set, and every refusal with the word it names.

use super::super::*;
use bareverbs_nvmf::target::{NsIds, Peer};
use bareverbs_nvmf::wire::ana::AnaState;

extern crate std;
use std::format;

const M: Machine = Machine {
    disks: 2,
    ram_bytes: 256 << 20,
    nvme: [0; MAX_NVME],
};
const NQN: &str = "nqn.2026-11.io.example:shared";

fn refused(cmdline: &str, word: &str, problem: Problem) {
    match Config::parse(cmdline, &M) {
        Ok(c) => panic!("{cmdline:?} taken: {c:?}"),
        Err(e) => {
            assert_eq!((e.word, e.problem), (word, problem), "{cmdline:?}");
            let line = format!("{e}");
            assert!(line.contains(&format!("{problem}")), "{line:?}");
        }
    }
}

#[test]
fn an_appliance_of_two_takes_its_range_peer_identity_and_states() {
    let line = format!(
        "bvnvmf=10.0.0.4/24 bvnvmf.cntlid=32768-65519 bvnvmf.portid=2 bvnvmf.peer=10.0.0.2:4420:1 \
         bvnvmf.subsys={NQN} bvnvmf.ns=blk:0 bvnvmf.nguid=00112233445566778899AABBCCDDEEFF \
         bvnvmf.eui64=0011223344556677 bvnvmf.uuid=6b0e57a1-3c21-4f0e-9d5e-1a2b3c4d5e6f \
         bvnvmf.anagrp=2 bvnvmf.ns=ram:1M bvnvmf.ana=2:non-optimized bvnvmf.ana=1:inaccessible"
    );
    let c = Config::parse(&line, &M).unwrap();
    assert_eq!(c.multipath.cntlid, (0x8000, 0xFFEF));
    assert_eq!(c.multipath.port_id, 2);
    assert_eq!(
        c.multipath.peers[0],
        Some(Peer {
            addr: [10, 0, 0, 2],
            port: 4420,
            port_id: 1
        })
    );
    assert_eq!(c.multipath.peers[1], None);
    let s = &c.subsystems[0].shared;
    assert_eq!(
        s.ids[0],
        NsIds {
            nguid: Some([
                0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xAA, 0xBB, 0xCC, 0xDD,
                0xEE, 0xFF
            ]),
            eui64: Some([0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77]),
            uuid: Some([
                0x6b, 0x0e, 0x57, 0xa1, 0x3c, 0x21, 0x4f, 0x0e, 0x9d, 0x5e, 0x1a, 0x2b, 0x3c, 0x4d,
                0x5e, 0x6f
            ]),
            anagrpid: 2,
        }
    );
    assert_eq!(
        s.ids[1],
        NsIds::default(),
        "the RAM namespace: group 1, no identity"
    );
    assert_eq!(
        s.ana,
        [
            AnaState::Inaccessible,
            AnaState::NonOptimized,
            AnaState::Optimized,
            AnaState::Optimized
        ]
    );
}

#[test]
fn defaults_without_the_words() {
    let c = Config::parse("bvnvmf=10.0.0.2", &M).unwrap();
    assert_eq!(c.multipath, Multipath::default());
    assert_eq!(c.multipath.cntlid, (1, 0xFFEF));
    assert_eq!((c.multipath.port_id, c.multipath.peers), (1, [None; 4]));
    // Peers without a port or port ID: 4420, and 2, 3, … in their order.
    let c = Config::parse("bvnvmf.peer=10.0.0.4 bvnvmf.peer=10.0.0.5:4421", &M).unwrap();
    let peers: std::vec::Vec<_> = c.multipath.peers.iter().flatten().copied().collect();
    assert_eq!(
        peers,
        [
            Peer {
                addr: [10, 0, 0, 4],
                port: 4420,
                port_id: 2
            },
            Peer {
                addr: [10, 0, 0, 5],
                port: 4421,
                port_id: 3
            }
        ]
    );
}

#[test]
fn refusals() {
    let sub = format!("bvnvmf.subsys={NQN} bvnvmf.ns=blk:0");
    for (line, word, problem) in [
        (
            "bvnvmf.cntlid=0-5",
            "bvnvmf.cntlid=0-5",
            Problem::BadCntlidRange,
        ),
        (
            "bvnvmf.cntlid=9-5",
            "bvnvmf.cntlid=9-5",
            Problem::BadCntlidRange,
        ),
        (
            "bvnvmf.cntlid=1-65520",
            "bvnvmf.cntlid=1-65520",
            Problem::BadCntlidRange,
        ),
        (
            "bvnvmf.cntlid=7",
            "bvnvmf.cntlid=7",
            Problem::BadCntlidRange,
        ),
        (
            "bvnvmf.cntlid=1-2 bvnvmf.cntlid=3-4",
            "bvnvmf.cntlid=3-4",
            Problem::Repeated,
        ),
        (
            "bvnvmf.portid=70000",
            "bvnvmf.portid=70000",
            Problem::BadNumber,
        ),
        (
            "bvnvmf.portid=1 bvnvmf.portid=2",
            "bvnvmf.portid=2",
            Problem::Repeated,
        ),
        (
            "bvnvmf.peer=10.0.0.300",
            "bvnvmf.peer=10.0.0.300",
            Problem::BadAddress,
        ),
        (
            "bvnvmf.peer=10.0.0.4:0",
            "bvnvmf.peer=10.0.0.4:0",
            Problem::BadPort,
        ),
        (
            "bvnvmf.peer=10.0.0.4:1:2:3",
            "bvnvmf.peer=10.0.0.4:1:2:3",
            Problem::BadAddress,
        ),
        (
            "bvnvmf.peer=1.1.1.1 bvnvmf.peer=1.1.1.1",
            "bvnvmf.peer=1.1.1.1",
            Problem::Repeated,
        ),
        (
            "bvnvmf.peer=1.1.1.1 bvnvmf.peer=1.1.1.2 bvnvmf.peer=1.1.1.3 bvnvmf.peer=1.1.1.4 bvnvmf.peer=1.1.1.5",
            "bvnvmf.peer=1.1.1.5",
            Problem::TooManyPeers,
        ),
        (
            "bvnvmf.nguid=00",
            "bvnvmf.nguid=00",
            Problem::IdentityOutsideNamespace,
        ),
        (
            "bvnvmf.ana=1:optimized",
            "bvnvmf.ana=1:optimized",
            Problem::AnaOutsideSubsystem,
        ),
    ] {
        refused(line, word, problem);
    }
    for (tail, word, problem) in [
        (
            "bvnvmf.nguid=0011",
            "bvnvmf.nguid=0011",
            Problem::BadIdentifier,
        ),
        (
            "bvnvmf.eui64=001122334455667g",
            "bvnvmf.eui64=001122334455667g",
            Problem::BadIdentifier,
        ),
        (
            "bvnvmf.uuid=6b0e57a13c214f0e9d5e1a2b3c4d5e6f",
            "bvnvmf.uuid=6b0e57a13c214f0e9d5e1a2b3c4d5e6f",
            Problem::BadIdentifier,
        ),
        (
            "bvnvmf.eui64=0011223344556677 bvnvmf.eui64=0011223344556678",
            "bvnvmf.eui64=0011223344556678",
            Problem::Repeated,
        ),
        ("bvnvmf.anagrp=0", "bvnvmf.anagrp=0", Problem::BadGroup),
        ("bvnvmf.anagrp=5", "bvnvmf.anagrp=5", Problem::BadGroup),
        (
            "bvnvmf.anagrp=2 bvnvmf.anagrp=3",
            "bvnvmf.anagrp=3",
            Problem::Repeated,
        ),
        (
            "bvnvmf.ana=1:persistent-loss",
            "bvnvmf.ana=1:persistent-loss",
            Problem::BadAnaState,
        ),
        ("bvnvmf.ana=1", "bvnvmf.ana=1", Problem::BadAnaState),
        (
            "bvnvmf.ana=9:optimized",
            "bvnvmf.ana=9:optimized",
            Problem::BadGroup,
        ),
        (
            "bvnvmf.eui64=0011223344556677 bvnvmf.ns=blk:1 bvnvmf.eui64=0011223344556677",
            "bvnvmf.eui64=0011223344556677",
            Problem::DuplicateIdentifier,
        ),
    ] {
        refused(&format!("{sub} {tail}"), word, problem);
    }
    // The same NGUID in two subsystems of one appliance: one namespace to a host.
    let g = "bvnvmf.nguid=000102030405060708090a0b0c0d0e0f";
    refused(
        &format!("{sub} {g} bvnvmf.subsys={NQN}2 bvnvmf.ns=blk:1 {g}"),
        g,
        Problem::DuplicateIdentifier,
    );
}
