//! The bareverbs unikernel demo: what the example kernel does once it runs, written against the
//! HAL traits so that the same code also runs on the host against the device model.
//!
//! It scans PCI and prints what it finds; if a PVRDMA is present it brings it up, prints the
//! device's caps and port, creates a PD and CQs, creates QPs of each supported type with several
//! cap sets (printing requested vs actual caps and the QP number), drives RC and UD QPs through
//! their state transitions (binding the port GID first), moves data (SEND/RECV between two RC
//! QPs and over UD through a registered buffer pool, payloads checked byte for byte), destroys everything, and says whether it
//! all worked.
//!
//! Without a PVRDMA, [`roce`] is the second device: bareverbs' software RoCEv2 over the first
//! virtio-net NIC, two QPs of each kind exchanging every operation, then a CM connection from
//! the device to its own address, every byte checked.
//!
//! The machine it runs on (boot, console, interrupts, waits) is `bareverbs-platform`'s; the
//! storage appliance and the lab peers are binaries of their own (`appliance/`,
//! `qemu/peers/`).
#![no_std]
#![deny(
    unsafe_op_in_unsafe_fn,
    missing_docs,
    clippy::undocumented_unsafe_blocks
)]

use core::fmt::Write;

pub mod kernel;
pub mod roce;

/// The waits the demo halts in (the platform's).
pub use bareverbs_platform::wait;
pub use bareverbs_platform::{DisplayGid, Failure, Step};

use bareverbs::Context;
use bareverbs::device::pvrdma::{self, Config, Pvrdma};
use bareverbs::error::{Error, Unsupported};
use bareverbs::hal::{ConfigRegionAccess, Hal};
use bareverbs::pci;
use bareverbs::verbs::*;
use wait::{Cpu, Entry};

/// How the demo ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A PVRDMA was found and everything worked.
    Pass,
    /// No PVRDMA on the bus.
    NoDevice,
}

fn name(vendor: u16, device: u16) -> &'static str {
    match (vendor, device) {
        (0x15AD, 0x0820) => "VMware PVRDMA",
        (0x15AD, 0x07B0) => "VMware vmxnet3",
        (0x8086, 0x29C0) => "Intel Q35 host bridge",
        (0x8086, 0x2918) => "Intel ICH9 LPC",
        (0x8086, 0x2922) => "Intel ICH9 AHCI",
        (0x8086, 0x2930) => "Intel ICH9 SMBus",
        (0x8086, 0x1237) => "Intel 440FX host bridge",
        (0x8086, 0x7000) => "Intel PIIX3 ISA",
        (0x8086, 0x7010) => "Intel PIIX3 IDE",
        (0x8086, 0x7113) => "Intel PIIX4 ACPI",
        (0x1234, 0x1111) => "QEMU VGA",
        (0x8086, 0x100E) => "Intel e1000",
        (0x8086, 0x10D3) => "Intel 82574L (e1000e)",
        (0x8086, 0x10C9) => "Intel 82576 (igb)",
        (0x1AF4, _) => "virtio",
        _ => "",
    }
}

/// Cap sets each QP type is created with: (send wr, recv wr, send sge, recv sge).
pub const CAP_SETS: [(u32, u32, u32, u32); 4] = [
    (1, 1, 1, 1),
    (16, 16, 2, 2),
    (100, 50, 4, 3),
    (2048, 1, 4, 1),
];

/// RC round trips in which every completion is waited for.
pub const ROUND_TRIPS: u64 = 64;

