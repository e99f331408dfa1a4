//! perftest's control messages as `-R` sends them, and their checks (pure functions: the
//! host tests run them).

use super::super::{CaseError, CmCase};
use super::{Agreed, MIN_VERSION, Report, cycle_steps, parse_version};

/// Bytes of `struct pingpong_dest` (perftest's `perftest_resources.h`): on x86-64 seven
/// 4-byte fields around an 8-byte one, so 4 bytes of padding before `vaddr`.
pub const DEST_LEN: usize = 56;
/// Its padding (whatever perftest's stack held: never checked).
const PADDING: core::ops::Range<usize> = 20..24;
/// Bytes of a `pingpong_dest` that perftest defines.
pub const DEFINED: usize = DEST_LEN - 4;

/// One QP's `pingpong_dest`, every field big-endian on the wire (perftest's `HAVE_ENDIAN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u32,
    /// READs this side accepts in flight (1 but for `ib_read_bw`).
    pub out_reads: u32,
    /// QP number.
    pub qpn: u32,
    /// A starting PSN (unused with `-R`: the CM carries the real one).
    pub psn: u32,
    /// R_Key of the buffer the peer targets.
    pub rkey: u32,
    /// Its address.
    pub vaddr: u64,
    /// GID, bytes in order.
    pub gid: [u8; 16],
    /// SRQ number (0 on RC).
    pub srqn: u32,
    /// The GID's index on the sender's port.
    pub gid_index: u32,
}

