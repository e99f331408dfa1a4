//! The verbs objects: a [`Context`] over a device provider, and the protection domains,
//! completion queues and GID bindings it creates. Device-agnostic: every hardware fact is behind
//! the [`Provider`] trait.
//!
//! Objects borrow the context (and, for queue pairs, their PD and CQs), so the compiler keeps
//! a device alive while anything uses it. Each object has `destroy(self)`, which hands the
//! object back with the error when the device refuses, and a `Drop` that destroys on a best-effort
//! basis and never panics.

/// Defines `destroy(self)` and a best-effort, never-panicking `Drop` for a verbs object.
macro_rules! destroy_and_drop {
    ($ty:ident, $destroy:ident, $what:literal) => {
        impl<'c, P: Provider> $ty<'c, P> {
            /// Destroys the object. When the device refuses, the object is handed back with the
            /// error, unchanged, so the caller may retry.
            pub fn destroy(mut self) -> Result<(), (Self, $crate::error::Error)> {
                // SAFETY: `raw` is taken once; `self` is forgotten on success, or rebuilt
                // around the returned raw object on failure, so it is never used again.
                let raw = unsafe { ManuallyDrop::take(&mut self.raw) };
                let ctx = self.ctx;
                core::mem::forget(self);
                match ctx.provider.$destroy(raw) {
                    Ok(()) => Ok(()),
                    Err((raw, e)) => Err((
                        $ty {
                            ctx,
                            raw: ManuallyDrop::new(raw),
                        },
                        e,
                    )),
                }
            }
        }

        impl<P: Provider> Drop for $ty<'_, P> {
            fn drop(&mut self) {
                // SAFETY: `raw` is taken once, here, and `self` is gone afterwards.
                let raw = unsafe { ManuallyDrop::take(&mut self.raw) };
                if let Err((raw, e)) = self.ctx.provider.$destroy(raw) {
                    // The device may still use the object's memory: keep it from being reused.
                    $crate::error::warn(concat!($what, " not destroyed ("), &e, "); memory leaked");
                    core::mem::forget(raw);
                }
            }
        }
    };
}

mod ah;
mod awaiting;
mod buf_release;
mod channel;
mod cq;
mod cq_resize;
mod gid;
mod mr;
mod pool;
mod qp;
pub(crate) mod qp_types;
mod query;
mod random;
mod shared;
mod srq;
mod types;
mod wait;
mod wr;

use core::mem::ManuallyDrop;
use core::ptr::NonNull;

pub use ah::AddressHandle;
pub use buf_release::BufRelease;
pub use channel::CompletionChannel;
pub use cq::{CompletionQueue, PollCq, PollCursor};
pub use gid::GidEntries;
pub use mr::MemoryRegion;
pub use pool::{Buf, BufferPool};
pub(crate) use qp::local_gid;
pub use qp::{
    CanRecv, CanSend, Completion, ConnectedInit, ConnectedRtr, ConnectedRts, DEFAULT_RD_ATOMIC,
    Datagram, DatagramInit, DatagramRts, Endpoint, ErrState, Gsi, Handshake, Init, QpBuilder,
    QueuePair, RawPacket, Rc, RecvBatch, Reset, Rtr, Rts, SendBatch, State, Transport, Uc, Ud,
};
pub use qp_types::{
    AccessFlags, AddressVector, CreateFlags, ModifyAttr, QpAttr, QpAttrMask, QpCaps, QpInit,
    QpInitEx, QpState, QpType, RxHashConf, SrqAttr,
};
pub use query::{GidEntry, GidType};
pub use random::Entropy;
pub use shared::SharedProvider;
pub use srq::SharedReceiveQueue;
pub use types::{DeviceCaps, Gid, LinkLayer, Mtu, PortAttr, PortState};
pub use wait::{AsyncEventFuture, CqEventFuture, NextCompletion, Ready};
pub use wr::{
    RecvWr, SendFlags, SendWqe, Sge, UdTarget, WcFlags, WcOpcode, WcStatus, WorkCompletion,
    WrOpcode,
};

