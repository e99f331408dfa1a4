//! The fw_cfg file reader on a device played here: a well-formed directory, and a host that
//! lies: no signature, a count past the bound, names without their NUL, a size past the
//! buffer, bytes that are not UTF-8, a file shorter than its entry claims.

use bareverbs_platform::fw_cfg::{
    FwCfgError, MAX_FILES, NAME_MAX, Ports, find, read_file, read_text,
};

/// A device: items by key, a selected item and the offset in it.
struct Dev {
    items: Vec<(u16, Vec<u8>)>,
    at: (u16, usize),
    reads: usize,
}

impl Ports for Dev {
    fn select(&mut self, key: u16) {
        self.at = (key, 0);
    }
    fn read(&mut self) -> u8 {
        self.reads += 1;
        let (key, off) = self.at;
        self.at.1 += 1;
        self.items
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.get(off).copied())
            .unwrap_or(0)
    }
}

fn entry(size: u32, key: u16, name: &[u8]) -> Vec<u8> {
    let mut e = Vec::new();
    e.extend_from_slice(&size.to_be_bytes());
    e.extend_from_slice(&key.to_be_bytes());
    e.extend_from_slice(&[0, 0]);
    let mut n = [0u8; NAME_MAX];
    n[..name.len()].copy_from_slice(name);
    e.extend_from_slice(&n);
    e
}

/// A device whose directory claims `count` entries and lists `entries`, with `files`.
fn dev(count: u32, entries: &[Vec<u8>], files: &[(u16, &[u8])]) -> Dev {
    let mut dir = count.to_be_bytes().to_vec();
    entries.iter().for_each(|e| dir.extend_from_slice(e));
    let mut items = vec![(0x0000, b"QEMU".to_vec()), (0x0019, dir)];
    items.extend(files.iter().map(|(k, v)| (*k, v.to_vec())));
    Dev {
        items,
        at: (0, 0),
        reads: 0,
    }
}

const LIST: &[u8] = b"rc-server,-n,5+read,-s,65536\n";

fn lab_device() -> Dev {
    dev(
        3,
        &[
            entry(4, 0x20, b"etc/boot-fail-wait"),
            entry(LIST.len() as u32, 0x21, b"opt/bareverbs/roce-cases"),
            entry(2, 0x22, b"opt/other"),
        ],
        &[(0x20, &[0, 0, 0, 0]), (0x21, LIST), (0x22, b"no")],
    )
}

#[test]
fn a_file_by_name() {
    let mut d = lab_device();
    assert_eq!(find(&mut d, "opt/bareverbs/roce-cases"), Ok((0x21, 29)));
    let mut buf = [0u8; 64];
    assert_eq!(
        read_file(&mut d, "opt/bareverbs/roce-cases", &mut buf),
        Ok(LIST)
    );
    // Text: UTF-8, the newline at the end trimmed.
    assert_eq!(
        read_text(&mut d, "opt/bareverbs/roce-cases", &mut buf),
        Ok("rc-server,-n,5+read,-s,65536")
    );
    assert_eq!(read_text(&mut d, "opt/other", &mut buf), Ok("no"));
    // A prefix of a name is not the name.
    assert_eq!(
        find(&mut d, "opt/bareverbs/roce"),
        Err(FwCfgError::NotFound)
    );
    assert_eq!(find(&mut d, "opt/none"), Err(FwCfgError::NotFound));
}