/// Runs the demo: `out` receives the report. The caller checks DMA pages afterwards.
///
/// With [`Config::interrupts`], the device's interrupts are routed through `cpu` to the
/// driver, every wait for a completion halts the CPU until its interrupt, and the report ends
/// with the interrupt counts (`interrupts: command …, async …, cq …`) and the waits (`waits:
/// halted …, spun …`).
pub fn run<H: Hal, C: ConfigRegionAccess, W: Write>(
    hal: H,
    pci: &C,
    out: &mut W,
    config: Config,
    cpu: &mut dyn Cpu,
) -> Result<Verdict, Failure> {
    let _ = writeln!(out, "PCI functions:");
    for f in pci::scan(pci) {
        let a = f.address;
        let _ = writeln!(
            out,
            "  {:02x}:{:02x}.{} {:04x}:{:04x} class {:02x}.{:02x} {}",
            a.bus(),
            a.device(),
            a.function(),
            f.vendor,
            f.device,
            f.class.0,
            f.class.1,
            name(f.vendor, f.device)
        );
    }
    let Some(address) = pvrdma::find(pci) else {
        let _ = writeln!(
            out,
            "no PVRDMA (15ad:0820) on the bus (plain QEMU cannot realize -device pvrdma without \
             a host RDMA device)"
        );
        return Ok(Verdict::NoDevice);
    };
    let dev = Pvrdma::new(hal, pci, address, config).at("bring-up")?;
    let _ = writeln!(
        out,
        "PVRDMA at {:02x}:{:02x}.{}: device version {}",
        address.bus(),
        address.device(),
        address.function(),
        dev.version()
    );
    let ctx = Context::new(dev);
    // Routed until dropped (before `ctx`: declared after it).
    let irq = ctx.provider().interrupts_enabled();
    let cpu = Routed::new(cpu, irq.then(|| Entry::of(&ctx)));
    // What the device reports, as Linux's ibv_devinfo shows it (compare.sh compares the two);
    // ctx.caps() is the subset creation accepts.
    report_caps(&ctx.provider().device_caps(), out);
    let port = ctx.query_port(1).at("query port 1")?;
    let _ = writeln!(
        out,
        "port 1: state {:?}, max_mtu {}, active_mtu {}, gid_tbl_len {}, max_msg_sz {}, pkey[0] {:#06x}",
        port.state,
        port.max_mtu.bytes(),
        port.active_mtu.bytes(),
        port.gid_tbl_len,
        port.max_msg_sz,
        ctx.query_pkey(1, 0).at("query pkey")?
    );

    // The port's GID: the link-local address of the paired vmxnet3's MAC, whose EUI-64 is the
    // node GUID (in memory order).
    let mut g = [0u8; 16];
    g[0] = 0xFE;
    g[1] = 0x80;
    g[8..].copy_from_slice(&ctx.caps().node_guid.to_le_bytes());
    let gid = ctx.bind_gid(0, Gid(g)).at("bind GID 0")?;
    let _ = writeln!(out, "GID[0] bound: {}", DisplayGid(gid.gid()));

    let pd = ctx.alloc_pd().at("alloc PD")?;
    let send_cq = ctx.create_cq(4096).at("create send CQ")?;
    let recv_cq = ctx.create_cq(100).at("create recv CQ")?;
    let _ = writeln!(
        out,
        "PD {}, CQs of {} and {} entries (asked 4096, 100)",
        pd.raw().handle(),
        send_cq.entries(),
        recv_cq.entries()
    );

    for &(sw, rw, ss, rs) in &CAP_SETS {
        let want = QpCaps {
            max_send_wr: sw,
            max_recv_wr: rw,
            max_send_sge: ss,
            max_recv_sge: rs,
            max_inline_data: 0,
        };
        let b = || pd.qp_builder(&send_cq, &recv_cq).caps(want);
        let rc = b().build::<Rc>().at("create RC QP")?;
        report_qp(out, "RC", &want, rc.qp_num(), rc.caps());
        let ud = b().build::<Ud>().at("create UD QP")?;
        report_qp(out, "UD", &want, ud.qp_num(), ud.caps());
        rc.destroy().at("destroy RC QP")?;
        ud.destroy().at("destroy UD QP")?;
    }
    match pd.qp_builder(&send_cq, &recv_cq).build::<Uc>() {
        Err(Error::Unsupported(Unsupported::QpType(QpType::Uc))) => {
            let _ = writeln!(out, "UC: unsupported on PVRDMA (as expected)");
        }
        Err(e) => {
            return Err(Failure {
                step: "create UC QP",
                error: e,
            });
        }
        Ok(_) => {
            let error = Error::Unsupported(Unsupported::QpType(QpType::Uc));
            return Err(Failure {
                step: "UC QP was created",
                error,
            });
        }
    }
    let gsi = pd
        .qp_builder(&send_cq, &recv_cq)
        .build::<Gsi>()
        .at("create GSI QP")?;
    let _ = writeln!(out, "GSI QP: qpn {}", gsi.qp_num());

    // The SRQ's QP completes to a CQ of its own: every request it may receive is reserved
    // there (256 slots).
    let srq_cq = ctx.create_cq(256).at("create SRQ CQ")?;
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 200,
            max_sge: 2,
            srq_limit: 0,
        })
        .at("create SRQ")?;
    let on_srq = pd
        .qp_builder(&send_cq, &srq_cq)
        .srq(&srq)
        .build::<Rc>()
        .at("create RC QP on SRQ")?;
    let _ = writeln!(
        out,
        "SRQ: max_wr {} max_sge {}; RC QP {} receives from it (recv caps {}/{})",
        srq.attr().max_wr,
        srq.attr().max_sge,
        on_srq.qp_num(),
        on_srq.caps().max_recv_wr,
        on_srq.caps().max_recv_sge
    );

    // The safe path's buffers: one registered region carved into 4 KiB buffers.
    let pool = pd.buffer_pool(8, 4096).at("register buffer pool")?;
    // An RC pair connected to each other, through RESET → INIT → RTR → RTS, on CQs of its own
    // (what it waits for is then always its own: a wait halts until the CQ's interrupt).
    let pair_scq = ctx.create_cq(64).at("create the pair's send CQ")?;
    let pair_rcq = ctx.create_cq(64).at("create the pair's recv CQ")?;
    let a = pd
        .qp_builder(&pair_scq, &pair_rcq)
        .pool(&pool)
        .build::<Rc>()
        .at("create RC a")?;
    let b = pd
        .qp_builder(&pair_scq, &pair_rcq)
        .pool(&pool)
        .build::<Rc>()
        .at("create RC b")?;
    let (qa, qb) = (a.qp_num(), b.qp_num());
    let av = AddressVector::new(gid.gid(), gid.index() as u8);
    let a = a.init(&ConnectedInit::default()).at("RC a INIT")?;
    let b = b.init(&ConnectedInit::default()).at("RC b INIT")?;
    let a = a.rtr(&ConnectedRtr::new(qb, 100, av)).at("RC a RTR")?;
    let b = b.rtr(&ConnectedRtr::new(qa, 200, av)).at("RC b RTR")?;
    let a = a.rts(&ConnectedRts::new(200)).at("RC a RTS")?;
    let b = b.rts(&ConnectedRts::new(100)).at("RC b RTS")?;
    let (sa, sb) = (a.query().at("query RC a")?, b.query().at("query RC b")?);
    let _ = writeln!(
        out,
        "RC pair {qa} <-> {qb}: {:?}/{:?}, dest_qpn {}/{}",
        sa.state, sb.state, sa.dest_qpn, sb.dest_qpn
    );
    if (sa.state, sa.dest_qpn, sb.dest_qpn) != (QpState::Rts, qb, qa) {
        let error = Error::Unsupported(Unsupported::QpType(QpType::Rc));
        return Err(Failure {
            step: "RC pair state read back",
            error,
        });
    }

    // Data: SEND/RECV between the pair, checked byte for byte.
    let (mut a, mut b) = (a, b);
    let pattern = |i: usize| (i * 7 + 3) as u8;
    let take = || {
        pool.alloc().ok_or(Failure {
            step: "buffer pool",
            error: Error::Resource(bareverbs::error::Resource::Dma { pages: 1 }),
        })
    };
    b.post_recv(1, take()?).at("RC post_recv")?;
    let mut outbox = take()?;
    outbox.set_len(1000).at("RC buffer length")?;
    for (i, x) in outbox.as_mut_slice().iter_mut().enumerate() {
        *x = pattern(i);
    }
    a.post_send(2, outbox).at("RC post_send")?;
    let got = wait(&mut b, &pair_rcq, &mut *cpu.0, "RC receive")?;
    let sent = wait(&mut a, &pair_scq, &mut *cpu.0, "RC send completion")?;
    check(&got, 1000, 0, pattern, "RC payload")?;
    let _ = writeln!(
        out,
        "RC SEND {qa} -> {qb}: {} bytes received, payload checked; send status {:?}",
        got.wc.byte_len, sent.wc.status
    );
    drop((got, sent));
    // Round trips, each completion waited for: with interrupts, the CPU halts for each.
    for i in 0..ROUND_TRIPS {
        b.post_recv(10 + i, take()?)
            .at("RC post_recv (round trips)")?;
        let mut m = take()?;
        m.set_len(64).at("RC buffer length")?;
        a.post_send(1000 + i, m).at("RC post_send (round trips)")?;
        let got = wait(&mut b, &pair_rcq, &mut *cpu.0, "RC receive (round trips)")?;
        let sent = wait(&mut a, &pair_scq, &mut *cpu.0, "RC send (round trips)")?;
        let ok = got.wc.status == WcStatus::Success
            && got.wc.byte_len == 64
            && got.wc.wr_id == 10 + i
            && sent.wc.status == WcStatus::Success
            && sent.wc.wr_id == 1000 + i;
        if !ok {
            let error = Error::Busy {
                op: bareverbs::error::Op::PollCq,
            };
            return Err(Failure {
                step: "RC round trip completions",
                error,
            });
        }
        drop((got, sent));
    }
    let _ = writeln!(
        out,
        "RC round trips: {ROUND_TRIPS} of 64 bytes, each completion waited for"
    );

    // UD straight to RTS; the qkey and sq_psn read back; RTS → RESET.
    let ud = pd
        .qp_builder(&send_cq, &recv_cq)
        .pool(&pool)
        .build::<Ud>()
        .at("create UD")?;
    let ud = ud.ready(0x1111_1111, 0x42).at("UD to RTS")?;
    let q = ud.query().at("query UD")?;
    let _ = writeln!(
        out,
        "UD QP {}: {:?}, qkey {:#x}, sq_psn {:#x}",
        ud.qp_num(),
        q.state,
        q.qkey,
        q.sq_psn
    );
    // Data over UD: to a second UD QP; the receive buffer starts with the 40-byte GRH.
    let ud2 = pd
        .qp_builder(&send_cq, &recv_cq)
        .pool(&pool)
        .build::<Ud>()
        .at("create UD 2")?;
    let mut ud2 = ud2.ready(0x2222_2222, 0).at("UD 2 to RTS")?;
    let mut ud = ud;
    ud2.post_recv(3, take()?).at("UD post_recv")?;
    let mut outbox = take()?;
    outbox.set_len(512).at("UD buffer length")?;
    for (i, x) in outbox.as_mut_slice().iter_mut().enumerate() {
        *x = pattern(i);
    }
    let ah = pd.create_ah(&av).at("create address handle")?;
    ud.post_send_to(4, outbox, (&ah, ud2.qp_num(), 0x2222_2222))
        .at("UD post_send")?;
    let got = wait(&mut ud2, &recv_cq, &mut *cpu.0, "UD receive")?;
    let sent = wait(&mut ud, &send_cq, &mut *cpu.0, "UD send completion")?;
    check(&got, 40 + 512, 40, pattern, "UD payload")?;
    let _ = writeln!(
        out,
        "UD SEND {} -> {}: {} bytes received (40 GRH + 512), payload checked; send status {:?}",
        ud.qp_num(),
        ud2.qp_num(),
        got.wc.byte_len,
        sent.wc.status
    );
    drop((got, sent));
    ud2.destroy().at("destroy UD 2")?;

    let ud = ud.reset().at("UD to RESET")?;
    let _ = writeln!(
        out,
        "UD QP after reset: {:?}",
        ud.query().at("query UD")?.state
    );

    ud.destroy().at("destroy UD")?;
    a.destroy().at("destroy RC a")?;
    b.destroy().at("destroy RC b")?;
    pair_rcq.destroy().at("destroy the pair's recv CQ")?;
    pair_scq.destroy().at("destroy the pair's send CQ")?;
    on_srq.destroy().at("destroy RC on SRQ")?;
    srq.destroy().at("destroy SRQ")?;
    srq_cq.destroy().at("destroy SRQ CQ")?;
    gsi.destroy().at("destroy GSI")?;
    if pool.free_count() != pool.count() {
        let error = Error::Busy {
            op: bareverbs::error::Op::DestroyMr,
        };
        return Err(Failure {
            step: "every pool buffer back",
            error,
        });
    }
    drop((pool, ah));
    recv_cq.destroy().at("destroy recv CQ")?;
    send_cq.destroy().at("destroy send CQ")?;
    pd.destroy().at("destroy PD")?;
    gid.unbind().at("unbind GID")?;
    if irq {
        let c = ctx.irq_counts();
        let _ = writeln!(
            out,
            "interrupts: command {}, async {}, cq {}",
            c.command, c.async_events, c.cq
        );
        let (halted, spun) = wait::counts();
        let _ = writeln!(out, "waits: halted {halted}, spun {spun}");
    }
    drop(cpu);
    drop(ctx);
    Ok(Verdict::Pass)
}

