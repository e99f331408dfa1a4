//! The TCP exchange of `tcp::pingpong` and `tcp::perftest` end to end: two smoltcp stacks on
//! an in-memory Ethernet segment, one playing the unikernel (the module under test), the other
//! a test-only peer that behaves as the C programs do (`docs/roce-v2.md` §10.1; perftest
//! v4.5-0.17): every read is one `read()` of the exact size that must return all of it, the
//! C client connects once, the C server accepts one.
//!
//! Each side runs in its own thread on a real millisecond clock (smoltcp's minimum
//! retransmission timeout is one second, so the lossy cases take a few seconds).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use bareverbs::verbs::Gid;
use bareverbs_hal::{Link, LinkError};
use bareverbs_lab_peers::tcp::perftest::{self, Agreed, Hooks, Key, Latency, Local, Report, Role};
use bareverbs_lab_peers::tcp::pingpong::{self, Dest};
use bareverbs_lab_peers::tcp::{
    Error, Field, FlowError, NetConfig, PORT, Retry, Stack, Step, Storage,
};
use bareverbs_model::link::{Faults, MemLink, Segment};

const UNI_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const LNX_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const UNI_IP: [u8; 4] = [10, 0, 0, 2];
const LNX_IP: [u8; 4] = [10, 0, 0, 1];
/// Every exchange must be over well within this (milliseconds).
const BUDGET: u64 = 60_000;

type Now<'a> = &'a mut dyn FnMut() -> u64;

/// A millisecond clock from zero that yields the CPU a little each call.
fn clock() -> impl FnMut() -> u64 {
    let t0 = Instant::now();
    move || {
        thread::sleep(Duration::from_micros(100));
        t0.elapsed().as_millis() as u64
    }
}