use crate::error::{Error, Result};
pub use crate::events::{AsyncEvent, CqId, IrqCounts};
use crate::events::{ChannelId, EventHub, Slot};

/// What a device driver implements to be driven by the verbs layer.
///
/// The `unsafe` creation methods return device objects whose memory the device may use until
/// they are destroyed; [`Context`] and the object types uphold their contract with lifetimes,
/// so users never call them directly.
pub trait Provider {
    /// A protection domain on the device.
    type Pd;
    /// A completion queue on the device.
    type Cq;

    /// The device's capabilities (read once at bring-up).
    fn caps(&self) -> &DeviceCaps;
    /// The seed for values the network must not predict: the device's
    /// [`Hal::seed`](bareverbs_hal::Hal::seed), read once by [`Context::new`].
    fn seed(&self) -> u64;
    /// Queries port `port` (1-based).
    fn query_port(&self, port: u8) -> Result<PortAttr>;
    /// Reads P_Key `index` of port `port`.
    fn query_pkey(&self, port: u8, index: u16) -> Result<u16>;

    /// Creates a protection domain.
    ///
    /// # Safety
    ///
    /// The PD is passed to [`destroy_pd`](Self::destroy_pd) of this provider (or leaked) before
    /// the provider is dropped.
    unsafe fn create_pd(&self) -> Result<Self::Pd>;
    /// Destroys a protection domain; on failure hands it back with the error.
    fn destroy_pd(&self, pd: Self::Pd) -> Result<(), (Self::Pd, Error)>;

    /// Creates a completion queue of at least `entries` entries, raising its events on
    /// `channel` if given.
    ///
    /// # Safety
    ///
    /// As for [`create_pd`](Self::create_pd): destroyed through this provider, or leaked, before
    /// the provider is dropped (the device writes into its ring until then).
    unsafe fn create_cq(&self, entries: u32, channel: Option<ChannelId>) -> Result<Self::Cq>;
    /// Destroys a completion queue; on failure hands it back with the error.
    fn destroy_cq(&self, cq: Self::Cq) -> Result<(), (Self::Cq, Error)>;
    /// The number of entries the completion queue actually has.
    fn cq_entries(&self, cq: &Self::Cq) -> u32;

    /// Adds `gid` at `index` of port 1's GID table.
    fn bind_gid(&self, index: u32, gid: Gid) -> Result<()>;
    /// Removes the GID at `index`.
    fn unbind_gid(&self, index: u32, gid: Gid) -> Result<()>;

    /// A queue pair on the device.
    type Qp;
    /// A shared receive queue on the device.
    type Srq;

