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

        /// Its kind alone (the device's handle is not the caller's): what `unwrap` and
        /// `expect` print of a hand-back (`Err((object, error))`) besides the error.
        impl<P: Provider> core::fmt::Debug for $ty<'_, P> {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.debug_struct(stringify!($ty)).finish_non_exhaustive()
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
mod mw;
mod pool;
mod provider;
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

pub use ah::{AddressHandle, GRH_LEN};
pub use buf_release::BufRelease;
pub use channel::CompletionChannel;
pub use cq::{CompletionQueue, PollCursor};
pub use gid::GidEntries;
pub use mr::MemoryRegion;
pub use mw::{FastReg, FastRegMr, MemoryWindow, MwBind};
pub use pool::{Buf, BufferPool};
pub use provider::{PollCq, Provider};
pub use qp::{
    CanRecv, CanSend, Completion, ConnectedInit, ConnectedRtr, ConnectedRts, DEFAULT_RD_ATOMIC,
    Datagram, DatagramInit, DatagramRts, Endpoint, ErrState, Gsi, Handshake, Init, QpBuilder,
    QueuePair, RawPacket, Rc, RecvBatch, Reset, Rtr, Rts, SendBatch, State, Transport, Uc, Ud,
};
pub use qp_types::{
    AccessFlags, AddressVector, CreateFlags, ModifyAttr, QpAttr, QpAttrMask, QpCaps, QpInit,
    QpInitEx, QpState, QpType, RxHashConf, SrqAttr,
};
pub use query::GidEntry;
pub use random::Entropy;
pub use shared::SharedProvider;
pub use srq::SharedReceiveQueue;
pub use types::{DeviceCaps, Gid, GidType, LinkLayer, Mtu, PortAttr, PortState};
pub use wait::{AsyncEventFuture, CqEventFuture, NextCompletion, Ready};
pub use wr::{
    ExtOp, ExtWqe, KeyKind, MwType, RecvWr, SendFlags, SendWqe, Sge, UdTarget, WcFlags, WcOpcode,
    WcStatus, WorkCompletion, WrOpcode,
};

use crate::error::Result;
pub use crate::events::{AsyncEvent, CqId, IrqCounts};

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

    /// Runs the device's work for its peers now ([`Provider::progress`]): on the software
    /// RoCE device, the frames received — a peer's READs, WRITEs and atomics on this side's
    /// memory are served here — and the timers; nothing on PVRDMA, whose device runs by
    /// itself. Bounded; never waits.
    ///
    /// The crate's waits call it already (its futures when polled, [`block_on`](Self::block_on),
    /// completion channels, the CM). An application that waits on anything else — a lock, a
    /// socket, its own flag — while a peer uses its memory calls it from that loop, or waits
    /// through [`block_on`](Self::block_on).
    pub fn progress(&self) {
        self.provider.progress()
    }

    /// Runs `fut` to completion on this core, as [`crate::block_on`], running this device's
    /// [`progress`](Self::progress) between polls: whatever `fut` waits for — a completion
    /// of this device, another device's, a flag of the application's — the peers using this
    /// device's memory are served meanwhile. Spins: it returns only when `fut` does (bound
    /// the wait in the future, or use [`crate::block_on_with`] with an idle step that gives
    /// up).
    ///
    /// # Example
    ///
    /// A side that only waits while its memory is written: an RDMA WRITE lands in `dst`
    /// while the application awaits its own condition (here the written bytes themselves,
    /// on the software RoCE device in loopback: the same device is both ends).
    ///
    /// ```
    /// # include!("../doctests.rs");
    /// # fn main() -> bareverbs::Result<()> {
    /// use bareverbs::verbs::*;
    /// use std::task::Poll;
    /// let (ctx, _clock) = rxe_loopback()?;
    /// let pd = ctx.alloc_pd()?;
    /// let cq = ctx.create_cq(64)?;
    /// let pool = pd.buffer_pool(4, 64)?;
    /// let (mut a, _b) = rc_pair(&pd, &cq, &pool, rxe_gid())?;
    /// let mut src = pd.register(8, AccessFlags::LOCAL_WRITE)?;
    /// let dst = pd.register(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    /// src.as_mut_slice().copy_from_slice(b"written!");
    /// // SAFETY: `src` is left alone until the completion is polled.
    /// unsafe {
    ///     let mut batch = a.send_batch();
    ///     batch.rdma_write(1, SendFlags::SIGNALED, (dst.addr(), dst.rkey()), &[src.sge(0, 8)?])?;
    ///     batch.finish();
    /// }
    /// // Not a future of the crate's: `block_on` serves the peer between its polls.
    /// let landed = std::future::poll_fn(|_| match dst.as_slice() {
    ///     b"written!" => Poll::Ready(()),
    ///     _ => Poll::Pending,
    /// });
    /// ctx.block_on(landed);
    /// assert_eq!(bareverbs::block_on(cq.next_completion())?.status, WcStatus::Success);
    /// # Ok(()) }
    /// ```
    pub fn block_on<F: core::future::Future>(&self, fut: F) -> F::Output {
        crate::block_on_with(fut, || self.progress())
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
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for [`Param::Port`](crate::error::Param::Port) or
    /// [`Param::GidIndex`](crate::error::Param::GidIndex) out of range.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        self.provider.query_gid(port, index)
    }

    /// The bound entries of port `port`'s GID table, (index, GID) in index order, read one at
    /// a time (no heap; an entry bound or unbound while iterating may or may not be seen).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a port out of range.
    pub fn gid_table(&self, port: u8) -> Result<GidEntries<'_, P>> {
        self.provider.query_gid(port, 0)?;
        Ok(GidEntries::new(self, port))
    }

    /// Fills `out` with the bound entries of port `port`'s GID table (as
    /// [`gid_table`](Self::gid_table)); returns how many. A buffer too short for them is an
    /// error, as `ibv_query_gid_table`'s EINVAL: an empty table and a short buffer are told
    /// apart (the entries that fit are written all the same).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for
    /// [`Param::GidTableBuffer`](crate::error::Param::GidTableBuffer) when `out` is shorter
    /// than the bound entries (`value` its length, `max` the entries: the length it needs);
    /// as [`gid_table`](Self::gid_table) for the port.
    pub fn bound_gids(&self, port: u8, out: &mut [(u32, Gid)]) -> Result<usize> {
        let mut n = 0usize;
        for e in self.gid_table(port)? {
            if let Some(slot) = out.get_mut(n) {
                *slot = e;
            }
            n += 1;
        }
        if n > out.len() {
            return Err(crate::error::Error::invalid(
                crate::error::Param::GidTableBuffer,
                out.len() as u64,
                n as u64,
            ));
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
