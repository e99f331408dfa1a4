//! The unikernel's perftest `-R` server (`cm_peer`, cases `ib_send_bw-client`,
//! `ib_write_lat-client` and `ib_write_bw-client` with `-b`) against a scripted
//! `ib_send_bw -R`, `ib_write_lat -R` or `ib_write_bw -R -b` client
//! written from perftest 4.5-0.17's exchange as
//! `docs/cm.md` gives it (the bytes here are spelled out, not taken from the module under
//! test): two software RoCE devices on an in-memory segment, each side in its own thread on
//! a real millisecond clock (a third thread moves the devices' clock along).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use bareverbs::Context;
use bareverbs::cm::{Cm, CmConfig, CmEvent, ConnId, ConnectParams};
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_lab_peers::cm_peer::{CmCase, run_case};
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};

type R = Rxe<Model, MemLink, TestClock>;

const UNI_IP: [u8; 4] = [10, 0, 0, 2];
const LNX_IP: [u8; 4] = [10, 0, 0, 1];
const SIZE: u32 = 256;
const ITERS: u32 = 20;

/// How long either side may take, in real time: the case's own 20 s deadline on a clock at a
/// tenth of real time. The exchange takes milliseconds natively and about 1.5 s under
/// valgrind, but a timer at the devices' tenth of real time (an RNR or CM retry) can add
/// seconds there, and under valgrind's one-thread-at-a-time scheduling on a loaded machine
/// the 20 s of real time the case had ran out.
const REAL_DEADLINE: Duration = Duration::from_secs(200);

/// The case's milliseconds since `t0`, at a tenth of real time (as the devices' clock runs),
/// yielding the CPU a little.
fn ms_since(t0: Instant) -> u64 {
    thread::sleep(Duration::from_micros(50));
    t0.elapsed().as_millis() as u64 / 10
}

/// What the scripted client changes, to see the unikernel notice.
#[derive(Clone, Copy, PartialEq)]
enum Twist {
    None,
    /// The 18th SEND (the second at its place) carries one byte that is not the buffer's.
    BadSend,
    /// The third `pingpong_dest` names another QP.
    BadDest,
    /// `ib_write_lat`: the WRITE of the fifth round has a byte before the round's number
    /// that is not zero.
    BadWrite,
    /// `ib_write_bw -b`: the client's report says one iteration less.
    BadReport,
}

/// The Linux program the scripted client plays.
#[derive(Clone, Copy, PartialEq)]
enum Prog {
    /// `ib_send_bw -R -s 256 -n 20`.
    SendBw,
    /// `ib_write_lat -R -s 2 -n 20`.
    WriteLat,
    /// `ib_write_bw -R -b -s 256 -n 20`.
    WriteBoth,
    /// `ib_send_bw -R -q 2 -s 256 -n 20`: two data connections, asked for at once.
    SendQ2,
}

/// `ib_write_lat`'s message size.
const LAT_SIZE: u32 = 2;

