//! mckey (librdmacm-utils' multicast test, `docs/multicast.md`) against the unikernel:
//!
//! | case | Linux runs | the unikernel |
//! | --- | --- | --- |
//! | `mckey-server` | `mckey -m <group> -b <its address>`: joins, takes `-C` datagrams | waits for Linux's IGMP report for the group, then sends rounds of `-C` datagrams of `-S` bytes to it until Linux's IGMP leave |
//! | `mckey-client` | `mckey -s -m <group> -b <its address>`: joins, sends `-C` datagrams | attaches a UD QP to the group, takes the `-C` datagrams and checks each |
//!
//! Over RoCEv2 Linux's CM joins a group without a word on the wire: the group's GID is the
//! IPv4-mapped GID of its address, its Q_Key rdma_cm's UDP one (0x01234567), the remote QPN
//! 0xFFFFFF; the kernel joins the IP group (IGMP) and the QP is attached locally. So the
//! unikernel needs no CM for it: it attaches its QP to the same GID directly. mckey SENDs
//! WITH_IMM (the immediate its QPN) from one buffer, unsignaled, three seconds after its join;
//! its receiver takes `-C` completions, whatever their status, then leaves.

use core::fmt::Write;

use bareverbs::Context;
use bareverbs::cm::msg::UDP_QKEY;
use bareverbs::device::rxe::{MCAST_QPN, Rxe};
use bareverbs::hal::{Clock, Hal, Link};
use bareverbs::verbs::*;

use super::CaseError;
use crate::Step;
use crate::peer::grh_ok;

/// Bytes of the GRH area before a UD receive's payload.
const GRH: u32 = 40;
/// Largest `-S` (a datagram within the 1024-byte path MTU) and `-C` of a case.
pub const MAX_SIZE: u32 = 1024;
/// Largest `-C` of a case.
pub const MAX_COUNT: u32 = 32;
/// Milliseconds between two rounds of the sender.
const ROUND_MS: u64 = 500;
/// Rounds the sender sends at most after Linux's join without seeing its leave.
const ROUNDS: u32 = 40;
/// The GID index of the device's IPv4-mapped GID.
const GID_INDEX: u8 = 1;

/// An mckey case: who sends, the group, `-S` and `-C`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct McCase {
    /// Linux runs `mckey -s` (`mckey-client`): the unikernel receives.
    pub linux_sends: bool,
    /// The IPv4 group (`-m`).
    pub group: [u8; 4],
    /// Bytes of a datagram (`-S`, default 100).
    pub size: u32,
    /// Datagrams (`-C`, default 10).
    pub count: u32,
}

impl McCase {
    /// Parses `mckey-server,-m,239.192.0.1,-C,10,-S,100` (`,` for spaces); `None` for another
    /// program, a group that is not class D, or options out of range.
    pub fn parse(spec: &str) -> Option<McCase> {
        let mut words = spec.split(',').filter(|w| !w.is_empty());
        let linux_sends = match words.next()? {
            "mckey-server" => false,
            "mckey-client" => true,
            _ => return None,
        };
        let (mut group, mut size, mut count) = (None, 100, 10);
        while let Some(w) = words.next() {
            match w {
                "-m" => group = Some(crate::tcp::stack::parse_ipv4(words.next()?)?),
                "-S" => size = words.next()?.parse().ok()?,
                "-C" => count = words.next()?.parse().ok()?,
                _ => return None,
            }
        }
        let group = group.filter(|g| g[0] >> 4 == 0xE)?;
        let ok = (1..=MAX_SIZE).contains(&size) && (1..=MAX_COUNT).contains(&count);
        ok.then_some(McCase {
            linux_sends,
            group,
            size,
            count,
        })
    }
}

/// What an IGMP message in `frame` from `from` says of `group`: `Some(true)` a join (an
/// IGMPv2 report, or an IGMPv3 record of exclude mode), `Some(false)` a leave (IGMPv2's, or
/// IGMPv3's change to include mode with no source). Every length is checked against the
/// frame; at most 64 records are looked at.
pub fn igmp_news(frame: &[u8], from: [u8; 4], group: [u8; 4]) -> Option<bool> {
    if frame.get(12..14)? != [0x08, 0x00] {
        return None;
    }
    let ip = frame.get(14..)?;
    let ihl = usize::from(ip.first()? & 0xF) * 4;
    if ip[0] >> 4 != 4 || ihl < 20 || *ip.get(9)? != 2 || ip.get(12..16)? != from {
        return None;
    }
    let g = ip.get(ihl..)?;
    match *g.first()? {
        0x16 => (g.get(4..8)? == group).then_some(true),
        0x17 => (g.get(4..8)? == group).then_some(false),
        0x22 => {
            let n = u16::from_be_bytes([*g.get(6)?, *g.get(7)?]);
            let mut at = 8usize;
            for _ in 0..n.min(64) {
                let r = g.get(at..at + 8)?;
                let sources = usize::from(u16::from_be_bytes([r[2], r[3]]));
                if r[4..8] == group {
                    match (r[0], sources) {
                        (2 | 4, _) => return Some(true),
                        (1 | 3, 0) => return Some(false),
                        _ => {}
                    }
                }
                at += 8 + 4 * sources + 4 * usize::from(r[1]);
            }
            None
        }
        _ => None,
    }
}