#[test]
fn a_file_of_many_kilobytes() {
    // The case list of a matrix that no longer fits on a command line: 64 KiB read whole.
    let big: Vec<u8> = (0..65536u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut d = dev(
        1,
        &[entry(big.len() as u32, 0x30, b"opt/bareverbs/roce-cases")],
        &[(0x30, &big)],
    );
    let mut buf = vec![0u8; 65536];
    let t = read_text(&mut d, "opt/bareverbs/roce-cases", &mut buf).expect("reads");
    assert_eq!(t.as_bytes(), &big[..]);
}

#[test]
fn names_that_cannot_be_asked_for() {
    let mut d = lab_device();
    assert_eq!(find(&mut d, ""), Err(FwCfgError::BadName));
    let long = "o".repeat(NAME_MAX);
    assert_eq!(find(&mut d, &long), Err(FwCfgError::BadName));
    // The longest name that fits with its NUL is found.
    let fits = "p".repeat(NAME_MAX - 1);
    let mut d = dev(1, &[entry(1, 0x20, fits.as_bytes())], &[(0x20, b"x")]);
    assert_eq!(find(&mut d, &fits), Ok((0x20, 1)));
}

#[test]
fn no_device() {
    let mut d = lab_device();
    d.items[0].1 = b"QEMV".to_vec();
    let mut buf = [0u8; 64];
    assert_eq!(
        read_text(&mut d, "opt/other", &mut buf),
        Err(FwCfgError::NoDevice)
    );
    // Nothing at all on the ports (they read 0).
    let mut none = Dev {
        items: vec![],
        at: (0, 0),
        reads: 0,
    };
    assert_eq!(find(&mut none, "opt/other"), Err(FwCfgError::NoDevice));
    assert_eq!(none.reads, 4, "only the signature is read");
}

#[test]
fn a_directory_count_past_the_bound_is_not_followed() {
    // The host claims 4 billion entries and lists one: the reader stops after MAX_FILES.
    let mut d = dev(u32::MAX, &[entry(2, 0x22, b"opt/other")], &[(0x22, b"no")]);
    let mut buf = [0u8; 8];
    assert_eq!(read_text(&mut d, "opt/other", &mut buf), Ok("no"));
    d.reads = 0;
    assert_eq!(
        find(&mut d, "opt/missing"),
        Err(FwCfgError::Directory { count: u32::MAX })
    );
    assert_eq!(
        d.reads,
        4 + 4 + MAX_FILES as usize * 64,
        "signature, count, then MAX_FILES entries, no more"
    );
    // A count of exactly the bound that lacks the file: plainly not found.
    let mut d = dev(MAX_FILES, &[], &[]);
    assert_eq!(find(&mut d, "opt/missing"), Err(FwCfgError::NotFound));
}

#[test]
fn a_name_without_its_nul_matches_nothing() {
    // 56 bytes of name and no NUL: the entry is skipped, the next one still found.
    let mut unterminated = entry(2, 0x20, b"");
    unterminated[8..].fill(b'o');
    let mut d = dev(
        2,
        &[unterminated, entry(2, 0x21, b"opt/other")],
        &[(0x20, b"xx"), (0x21, b"ok")],
    );
    let name = "o".repeat(NAME_MAX - 1);
    assert_eq!(find(&mut d, &name), Err(FwCfgError::NotFound));
    let mut buf = [0u8; 8];
    assert_eq!(read_text(&mut d, "opt/other", &mut buf), Ok("ok"));
}

#[test]
fn a_file_larger_than_the_buffer_is_refused_unread() {
    let mut d = dev(
        1,
        &[entry(u32::MAX, 0x20, b"opt/huge")],
        &[(0x20, b"whatever")],
    );
    let mut buf = [0u8; 4096];
    d.reads = 0;
    assert_eq!(
        read_file(&mut d, "opt/huge", &mut buf),
        Err(FwCfgError::TooLarge {
            size: u32::MAX,
            max: 4096
        })
    );
    assert_eq!(d.reads, 4 + 4 + 64, "the file's bytes are not read");
    // One byte over the buffer: refused too; exactly the buffer: read.
    let mut d = dev(1, &[entry(5, 0x20, b"opt/f")], &[(0x20, b"abcde")]);
    let mut four = [0u8; 4];
    assert_eq!(
        read_file(&mut d, "opt/f", &mut four),
        Err(FwCfgError::TooLarge { size: 5, max: 4 })
    );
    let mut five = [0u8; 5];
    assert_eq!(read_file(&mut d, "opt/f", &mut five), Ok(&b"abcde"[..]));
}

#[test]
fn bytes_that_are_not_utf8() {
    let mut d = dev(1, &[entry(6, 0x20, b"opt/bad")], &[(0x20, b"rc\xff\xfe-s")]);
    let mut buf = [0u8; 16];
    assert_eq!(
        read_text(&mut d, "opt/bad", &mut buf),
        Err(FwCfgError::NotUtf8 { at: 2 })
    );
}

#[test]
fn a_file_shorter_than_its_entry_reads_zeros_not_other_memory() {
    // The entry claims 8 bytes, the item holds 3: the device reads 0 past its end, and the
    // reader returns exactly the claimed 8 bytes of the caller's buffer.
    let mut d = dev(1, &[entry(8, 0x20, b"opt/short")], &[(0x20, b"abc")]);
    let mut buf = [0xAAu8; 16];
    assert_eq!(
        read_file(&mut d, "opt/short", &mut buf),
        Ok(&b"abc\0\0\0\0\0"[..])
    );
    assert_eq!(buf[8..], [0xAA; 8], "nothing past the claimed size written");
}

#[test]
fn errors_say_what_is_wrong() {
    assert_eq!(
        FwCfgError::TooLarge {
            size: 70000,
            max: 65536
        }
        .to_string(),
        "the fw_cfg file has 70000 bytes, more than 65536"
    );
    assert_eq!(
        FwCfgError::NotUtf8 { at: 2 }.to_string(),
        "the fw_cfg file is not UTF-8 (byte 2)"
    );
    assert!(FwCfgError::NoDevice.to_string().contains("QEMU"));
}
