//! Memory windows (`ibv_alloc_mw`, `ibv_bind_mw`, `IBV_WR_BIND_MW`) and regions for fast
//! registration (`ib_alloc_mr`, `IB_WR_REG_MR`), with local invalidation
//! (`IBV_WR_LOCAL_INV`): keys a protection domain owns, whose access the send queue grants
//! and takes back in order with the other work requests (`docs/architecture.md`, "Memory
//! windows and fast registration", states the semantics relied on).

use super::{
    AccessFlags, CanSend, Context, ExtOp, ExtWqe, KeyKind, MemoryRegion, MwType, ProtectionDomain,
    Provider, QueuePair, SendBatch, SendFlags, Sge, State, Transport,
};
use crate::error::{Error, Param, Result};

/// A memory window (`ibv_mw`): a key of its protection domain that, once bound, grants a peer
/// remote access to a range of a memory region (narrower than the region's own rkey may),
/// and that is taken back by binding it again, by invalidating it (type 2) or by
/// deallocating it. While it is bound, its region cannot be deregistered
/// ([`Error::InUse`] with [`Holder::Windows`](crate::error::Holder::Windows)).
///
/// # Example
///
/// ```
/// # include!("../doctests.rs");
/// # fn main() -> bareverbs::Result<()> {
/// use bareverbs::verbs::*;
/// let (ctx, clock) = rxe_loopback()?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64)?;
/// let pool = pd.buffer_pool(1, 64)?;
/// let (mut a, mut b) = rc_pair(&pd, &cq, &pool, rxe_gid())?;
/// let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
/// let mut mr = pd.register(4096, access)?; // no remote right of its own
/// mr.as_mut_slice()[100..105].copy_from_slice(b"hello");
///
/// // A type 2 window over bytes 0..256, readable by B's peer only (A is bound to B).
/// let mut mw = pd.alloc_mw(MwType::Type2)?;
/// let bind = mr.window(0, 256, AccessFlags::REMOTE_READ)?;
/// let mut batch = b.send_batch();
/// let rkey = batch.bind_mw(1, SendFlags::SIGNALED, &mut mw, 0x42, &bind)?;
/// batch.finish();
/// assert_eq!(rkey & 0xFF, 0x42); // the low byte is the consumer's
///
/// // A reads through the window.
/// let local = pd.register(64, AccessFlags::LOCAL_WRITE)?;
/// // SAFETY: `local` is left alone until the completion is polled.
/// unsafe {
///     let mut batch = a.send_batch();
///     batch.rdma_read(2, SendFlags::SIGNALED, (mr.addr() + 100, rkey), &[local.sge(0, 5)?])?;
///     batch.finish();
/// }
/// let mut wc = [WorkCompletion::default(); 2];
/// let mut n = 0;
/// while n < 2 {
///     clock.advance(100);
///     ctx.process_events();
///     n += cq.poll(&mut wc[n..])?;
/// }
/// assert!(wc.iter().any(|c| c.opcode == WcOpcode::BindMw && c.status == WcStatus::Success));
/// assert!(wc.iter().any(|c| c.opcode == WcOpcode::RdmaRead && c.status == WcStatus::Success));
/// assert_eq!(&local.as_slice()[..5], b"hello");
/// drop(mw); // deallocated: the window's key is dead, the region free to go
/// mr.destroy()?;
/// # Ok(()) }
/// ```
pub struct MemoryWindow<'a, P: Provider> {
    ctx: &'a Context<P>,
    pd: &'a P::Pd,
    kind: MwType,
    /// The handle the provider knows it by (its key when allocated).
    handle: u32,
    rkey: u32,
}

/// Its type and key: what `unwrap` and `expect` print of a hand-back besides the error.
impl<P: Provider> core::fmt::Debug for MemoryWindow<'_, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("kind", &self.kind)
            .field("rkey", &self.rkey)
            .finish()
    }
}

/// Where a window is bound: a range of a memory region and the remote rights it grants
/// (`struct ibv_mw_bind_info`); made by [`MemoryRegion::window`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwBind {
    /// The region's local key.
    pub mr_lkey: u32,
    /// The first byte, in the region's address space.
    pub addr: u64,
    /// Bytes (0: unbind a type 1 window).
    pub length: u64,
    /// The remote rights (`REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`).
    pub access: AccessFlags,
}