/// The device's interrupts routed to a context through the embedder's CPU, unrouted when
/// dropped.
struct Routed<'a>(&'a mut dyn Cpu);

impl<'a> Routed<'a> {
    fn new(cpu: &'a mut dyn Cpu, entry: Option<Entry>) -> Self {
        cpu.route(entry);
        Routed(cpu)
    }
}

impl Drop for Routed<'_> {
    fn drop(&mut self) {
        self.0.route(None);
    }
}

/// Takes the next completion of `qp`, whose completions come to `cq`: while there is none,
/// waits for the CQ (armed; the CPU halts until its interrupt, or polls without interrupts),
/// a bounded number of times.
fn wait<'a, P: Provider, T: Transport, S: State>(
    qp: &mut QueuePair<'a, P, T, S>,
    cq: &CompletionQueue<'_, P>,
    cpu: &mut dyn Cpu,
    step: &'static str,
) -> Result<Completion<'a, P>, Failure> {
    let error = Error::Timeout {
        op: bareverbs::error::Op::PollCq,
    };
    for _ in 0..10_000_000 {
        // Wait first: a wait that finds the CQ ready returns at once, while a poll first
        // would mostly find the completion there already (QEMU's completion thread is
        // quick), and the interrupt path would seldom be taken.
        if cpu.takes_interrupts() {
            let spun = wait::counts().1;
            wait::block_on(cpu, cq.ready()).at(step)?;
            if wait::counts().1 != spun {
                // A wait that the interrupt did not end: the wake-up was lost.
                return Err(Failure { step, error });
            }
        } else {
            core::hint::spin_loop();
        }
        if let Some(c) = qp.poll_one().at(step)? {
            return Ok(c);
        }
    }
    Err(Failure { step, error })
}

