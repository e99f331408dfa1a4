//! The configuration grammar: what it takes, and every refusal with the word it names.

use super::*;

extern crate std;
use std::format;
use std::string::String;

const MIB: u64 = 1 << 20;
const ONE_DISK: Machine = Machine {
    disks: 1,
    ram_bytes: 256 * MIB,
};
const TWO_DISKS: Machine = Machine {
    disks: 2,
    ram_bytes: 256 * MIB,
};
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b";

fn ok<'a>(cmdline: &'a str, m: &Machine) -> Config<'a> {
    match Config::parse(cmdline, m) {
        Ok(c) => c,
        Err(e) => panic!("{cmdline:?} refused: {e}"),
    }
}

/// Refused, naming `word`, for `problem`; the console line names both.
fn refused(cmdline: &str, m: &Machine, word: &str, problem: Problem) {
    match Config::parse(cmdline, m) {
        Ok(c) => panic!("{cmdline:?} taken: {c:?}"),
        Err(e) => {
            assert_eq!((e.word, e.problem), (word, problem), "{cmdline:?}");
            let line = format!("{e}");
            assert!(line.contains(word), "{line:?} does not name {word:?}");
            assert!(line.contains(&format!("{problem}")), "{line:?}");
        }
    }
}

fn ns(v: &[Medium]) -> Vec<Medium, MAX_NAMESPACES> {
    Vec::from_slice(v).unwrap()
}

#[test]
fn built_in_configuration_without_subsystem_words() {
    let c = ok("console=ttyS0 bvirq bvnvmf=10.0.0.2/24", &ONE_DISK);
    assert!(c.built_in);
    assert_eq!(
        (c.ip, c.prefix, c.port, c.host),
        ([10, 0, 0, 2], 24, 4420, None)
    );
    assert_eq!(c.subsystems.len(), 2);
    assert_eq!(c.subsystems[0].nqn, NQN_RAM);
    assert_eq!(
        c.subsystems[0].namespaces,
        ns(&[Medium::Ram { bytes: 64 * MIB }])
    );
    assert_eq!(c.subsystems[1].nqn, NQN_BLK);
    assert_eq!(c.subsystems[1].namespaces, ns(&[Medium::Blk { index: 0 }]));
    assert!(c.subsystems.iter().all(|s| s.allow.is_empty()));
    // Without a disk the virtio-blk subsystem has no namespace (as it always had).
    let c = ok(
        "bvnvmf=10.0.0.2",
        &Machine {
            disks: 0,
            ..ONE_DISK
        },
    );
    assert_eq!(c.prefix, 24);
    assert!(c.subsystems[1].namespaces.is_empty());
}

#[test]
fn built_in_configuration_takes_its_size_allow_list_and_host() {
    let line = format!(
        "bvnvmf=192.168.7.9/16 bvnvmf.mib=32 bvnvmf.allow={HOST_A},{HOST_B} bvnvmf.host=192.168.7.1 bvnvmf.port=4421"
    );
    let c = ok(&line, &ONE_DISK);
    assert_eq!((c.ip, c.prefix, c.port), ([192, 168, 7, 9], 16, 4421));
    assert_eq!(c.host, Some([192, 168, 7, 1]));
    assert_eq!(
        c.subsystems[0].namespaces,
        ns(&[Medium::Ram { bytes: 32 * MIB }])
    );
    for s in &c.subsystems {
        assert_eq!(&s.allow[..], &[HOST_A, HOST_B]);
    }
    assert_eq!(c.ram_bytes(), 32 * MIB);
}