/// Runs the unikernel's case `ib_send_bw-client -R -s 256 -n 20` (or `ib_write_lat-client
/// -R -s 2 -n 20`) against the scripted client; returns the unikernel's line and whether the
/// client got through its part.
fn run(prog: Prog, twist: Twist) -> (String, bool) {
    // One case at a time: each runs three threads that poll against the unikernel's real-time
    // deadlines, and under valgrind (which runs one thread at a time) three cases at once
    // starved each other past them.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let model = Model::new(ModelConfig::default());
    let seg = Segment::new();
    let clk = TestClock::default();
    let lu = seg.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    let ll = seg.attach([0x52, 0x54, 0, 0, 0, 1], 1514);
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = {
        let (clk, stop) = (clk.clone(), stop.clone());
        thread::spawn(move || {
            // The devices' clock runs at a tenth of real time: the exchange needs none of its
            // timers (it ends in milliseconds natively), and under valgrind, some fifty times
            // slower, a clock at real time fired the CM's and the transport's retries until
            // the case's deadline passed.
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(1));
                clk.advance(100);
            }
        })
    };
    let (tx, rx) = mpsc::channel();
    let uni = {
        let (model, clk) = (model.clone(), clk.clone());
        thread::spawn(move || {
            model.set_seed(7);
            let dev = Rxe::new(model, lu, clk, Config { ip: UNI_IP }).unwrap();
            let ctx: Context<R> = Context::new(dev);
            let pd = ctx.alloc_pd().unwrap();
            let (spec, name) = match prog {
                Prog::SendBw => ("ib_send_bw-client,-R,-s,256,-n,20", "ib_send_bw-client"),
                Prog::WriteLat => ("ib_write_lat-client,-R,-s,2,-n,20", "ib_write_lat-client"),
                Prog::WriteBoth => (
                    "ib_write_bw-client,-R,-b,-s,256,-n,20",
                    "ib_write_bw-client",
                ),
                Prog::SendQ2 => (
                    "ib_send_bw-client,-R,-q,2,-s,256,-n,20",
                    "ib_send_bw-client",
                ),
            };
            let case = CmCase::parse(spec).unwrap();
            let t0 = Instant::now();
            let mut out = String::new();
            let clock = move || ms_since(t0);
            run_case(&ctx, &pd, LNX_IP, name, &case, 20_000, &clock, &mut out);
            tx.send(out).unwrap();
        })
    };
    let lnx = {
        let (model, clk) = (model.clone(), clk.clone());
        thread::spawn(move || {
            model.set_seed(9);
            let dev = Rxe::new(model, ll, clk.clone(), Config { ip: LNX_IP }).unwrap();
            let ctx: Context<R> = Context::new(dev);
            client(&ctx, clk, prog, twist)
        })
    };
    let line = rx
        .recv_timeout(REAL_DEADLINE + Duration::from_secs(60))
        .expect("the case ends");
    uni.join().unwrap();
    let r = lnx.join().unwrap();
    let ok = r.is_ok();
    stop.store(true, Ordering::Relaxed);
    ticker.join().unwrap();
    (line, ok)
}

/// Connects a new QP to the unikernel's port 18515 as perftest does (depths 0, retries 7, RNR
/// retries 7), again after a REJ.
fn connect<'a>(
    cm: &mut Cm<'a, R, TestClock, 4>,
    pd: &'a ProtectionDomain<'a, R>,
    cq: &'a CompletionQueue<'a, R>,
    t0: Instant,
) -> Result<(ConnId, QueuePair<'a, R, Rc, Rts>), String> {
    let caps = QpCaps {
        max_send_wr: 32,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let params = ConnectParams {
        responder_resources: 0,
        initiator_depth: 0,
        ..ConnectParams::default()
    };
    let mut qp = Some(pd.qp_builder(cq, cq).caps(caps).build::<Rc>().unwrap());
    while t0.elapsed() < REAL_DEADLINE {
        let Some(q) = qp.take() else { break };
        let id = cm
            .connect(q, UNI_IP, 18515, &params)
            .map_err(|(_, e)| format!("{e:?}"))?;
        loop {
            match cm.poll() {
                Some(CmEvent::Established {
                    id: i, qp: Some(q), ..
                }) if i == id => {
                    return Ok((id, q));
                }
                Some(CmEvent::Failed { id: i, qp: q, .. }) if i == id => {
                    qp = q;
                    thread::sleep(Duration::from_millis(20));
                    break;
                }
                _ if t0.elapsed() > REAL_DEADLINE => return Err("no REP".into()),
                _ => thread::sleep(Duration::from_micros(50)),
            }
        }
    }
    Err("never connected".into())
}

/// A connection the scripted side made: its ID and its QP.
type Connected<'a> = (ConnId, QueuePair<'a, R, Rc, Rts>);