    /// The capacities a queue pair created with `init` would actually have, or why it cannot
    /// be created (limits, unsupported types and features); touches nothing.
    fn plan_qp(&self, init: &QpInit<'_>) -> Result<QpCaps>;
    /// Creates a queue pair (in RESET).
    ///
    /// # Safety
    ///
    /// The PD, CQs and SRQ outlive the QP and stay where they are (are not moved) while it
    /// exists — a provider may keep pointers to them — and the QP is destroyed through
    /// [`destroy_qp`](Self::destroy_qp) (or leaked) before the provider is dropped.
    unsafe fn create_qp(
        &self,
        pd: &Self::Pd,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        srq: Option<&Self::Srq>,
        init: &QpInit<'_>,
    ) -> Result<Self::Qp>;
    /// The QP number.
    fn qp_num(&self, qp: &Self::Qp) -> u32;
    /// The actual capacities.
    fn qp_caps(&self, qp: &Self::Qp) -> QpCaps;
    /// Applies a modify (the typestate layer has checked the transition and the limits).
    fn modify_qp(&self, qp: &mut Self::Qp, attr: &ModifyAttr) -> Result<()>;
    /// Queries a queue pair.
    fn query_qp(&self, qp: &Self::Qp) -> Result<QpAttr>;
    /// Destroys a queue pair; on failure hands it back with the error.
    fn destroy_qp(&self, qp: Self::Qp) -> Result<(), (Self::Qp, Error)>;
    /// Attaches a queue pair to a multicast group.
    fn attach_mcast(&self, qp: &Self::Qp, gid: Gid, lid: u16) -> Result<()>;
    /// Detaches a queue pair from a multicast group.
    fn detach_mcast(&self, qp: &Self::Qp, gid: Gid, lid: u16) -> Result<()>;

    /// The attributes a shared receive queue created with `attr` would actually have; touches
    /// nothing.
    fn plan_srq(&self, attr: &SrqAttr) -> Result<SrqAttr>;
    /// Creates a shared receive queue.
    ///
    /// # Safety
    ///
    /// The PD outlives it, and it is destroyed through [`destroy_srq`](Self::destroy_srq) (or
    /// leaked) before the provider is dropped.
    unsafe fn create_srq(&self, pd: &Self::Pd, attr: &SrqAttr) -> Result<Self::Srq>;
    /// The actual attributes.
    fn srq_attr(&self, srq: &Self::Srq) -> SrqAttr;
    /// Destroys a shared receive queue; on failure hands it back with the error.
    fn destroy_srq(&self, srq: Self::Srq) -> Result<(), (Self::Srq, Error)>;

    /// A registered memory region (with the memory it covers, when the driver allocated it).
    type Mr;
    /// Allocates `len` bytes of DMA memory and registers them in `pd` with `access`.
    ///
    /// # Safety
    ///
    /// The PD outlives the region, and it is destroyed through [`destroy_mr`](Self::destroy_mr)
    /// (or leaked) before the provider is dropped.
    unsafe fn create_mr(&self, pd: &Self::Pd, len: usize, access: AccessFlags) -> Result<Self::Mr>;
    /// Registers `len` bytes of the embedder's own memory at `addr` in `pd` with `access`; the
    /// region's addresses are the CPU's (`addr` is the first SGE address).
    ///
    /// # Safety
    ///
    /// As for [`create_mr`](Self::create_mr); and the memory stays allocated, and is not used
    /// for anything else the device could be told about, until the region is destroyed.
    unsafe fn create_user_mr(
        &self,
        pd: &Self::Pd,
        addr: NonNull<u8>,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self::Mr>;
    /// Deregisters a memory region and frees its memory; on failure hands it back.
    fn destroy_mr(&self, mr: Self::Mr) -> Result<(), (Self::Mr, Error)>;
    /// (address in the region's address space, length, local key, remote key).
    fn mr_info(&self, mr: &Self::Mr) -> (u64, usize, u32, u32);
    /// Where the CPU reaches the region's bytes.
    fn mr_ptr(&self, mr: &Self::Mr) -> NonNull<u8>;

    /// Driver-private memory (bookkeeping the device never sees), freed when dropped.
    type Mem;
    /// Allocates `bytes` of zeroed driver-private memory (it never moves).
    fn alloc_mem(&self, bytes: usize) -> Result<Self::Mem>;
    /// Where it is.
    fn mem_ptr(&self, mem: &Self::Mem) -> NonNull<u8>;

    /// A UD destination prepared once (`ibv_ah`).
    type Ah;
    /// Prepares an address handle in `pd` (checks the source GID index).
    fn create_ah(&self, pd: &Self::Pd, av: &AddressVector) -> Result<Self::Ah>;

    /// A batch's copy of a work queue's posting state, kept in registers while the batch
    /// writes requests; written back when the batch is committed (dropping it forgets them).
    type Cursor: Copy;
    /// Starts a batch of send requests.
    fn sq_start(&self, qp: &Self::Qp) -> Self::Cursor;
    /// Writes one send work request into the QP's send queue, not yet visible to the device.
    ///
    /// # Safety
    ///
    /// Every buffer the request names stays allocated, registered, and untouched by the CPU
    /// until its completion has been polled (or the QP is reset or destroyed).
    unsafe fn sq_write(
        &self,
        qp: &mut Self::Qp,
        c: &mut Self::Cursor,
        wqe: &SendWqe<'_, Self::Ah>,
    ) -> Result<()>;
    /// Makes the send requests of the batch visible, with one doorbell.
    fn sq_commit(&self, qp: &mut Self::Qp, c: &Self::Cursor);
    /// Starts a batch of receive requests.
    fn rq_start(&self, qp: &Self::Qp) -> Self::Cursor;
    /// Writes one receive work request (with the safe path's buffer tag + 1, or 0).
    ///
    /// # Safety
    ///
    /// As for [`sq_write`](Self::sq_write).
    unsafe fn rq_write(
        &self,
        qp: &mut Self::Qp,
        c: &mut Self::Cursor,
        wr_id: u64,
        sges: &[Sge],
        tag: u32,
    ) -> Result<()>;
    /// Makes the receive requests of the batch visible, one doorbell.
    fn rq_commit(&self, qp: &mut Self::Qp, c: &Self::Cursor);
    /// Posts receive work requests to a shared receive queue, all or none.
    ///
    /// # Safety
    ///
    /// As for [`sq_write`](Self::sq_write).
    unsafe fn post_srq_recv(&self, srq: &Self::Srq, wrs: &[RecvWr<'_>]) -> Result<()>;

    /// A poll in progress on a CQ.
    type Poll<'c>: PollCq
    where
        Self: 'c;
    /// Starts polling `cq` (`ibv_start_poll`); `None` when nothing is there. With `only`, the
    /// poll stops at the first completion of another QP (leaving it for that QP's poll).
    fn start_poll<'c>(
        &'c self,
        cq: &'c Self::Cq,
        only: Option<&Self::Qp>,
    ) -> Result<Option<Self::Poll<'c>>>;
    /// Polls up to `out.len()` completions of any QP into `out` (`ibv_poll_cq`); a safe
    /// buffer whose completion is taken here goes back to its pool.
    fn poll_cq(&self, cq: &Self::Cq, out: &mut [WorkCompletion]) -> Result<usize>;
    /// Takes the next completion of `qp` from `cq` into `wc` (as a poll cursor with `only`
    /// does: it stops at another QP's completion, left for that QP's poll). `Some(tag)` for a
    /// completion: the safe path's buffer tag + 1, the buffer now the caller's, or 0 for
    /// none; `None` when there is nothing.
    fn poll_qp(&self, cq: &Self::Cq, qp: &Self::Qp, wc: &mut WorkCompletion)
    -> Result<Option<u32>>;
    /// Arms `cq` for an event at its next completion (`solicited_only`: its next solicited
    /// one) (`ibv_req_notify_cq`).
    fn req_notify_cq(&self, cq: &Self::Cq, solicited_only: bool) -> Result<()>;
    /// Whether a poll of `cq` would find something now (a hint: a poll may still find
    /// nothing, or another thread take it first).
    fn cq_ready(&self, cq: &Self::Cq) -> bool;
    /// The identity `cq` has in events.
    fn cq_id(&self, cq: &Self::Cq) -> CqId;
    /// The place of `cq` in the event hub, when it has one.
    fn cq_slot(&self, cq: &Self::Cq) -> Option<Slot>;
    /// The provider's event state.
    fn events(&self) -> &EventHub;
    /// Takes the device's notifications now, as an interrupt does (bounded; never waits).
    fn process_events(&self);
    /// The interrupt entry for the device's vector `vector` (interrupt-safe: see the
    /// provider's documentation).
    fn interrupt(&self, vector: u16);
    /// The next async event, if the device has one.
    fn next_async_event(&self) -> Option<AsyncEvent>;

    // --- The rest of the verbs surface: GID query, SRQ modify/query, CQ resize,
    // --- posting in the error state.

    /// The GID at `index` of port `port`'s table (`ibv_query_gid`): the zero GID for an index
    /// in range where nothing is bound; [`Error::InvalidInput`] for a port or an index out of
    /// range.
    fn query_gid(&self, port: u8, index: u32) -> Result<Gid>;
    /// The first bound entry (index, GID) of port `port`'s table at or after index `from`.
    fn next_gid(&self, port: u8, from: u32) -> Result<Option<(u32, Gid)>>;
    /// The type of the bound GID at `index` of port `port` (`ibv_query_gid_type`). By
    /// default RoCEv2; a device that speaks another says so.
    fn gid_type(&self, _port: u8, _index: u32) -> GidType {
        GidType::RoceV2
    }
    /// Completion vectors CQs may name (`num_comp_vectors`): 1 by default.
    fn num_comp_vectors(&self) -> u32 {
        1
    }
    /// Changes a memory region's access rights in place (`ibv_rereg_mr` with
    /// `IBV_REREG_MR_CHANGE_ACCESS`); its keys stay. A typed `Unsupported` by default.
    fn rereg_mr_access(&self, _mr: &mut Self::Mr, _access: AccessFlags) -> Result<()> {
        Err(Error::Unsupported(crate::error::Unsupported::Feature(
            crate::error::Feature::ReregMr,
        )))
    }
    /// Arms the SRQ limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): the device raises
    /// SRQ_LIMIT_REACHED once fewer than `limit` receives are posted, and disarms.
    fn modify_srq(&self, srq: &Self::Srq, limit: u32) -> Result<()>;
    /// The SRQ's attributes (`ibv_query_srq`).
    fn query_srq(&self, srq: &Self::Srq) -> Result<SrqAttr>;
    /// Resizes `cq` to at least `entries` (`ibv_resize_cq`); refuses fewer than the CQEs it
    /// must keep room for.
    fn resize_cq(&self, cq: &mut Self::Cq, entries: u32) -> Result<()>;
    /// Makes the send requests of a batch written to a QP in the error state outstanding,
    /// to complete flushed (`WR_FLUSH_ERR`), without showing them to the device.
    fn sq_commit_flushed(&self, qp: &mut Self::Qp, c: &Self::Cursor);
    /// As [`sq_commit_flushed`](Self::sq_commit_flushed), for receive requests.
    fn rq_commit_flushed(&self, qp: &mut Self::Qp, c: &Self::Cursor);
}

/// A device opened for verbs: owns the provider; every object borrows it.
///
/// # Example
///
/// ```
/// use bareverbs::Context;
/// use bareverbs::device::pvrdma::{Config, Pvrdma};
/// use bareverbs::verbs::PortState;
/// use bareverbs_model::Model;
///
/// # fn main() -> bareverbs::Result<()> {
/// let machine = Model::default(); // memory, PCI configuration space and a PVRDMA
/// let dev = Pvrdma::probe(machine.clone(), &machine, Config::default())?; // find, bring up
/// let ctx = Context::new(dev);
/// assert_eq!(ctx.query_port(1)?.state, PortState::Active);
/// assert!(ctx.caps().max_qp > 0);
/// // A driver that takes no interrupts processes the device's events itself:
/// ctx.process_events();
/// assert!(ctx.get_async_event().is_none());
/// drop(ctx); // the device is reset and every DMA page returned
/// assert_eq!(machine.outstanding_pages(), 0);
/// # Ok(()) }
/// ```
pub struct Context<P: Provider> {
    provider: P,
    entropy: Entropy,
}

impl<P: Provider> Context<P> {
    /// Wraps a device.
    pub fn new(provider: P) -> Self {
        let entropy = Entropy::new(provider.seed());
        Context { provider, entropy }
    }

    /// The context's stream of unpredictable values, seeded from the device's HAL
    /// ([`Hal::seed`](bareverbs_hal::Hal::seed)).
    pub fn entropy(&self) -> &Entropy {
        &self.entropy
    }

    /// A starting packet sequence number (24 bits) a station on the network cannot predict: what
    /// `sq_psn` and `rq_psn` should be unless a peer protocol fixes them.
    pub fn random_psn(&self) -> u32 {
        self.entropy.next_psn()
    }

    /// The device driver.
    pub fn provider(&self) -> &P {
        &self.provider
    }

    /// Gives the device back (no object can be alive: they all borrow the context).
    pub fn into_provider(self) -> P {
        self.provider
    }

    /// The device's capabilities (`ibv_query_device`).
    pub fn caps(&self) -> &DeviceCaps {
        self.provider.caps()
    }

    /// Port attributes (`ibv_query_port`); ports are numbered from 1.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.provider.query_port(port)
    }

    /// A P_Key (`ibv_query_pkey`).
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        self.provider.query_pkey(port, index)
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<ProtectionDomain<'_, P>> {
        // SAFETY: the PD is held by a ProtectionDomain borrowing this context; it is destroyed
        // (or deliberately leaked) when that is dropped, before the context can be.
        let raw = unsafe { self.provider.create_pd()? };
        Ok(ProtectionDomain {
            ctx: self,
            raw: ManuallyDrop::new(raw),
        })
    }

    /// Creates a completion queue of at least `entries` entries (`ibv_create_cq`); the actual
    /// size is [`CompletionQueue::entries`].
    pub fn create_cq(&self, entries: u32) -> Result<CompletionQueue<'_, P>> {
        // SAFETY: as in `alloc_pd`: owned by a CompletionQueue that borrows this context.
        let raw = unsafe { self.provider.create_cq(entries, None)? };
        Ok(CompletionQueue {
            ctx: self,
            raw: ManuallyDrop::new(raw),
        })
    }

