//! The unikernel's mckey peer (`cm_peer::mckey`, `docs/multicast.md`) in both roles against a
//! scripted mckey written from what `docs/multicast.md` says Linux's does (a UD QP attached to
//! the group's IPv4-mapped GID, Q_Key 0x01234567, SEND WITH_IMM of its QPN to QPN 0xFFFFFF,
//! one buffer for every datagram): two software RoCE devices on an in-memory segment, each
//! side in its own thread on a real millisecond clock (a third thread moves the devices'
//! clock along). The scripted side's device sends its IGMP report and leave itself, as it
//! attaches and detaches; the unikernel's watches for them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use bareverbs::Context;
use bareverbs::device::rxe::{Config, MCAST_QPN, Rxe};
use bareverbs::hal::Link;
use bareverbs::verbs::*;
use bareverbs_lab_peers::cm_peer::mckey::{McCase, igmp_news, run_case};
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};

type R = Rxe<Model, MemLink, TestClock>;

const UNI_IP: [u8; 4] = [10, 0, 0, 2];
const LNX_IP: [u8; 4] = [10, 0, 0, 1];
const GROUP: [u8; 4] = [239, 192, 0, 9];
const QKEY: u32 = 0x0123_4567;
const SIZE: u32 = 100;
const COUNT: u32 = 10;
/// How long either side may take, in real time.
const REAL_DEADLINE: Duration = Duration::from_secs(60);

/// What the scripted side changes, to see the unikernel notice.
#[derive(Clone, Copy, PartialEq)]
enum Twist {
    None,
    /// The 7th datagram's payload is not the buffer the others came from.
    OtherBytes,
}

/// Runs the unikernel's case `spec` against the scripted mckey (`linux_sends`: `mckey -s`);
/// returns the unikernel's line and what the scripted side said.
fn run(spec: &'static str, linux_sends: bool, twist: Twist) -> (String, Result<u32, String>) {
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
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(1));
                clk.advance(1000);
            }
        })
    };
    let (tx, rx) = mpsc::channel();
    let uni = {
        let (model, clk) = (model.clone(), clk.clone());
        thread::spawn(move || {
            let dev = Rxe::new(model, lu, clk, Config { ip: UNI_IP }).unwrap();
            let ctx: Context<R> = Context::new(dev);
            let pd = ctx.alloc_pd().unwrap();
            let case = McCase::parse(spec).unwrap();
            let t0 = Instant::now();
            let mut out = String::new();
            let clock = move || {
                thread::sleep(Duration::from_micros(50));
                t0.elapsed().as_millis() as u64
            };
            let name = spec.split(',').next().unwrap();
            run_case(&ctx, &pd, LNX_IP, name, &case, 20_000, &clock, &mut out);
            tx.send(out).unwrap();
        })
    };
    let lnx = thread::spawn(move || {
        let dev = Rxe::new(model, ll, clk, Config { ip: LNX_IP }).unwrap();
        let ctx: Context<R> = Context::new(dev);
        if linux_sends {
            sender(&ctx, twist)
        } else {
            receiver(&ctx)
        }
    });
    let line = rx
        .recv_timeout(REAL_DEADLINE + Duration::from_secs(30))
        .expect("the case ends");
    uni.join().unwrap();
    let r = lnx.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    ticker.join().unwrap();
    (line, r)
}

fn ud<'a>(
    pd: &'a ProtectionDomain<'a, R>,
    cq: &'a CompletionQueue<'a, R>,
) -> QueuePair<'a, R, Ud, Rts> {
    let caps = QpCaps {
        max_send_wr: COUNT,
        max_recv_wr: COUNT,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.qp_builder(cq, cq).caps(caps).build::<Ud>().unwrap();
    qp.ready(QKEY, 0).map_err(|(_, e)| e).unwrap()
}