/// Connects two new QPs to the unikernel's port 18515 at once, as perftest's client does with
/// `-q 2` (both REQs out before either REP came); returns them in the order they were asked.
fn connect_two<'a>(
    cm: &mut Cm<'a, R, TestClock, 4>,
    pd: &'a ProtectionDomain<'a, R>,
    cq: &'a CompletionQueue<'a, R>,
    t0: Instant,
) -> Result<[Connected<'a>; 2], String> {
    let caps = QpCaps {
        max_send_wr: 32,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let params = ConnectParams {
        responder_resources: 0,
        initiator_depth: 0,
        ..ConnectParams::default()
    };
    let mut ids = Vec::new();
    for _ in 0..2 {
        let q = pd.qp_builder(cq, cq).caps(caps).build::<Rc>().unwrap();
        let id = cm
            .connect(q, UNI_IP, 18515, &params)
            .map_err(|(_, e)| format!("{e:?}"))?;
        ids.push(id);
    }
    let mut up: [Option<QueuePair<'a, R, Rc, Rts>>; 2] = [None, None];
    while up.iter().any(Option::is_none) {
        match cm.poll() {
            Some(CmEvent::Established {
                id: i, qp: Some(q), ..
            }) => {
                let k = ids
                    .iter()
                    .position(|&d| d == i)
                    .ok_or("an unknown connection")?;
                up[k] = Some(q);
            }
            Some(CmEvent::Failed { id: i, failure, .. }) => {
                return Err(format!("connection {i:?} failed: {failure:?}"));
            }
            _ if t0.elapsed() > REAL_DEADLINE => return Err("no REP".into()),
            _ => thread::sleep(Duration::from_micros(50)),
        }
    }
    let [a, b] = up;
    Ok([(ids[0], a.unwrap()), (ids[1], b.unwrap())])
}

/// The client's side, as `ib_send_bw -R -s 256 -n 20 10.0.0.2` (or `ib_write_lat -R -s 2
/// -n 20 10.0.0.2`) runs it.
fn client(ctx: &Context<R>, clk: TestClock, prog: Prog, twist: Twist) -> Result<(), String> {
    let pd = ctx.alloc_pd().unwrap();
    let cm_cq = ctx.create_cq(32).unwrap();
    let cq = ctx.create_cq(128).unwrap();
    let t0 = Instant::now();
    let deadline = REAL_DEADLINE;
    // The scripted side's CM keeps the devices' time, as the unikernel's does: on a real-time
    // clock, under valgrind, its REQ retries ran out while the unikernel's CM, a tenth as
    // fast, still held the first attempt (the case then waited out its deadline).
    let mut cm: Cm<'_, R, TestClock, 4> = Cm::new(&pd, &cm_cq, clk, CmConfig::default()).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    // (The second page: where ib_write_bw -b's peer WRITEs.)
    let mut mr = pd.register(128 + 2 * 4096, access).unwrap();
    let (ctl_id, mut ctl) = connect(&mut cm, &pd, &cq, t0)?;
    // Region: 0 the receive, 64 the send, 128 the data buffer, a page (perftest's cycle
    // buffer, rand() bytes).
    for (j, b) in mr.as_mut_slice()[128..].iter_mut().enumerate() {
        *b = (j as u8).wrapping_mul(151) ^ 0x3C;
    }
    let post_recv = |qp: &mut QueuePair<'_, R, Rc, Rts>, mr: &MemoryRegion<'_, R>| {
        let sge = mr.sge(0, 56).unwrap();
        // SAFETY: the region outlives the QPs; read only after the completion.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(5, &[sge]).unwrap();
            r.finish();
        }
    };
    post_recv(&mut ctl, &mr);
    let wait = |want: u64, cm: &mut Cm<'_, R, TestClock, 4>| -> Result<WorkCompletion, String> {
        let mut wc = [WorkCompletion::default(); 1];
        while t0.elapsed() < deadline {
            if let Some(CmEvent::Disconnected { .. }) = cm.poll() {
                return Err("disconnected".into());
            }
            if cq.poll(&mut wc).unwrap() == 1 {
                if wc[0].status != WcStatus::Success || wc[0].wr_id != want {
                    return Err(format!("completion {:?}", wc[0]));
                }
                return Ok(wc[0]);
            }
        }
        Err(format!("no completion {want}"))
    };
    // The client writes, then reads.
    let xchg = |qp: &mut QueuePair<'_, R, Rc, Rts>,
                mr: &mut MemoryRegion<'_, R>,
                cm: &mut Cm<'_, R, TestClock, 4>,
                mine: &[u8]|
     -> Result<Vec<u8>, String> {
        mr.as_mut_slice()[64..64 + mine.len()].copy_from_slice(mine);
        let sge = mr.sge(64, mine.len() as u32).unwrap();
        // SAFETY: as above.
        unsafe {
            let mut s = qp.send_batch();
            s.send(5, SendFlags::SIGNALED, &[sge]).unwrap();
            s.finish();
        }
        wait(5, cm)?;
        let w = wait(5, cm)?;
        let got = mr.as_slice()[..w.byte_len as usize].to_vec();
        post_recv(qp, mr);
        Ok(got)
    };
    let mut version = [0u8; 16];
    version[..4].copy_from_slice(b"6.06");
    let v = xchg(&mut ctl, &mut mr, &mut cm, &version)?;
    assert_eq!(v, version);
    assert_eq!(
        xchg(&mut ctl, &mut mr, &mut cm, &[0, 0, 16, 0])?,
        [0, 0, 16, 0]
    );
    assert_eq!(
        xchg(&mut ctl, &mut mr, &mut cm, &[0, 0, 0, 64])?,
        [0, 0, 0, 64]
    );
    assert_eq!(xchg(&mut ctl, &mut mr, &mut cm, b"3\0")?, b"3\0");
    // A blank pingpong_dest with garbage in its padding, as perftest's stack leaves it.
    let mut blank = [0u8; 56];
    blank[20..24].copy_from_slice(&[0xDE, 0xAD, 0xBE, 0xEF]);
    assert_eq!(xchg(&mut ctl, &mut mr, &mut cm, &blank)?[..20], [0; 20]);
    let (data_id, mut data, mut second) = if prog == Prog::SendQ2 {
        let [(a, qa), b] = connect_two(&mut cm, &pd, &cq, t0)?;
        (a, qa, Some(b))
    } else {
        let (a, qa) = connect(&mut cm, &pd, &cq, t0)?;
        (a, qa, None)
    };
    assert_eq!(xchg(&mut ctl, &mut mr, &mut cm, &blank)?[24..], [0; 32]);
    let peer_qpn = data.query().unwrap().dest_qpn;
    let mut dest = [0u8; 56];
    dest[4..8].copy_from_slice(&1u32.to_be_bytes());
    dest[8..12].copy_from_slice(&data.qp_num().to_be_bytes());
    dest[12..16].copy_from_slice(&0x12_3456u32.to_be_bytes());
    dest[16..20].copy_from_slice(&mr.rkey().to_be_bytes());
    dest[24..32].copy_from_slice(&(mr.addr() + 128).to_be_bytes());
    dest[32..48].copy_from_slice(&Gid::from_ipv4(LNX_IP).0);
    dest[52..56].copy_from_slice(&1u32.to_be_bytes());
    if prog == Prog::WriteLat {
        // ib_write_lat: its buffer (zeroes), and where the peer WRITEs, 64 bytes on.
        mr.as_mut_slice()[128..].fill(0);
        dest[24..32].copy_from_slice(&(mr.addr() + 192).to_be_bytes());
    }
    if prog == Prog::WriteBoth {
        dest[24..32].copy_from_slice(&(mr.addr() + 128 + 4096).to_be_bytes());
    }
    let mut theirs = Vec::new();
    if let Some((_, q)) = &second {
        // -q 2 (send_bw.c's order): each QP's pingpong_dest (the unikernel's naming its QP
        // of the same place), the first QP's, each QP's again, and the first QP's once the
        // receives are posted; the second names its own part of the buffer.
        let mut d2 = dest;
        d2[8..12].copy_from_slice(&q.qp_num().to_be_bytes());
        d2[24..32].copy_from_slice(&(mr.addr() + 128 + 4096).to_be_bytes());
        let qpn2 = q.query().unwrap().dest_qpn;
        for step in 0..3 {
            let t = xchg(&mut ctl, &mut mr, &mut cm, &dest)?;
            assert_eq!(t[8..12], peer_qpn.to_be_bytes());
            if step != 1 {
                let t = xchg(&mut ctl, &mut mr, &mut cm, &d2)?;
                assert_eq!(t[8..12], qpn2.to_be_bytes());
            }
        }
        theirs = xchg(&mut ctl, &mut mr, &mut cm, &dest)?;
    }
    for k in 0..4 * u32::from(second.is_none()) {
        let mut d = dest;
        if twist == Twist::BadDest && k == 2 {
            d[11] ^= 1;
        }
        theirs = xchg(&mut ctl, &mut mr, &mut cm, &d)?;
    }
    // The unikernel's pingpong_dest: its data QP, its GID.
    assert_eq!(theirs[8..12], peer_qpn.to_be_bytes());
    assert_eq!(theirs[32..48], Gid::from_ipv4(UNI_IP).0);
    if prog == Prog::WriteLat {
        // The ping-pong: the server WRITEs first; each side polls the last byte of its
        // buffer for the round's number, then WRITEs its own (zeroes, the number last).
        let mut rkey = [0u8; 4];
        rkey.copy_from_slice(&theirs[16..20]);
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&theirs[24..32]);
        let to = (u64::from_be_bytes(vaddr), u32::from_be_bytes(rkey));
        let last = (192 + LAT_SIZE - 1) as usize;
        let mut wc = [WorkCompletion::default(); 1];
        for k in 1..=ITERS {
            while mr.as_slice()[last] != k as u8 {
                cq.poll(&mut wc).unwrap();
                // The unikernel ends a case that failed by disconnecting.
                if let Some(CmEvent::Disconnected { .. }) = cm.poll() {
                    return Err(format!("disconnected before round {k}"));
                }
                if t0.elapsed() > deadline {
                    return Err(format!("no WRITE of round {k}"));
                }
            }
            let src = 128 + LAT_SIZE as usize - 1;
            mr.as_mut_slice()[src] = k as u8;
            mr.as_mut_slice()[128] = u8::from(twist == Twist::BadWrite && k == 5);
            let sge = mr.sge(128, LAT_SIZE).unwrap();
            // SAFETY: as above; one WRITE at a time (the buffer changes only between them).
            unsafe {
                let mut s = data.send_batch();
                s.rdma_write(100, SendFlags::SIGNALED, to, &[sge]).unwrap();
                s.finish();
            }
            wait(100, &mut cm)?;
        }
    }
    // The SENDs from the cycle buffer: 256 bytes are at most half a page, so perftest moves
    // on by 256 (a multiple of the 64-byte cache line) each time, back to the start after 16.
    for i in 0..ITERS * u32::from(prog == Prog::SendBw) {
        let at = 128 + (i % 16) * SIZE;
        let bad = twist == Twist::BadSend && i == 17;
        mr.as_mut_slice()[at as usize + 7] ^= u8::from(bad);
        let sge = mr.sge(at, SIZE).unwrap();
        // SAFETY: as above; one SEND at a time (the buffer changes only between them).
        unsafe {
            let mut s = data.send_batch();
            s.send(100, SendFlags::SIGNALED, &[sge]).unwrap();
            s.finish();
        }
        wait(100, &mut cm)?;
        mr.as_mut_slice()[at as usize + 7] ^= u8::from(bad);
    }
    if let Some((_, q2)) = &mut second {
        // -q 2: every SEND of both QPs posted at once, as perftest posts on each QP while it
        // has room; the unikernel takes one QP's after the other's (the other's wait, or are
        // refused with RNR and sent again). Both QPs send the same cycle buffer.
        for i in 0..ITERS {
            let at = 128 + (i % 16) * SIZE;
            let sge = mr.sge(at, SIZE).unwrap();
            for q in [&mut data, &mut *q2] {
                // SAFETY: as above; the buffer does not change while the SENDs fly.
                unsafe {
                    let mut s = q.send_batch();
                    s.send(200 + u64::from(i), SendFlags::SIGNALED, &[sge])
                        .unwrap();
                    s.finish();
                }
            }
        }
        let mut wc = [WorkCompletion::default(); 8];
        let mut done = 0;
        while done < 2 * ITERS {
            let n = cq.poll(&mut wc).unwrap();
            if let Some(w) = wc[..n].iter().find(|w| w.status != WcStatus::Success) {
                return Err(format!("completion {w:?}"));
            }
            done += n as u32;
            if let Some(CmEvent::Disconnected { .. }) = cm.poll() {
                return Err("disconnected".into());
            }
            if t0.elapsed() > deadline {
                return Err(format!("{done} SENDs completed"));
            }
        }
    }
    if prog == Prog::WriteBoth {
        // After the sync (the fourth pingpong_dest) both sides WRITE: this one from its cycle
        // buffer to the same place of the peer's, one at a time.
        let mut rkey = [0u8; 4];
        rkey.copy_from_slice(&theirs[16..20]);
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&theirs[24..32]);
        let (va, rk) = (u64::from_be_bytes(vaddr), u32::from_be_bytes(rkey));
        for i in 0..ITERS {
            let at = (i % 16) * SIZE;
            let sge = mr.sge(128 + at, SIZE).unwrap();
            // SAFETY: as above; one WRITE at a time.
            unsafe {
                let mut s = data.send_batch();
                s.rdma_write(100, SendFlags::SIGNALED, (va + u64::from(at), rk), &[sge])
                    .unwrap();
                s.finish();
            }
            wait(100, &mut cm)?;
        }
        // The reports, each side's own: size, iterations, three figures (big-endian words).
        let iters = u64::from(ITERS) - u64::from(twist == Twist::BadReport);
        let words = [
            u64::from(SIZE),
            iters,
            12.5f64.to_bits(),
            12.0f64.to_bits(),
            0.05f64.to_bits(),
        ];
        let mut got = [0u64; 5];
        for (w, g) in words.iter().zip(got.iter_mut()) {
            let m = xchg(&mut ctl, &mut mr, &mut cm, &w.to_be_bytes())?;
            *g = u64::from_be_bytes(m[..8].try_into().unwrap());
        }
        // The unikernel's own report: its size and iterations.
        assert_eq!(got[..2], [u64::from(SIZE), u64::from(ITERS)]);
        assert!(f64::from_bits(got[3]).is_finite());
    }
    if prog != Prog::WriteLat {
        xchg(&mut ctl, &mut mr, &mut cm, &dest)?;
    }
    // perftest's client disconnects its data connection and waits; its exit takes the control
    // connection down.
    let data = data.to_error().unwrap();
    let ctl = ctl.to_error().unwrap();
    let (second_id, second) = match second {
        Some((id, q)) => (Some(id), Some(q.to_error().unwrap())),
        None => (None, None),
    };
    // (Once its data connection is down the unikernel takes the control connection down
    // itself: its DREQ may come while this side still waits for the data connection's DREP.)
    let mut down = Vec::new();
    for id in [Some(data_id), second_id, Some(ctl_id)]
        .into_iter()
        .flatten()
    {
        // (A refused DREQ: the peer's came first, its event still to be taken below.)
        if !down.contains(&id) {
            let _ = cm.disconnect(id);
        }
        while !down.contains(&id) {
            match cm.poll() {
                Some(CmEvent::Disconnected { id: i }) => down.push(i),
                _ if t0.elapsed() > deadline => return Err("no DREP".into()),
                _ => thread::sleep(Duration::from_micros(50)),
            }
        }
    }
    drop((data, second, ctl));
    Ok(())
}

