//! What the target counts per queue and per controller ([`IoCounts`]: commands, errors by
//! status, bytes, a latency histogram), and the requests and Connects it refused
//! ([`Refusal`]). Heap-free: fixed arrays, a few adds per command.

use crate::wire::Status;
use crate::wire::cm::CmRejStatus;
use crate::wire::fabrics::Nqn;

/// Buckets of the latency histogram: bucket 0 holds commands that took under 1 µs of the
/// target's clock, bucket `k` (1 to 18) those of `2^(k-1)` to `2^k - 1` µs, the last one
/// (19) everything from 2^18 µs (262 ms) up.
pub const LATENCY_BUCKETS: usize = 20;
/// Distinct error statuses counted one by one; errors of further statuses are counted
/// together ([`IoCounts::other_errors`]).
pub const STATUS_KINDS: usize = 8;

/// The latency bucket of `us` microseconds.
pub fn latency_bucket(us: u64) -> usize {
    ((64 - us.leading_zeros()) as usize).min(LATENCY_BUCKETS - 1)
}

/// The lowest latency (µs) bucket `k` holds.
pub fn bucket_floor_us(k: usize) -> u64 {
    match k {
        0 => 0,
        k => 1 << (k.min(LATENCY_BUCKETS - 1) - 1),
    }
}

/// Commands, errors, data and time, of a queue or (summed) of a controller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounts {
    /// Commands answered.
    pub commands: u64,
    /// Commands answered with an error status.
    pub errors: u64,
    /// Errors by status: the first [`STATUS_KINDS`] distinct statuses seen, each with its
    /// count (a count of 0 marks an unused entry).
    pub by_status: [(Status, u64); STATUS_KINDS],
    /// Errors of statuses beyond those of [`by_status`](Self::by_status).
    pub other_errors: u64,
    /// Read commands completed successfully.
    pub reads: u64,
    /// Write commands completed successfully (Write Zeroes not included).
    pub writes: u64,
    /// Bytes Read commands returned.
    pub bytes_read: u64,
    /// Bytes Write commands stored.
    pub bytes_written: u64,
    /// 512-byte units Read commands returned (the SMART log's unit).
    pub units_read: u64,
    /// 512-byte units Write commands stored.
    pub units_written: u64,
    /// Commands the medium failed (a read, write or flush error).
    pub media_errors: u64,
    /// Bytes the CPU copied between the data buffers of Read and Write commands and the
    /// medium ([`BlockDevice::read_dma`](crate::block::BlockDevice::read_dma)): 0 where the
    /// medium's controller moves the data by DMA to and from the buffers the RDMA transfers
    /// use.
    pub bytes_copied: u64,
    /// Flushes that reached the medium (Flush commands, and those Force Unit Access or a
    /// disabled write cache made).
    pub medium_flushes: u64,
    /// The latency histogram: commands by the time from the poll that took their capsule to
    /// the posting of their response ([`latency_bucket`]). Held asynchronous event requests
    /// are not in it.
    pub latency: [u64; LATENCY_BUCKETS],
}

impl IoCounts {
    /// Counts an error of status `st`.
    pub(crate) fn error(&mut self, st: Status) {
        self.errors += 1;
        self.by_kind(st, 1);
    }

    /// `n` errors of status `st` in the table (or with the others).
    fn by_kind(&mut self, st: Status, n: u64) {
        for e in self.by_status.iter_mut() {
            if e.1 == 0 {
                *e = (st, n);
                return;
            }
            if e.0 == st {
                e.1 += n;
                return;
            }
        }
        self.other_errors += n;
    }

    /// Errors answered with status `st` (0 for one not among [`by_status`](Self::by_status)).
    pub fn errors_with(&self, st: Status) -> u64 {
        self.by_status
            .iter()
            .find(|e| e.1 != 0 && e.0 == st)
            .map_or(0, |e| e.1)
    }

    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &IoCounts) {
        self.commands += o.commands;
        self.reads += o.reads;
        self.writes += o.writes;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.units_read += o.units_read;
        self.units_written += o.units_written;
        self.media_errors += o.media_errors;
        self.medium_flushes += o.medium_flushes;
        self.bytes_copied += o.bytes_copied;
        for (a, b) in self.latency.iter_mut().zip(o.latency.iter()) {
            *a += b;
        }
        for &(st, n) in o.by_status.iter().filter(|e| e.1 != 0) {
            self.by_kind(st, n);
        }
        self.other_errors += o.other_errors;
        self.errors += o.errors;
    }

    /// Thousands of 512-byte units, rounded up (the SMART log's Data Units).
    pub fn data_units(units: u64) -> u64 {
        units.div_ceil(1000)
    }
}