/// A memory region allocated for fast registration (`ib_alloc_mr` of
/// `IB_MR_TYPE_MEM_REG`): a key that maps nothing until a [`SendBatch::reg_mr`] maps memory
/// under a new key, and that [`SendBatch::local_inv`] (or a peer's SEND with invalidate)
/// takes back. Its key is both its lkey and its rkey.
///
/// # Example
///
/// ```
/// # include!("../doctests.rs");
/// # fn main() -> bareverbs::Result<()> {
/// use bareverbs::verbs::*;
/// let (ctx, clock) = rxe_loopback()?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64)?;
/// let pool = pd.buffer_pool(1, 64)?;
/// let (mut a, _b) = rc_pair(&pd, &cq, &pool, rxe_gid())?;
/// let data = pd.register(8192, AccessFlags::LOCAL_WRITE)?;
/// let mut frmr = pd.alloc_fast_reg_mr(4)?;
/// let reg = FastReg {
///     sge: data.sge(0, 8192)?,
///     iova: 0x1_0000_0000, // what peers name the first byte by
///     access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
/// };
/// let mut batch = a.send_batch();
/// let key = batch.reg_mr(1, SendFlags::SIGNALED, &mut frmr, 7, &reg)?;
/// batch.local_inv(2, SendFlags::SIGNALED, key)?; // and taken back
/// batch.finish();
/// let mut wc = [WorkCompletion::default(); 2];
/// let mut n = 0;
/// while n < 2 {
///     clock.advance(100);
///     ctx.process_events();
///     n += cq.poll(&mut wc[n..])?;
/// }
/// assert_eq!((wc[0].opcode, wc[0].status), (WcOpcode::RegMr, WcStatus::Success));
/// assert_eq!((wc[1].opcode, wc[1].status), (WcOpcode::LocalInv, WcStatus::Success));
/// # Ok(()) }
/// ```
pub struct FastRegMr<'a, P: Provider> {
    ctx: &'a Context<P>,
    pd: &'a P::Pd,
    handle: u32,
    key: u32,
    max_pages: u32,
}

/// Its key and size: what `unwrap` and `expect` print of a hand-back besides the error.
impl<P: Provider> core::fmt::Debug for FastRegMr<'_, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FastRegMr")
            .field("key", &self.key)
            .field("max_pages", &self.max_pages)
            .finish()
    }
}

/// A fast registration: the memory mapped, where peers find it, and the rights granted
/// (the `ib_reg_wr` of one contiguous range: `ib_map_mr_sg` of a single entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastReg {
    /// The memory: a range of a memory region of the QP's protection domain (its local
    /// key, CPU address and length). At most the region's `max_pages` pages of 4 KiB.
    pub sge: Sge,
    /// The address the region's users name the first byte by.
    pub iova: u64,
    /// The rights granted (remote write and atomics need `LOCAL_WRITE`, as for a
    /// registration).
    pub access: AccessFlags,
}

impl TryFrom<u32> for MwType {
    type Error = Error;

    /// The type `ibv_alloc_mw` names by number: `IBV_MW_TYPE_1` (1) or `IBV_MW_TYPE_2` (2);
    /// any other number is [`Error::InvalidInput`] for [`Param::MwType`].
    fn try_from(v: u32) -> Result<Self> {
        match v {
            1 => Ok(MwType::Type1),
            2 => Ok(MwType::Type2),
            v => Err(Error::invalid(Param::MwType, v, 2u32)),
        }
    }
}

/// The key with its low byte replaced by `byte` (`ib_update_fast_reg_key`).
fn with_byte(key: u32, byte: u8) -> u32 {
    (key & !0xFF) | u32::from(byte)
}

