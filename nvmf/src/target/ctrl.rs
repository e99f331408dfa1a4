//! A controller: what one host's association with one subsystem (or the discovery
//! subsystem) holds, and its error log.

use super::counts::{Carried, IoCounts};
use crate::wire::fabrics::Nqn;
use crate::wire::log::ErrorEntry;

/// Error Information log entries a controller keeps (its newest errors; Identify
/// Controller's ELPE is this less one).
pub const ERROR_LOG_ENTRIES: usize = 8;

/// Which subsystem a controller belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// The discovery subsystem.
    Discovery,
    /// NVM subsystem `k` of the target's list.
    Nvm(usize),
}

/// A controller's Error Information log: its newest [`ERROR_LOG_ENTRIES`] errors in a ring,
/// and how many it had in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorLog {
    ring: [ErrorEntry; ERROR_LOG_ENTRIES],
    count: u64,
}

impl ErrorLog {
    /// Errors logged over the controller's life.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Logs `e`, numbered one past the last (its `count` is set here); the oldest entry
    /// makes room.
    pub(crate) fn record(&mut self, e: ErrorEntry) {
        self.count = self.count.saturating_add(1);
        let at = ((self.count - 1) % ERROR_LOG_ENTRIES as u64) as usize;
        self.ring[at] = ErrorEntry {
            count: self.count,
            ..e
        };
    }

    /// The `k`-th newest entry kept (0: the newest), or `None` past those.
    pub fn newest(&self, k: usize) -> Option<&ErrorEntry> {
        if k >= ERROR_LOG_ENTRIES || k as u64 >= self.count {
            return None;
        }
        let at = ((self.count - 1 - k as u64) % ERROR_LOG_ENTRIES as u64) as usize;
        self.ring.get(at)
    }
}

/// A live controller.
#[derive(Clone, Copy, Debug)]
pub struct Ctrl {
    /// Its controller ID.
    pub cntlid: u16,
    /// Its subsystem.
    pub which: Which,
    /// The host's NQN.
    pub hostnqn: Nqn,
    /// The host's identifier.
    pub hostid: [u8; 16],
    /// The station its admin queue came from (the CM request's source address): its I/O
    /// queues must come from there too.
    pub station: [u8; 4],
    /// Keep-alive timeout in force (ms; never 0: see
    /// [`TargetConfig::max_kato_ms`](super::TargetConfig::max_kato_ms)).
    pub kato_ms: u32,
    /// When a command last arrived on one of its queues (µs).
    pub last_us: u64,
    /// The longest time it went without a command so far (µs): how near its host's Keep Alives
    /// came to its keep-alive timeout.
    pub longest_idle_us: u64,
    /// Controller configuration.
    pub cc: u32,
    /// I/O queues granted (Set Features, Number of Queues).
    pub io_granted: u16,
    /// I/O queues connected.
    pub io_queues: u16,
    /// Asynchronous event requests held.
    pub aers: u8,
    /// Asynchronous event configuration.
    pub aec: u32,
    /// An ANA change notice waits for an asynchronous event request to carry it.
    pub ana_pending: bool,
    /// An ANA change notice was sent and its host has not read the ANA log since: further
    /// changes are not announced until it does.
    pub ana_masked: bool,
    /// The commands it answered with an error status.
    pub errors: ErrorLog,
    /// Volatile write cache enabled (Set Features, Volatile Write Cache; on at first). Off,
    /// its writes are written through: each is made durable (a flush of the medium, where
    /// it has a cache) before its response.
    pub wce: bool,
    /// Commands outstanding on its I/O queues (the controller is busy while there are).
    pub outstanding: u32,
    /// When it last became busy (µs).
    pub busy_since_us: u64,
    /// Time it was busy with I/O commands before that (µs).
    pub busy_us: u64,
    /// The counts of its queues that ended (a live queue's are its own until it ends).
    pub retired: IoCounts,
    /// What its host's controllers before it counted (on this subsystem, with this host NQN
    /// and host ID): its SMART log goes on from there.
    pub carried: Carried,
}

impl Ctrl {
    /// Microseconds it was busy with I/O commands (some outstanding on an I/O queue) up to
    /// `now_us`: the SMART log's Controller Busy Time, before its rounding to minutes.
    pub fn busy_time_us(&self, now_us: u64) -> u64 {
        let open = if self.outstanding > 0 {
            now_us.saturating_sub(self.busy_since_us)
        } else {
            0
        };
        self.busy_us.saturating_add(open)
    }

    /// One more command outstanding on an I/O queue, at `now_us`.
    pub(crate) fn busy_begin(&mut self, now_us: u64) {
        if self.outstanding == 0 {
            self.busy_since_us = now_us;
        }
        self.outstanding += 1;
    }

    /// `n` fewer commands outstanding, at `now_us`.
    pub(crate) fn busy_end(&mut self, n: u32, now_us: u64) {
        if n == 0 || self.outstanding == 0 {
            return;
        }
        self.outstanding = self.outstanding.saturating_sub(n);
        if self.outstanding == 0 {
            self.busy_us = self
                .busy_us
                .saturating_add(now_us.saturating_sub(self.busy_since_us));
        }
    }
}