#[test]
fn the_server_takes_a_perftest_client_and_checks_every_send() {
    let (line, ok) = run(Prog::SendBw, Twist::None);
    assert!(
        line.starts_with("roce-uk ib_send_bw-client: ok 20 SENDs of 256 bytes"),
        "{line}"
    );
    // 16 + 4 + 4 + 2, two blanks and five pingpong_dest of 52 defined bytes, 20 × 256.
    let checked = 26 + 7 * 52 + 20 * 256;
    assert!(line.contains(&format!("({checked} bytes)")), "{line}");
    assert!(ok);
}

#[test]
fn a_send_with_a_wrong_byte_fails_the_case() {
    let (line, _) = run(Prog::SendBw, Twist::BadSend);
    assert!(
        line.contains(
            "FAIL a SEND (not the bytes the first one at its place had), number 17: wrong byte at 7"
        ),
        "{line}"
    );
}

#[test]
fn a_pingpong_dest_that_changes_fails_the_case() {
    let (line, _) = run(Prog::SendBw, Twist::BadDest);
    assert!(
        line.contains(
            "FAIL a pingpong_dest (not the first one's bytes), number 2: wrong byte at 11"
        ),
        "{line}"
    );
}

#[test]
fn the_server_plays_ib_write_lat_s_ping_pong_and_checks_every_write() {
    let (line, ok) = run(Prog::WriteLat, Twist::None);
    assert!(
        line.starts_with(
            "roce-uk ib_write_lat-client: ok 20 rounds of an RDMA WRITE each way of 2 bytes"
        ),
        "{line}"
    );
    // 16 + 4 + 4 + 2, two blanks and four pingpong_dest of 52 defined bytes, 20 × 2.
    let checked = 26 + 6 * 52 + 20 * 2;
    assert!(line.contains(&format!("({checked} bytes)")), "{line}");
    assert!(ok);
}