/// Milliseconds between two queries while the sender waits for Linux's report.
const QUERY_MS: u64 = 1000;

/// An IGMPv3 group-specific query for `group` (RFC 3376 §4.1) from the station with `mac` and
/// `ip`: to the group (its MAC), TTL 1, Router Alert, a maximum response time of one second,
/// no source. A member answers with a report of the group's current state (exclude mode).
pub fn query(mac: [u8; 6], ip: [u8; 4], group: [u8; 4]) -> [u8; 60] {
    use bareverbs::device::rxe::wire::{igmp, ip::ones_sum};
    let mut f = [0u8; 60];
    f[..6].copy_from_slice(&igmp::multicast_mac(group));
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let h = &mut f[14..38];
    h[0] = 0x46;
    h[1] = 0xC0;
    h[2..4].copy_from_slice(&36u16.to_be_bytes());
    h[6] = 0x40;
    h[8] = 1;
    h[9] = igmp::PROTOCOL;
    h[12..16].copy_from_slice(&ip);
    h[16..20].copy_from_slice(&group);
    h[20..24].copy_from_slice(&[0x94, 0x04, 0, 0]);
    let sum = !(ones_sum(0, h) as u16);
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    let q = &mut f[38..50];
    q[0] = 0x11;
    q[1] = 10; // tenths of a second
    q[4..8].copy_from_slice(&group);
    q[8] = 2; // QRV 2, S 0
    q[9] = 125; // QQIC: 125 s, the default
    let sum = !(ones_sum(0, q) as u16);
    q[2..4].copy_from_slice(&sum.to_be_bytes());
    f
}

/// Runs an mckey case against Linux at `linux` and prints its `roce-uk` line; `true` if it
/// passed.
#[allow(clippy::too_many_arguments)]
pub fn run_case<H: Hal, L: Link, C: Clock>(
    ctx: &Context<Rxe<H, L, C>>,
    pd: &ProtectionDomain<'_, Rxe<H, L, C>>,
    linux: [u8; 4],
    name: &str,
    case: &McCase,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
    out: &mut dyn Write,
) -> bool {
    let t0 = clock_ms();
    let r = run(ctx, pd, linux, case, deadline, clock_ms);
    let ms = clock_ms() - t0;
    let [a, b, c, d] = case.group;
    match r {
        Ok(what) => {
            let _ = writeln!(
                out,
                "roce-uk {name}: ok {what}, group {a}.{b}.{c}.{d} (QPN 0xFFFFFF, Q_Key {UDP_QKEY:#010x}, QP attached directly); {ms} ms in all"
            );
            true
        }
        Err(e) => {
            let _ = writeln!(out, "roce-uk {name}: FAIL {e} (after {ms} ms)");
            false
        }
    }
}

/// What a case that passed did, in words.
struct Did {
    rounds: u32,
    /// Queries sent before Linux's report came.
    queries: u32,
    count: u32,
    size: u32,
    receiver: bool,
    from_qp: u32,
}

impl core::fmt::Display for Did {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.receiver {
            write!(
                f,
                "{} datagrams of {} bytes from QP {:#x}, every byte checked ({} each: GRH area, immediate, the first one's payload)",
                self.count,
                self.size,
                self.from_qp,
                self.size + GRH
            )
        } else {
            write!(
                f,
                "{} rounds of {} datagrams of {} bytes sent between Linux's IGMP join (a report after {} queries of ours) and its leave",
                self.rounds, self.count, self.size, self.queries
            )
        }
    }
}