    /// Creates a completion queue whose events go to `channel` (`ibv_create_cq` with a
    /// completion channel); the channel outlives it (it is borrowed as long).
    ///
    /// # Errors
    ///
    /// As [`create_cq`](Self::create_cq), and [`Resource::Objects`](crate::error::Resource)
    /// for [`Object::CqEventSlot`](crate::error::Object::CqEventSlot) when
    /// [`CQ_SLOTS`](crate::events::CQ_SLOTS) CQs take part in events already.
    pub fn create_cq_with_channel<'a>(
        &'a self,
        entries: u32,
        channel: &'a CompletionChannel<'_, P>,
    ) -> Result<CompletionQueue<'a, P>> {
        // SAFETY: as in `alloc_pd`: owned by a CompletionQueue that borrows this context.
        let raw = unsafe { self.provider.create_cq(entries, Some(channel.id()))? };
        Ok(CompletionQueue {
            ctx: self,
            raw: ManuallyDrop::new(raw),
        })
    }

    /// Creates a completion channel (`ibv_create_comp_channel`): where the events of the CQs
    /// created on it are read, in order of arrival per CQ and fairly across CQs.
    ///
    /// # Errors
    ///
    /// [`Resource::Objects`](crate::error::Resource) for
    /// [`Object::CompletionChannel`](crate::error::Object::CompletionChannel) when
    /// [`CHANNELS`](crate::events::CHANNELS) are open.
    pub fn create_comp_channel(&self) -> Result<CompletionChannel<'_, P>> {
        CompletionChannel::open(self)
    }

    /// The next async event (`ibv_get_async_event`, non-blocking): port changes, QP, CQ and
    /// SRQ errors, the SRQ limit, a device failure. `None` when there is none now.
    pub fn get_async_event(&self) -> Option<AsyncEvent> {
        self.provider.next_async_event()
    }

    /// A future of the next async event (woken from the async-event interrupt).
    ///
    /// # Example
    ///
    /// ```
    /// # include!("../doctests.rs");
    /// # fn main() -> bareverbs::Result<()> {
    /// use bareverbs::verbs::AsyncEvent;
    /// let (machine, ctx) = pvrdma()?;
    /// machine.post_async(9, 1); // the model's device reports "port 1 active"
    /// let event = bareverbs::block_on(ctx.async_event());
    /// assert_eq!(event, AsyncEvent::PortActive(1));
    /// # Ok(()) }
    /// ```
    pub fn async_event(&self) -> AsyncEventFuture<'_, P> {
        AsyncEventFuture::new(self)
    }

    /// The interrupt entry: the embedder's handler for the device's interrupt `vector` calls
    /// it (interrupt-safe, bounded, never waits; see the provider's `interrupt`).
    pub fn interrupt(&self, vector: u16) {
        self.provider.interrupt(vector)
    }

    /// Takes the device's pending notifications now (what an interrupt does): for a driver
    /// that polls instead of taking interrupts.
    pub fn process_events(&self) {
        self.provider.process_events()
    }

    /// Interrupts and notifications counted so far, by cause.
    pub fn irq_counts(&self) -> IrqCounts {
        self.provider.events().counts()
    }

    /// Adds `gid` to port 1's GID table at `index`; dropping the binding removes it.
    pub fn bind_gid(&self, index: u32, gid: Gid) -> Result<GidBinding<'_, P>> {
        self.provider.bind_gid(index, gid)?;
        Ok(GidBinding {
            ctx: self,
            index,
            gid,
        })
    }

    // --- The rest of the verbs surface.

    /// The GID at `index` of port `port`'s table (`ibv_query_gid`). An index in range where
    /// nothing is bound gives the zero GID, as libibverbs does.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for [`Param::Port`](crate::error::Param::Port) or
    /// [`Param::GidIndex`](crate::error::Param::GidIndex) out of range.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        self.provider.query_gid(port, index)
    }

    /// The bound entries of port `port`'s GID table, (index, GID) in index order, read one at
    /// a time (no heap; an entry bound or unbound while iterating may or may not be seen).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a port out of range.
    pub fn gid_table(&self, port: u8) -> Result<GidEntries<'_, P>> {
        self.provider.query_gid(port, 0)?;
        Ok(GidEntries::new(self, port))
    }

    /// Fills `out` with the first `out.len()` bound entries of port `port`'s GID table (as
    /// [`gid_table`](Self::gid_table)); returns how many.
    ///
    /// # Errors
    ///
    /// As [`gid_table`](Self::gid_table).
    pub fn bound_gids(&self, port: u8, out: &mut [(u32, Gid)]) -> Result<usize> {
        let mut n = 0;
        for (slot, e) in out.iter_mut().zip(self.gid_table(port)?) {
            *slot = e;
            n += 1;
        }
        Ok(n)
    }
}