#[test]
fn a_latency_write_with_a_byte_before_the_round_s_number_fails_the_case() {
    let (line, _) = run(Prog::WriteLat, Twist::BadWrite);
    assert!(
        line.contains(
            "FAIL a WRITE of the peer's (not zeroes before its round's number), number 4: wrong byte at 0"
        ),
        "{line}"
    );
}

#[test]
fn the_latency_programs_and_b_parse_with_rdma_cm() {
    use bareverbs_lab_peers::cm_peer::{Program, PtVerb};
    let c = CmCase::parse("ib_read_lat-cm-server,-R,-s,2,-n,200").unwrap();
    assert_eq!(
        (c.program, c.size, c.count),
        (
            Program::Perftest {
                verb: PtVerb::ReadLat,
                linux_serves: true
            },
            2,
            200
        )
    );
    // perftest's defaults: 2 bytes (8 for atomics), 1000 iterations.
    let d = CmCase::parse("ib_send_lat-client,-R").unwrap();
    assert_eq!((d.size, d.count), (2, 1000));
    let a = CmCase::parse("ib_atomic_lat-client,--rdma_cm").unwrap();
    assert_eq!(
        (a.program, a.size, a.count),
        (
            Program::Perftest {
                verb: PtVerb::AtomicLat,
                linux_serves: false
            },
            8,
            1000
        )
    );
    // ib_write_bw's -b: both sides WRITE.
    let b = CmCase::parse("ib_write_bw-cmb-server,-R,-b,-s,4096,-n,200").unwrap();
    assert_eq!(
        (b.program, b.size, b.count),
        (
            Program::Perftest {
                verb: PtVerb::WriteBoth,
                linux_serves: true
            },
            4096,
            200
        )
    );
    // ib_send_bw's -b: both sides SEND.
    let s = CmCase::parse("ib_send_bw-cmb-client,-R,-b").unwrap();
    assert_eq!(
        (s.program, s.size, s.count),
        (
            Program::Perftest {
                verb: PtVerb::SendBoth,
                linux_serves: false
            },
            65536,
            1000
        )
    );
    // ib_read_bw's -b: both sides READ.
    let s = CmCase::parse("ib_read_bw-cmb-server,-R,-b,-s,4096").unwrap();
    assert_eq!(
        (s.program, s.size, s.count),
        (
            Program::Perftest {
                verb: PtVerb::ReadBoth,
                linux_serves: true
            },
            4096,
            1000
        )
    );
    for bad in [
        // -b with -R: the bandwidth programs' only.
        "ib_read_lat-cmb-client,-R,-b",
        // -q with -R: four data connections at most, bandwidth programs only.
        "ib_write_bw-q5-client,-R,-q,5",
        // Without -R: the TCP exchange's case, not the CM's.
        "ib_write_lat-client,-s,2",
        // Atomics are 8 bytes.
        "ib_atomic_lat-client,-R,-s,2",
        // Options the latency exchange does not take here.
        "ib_send_lat-client,-R,-q,2",
        "ib_write_lat-server,-R,-b",
        "ib_read_lat-server,-R,-n,0",
        "ib_read_lat-x-y-server,-R",
    ] {
        assert_eq!(CmCase::parse(bad), None, "{bad}");
    }
}