#[test]
fn two_subsystems_three_namespaces_different_allow_lists() {
    let line = format!(
        "bvnvmf=10.0.0.2/24 \
         bvnvmf.subsys=nqn.2026-11.io.example:fast bvnvmf.ns=ram:16M bvnvmf.ns=blk:1 bvnvmf.allow={HOST_A} \
         bvnvmf.subsys=nqn.2026-11.io.example:slow bvnvmf.ns=blk:0 bvnvmf.allow={HOST_B},{HOST_A}"
    );
    let c = ok(&line, &TWO_DISKS);
    assert!(!c.built_in);
    assert_eq!(c.subsystems.len(), 2);
    let (fast, slow) = (&c.subsystems[0], &c.subsystems[1]);
    assert_eq!(fast.nqn, "nqn.2026-11.io.example:fast");
    assert_eq!(
        fast.namespaces,
        ns(&[Medium::Ram { bytes: 16 * MIB }, Medium::Blk { index: 1 }])
    );
    assert_eq!(&fast.allow[..], &[HOST_A]);
    assert_eq!(slow.nqn, "nqn.2026-11.io.example:slow");
    assert_eq!(slow.namespaces, ns(&[Medium::Blk { index: 0 }]));
    assert_eq!(&slow.allow[..], &[HOST_B, HOST_A]);
    assert_eq!(c.ram_bytes(), 16 * MIB);
    // A subsystem without an allow word lets any host in; several allow words add up.
    let line = format!(
        "bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:open bvnvmf.ns=ram:1M \
         bvnvmf.subsys=nqn.x:closed bvnvmf.ns=ram:1M bvnvmf.allow={HOST_A} bvnvmf.allow={HOST_B}"
    );
    let c = ok(&line, &ONE_DISK);
    assert!(c.subsystems[0].allow.is_empty());
    assert_eq!(&c.subsystems[1].allow[..], &[HOST_A, HOST_B]);
}

#[test]
fn sizes() {
    for (text, bytes) in [
        ("512", 512),
        ("4096", 4096),
        ("512K", 512 << 10),
        ("64k", 64 << 10),
        ("3M", 3 * MIB),
        ("1G", 1 << 30),
    ] {
        let line = format!("bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:{text}");
        let m = Machine {
            disks: 0,
            ram_bytes: 2 << 30,
        };
        assert_eq!(
            ok(&line, &m).subsystems[0].namespaces,
            ns(&[Medium::Ram { bytes }]),
            "{text}"
        );
    }
    for bad in [
        "",
        "M",
        "1.5M",
        "-1M",
        "+4M",
        "4T",
        "4MiB",
        "99999999999999999999G",
        "18014398509481984G",
    ] {
        let line = format!("bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:{bad}");
        refused(
            &line,
            &ONE_DISK,
            &format!("bvnvmf.ns=ram:{bad}"),
            Problem::BadSize,
        );
    }
    for bad in ["0", "0M", "1000", "513"] {
        let line = format!("bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:{bad}");
        refused(
            &line,
            &ONE_DISK,
            &format!("bvnvmf.ns=ram:{bad}"),
            Problem::SizeNotBlocks,
        );
    }
}

#[test]
fn unknown_and_repeated_words() {
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.mip=32",
        &ONE_DISK,
        "bvnvmf.mip=32",
        Problem::UnknownWord,
    );
    refused(
        "bvnvmf=10.0.0.2 bvnvmfx=1",
        &ONE_DISK,
        "bvnvmfx=1",
        Problem::UnknownWord,
    );
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.port",
        &ONE_DISK,
        "bvnvmf.port",
        Problem::UnknownWord,
    );
    refused(
        "bvnvmf=10.0.0.2 bvnvmf=10.0.0.3",
        &ONE_DISK,
        "bvnvmf=10.0.0.3",
        Problem::Repeated,
    );
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.port=1 bvnvmf.port=2",
        &ONE_DISK,
        "bvnvmf.port=2",
        Problem::Repeated,
    );
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.mib=8 bvnvmf.mib=8",
        &ONE_DISK,
        "bvnvmf.mib=8",
        Problem::Repeated,
    );
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.host=10.0.0.1 bvnvmf.host=10.0.0.1",
        &ONE_DISK,
        "bvnvmf.host=10.0.0.1",
        Problem::Repeated,
    );
    let line = format!("bvnvmf=10.0.0.2 bvnvmf.allow={HOST_A} bvnvmf.allow={HOST_B}");
    refused(
        &line,
        &ONE_DISK,
        &format!("bvnvmf.allow={HOST_B}"),
        Problem::Repeated,
    );
    // Words that are not the appliance's are let be, whatever they say.
    ok(
        "bvnvmf=10.0.0.2 bvpeer=1.2.3.4 bvroce=x bvblk nvmf.mib=9 console=ttyS0",
        &ONE_DISK,
    );
}