impl<'c, P: Provider> ProtectionDomain<'c, P> {
    /// Allocates a memory window of type `kind` in this PD (`ibv_alloc_mw`), unbound.
    ///
    /// # Errors
    ///
    /// A typed [`Unsupported`](crate::error::Unsupported) for
    /// [`Feature::MemoryWindows`](crate::error::Feature::MemoryWindows) on a device without
    /// them (QEMU's PVRDMA); [`Error::Resource`] when the device's key table is full.
    pub fn alloc_mw(&self, kind: MwType) -> Result<MemoryWindow<'_, P>> {
        let handle = self
            .context()
            .provider()
            .alloc_key(self.raw(), KeyKind::Window(kind))?;
        Ok(MemoryWindow {
            ctx: self.context(),
            pd: self.raw(),
            kind,
            handle,
            rkey: handle,
        })
    }

    /// Allocates a memory region for fast registration of up to `max_pages` pages of 4 KiB
    /// (`ib_alloc_mr` with `IB_MR_TYPE_MEM_REG`), mapping nothing yet.
    ///
    /// # Errors
    ///
    /// A typed [`Unsupported`](crate::error::Unsupported) for
    /// [`Feature::FastRegistration`](crate::error::Feature::FastRegistration) on a device
    /// without it; [`Error::InvalidInput`] for 0 pages.
    pub fn alloc_fast_reg_mr(&self, max_pages: u32) -> Result<FastRegMr<'_, P>> {
        if max_pages == 0 {
            return Err(Error::invalid(Param::MrLength, 0u32, u32::MAX));
        }
        let handle = self
            .context()
            .provider()
            .alloc_key(self.raw(), KeyKind::FastReg { max_pages })?;
        Ok(FastRegMr {
            ctx: self.context(),
            pd: self.raw(),
            handle,
            key: handle,
            max_pages,
        })
    }
}

impl<P: Provider> MemoryRegion<'_, P> {
    /// Where a window goes: `length` bytes from `offset` of this region, with the remote
    /// rights `access`; checked against the region's bounds here (its rights, `MW_BIND`
    /// among them, when the bind executes).
    pub fn window(&self, offset: u64, length: u64, access: AccessFlags) -> Result<MwBind> {
        let end = offset.saturating_add(length);
        if end > self.len() as u64 {
            return Err(Error::invalid(Param::BufferRange, end, self.len() as u64));
        }
        Ok(MwBind {
            mr_lkey: self.lkey(),
            addr: self.addr() + offset,
            length,
            access,
        })
    }
}

impl<P: Provider> MemoryWindow<'_, P> {
    /// The key a peer names the window by (as of the last bind posted).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Its type.
    pub fn kind(&self) -> MwType {
        self.kind
    }

    /// Deallocates the window (`ibv_dealloc_mw`), bound or not: access through it ends and
    /// its region is released. Hands it back on failure.
    pub fn dealloc(self) -> Result<(), (Self, Error)> {
        match self.ctx.provider().free_key(self.pd, self.handle) {
            Ok(()) => {
                core::mem::forget(self);
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }

    fn bind_wqe(&self, wr_id: u64, flags: SendFlags, new_rkey: u32, b: &MwBind) -> ExtWqe<'_> {
        ExtWqe {
            wr_id,
            flags,
            op: ExtOp::BindMw {
                mw: self.rkey,
                kind: self.kind,
                new_rkey,
                mr_lkey: b.mr_lkey,
                addr: b.addr,
                length: b.length,
                access: b.access,
            },
        }
    }
}

impl<P: Provider> Drop for MemoryWindow<'_, P> {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.provider().free_key(self.pd, self.handle) {
            crate::error::warn("memory window not deallocated (", &e, ")");
        }
    }
}

impl<P: Provider> FastRegMr<'_, P> {
    /// Its key (lkey and rkey), as of the last registration posted.
    pub fn key(&self) -> u32 {
        self.key
    }

    /// Pages of 4 KiB it may map.
    pub fn max_pages(&self) -> u32 {
        self.max_pages
    }

    /// Deallocates the region (`ib_dereg_mr`), registered or not. Hands it back on failure.
    pub fn dealloc(self) -> Result<(), (Self, Error)> {
        match self.ctx.provider().free_key(self.pd, self.handle) {
            Ok(()) => {
                core::mem::forget(self);
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }
}

impl<P: Provider> Drop for FastRegMr<'_, P> {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.provider().free_key(self.pd, self.handle) {
            crate::error::warn("fast-registration region not deallocated (", &e, ")");
        }
    }
}