/// Runs `f` with a stack on `link` at `ip`.
fn with_stack<L: Link, R>(
    link: L,
    ip: [u8; 4],
    seed: u64,
    f: impl FnOnce(&mut Stack<'_, L>, Now) -> R,
) -> R {
    let mut storage = Storage::new();
    let mut now = clock();
    let config = NetConfig {
        ip,
        prefix: 24,
        gateway: None,
        seed,
    };
    let t = now();
    let mut stack = Stack::new(link, &mut storage, config, t).expect("stack");
    f(&mut stack, &mut now)
}

fn pair(faults: Option<Faults>) -> (Segment, MemLink, MemLink) {
    let seg = Segment::new();
    let uni = seg.attach(UNI_MAC, 1514);
    let lnx = seg.attach(LNX_MAC, 1514);
    if let Some(f) = faults {
        seg.set_faults(f);
    }
    (seg, uni, lnx)
}

fn uni_dest() -> Dest {
    Dest {
        lid: 0,
        qpn: 0x11,
        psn: 0x12_3456,
        gid: Gid::from_ipv4(UNI_IP),
    }
}

fn lnx_dest() -> Dest {
    Dest {
        lid: 0,
        qpn: 0x2a,
        psn: 0xab_cdef,
        gid: Gid::from_ipv4(LNX_IP),
    }
}

/// One C `read(fd, buf, cap)`: whatever has arrived, at most `cap` bytes.
fn c_read<L: Link>(st: &mut Stack<'_, L>, cap: usize, now: Now) -> Vec<u8> {
    let mut buf = vec![0u8; cap];
    let deadline = now() + BUDGET;
    let n = st.read_once(&mut buf, deadline, now).expect("C read");
    buf.truncate(n);
    buf
}

/// One C `read()` that must return exactly `len` bytes (else the program exits).
fn c_read_exact<L: Link>(st: &mut Stack<'_, L>, len: usize, now: Now) -> Vec<u8> {
    let got = c_read(st, len, now);
    assert_eq!(got.len(), len, "a single read() got a partial message");
    got
}

fn c_write<L: Link>(st: &mut Stack<'_, L>, msg: &[u8], now: Now) {
    let deadline = now() + BUDGET;
    st.write_message(msg, deadline, now).expect("C write");
}

/// C's `close()`: returns at once, the kernel finishes the connection (here: a short
/// linger, so that what was written goes out; a lost last ACK is not waited for).
fn c_close<L: Link>(st: &mut Stack<'_, L>, now: Now) {
    let deadline = now() + 3_000;
    let _ = st.close(deadline, now);
}

/// `ibv_rc_pingpong -g 1` as the server: accept one, read 52, connect the QP, write 52, one
/// read of up to 52 must give exactly `done\0`.
fn c_pingpong_server<L: Link>(st: &mut Stack<'_, L>, now: Now, delay_ms: u64) -> Dest {
    // Starts late: meanwhile the stack answers the unikernel's SYNs with resets.
    let start = now();
    while now() < start + delay_ms {
        let t = now();
        st.poll(t);
    }
    let deadline = now() + BUDGET;
    st.accept(PORT, deadline, now).expect("C accept");
    let m = c_read_exact(st, pingpong::MSG_LEN, now);
    let peer = Dest::parse(&m).expect("C sscanf");
    c_write(st, &lnx_dest().encode().unwrap(), now);
    let done = c_read(st, pingpong::MSG_LEN, now);
    assert_eq!(done, b"done\0");
    c_close(st, now);
    peer
}

/// `ibv_rc_pingpong -g 1 10.0.0.2`: connect once, write 52, read exactly 52, write done.
fn c_pingpong_client<L: Link>(
    st: &mut Stack<'_, L>,
    now: Now,
    hello: &[u8],
) -> Result<Dest, Error> {
    c_pingpong_client_then(st, now, hello, || ())
}

/// The same, calling `on_reply` the moment the server's reply has been read.
fn c_pingpong_client_then<L: Link>(
    st: &mut Stack<'_, L>,
    now: Now,
    hello: &[u8],
    on_reply: impl FnOnce(),
) -> Result<Dest, Error> {
    let deadline = now() + BUDGET;
    let once = Retry {
        tries: 1,
        pause_ms: 0,
    };
    st.connect(UNI_IP, PORT, once, deadline, now)?;
    c_write(st, hello, now);
    let mut m = vec![0u8; pingpong::MSG_LEN];
    let n = st.read_once(&mut m, deadline, now)?;
    assert_eq!(
        n,
        pingpong::MSG_LEN,
        "a single read() got a partial message"
    );
    on_reply();
    let peer = Dest::parse(&m).expect("C sscanf");
    c_write(st, b"done\0", now);
    c_close(st, now);
    Ok(peer)
}

/// The TCP payload lengths of the frames link `who` sent.
fn payloads(seg: &Segment, who: usize) -> Vec<usize> {
    seg.sent()
        .iter()
        .filter(|(from, f)| *from == who && f.len() > 34 && f[12..14] == [0x08, 0x00] && f[23] == 6)
        .map(|(_, f)| {
            let ihl = usize::from(f[14] & 0x0F) * 4;
            let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
            let doff = usize::from(f[14 + ihl + 12] >> 4) * 4;
            total - ihl - doff
        })
        .filter(|&n| n > 0)
        .collect()
}

#[test]
fn pingpong_unikernel_serves_the_c_client() {
    let (seg, uni, lnx) = pair(None);
    let qp_ready = Arc::new(AtomicBool::new(false));
    let (listening, go) = mpsc::channel();
    let ready = qp_ready.clone();
    let u = thread::spawn(move || {
        with_stack(uni, UNI_IP, 1, |st, now| {
            st.listen(PORT).unwrap();
            listening.send(()).unwrap();
            let deadline = now() + BUDGET;
            pingpong::serve(st, PORT, &uni_dest(), deadline, now, |peer| {
                // The QP moves to RTR/RTS here (slowly), before the reply goes out.
                assert_eq!(*peer, lnx_dest());
                thread::sleep(Duration::from_millis(200));
                ready.store(true, Ordering::SeqCst);
                Ok::<(), ()>(())
            })
        })
    });
    go.recv().unwrap();
    let ready = qp_ready.clone();
    let l = thread::spawn(move || {
        with_stack(lnx, LNX_IP, 2, |st, now| {
            let hello = lnx_dest().encode().unwrap();
            // The reply comes only once the server's QP is ready.
            c_pingpong_client_then(st, now, &hello, || assert!(ready.load(Ordering::SeqCst)))
        })
    });
    assert_eq!(l.join().unwrap(), Ok(uni_dest()));
    assert_eq!(u.join().unwrap(), Ok(lnx_dest()));
    assert!(qp_ready.load(Ordering::SeqCst));
    // Every message of the unikernel left in one segment.
    for n in payloads(&seg, 0) {
        assert!(n == pingpong::MSG_LEN, "unikernel segment of {n} bytes");
    }
}

#[test]
fn pingpong_unikernel_connects_to_a_late_c_server() {
    let (seg, uni, lnx) = pair(None);
    let l = thread::spawn(move || {
        with_stack(lnx, LNX_IP, 3, |st, now| c_pingpong_server(st, now, 1500))
    });
    let u = thread::spawn(move || {
        with_stack(uni, UNI_IP, 4, |st, now| {
            let deadline = now() + BUDGET;
            let retry = Retry {
                tries: 50,
                pause_ms: 200,
            };
            pingpong::connect(st, LNX_IP, PORT, retry, &uni_dest(), deadline, now)
        })
    });
    assert_eq!(u.join().unwrap(), Ok(lnx_dest()));
    assert_eq!(l.join().unwrap(), uni_dest());
    let mut sizes = payloads(&seg, 0);
    sizes.sort();
    assert_eq!(sizes, [5, pingpong::MSG_LEN]);
}

#[test]
fn pingpong_connect_gives_up_after_its_tries() {
    // A peer whose stack runs but never listens: every SYN is reset.
    let (_seg, uni, lnx) = pair(None);
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let l = thread::spawn(move || {
        with_stack(lnx, LNX_IP, 5, |st, now| {
            while !s.load(Ordering::SeqCst) {
                let t = now();
                st.poll(t);
            }
        })
    });
    let r = with_stack(uni, UNI_IP, 6, |st, now| {
        let deadline = now() + BUDGET;
        let retry = Retry {
            tries: 3,
            pause_ms: 50,
        };
        let t0 = now();
        let r = pingpong::connect(st, LNX_IP, PORT, retry, &uni_dest(), deadline, now);
        (r, now() - t0)
    });
    stop.store(true, Ordering::SeqCst);
    l.join().unwrap();
    assert_eq!(r.0, Err(Error::Refused));
    assert!(r.1 < 5_000, "took {} ms", r.1);
}

#[test]
fn pingpong_malformed_message_is_rejected_and_the_hook_not_called() {
    let (_seg, uni, lnx) = pair(None);
    let (listening, go) = mpsc::channel();
    let u = thread::spawn(move || {
        with_stack(uni, UNI_IP, 7, |st, now| {
            st.listen(PORT).unwrap();
            listening.send(()).unwrap();
            let deadline = now() + BUDGET;
            let mut called = false;
            let r = pingpong::serve(st, PORT, &uni_dest(), deadline, now, |_| {
                called = true;
                Ok::<(), ()>(())
            });
            (r, called, st.state())
        })
    });
    go.recv().unwrap();
    let l = thread::spawn(move || {
        with_stack(lnx, LNX_IP, 8, |st, now| {
            let mut bad = lnx_dest().encode().unwrap();
            bad[11] = b'-';
            // The unikernel resets instead of replying: the C client's read fails.
            c_pingpong_client(st, now, &bad)
        })
    });
    assert_eq!(l.join().unwrap(), Err(Error::Closed(Step::Read)));
    let (r, called, _) = u.join().unwrap();
    assert_eq!(
        r,
        Err(FlowError::Exchange(Error::Malformed(Field::Separator)))
    );
    assert!(!called);
}

#[test]
fn pingpong_hook_failure_is_returned_and_resets() {
    let (_seg, uni, lnx) = pair(None);
    let (listening, go) = mpsc::channel();
    let u = thread::spawn(move || {
        with_stack(uni, UNI_IP, 9, |st, now| {
            st.listen(PORT).unwrap();
            listening.send(()).unwrap();
            let deadline = now() + BUDGET;
            pingpong::serve(st, PORT, &uni_dest(), deadline, now, |_| Err("RTR refused"))
        })
    });
    go.recv().unwrap();
    let l = thread::spawn(move || {
        with_stack(lnx, LNX_IP, 10, |st, now| {
            c_pingpong_client(st, now, &lnx_dest().encode().unwrap())
        })
    });
    assert_eq!(u.join().unwrap(), Err(FlowError::Hook("RTR refused")));
    assert_eq!(l.join().unwrap(), Err(Error::Closed(Step::Read)));
}

#[test]
fn silent_peers_time_out_within_the_deadline() {
    // Nobody at 10.0.0.9: ARP goes unanswered, the connect times out.
    let (_seg, uni, lnx) = pair(None);
    with_stack(uni, UNI_IP, 11, |st, now| {
        let t0 = now();
        let r = st.connect([10, 0, 0, 9], PORT, Retry::default(), t0 + 800, now);
        let took = now() - t0;
        assert_eq!(r, Err(Error::Timeout(Step::Connect)));
        assert!((800..3_000).contains(&took), "took {took} ms");
        // Nobody connects: the accept times out; the socket can be used again.
        let t0 = now();
        assert_eq!(
            st.accept(PORT, t0 + 300, now),
            Err(Error::Timeout(Step::Accept))
        );
        assert!(now() - t0 < 3_000);
    });
    drop(lnx);
    // A peer that connects and then says nothing: the server's read times out.
    let (_seg, uni, lnx) = pair(None);
    let (listening, go) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let l = thread::spawn(move || {
        go.recv().unwrap();
        with_stack(lnx, LNX_IP, 12, |st, now| {
            let deadline = now() + BUDGET;
            st.connect(UNI_IP, PORT, Retry::default(), deadline, now)
                .unwrap();
            while !s.load(Ordering::SeqCst) {
                let t = now();
                st.poll(t);
            }
        })
    });
    let r = with_stack(uni, UNI_IP, 13, |st, now| {
        st.listen(PORT).unwrap();
        listening.send(()).unwrap();
        let t0 = now();
        let r = pingpong::serve(st, PORT, &uni_dest(), t0 + 1_500, now, |_| Ok::<(), ()>(()));
        (r, now() - t0)
    });
    stop.store(true, Ordering::SeqCst);
    l.join().unwrap();
    assert_eq!(r.0, Err(FlowError::Exchange(Error::Timeout(Step::Read))));
    assert!((1_500..5_000).contains(&r.1), "took {} ms", r.1);
}

// ---------------------------------------------------------------------------------------
// perftest

/// What the C perftest side sends, as raw bytes (so tests can damage any of it).
#[derive(Clone)]
struct CPerf {
    version: [u8; 16],
    page: u32,
    cache: u32,
    mtu: [u8; 2],
    key: [u8; perftest::KEY_LEN],
    /// `-q 2`: the second QP's key.
    key2: Option<[u8; perftest::KEY_LEN]>,
    report: Report,
}

/// What the C side learnt.
#[derive(Debug, PartialEq)]
struct CSaw {
    peer: Key,
    page: u32,
    cache: u32,
    mtu: u8,
    report: Report,
}

fn lnx_key(out_reads: u16) -> Key {
    Key {
        lid: 0,
        out_reads,
        qpn: 0x2a,
        psn: 0x00_beef,
        rkey: 0x0000_1234,
        vaddr: 0x5555_0000_1000,
        gid: Gid::from_ipv4(LNX_IP),
        srqn: 0,
    }
}

fn uni_key(out_reads: u16) -> Key {
    Key {
        lid: 0,
        out_reads,
        qpn: 0x11,
        psn: 0x12_3456,
        rkey: 0x0000_0300,
        vaddr: 0x20_0000,
        gid: Gid::from_ipv4(UNI_IP),
        srqn: 0,
    }
}

fn c_perf(out_reads: u16) -> CPerf {
    let mut version = [0u8; 16];
    version[..4].copy_from_slice(b"6.06");
    CPerf {
        version,
        page: 4096,
        cache: 128,
        // 2048: the agreed MTU is the unikernel's smaller 1024.
        mtu: *b"4\0",
        key: lnx_key(out_reads).encode().unwrap(),
        key2: None,
        report: Report {
            size: 65536,
            iters: 5000,
            bw_peak: 1234.5,
            bw_avg: 1200.25,
            msg_rate: 0.019204,
        },
    }
}

/// One `ctx_xchg_data`: the C client writes then reads; the C server reads then writes.
fn c_xchg<L: Link>(
    st: &mut Stack<'_, L>,
    client: bool,
    mine: &[u8],
    len: usize,
    now: Now,
) -> Result<Vec<u8>, Error> {
    let deadline = now() + BUDGET;
    let mut buf = vec![0u8; len];
    if client {
        st.write_message(mine, deadline, now)?;
    }
    let n = st.read_once(&mut buf, deadline, now)?;
    assert_eq!(n, len, "a single read() got a partial message");
    if !client {
        st.write_message(mine, deadline, now)?;
    }
    Ok(buf)
}

/// `ib_write_bw` / `ib_read_bw` / `ib_atomic_bw` (6.06), bandwidth test, one QP, as client
/// (connects once) or server, after `delay_ms`.
fn c_perftest<L: Link>(
    st: &mut Stack<'_, L>,
    now: Now,
    client: bool,
    c: &CPerf,
    delay_ms: u64,
) -> Result<CSaw, Error> {
    let start = now();
    while now() < start + delay_ms {
        let t = now();
        st.poll(t);
    }
    let deadline = now() + BUDGET;
    if client {
        let once = Retry {
            tries: 1,
            pause_ms: 0,
        };
        st.connect(UNI_IP, PORT, once, deadline, now)?;
    } else {
        st.accept(PORT, deadline, now)?;
    }
    let v = c_xchg(st, client, &c.version, 16, now)?;
    assert_eq!(perftest::parse_version(&v), Ok(606));
    let p = c_xchg(st, client, &c.page.to_be_bytes(), 4, now)?;
    let l = c_xchg(st, client, &c.cache.to_be_bytes(), 4, now)?;
    let m = c_xchg(st, client, &c.mtu, 2, now)?;
    assert_eq!(m[1], 0);
    let k = c_xchg(st, client, &c.key, perftest::KEY_LEN, now)?;
    let peer = Key::parse(&k).expect("C parses the key");
    // -q 2: each QP's key, before connecting and after; then the first's barriers.
    let k2 = match &c.key2 {
        Some(m) => Some(c_xchg(st, client, m, perftest::KEY_LEN, now)?),
        None => None,
    };
    assert_eq!(c_xchg(st, client, &c.key, perftest::KEY_LEN, now)?, k);
    if let (Some(m), Some(k2)) = (&c.key2, &k2) {
        assert_eq!(&c_xchg(st, client, m, perftest::KEY_LEN, now)?, k2);
        let peer2 = Key::parse(k2).expect("C parses the second key");
        assert_ne!(peer2.qpn, peer.qpn, "two QPs");
    }
    for _ in 0..2 {
        assert_eq!(c_xchg(st, client, &c.key, perftest::KEY_LEN, now)?, k);
    }
    let mut w = [0u64; 5];
    let mine = [
        c.report.size,
        c.report.iters,
        c.report.bw_peak.to_bits(),
        c.report.bw_avg.to_bits(),
        c.report.msg_rate.to_bits(),
    ];
    for (x, y) in mine.iter().zip(w.iter_mut()) {
        *y = u64::from_be_bytes(
            c_xchg(st, client, &x.to_be_bytes(), 8, now)?
                .try_into()
                .unwrap(),
        );
    }
    assert_eq!(c_xchg(st, client, &c.key, perftest::KEY_LEN, now)?, k);
    c_write(st, b"done\0", now);
    c_close(st, now);
    Ok(CSaw {
        peer,
        page: c.page.max(u32::from_be_bytes(p.try_into().unwrap())),
        cache: c.cache.max(u32::from_be_bytes(l.try_into().unwrap())),
        mtu: (c.mtu[0] - b'0').min(m[0] - b'0'),
        report: Report {
            size: w[0],
            iters: w[1],
            bw_peak: f64::from_bits(w[2]),
            bw_avg: f64::from_bits(w[3]),
            msg_rate: f64::from_bits(w[4]),
        },
    })
}

/// The unikernel's hooks: record the order of calls and what they were given.
#[derive(Default)]
struct Recorder {
    calls: Vec<&'static str>,
    agreed: Option<Agreed>,
    report: Report,
    fail_connect: bool,
    /// QPs connected.
    qps: usize,
}

impl Hooks for Recorder {
    type Error = &'static str;

    fn connect(&mut self, peers: &[Key], agreed: &Agreed) -> Result<(), &'static str> {
        self.qps = peers.len();
        for peer in peers {
            assert_eq!(peer.gid, Gid::from_ipv4(LNX_IP));
        }
        self.calls.push("connect");
        self.agreed = Some(*agreed);
        if self.fail_connect {
            return Err("modify QP failed");
        }
        Ok(())
    }

    fn data_phase(&mut self, peers: &[Key]) -> Result<Report, &'static str> {
        assert_eq!(peers.len(), self.qps);
        self.calls.push("data");
        Ok(self.report)
    }
}

