//! NVMe over Fabrics on RDMA, as Linux's `nvme-rdma` host and `nvmet-rdma` target speak it:
//! a target (a discovery controller and NVM subsystems whose namespaces are
//! [`BlockDevice`]s) and a host, over bareverbs' verbs and connection manager.
//!
//! No heap, no thread: every buffer is sized by const generics or configuration, and all
//! progress happens in `poll` calls the embedder makes. The wire facts and what is left out
//! are in `docs/nvmeof.md`.
//!
//! # Example
//!
//! A target serving a 1 MiB RAM disk and a host that writes and reads it, on two software
//! RoCE devices on the test model's in-memory segment (`bareverbs-model`, a development
//! dependency; on a machine each device is over its NIC, and either side may be Linux's
//! `nvmet-rdma` or `nvme connect`). The defaults, [`TargetConfig::default()`] and
//! [`HostConfig::default()`], are spelled out:
//!
//! | [`TargetConfig`] | default | | [`HostConfig`] | default |
//! |---|---|---|---|---|
//! | `port` | 4420 | | `addr` | none: the target's IPv4 address, to set |
//! | `port_id` | 1 | | `port` | 4420 |
//! | `max_io_queues` | 4 | | `subnqn` | none: the subsystem's NQN, to set |
//! | `io_depth` | 128 | | `hostnqn` | a zero UUID NQN |
//! | `inline_data` | 4096 bytes | | `io_queues` | 1 |
//! | `max_transfer` | 128 KiB | | `io_depth` | 32 |
//! | `data_slots` | 32 | | `kato_ms` | 5000 |
//! | `default_kato_ms` | 0 (none) | | `max_transfer`, `inline`, `timeout_ms` | 32 KiB, on, 10 000 |
//! | `cntlid_min`, `cntlid_max` | 1, 0xFFEF | | | |
//! | `peers` | none | | | |
//!
//! ```
//! use bareverbs::Context;
//! use bareverbs::cm::{Cm, CmConfig, Service};
//! use bareverbs::device::rxe::{Config, Rxe};
//! use bareverbs_model::link::{Segment, TestClock};
//! use bareverbs_model::{Model, ModelConfig};
//! use bareverbs_nvmf::{BlockDevice, Host, HostConfig, NVME_RDMA_PORT, RamDisk, Subsystem};
//! use bareverbs_nvmf::{Target, TargetConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (model, segment, clock) = (Model::new(ModelConfig::default()), Segment::new(), TestClock::default());
//! let device = |mac, ip| Rxe::new(model.clone(), segment.attach(mac, 1514), clock.clone(), Config { ip });
//! let host_dev = Context::new(device([2, 0, 0, 0, 0, 1], [10, 0, 0, 1])?);
//! let target_dev = Context::new(device([2, 0, 0, 0, 0, 2], [10, 0, 0, 2])?);
//!
//! // The target: subsystem "…:ram", namespace 1 a RAM disk of 512-byte blocks, the defaults.
//! let config = TargetConfig::default();
//! assert_eq!((config.port, config.max_io_queues, config.io_depth), (NVME_RDMA_PORT, 4, 128));
//! assert_eq!((config.inline_data, config.max_transfer, config.data_slots), (4096, 128 * 1024, 32));
//! let pd = target_dev.alloc_pd()?;
//! // The CM's completion queue, and the target's: Q × 4 × D entries hold every queue's work.
//! let (cm_cq, cq) = (target_dev.create_cq(64)?, target_dev.create_cq(8 * 4 * 128)?);
//! let mut target_cm: Cm<_, _, 8> = Cm::new(&pd, &cm_cq, clock.clone(), CmConfig::default())?;
//! target_cm.listen(None, config.port, Service::Rc)?;
//! let mut memory = vec![0u8; 1 << 20];
//! let mut disk = RamDisk::new(&mut memory, 512);
//! let mut namespaces: [&mut dyn BlockDevice; 1] = [&mut disk];
//! let mut subsystems = [Subsystem::new("nqn.2026-11.io.example:ram", &mut namespaces)];
//! // At most 8 queues (admin + I/O, all hosts) of at most 128 commands.
//! let mut target: Target<'_, '_, _, _, 8, 128> =
//!     Target::new(&pd, &cq, clock.clone(), target_cm.ip(), config, &mut subsystems)?;
//!
//! // The host: the target's address and subsystem, the rest the defaults (1 I/O queue of 32).
//! let config = HostConfig { addr: [10, 0, 0, 2], subnqn: "nqn.2026-11.io.example:ram", ..HostConfig::default() };
//! assert_eq!((config.port, config.io_queues, config.io_depth, config.kato_ms), (4420, 1, 32, 5000));
//! let host_pd = host_dev.alloc_pd()?;
//! // Q × 2 × D entries: the admin queue and one I/O queue, of 32.
//! let (host_cm_cq, host_cq) = (host_dev.create_cq(64)?, host_dev.create_cq(2 * 2 * 32)?);
//! let mut host_cm: Cm<_, _, 8> = Cm::new(&host_pd, &host_cm_cq, clock.clone(), CmConfig::default())?;
//! let mut host: Host<'_, '_, _, _, 2, 32> = Host::new(&host_pd, &host_cq, clock.clone(), config);
//!
//! // The host's calls wait, running `idle` between looks: here it runs the target, which on
//! // its own machine runs `target.poll(&mut target_cm)` in its loop.
//! let mut idle = || {
//!     clock.advance(20);
//!     target.poll(&mut target_cm);
//! };
//! host.connect(&mut host_cm, &mut idle)?; // admin queue, controller enabled, 1 I/O queue
//! let blocks = [0x5Au8; 1024];
//! host.write(1, 1, 8, 2, &blocks, &mut idle)?; // queue 1, namespace 1, LBA 8, 2 blocks
//! let mut back = [0u8; 1024];
//! host.read(1, 1, 8, 2, &mut back, &mut idle)?;
//! assert_eq!(back, blocks);
//! host.disconnect(&mut host_cm, &mut idle)?;
//! # Ok(()) }
//! ```
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod block;
pub mod host;
pub mod target;
pub mod wire;

pub use block::{BlockDevice, BlockError, RamDisk, SharedRam, SharedRamDisk};
pub use host::{Data, Host, HostConfig, HostError};
pub use target::{Subsystem, Target, TargetConfig, TargetCounts, TargetError};
pub use wire::{Cqe, Sgl, Sqe, Status};

/// NVMe/RDMA's well-known port.
pub const NVME_RDMA_PORT: u16 = 4420;
