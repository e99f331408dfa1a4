//! The safe path's memory: a registered buffer pool — one memory region carved into
//! fixed-size buffers, handed out as 16-byte [`Buf`] handles that move into a queue pair when
//! posted and come back with their completion.
//!
//! Which buffers are free is one bit each in driver-private memory (atomics: a buffer can be
//! handed back from any poller, lock-free). A completion taken by a raw poll
//! ([`CompletionQueue::poll`](super::CompletionQueue::poll)), a flush or a destroy hands its
//! buffer back to the pool.

use core::marker::PhantomData;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::buf_release::BufRelease;
use super::{AccessFlags, MemoryRegion, ProtectionDomain, Provider, Sge};
use crate::error::{Error, Param, Result};

/// Free map layout: word 0 holds the buffer count, then one bit per buffer (1: in use).
unsafe fn release_bit(ctx: NonNull<u8>, index: u32) {
    let words = ctx.cast::<AtomicU64>();
    // SAFETY: `ctx` is a pool's free map (the caller's contract): word 0 is the count.
    let count = unsafe { words.as_ref() }.load(Ordering::Relaxed);
    if u64::from(index) >= count {
        return;
    }
    // SAFETY: index < count, and the map has a bit for each buffer after word 0.
    let w = unsafe { words.add(1 + index as usize / 64).as_ref() };
    w.fetch_and(!(1 << (index % 64)), Ordering::Release);
}

/// A registered buffer pool (`count` buffers of `size` bytes in one memory region): the safe
/// path's memory.
///
/// [`alloc`](Self::alloc) hands out a [`Buf`], which moves into a queue pair when posted
/// ([`QueuePair::post_send`](super::QueuePair::post_send),
/// [`post_recv`](super::QueuePair::post_recv)) and comes back with its completion; dropping a
/// `Buf` frees it. No code can touch a buffer while the device may use it.
///
/// # Example
///
/// ```
/// # include!("../doctests.rs");
/// # fn main() -> bareverbs::Result<()> {
/// use bareverbs::verbs::*;
/// let (_machine, ctx) = pvrdma()?;
/// let gid = ctx.bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64)?;
/// let pool = pd.buffer_pool(4, 100)?; // 4 buffers of 128 bytes (a multiple of 64)
/// assert_eq!((pool.count(), pool.free_count()), (4, 4));
///
/// let mut buf = pool.alloc().expect("a free buffer");
/// assert_eq!(buf.len(), 128); // the whole buffer, until set_len
/// buf.set_len(3)?;
/// buf.as_mut_slice().copy_from_slice(b"abc");
/// assert_eq!(pool.free_count(), 3);
///
/// let (mut a, mut b) = rc_pair(&pd, &cq, &pool, gid.gid())?;
/// b.post_recv(1, pool.alloc().expect("a free buffer"))?;
/// a.post_send(2, buf)?; // `buf` is the QP's now
/// let got = b.poll_one()?.expect("a receive completion");
/// assert_eq!(got.buf.as_ref().map(|b| b.as_slice()), Some(&b"abc"[..]));
/// drop(got); // the receive buffer goes back to the pool
/// drop(a.poll_one()?); // and the sent one
/// assert_eq!(pool.free_count(), 4);
/// # Ok(()) }
/// ```
pub struct BufferPool<'a, P: Provider> {
    mr: core::mem::ManuallyDrop<MemoryRegion<'a, P>>,
    map: core::mem::ManuallyDrop<P::Mem>,
    /// Queue pairs built with this pool that still exist (a QP whose destroy failed is kept
    /// for good, and so is the pool's memory then).
    users: AtomicU32,
    count: u32,
    size: u32,
    addr: u64,
    lkey: u32,
    base: NonNull<u8>,
    hint: AtomicU32,
}

// SAFETY: the buffers are reached only through `Buf` handles, each owning its buffer
// exclusively (the free map hands each out once); the map is atomics.
unsafe impl<P: Provider + Sync> Sync for BufferPool<'_, P> where P::Mem: Sync {}
// SAFETY: as above.
unsafe impl<P: Provider + Sync> Send for BufferPool<'_, P> where P::Mem: Send {}