fn uni_report() -> Report {
    Report {
        size: 65536,
        iters: 5000,
        bw_peak: 98.75,
        bw_avg: 97.5,
        msg_rate: 0.00156,
    }
}

type UniResult = (
    Result<perftest::Outcome, FlowError<&'static str>>,
    Vec<&'static str>,
);

/// Runs one perftest exchange: the unikernel in `role_client` (true: it connects), the C side
/// the other role, on `seg`'s links `uni` / `lnx`.
fn perftest_run<L: Link + Send + 'static>(
    uni: L,
    lnx: MemLink,
    uni_client: bool,
    out_reads: u16,
    c: CPerf,
    fail_connect: bool,
) -> (UniResult, Result<CSaw, Error>) {
    let (listening, go) = mpsc::channel();
    let u = thread::spawn(move || {
        with_stack(uni, UNI_IP, 21, |st, now| {
            let role = if uni_client {
                Role::Client {
                    server: LNX_IP,
                    retry: Retry {
                        tries: 50,
                        pause_ms: 100,
                    },
                }
            } else {
                st.listen(PORT).unwrap();
                Role::Server
            };
            listening.send(()).unwrap();
            let mut hooks = Recorder {
                report: uni_report(),
                fail_connect,
                ..Recorder::default()
            };
            let local = Local::new(uni_key(out_reads));
            let deadline = now() + BUDGET;
            let r = perftest::run(st, role, PORT, &local, &mut hooks, deadline, now);
            if let Ok(o) = &r {
                assert_eq!(hooks.agreed, Some(o.agreed));
            }
            (r, hooks.calls)
        })
    });
    go.recv().unwrap();
    let l = thread::spawn(move || {
        // As the server the C side starts late, so that the unikernel retries.
        with_stack(lnx, LNX_IP, 22, |st, now| {
            c_perftest(st, now, !uni_client, &c, if uni_client { 700 } else { 0 })
        })
    });
    (u.join().unwrap(), l.join().unwrap())
}

