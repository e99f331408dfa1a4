//! What a host operation reports when it fails.

use crate::wire::Status;

/// Why a host operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostError {
    /// The target answered with an error status.
    Status(Status),
    /// The target rejected the queue's connection (REJ with NVMe/RDMA status, if it gave one).
    Rejected(Option<u16>),
    /// The connection failed otherwise (no answer, the CM gave up).
    ConnectFailed,
    /// The queue is not connected (or it ended).
    NotConnected,
    /// Every command slot of the queue is in use.
    Busy,
    /// More data than a command slot holds, or a buffer that does not fit.
    TooLarge,
    /// No response within the timeout.
    Timeout,
    /// The verbs layer failed (QP, region, post).
    Verbs,
    /// The controller's answer breaks the protocol (a wrong controller ID, …).
    Protocol,
}

impl core::fmt::Display for HostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HostError::Status(s) => write!(f, "NVMe status {:#06x}", s.0),
            HostError::Rejected(s) => write!(f, "connection rejected ({s:?})"),
            HostError::ConnectFailed => f.write_str("connection failed"),
            HostError::NotConnected => f.write_str("queue not connected"),
            HostError::Busy => f.write_str("queue full"),
            HostError::TooLarge => f.write_str("data too large"),
            HostError::Timeout => f.write_str("timed out"),
            HostError::Verbs => f.write_str("verbs failure"),
            HostError::Protocol => f.write_str("protocol violation by the controller"),
        }
    }
}

impl core::error::Error for HostError {}