#[test]
fn addresses_prefixes_and_ports() {
    // Without an address: QEMU's user network's.
    let c = ok("console=ttyS0 bvnvmf.serve=5", &ONE_DISK);
    assert_eq!((c.ip, c.prefix, c.serve_secs), (DEFAULT_IP, 24, Some(5)));
    assert_eq!(ok("bvnvmf=10.0.0.2", &ONE_DISK).serve_secs, None);
    for bad in ["0", "-1", "+5", "", "4294967296", "1s"] {
        refused(
            &format!("bvnvmf.serve={bad}"),
            &ONE_DISK,
            &format!("bvnvmf.serve={bad}"),
            Problem::BadSeconds,
        );
    }
    refused(
        "bvnvmf.serve=1 bvnvmf.serve=2",
        &ONE_DISK,
        "bvnvmf.serve=2",
        Problem::Repeated,
    );
    for bad in [
        "10.0.0",
        "10.0.0.2.1",
        "10.0.0.256",
        "10.0.0.+2",
        "10..0.2",
        "a.b.c.d",
        "0010.0.0.2",
        "",
    ] {
        refused(
            &format!("bvnvmf={bad}/24"),
            &ONE_DISK,
            &format!("bvnvmf={bad}/24"),
            Problem::BadAddress,
        );
    }
    for bad in ["33", "-1", "+8", "", "x"] {
        refused(
            &format!("bvnvmf=10.0.0.2/{bad}"),
            &ONE_DISK,
            &format!("bvnvmf=10.0.0.2/{bad}"),
            Problem::BadPrefix,
        );
    }
    assert_eq!(ok("bvnvmf=10.0.0.2/0", &ONE_DISK).prefix, 0);
    assert_eq!(ok("bvnvmf=10.0.0.2/32", &ONE_DISK).prefix, 32);
    for bad in ["0", "65536", "+1", "-1", "", "44x"] {
        refused(
            &format!("bvnvmf=10.0.0.2 bvnvmf.port={bad}"),
            &ONE_DISK,
            &format!("bvnvmf.port={bad}"),
            Problem::BadPort,
        );
    }
    assert_eq!(
        ok("bvnvmf=10.0.0.2 bvnvmf.port=65535", &ONE_DISK).port,
        65535
    );
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.host=10.0.0",
        &ONE_DISK,
        "bvnvmf.host=10.0.0",
        Problem::BadAddress,
    );
}

#[test]
fn nqns() {
    let longest = format!("nqn.{}", "a".repeat(MAX_NQN - 4));
    let line =
        format!("bvnvmf=10.0.0.2 bvnvmf.subsys={longest} bvnvmf.ns=ram:1M bvnvmf.allow={longest}");
    let c = ok(&line, &ONE_DISK);
    assert_eq!(c.subsystems[0].nqn.len(), MAX_NQN);
    let too_long = format!("nqn.{}", "a".repeat(MAX_NQN - 3));
    for bad in [
        too_long.as_str(),
        "nqn.",
        "iqn.2026-11.x:y",
        "nqn.a\u{7}b",
        "NQN.x:y",
    ] {
        refused(
            &format!("bvnvmf=10.0.0.2 bvnvmf.subsys={bad}"),
            &ONE_DISK,
            &format!("bvnvmf.subsys={bad}"),
            Problem::BadNqn,
        );
        let line = format!(
            "bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:1M bvnvmf.allow={HOST_A},{bad}"
        );
        refused(
            &line,
            &ONE_DISK,
            &format!("bvnvmf.allow={HOST_A},{bad}"),
            Problem::BadNqn,
        );
    }
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.allow=",
        &ONE_DISK,
        "bvnvmf.allow=",
        Problem::BadNqn,
    );
    let word = format!("bvnvmf.subsys={DISCOVERY_NQN}");
    refused(
        &format!("bvnvmf=10.0.0.2 {word}"),
        &ONE_DISK,
        &word,
        Problem::DiscoveryNqn,
    );
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:1M bvnvmf.subsys=nqn.x:a",
        &ONE_DISK,
        "bvnvmf.subsys=nqn.x:a",
        Problem::DuplicateNqn,
    );
    let line = format!(
        "bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:1M bvnvmf.allow={HOST_A} bvnvmf.allow={HOST_A}"
    );
    refused(
        &line,
        &ONE_DISK,
        &format!("bvnvmf.allow={HOST_A}"),
        Problem::DuplicateHost,
    );
}