fn check_perftest((uni, c): (UniResult, Result<CSaw, Error>), out_reads: u16) {
    let (r, calls) = uni;
    let o = r.expect("unikernel side");
    let c = c.expect("C side");
    assert_eq!(calls, ["connect", "data"]);
    assert_eq!(o.peer, lnx_key(out_reads));
    let agreed = Agreed {
        peer_version: 606,
        page_size: 4096,
        cache_line: 128,
        mtu: 3,
    };
    assert_eq!(o.agreed, agreed);
    assert_eq!(o.peer_report, c_perf(out_reads).report);
    assert_eq!(
        c,
        CSaw {
            peer: uni_key(out_reads),
            page: 4096,
            cache: 128,
            mtu: 3,
            report: uni_report(),
        }
    );
}

#[test]
fn perftest_write_bw_linux_serves() {
    let (seg, uni, lnx) = pair(None);
    check_perftest(perftest_run(uni, lnx, true, 1, c_perf(1), false), 1);
    // Each of the unikernel's messages in one segment of its own size.
    for n in payloads(&seg, 0) {
        assert!(
            [16, 4, 2, perftest::KEY_LEN, 8, 5].contains(&n),
            "unikernel segment of {n} bytes"
        );
    }
}

#[test]
fn perftest_read_bw_linux_connects() {
    let (seg, uni, lnx) = pair(None);
    check_perftest(perftest_run(uni, lnx, false, 128, c_perf(128), false), 128);
    for n in payloads(&seg, 0) {
        assert!(
            [16, 4, 2, perftest::KEY_LEN, 8, 5].contains(&n),
            "unikernel segment of {n} bytes"
        );
    }
}