impl<'c, P: Provider> ProtectionDomain<'c, P> {
    /// Registers a pool of `count` buffers of `size` bytes each (`size` rounded up to a
    /// multiple of 64), local write access only.
    pub fn buffer_pool(&self, count: u32, size: u32) -> Result<BufferPool<'_, P>> {
        if count == 0 {
            return Err(Error::invalid(Param::PoolBuffers, 0u32, u32::MAX));
        }
        if size == 0 || size > 1 << 30 {
            return Err(Error::invalid(Param::BufferSize, size, 1u32 << 30));
        }
        let size = size.next_multiple_of(64);
        let Some(len) = (count as usize).checked_mul(size as usize) else {
            return Err(Error::invalid(Param::PoolBuffers, count, u32::MAX / size));
        };
        let mr = self.register(len, AccessFlags::LOCAL_WRITE)?;
        let provider = self.context().provider();
        let map = provider.alloc_mem(8 * (1 + (count as usize).div_ceil(64)))?;
        let words = provider.mem_ptr(&map).cast::<AtomicU64>();
        // SAFETY: the map has at least one word; zeroed memory is a valid AtomicU64.
        unsafe { words.as_ref() }.store(u64::from(count), Ordering::Relaxed);
        let (addr, _, lkey, _) = provider.mr_info(mr.raw());
        let base = provider.mr_ptr(mr.raw());
        Ok(BufferPool {
            mr: core::mem::ManuallyDrop::new(mr),
            map: core::mem::ManuallyDrop::new(map),
            users: AtomicU32::new(0),
            count,
            size,
            addr,
            lkey,
            base,
            hint: AtomicU32::new(0),
        })
    }
}

impl<'a, P: Provider> BufferPool<'a, P> {
    fn word(&self, i: usize) -> &AtomicU64 {
        let words = self
            .mr
            .ctx
            .provider()
            .mem_ptr(&self.map)
            .cast::<AtomicU64>();
        debug_assert!(i < (self.count as usize).div_ceil(64));
        // SAFETY: the map has 1 + ⌈count/64⌉ words (`buffer_pool`); callers pass i below that.
        unsafe { words.add(1 + i).as_ref() }
    }

    /// Takes a free buffer (its length set to the whole buffer), or `None` when all are in
    /// use.
    pub fn alloc(&self) -> Option<Buf<'_, P>> {
        let words = (self.count as usize).div_ceil(64);
        let start = self.hint.load(Ordering::Relaxed) as usize % words;
        for k in 0..words {
            let i = (start + k) % words;
            let w = self.word(i);
            let mut cur = w.load(Ordering::Relaxed);
            loop {
                let valid = (self.count as usize - i * 64).min(64);
                let mask = if valid == 64 { !0 } else { (1u64 << valid) - 1 };
                let free = !cur & mask;
                if free == 0 {
                    break;
                }
                let bit = free.trailing_zeros();
                match w.compare_exchange_weak(
                    cur,
                    cur | (1 << bit),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        self.hint.store(i as u32, Ordering::Relaxed);
                        return Some(Buf {
                            pool: self,
                            index: (i * 64) as u32 + bit,
                            len: self.size,
                            _p: PhantomData,
                        });
                    }
                    Err(now) => cur = now,
                }
            }
        }
        None
    }

    /// Buffers in the pool.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes per buffer.
    pub fn buf_size(&self) -> u32 {
        self.size
    }

    /// Buffers free now.
    pub fn free_count(&self) -> u32 {
        let words = (self.count as usize).div_ceil(64);
        let used: u32 = (0..words)
            .map(|i| self.word(i).load(Ordering::Relaxed).count_ones())
            .sum();
        self.count - used
    }

    /// How a provider hands this pool's buffers back.
    pub(crate) fn release_hook(&self) -> BufRelease {
        BufRelease {
            f: release_bit,
            ctx: self.mr.ctx.provider().mem_ptr(&self.map),
        }
    }

    /// Rebuilds the handle of buffer `index` handed back by a completion with `len` bytes.
    pub(crate) fn reclaim(&self, index: u32, len: u32) -> Option<Buf<'_, P>> {
        (index < self.count).then(|| Buf {
            pool: self,
            index,
            len: len.min(self.size),
            _p: PhantomData,
        })
    }

    /// The region the buffers live in.
    pub fn memory_region(&self) -> &MemoryRegion<'a, P> {
        &self.mr
    }

    /// A queue pair built with this pool now exists.
    pub(crate) fn hold(&self) {
        self.users.fetch_add(1, Ordering::Relaxed);
    }

    /// A queue pair built with this pool was destroyed (by the device: none of its requests
    /// can touch the buffers any more).
    pub(crate) fn release(&self) {
        self.users.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<P: Provider> Drop for BufferPool<'_, P> {
    fn drop(&mut self) {
        if self.users.load(Ordering::Relaxed) != 0 {
            // A queue pair the device would not destroy still holds buffers of this pool (and
            // its completions would hand them back here): keep the memory for good.
            log::warn!("bareverbs: buffer pool used by a QP that was not destroyed: leaked");
            return;
        }
        // SAFETY: each field is dropped once, here; no QP holds the pool any more.
        unsafe {
            core::mem::ManuallyDrop::drop(&mut self.mr);
            core::mem::ManuallyDrop::drop(&mut self.map);
        }
    }
}