/// Checks a receive completion: success, `len` bytes, the pattern from `offset` of its buffer.
fn check<P: Provider>(
    c: &Completion<'_, P>,
    len: u32,
    offset: usize,
    pattern: impl Fn(usize) -> u8,
    step: &'static str,
) -> Result<(), Failure> {
    let bad = |field, value: u64| Failure {
        step,
        error: Error::Protocol {
            op: bareverbs::error::Op::PollCq,
            fault: bareverbs::error::Fault::Value { field, value },
        },
    };
    if c.wc.status != WcStatus::Success {
        return Err(bad(&"status", c.wc.status as u64));
    }
    if c.wc.byte_len != len {
        return Err(bad(&"byte_len", u64::from(c.wc.byte_len)));
    }
    let Some(buf) = &c.buf else {
        return Err(bad(&"buffer", 0));
    };
    let data = &buf.as_slice()[offset..len as usize];
    match data.iter().enumerate().find(|&(i, &x)| x != pattern(i)) {
        Some((i, _)) => Err(bad(&"payload byte", i as u64)),
        None => Ok(()),
    }
}

fn report_caps<W: Write>(c: &DeviceCaps, out: &mut W) {
    let g = c.node_guid.to_le_bytes();
    let _ = writeln!(
        out,
        "caps: fw_ver {} node_guid {:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x} max_mr_size {:#x}",
        c.fw_ver, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], c.max_mr_size
    );
    let _ = writeln!(
        out,
        "caps: max_qp {} max_qp_wr {} max_sge {} max_cq {} max_cqe {} max_mr {} max_pd {}",
        c.max_qp, c.max_qp_wr, c.max_sge, c.max_cq, c.max_cqe, c.max_mr, c.max_pd
    );
    let _ = writeln!(
        out,
        "caps: max_srq {} max_srq_wr {} max_srq_sge {} max_ah {} gid_tbl_len {} max_pkeys {} ports {}",
        c.max_srq,
        c.max_srq_wr,
        c.max_srq_sge,
        c.max_ah,
        c.gid_tbl_len,
        c.max_pkeys,
        c.phys_port_cnt
    );
}

fn report_qp<W: Write>(out: &mut W, kind: &str, want: &QpCaps, qpn: u32, got: QpCaps) {
    let _ = writeln!(
        out,
        "{kind} QP {qpn}: asked wr {}/{} sge {}/{} -> got wr {}/{} sge {}/{} inline {}",
        want.max_send_wr,
        want.max_recv_wr,
        want.max_send_sge,
        want.max_recv_sge,
        got.max_send_wr,
        got.max_recv_wr,
        got.max_send_sge,
        got.max_recv_sge,
        got.max_inline_data
    );
}
