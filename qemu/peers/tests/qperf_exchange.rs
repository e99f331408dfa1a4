//! qperf's control connection (`tcp::qperf`) end to end: two smoltcp stacks on an in-memory
//! Ethernet segment, the unikernel with recording hooks against a test-only peer that sends
//! and expects what qperf 0.4.11 does (`docs/qperf.md`): as the server, the 200-byte request,
//! the CM port, the nodes, the synchronizations, the statistics, `quit`, requests refused; as
//! the client, the request it sends, the server's statistics, a CM port that is no port,
//! `quit`.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use bareverbs_hal::Link;
use bareverbs_lab_peers::tcp::qperf::{
    self, ClientHooks, Counts, Error as QError, Failure, Hooks, Node, Request, Stat, Test,
};
use bareverbs_lab_peers::tcp::{Error, NetConfig, Retry, Stack, Step, Storage};
use bareverbs_model::link::{MemLink, Segment};

const UNI_IP: [u8; 4] = [10, 0, 0, 2];
const LNX_IP: [u8; 4] = [10, 0, 0, 1];
const BUDGET: u64 = 60_000;

type Now<'a> = &'a mut dyn FnMut() -> u64;

fn clock() -> impl FnMut() -> u64 {
    let t0 = Instant::now();
    move || {
        thread::sleep(Duration::from_micros(100));
        t0.elapsed().as_millis() as u64
    }
}

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

fn pair() -> (Segment, MemLink, MemLink) {
    let seg = Segment::new();
    let uni = seg.attach([2, 0, 0, 0, 0, 2], 1514);
    let lnx = seg.attach([2, 0, 0, 0, 0, 1], 1514);
    (seg, uni, lnx)
}

/// What qperf's client sends for `qperf -cm1 -t 2 <test>` (index in qperf's table), with
/// the bandwidth tests' message size.
fn request(index: u16) -> Request {
    sized(index, 65536)
}

/// As [`request`], with `msg_size` (1 for the latency tests, 0 for the atomics: qperf's
/// client sends no size for them).
fn sized(index: u16, msg_size: u32) -> Request {
    let mut b = [0u8; qperf::REQ_LEN];
    b[..8].copy_from_slice(&[0, 0, 4, 0, 11, 0, index as u8, (index >> 8) as u8]);
    let mut put = |i: usize, v: u32| b[8 + 4 * i..12 + 4 * i].copy_from_slice(&v.to_le_bytes());
    put(4, msg_size);
    put(13, 2); // time
    put(14, 5); // timeout
    put(15, 1); // use_cm
    Request::decode(&b)
}

const LNX_NODE: Node = Node {
    vaddr: 0x5555_0000_1000,
    lid: 0,
    qpn: 0,
    psn: 0,
    srqn: 0,
    rkey: 0x1234,
    alt_lid: 0,
    rd_atomic: 128,
};

const UNI_NODE: Node = Node {
    vaddr: 0x8000_0000,
    lid: 0,
    qpn: 0,
    psn: 0,
    srqn: 0,
    rkey: 0xabcd,
    alt_lid: 0,
    rd_atomic: 1,
};

fn uni_stat() -> Stat {
    Stat {
        max_cqes: 2,
        elapsed_ms: 2_000,
        sent: Counts::default(),
        received: Counts {
            bytes: 65536 * 10,
            msgs: 10,
            errs: 0,
        },
    }
}

/// The unikernel's hooks: record the order of the calls and the client's node.
#[derive(Default)]
struct Recorder {
    calls: Vec<&'static str>,
    peer: Option<Node>,
    now: Option<Box<dyn FnMut() -> u64 + Send>>,
}

impl Hooks for Recorder {
    type Error = ();
    fn now(&mut self) -> u64 {
        (self.now.as_mut().expect("clock"))()
    }
    fn listen(&mut self, test: Test, req: &Request) -> Result<u16, ()> {
        assert_eq!(req.time, 2);
        self.calls.push(test.name());
        Ok(19766)
    }
    fn accept(&mut self) -> Result<Node, ()> {
        self.calls.push("accept");
        Ok(UNI_NODE)
    }
    fn run(&mut self, peer: &Node) -> Result<Stat, ()> {
        self.calls.push("run");
        self.peer = Some(*peer);
        Ok(uni_stat())
    }
    fn finish(&mut self) -> Result<(), ()> {
        self.calls.push("finish");
        Ok(())
    }
}

