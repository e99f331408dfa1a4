//! # bareverbs
//!
//! A `#![no_std]`, heap-free RDMA verbs driver for unikernels, bare-metal appliances and
//! firmware. It drives an RDMA device through a HAL the embedder provides ([`bareverbs_hal`]:
//! DMA memory, register windows, PCI configuration space, and for the software device an
//! Ethernet link and a clock), and offers the verbs objects with `libibverbs` semantics.
//!
//! Two devices:
//! - [`device::pvrdma`]: the VMware paravirtual RDMA NIC as QEMU emulates it, found on PCI
//!   and brought up by [`Pvrdma::probe`](device::pvrdma::Pvrdma::probe);
//! - [`device::rxe`]: software RoCEv2 over any Ethernet NIC (a [`hal::Link`]), interoperating
//!   with Linux's `rdma_rxe`, opened by [`Rxe::new`](device::rxe::Rxe::new).
//!
//! The rest:
//! - [`verbs`]: the device-agnostic API — [`Context`], [`ProtectionDomain`],
//!   [`CompletionQueue`], [`QueuePair`] (typed by transport and state), buffer pools, memory
//!   regions, completion channels and futures — over a [`Provider`];
//! - [`block_on`]: the smallest executor for those futures;
//! - [`pci`]: PCI enumeration and BAR sizing;
//! - [`Error`]: one `Copy` error type.
//!
//! # Quick start
//!
//! On the device model (`bareverbs-model`, a software PVRDMA with QEMU's behaviour: memory,
//! PCI configuration space and the device in one value). On a machine, your [`hal::Hal`] and
//! [`hal::ConfigRegionAccess`] implementations take its place.
//!
//! ```
//! use bareverbs::Context;
//! use bareverbs::device::pvrdma::{Config, Pvrdma};
//! use bareverbs::verbs::*;
//! use bareverbs_model::Model;
//!
//! fn connect<'a, P: Provider>(
//!     qp: QueuePair<'a, P, Rc, Reset>,
//!     peer_qpn: u32,
//!     peer: AddressVector,
//! ) -> bareverbs::Result<QueuePair<'a, P, Rc, Rts>> {
//!     let qp = qp.init(&ConnectedInit::default())?;
//!     let qp = qp.rtr(&ConnectedRtr::new(peer_qpn, 0, peer))?;
//!     Ok(qp.rts(&ConnectedRts::new(0))?)
//! }
//!
//! # fn main() -> bareverbs::Result<()> {
//! let machine = Model::default();
//! let ctx = Context::new(Pvrdma::probe(machine.clone(), &machine, Config::default())?);
//! // RoCE addresses by GID: one bound before a QP connects (dropping the binding removes it).
//! let gid = ctx.bind_gid(0, Gid::link_local_from_mac([0x52, 0x54, 0, 0x12, 0x34, 0x57]))?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(256)?;
//! let pool = pd.buffer_pool(16, 1024)?; // 16 registered buffers of 1 KiB
//!
//! // Two RC queue pairs, connected to each other: RESET -> INIT -> RTR -> RTS.
//! let a = pd.qp_builder(&cq, &cq).pool(&pool).build::<Rc>()?;
//! let b = pd.qp_builder(&cq, &cq).pool(&pool).build::<Rc>()?;
//! let av = AddressVector::new(gid.gid(), gid.index() as u8);
//! let (qpn_a, qpn_b) = (a.qp_num(), b.qp_num());
//! let (mut a, mut b) = (connect(a, qpn_b, av)?, connect(b, qpn_a, av)?);
//!
//! // A buffer moves into the QP when posted and comes back with its completion.
//! b.post_recv(1, pool.alloc().expect("a free buffer"))?;
//! let mut buf = pool.alloc().expect("a free buffer");
//! buf.set_len(5)?;
//! buf.as_mut_slice().copy_from_slice(b"hello");
//! a.post_send(2, buf)?;
//! let got = b.poll_one()?.expect("a receive completion");
//! assert_eq!((got.wc.status, got.wc.byte_len), (WcStatus::Success, 5));
//! assert_eq!(got.buf.expect("the buffer").as_slice(), b"hello");
//! # let sent = a.poll_one()?.expect("a send completion");
//! # assert_eq!(sent.wc.wr_id, 2);
//! # Ok(()) }
//! ```
//!
//! Dropping destroys (best effort, never panicking); `destroy()` reports. The objects borrow
//! what they were made from, so nothing outlives what it needs.
#![cfg_attr(not(test), no_std)]
#![deny(
    unsafe_op_in_unsafe_fn,
    missing_docs,
    clippy::undocumented_unsafe_blocks
)]
// No heap: an object whose destroy fails is handed back by value inside the `Err`, not boxed.
#![allow(clippy::result_large_err)]

pub mod cm;
pub mod device;
mod dma;
pub mod error;
pub mod events;
mod executor;
pub mod pci;
pub mod verbs;

pub use bareverbs_hal as hal;
/// The `bitflags` crate the flag types ([`verbs::AccessFlags`], [`verbs::SendFlags`] …) are
/// made with: its [`Flags`](bitflags::Flags) trait is theirs.
pub use bitflags;
pub use error::{Error, ErrorKind, Result};
pub use executor::{block_on, block_on_with};
/// The `heapless` crate: [`QueuePair::poll`] fills a [`heapless::Vec`].
pub use heapless;
pub use verbs::{CompletionQueue, Context, Gid, ProtectionDomain, Provider, QueuePair};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
