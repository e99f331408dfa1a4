//! The unikernel's peer mode speaks the pingpong programs' text and the bridge's line
//! protocol: the formats and the data each side must see, checked on the host. Also what the
//! real stack showed the lab that the model now does too.

#[path = "../../../tests/common/mod.rs"]
mod common;

use bareverbs::verbs::*;
use bareverbs_lab_peers::peer::{Case, Dest, Kind, Line, LineBuf, UD_QKEY, grh_ok};
use bareverbs_model::{Model, Semantics};
use common::*;

/// `docs/roce-v2.md` §10.1's example message, without its NUL.
const EXAMPLE: &str = "0000:000011:3fa2c1:00000000000000000000ffff0a000210";

/// The message as it travels: the text and its NUL.
fn msg(text: &str) -> Vec<u8> {
    let mut m = text.as_bytes().to_vec();
    m.push(0);
    m
}

#[test]
fn the_pingpong_text_parses_and_prints_back_byte_for_byte() {
    let d = Dest::parse(&msg(EXAMPLE)).expect("the documented example parses");
    assert_eq!(d.lid, 0);
    assert_eq!(d.qpn, 0x11);
    assert_eq!(d.psn, 0x3fa2c1);
    assert_eq!(d.gid, Gid::from_ipv4([10, 0, 2, 16]));
    assert_eq!(d.encode().unwrap().to_vec(), msg(EXAMPLE));
    // Receivers scan hex: upper case is accepted, and printed back in lower case.
    let upper = EXAMPLE.to_ascii_uppercase();
    assert_eq!(Dest::parse(&msg(&upper)), Ok(d));
    // A 24-bit QPN and PSN use all six digits.
    let big = Dest {
        lid: 0,
        qpn: 0xFF_FFFF,
        psn: 0xAB_CDEF,
        gid: Gid::from_ipv4([192, 168, 1, 2]),
    };
    assert_eq!(
        big.encode().unwrap().to_vec(),
        msg("0000:ffffff:abcdef:00000000000000000000ffffc0a80102")
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
        assert!(Dest::parse(&msg(bad)).is_err(), "{bad:?}");
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

/// In the lab, a UD receive between IPv4-mapped GIDs (Linux's ud_pingpong on rxe0 and the
/// unikernel on pvrdma) held 20 zero bytes and then the packet's IPv4 header in its 40-byte
/// GRH area, not an IPv6 GRH: the model writes the same.
#[test]
fn a_ud_receive_between_ipv4_mapped_gids_starts_with_rxe_s_ipv4_header() {
    for semantics in [Semantics::Verbs, Semantics::Qemu] {
        let model = Model::new(bareverbs_model::ModelConfig {
            semantics,
            ..Default::default()
        });
        let ctx = up(&model);
        exchange(&ctx, semantics);
        teardown(&model, ctx);
    }
}

fn exchange(ctx: &Ctx, semantics: Semantics) {
    // Dropped in reverse: the QPs, then the pool, CQ, PD, and the GIDs last.
    {
        let (linux, unikernel) = (
            Gid::from_ipv4([10, 0, 2, 15]),
            Gid::from_ipv4([10, 0, 2, 16]),
        );
        let _g0 = ctx.bind_gid(0, linux).unwrap();
        let _g1 = ctx.bind_gid(1, unikernel).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let pool = pd.buffer_pool(4, 1024 + 40).unwrap();
        let ud = || {
            pd.qp_builder(&cq, &cq)
                .pool(&pool)
                .build::<Ud>()
                .unwrap()
                .ready(UD_QKEY, 0)
                .unwrap()
        };
        let (mut a, mut b) = (ud(), ud());
        b.post_recv(1, pool.alloc().unwrap()).unwrap();
        // From the unikernel's GID (index 1) to the Linux side's.
        let ah = pd.create_ah(&AddressVector::new(linux, 1)).unwrap();
        let mut msg = pool.alloc().unwrap();
        msg.set_len(1024).unwrap();
        msg.as_mut_slice().fill(0x7B);
        a.post_send_to(2, msg, (&ah, b.qp_num(), UD_QKEY)).unwrap();
        let r = b.poll_one().unwrap().expect("the datagram");
        assert_eq!((r.wc.byte_len, r.wc.src_qp), (40 + 1024, a.qp_num()));
        assert!(r.wc.flags.contains(WcFlags::GRH));
        let buf = r.buf.as_ref().unwrap().as_slice();
        assert_eq!(buf[..20], [0; 20], "{semantics:?}");
        let ip = &buf[20..40];
        assert_eq!((ip[0], ip[1]), (0x45, 0), "IPv4, 20-byte header, TOS 0");
        let total = 20 + 8 + 12 + 8 + 1024 + 4; // IP, UDP, BTH, DETH, payload, ICRC
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), total);
        assert_eq!((ip[6], ip[8], ip[9]), (0x40, 64, 17), "DF, TTL 64, UDP");
        assert_eq!(
            (&ip[12..16], &ip[16..20]),
            (&[10, 0, 2, 16][..], &[10, 0, 2, 15][..])
        );
        assert!(buf[40..].iter().all(|&x| x == 0x7B));
        // The unikernel's check accepts it, and only from the right source to the right
        // destination.
        assert!(grh_ok(buf, &unikernel, &linux));
        assert!(!grh_ok(buf, &linux, &unikernel));
        assert!(!grh_ok(buf, &unikernel, &Gid::from_ipv4([10, 0, 2, 17])));
        drop(r);
        drop(a.poll_one().unwrap().expect("the send completion"));
    }
}