/// What the unikernel's side returned, and its hooks' record.
type Served = (Result<(Request, Test, Option<Stat>), Failure<()>>, Recorder);

/// The unikernel serves one connection in a thread (listening before it returns).
fn serve(uni: MemLink) -> thread::JoinHandle<Served> {
    let (listening, go) = mpsc::channel();
    let h = thread::spawn(move || {
        with_stack(uni, UNI_IP, 1, |st, _| {
            st.listen(qperf::PORT).unwrap();
            listening.send(()).unwrap();
            let mut rec = Recorder {
                now: Some(Box::new(clock())),
                ..Recorder::default()
            };
            let deadline = rec.now() + BUDGET;
            let r = qperf::serve(st, &mut rec, deadline);
            (r, rec)
        })
    });
    go.recv().unwrap();
    h
}

fn c_connect<L: Link>(st: &mut Stack<'_, L>, now: Now) {
    let deadline = now() + BUDGET;
    let retry = Retry {
        tries: 5,
        pause_ms: 200,
    };
    st.connect(UNI_IP, qperf::PORT, retry, deadline, now)
        .expect("connect");
}

fn c_write<L: Link>(st: &mut Stack<'_, L>, msg: &[u8], now: Now) {
    let deadline = now() + BUDGET;
    st.write_message(msg, deadline, now).expect("C write");
}

fn c_read<L: Link>(st: &mut Stack<'_, L>, len: usize, now: Now) -> Result<Vec<u8>, Error> {
    let mut b = vec![0u8; len];
    let deadline = now() + BUDGET;
    st.read_exact(&mut b, deadline, now)?;
    Ok(b)
}

#[test]
fn an_rc_test_runs_every_step_in_qperfs_order() {
    // rc_bw; rc_bi_bw (both send); rc_fetch_add_mr, whose request has no message size;
    // rc_rdma_write_poll_lat (1 byte).
    for (req, test) in [
        (request(13), Test::RcBw),
        (request(12), Test::RcBiBw),
        (sized(15, 0), Test::RcFetchAddMr),
        (sized(21, 1), Test::RcRdmaWritePollLat),
    ] {
        runs_every_step(req, test);
    }
}

fn runs_every_step(req: Request, test: Test) {
    let (_seg, uni, lnx) = pair();
    let u = serve(uni);
    let saw = with_stack(lnx, LNX_IP, 2, |st, now| {
        c_connect(st, now);
        c_write(st, &req.encode(), now);
        let port = c_read(st, 4, now).unwrap();
        c_write(st, &LNX_NODE.encode(), now);
        let node = c_read(st, qperf::NODE_LEN, now).unwrap();
        c_write(st, qperf::SYNC_BEFORE, now);
        let sync = c_read(st, qperf::SYNC_BEFORE.len(), now).unwrap();
        let stat = c_read(st, qperf::STAT_LEN, now).unwrap();
        c_write(st, qperf::SYNC_AFTER, now);
        let deadline = now() + 3_000;
        let _ = st.close(deadline, now);
        (port, node, sync, stat)
    });
    let (port, node, sync, stat) = saw;
    assert_eq!(port, 19766u32.to_le_bytes(), "{test:?}");
    assert_eq!(node, UNI_NODE.encode());
    assert_eq!(sync, qperf::SYNC_BEFORE);
    assert_eq!(stat, uni_stat().encode());
    let (r, rec) = u.join().unwrap();
    assert_eq!(r, Ok((req, test, Some(uni_stat()))));
    assert_eq!(rec.calls, [test.name(), "accept", "run", "finish"]);
    assert_eq!(rec.peer, Some(LNX_NODE));
}