/// A buffer of a [`BufferPool`] (16 bytes: the pool, the index, the length). Dropping it
/// hands it back to the pool; posting it moves it into a queue pair until its completion.
pub struct Buf<'p, P: Provider> {
    pool: &'p BufferPool<'p, P>,
    index: u32,
    len: u32,
    _p: PhantomData<*mut u8>,
}

// SAFETY: a Buf owns its buffer's bytes exclusively; the pool is Sync.
unsafe impl<P: Provider> Send for Buf<'_, P> where for<'x> BufferPool<'x, P>: Sync {}

impl<'p, P: Provider> Buf<'p, P> {
    /// The buffer's index in its pool.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Bytes in use (what a send sends; after a receive, what arrived).
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether no byte is in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the buffer holds at most.
    pub fn capacity(&self) -> u32 {
        self.pool.size
    }

    /// Sets the bytes in use (at most the capacity).
    pub fn set_len(&mut self, len: u32) -> Result<()> {
        if len > self.pool.size {
            return Err(Error::invalid(Param::BufferRange, len, self.pool.size));
        }
        self.len = len;
        Ok(())
    }

    fn ptr(&self) -> *mut u8 {
        // SAFETY: index < count, so the buffer lies inside the region (count · size bytes).
        unsafe {
            self.pool
                .base
                .as_ptr()
                .add(self.index as usize * self.pool.size as usize)
        }
    }

    /// The bytes in use.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: this handle owns the buffer (not posted: posting consumes the handle), and
        // len ≤ size bytes of it lie in the region.
        unsafe { core::slice::from_raw_parts(self.ptr(), self.len as usize) }
    }

    /// The bytes in use, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, with `&mut self` for exclusive access.
        unsafe { core::slice::from_raw_parts_mut(self.ptr(), self.len as usize) }
    }

    /// The scatter/gather entry of the bytes in use.
    pub(crate) fn sge(&self) -> Sge {
        Sge {
            addr: self.pool.addr + u64::from(self.index) * u64::from(self.pool.size),
            length: self.len,
            lkey: self.pool.lkey,
        }
    }

    /// The scatter/gather entry of the whole buffer (a receive's room).
    pub(crate) fn room(&self) -> Sge {
        Sge {
            length: self.pool.size,
            ..self.sge()
        }
    }

    /// The pool it belongs to.
    pub fn pool(&self) -> &'p BufferPool<'p, P> {
        self.pool
    }

    /// Gives up the handle without handing the buffer back (it moves into a QP).
    pub(crate) fn into_tag(self) -> u32 {
        let t = self.index + 1;
        core::mem::forget(self);
        t
    }
}

impl<P: Provider> Drop for Buf<'_, P> {
    fn drop(&mut self) {
        // SAFETY: the pool is alive (borrowed) and this handle owned the buffer.
        unsafe { self.pool.release_hook().release(self.index) }
    }
}

impl<P: Provider> core::fmt::Debug for Buf<'_, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Buf")
            .field("index", &self.index)
            .field("len", &self.len)
            .finish()
    }
}
