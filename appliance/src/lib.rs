//! The bareverbs storage appliance: an NVMe over Fabrics RDMA target (`bareverbs-nvmf`) on
//! bareverbs' software RoCEv2 device, serving a RAM disk and the machine's virtio-blk disk to
//! unmodified Linux hosts. The binary (`src/main.rs`, booted by `cargo appliance`) runs on
//! `bareverbs-platform`'s machine; this library is what it serves and how, written against the
//! driver's traits so that its parts are tested on the host:
//!
//! - [`config`]: what the kernel command line declares (subsystems, namespaces, allow lists, address, port), checked against the machine before anything is served;
//! - [`nvmf_app`]: the target's serving loop, its console commands and counter report, and the
//!   host mode the NVMe-oF lab checks first;
//! - [`disk_check`]: the virtio-blk boot check (a pattern written, read back and flushed).
//!
//! How to run it: `docs/appliance.md`.
#![no_std]
#![deny(
    unsafe_op_in_unsafe_fn,
    missing_docs,
    clippy::undocumented_unsafe_blocks
)]

pub mod config;
pub mod disk_check;
pub mod nvmf_app;