/// Why the target refused a host's connection request or Connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// The request's NVMe/RDMA private data was refused (REJ with this status).
    Request(CmRejStatus),
    /// No free queue in the target's table (REJ, no resources).
    NoQueue,
    /// The queue pair or its memory could not be made (REJ, no resources).
    NoMemory,
    /// The CM could not accept (the request went away).
    AcceptFailed,
    /// A Connect was answered with this status (its dword 0 names an invalid parameter):
    /// an unknown subsystem, a host not on the subsystem's allow list, a controller ID that
    /// does not exist for this host, no free controller.
    Connect(Status, u32),
}

impl core::fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            RefusalReason::Request(st) => write!(f, "connection request refused ({st:?})"),
            RefusalReason::NoQueue => f.write_str("no free queue"),
            RefusalReason::NoMemory => f.write_str("no memory for the queue"),
            RefusalReason::AcceptFailed => f.write_str("accept failed"),
            RefusalReason::Connect(Status::CONNECT_INVALID_HOST, _) => {
                f.write_str("Connect: host not allowed")
            }
            RefusalReason::Connect(Status::CONNECT_BUSY, _) => {
                f.write_str("Connect: no free controller")
            }
            RefusalReason::Connect(Status::CONNECT_FORMAT, _) => {
                f.write_str("Connect: unknown format")
            }
            RefusalReason::Connect(st, dw0) => {
                write!(f, "Connect: status {:#05x}, parameter {dw0:#x}", st.code())
            }
        }
    }
}

/// A refused request or Connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Its number: 1 for the target's first refusal.
    pub seq: u64,
    /// When (µs of the target's clock).
    pub at_us: u64,
    /// The station it came from.
    pub station: [u8; 4],
    /// Why.
    pub reason: RefusalReason,
    /// The host NQN a Connect named (`None` for a connection request).
    pub hostnqn: Option<Nqn>,
}

/// Refusals kept (the newest).
pub const REFUSALS_KEPT: usize = 8;

/// The newest [`REFUSALS_KEPT`] refusals in a ring, and how many there were.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RefusalLog {
    ring: [Option<Refusal>; REFUSALS_KEPT],
    count: u64,
}

impl Default for RefusalLog {
    fn default() -> Self {
        RefusalLog {
            ring: [None; REFUSALS_KEPT],
            count: 0,
        }
    }
}

impl RefusalLog {
    pub(crate) fn record(&mut self, r: Refusal) {
        self.count += 1;
        self.ring[((self.count - 1) % REFUSALS_KEPT as u64) as usize] = Some(Refusal {
            seq: self.count,
            ..r
        });
    }
    pub(crate) fn count(&self) -> u64 {
        self.count
    }
    /// Refusal number `seq`, if still kept.
    pub(crate) fn get(&self, seq: u64) -> Option<&Refusal> {
        if seq == 0 || seq > self.count || self.count - seq >= REFUSALS_KEPT as u64 {
            return None;
        }
        self.ring[((seq - 1) % REFUSALS_KEPT as u64) as usize].as_ref()
    }
}

/// Hosts' SMART counts kept between their controllers ([`HostHistories`]): this many
/// (subsystem, host) pairs at most.
pub const HOST_HISTORIES: usize = 16;

/// What a host's controllers counted for the SMART log, carried from one to the next: the
/// I/O counts, the time busy, the errors logged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Carried {
    /// The I/O counts (queues summed).
    pub io: IoCounts,
    /// Microseconds busy with I/O commands.
    pub busy_us: u64,
    /// Errors logged (the Error Information log's count).
    pub errors: u64,
}

impl Carried {
    /// Adds `o` to these.
    pub(crate) fn add(&mut self, o: &Carried) {
        self.io.add(&o.io);
        self.busy_us = self.busy_us.saturating_add(o.busy_us);
        self.errors = self.errors.saturating_add(o.errors);
    }
}

/// One host's history: whose it is (subsystem, host NQN and host identifier, as its Connect
/// gave them) and what it counted.
#[derive(Clone, Copy)]
struct History {
    subsystem: usize,
    hostnqn: Nqn,
    hostid: [u8; 16],
    carried: Carried,
    /// When its last controller ended (µs): the oldest goes first when the table is full.
    ended_us: u64,
}

