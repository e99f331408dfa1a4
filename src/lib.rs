//! # bareverbs
//!
//! A `#![no_std]`, heap-free RDMA verbs driver for unikernels, bare-metal appliances and
//! firmware. It drives an RDMA device through a HAL the embedder provides (the
//! `bareverbs-hal` crate, re-exported as `bareverbs::hal`: DMA memory, register windows, PCI
//! configuration space, and for the software device an Ethernet link and a clock), and offers
//! the verbs objects with `libibverbs` semantics and a connection manager with `librdmacm`'s.
//!
//! Two devices:
//! - [`device::pvrdma`]: the VMware paravirtual RDMA NIC as QEMU emulates it, found on PCI
//!   and brought up by [`Pvrdma::probe`](device::pvrdma::Pvrdma::probe);
//! - [`device::rxe`]: software RoCEv2 over any Ethernet NIC (a `hal::Link`), interoperating
//!   with Linux's `rdma_rxe`, opened by [`Rxe::new`](device::rxe::Rxe::new).
//!
//! The rest:
//! - [`verbs`]: the device-agnostic API — [`Context`], [`ProtectionDomain`],
//!   [`CompletionQueue`], [`QueuePair`] (typed by transport and state; RC, UC, UD, GSI),
//!   buffer pools, memory regions and windows, shared receive queues, address handles,
//!   completion channels and futures — over a [`Provider`];
//! - [`cm`]: connection management on the wire, `rdma_cm`'s messages on QP1 (listen,
//!   connect, accept, reject, disconnect, SIDR for UD), interoperating with Linux;
//! - [`block_on`], [`Context::block_on`]: the smallest executor for those futures;
//! - [`pci`]: PCI enumeration and BAR sizing;
//! - [`Error`]: one `Copy` error type; a call that consumes an object hands it back with
//!   the error, and `?` takes the error alone.
//!
//! # Where to start
//!
//! - The hello-world is the README's example (a doctest): the same generic code on both
//!   devices, the safe and the raw paths.
//! - A connection by the CM, with RDMA WRITE and READ: [`cm`]; without a CM, each side's
//!   endpoint exchanged by hand: [`QueuePair::handshake`].
//! - Unreliable datagrams, answered through the sender's address:
//!   [`Context::init_ah_from_wc`].
//! - Two software devices on an in-memory segment: [`Rxe::new`](device::rxe::Rxe::new); a
//!   peer that only waits while its memory is used: [`Context::block_on`].
//! - Waiting without a loop: [`CompletionQueue::next_completion`],
//!   [`CompletionChannel`](verbs::CompletionChannel).
//! - NVMe over Fabrics, target and host: the `bareverbs-nvmf` crate's documentation.
//!
//! What must run for a peer to be served: a hardware device (PVRDMA) serves RDMA READs and
//! WRITEs on this side's memory by itself; the software device serves them inside this
//! side's calls — any wait the crate offers, a poll, or [`Context::progress`].
//!
//! # Depending on the crates
//!
//! ```toml
//! [dependencies]
//! bareverbs = "0.1"        # the driver, the verbs, the CM (re-exports bareverbs-hal as `hal`)
//! bareverbs-hal = "0.1"    # to implement the HAL for your platform (or its ready ones)
//! bareverbs-nvmf = { path = "…/nvmf" }  # NVMe over Fabrics on RDMA, target and host (not on crates.io)
//!
//! [dev-dependencies]
//! bareverbs-model = "0.1"  # the device model, an in-memory Ethernet segment, a test clock
//! ```
//!
//! From a checkout, `path = "…"` each (`hal/`, `nvmf/`, and the model's directory). The
//! examples in this documentation run on `bareverbs-model`: on a machine, your
//! `hal::Hal` and `hal::ConfigRegionAccess` implementations take the model's place, and
//! your NIC the in-memory segment's.
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
