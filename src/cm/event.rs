//! What the CM tells its user, as typed values: [`CmEvent`], one at a time from
//! [`Cm::poll`](super::Cm::poll).

use bareverbs_hal::Clock;

use super::msg::{self, Private, pdata};
use super::table::{Conn, Failure, St, pend};
use super::{Cm, CmAddr};
use crate::verbs::{Provider, QueuePair, Rc, Reset, Rts};

/// A connection, by the communication ID this side gave it (unique among the live ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId(pub u32);

/// Bytes of user private data a REQ carries after rdma_cm's header.
pub const REQ_USER_DATA: usize = pdata::REQ - super::msg::CMA_HDR;
/// Bytes of user private data a SIDR_REQ carries after rdma_cm's header.
pub const SIDR_USER_DATA: usize = pdata::SIDR_REQ - super::msg::CMA_HDR;

/// A connection request to a listening port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The connection, to [`accept`](super::Cm::accept) or [`reject`](super::Cm::reject).
    pub id: ConnId,
    /// The active side's IPv4 address (from the datagram, checked against rdma_cm's
    /// header); `0.0.0.0` for a request over IPv6 ([`src_addr`](Self::src_addr) has it).
    pub src_ip: [u8; 4],
    /// The active side's rdma_cm port.
    pub src_port: u16,
    /// The IPv4 address connected to; `0.0.0.0` for a request over IPv6.
    pub dst_ip: [u8; 4],
    /// The active side's address, IPv4 or IPv6.
    pub src_addr: CmAddr,
    /// The address connected to, IPv4 or IPv6.
    pub dst_addr: CmAddr,
    /// The port connected to.
    pub dst_port: u16,
    /// READs/atomics the active side accepts at once.
    pub responder_resources: u8,
    /// READs/atomics the active side issues at once.
    pub initiator_depth: u8,
    /// Transport retries the active side asks for.
    pub retry_count: u8,
    /// RNR retries the active side asks this side to use.
    pub rnr_retry_count: u8,
    /// The user's private data (after rdma_cm's header; the whole area: the wire does not
    /// say how much was meant).
    pub private_data: Private<REQ_USER_DATA>,
}

/// A request to a listening UD service (SIDR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidrRequest {
    /// The request, to answer with [`sidr_reply`](super::Cm::sidr_reply).
    pub id: ConnId,
    /// The asking side's IPv4 address; `0.0.0.0` for a request over IPv6
    /// ([`src_addr`](Self::src_addr) has it).
    pub src_ip: [u8; 4],
    /// The asking side's address, IPv4 or IPv6.
    pub src_addr: CmAddr,
    /// The asking side's rdma_cm port.
    pub src_port: u16,
    /// The port asked for.
    pub dst_port: u16,
    /// The user's private data (after rdma_cm's header).
    pub private_data: Private<SIDR_USER_DATA>,
}

/// Something that happened to a connection.
pub enum CmEvent<'a, P: Provider> {
    /// A REQ to a listening port: accept or reject it.
    ConnectRequest(ConnectRequest),
    /// The connection is up. On the active side, its QP in RTS; on the passive side (which
    /// got its QP back from [`accept`](super::Cm::accept)) `None`: the RTU arrived.
    Established {
        /// The connection.
        id: ConnId,
        /// The active side's QP.
        qp: Option<QueuePair<'a, P, Rc, Rts>>,
        /// The REP's private data (active side; empty on the passive side).
        private_data: Private<{ pdata::REP }>,
    },
    /// The connection was not established.
    Failed {
        /// The connection.
        id: ConnId,
        /// Why.
        failure: Failure,
        /// The REJ's private data, if it was a REJ.
        private_data: Private<{ pdata::REJ }>,
        /// The active side's QP, handed back in RESET.
        qp: Option<QueuePair<'a, P, Rc, Reset>>,
    },
    /// The peer disconnected (DREQ), or this side's disconnect was answered (DREP) or went
    /// unanswered. The QP should be moved to ERROR, as Linux does before it disconnects.
    Disconnected {
        /// The connection.
        id: ConnId,
    },
    /// TIME_WAIT is over: the connection's entry is free and its QP may be reused.
    TimeWaitExit {
        /// The connection.
        id: ConnId,
    },
    /// A SIDR_REQ to a listening UD port.
    SidrRequest(SidrRequest),
    /// The answer to [`sidr_resolve`](super::Cm::sidr_resolve).
    SidrResolved {
        /// The request.
        id: ConnId,
        /// `Ok((qpn, qkey))`, or the SIDR_REP's status (1 no such service, 2 refused …), or
        /// [`SIDR_TIMEOUT`] when no answer came.
        result: Result<(u32, u32), u8>,
        /// The SIDR_REP's private data.
        private_data: Private<{ pdata::SIDR_REP }>,
    },
}