/// `ib_write_bw -q 2`: each QP's key before the QPs connect and again after, the barriers
/// on the first's; the unikernel's hooks get both peers' keys, in order. With `-b` too (the
/// same messages: a sync barrier where the "finished" one was, the data phase after it on
/// both sides).
#[test]
fn perftest_two_qps_both_roles() {
    for (uni_client, duplex) in [(true, false), (false, false), (true, true), (false, true)] {
        let (_seg, uni, lnx) = pair(None);
        let mut c = c_perf(1);
        let mut second = lnx_key(1);
        second.qpn += 1;
        second.vaddr += 0x1_0000;
        c.key2 = Some(second.encode().unwrap());
        let (listening, go) = mpsc::channel();
        let u = thread::spawn(move || {
            with_stack(uni, UNI_IP, 41, |st, now| {
                let role = if uni_client {
                    Role::Client {
                        server: LNX_IP,
                        retry: Retry {
                            tries: 50,
                            pause_ms: 100,
                        },
                    }
                } else {
                    st.listen(PORT).unwrap();
                    Role::Server
                };
                listening.send(()).unwrap();
                let mut hooks = Recorder {
                    report: uni_report(),
                    ..Recorder::default()
                };
                let mut k2 = uni_key(1);
                k2.qpn += 1;
                let local = Local::with_qps(&[uni_key(1), k2]).unwrap();
                let deadline = now() + BUDGET;
                let r = if duplex {
                    perftest::run_bidirectional(st, role, PORT, &local, &mut hooks, deadline, now)
                } else {
                    perftest::run(st, role, PORT, &local, &mut hooks, deadline, now)
                };
                (r, hooks.calls, hooks.qps)
            })
        });
        go.recv().unwrap();
        let l = thread::spawn(move || {
            with_stack(lnx, LNX_IP, 42, |st, now| {
                c_perftest(st, now, !uni_client, &c, if uni_client { 700 } else { 0 })
            })
        });
        let (r, calls, qps) = u.join().unwrap();
        let o = r.expect("unikernel side");
        assert_eq!((calls, qps), (vec!["connect", "data"], 2));
        assert_eq!(&o.peers[..2], &[lnx_key(1), second]);
        assert_eq!(l.join().unwrap().expect("C side").report, uni_report());
    }
    assert_eq!(Local::with_qps(&[]), None);
    assert_eq!(Local::with_qps(&[uni_key(1); 5]), None);
}

/// `ib_send_bw` (6.06), `-q 2`, as the C client (connects once) or server: each QP's key, the
/// first's, each QP's again, the sync, (`-b`: the five report words), the closing barrier and
/// `done`. Returns the unikernel's keys and report words as the C side got them.
fn c_send_bw<L: Link>(
    st: &mut Stack<'_, L>,
    now: Now,
    client: bool,
    keys: &[[u8; perftest::KEY_LEN]; 2],
    duplex: bool,
) -> Result<(Vec<Key>, [u64; 5]), Error> {
    let deadline = now() + BUDGET;
    if client {
        let once = Retry {
            tries: 1,
            pause_ms: 0,
        };
        st.connect(UNI_IP, PORT, once, deadline, now)?;
    } else {
        st.accept(PORT, deadline, now)?;
    }
    let c = c_perf(1);
    c_xchg(st, client, &c.version, 16, now)?;
    c_xchg(st, client, &c.page.to_be_bytes(), 4, now)?;
    c_xchg(st, client, &c.cache.to_be_bytes(), 4, now)?;
    c_xchg(st, client, &c.mtu, 2, now)?;
    let mut theirs = Vec::new();
    for k in keys {
        theirs.push(c_xchg(st, client, k, perftest::KEY_LEN, now)?);
    }
    assert_eq!(
        c_xchg(st, client, &keys[0], perftest::KEY_LEN, now)?,
        theirs[0]
    );
    for (k, t) in keys.iter().zip(&theirs) {
        assert_eq!(&c_xchg(st, client, k, perftest::KEY_LEN, now)?, t);
    }
    assert_eq!(
        c_xchg(st, client, &keys[0], perftest::KEY_LEN, now)?,
        theirs[0]
    );
    let mut w = [0u64; 5];
    if duplex {
        for x in w.iter_mut() {
            let b = c_xchg(st, client, &7u64.to_be_bytes(), 8, now)?;
            *x = u64::from_be_bytes(b.try_into().unwrap());
        }
    }
    assert_eq!(
        c_xchg(st, client, &keys[0], perftest::KEY_LEN, now)?,
        theirs[0]
    );
    c_write(st, b"done\0", now);
    c_close(st, now);
    Ok((theirs.iter().map(|k| Key::parse(k).unwrap()).collect(), w))
}

/// `ib_send_bw -q 2`, with and without `-b`, both roles: the unikernel's data phase runs on
/// both sides after the sync; the reports go only with `-b`.
#[test]
fn perftest_send_bw_both_roles() {
    for (uni_client, duplex) in [(true, false), (false, false), (true, true), (false, true)] {
        let (_seg, uni, lnx) = pair(None);
        let mut second = lnx_key(1);
        second.qpn += 1;
        let lnx_keys = [lnx_key(1).encode().unwrap(), second.encode().unwrap()];
        let (listening, go) = mpsc::channel();
        let u = thread::spawn(move || {
            with_stack(uni, UNI_IP, 51, |st, now| {
                let role = if uni_client {
                    Role::Client {
                        server: LNX_IP,
                        retry: Retry {
                            tries: 50,
                            pause_ms: 100,
                        },
                    }
                } else {
                    st.listen(PORT).unwrap();
                    Role::Server
                };
                listening.send(()).unwrap();
                let mut hooks = Recorder {
                    report: uni_report(),
                    ..Recorder::default()
                };
                let mut k2 = uni_key(1);
                k2.qpn += 1;
                let local = Local::with_qps(&[uni_key(1), k2]).unwrap();
                let deadline = now() + BUDGET;
                let r =
                    perftest::run_send(st, role, PORT, &local, &mut hooks, duplex, deadline, now);
                (r, hooks.calls, hooks.qps)
            })
        });
        go.recv().unwrap();
        let l = thread::spawn(move || {
            with_stack(lnx, LNX_IP, 52, |st, now| {
                c_send_bw(st, now, !uni_client, &lnx_keys, duplex)
            })
        });
        let (r, calls, qps) = u.join().unwrap();
        let o = r.unwrap_or_else(|e| panic!("{uni_client} {duplex}: {e:?}"));
        assert_eq!((calls, qps), (vec!["connect", "data"], 2));
        assert_eq!(&o.peers[..2], &[lnx_key(1), second]);
        let (keys, words) = l.join().unwrap().expect("C side");
        assert_eq!(keys[0], uni_key(1));
        assert_eq!(keys[1].qpn, uni_key(1).qpn + 1);
        if duplex {
            assert_eq!(words, uni_report().words());
            assert_eq!(o.peer_report.words(), [7; 5]);
        } else {
            assert_eq!(o.peer_report, Report::default());
        }
    }
}

#[test]
fn perftest_atomic_bw_both_roles() {
    for uni_client in [true, false] {
        let (_seg, uni, lnx) = pair(None);
        check_perftest(
            perftest_run(uni, lnx, uni_client, 16, c_perf(16), false),
            16,
        );
    }
}

/// Damage done to the C side's messages.
type Damage = fn(&mut CPerf);

