//! Connecting a queue pair in one call, for peers that trade their endpoints themselves (over
//! a TCP side channel, a file, a console): [`QueuePair::endpoint`] gives what the peer needs,
//! as a fixed-size [`Endpoint`] that serializes to 24 bytes, and [`QueuePair::handshake`]
//! takes a RESET RC or UC queue pair to RTS towards the peer's endpoint.
//!
//! The defaults work for RDMA, where the step-by-step transitions default to nothing:
//!
//! | attribute | default | step by step ([`ConnectedInit`] / [`ConnectedRtr`] / [`ConnectedRts`]) |
//! |---|---|---|
//! | remote access | WRITE, READ, and atomics when the device has them | none |
//! | READ/atomic depth, each way | [`DEFAULT_RD_ATOMIC`], clamped to the device's limit (QEMU's PVRDMA reports 0 and applies 1) | 1, clamped by the provider |
//! | path MTU | the smaller of the two endpoints' | 1024 |
//! | local ACK timeout, retries, RNR retries, RNR timer | 14 (67 ms), 7, 7 (infinite), 12 (0.64 ms) | the same |
//! | hop limit | 64, as Linux sends RoCEv2 | 1 |
//!
//! Every one of them is a field of [`Handshake`], overridable.
//!
//! # Example
//!
//! Two software RoCE devices on an in-memory segment (on machines: any channel carries the
//! 24 bytes each way); each side's queue pair has the default depths, 16 requests each way,
//! and both use them: 8 receives posted, 8 messages sent.
//!
//! ```
//! use bareverbs::Context;
//! use bareverbs::device::rxe::{Config, Rxe};
//! use bareverbs::verbs::*;
//! use bareverbs_model::link::{Segment, TestClock};
//! use bareverbs_model::Model;
//!
//! # fn main() -> bareverbs::Result<()> {
//! let (machine, segment, clock) = (Model::default(), Segment::new(), TestClock::default());
//! let device = |mac, ip| Rxe::new(machine.clone(), segment.attach(mac, 1514), clock.clone(), Config { ip });
//! let a = Context::new(device([2, 0, 0, 0, 0, 1], [10, 0, 0, 1])?);
//! let b = Context::new(device([2, 0, 0, 0, 0, 2], [10, 0, 0, 2])?);
//! let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
//! let (cq_a, cq_b) = (a.create_cq(64)?, b.create_cq(64)?);
//! let (pool_a, pool_b) = (pd_a.buffer_pool(16, 256)?, pd_b.buffer_pool(16, 256)?);
//! let qa = pd_a.qp_builder(&cq_a, &cq_a).pool(&pool_a).build::<Rc>()?;
//! let qb = pd_b.qp_builder(&cq_b, &cq_b).pool(&pool_b).build::<Rc>()?;
//!
//! // Each side sends its 24 bytes to the other, however it likes.
//! let (to_b, to_a) = (qa.endpoint()?.to_bytes(), qb.endpoint()?.to_bytes());
//! let mut qa = qa.handshake(&Endpoint::from_bytes(&to_a)?)?;
//! let mut qb = qb.handshake(&Endpoint::from_bytes(&to_b)?)?;
//!
//! for i in 0..8 {
//!     qb.post_recv(i, pool_b.alloc().expect("a free buffer"))?;
//! }
//! for i in 0..8u8 {
//!     let mut buf = pool_a.alloc().expect("a free buffer");
//!     buf.set_len(6)?;
//!     buf.as_mut_slice().copy_from_slice(&[b'h', b'e', b'l', b'l', b'o', b'0' + i]);
//!     qa.post_send(100 + u64::from(i), buf)?;
//! }
//! // B's wait runs B's device (its frames in); A's runs in the idle step, as A's own thread
//! // or machine would run it (its address resolution, sends and acknowledgements).
//! for i in 0..8u8 {
//!     let next = std::future::poll_fn(|_| match qb.poll_one() {
//!         Ok(None) => std::task::Poll::Pending,
//!         other => std::task::Poll::Ready(other),
//!     });
//!     let got = bareverbs::block_on_with(next, || a.progress())?.expect("a completion");
//!     assert_eq!(got.wc.status, WcStatus::Success);
//!     assert_eq!(got.buf.expect("its buffer").as_slice(), &[b'h', b'e', b'l', b'l', b'o', b'0' + i]);
//! }
//! for _ in 0..8 {
//!     assert_eq!(a.block_on(cq_a.next_completion())?.status, WcStatus::Success);
//! }
//! # Ok(()) }
//! ```
//!
//! What must run for a peer's READs and WRITEs on this side's memory to be served, once
//! connected: nothing on PVRDMA; on the software RoCE device, this side's calls into its device
//! — a wait of the crate's, a poll, or [`Context::progress`](crate::verbs::Context::progress)
//! (`docs/cm.md`).
//!
//! # PSNs
//!
//! Each queue pair draws its starting PSN from the context's entropy
//! ([`Context::random_psn`](crate::verbs::Context::random_psn)) when it is created. An
//! endpoint carries the PSN its queue pair *expects to receive*; the peer sends from it. This is
//! the rule the connection manager follows too (`docs/cm.md`): each side advertises what it
//! receives, so neither side's choice can be predicted by a third station.
//!
//! # Wire format of an endpoint (24 bytes, big-endian)
//!
//! | bytes | field |
//! |---|---|
//! | 0 | path MTU, `ibv_mtu` numbering (1 = 256 … 5 = 4096) |
//! | 1–3 | QP number (24 bits) |
//! | 4 | reserved, 0 (ignored when read) |
//! | 5–7 | PSN the QP expects first (24 bits) |
//! | 8–23 | GID |