/// A protection domain (`ibv_pd`).
pub struct ProtectionDomain<'c, P: Provider> {
    ctx: &'c Context<P>,
    raw: ManuallyDrop<P::Pd>,
}

impl<'c, P: Provider> ProtectionDomain<'c, P> {
    /// The context it belongs to.
    pub fn context(&self) -> &'c Context<P> {
        self.ctx
    }

    /// The provider's object.
    pub fn raw(&self) -> &P::Pd {
        &self.raw
    }
}
destroy_and_drop!(ProtectionDomain, destroy_pd, "protection domain");

/// A GID added to the port's table; removed when dropped.
pub struct GidBinding<'c, P: Provider> {
    ctx: &'c Context<P>,
    index: u32,
    gid: Gid,
}

impl<P: Provider> GidBinding<'_, P> {
    /// The GID table index (the `sgid_index` to use in address vectors).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The GID.
    pub fn gid(&self) -> Gid {
        self.gid
    }

    /// Removes the GID, reporting failure (dropping does the same and only logs it).
    pub fn unbind(self) -> Result<()> {
        let r = self.ctx.provider.unbind_gid(self.index, self.gid);
        core::mem::forget(self);
        r
    }
}

impl<P: Provider> Drop for GidBinding<'_, P> {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.provider.unbind_gid(self.index, self.gid) {
            log::warn!("bareverbs: GID {} not unbound: {}", self.index, e);
        }
    }
}