#[test]
fn capacities() {
    let mut line = String::from("bvnvmf=10.0.0.2");
    for k in 0..MAX_SUBSYSTEMS {
        line += &format!(" bvnvmf.subsys=nqn.x:{k} bvnvmf.ns=ram:4K");
    }
    assert_eq!(ok(&line, &ONE_DISK).subsystems.len(), MAX_SUBSYSTEMS);
    line += " bvnvmf.subsys=nqn.x:one-more";
    refused(
        &line,
        &ONE_DISK,
        "bvnvmf.subsys=nqn.x:one-more",
        Problem::TooManySubsystems,
    );

    let mut line = String::from("bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a");
    for _ in 0..MAX_NAMESPACES {
        line += " bvnvmf.ns=ram:4K";
    }
    assert_eq!(
        ok(&line, &ONE_DISK).subsystems[0].namespaces.len(),
        MAX_NAMESPACES
    );
    line += " bvnvmf.ns=ram:8K";
    refused(
        &line,
        &ONE_DISK,
        "bvnvmf.ns=ram:8K",
        Problem::TooManyNamespaces,
    );

    let hosts: std::vec::Vec<String> = (0..=MAX_ALLOW).map(|k| format!("nqn.host:{k}")).collect();
    let line = format!(
        "bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:4K bvnvmf.allow={}",
        hosts[..MAX_ALLOW].join(",")
    );
    assert_eq!(ok(&line, &ONE_DISK).subsystems[0].allow.len(), MAX_ALLOW);
    let word = format!("bvnvmf.allow={}", hosts.join(","));
    refused(
        &format!("bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:4K {word}"),
        &ONE_DISK,
        &word,
        Problem::TooManyHosts,
    );
}

#[test]
fn namespaces_against_the_machine() {
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=blk:1",
        &ONE_DISK,
        "bvnvmf.ns=blk:1",
        Problem::NoSuchDisk { disks: 1 },
    );
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=blk:0",
        &Machine {
            disks: 0,
            ..ONE_DISK
        },
        "bvnvmf.ns=blk:0",
        Problem::NoSuchDisk { disks: 0 },
    );
    // One disk backs one namespace, in one subsystem or across two.
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=blk:0 bvnvmf.ns=blk:0",
        &ONE_DISK,
        "bvnvmf.ns=blk:0",
        Problem::DiskTaken,
    );
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=blk:0 bvnvmf.subsys=nqn.x:b bvnvmf.ns=blk:0",
        &ONE_DISK,
        "bvnvmf.ns=blk:0",
        Problem::DiskTaken,
    );
    for bad in [
        "blk:", "blk:x", "blk:-1", "blk:1000", "disk:0", "ram", "nvme:0", "",
    ] {
        refused(
            &format!("bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns={bad}"),
            &ONE_DISK,
            &format!("bvnvmf.ns={bad}"),
            Problem::BadMedium,
        );
    }
    // RAM namespaces add up against the room the machine has.
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:200M bvnvmf.subsys=nqn.x:b bvnvmf.ns=ram:57M",
        &ONE_DISK,
        "bvnvmf.ns=ram:57M",
        Problem::RamTooLarge {
            asked: 257 * MIB,
            room: 256 * MIB,
        },
    );
    let c = ok(
        "bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:200M bvnvmf.subsys=nqn.x:b bvnvmf.ns=ram:56M",
        &ONE_DISK,
    );
    assert_eq!(c.ram_bytes(), 256 * MIB);
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.mib=257",
        &ONE_DISK,
        "bvnvmf.mib=257",
        Problem::BadMib,
    );
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.mib=0",
        &ONE_DISK,
        "bvnvmf.mib=0",
        Problem::BadMib,
    );
    // The built-in 64 MiB on a machine with less room.
    refused(
        "bvnvmf=10.0.0.2",
        &Machine {
            disks: 0,
            ram_bytes: 32 * MIB,
        },
        "",
        Problem::RamTooLarge {
            asked: 64 * MIB,
            room: 32 * MIB,
        },
    );
}