use super::{
    AccessFlags, AddressVector, ConnectedInit, ConnectedRtr, ConnectedRts, QueuePair, Reset, Rts,
    State, Transport, back_to_reset,
};
use crate::error::{Attr, Error, Op, Param, Result};
use crate::verbs::{Context, Gid, Mtu, Provider};

/// The READ/atomic depth a handshake asks for each way, before clamping to the device's limit.
pub const DEFAULT_RD_ATOMIC: u8 = 16;

/// What a connected queue pair's peer needs to connect to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The QP number (24 bits).
    pub qpn: u32,
    /// The GID the QP sends from and is reached at.
    pub gid: Gid,
    /// The first PSN the QP expects to receive (24 bits): the peer sends from it.
    pub psn: u32,
    /// The largest path MTU the QP's port carries.
    pub mtu: Mtu,
}

impl Endpoint {
    /// Bytes of the serialized form.
    pub const LEN: usize = 24;

    /// The 24-byte serialized form (the module's table).
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..4].copy_from_slice(&(self.qpn & 0xFF_FFFF).to_be_bytes());
        b[0] = self.mtu as u8;
        b[4..8].copy_from_slice(&(self.psn & 0xFF_FFFF).to_be_bytes());
        b[8..].copy_from_slice(&self.gid.0);
        b
    }

    /// Reads the serialized form.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`]: [`Param::BufferSize`] when `bytes` is not 24 bytes long,
    /// [`Param::PathMtu`] for an MTU code that is not 1 to 5.
    pub fn from_bytes(bytes: &[u8]) -> Result<Endpoint> {
        let b: &[u8; Self::LEN] = bytes
            .try_into()
            .map_err(|_| Error::invalid(Param::BufferSize, bytes.len() as u64, Self::LEN as u64))?;
        let mtu = Mtu::from_raw(u32::from(b[0])).ok_or(Error::invalid(
            Param::PathMtu,
            b[0],
            Mtu::Mtu4096 as u8,
        ))?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..]);
        Ok(Endpoint {
            qpn: u32::from_be_bytes([0, b[1], b[2], b[3]]),
            gid: Gid(gid),
            psn: u32::from_be_bytes([0, b[5], b[6], b[7]]),
            mtu,
        })
    }
}