#[test]
fn the_grh_check_takes_the_bytes_the_lab_showed() {
    // ud-server's first receive in the lab (Linux at 10.0.2.15 to the unikernel at .16).
    let hex = "000000000000000000000000000000000000000045000434e8664000401100000a00020f0a000210";
    let grh: Vec<u8> = (0..40)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let (linux, unikernel) = (
        Gid::from_ipv4([10, 0, 2, 15]),
        Gid::from_ipv4([10, 0, 2, 16]),
    );
    assert!(grh_ok(&grh, &linux, &unikernel));
    assert!(!grh_ok(&grh, &unikernel, &linux));
    assert!(!grh_ok(&grh[..39], &linux, &unikernel));
    let mut v6 = grh.clone();
    v6[0] = 0x60;
    assert!(
        !grh_ok(&v6, &linux, &unikernel),
        "an IPv6 header where rxe writes IPv4"
    );
}

/// In the lab QEMU logged "rdma: CQ is full" for every CQE past the 1024th while the driver
/// only polled and never drained the CQ-notification ring (1024 entries): QEMU then skips the
/// notification and the interrupt, not the CQE. The model does the same and counts them. An
/// arm drains the ring first, so the armed CQ's interrupt comes.
#[test]
fn past_1024_cqes_the_undrained_notification_ring_is_full_until_an_arm_drains_it() {
    let model = Model::new(Default::default());
    let ctx = up(&model);
    ping_pong_until_the_ring_is_full(&model, &ctx);
    teardown(&model, ctx);
}

type P = bareverbs::device::pvrdma::Pvrdma<Model>;
type Qp<'a, S> = QueuePair<'a, P, Rc, S>;

fn connect<'a>(qp: Qp<'a, Reset>, peer: u32, gid: Gid) -> Qp<'a, Rts> {
    rc_up(qp, peer, gid, AccessFlags::empty())
}

/// One SEND from `a` to `b`: two CQEs, the receive's and the send's.
fn one<'a>(pool: &'a BufferPool<'a, P>, a: &mut Qp<'a, Rts>, b: &mut Qp<'a, Rts>) {
    b.post_recv(1, pool.alloc().unwrap()).unwrap();
    let mut m = pool.alloc().unwrap();
    m.set_len(8).unwrap();
    a.post_send(2, m).unwrap();
    let r = b.poll_one().unwrap().expect("the receive");
    assert_eq!(r.wc.status, WcStatus::Success);
    let s = a.poll_one().unwrap().expect("the send");
    assert_eq!(s.wc.status, WcStatus::Success);
}

fn ping_pong_until_the_ring_is_full(model: &Model, ctx: &Ctx) {
    let g = ctx.bind_gid(0, Gid::from_ipv4([10, 0, 2, 16])).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let pool = pd.buffer_pool(8, 64).unwrap();
    let rc = || pd.qp_builder(&cq, &cq).pool(&pool).build::<Rc>().unwrap();
    let (a, b) = (rc(), rc());
    let (qa, qb) = (a.qp_num(), b.qp_num());
    let (mut a, mut b) = (connect(a, qb, g.gid()), connect(b, qa, g.gid()));
    // Armed while the ring has room: an interrupt.
    cq.req_notify(false).expect("arm");
    one(&pool, &mut a, &mut b);
    assert_eq!(model.counters().2, 1);
    assert_eq!(model.notify_ring_full(), 0);
    while model.counters().1 < 1024 + 100 {
        one(&pool, &mut a, &mut b);
    }
    assert_eq!(model.notify_ring_full(), model.counters().1 - 1024);
    // Arming takes what the ring holds first: the device has room again and interrupts.
    let full = model.notify_ring_full();
    cq.req_notify(false).expect("arm");
    one(&pool, &mut a, &mut b);
    assert_eq!(model.counters().2, 2, "the armed CQ's interrupt");
    assert_eq!(
        model.notify_ring_full(),
        full,
        "nothing dropped after the drain"
    );
    assert_eq!(ctx.irq_counts().notifications, 1024);
}

/// In the lab an RC receive's completion carried the GRH flag and source QP 0: QEMU hands
/// over rxe's completion, and on RoCE every packet has a GRH (the verbs only define both
/// fields for UD). The model does the same under `Semantics::Qemu`; under `Semantics::Verbs`
/// it keeps the flag for UD only and names the sender.
#[test]
fn an_rc_receive_on_qemu_carries_the_grh_flag_and_source_qp_0() {
    for semantics in [Semantics::Verbs, Semantics::Qemu] {
        let model = Model::new(bareverbs_model::ModelConfig {
            semantics,
            ..Default::default()
        });
        let ctx = up(&model);
        {
            let g = ctx.bind_gid(0, Gid::from_ipv4([10, 0, 2, 16])).unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(64).unwrap();
            let pool = pd.buffer_pool(4, 64).unwrap();
            let rc = || pd.qp_builder(&cq, &cq).pool(&pool).build::<Rc>().unwrap();
            let (a, b) = (rc(), rc());
            let (qa, qb) = (a.qp_num(), b.qp_num());
            let (mut a, mut b) = (connect(a, qb, g.gid()), connect(b, qa, g.gid()));
            b.post_recv(1, pool.alloc().unwrap()).unwrap();
            let mut m = pool.alloc().unwrap();
            m.set_len(8).unwrap();
            a.post_send(2, m).unwrap();
            let r = b.poll_one().unwrap().expect("the receive");
            let qemu = semantics == Semantics::Qemu;
            assert_eq!(
                (r.wc.flags.contains(WcFlags::GRH), r.wc.src_qp),
                (qemu, if qemu { 0 } else { qa }),
                "{semantics:?}"
            );
            drop(r);
            drop(a.poll_one().unwrap().expect("the send"));
        }
        teardown(&model, ctx);
    }
}