#[test]
fn perftest_rejects_what_6_06_would() {
    let cases: [(&str, Damage, Error); 5] = [
        (
            "old version",
            |c| c.version[..4].copy_from_slice(b"5.60"),
            Error::Version(560),
        ),
        (
            "unterminated version",
            |c| c.version = [b'6'; 16],
            Error::Malformed(Field::Version),
        ),
        ("bad MTU", |c| c.mtu = *b"9\0", Error::Malformed(Field::Mtu)),
        (
            "bad key",
            |c| c.key[20] = b'?',
            Error::Malformed(Field::Psn),
        ),
        (
            "GID of the other family",
            |c| {
                let mut k = lnx_key(1);
                k.gid = Gid([0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
                c.key = k.encode().unwrap();
            },
            Error::GidFamily,
        ),
    ];
    for (what, damage, want) in cases {
        for uni_client in [true, false] {
            let (_seg, uni, lnx) = pair(None);
            let mut c = c_perf(1);
            damage(&mut c);
            let ((r, calls), csaw) = perftest_run(uni, lnx, uni_client, 1, c, false);
            assert_eq!(r, Err(FlowError::Exchange(want)), "{what}");
            // Refused before the QP was touched; the C side saw the connection go.
            assert!(calls.is_empty(), "{what}");
            assert!(matches!(csaw, Err(Error::Closed(_))), "{what}: {csaw:?}");
        }
    }
}

#[test]
fn perftest_connect_hook_failure_resets() {
    let (_seg, uni, lnx) = pair(None);
    let ((r, calls), csaw) = perftest_run(uni, lnx, false, 1, c_perf(1), true);
    assert_eq!(r, Err(FlowError::Hook("modify QP failed")));
    assert_eq!(calls, ["connect"]);
    assert!(matches!(csaw, Err(Error::Closed(_))));
}

// ---------------------------------------------------------------------------------------
// A damaged link and a busy NIC

#[test]
fn lossy_link_still_completes_every_exchange() {
    // Both roles of each protocol over the lossy segment, two seeds.
    let mut dropped = 0;
    for seed in [0x5EED_0001u64, 0x5EED_0002] {
        // 5 % of the frames dropped, 1 % delivered twice, 1 % delivered late.
        let faults = Faults {
            drop: 50,
            duplicate: 10,
            reorder: 10,
            seed,
        };
        let (seg, uni, lnx) = pair(Some(faults));
        check_perftest(
            perftest_run(uni, lnx, seed % 2 == 0, 1, c_perf(1), false),
            1,
        );
        dropped += seg.damage().0;

        let (seg, uni, lnx) = pair(Some(faults));
        let l = thread::spawn(move || {
            with_stack(lnx, LNX_IP, 3, |st, now| c_pingpong_server(st, now, 300))
        });
        let r = with_stack(uni, UNI_IP, seed, |st, now| {
            let deadline = now() + BUDGET;
            pingpong::connect(
                st,
                LNX_IP,
                PORT,
                Retry::default(),
                &uni_dest(),
                deadline,
                now,
            )
        });
        assert_eq!(r, Ok(lnx_dest()));
        assert_eq!(l.join().unwrap(), uni_dest());
        dropped += seg.damage().0;

        let (seg, uni, lnx) = pair(Some(faults));
        let (listening, go) = mpsc::channel();
        let u = thread::spawn(move || {
            with_stack(uni, UNI_IP, seed, |st, now| {
                st.listen(PORT).unwrap();
                listening.send(()).unwrap();
                let deadline = now() + BUDGET;
                pingpong::serve(st, PORT, &uni_dest(), deadline, now, |_| Ok::<(), ()>(()))
            })
        });
        go.recv().unwrap();
        let hello = lnx_dest().encode().unwrap();
        let c = with_stack(lnx, LNX_IP, 4, |st, now| c_pingpong_client(st, now, &hello));
        assert_eq!(c, Ok(uni_dest()));
        assert_eq!(u.join().unwrap(), Ok(lnx_dest()));
        dropped += seg.damage().0;
    }
    // The segment did drop frames (about 5 %), and TCP made up for them.
    assert!(dropped > 0);
}

/// A NIC whose transmit ring is full every third time.
struct Busy {
    inner: MemLink,
    calls: u32,
}

impl Link for Busy {
    fn mac(&self) -> [u8; 6] {
        self.inner.mac()
    }
    fn max_frame(&self) -> usize {
        self.inner.max_frame()
    }
    fn transmit(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        self.calls += 1;
        if self.calls.is_multiple_of(3) {
            return Err(LinkError::Busy);
        }
        self.inner.transmit(frame)
    }
    fn receive(&mut self, buf: &mut [u8]) -> Option<usize> {
        self.inner.receive(buf)
    }
}

#[test]
fn busy_transmit_ring_defers_frames_instead_of_losing_them() {
    let (_seg, uni, lnx) = pair(None);
    let (listening, go) = mpsc::channel();
    let u = thread::spawn(move || {
        let link = Busy {
            inner: uni,
            calls: 0,
        };
        with_stack(link, UNI_IP, 31, |st, now| {
            st.listen(PORT).unwrap();
            listening.send(()).unwrap();
            let deadline = now() + BUDGET;
            let r = pingpong::serve(st, PORT, &uni_dest(), deadline, now, |_| Ok::<(), ()>(()));
            (r, st.counts())
        })
    });
    go.recv().unwrap();
    let l = thread::spawn(move || {
        with_stack(lnx, LNX_IP, 32, |st, now| {
            c_pingpong_client(st, now, &lnx_dest().encode().unwrap())
        })
    });
    assert_eq!(l.join().unwrap(), Ok(uni_dest()));
    let (r, counts) = u.join().unwrap();
    assert_eq!(r, Ok(lnx_dest()));
    assert!(counts.tx_deferred > 0, "{counts:?}");
    // Every deferred frame went out later: none was dropped or refused.
    assert_eq!((counts.tx_dropped, counts.tx_errors), (0, 0));
}

#[test]
fn bad_configuration_is_refused() {
    let seg = Segment::new();
    let cfg = |ip, prefix| NetConfig {
        ip,
        prefix,
        gateway: None,
        seed: 0,
    };
    for (mac, c) in [
        ([0x03, 0, 0, 0, 0, 1], cfg(UNI_IP, 24)),
        ([0; 6], cfg(UNI_IP, 24)),
        (UNI_MAC, cfg([0, 0, 0, 0], 24)),
        (UNI_MAC, cfg([224, 0, 0, 1], 24)),
        (UNI_MAC, cfg([255, 255, 255, 255], 24)),
        (UNI_MAC, cfg(UNI_IP, 33)),
        (UNI_MAC, cfg(UNI_IP, 0)),
    ] {
        let mut storage = Storage::new();
        let r = Stack::new(seg.attach(mac, 1514), &mut storage, c, 0);
        assert!(matches!(r, Err(Error::Config)), "{mac:?} {c:?}");
    }
    let mut storage = Storage::new();
    let tiny = seg.attach(UNI_MAC, 589);
    assert!(matches!(
        Stack::new(tiny, &mut storage, cfg(UNI_IP, 24), 0),
        Err(Error::Config)
    ));
    let mut storage = Storage::new();
    let gw = NetConfig {
        gateway: Some([255, 255, 255, 255]),
        ..cfg(UNI_IP, 24)
    };
    assert!(matches!(
        Stack::new(seg.attach(UNI_MAC, 1514), &mut storage, gw, 0),
        Err(Error::Config)
    ));
    let mut storage = Storage::new();
    let gw = NetConfig {
        gateway: Some([10, 0, 0, 254]),
        ..cfg(UNI_IP, 24)
    };
    assert!(Stack::new(seg.attach(UNI_MAC, 590), &mut storage, gw, 0).is_ok());
    assert_eq!(
        NetConfig::from_cidr("10.0.0.2/24", 7),
        Some(cfg(UNI_IP, 24)).map(|c| NetConfig { seed: 7, ..c })
    );
    assert_eq!(
        NetConfig::from_cidr("192.168.1.20", 0).map(|c| (c.ip, c.prefix)),
        Some(([192, 168, 1, 20], 24))
    );
    for bad in [
        "10.0.0/24",
        "10.0.0.256/24",
        "10.0.0.2/",
        "10.0.0.2/x",
        "a.b.c.d",
        "",
    ] {
        assert_eq!(NetConfig::from_cidr(bad, 0), None, "{bad}");
    }
}

/// A refused case whose Linux program connects: the one connection is accepted and reset, the
/// program's first read fails at once (not at its timeout), and the peer is free for the next
/// case's listener.
#[test]
fn a_refused_case_resets_the_linux_client() {
    use bareverbs_lab_peers::tcp::refuse::{LinuxSide, refuse};
    let (_seg, uni, lnx) = pair(None);
    let (listening, go) = mpsc::channel();
    let u = thread::spawn(move || {
        with_stack(uni, UNI_IP, 21, |st, now| {
            st.listen(PORT).unwrap();
            listening.send(()).unwrap();
            let deadline = now() + BUDGET;
            let r = refuse(
                st,
                LinuxSide::Connects,
                LNX_IP,
                Retry::default(),
                1_500,
                deadline,
                now,
            );
            // The next case listens on the same port: nothing of the refused one is in the way.
            (r, st.listen(PORT))
        })
    });
    go.recv().unwrap();
    let l = thread::spawn(move || {
        with_stack(lnx, LNX_IP, 22, |st, now| {
            let t0 = now();
            let deadline = t0 + BUDGET;
            st.connect(UNI_IP, PORT, Retry::default(), deadline, now)
                .expect("connects");
            let mut m = [0u8; 16];
            (st.read_exact(&mut m, deadline, now), now() - t0)
        })
    });
    let (read, ms) = l.join().unwrap();
    assert!(matches!(read, Err(Error::Closed(_))), "{read:?}");
    assert!(ms < 10_000, "the client's read failed only after {ms} ms");
    let (r, again) = u.join().unwrap();
    assert_eq!(r, Ok(1));
    assert_eq!(again, Ok(()));
}

/// A refused case whose Linux program listens (and starts late): the peer connects once it
/// listens and resets the connection; the program's read fails.
#[test]
fn a_refused_case_resets_the_linux_server() {
    use bareverbs_lab_peers::tcp::refuse::{LinuxSide, refuse};
    let (_seg, uni, lnx) = pair(None);
    let l = thread::spawn(move || {
        with_stack(lnx, LNX_IP, 23, |st, now| {
            thread::sleep(Duration::from_millis(800));
            let deadline = now() + BUDGET;
            // The connection is reset either before this stack's poll saw it established
            // (accept ends closed; likely on a loaded machine) or after (the read does).
            st.accept(PORT, deadline, now)?;
            let mut m = [0u8; 16];
            st.read_exact(&mut m, deadline, now)
        })
    });
    let r = with_stack(uni, UNI_IP, 24, |st, now| {
        let deadline = now() + BUDGET;
        let retry = Retry {
            tries: 50,
            pause_ms: 100,
        };
        refuse(st, LinuxSide::Listens, LNX_IP, retry, 1_500, deadline, now)
    });
    assert_eq!(r, Ok(1));
    let read = l.join().unwrap();
    assert!(matches!(read, Err(Error::Closed(_))), "{read:?}");
}

/// Nobody shows up: the refusal ends at its deadline, with nothing left open.
#[test]
fn a_refused_case_whose_linux_side_never_comes_times_out() {
    use bareverbs_lab_peers::tcp::refuse::{LinuxSide, refuse};
    let (_seg, uni, _lnx) = pair(None);
    let r = with_stack(uni, UNI_IP, 25, |st, now| {
        let deadline = now() + 300;
        let r = refuse(
            st,
            LinuxSide::Connects,
            LNX_IP,
            Retry::default(),
            100,
            deadline,
            now,
        );
        (r, st.listen(PORT))
    });
    assert!(matches!(r.0, Err(Error::Timeout(_))), "{:?}", r.0);
    assert_eq!(r.1, Ok(()));
}

/// A latency program (6.06), one QP, as the C client (connects once) or server:
/// `ib_read_lat` / `ib_atomic_lat` send the key twice before the QPs connect, twice after,
/// then (the client's test) the closing barrier and `done`; `ib_write_lat` the same without
/// the closing barrier and `done` (it just ends); `ib_send_lat` once before, three times
/// after, then the closing barrier and `done`. No "finished" barrier, no reports.
/// `second_key`: what it sends as its second key message (its own key, unless a test makes it
/// differ).
fn c_perftest_lat<L: Link>(
    st: &mut Stack<'_, L>,
    now: Now,
    client: bool,
    c: &CPerf,
    second_key: &[u8],
    which: Latency,
) -> Result<Key, Error> {
    let deadline = now() + BUDGET;
    if client {
        let once = Retry {
            tries: 1,
            pause_ms: 0,
        };
        st.connect(UNI_IP, PORT, once, deadline, now)?;
    } else {
        st.accept(PORT, deadline, now)?;
    }
    c_xchg(st, client, &c.version, 16, now)?;
    c_xchg(st, client, &c.page.to_be_bytes(), 4, now)?;
    c_xchg(st, client, &c.cache.to_be_bytes(), 4, now)?;
    c_xchg(st, client, &c.mtu, 2, now)?;
    let k = c_xchg(st, client, &c.key, perftest::KEY_LEN, now)?;
    if which != Latency::Send {
        assert_eq!(c_xchg(st, client, second_key, perftest::KEY_LEN, now)?, k);
    }
    let after = if which == Latency::Send { 3 } else { 2 };
    for _ in 0..after {
        assert_eq!(c_xchg(st, client, &c.key, perftest::KEY_LEN, now)?, k);
    }
    if which == Latency::Write {
        // No closing barrier: the unikernel's side ends with its connection, nothing more.
        let mut rest = [0u8; 16];
        assert_eq!(
            st.read_once(&mut rest, now() + BUDGET, now),
            Err(Error::Closed(Step::Read))
        );
    } else {
        assert_eq!(c_xchg(st, client, &c.key, perftest::KEY_LEN, now)?, k);
        c_write(st, b"done\0", now);
    }
    c_close(st, now);
    Ok(Key::parse(&k).expect("C parses the key"))
}

fn perftest_lat_run(
    uni_client: bool,
    second_key: Vec<u8>,
    which: Latency,
) -> (UniResult, Result<Key, Error>) {
    let (_seg, uni, lnx) = pair(None);
    let (listening, go) = mpsc::channel();
    let u = thread::spawn(move || {
        with_stack(uni, UNI_IP, 31, |st, now| {
            let role = if uni_client {
                Role::Client {
                    server: LNX_IP,
                    retry: Retry {
                        tries: 50,
                        pause_ms: 100,
                    },
                }
            } else {
                st.listen(PORT).unwrap();
                Role::Server
            };
            listening.send(()).unwrap();
            let mut hooks = Recorder::default();
            let local = Local::new(uni_key(16));
            let deadline = now() + BUDGET;
            let r = if which == Latency::ReadAtomic {
                perftest::run_lat(st, role, PORT, &local, &mut hooks, deadline, now)
            } else {
                perftest::run_latency(st, role, PORT, &local, &mut hooks, which, deadline, now)
            };
            (r, hooks.calls)
        })
    });
    go.recv().unwrap();
    let l = thread::spawn(move || {
        with_stack(lnx, LNX_IP, 32, |st, now| {
            c_perftest_lat(st, now, !uni_client, &c_perf(16), &second_key, which)
        })
    });
    (u.join().unwrap(), l.join().unwrap())
}

#[test]
fn perftest_read_lat_both_roles() {
    let own = c_perf(16).key.to_vec();
    // The unikernel serves (ib_read_lat's client READs its buffer): no data phase of its own.
    let ((r, calls), c) = perftest_lat_run(false, own.clone(), Latency::ReadAtomic);
    let o = r.expect("unikernel side");
    assert_eq!(calls, ["connect"]);
    assert_eq!(o.peer, lnx_key(16));
    assert_eq!(o.peer_report, Report::default());
    assert_eq!(c.expect("C side"), uni_key(16));
    // The unikernel as the client: its test runs before the closing barrier.
    let ((r, calls), c) = perftest_lat_run(true, own, Latency::ReadAtomic);
    assert_eq!(r.expect("unikernel side").peer, lnx_key(16));
    assert_eq!(calls, ["connect", "data"]);
    assert_eq!(c.expect("C side"), uni_key(16));
}

/// `ib_write_lat` and `ib_send_lat`: both sides ping-pong, so the unikernel's data phase runs
/// in either role, after the last barrier; ib_write_lat ends without a closing barrier,
/// ib_send_lat with one and `done` (the C side checks each: a message too many or too few
/// fails its exact reads).
#[test]
fn perftest_write_and_send_lat_both_roles() {
    let own = c_perf(16).key.to_vec();
    for which in [Latency::Write, Latency::Send] {
        for uni_client in [false, true] {
            let ((r, calls), c) = perftest_lat_run(uni_client, own.clone(), which);
            let o = r.unwrap_or_else(|e| panic!("{which:?} {uni_client}: {e:?}"));
            assert_eq!(calls, ["connect", "data"], "{which:?} {uni_client}");
            assert_eq!(o.peer, lnx_key(16));
            assert_eq!(o.peer_report, Report::default());
            assert_eq!(c.expect("C side"), uni_key(16));
        }
    }
}

#[test]
fn perftest_lat_second_key_must_be_the_first() {
    let mut other = lnx_key(16);
    other.qpn += 1;
    let ((r, calls), _) =
        perftest_lat_run(false, other.encode().unwrap().to_vec(), Latency::ReadAtomic);
    assert!(
        matches!(r, Err(FlowError::Exchange(Error::Malformed(Field::Qpn)))),
        "{r:?}"
    );
    // The QP is never connected to a peer that named two.
    assert!(calls.is_empty(), "{calls:?}");
}

/// A refused case's Linux client that runs again (three times, a pause between): every
/// connection is accepted and reset, the refusal ends only once none came for its quiet time,
/// and the next case's listener meets none of them.
#[test]
fn a_refused_case_resets_a_linux_client_that_runs_again() {
    use bareverbs_lab_peers::tcp::refuse::{LinuxSide, refuse};
    let (_seg, uni, lnx) = pair(None);
    let (listening, go) = mpsc::channel();
    let u = thread::spawn(move || {
        with_stack(uni, UNI_IP, 26, |st, now| {
            st.listen(PORT).unwrap();
            listening.send(()).unwrap();
            let deadline = now() + BUDGET;
            refuse(
                st,
                LinuxSide::Connects,
                LNX_IP,
                Retry::default(),
                1_500,
                deadline,
                now,
            )
        })
    });
    go.recv().unwrap();
    let l = thread::spawn(move || {
        with_stack(lnx, LNX_IP, 27, |st, now| {
            let mut reads = Vec::new();
            for _ in 0..3 {
                let deadline = now() + BUDGET;
                st.connect(UNI_IP, PORT, Retry::default(), deadline, now)
                    .expect("connects");
                let mut m = [0u8; 16];
                reads.push(st.read_exact(&mut m, deadline, now));
                st.abort();
                thread::sleep(Duration::from_millis(500));
            }
            reads
        })
    });
    for read in l.join().unwrap() {
        assert!(matches!(read, Err(Error::Closed(_))), "{read:?}");
    }
    assert_eq!(u.join().unwrap(), Ok(3));
}
