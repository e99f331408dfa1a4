//! # bareverbs
//!
//! A `#![no_std]`, heap-free RDMA verbs driver for unikernels, bare-metal appliances and
//! firmware. It probes an RDMA NIC over PCI, brings up its command interface and queue memory
//! through a HAL the embedder provides ([`bareverbs_hal`]), and offers the verbs objects with
//! `libibverbs` semantics.
//!
//! - [`verbs`]: the device-agnostic API — [`Context`], [`ProtectionDomain`],
//!   [`CompletionQueue`], GID bindings — over a [`Provider`].
//! - [`device::pvrdma`]: the first provider, the VMware paravirtual RDMA NIC as QEMU emulates it.
//! - [`pci`]: PCI enumeration and BAR sizing.
//! - [`Error`]: one `Copy` error type.
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
pub mod pci;
pub mod verbs;

pub use bareverbs_hal as hal;
pub use error::{Error, ErrorKind, Result};
pub use verbs::{CompletionQueue, Context, Gid, ProtectionDomain, Provider, QueuePair};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