/// How [`QueuePair::handshake_with`] connects; [`Default`] gives the module's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// What the peer may do to this QP's memory.
    pub access: AccessFlags,
    /// Outstanding READs/atomics this QP issues (`None`: [`DEFAULT_RD_ATOMIC`]); clamped to
    /// the device's limit either way. Always 0 on UC.
    pub max_rd_atomic: Option<u8>,
    /// Outstanding READs/atomics this QP answers (`None`: [`DEFAULT_RD_ATOMIC`]); clamped to
    /// the device's limit either way. Always 0 on UC.
    pub max_dest_rd_atomic: Option<u8>,
    /// The local GID to send from (`None`: the first bound IPv4-mapped GID of port 1, else
    /// its first bound GID), as [`QueuePair::endpoint`] chooses.
    pub sgid_index: Option<u32>,
    /// Path MTU (`None`: the smaller of the two endpoints').
    pub path_mtu: Option<Mtu>,
    /// Local ACK timeout code (4.096 µs · 2^timeout).
    pub timeout: u8,
    /// Retries on timeout.
    pub retry_cnt: u8,
    /// Retries on receiver-not-ready (7: infinite).
    pub rnr_retry: u8,
    /// Receiver-not-ready NAK timer code.
    pub min_rnr_timer: u8,
    /// IP hop limit.
    pub hop_limit: u8,
    /// IP traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits; 0: none). The software RoCE device derives the connection's UDP
    /// source port from it, as Linux's rxe does.
    pub flow_label: u32,
}

impl Default for Handshake {
    fn default() -> Self {
        Handshake {
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            max_rd_atomic: None,
            max_dest_rd_atomic: None,
            sgid_index: None,
            path_mtu: None,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        }
    }
}

/// The local GID a connection uses: `index` if given (it must be bound), else the first bound
/// IPv4-mapped GID of port 1 (RoCEv2), else its first bound GID.
pub(crate) fn local_gid<P: Provider>(ctx: &Context<P>, index: Option<u32>) -> Result<(u32, Gid)> {
    let missing = Error::MissingAttribute {
        op: Op::ModifyQp,
        attr: Attr::SourceGid,
    };
    if let Some(i) = index {
        let g = ctx.query_gid(1, i)?;
        return if g == Gid::default() {
            Err(Error::MissingAttribute {
                op: Op::ModifyQp,
                attr: Attr::BoundGid {
                    index: u8::try_from(i).unwrap_or(u8::MAX),
                },
            })
        } else {
            Ok((i, g))
        };
    }
    let mut first = None;
    for (i, g) in ctx.gid_table(1)? {
        if g.ipv4().is_some() {
            return Ok((i, g));
        }
        first = first.or(Some((i, g)));
    }
    first.ok_or(missing)
}

/// `want` (or the default) clamped to the device's `limit`.
fn depth(want: Option<u8>, limit: u32) -> u8 {
    let w = want.unwrap_or(DEFAULT_RD_ATOMIC);
    u32::from(w).min(limit) as u8
}

impl<'a, P: Provider, T: Transport, S: State> QueuePair<'a, P, T, S> {
    /// The starting PSN drawn for this QP when it was created: the first PSN it expects to
    /// receive when connected by [`handshake`](Self::handshake) (24 bits).
    pub fn local_psn(&self) -> u32 {
        self.inner.psn
    }

    /// What the peer needs to connect to this QP: its number, its GID (the one
    /// [`Handshake::sgid_index`]'s default chooses), the PSN it expects first and the port's
    /// active MTU.
    ///
    /// # Errors
    ///
    /// [`Error::MissingAttribute`] with [`Attr::SourceGid`] when port 1 has no bound GID; the
    /// device's errors from the port query.
    pub fn endpoint(&self) -> Result<Endpoint> {
        let ctx = self.inner.ctx;
        let (_, gid) = local_gid(ctx, None)?;
        let mtu = ctx.query_port(1)?.active_mtu;
        Ok(Endpoint {
            qpn: self.qp_num(),
            gid,
            psn: self.inner.psn,
            mtu,
        })
    }
}