#[test]
fn quit_is_its_synchronization_then_the_clients_close() {
    let (_seg, uni, lnx) = pair();
    let u = serve(uni);
    let sync = with_stack(lnx, LNX_IP, 2, |st, now| {
        c_connect(st, now);
        c_write(st, &request(1).encode(), now);
        c_write(st, qperf::SYNC_BEFORE, now);
        let sync = c_read(st, qperf::SYNC_BEFORE.len(), now).unwrap();
        let deadline = now() + 3_000;
        let _ = st.close(deadline, now);
        sync
    });
    assert_eq!(sync, qperf::SYNC_BEFORE);
    let (r, rec) = u.join().unwrap();
    assert_eq!(r.map(|(_, t, s)| (t, s)), Ok((Test::Quit, None)));
    assert!(rec.calls.is_empty());
}

#[test]
fn a_request_it_does_not_run_resets_the_connection_and_calls_no_hook() {
    for (index, want) in [
        (29, QError::Unsupported("ud_bw")),
        (22, QError::Unsupported("uc_bi_bw")),
        (31, QError::Unsupported("ver_rc_compare_swap")),
        (40, QError::Index(40)),
    ] {
        let (_seg, uni, lnx) = pair();
        let u = serve(uni);
        let got = with_stack(lnx, LNX_IP, 2, |st, now| {
            c_connect(st, now);
            c_write(st, &request(index).encode(), now);
            // qperf's client waits for the CM port: the connection is reset instead.
            c_read(st, 4, now)
        });
        assert_eq!(got, Err(Error::Closed(Step::Read)));
        let (r, rec) = u.join().unwrap();
        assert_eq!(r, Err(Failure::Qperf(want)));
        assert!(rec.calls.is_empty());
    }
}

#[test]
fn a_synchronization_that_is_not_qperfs_fails_the_test() {
    let (_seg, uni, lnx) = pair();
    let u = serve(uni);
    with_stack(lnx, LNX_IP, 2, |st, now| {
        c_connect(st, now);
        c_write(st, &request(16).encode(), now);
        c_read(st, 4, now).unwrap();
        c_write(st, &LNX_NODE.encode(), now);
        c_read(st, qperf::NODE_LEN, now).unwrap();
        c_write(st, b"synchronization before TEST", now);
        let deadline = now() + 3_000;
        let _ = st.close(deadline, now);
    });
    let (r, rec) = u.join().unwrap();
    assert_eq!(r, Err(Failure::Qperf(QError::Sync)));
    // The test never ran.
    assert_eq!(rec.calls, ["rc_lat", "accept"]);
}

/// The unikernel's hooks as qperf's client.
struct ClientRecorder {
    calls: Vec<String>,
    peer: Option<Node>,
    now: Box<dyn FnMut() -> u64 + Send>,
}

impl ClientHooks for ClientRecorder {
    type Error = ();
    fn now(&mut self) -> u64 {
        (self.now)()
    }
    fn connect(&mut self, port: u16) -> Result<Node, ()> {
        self.calls.push(format!("connect {port}"));
        Ok(UNI_NODE)
    }
    fn run(&mut self, peer: &Node) -> Result<Stat, ()> {
        self.calls.push("run".into());
        self.peer = Some(*peer);
        Ok(Stat::default())
    }
    fn finish(&mut self) -> Result<(), ()> {
        self.calls.push("finish".into());
        Ok(())
    }
}

/// qperf's server for one test: accept, the request, the CM port (`port`), the nodes, the
/// sync, its statistics, the last sync.
fn c_server<L: Link>(st: &mut Stack<'_, L>, now: Now, port: u32) -> Request {
    let deadline = now() + BUDGET;
    st.accept(qperf::PORT, deadline, now).expect("accept");
    let req = c_read(st, qperf::REQ_LEN, now).unwrap();
    let req = Request::decode(&req.try_into().unwrap());
    c_write(st, &port.to_le_bytes(), now);
    c_write(st, &LNX_NODE.encode(), now);
    let node = c_read(st, qperf::NODE_LEN, now).unwrap();
    assert_eq!(node, UNI_NODE.encode());
    c_write(st, qperf::SYNC_BEFORE, now);
    assert_eq!(
        c_read(st, qperf::SYNC_BEFORE.len(), now).unwrap(),
        qperf::SYNC_BEFORE
    );
    c_write(st, &uni_stat().encode(), now);
    assert_eq!(
        c_read(st, qperf::SYNC_AFTER.len(), now).unwrap(),
        qperf::SYNC_AFTER
    );
    let deadline = now() + 3_000;
    let _ = st.close(deadline, now);
    req
}