impl Dest {
    /// The 56 bytes (padding zero).
    pub fn encode(&self) -> [u8; DEST_LEN] {
        let mut m = [0u8; DEST_LEN];
        m[0..4].copy_from_slice(&self.lid.to_be_bytes());
        m[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        m[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        m[12..16].copy_from_slice(&self.psn.to_be_bytes());
        m[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        m[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        m[32..48].copy_from_slice(&self.gid);
        m[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        m[52..56].copy_from_slice(&self.gid_index.to_be_bytes());
        m
    }

    /// Reads the 56 bytes (the padding ignored).
    pub fn parse(m: &[u8; DEST_LEN]) -> Dest {
        let u = |at: usize| u32::from_be_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]]);
        let mut v = [0u8; 8];
        v.copy_from_slice(&m[24..32]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&m[32..48]);
        Dest {
            lid: u(0),
            out_reads: u(4),
            qpn: u(8),
            psn: u(12),
            rkey: u(16),
            vaddr: u64::from_be_bytes(v),
            gid,
            srqn: u(48),
            gid_index: u(52),
        }
    }
}

/// What the peer's `pingpong_dest` must say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    /// The data QP's peer QPN, as the CM connected it.
    pub qpn: u32,
    /// The peer's IPv4-mapped GID.
    pub gid: [u8; 16],
    /// Its outstanding reads, when known (1 but for `ib_read_bw`; there, the depth its REQ
    /// asked for, when it connected).
    pub out_reads: Option<u32>,
}

fn wrong(what: &'static str, index: u32, at: usize) -> CaseError {
    CaseError::Message {
        what,
        index,
        at: at as u32,
    }
}

/// The first byte of `a` and `b` that differs outside the padding.
fn first_difference(a: &[u8; DEST_LEN], b: &[u8; DEST_LEN]) -> Option<usize> {
    (0..DEST_LEN).find(|&i| !PADDING.contains(&i) && a[i] != b[i])
}

/// Checks the peer's `index`-th `pingpong_dest` against `expect`, and against the first one
/// (`first`, set by the first call): perftest sends the same struct every time.
pub fn check_dest(
    m: &[u8; DEST_LEN],
    expect: &Expect,
    first: &mut Option<[u8; DEST_LEN]>,
    index: u32,
) -> Result<Dest, CaseError> {
    let what = "the peer's pingpong_dest";
    if let Some(f) = first {
        return match first_difference(f, m) {
            Some(at) => Err(wrong(
                "a pingpong_dest (not the first one's bytes)",
                index,
                at,
            )),
            None => Ok(Dest::parse(m)),
        };
    }
    let d = Dest::parse(m);
    let checks = [
        (d.lid == 0, 0),
        (
            d.out_reads >= 1 && expect.out_reads.is_none_or(|o| o == d.out_reads),
            4,
        ),
        (d.qpn == expect.qpn, 8),
        (d.psn <= 0xFF_FFFF, 12),
        (d.gid == expect.gid, 32),
        (d.srqn == 0, 48),
        (d.gid_index <= 0xFF, 52),
    ];
    if let Some(&(_, at)) = checks.iter().find(|(ok, _)| !ok) {
        return Err(wrong(what, index, at));
    }
    *first = Some(*m);
    Ok(d)
}

/// The blank `pingpong_dest` perftest sends around the data connection: zero but for the
/// padding.
pub fn check_blank(m: &[u8; DEST_LEN], what: &'static str) -> Result<(), CaseError> {
    match first_difference(m, &[0; DEST_LEN]) {
        Some(at) => Err(wrong(what, 0, at)),
        None => Ok(()),
    }
}

/// The peer's 16-byte version: a version perftest 6.06 talks to, NUL-padded.
pub fn check_version(m: &[u8]) -> Result<u32, CaseError> {
    let bad = |at: usize| wrong("the version", 0, at);
    let v = parse_version(m).map_err(|_| bad(0))?;
    if v < MIN_VERSION {
        return Err(bad(0));
    }
    let nul = m.iter().position(|&b| b == 0).unwrap_or(m.len());
    match m[nul..].iter().position(|&b| b != 0) {
        Some(at) => Err(bad(nul + at)),
        None => Ok(v),
    }
}

/// A big-endian 4-byte power of two within `range` (the page size, the cache line).
pub fn check_power(
    m: &[u8],
    range: core::ops::RangeInclusive<u32>,
    what: &'static str,
) -> Result<u32, CaseError> {
    let v = u32::from_be_bytes([m[0], m[1], m[2], m[3]]);
    if v.is_power_of_two() && range.contains(&v) {
        Ok(v)
    } else {
        Err(wrong(what, 0, 0))
    }
}

/// The MTU: one digit `1`..=`5` (`ibv_mtu`), then a NUL.
pub fn check_mtu(m: &[u8]) -> Result<u8, CaseError> {
    if !(b'1'..=b'5').contains(&m[0]) {
        return Err(wrong("the MTU", 0, 0));
    }
    if m[1] != 0 {
        return Err(wrong("the MTU", 0, 1));
    }
    Ok(m[0] - b'0')
}

/// The Linux client's report: the case's size and iterations, finite non-negative figures.
pub fn check_report(r: &Report, case: &CmCase) -> Result<(), CaseError> {
    let what = "the client's report";
    let ok_f = |f: f64| f.is_finite() && f >= 0.0;
    let checks = [
        (r.size == u64::from(case.size), 0),
        (r.iters == u64::from(case.count), 8),
        (ok_f(r.bw_peak), 16),
        (ok_f(r.bw_avg), 24),
        (ok_f(r.msg_rate), 32),
    ];
    match checks.iter().find(|(ok, _)| !ok) {
        Some(&(_, at)) => Err(wrong(what, 0, at)),
        None => Ok(()),
    }
}

/// Byte `j` of the area the peer WRITEs or READs, before it does.
pub fn prefill(j: usize) -> u8 {
    (j * 13 + 5) as u8
}

/// `area` holds its pre-fill still (the buffer the peer READs); `what` names it otherwise.
pub fn check_prefill(area: &[u8], what: &'static str) -> Result<(), CaseError> {
    match (0..area.len()).find(|&j| area[j] != prefill(j)) {
        Some(j) => Err(wrong(what, 0, j)),
        None => Ok(()),
    }
}

/// `ib_atomic_lat`'s target after the peer's `iters` fetch-and-adds of 1 on a zeroed area:
/// its 8-byte words (in this machine's order, as the device stores them) add up to `iters`,
/// each executed once.
pub fn check_added(area: &[u8], iters: u32) -> Result<(), CaseError> {
    let sum = area
        .chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().unwrap_or([0; 8])))
        .fold(0u64, u64::wrapping_add);
    if sum == u64::from(iters) {
        Ok(())
    } else {
        Err(wrong("the word the fetch-and-adds land on (not -n)", 0, 0))
    }
}

/// The peer's `ib_write_lat` WRITE of round `round` (from 0), once its last byte shows the
/// round's number: the bytes before it zero (perftest's buffer is zeroed and only its last
/// byte changes).
pub fn check_round_write(buf: &[u8], round: u32) -> Result<(), CaseError> {
    let body = buf.len().saturating_sub(1);
    match buf[..body].iter().position(|&b| b != 0) {
        Some(at) => Err(wrong(
            "a WRITE of the peer's (not zeroes before its round's number)",
            round,
            at,
        )),
        None => Ok(()),
    }
}

/// The longest run of pre-fill bytes a WRITE target may still hold by chance (perftest
/// writes `rand()` bytes: a run of 8 has odds of 2^-64 at each place).
const RUN: usize = 8;