#[test]
fn both_sides_write_with_b_and_each_report_is_checked() {
    let (line, ok) = run(Prog::WriteBoth, Twist::None);
    assert!(
        line.starts_with("roce-uk ib_write_bw-client: ok 20 RDMA WRITEs each way of 256 bytes"),
        "{line}"
    );
    assert!(
        line.contains("the WRITE target overwritten whole"),
        "{line}"
    );
    // 16 + 4 + 4 + 2, two blanks and five pingpong_dest of 52 defined bytes, the report.
    let checked = 26 + 7 * 52 + 40;
    assert!(line.contains(&format!("({checked} bytes)")), "{line}");
    assert!(ok);
    let (line, _) = run(Prog::WriteBoth, Twist::BadReport);
    assert!(
        line.contains("FAIL the client's report, number 0: wrong byte at 8"),
        "{line}"
    );
}

#[test]
fn two_data_connections_asked_for_at_once_each_send_checked() {
    let (line, ok) = run(Prog::SendQ2, Twist::None);
    assert!(
        line.starts_with("roce-uk ib_send_bw-client: ok 40 SENDs of 256 bytes"),
        "{line}"
    );
    // 16 + 4 + 4 + 2, two blanks and seven pingpong_dest of 52 defined bytes, both QPs' 20
    // SENDs.
    let checked = 26 + 9 * 52 + 2 * 20 * 256;
    assert!(line.contains(&format!("({checked} bytes)")), "{line}");
    assert!(ok);
}
