//! The connection table: a fixed number of entries, each a connection's state, its peer, its
//! timer, the message it retransmits and the events it has to report. No heap: the table is
//! an array inside the [`Cm`](super::Cm).

use super::CmAddr;
use super::mad::Mad;
use super::msg::{Private, Req, pdata};
use super::timer::Timer;
use crate::Error;
use crate::verbs::{Provider, QueuePair, Rc, Reset, Rts};

/// Why a connection ended before it was established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The peer sent a REJ with this reason (`docs/cm.md` lists them; 28: the application).
    Rejected {
        /// The reason code.
        reason: u16,
    },
    /// The peer did not answer the REQ (or REP, SIDR_REQ) through every retry.
    Timeout,
    /// The QP could not be moved to RTS with the peer's values (a REJ was sent).
    Qp(Error),
    /// The REP named a QP of a live connection (a REJ "stale connection" was sent).
    Stale,
}

/// Where a connection is (IBTA's CM states, as far as RoCE uses them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum St {
    /// Free.
    Idle,
    /// Over, with events still to report.
    Closed,
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Passive: REQ received, the user deciding.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Both sides up.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// Disconnected; the QP number is not reused towards the peer until this ends.
    TimeWait,
    /// Active UD: SIDR_REQ sent.
    SidrReqSent,
    /// Passive UD: SIDR_REQ received, the user deciding.
    SidrReqRcvd,
}

/// Events an entry has to report, one bit each, reported lowest first.
pub mod pend {
    /// A REQ to a listener.
    pub const REQUEST: u8 = 1 << 0;
    /// Established.
    pub const ESTABLISHED: u8 = 1 << 1;
    /// Failed before establishment.
    pub const FAILED: u8 = 1 << 2;
    /// Disconnected.
    pub const DISCONNECTED: u8 = 1 << 3;
    /// TIME_WAIT over.
    pub const TIMEWAIT_EXIT: u8 = 1 << 4;
    /// A SIDR_REQ to a listener.
    pub const SIDR_REQUEST: u8 = 1 << 5;
    /// A SIDR_REP (or its timeout).
    pub const SIDR_RESOLVED: u8 = 1 << 6;
}

/// One connection.
pub struct Conn<'a, P: Provider> {
    /// Its state.
    pub st: St,
    /// Whether this side started it (REQ or SIDR_REQ sent).
    pub active: bool,
    /// This side's communication ID (also the [`ConnId`](super::ConnId)).
    pub local_id: u32,
    /// The peer's (0 until known).
    pub remote_id: u32,
    /// The peer's CA GUID.
    pub remote_guid: u64,
    /// The peer's data QP.
    pub remote_qpn: u32,
    /// This side's data QP.
    pub local_qpn: u32,
    /// The peer's IPv4 address: every message matched to this entry must come from it.
    pub peer_ip: CmAddr,
    /// The peer's rdma_cm port, and the port on this side.
    pub ports: (u16, u16),
    /// The transaction ID of the REQ/REP/RTU exchange (or of the SIDR exchange).
    pub tid: u64,
    /// The retransmission timer (or TIME_WAIT's).
    pub timer: Timer,
    /// The message the timer resends.
    pub out: Mad,
    /// When the entry was taken (for choosing which half-open entry goes first).
    pub born: u64,
    /// Events to report ([`pend`]).
    pub pending: u8,
    /// The REQ (passive side, until accepted).
    pub req: Option<Req>,
    /// What this side advertised: READ/atomic depths (responder resources, initiator depth).
    pub depths: (u8, u8),
    /// The retry counts asked for (transport, RNR).
    pub retries: (u8, u8),
    /// The private data of the event to report (REP's, REJ's, SIDR's).
    pub private: Private<{ pdata::REP }>,
    /// Why it failed, for [`pend::FAILED`].
    pub failure: Failure,
    /// The SIDR answer, for [`pend::SIDR_RESOLVED`].
    pub sidr: Result<(u32, u32), u8>,
    /// The active side's QP while the REQ is out (and back after a failure).
    pub qp: Option<QueuePair<'a, P, Rc, Reset>>,
    /// The active side's QP once in RTS, until reported.
    pub ready: Option<QueuePair<'a, P, Rc, Rts>>,
}

impl<P: Provider> Conn<'_, P> {
    /// A free entry.
    pub fn idle() -> Self {
        Conn {
            st: St::Idle,
            active: false,
            local_id: 0,
            remote_id: 0,
            remote_guid: 0,
            remote_qpn: 0,
            local_qpn: 0,
            peer_ip: CmAddr::UNSPECIFIED,
            ports: (0, 0),
            tid: 0,
            timer: Timer::default(),
            out: Mad([0; super::mad::MAD_LEN]),
            born: 0,
            pending: 0,
            req: None,
            depths: (0, 0),
            retries: (0, 0),
            private: Private::empty(),
            failure: Failure::Timeout,
            sidr: Err(0),
            qp: None,
            ready: None,
        }
    }

    /// Whether this side started the connection.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// Whether the entry holds nothing.
    pub fn is_free(&self) -> bool {
        self.st == St::Idle
    }

    /// Whether the entry is a connection in progress or up (not free, not over).
    pub fn live(&self) -> bool {
        !matches!(self.st, St::Idle | St::Closed)
    }

    /// Ends the connection: the entry stays until its events are reported.
    pub fn close(&mut self) {
        self.timer.stop();
        self.req = None;
        self.st = if self.pending == 0 && self.qp.is_none() && self.ready.is_none() {
            St::Idle
        } else {
            St::Closed
        };
    }

    /// Ends the connection with `failure` to report.
    pub fn fail(&mut self, failure: Failure) {
        self.failure = failure;
        self.pending |= pend::FAILED;
        self.close();
    }
}

/// Lookups over the entries.
pub trait Lookup {
    /// The index of the live entry whose ID is `local_id`.
    fn by_local(&self, local_id: u32) -> Option<usize>;
    /// The index of the live entry with this pair of IDs, whose peer is `ip`.
    fn by_pair(&self, local_id: u32, remote_id: u32, ip: CmAddr) -> Option<usize>;
    /// A free entry.
    fn free(&self) -> Option<usize>;
    /// The oldest entry still waiting for its user's decision (half-open).
    fn oldest_half_open(&self) -> Option<usize>;
}

impl<P: Provider> Lookup for [Conn<'_, P>] {
    fn by_local(&self, local_id: u32) -> Option<usize> {
        self.iter()
            .position(|c| c.live() && c.local_id == local_id && local_id != 0)
    }

    fn by_pair(&self, local_id: u32, remote_id: u32, ip: CmAddr) -> Option<usize> {
        self.iter().position(|c| {
            c.live()
                && local_id != 0
                && c.local_id == local_id
                && c.remote_id == remote_id
                && c.peer_ip == ip
        })
    }

    fn free(&self) -> Option<usize> {
        self.iter().position(Conn::is_free)
    }

    fn oldest_half_open(&self) -> Option<usize> {
        self.iter()
            .enumerate()
            .filter(|(_, c)| matches!(c.st, St::ReqRcvd | St::SidrReqRcvd))
            .min_by_key(|(_, c)| c.born)
            .map(|(i, _)| i)
    }
}