/// The SMART counts of hosts whose controllers ended, per (subsystem, host NQN, host ID), so
/// that a host that reconnects (after a keep-alive timeout, a reset of the fabric, a reboot)
/// reads on in its SMART log where its last controller stopped, as it would on a drive. A
/// controller takes its host's history when it is made (the entry leaves the table: each
/// count lives in one place, a live controller or the table) and gives it back, with what it
/// counted, when it ends; two controllers of one host at once each take their own share, and
/// the shares add up again in the table.
///
/// Only the host named by all three keys gets an entry back: another host's NQN or host ID
/// reads and changes none of it (the fabric proves neither: a host that claims another's NQN
/// and host ID is that host to the target, as to its allow list).
///
/// Bounded: [`HOST_HISTORIES`] entries, the hosts with a live controller not among them.
/// When it is full, the entry whose controller ended longest ago makes room (a host gone for
/// longest loses its history first; a host coming back finds its entry while fewer than that
/// many other pairs ended since).
pub struct HostHistories {
    e: [Option<History>; HOST_HISTORIES],
}

impl Default for HostHistories {
    fn default() -> Self {
        Self {
            e: [None; HOST_HISTORIES],
        }
    }
}

impl HostHistories {
    fn find(&self, subsystem: usize, hostnqn: &Nqn, hostid: &[u8; 16]) -> Option<usize> {
        self.e.iter().position(|h| {
            h.as_ref().is_some_and(|h| {
                h.subsystem == subsystem && h.hostnqn == *hostnqn && h.hostid == *hostid
            })
        })
    }

    /// Takes the history of the host (`hostnqn`, `hostid`) on subsystem `subsystem` out of
    /// the table (all zero when it has none).
    pub(crate) fn take(&mut self, subsystem: usize, hostnqn: &Nqn, hostid: &[u8; 16]) -> Carried {
        self.find(subsystem, hostnqn, hostid)
            .and_then(|i| self.e[i].take())
            .map(|h| h.carried)
            .unwrap_or_default()
    }

    /// Gives back the history of the host (`hostnqn`, `hostid`) on `subsystem` as its
    /// controller ended at `now_us` (what it took and what it counted since): added to an
    /// entry of the same host, else in a free entry, else in place of the one that ended
    /// longest ago.
    pub(crate) fn give(
        &mut self,
        subsystem: usize,
        hostnqn: &Nqn,
        hostid: &[u8; 16],
        carried: Carried,
        now_us: u64,
    ) {
        if let Some(i) = self.find(subsystem, hostnqn, hostid) {
            if let Some(h) = self.e[i].as_mut() {
                h.carried.add(&carried);
                h.ended_us = now_us;
            }
            return;
        }
        let i = self.e.iter().position(Option::is_none).unwrap_or_else(|| {
            let mut oldest = 0;
            for (i, h) in self.e.iter().enumerate() {
                if let (Some(h), Some(o)) = (h, &self.e[oldest])
                    && h.ended_us < o.ended_us
                {
                    oldest = i;
                }
            }
            oldest
        });
        self.e[i] = Some(History {
            subsystem,
            hostnqn: *hostnqn,
            hostid: *hostid,
            carried,
            ended_us: now_us,
        });
    }