fn run<H: Hal, L: Link, C: Clock>(
    ctx: &Context<Rxe<H, L, C>>,
    pd: &ProtectionDomain<'_, Rxe<H, L, C>>,
    linux: [u8; 4],
    case: &McCase,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
) -> Result<Did, CaseError> {
    let cq = ctx.create_cq(2 * MAX_COUNT + 4).at("mckey: create CQ")?;
    let slot = case.size + GRH;
    let mut mr = pd
        .register(((case.count + 1) * slot) as usize, AccessFlags::LOCAL_WRITE)
        .at("mckey: register")?;
    let caps = QpCaps {
        max_send_wr: MAX_COUNT,
        max_recv_wr: MAX_COUNT,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .qp_builder(&cq, &cq)
        .caps(caps)
        .build::<Ud>()
        .at("mckey: create UD QP")?;
    let mut qp = qp.ready(UDP_QKEY, 0).at("mckey: UD QP to RTS")?;
    let mut x = Mc {
        ctx,
        cq: &cq,
        linux,
        case,
        deadline,
        clock_ms,
    };
    let r = if case.linux_sends {
        x.receive(&mut qp, &mut mr)
    } else {
        x.send(&mut qp, pd, &mut mr)
    };
    // Whatever is left on the CQ goes; the QP leaves its group as it is destroyed.
    let mut wcs = [WorkCompletion::default(); 8];
    for _ in 0..8 {
        if cq.poll(&mut wcs).unwrap_or(0) == 0 {
            break;
        }
    }
    drop(qp);
    r
}

struct Mc<'c, 'q, H: Hal, L: Link, C: Clock> {
    ctx: &'c Context<Rxe<H, L, C>>,
    cq: &'q CompletionQueue<'q, Rxe<H, L, C>>,
    linux: [u8; 4],
    case: &'c McCase,
    deadline: u64,
    clock_ms: &'c dyn Fn() -> u64,
}

impl<'a, H: Hal, L: Link, C: Clock> Mc<'_, 'a, H, L, C> {
    fn now(&self) -> u64 {
        (self.clock_ms)()
    }

    /// The next IGMP news of the case's group from Linux, among the frames for the IP stack
    /// (none: nothing now).
    fn igmp(&self) -> Option<bool> {
        let mut buf = [0u8; 1536];
        let mut stack = self.ctx.provider().stack();
        // Bounded: the device queues a few frames for the stack at most.
        for _ in 0..16 {
            let n = stack.receive(&mut buf)?;
            if let Some(news) = igmp_news(&buf[..n.min(buf.len())], self.linux, self.case.group) {
                return Some(news);
            }
        }
        None
    }

    /// The unikernel receives (Linux runs `mckey -s`).
    fn receive(
        &mut self,
        qp: &mut QueuePair<'a, Rxe<H, L, C>, Ud, Rts>,
        mr: &mut MemoryRegion<'a, Rxe<H, L, C>>,
    ) -> Result<Did, CaseError> {
        let (count, size, slot) = (self.case.count, self.case.size, self.case.size + GRH);
        // SAFETY: the region outlives the QP's receives (it is dropped after the QP, and
        // read only after their completions).
        unsafe {
            let mut rb = qp.recv_batch();
            for i in 0..count {
                let sge = mr.sge(i * slot, slot).at("mckey: sge")?;
                rb.recv(u64::from(i), &[sge]).at("mckey: post receive")?;
            }
            rb.finish();
        }
        let group = Gid::from_ipv4(self.case.group);
        qp.attach_mcast(group, 0).at("mckey: attach")?;
        let mut got = [None::<WorkCompletion>; MAX_COUNT as usize];
        let mut n = 0;
        while n < count {
            let mut wcs = [WorkCompletion::default(); 8];
            let k = self.cq.poll(&mut wcs).at("mckey: poll CQ")?;
            for w in &wcs[..k] {
                if w.status != WcStatus::Success || w.wr_id >= u64::from(count) {
                    return Err(CaseError::Status(w.status, w.wr_id));
                }
                if got[w.wr_id as usize].replace(*w).is_none() {
                    n += 1;
                }
            }
            let _ = self.igmp();
            if k == 0 && self.now() > self.deadline {
                return Err(CaseError::Deadline("Linux's datagrams"));
            }
        }
        let _ = qp.detach_mcast(group, 0);
        let bad = |what, i, at| CaseError::Bytes { what, ping: i, at };
        let bytes = mr.as_slice();
        let from_qp = got[0].map_or(0, |w| w.src_qp);
        let first = &bytes[GRH as usize..slot as usize];
        for i in 0..count {
            let w = got[i as usize].ok_or(bad("a datagram", i, u32::MAX))?;
            if w.byte_len != slot || w.opcode != WcOpcode::Recv {
                return Err(bad("a datagram's length", i, u32::MAX));
            }
            // mckey's immediate is its QPN: the datagram's source.
            if w.src_qp != from_qp || !w.flags.contains(WcFlags::WITH_IMM) || w.imm != w.src_qp {
                return Err(bad("a datagram's source QP or immediate", i, u32::MAX));
            }
            let m = &bytes[(i * slot) as usize..((i + 1) * slot) as usize];
            if !grh_ok(&m[..GRH as usize], &Gid::from_ipv4(self.linux), &group) {
                return Err(bad(
                    "a datagram's GRH area (not from Linux to the group)",
                    i,
                    0,
                ));
            }
            // mckey sends one buffer every time: every payload is the first one's.
            if let Some(at) = m[GRH as usize..]
                .iter()
                .zip(first)
                .position(|(a, b)| a != b)
            {
                return Err(bad("a datagram (not the first one's bytes)", i, at as u32));
            }
        }
        Ok(Did {
            rounds: 1,
            queries: 0,
            count,
            size,
            receiver: true,
            from_qp,
        })
    }

    /// The unikernel sends (Linux runs `mckey`).
    fn send(
        &mut self,
        qp: &mut QueuePair<'a, Rxe<H, L, C>, Ud, Rts>,
        pd: &'a ProtectionDomain<'a, Rxe<H, L, C>>,
        mr: &mut MemoryRegion<'a, Rxe<H, L, C>>,
    ) -> Result<Did, CaseError> {
        let (count, size) = (self.case.count, self.case.size);
        // Linux's receiver posted its receives before it joined: its report says it is there.
        // Its IGMPv3 reports go to 224.0.0.22, an IGMPv2 leave to 224.0.0.2 (a NIC with a
        // multicast filter, the Intel ones, takes them only when asked).
        let dev = self.ctx.provider();
        dev.join_ethernet_group(bareverbs::device::rxe::wire::igmp::multicast_mac([
            224, 0, 0, 22,
        ]));
        dev.join_ethernet_group(bareverbs::device::rxe::wire::igmp::multicast_mac([
            224, 0, 0, 2,
        ]));
        // Its unsolicited reports may have come before this case (the unikernel still
        // booting, or in its previous case): a query for the group, every QUERY_MS until a
        // report answers, asks Linux for another.
        let (mut next_query, mut queries) = (self.now(), 0);
        while self.igmp() != Some(true) {
            if self.now() >= next_query {
                let q = query(dev.mac(), dev.ip(), self.case.group);
                let _ = dev.stack().transmit(&q);
                next_query = self.now() + QUERY_MS;
                queries += 1;
            }
            let mut wcs = [WorkCompletion::default(); 4];
            let _ = self.cq.poll(&mut wcs);
            if self.now() > self.deadline {
                return Err(CaseError::Deadline("Linux's IGMP report for the group"));
            }
        }
        let mut av = AddressVector::new(Gid::from_ipv4(self.case.group), GID_INDEX);
        av.hop_limit = 64;
        let ah = pd.create_ah(&av).at("mckey: create AH")?;
        for (j, b) in mr.as_mut_slice()[..size as usize].iter_mut().enumerate() {
            *b = b'a' + (j % 26) as u8;
        }
        let me = qp.qp_num();
        let mut rounds = 0;
        loop {
            // A round: after a pause (the receiver attaches its QP once its join returned),
            // the datagrams, then their completions.
            let until = self.now() + ROUND_MS;
            while self.now() < until {
                let mut wcs = [WorkCompletion::default(); 4];
                let _ = self.cq.poll(&mut wcs);
                if self.igmp() == Some(false) {
                    return Ok(Did {
                        rounds,
                        queries,
                        count,
                        size,
                        receiver: false,
                        from_qp: me,
                    });
                }
            }
            if rounds == ROUNDS {
                return Err(CaseError::Deadline(
                    "Linux's IGMP leave (its receiver done)",
                ));
            }
            rounds += 1;
            let sge = mr.sge(0, size).at("mckey: sge")?;
            // SAFETY: the region outlives the sends (it is dropped after the QP), and is not
            // written while they are outstanding.
            unsafe {
                let mut sb = qp.send_batch();
                for i in 0..count {
                    let to = (&ah, MCAST_QPN, UDP_QKEY);
                    sb.send_to_imm(u64::from(i), SendFlags::SIGNALED, to, me, &[sge])
                        .at("mckey: post send")?;
                }
                sb.finish();
            }
            let mut done = 0;
            while done < count {
                let mut wcs = [WorkCompletion::default(); 8];
                let k = self.cq.poll(&mut wcs).at("mckey: poll CQ")?;
                for w in &wcs[..k] {
                    if w.status != WcStatus::Success {
                        return Err(CaseError::Status(w.status, w.wr_id));
                    }
                }
                done += k as u32;
                if k == 0 && self.now() > self.deadline {
                    return Err(CaseError::Deadline("the sends' completions"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_parse_as_mckeys_options() {
        let c = McCase::parse("mckey-server,-m,239.192.0.1,-C,10,-S,100").expect("a case");
        assert_eq!(
            (c.linux_sends, c.group, c.size, c.count),
            (false, [239, 192, 0, 1], 100, 10)
        );
        let c = McCase::parse("mckey-client,-m,224.1.2.3").expect("defaults");
        assert_eq!((c.linux_sends, c.size, c.count), (true, 100, 10));
        assert_eq!(McCase::parse("mckey-client"), None);
        assert_eq!(McCase::parse("mckey-client,-m,10.0.0.1"), None);
        assert_eq!(McCase::parse("mckey-client,-m,239.1.1.1,-S,2000"), None);
        assert_eq!(McCase::parse("mckey-client,-m,239.1.1.1,-C,0"), None);
        assert_eq!(McCase::parse("mckey-client,-m,239.1.1.1,-x"), None);
        assert_eq!(McCase::parse("rping-client"), None);
    }

    /// An IPv4 frame from 10.0.0.1 carrying `igmp` (header without options).
    fn frame(igmp: &[u8]) -> [u8; 80] {
        let mut f = [0u8; 80];
        f[12..14].copy_from_slice(&[8, 0]);
        f[14] = 0x45;
        f[23] = 2;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[34..34 + igmp.len()].copy_from_slice(igmp);
        f
    }

    #[test]
    fn a_query_is_an_igmpv3_group_specific_query_to_the_group() {
        use bareverbs::device::rxe::wire::ip::ones_sum;
        let q = query([0x52, 0x54, 0, 0, 0, 2], [10, 0, 0, 2], [239, 192, 0, 1]);
        assert_eq!(&q[..6], &[0x01, 0x00, 0x5E, 0x40, 0, 1]);
        assert_eq!(ones_sum(0, &q[14..38]), 0xFFFF);
        assert_eq!(ones_sum(0, &q[38..50]), 0xFFFF);
        assert_eq!((q[22], q[23], q[38], q[39]), (1, 2, 0x11, 10));
        assert_eq!(&q[30..34], &[239, 192, 0, 1]);
        assert_eq!(&q[42..46], &[239, 192, 0, 1]);
        // Twelve bytes of IGMP (a v3 query), no source.
        assert_eq!(u16::from_be_bytes([q[16], q[17]]), 36);
        assert_eq!(&q[48..50], &[0, 0]);
    }

    #[test]
    fn igmp_joins_and_leaves_are_read_with_their_lengths_checked() {
        let (a, g) = ([10, 0, 0, 1], [239, 192, 0, 1]);
        // IGMPv3: a record of another group (one source), then ours to exclude mode.
        let v3 = [
            0x22, 0, 0, 0, 0, 0, 0, 2, 4, 0, 0, 1, 239, 9, 9, 9, 1, 2, 3, 4, 4, 0, 0, 0, 239, 192,
            0, 1,
        ];
        assert_eq!(igmp_news(&frame(&v3), a, g), Some(true));
        let leave3 = [0x22, 0, 0, 0, 0, 0, 0, 1, 3, 0, 0, 0, 239, 192, 0, 1];
        assert_eq!(igmp_news(&frame(&leave3), a, g), Some(false));
        assert_eq!(
            igmp_news(&frame(&[0x16, 0, 0, 0, 239, 192, 0, 1]), a, g),
            Some(true)
        );
        assert_eq!(
            igmp_news(&frame(&[0x17, 0, 0, 0, 239, 192, 0, 1]), a, g),
            Some(false)
        );
        // From another station, or of another group: nothing.
        assert_eq!(
            igmp_news(&frame(&[0x16, 0, 0, 0, 239, 192, 0, 1]), [10, 0, 0, 3], g),
            None
        );
        assert_eq!(
            igmp_news(&frame(&[0x16, 0, 0, 0, 239, 192, 0, 2]), a, g),
            None
        );
        // A record count past the frame: no read beyond it.
        let long = [0x22, 0, 0, 0, 0, 0, 0xFF, 0xFF, 4, 0, 0xFF, 0xFF];
        assert_eq!(igmp_news(&frame(&long)[..46], a, g), None);
        assert_eq!(igmp_news(&frame(&[0x22])[..30], a, g), None);
    }
}