impl<P: Provider> core::fmt::Debug for CmEvent<'_, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CmEvent::ConnectRequest(r) => write!(f, "ConnectRequest({r:?})"),
            CmEvent::Established { id, qp, .. } => {
                write!(f, "Established({id:?}, qp: {})", qp.is_some())
            }
            CmEvent::Failed { id, failure, .. } => write!(f, "Failed({id:?}, {failure:?})"),
            CmEvent::Disconnected { id } => write!(f, "Disconnected({id:?})"),
            CmEvent::TimeWaitExit { id } => write!(f, "TimeWaitExit({id:?})"),
            CmEvent::SidrRequest(r) => write!(f, "SidrRequest({r:?})"),
            CmEvent::SidrResolved { id, result, .. } => {
                write!(f, "SidrResolved({id:?}, {result:?})")
            }
        }
    }
}

/// The status [`CmEvent::SidrResolved`] reports when no SIDR_REP came.
pub const SIDR_TIMEOUT: u8 = 0xFF;

impl<'a, P: Provider, C: Clock, const N: usize> Cm<'a, P, C, N> {
    /// The next pending event of any entry, taken round-robin from where the last one was
    /// (an entry whose connection is over is freed once its last event is taken).
    pub(super) fn take_event(&mut self) -> Option<CmEvent<'a, P>> {
        // This runs on every poll, most often finding nothing: a plain pass first.
        if self.conns.iter().all(|c| c.pending == 0) {
            return None;
        }
        // From the cursor to the end, then from the start to the cursor.
        let start = self.cursor.min(N);
        for i in (start..N).chain(0..start) {
            let c = &mut self.conns[i];
            if c.pending == 0 {
                continue;
            }
            let bit = c.pending & c.pending.wrapping_neg();
            c.pending &= !bit;
            self.cursor = (i + 1) % N;
            let ev = self.event(i, bit);
            let c = &mut self.conns[i];
            if c.st == St::Closed && c.pending == 0 && c.qp.is_none() && c.ready.is_none() {
                *c = Conn::idle();
            }
            if ev.is_some() {
                return ev;
            }
        }
        None
    }

    fn event(&mut self, i: usize, bit: u8) -> Option<CmEvent<'a, P>> {
        let c = &mut self.conns[i];
        let id = ConnId(c.local_id);
        Some(match bit {
            pend::REQUEST => {
                // The REQ is stored with the bit; without it there is nothing to report.
                let r = c.req?;
                // Checked when the REQ came: its destination is this side's address.
                let dst = msg::CmaAddrs::parse(r.private.as_slice()).map(|h| h.dst);
                let dst = dst.unwrap_or(CmAddr::UNSPECIFIED);
                let mut data = [0u8; REQ_USER_DATA];
                data.copy_from_slice(&r.private.bytes[msg::CMA_HDR..]);
                CmEvent::ConnectRequest(ConnectRequest {
                    id,
                    src_ip: c.peer_ip.ipv4_or_zero(),
                    src_port: c.ports.0,
                    dst_ip: dst.ipv4_or_zero(),
                    src_addr: c.peer_ip,
                    dst_addr: dst,
                    dst_port: c.ports.1,
                    responder_resources: r.responder_resources,
                    initiator_depth: r.initiator_depth,
                    retry_count: r.retry_count,
                    rnr_retry_count: r.rnr_retry_count,
                    private_data: Private {
                        bytes: data,
                        len: REQ_USER_DATA,
                    },
                })
            }
            pend::ESTABLISHED => CmEvent::Established {
                id,
                qp: c.ready.take(),
                private_data: c.private,
            },
            pend::FAILED => CmEvent::Failed {
                id,
                failure: c.failure,
                private_data: Private::from_slice(c.private.as_slice()),
                qp: c.qp.take(),
            },
            pend::DISCONNECTED => CmEvent::Disconnected { id },
            pend::TIMEWAIT_EXIT => CmEvent::TimeWaitExit { id },
            pend::SIDR_REQUEST => {
                let mut data = [0u8; SIDR_USER_DATA];
                let p = c.private.as_slice();
                let n = p.len().min(SIDR_USER_DATA);
                data[..n].copy_from_slice(&p[..n]);
                CmEvent::SidrRequest(SidrRequest {
                    id,
                    src_ip: c.peer_ip.ipv4_or_zero(),
                    src_addr: c.peer_ip,
                    src_port: c.ports.0,
                    dst_port: c.ports.1,
                    private_data: Private {
                        bytes: data,
                        len: n,
                    },
                })
            }
            _ => CmEvent::SidrResolved {
                id,
                result: c.sidr,
                private_data: Private::from_slice(c.private.as_slice()),
            },
        })
    }
}