    /// Hosts with a history in the table.
    pub fn len(&self) -> usize {
        self.e.iter().flatten().count()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(1), 1);
        assert_eq!(latency_bucket(2), 2);
        assert_eq!(latency_bucket(3), 2);
        assert_eq!(latency_bucket(4), 3);
        assert_eq!(latency_bucket(16_000), 14);
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
        for k in 1..LATENCY_BUCKETS {
            assert_eq!(latency_bucket(bucket_floor_us(k)), k);
            assert_eq!(latency_bucket(bucket_floor_us(k) - 1), k - 1);
        }
    }

    #[test]
    fn errors_by_status_and_sums() {
        let mut a = IoCounts::default();
        for k in 0..10u16 {
            a.error(Status(0x100 + k));
        }
        a.error(Status(0x100));
        assert_eq!(a.errors, 11);
        assert_eq!(a.errors_with(Status(0x100)), 2);
        assert_eq!(a.errors_with(Status(0x107)), 1);
        assert_eq!(a.errors_with(Status(0x108)), 0, "beyond the table");
        assert_eq!(a.other_errors, 2);
        let mut b = IoCounts::default();
        b.error(Status(0x100));
        b.error(Status(0x2));
        b.latency[3] = 5;
        b.commands = 7;
        b.add(&a);
        assert_eq!(b.errors, 13);
        assert_eq!(b.errors_with(Status(0x100)), 3);
        assert_eq!(b.errors_with(Status(0x2)), 1);
        let kept: u64 = b.by_status.iter().map(|e| e.1).sum();
        assert_eq!(kept + b.other_errors, b.errors);
        assert_eq!((b.commands, b.latency[3]), (7, 5));
    }

    #[test]
    fn data_units_round_up() {
        assert_eq!(IoCounts::data_units(0), 0);
        assert_eq!(IoCounts::data_units(1), 1);
        assert_eq!(IoCounts::data_units(1000), 1);
        assert_eq!(IoCounts::data_units(1001), 2);
        assert_eq!(IoCounts::data_units(3000), 3);
    }

    #[test]
    fn refusal_ring() {
        let mut log = RefusalLog::default();
        let r = Refusal {
            seq: 0,
            at_us: 1,
            station: [1, 2, 3, 4],
            reason: RefusalReason::NoQueue,
            hostnqn: None,
        };
        for _ in 0..REFUSALS_KEPT + 3 {
            log.record(r);
        }
        assert_eq!(log.count(), REFUSALS_KEPT as u64 + 3);
        assert!(log.get(3).is_none(), "overwritten");
        assert_eq!(log.get(4).map(|r| r.seq), Some(4));
        assert_eq!(log.get(log.count()).map(|r| r.seq), Some(log.count()));
        assert!(log.get(log.count() + 1).is_none() && log.get(0).is_none());
    }
}

#[cfg(test)]
mod history_tests {
    use super::*;

    /// The NQN of host `i` (below 100).
    fn nqn(i: usize) -> Nqn {
        let mut b = *b"nqn.2014-08.org.nvmexpress:host-00";
        let n = b.len();
        b[n - 2] = b'0' + (i / 10) as u8;
        b[n - 1] = b'0' + (i % 10) as u8;
        Nqn::new(core::str::from_utf8(&b).unwrap()).unwrap()
    }

    fn writes(n: u64) -> Carried {
        Carried {
            io: IoCounts {
                writes: n,
                ..IoCounts::default()
            },
            busy_us: n,
            errors: n,
        }
    }

    #[test]
    fn each_host_takes_back_its_own_only() {
        let mut t = HostHistories::default();
        t.give(0, &nqn(1), &[1; 16], writes(5), 10);
        // Another subsystem, NQN or host ID: nothing.
        assert_eq!(t.take(1, &nqn(1), &[1; 16]), Carried::default());
        assert_eq!(t.take(0, &nqn(2), &[1; 16]), Carried::default());
        assert_eq!(t.take(0, &nqn(1), &[2; 16]), Carried::default());
        assert_eq!(t.len(), 1);
        // Its own, once: the entry leaves with it.
        assert_eq!(t.take(0, &nqn(1), &[1; 16]), writes(5));
        assert!(t.is_empty());
        assert_eq!(t.take(0, &nqn(1), &[1; 16]), Carried::default());
    }

    #[test]
    fn two_controllers_of_one_host_add_up() {
        let mut t = HostHistories::default();
        t.give(0, &nqn(1), &[1; 16], writes(5), 10);
        t.give(0, &nqn(1), &[1; 16], writes(7), 20);
        assert_eq!(t.len(), 1);
        assert_eq!(t.take(0, &nqn(1), &[1; 16]), writes(12));
    }

    #[test]
    fn a_full_table_lets_the_host_gone_longest_go() {
        let mut t = HostHistories::default();
        for i in 0..HOST_HISTORIES {
            // Ended in a shuffled order: host 3 ended first.
            let ended = if i == 3 { 1 } else { 100 + i as u64 };
            t.give(0, &nqn(i), &[0; 16], writes(i as u64 + 1), ended);
        }
        assert_eq!(t.len(), HOST_HISTORIES);
        t.give(0, &nqn(99), &[0; 16], writes(1000), 500);
        assert_eq!(t.len(), HOST_HISTORIES);
        assert_eq!(t.take(0, &nqn(3), &[0; 16]), Carried::default());
        assert_eq!(t.take(0, &nqn(99), &[0; 16]), writes(1000));
        for i in (0..HOST_HISTORIES).filter(|&i| i != 3) {
            assert_eq!(
                t.take(0, &nqn(i), &[0; 16]),
                writes(i as u64 + 1),
                "host {i}"
            );
        }
        assert!(t.is_empty());
    }
}
