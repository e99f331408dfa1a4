//! NVMe over Fabrics on RDMA, as Linux's `nvme-rdma` host and `nvmet-rdma` target speak it:
//! a target (a discovery controller and NVM subsystems whose namespaces are
//! [`BlockDevice`]s) and a host, over bareverbs' verbs and connection manager.
//!
//! No heap, no thread: every buffer is sized by const generics or configuration, and all
//! progress happens in `poll` calls the embedder makes. The wire facts and what is left out
//! are in `docs/nvmeof.md`.
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod block;
pub mod host;
pub mod target;
pub mod wire;

pub use block::{BlockDevice, BlockError, RamDisk};
pub use host::{Host, HostConfig, HostError};
pub use target::{Subsystem, Target, TargetConfig, TargetCounts};
pub use wire::{Cqe, Sgl, Sqe, Status};

/// NVMe/RDMA's well-known port.
pub const NVME_RDMA_PORT: u16 = 4420;
