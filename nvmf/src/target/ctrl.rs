//! A controller: what one host's association with one subsystem (or the discovery
//! subsystem) holds.

use crate::wire::fabrics::Nqn;

/// Which subsystem a controller belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// The discovery subsystem.
    Discovery,
    /// NVM subsystem `k` of the target's list.
    Nvm(usize),
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
    /// Keep-alive timeout (ms; 0: none).
    pub kato_ms: u32,
    /// When a command last arrived on one of its queues (µs).
    pub last_us: u64,
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
}
