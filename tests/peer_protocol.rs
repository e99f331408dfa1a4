//! The unikernel's peer mode speaks the pingpong programs' text and the bridge's line
//! protocol: the formats and the data each side must see, checked on the host.

use bareverbs::verbs::Gid;
use bareverbs_unikernel::peer::{Case, Dest, Kind, Line, LineBuf};

/// `shared/linux-peer.md` §1.2's example message, without its NUL.
const EXAMPLE: &str = "0000:000011:3fa2c1:00000000000000000000ffff0a000210";

fn mapped(ip: [u8; 4]) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xFF;
    g[11] = 0xFF;
    g[12..].copy_from_slice(&ip);
    Gid(g)
}

#[test]
fn the_pingpong_text_parses_and_prints_back_byte_for_byte() {
    let d = Dest::parse(EXAMPLE).expect("the sheet's example parses");
    assert_eq!(d.lid, 0);
    assert_eq!(d.qpn, 0x11);
    assert_eq!(d.psn, 0x3fa2c1);
    assert_eq!(d.gid, mapped([10, 0, 2, 16]));
    assert_eq!(d.to_string(), EXAMPLE);
    assert_eq!(d.to_string().len(), 51);
    // Receivers scan hex: upper case is accepted, and printed back in lower case.
    let upper = EXAMPLE.to_ascii_uppercase();
    assert_eq!(Dest::parse(&upper), Some(d));
    // A 24-bit QPN and PSN use all six digits.
    let big = Dest {
        lid: 0,
        qpn: 0xFF_FFFF,
        psn: 0xAB_CDEF,
        gid: mapped([192, 168, 1, 2]),
    };
    assert_eq!(
        big.to_string(),
        "0000:ffffff:abcdef:00000000000000000000ffffc0a80102"
    );
}

#[test]
fn malformed_pingpong_text_is_refused() {
    for bad in [
        "",
        &EXAMPLE[..50],                                        // short
        &format!("{EXAMPLE}0"),                                // long
        "0000-000011:3fa2c1:00000000000000000000ffff0a000210", // separator
        "0000:00001g:3fa2c1:00000000000000000000ffff0a000210", // not hex
        "0000:000011:3fa2c1:00000000000000000000ffff0a00021 ", // space in the GID
        "0000:+00011:3fa2c1:00000000000000000000ffff0a000210", // sign
    ] {
        assert_eq!(Dest::parse(bad), None, "{bad:?}");
    }
}

#[test]
fn cases_take_the_linux_programs_options_and_defaults() {
    let c = Case::parse("rc-server").unwrap();
    assert_eq!(
        (c.kind, c.linux_server, c.size, c.iters, c.rx_depth, c.chk),
        (Kind::Rc, true, 4096, 1000, 500, false)
    );
    let c = Case::parse("ud-client").unwrap();
    assert_eq!((c.kind, c.linux_server, c.size), (Kind::Ud, false, 1024));
    let c = Case::parse("rc-client -s 1 -n 1000 -c -e -g 3 -r 16").unwrap();
    assert_eq!(
        (c.kind, c.linux_server, c.size, c.iters, c.rx_depth, c.chk),
        (Kind::Rc, false, 1, 1000, 16, true)
    );
    for bad in [
        "uc-server",
        "rc-server -s",
        "rc-server -s 0",
        "rc-server -n 0",
        "rc-server -r 1",
        "rc-server -x",
        "rc-server -s 4096x",
    ] {
        assert_eq!(Case::parse(bad), None, "{bad:?}");
    }
    assert_eq!(Case::parse("ud-server").unwrap().payload_offset(), 40);
    assert_eq!(Case::parse("rc-server").unwrap().payload_offset(), 0);
}

#[test]
fn each_side_expects_what_the_echo_delivers() {
    // The unikernel as the client: its own message i comes back.
    let c = Case::parse("rc-server -s 8192 -c").unwrap();
    for i in [0, 1, 999] {
        for k in [0, 1, 4095, 4096, 4097, 8191] {
            assert_eq!(c.expected(i, k), c.pattern(i, k));
        }
    }
    // -c: page offsets are zero (the Linux server checks them), the rest varies per message.
    assert_eq!((c.pattern(3, 0), c.pattern(3, 4096)), (0, 0));
    assert_ne!(c.pattern(3, 1), c.pattern(4, 1));
    // The unikernel as the server: the client's 0x7b buffer first (zeros at page offsets
    // with -c), then the unikernel's previous reply, which the client's buffer received.
    let s = Case::parse("rc-client -s 8192 -c").unwrap();
    assert_eq!(
        (s.expected(0, 0), s.expected(0, 1), s.expected(0, 4096)),
        (0, 0x7B, 0)
    );
    assert_eq!(s.expected(5, 17), s.pattern(4, 17));
    let plain = Case::parse("ud-client -s 1").unwrap();
    assert_eq!(plain.expected(0, 0), 0x7B);
    assert_ne!(
        plain.pattern(0, 0),
        0,
        "without -c the first byte carries data too"
    );
}

struct Script(&'static [u8], String);

impl core::fmt::Write for Script {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.1.push_str(s);
        Ok(())
    }
}

impl Line for Script {
    fn try_get(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
}

#[test]
fn only_whole_prefixed_lines_reach_the_protocol() {
    let long = format!("@@BV {}\n", "x".repeat(200));
    let input: &'static [u8] = Box::leak(
        format!("log line\r\n{long}@@BV PEER {EXAMPLE}\r\n@@BV partial")
            .into_bytes()
            .into_boxed_slice(),
    );
    let mut line = Script(input, String::new());
    let mut lb = LineBuf::default();
    let n = lb.poll(&mut line).expect("a protocol line");
    assert_eq!(lb.text(n), format!("PEER {EXAMPLE}"));
    assert_eq!(
        lb.poll(&mut line),
        None,
        "a line without its newline is not complete"
    );
}