impl<P: Provider, T> SendBatch<'_, P, T> {
    /// Binds the type 2 window `mw` to this QP over `bind` under the key whose low byte is
    /// `key` (`IBV_WR_BIND_MW`); returns that key. Completes with
    /// [`WcOpcode::BindMw`](super::WcOpcode::BindMw); a bind the device refuses (the window
    /// still bound, the region without `MW_BIND`, another PD) completes with
    /// [`WcStatus::MwBindErr`](super::WcStatus::MwBindErr) and the QP enters ERROR.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for [`Param::MwType`] on a type 1 window (bound by
    /// [`QueuePair::bind_mw`]); as for the other requests (a full queue, a device without
    /// windows).
    pub fn bind_mw(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        mw: &mut MemoryWindow<'_, P>,
        key: u8,
        bind: &MwBind,
    ) -> Result<u32> {
        if mw.kind != MwType::Type2 {
            return Err(Error::invalid(Param::MwType, 1u32, 2u32));
        }
        let new = with_byte(mw.rkey, key);
        // SAFETY: a bind names no memory the device copies: the region it names is checked
        // (registered, in the QP's PD) when it executes, and held registered while bound.
        unsafe { self.push_ext(&mw.bind_wqe(wr_id, flags, new, bind))? };
        mw.rkey = new;
        Ok(new)
    }

    /// Maps `reg` into the fast-registration region `mr` under the key whose low byte is
    /// `key` (`IB_WR_REG_MR`); returns that key. Completes with
    /// [`WcOpcode::RegMr`](super::WcOpcode::RegMr); a registration the device refuses (the
    /// region still registered, more than its pages, memory outside a region of the QP's
    /// PD) completes with [`WcStatus::LocQpOpErr`](super::WcStatus::LocQpOpErr) and the QP
    /// enters ERROR.
    pub fn reg_mr(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        mr: &mut FastRegMr<'_, P>,
        key: u8,
        reg: &FastReg,
    ) -> Result<u32> {
        let new = with_byte(mr.key, key);
        let w = ExtWqe {
            wr_id,
            flags,
            op: ExtOp::RegMr {
                mr: mr.key,
                new_key: new,
                sge: reg.sge,
                iova: reg.iova,
                access: reg.access,
            },
        };
        // SAFETY: the memory named is checked (inside a region of the QP's PD) when the
        // registration executes, and that region is held registered while it is mapped.
        unsafe { self.push_ext(&w)? };
        mr.key = new;
        Ok(new)
    }

    /// Invalidates `key`, a fast-registered region's or a type 2 window's
    /// (`IBV_WR_LOCAL_INV`): later access through it fails. Completes with
    /// [`WcOpcode::LocalInv`](super::WcOpcode::LocalInv); a key that names neither, or one
    /// of another PD, completes with [`WcStatus::LocQpOpErr`](super::WcStatus::LocQpOpErr)
    /// and the QP enters ERROR.
    pub fn local_inv(&mut self, wr_id: u64, flags: SendFlags, key: u32) -> Result<()> {
        let w = ExtWqe {
            wr_id,
            flags,
            op: ExtOp::LocalInv { key },
        };
        // SAFETY: names no memory.
        unsafe { self.push_ext(&w) }
    }
}

impl<'a, P: Provider, T: Transport, S: State> QueuePair<'a, P, T, S> {
    /// Binds the type 1 window `mw` over `bind` (`ibv_bind_mw`), posted on this QP as a
    /// one-request batch; returns its new key (the low byte one more than before). Length 0
    /// unbinds it. Completes as [`SendBatch::bind_mw`] does.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for [`Param::MwType`] on a type 2 window; as for a post.
    pub fn bind_mw(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        mw: &mut MemoryWindow<'_, P>,
        bind: &MwBind,
    ) -> Result<u32>
    where
        S: CanSend,
    {
        if mw.kind != MwType::Type1 {
            return Err(Error::invalid(Param::MwType, 2u32, 1u32));
        }
        let new = with_byte(mw.rkey, (mw.rkey as u8).wrapping_add(1));
        let mut batch = self.send_batch();
        // SAFETY: as in `SendBatch::bind_mw`.
        unsafe { batch.push_ext(&mw.bind_wqe(wr_id, flags, new, bind))? };
        batch.finish();
        mw.rkey = new;
        Ok(new)
    }
}