/// `ib_write_bw`'s target after `iters` WRITEs of `size` bytes, perftest's client placing
/// them as [`cycle_steps`] says from the start of `area`: every place written holds no run
/// of [`RUN`] pre-fill bytes, every other byte its pre-fill.
pub fn check_write_target(
    area: &[u8],
    size: u32,
    iters: u32,
    agreed: Agreed,
) -> Result<(), CaseError> {
    let (period, step) = cycle_steps(size, agreed.cycle, agreed.line);
    let places = period.min(iters) as usize;
    let written = |j: usize| {
        (0..places).any(|k| {
            let at = k * step as usize;
            (at..at + size as usize).contains(&j)
        })
    };
    let mut run = 0;
    for (j, &b) in area.iter().enumerate() {
        let pre = b == prefill(j);
        if written(j) {
            run = if pre { run + 1 } else { 0 };
            if run >= RUN {
                return Err(wrong("the WRITE target (not overwritten)", 0, j + 1 - RUN));
            }
        } else {
            run = 0;
            if !pre {
                return Err(wrong("the WRITE target's surroundings (touched)", 0, j));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm_peer::Program;
    use crate::cm_peer::perftest::PtVerb;

    fn sample() -> Dest {
        Dest {
            lid: 0,
            out_reads: 1,
            qpn: 0x11,
            psn: 0xAB_CDEF,
            rkey: 0x1234_5678,
            vaddr: 0x7F12_3456_7000,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 1],
            srqn: 0,
            gid_index: 1,
        }
    }

    #[test]
    fn dest_is_the_c_struct_big_endian() {
        let m = sample().encode();
        assert_eq!(
            &m[0..20],
            &[
                0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0x11, 0, 0xAB, 0xCD, 0xEF, 0x12, 0x34, 0x56, 0x78
            ]
        );
        assert_eq!(&m[24..32], &[0, 0, 0x7F, 0x12, 0x34, 0x56, 0x70, 0]);
        assert_eq!(&m[44..48], &[10, 0, 0, 1]);
        assert_eq!(&m[52..56], &[0, 0, 0, 1]);
        assert_eq!(Dest::parse(&m), sample());
    }

    #[test]
    fn dests_are_checked_and_must_repeat() {
        let e = Expect {
            qpn: 0x11,
            gid: sample().gid,
            out_reads: Some(1),
        };
        let mut m = sample().encode();
        m[21] = 0x99; // padding: ignored
        let mut first = None;
        assert_eq!(check_dest(&m, &e, &mut first, 0), Ok(sample()));
        assert_eq!(
            check_dest(&sample().encode(), &e, &mut first, 1),
            Ok(sample())
        );
        let mut other = sample().encode();
        other[19] ^= 1;
        assert_eq!(
            check_dest(&other, &e, &mut first, 2),
            Err(CaseError::Message {
                what: "a pingpong_dest (not the first one's bytes)",
                index: 2,
                at: 19
            })
        );
        let at = |d: Dest, e: &Expect| match check_dest(&d.encode(), e, &mut None, 0) {
            Err(CaseError::Message { at, .. }) => at,
            _ => u32::MAX,
        };
        assert_eq!(
            at(
                Dest {
                    qpn: 0x12,
                    ..sample()
                },
                &e
            ),
            8
        );
        assert_eq!(at(Dest { lid: 3, ..sample() }, &e), 0);
        assert_eq!(
            at(
                Dest {
                    out_reads: 128,
                    ..sample()
                },
                &e
            ),
            4
        );
        assert_eq!(
            at(
                Dest {
                    srqn: 1,
                    ..sample()
                },
                &e
            ),
            48
        );
        assert_eq!(
            at(
                Dest {
                    gid: [0; 16],
                    ..sample()
                },
                &e
            ),
            32
        );
        let any_reads = Expect {
            out_reads: None,
            ..e
        };
        assert_eq!(
            at(
                Dest {
                    out_reads: 128,
                    ..sample()
                },
                &any_reads
            ),
            u32::MAX
        );
        assert_eq!(
            at(
                Dest {
                    out_reads: 0,
                    ..sample()
                },
                &any_reads
            ),
            4
        );
    }

    #[test]
    fn blanks_versions_powers_mtus() {
        let mut b = [0u8; DEST_LEN];
        b[20..24].copy_from_slice(&[1, 2, 3, 4]);
        assert!(check_blank(&b, "x").is_ok());
        b[30] = 1;
        assert_eq!(check_blank(&b, "x"), Err(wrong("x", 0, 30)));
        let mut v = [0u8; 16];
        v[..4].copy_from_slice(b"6.06");
        assert_eq!(check_version(&v), Ok(606));
        v[10] = b'x';
        assert_eq!(check_version(&v), Err(wrong("the version", 0, 10)));
        v[..4].copy_from_slice(b"5.60");
        v[10] = 0;
        assert!(check_version(&v).is_err());
        assert_eq!(
            check_power(&4096u32.to_be_bytes(), 4096..=65536, "p"),
            Ok(4096)
        );
        assert!(check_power(&4095u32.to_be_bytes(), 1..=65536, "p").is_err());
        assert!(check_power(&(1u32 << 20).to_be_bytes(), 4096..=65536, "p").is_err());
        assert_eq!(check_mtu(b"3\0"), Ok(3));
        assert!(check_mtu(b"6\0").is_err());
        assert!(check_mtu(b"33").is_err());
    }

    #[test]
    fn reports_name_the_case() {
        let case = CmCase {
            program: Program::Perftest {
                verb: PtVerb::Read,
                linux_serves: false,
            },
            size: 4096,
            count: 200,
        };
        let r = Report {
            size: 4096,
            iters: 200,
            bw_peak: 10.0,
            bw_avg: 9.0,
            msg_rate: 0.01,
        };
        assert!(check_report(&r, &case).is_ok());
        assert!(check_report(&Report { iters: 199, ..r }, &case).is_err());
        assert!(
            check_report(
                &Report {
                    bw_avg: f64::NAN,
                    ..r
                },
                &case
            )
            .is_err()
        );
    }

    #[test]
    fn latency_targets_prefills_and_round_writes() {
        // ib_atomic_lat's word: -n fetch-and-adds of 1 on a zeroed area.
        let mut area = [0u8; 64];
        area[..8].copy_from_slice(&200u64.to_ne_bytes());
        assert_eq!(check_added(&area, 200), Ok(()));
        assert!(check_added(&area, 199).is_err());
        area[8] = 1;
        assert!(check_added(&area, 200).is_err(), "one add too many");
        // ib_read_lat's buffer: its pre-fill untouched.
        let mut buf = [0u8; 128];
        buf.iter_mut()
            .enumerate()
            .for_each(|(j, b)| *b = prefill(j));
        assert_eq!(check_prefill(&buf, "b"), Ok(()));
        buf[77] ^= 0x10;
        assert_eq!(check_prefill(&buf, "b"), Err(wrong("b", 0, 77)));
        // ib_write_lat's WRITE: zeroes, then the round's number.
        assert_eq!(check_round_write(&[0, 0, 0, 9], 8), Ok(()));
        assert_eq!(check_round_write(&[9], 8), Ok(()), "a 1-byte WRITE");
        assert_eq!(
            check_round_write(&[0, 3, 0, 9], 8),
            Err(wrong(
                "a WRITE of the peer's (not zeroes before its round's number)",
                8,
                1
            ))
        );
    }

    #[test]
    fn write_targets_follow_perftests_cycle() {
        let agreed = Agreed {
            cycle: 4096,
            line: 64,
        };
        assert_eq!(cycle_steps(4096, 4096, 64), (1, 0));
        assert_eq!(cycle_steps(100, 4096, 64), (32, 128));
        assert_eq!(cycle_steps(10, 4096, 64), (64, 64));
        // 4096-byte WRITEs: the first 4096 bytes rewritten, the rest untouched.
        let mut area = [0u8; 8192];
        area.iter_mut()
            .enumerate()
            .for_each(|(j, b)| *b = prefill(j));
        for (j, b) in area[..4096].iter_mut().enumerate() {
            *b = (j as u8).wrapping_mul(7) ^ 0x5A;
        }
        // A byte of the pre-fill here and there is chance.
        area[100] = prefill(100);
        assert!(check_write_target(&area, 4096, 10, agreed).is_ok());
        let mut short = area;
        for (j, b) in short.iter_mut().enumerate().skip(2000).take(8) {
            *b = prefill(j);
        }
        assert!(check_write_target(&short, 4096, 10, agreed).is_err());
        let mut touched = area;
        touched[5000] ^= 1;
        assert_eq!(
            check_write_target(&touched, 4096, 10, agreed),
            Err(wrong("the WRITE target's surroundings (touched)", 0, 5000))
        );
        // 100-byte WRITEs, 3 of them: at 0, 128, 256.
        let mut small = [0u8; 8192];
        small
            .iter_mut()
            .enumerate()
            .for_each(|(j, b)| *b = prefill(j));
        for k in 0..3 {
            for (j, b) in small.iter_mut().enumerate().skip(k * 128).take(100) {
                *b = !prefill(j);
            }
        }
        assert!(check_write_target(&small, 100, 3, agreed).is_ok());
        assert!(check_write_target(&small, 100, 4, agreed).is_err());
    }
}