/// What the unikernel's client returned, its hooks' record, the request the server took.
type ClientRun = (
    Result<(Stat, Stat), Failure<()>>,
    ClientRecorder,
    Option<Request>,
);

/// The unikernel as the client against `c_server` naming CM port `port`.
fn client_pair(port: u32) -> ClientRun {
    let (_seg, uni, lnx) = pair();
    let (listening, go) = mpsc::channel();
    let l = thread::spawn(move || {
        with_stack(lnx, LNX_IP, 2, |st, now| {
            st.listen(qperf::PORT).unwrap();
            listening.send(()).unwrap();
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c_server(st, now, port))).ok()
        })
    });
    go.recv().unwrap();
    let (r, rec) = with_stack(uni, UNI_IP, 1, |st, _| {
        let mut rec = ClientRecorder {
            calls: Vec::new(),
            peer: None,
            now: Box::new(clock()),
        };
        let deadline = rec.now() + BUDGET;
        let req = Request::new(Test::RcRdmaWriteBw, 4096, 3, 20);
        let retry = Retry {
            tries: 5,
            pause_ms: 200,
        };
        let r = qperf::run_client(st, LNX_IP, retry, &req, &mut rec, deadline);
        (r, rec)
    });
    (r, rec, l.join().unwrap())
}

#[test]
fn as_the_client_it_sends_qperfs_request_and_takes_the_servers_statistics() {
    let (r, rec, req) = client_pair(40_000);
    assert_eq!(r, Ok((Stat::default(), uni_stat())));
    assert_eq!(rec.calls, ["connect 40000", "run", "finish"]);
    assert_eq!(rec.peer, Some(LNX_NODE));
    // What qperf's server decodes: 0.4.11, rc_rdma_write_bw (19), -m, -t, -to, -cm1.
    let req = req.expect("the server's side");
    assert_eq!(req.version, (0, 4, 11));
    assert_eq!(req.index, 19);
    assert_eq!(
        (req.msg_size, req.time, req.timeout, req.use_cm),
        (4096, 3, 20, 1)
    );
    assert_eq!(req.test(), Ok(Test::RcRdmaWriteBw));
}

#[test]
fn a_cm_port_that_is_no_port_ends_the_test_before_any_hook() {
    for port in [0, 65_536] {
        let (r, rec, _) = client_pair(port);
        assert_eq!(r, Err(Failure::Qperf(QError::Port(port))));
        assert!(rec.calls.is_empty());
    }
}

#[test]
fn as_the_client_it_ends_the_server_with_quit() {
    let (_seg, uni, lnx) = pair();
    let (listening, go) = mpsc::channel();
    // qperf's server child for `quit`: the request, the synchronization, then a read that
    // ends with the client's close.
    let l = thread::spawn(move || {
        with_stack(lnx, LNX_IP, 2, |st, now| {
            st.listen(qperf::PORT).unwrap();
            listening.send(()).unwrap();
            let deadline = now() + BUDGET;
            st.accept(qperf::PORT, deadline, now).expect("accept");
            let req = c_read(st, qperf::REQ_LEN, now).unwrap();
            let req = Request::decode(&req.try_into().unwrap());
            c_write(st, qperf::SYNC_BEFORE, now);
            let sync = c_read(st, qperf::SYNC_BEFORE.len(), now).unwrap();
            let mut b = [0u8; 8];
            let end = st.read_once(&mut b, deadline, now);
            let _ = st.close(now() + 3_000, now);
            (req, sync, end)
        })
    });
    go.recv().unwrap();
    let r = with_stack(uni, UNI_IP, 1, |st, now| {
        let deadline = now() + BUDGET;
        let retry = Retry {
            tries: 5,
            pause_ms: 200,
        };
        qperf::quit(st, LNX_IP, retry, deadline, now)
    });
    assert_eq!(r, Ok(()));
    let (req, sync, end) = l.join().unwrap();
    assert_eq!(req.version, (0, 4, 11));
    assert_eq!(req.test(), Ok(Test::Quit));
    assert_eq!(sync, qperf::SYNC_BEFORE);
    // Nothing more came: the client closed.
    assert_eq!(end, Err(Error::Closed(Step::Read)));
}