#[test]
fn contradictions_between_words() {
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.ns=ram:1M bvnvmf.subsys=nqn.x:a",
        &ONE_DISK,
        "bvnvmf.ns=ram:1M",
        Problem::NamespaceOutsideSubsystem,
    );
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.mib=8 bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:1M",
        &ONE_DISK,
        "bvnvmf.subsys=nqn.x:a",
        Problem::MibWithSubsystems,
    );
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:1M bvnvmf.mib=8",
        &ONE_DISK,
        "bvnvmf.mib=8",
        Problem::MibWithSubsystems,
    );
    let word = format!("bvnvmf.allow={HOST_A}");
    refused(
        &format!("bvnvmf=10.0.0.2 {word} bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:1M"),
        &ONE_DISK,
        &word,
        Problem::AllowOutsideSubsystem,
    );
    // The first subsystem without a namespace is named, wherever the line goes on.
    refused(
        "bvnvmf=10.0.0.2 bvnvmf.subsys=nqn.x:a bvnvmf.ns=ram:1M bvnvmf.subsys=nqn.x:empty bvnvmf.subsys=nqn.x:c bvnvmf.ns=ram:1M",
        &ONE_DISK,
        "bvnvmf.subsys=nqn.x:empty",
        Problem::NoNamespace,
    );
}

/// Seeded word salad from the grammar's own pieces: nothing panics, and whatever is taken
/// keeps the rules (disks exist and back one namespace each, RAM fits, NQNs are unique and
/// well formed, each declared subsystem has a namespace).
#[test]
fn any_word_sequence_is_taken_only_when_it_keeps_the_rules() {
    const GOOD: &[&str] = &[
        "bvnvmf.port=4420",
        "bvnvmf.mib=16",
        "bvnvmf.host=10.0.0.1",
        "bvnvmf.serve=9",
        "bvnvmf.subsys=nqn.x:a",
        "bvnvmf.subsys=nqn.x:b",
        "bvnvmf.subsys=nqn.x:c",
        "bvnvmf.ns=ram:64M",
        "bvnvmf.ns=ram:100M",
        "bvnvmf.ns=ram:4K",
        "bvnvmf.ns=blk:0",
        "bvnvmf.ns=blk:1",
        "bvnvmf.allow=nqn.h:1",
        "bvnvmf.allow=nqn.h:2,nqn.h:3",
        "console=ttyS0",
        "bvirq",
    ];
    const BAD: &[&str] = &[
        "bvnvmf=10.0.0.300",
        "bvnvmf.port=0",
        "bvnvmf.mib=999",
        "bvnvmf.subsys=nqn.2014-08.org.nvmexpress.discovery",
        "bvnvmf.ns=ram:1000",
        "bvnvmf.ns=blk:2",
        "bvnvmf.allow=nqn.h:1,nqn.h:1",
        "bvnvmf.what=1",
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut taken, mut refusals) = (0u32, 0u32);
    for _ in 0..20_000 {
        // The address first most of the time; some lines have none.
        let mut line = String::from(if next() % 16 == 0 {
            ""
        } else {
            "bvnvmf=10.0.0.2/24 "
        });
        for _ in 0..1 + next() % 10 {
            let r = next();
            let w = if r % 32 == 0 {
                BAD[(r / 32 % BAD.len() as u64) as usize]
            } else {
                GOOD[(r / 32 % GOOD.len() as u64) as usize]
            };
            line += w;
            line.push(' ');
        }
        match Config::parse(&line, &TWO_DISKS) {
            Err(e) => {
                refusals += 1;
                assert!(
                    e.word.is_empty() || line.split(' ').any(|w| w == e.word),
                    "{line}: {e}"
                );
            }
            Ok(c) => {
                taken += 1;
                assert!(c.ram_bytes() <= TWO_DISKS.ram_bytes, "{line}");
                let mut disks = [false; 2];
                for (k, s) in c.subsystems.iter().enumerate() {
                    assert!(nqn_ok(s.nqn) && s.nqn != DISCOVERY_NQN, "{line}");
                    assert!(c.subsystems[..k].iter().all(|t| t.nqn != s.nqn), "{line}");
                    assert!(c.built_in || !s.namespaces.is_empty(), "{line}");
                    for m in &s.namespaces {
                        if let Medium::Blk { index } = *m {
                            assert!(!disks[index], "{line}");
                            disks[index] = true;
                        }
                    }
                }
            }
        }
    }
    // Both outcomes are reached often: the salad is not all refusals.
    assert!(
        taken > 500 && refusals > 500,
        "taken {taken}, refused {refusals}"
    );
}