/// `mckey -s`: waits until the unikernel joined the group (its IGMP report), joins, sends.
fn sender(ctx: &Context<R>, twist: Twist) -> Result<u32, String> {
    let t0 = Instant::now();
    let mut buf = [0u8; 1536];
    let from_uni = loop {
        if let Some(n) = ctx.provider().stack().receive(&mut buf)
            && igmp_news(&buf[..n], UNI_IP, GROUP) == Some(true)
        {
            break true;
        }
        if t0.elapsed() > REAL_DEADLINE {
            break false;
        }
        thread::sleep(Duration::from_micros(100));
    };
    if !from_uni {
        return Err("no IGMP report from the unikernel".into());
    }
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let mut qp = ud(&pd, &cq);
    let gid = Gid::from_ipv4(GROUP);
    qp.attach_mcast(gid, 0).unwrap();
    let mut mr = pd
        .register(2 * SIZE as usize, AccessFlags::LOCAL_WRITE)
        .unwrap();
    for (j, b) in mr.as_mut_slice().iter_mut().enumerate() {
        *b = (j as u8).wrapping_mul(37);
    }
    let mut av = AddressVector::new(gid, 1);
    av.hop_limit = 64;
    let ah = pd.create_ah(&av).unwrap();
    let me = qp.qp_num();
    // SAFETY: the region outlives the sends, whose completions are polled below.
    unsafe {
        let mut sb = qp.send_batch();
        for i in 0..COUNT {
            let at = if twist == Twist::OtherBytes && i == 6 {
                SIZE
            } else {
                0
            };
            let sge = mr.sge(at, SIZE).unwrap();
            sb.send_to_imm(
                u64::from(i),
                SendFlags::SIGNALED,
                (&ah, MCAST_QPN, QKEY),
                me,
                &[sge],
            )
            .unwrap();
        }
        sb.finish();
    }
    let mut done = 0;
    while done < COUNT && t0.elapsed() < REAL_DEADLINE {
        let mut wcs = [WorkCompletion::default(); 8];
        let n = cq.poll(&mut wcs).unwrap();
        if let Some(w) = wcs[..n].iter().find(|w| w.status != WcStatus::Success) {
            return Err(format!("send completion {w:?}"));
        }
        done += n as u32;
    }
    // Linger: the unikernel's device takes the frames as it polls.
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_millis(200) {
        ctx.provider().progress();
    }
    qp.detach_mcast(gid, 0).unwrap();
    Ok(done)
}

/// `mckey`: attaches (its device sends the report), takes the datagrams, checks them, leaves
/// (its device sends the leave the unikernel waits for).
fn receiver(ctx: &Context<R>) -> Result<u32, String> {
    let t0 = Instant::now();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let mut qp = ud(&pd, &cq);
    let slot = SIZE + 40;
    let mr = pd
        .register((COUNT * slot) as usize, AccessFlags::LOCAL_WRITE)
        .unwrap();
    // SAFETY: the region outlives the receives; read after their completions.
    unsafe {
        let mut rb = qp.recv_batch();
        for i in 0..COUNT {
            rb.recv(u64::from(i), &[mr.sge(i * slot, slot).unwrap()])
                .unwrap();
        }
        rb.finish();
    }
    let gid = Gid::from_ipv4(GROUP);
    qp.attach_mcast(gid, 0).unwrap();
    let mut got = Vec::new();
    while (got.len() as u32) < COUNT && t0.elapsed() < REAL_DEADLINE {
        let mut wcs = [WorkCompletion::default(); 8];
        let n = cq.poll(&mut wcs).unwrap();
        got.extend_from_slice(&wcs[..n]);
        thread::sleep(Duration::from_micros(100));
    }
    qp.detach_mcast(gid, 0).unwrap();
    // The leave goes out with the detach; the unikernel's device takes it as it polls.
    if got.len() as u32 != COUNT {
        return Err(format!("{} datagrams", got.len()));
    }
    for w in &got {
        let ok = w.status == WcStatus::Success
            && w.byte_len == slot
            && w.flags.contains(WcFlags::WITH_IMM)
            && w.imm == w.src_qp;
        if !ok {
            return Err(format!("datagram {w:?}"));
        }
        let m = &mr.as_slice()[(w.wr_id as u32 * slot) as usize..][..slot as usize];
        // The GRH slot's IPv4 header: from the unikernel to the group.
        if m[32..36] != UNI_IP || m[36..40] != GROUP {
            return Err(format!("GRH slot {:?}", &m[20..40]));
        }
        let want: Vec<u8> = (0..SIZE as usize).map(|j| b'a' + (j % 26) as u8).collect();
        if m[40..] != want[..] {
            return Err("payload".into());
        }
    }
    Ok(COUNT)
}

#[test]
fn the_unikernel_receives_what_mckey_s_sends_to_the_group_and_checks_it() {
    let (line, linux) = run(
        "mckey-client,-m,239.192.0.9,-C,10,-S,100",
        true,
        Twist::None,
    );
    assert_eq!(linux, Ok(COUNT), "{line}");
    assert!(
        line.starts_with("roce-uk mckey-client: ok 10 datagrams of 100 bytes from QP"),
        "{line}"
    );
}

#[test]
fn the_unikernel_notices_a_datagram_that_is_not_the_first_ones_bytes() {
    let (line, _) = run(
        "mckey-client,-m,239.192.0.9,-C,10,-S,100",
        true,
        Twist::OtherBytes,
    );
    assert!(
        line.starts_with(
            "roce-uk mckey-client: FAIL a datagram (not the first one's bytes) of ping 6"
        ),
        "{line}"
    );
}

#[test]
fn the_unikernel_sends_to_mckeys_group_from_its_join_to_its_leave() {
    let (line, linux) = run(
        "mckey-server,-m,239.192.0.9,-C,10,-S,100",
        false,
        Twist::None,
    );
    assert_eq!(linux, Ok(COUNT), "{line}");
    assert!(line.starts_with("roce-uk mckey-server: ok "), "{line}");
    assert!(
        line.contains(
            "rounds of 10 datagrams of 100 bytes sent between Linux's IGMP join (a report after"
        ),
        "{line}"
    );
}