impl<'a, P, T> QueuePair<'a, P, T, Reset>
where
    P: Provider,
    T: Transport<InitAttr = ConnectedInit, RtrAttr = ConnectedRtr, RtsAttr = ConnectedRts>,
{
    /// RESET → INIT → RTR → RTS towards `remote`, with the module's defaults.
    ///
    /// # Errors
    ///
    /// As [`handshake_with`](Self::handshake_with).
    pub fn handshake(self, remote: &Endpoint) -> Result<QueuePair<'a, P, T, Rts>, (Self, Error)> {
        self.handshake_with(remote, &Handshake::default())
    }

    /// RESET → INIT → RTR → RTS towards `remote`, as `opts` says: this QP receives from its
    /// own [`local_psn`](Self::local_psn) and sends from `remote.psn`.
    ///
    /// # Errors
    ///
    /// [`Error::MissingAttribute`] when no local GID can be found (see [`Handshake::sgid_index`]),
    /// and the errors of each transition. On any failure the QP is reset and handed back.
    pub fn handshake_with(
        self,
        remote: &Endpoint,
        opts: &Handshake,
    ) -> Result<QueuePair<'a, P, T, Rts>, (Self, Error)> {
        let ctx = self.inner.ctx;
        let caps = *ctx.caps();
        let mtu = match opts.path_mtu {
            Some(m) => m,
            None => match ctx.query_port(1) {
                Ok(p) => p.active_mtu.min(remote.mtu),
                Err(e) => return Err((self, e)),
            },
        };
        let sgid = match local_gid(ctx, opts.sgid_index) {
            Ok((i, _)) => i,
            Err(e) => return Err((self, e)),
        };
        let Ok(sgid_index) = u8::try_from(sgid) else {
            return Err((self, Error::invalid(Param::GidIndex, sgid, u8::MAX)));
        };
        let rc = T::TYPE == crate::verbs::QpType::Rc;
        let mut access = opts.access;
        if caps.atomic_ops == 0 {
            access.remove(AccessFlags::REMOTE_ATOMIC);
        }
        let (init_depth, resp_depth) = if rc {
            (
                depth(opts.max_rd_atomic, caps.max_qp_init_rd_atom),
                depth(opts.max_dest_rd_atomic, caps.max_qp_rd_atom),
            )
        } else {
            (0, 0)
        };
        let psn = self.inner.psn;
        let qp = self.init(&ConnectedInit {
            access,
            ..ConnectedInit::default()
        })?;
        let mut av = AddressVector::new(remote.gid, sgid_index);
        av.hop_limit = opts.hop_limit;
        av.traffic_class = opts.traffic_class;
        av.flow_label = opts.flow_label;
        let rtr = ConnectedRtr {
            path_mtu: mtu,
            max_dest_rd_atomic: resp_depth,
            min_rnr_timer: opts.min_rnr_timer,
            ..ConnectedRtr::new(remote.qpn, psn, av)
        };
        let qp = match qp.rtr(&rtr) {
            Ok(q) => q,
            Err((q, e)) => return Err((back_to_reset(q), e)),
        };
        let rts = ConnectedRts {
            sq_psn: remote.psn & 0xFF_FFFF,
            timeout: opts.timeout,
            retry_cnt: opts.retry_cnt,
            rnr_retry: opts.rnr_retry,
            max_rd_atomic: init_depth,
        };
        match qp.rts(&rts) {
            Ok(q) => Ok(q),
            Err((q, e)) => Err((back_to_reset(q), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_round_trips_through_its_24_bytes() {
        let e = Endpoint {
            qpn: 0xAB_CDEF,
            gid: Gid::from_ipv4([10, 0, 0, 2]),
            psn: 0x12_3456,
            mtu: Mtu::Mtu2048,
        };
        let b = e.to_bytes();
        assert_eq!(&b[..8], &[4, 0xAB, 0xCD, 0xEF, 0, 0x12, 0x34, 0x56]);
        assert_eq!(&b[8..], &e.gid.0);
        assert_eq!(Endpoint::from_bytes(&b), Ok(e));
    }

    #[test]
    fn a_bad_endpoint_is_refused_with_the_field_named() {
        let mut b = [0u8; Endpoint::LEN];
        b[0] = 3;
        assert!(Endpoint::from_bytes(&b).is_ok());
        assert_eq!(
            Endpoint::from_bytes(&b[..23]),
            Err(Error::invalid(Param::BufferSize, 23u64, 24u64))
        );
        assert_eq!(
            Endpoint::from_bytes(&[0u8; 25]),
            Err(Error::invalid(Param::BufferSize, 25u64, 24u64))
        );
        for bad in [0u8, 6, 0xFF] {
            b[0] = bad;
            assert_eq!(
                Endpoint::from_bytes(&b),
                Err(Error::invalid(Param::PathMtu, bad, 5u8))
            );
        }
    }

    #[test]
    fn depths_default_and_clamp_to_the_device() {
        assert_eq!(depth(None, 128), DEFAULT_RD_ATOMIC);
        assert_eq!(depth(None, 4), 4);
        assert_eq!(depth(None, 0), 0);
        assert_eq!(depth(Some(1), 0), 0);
        assert_eq!(depth(Some(200), 128), 128);
        assert_eq!(depth(Some(0), 128), 0);
    }
}
