//! The lab peers: what the bareverbs kernel does in the QEMU labs, where it plays the other side
//! of unmodified Linux programs, and nothing else needs:
//!
//! - [`peer`]: on a PVRDMA (the nested lab, `qemu/lab/`), Debian's `ibv_rc_pingpong` /
//!   `ibv_ud_pingpong`, their connection data carried over the serial console;
//! - [`roce_peer`]: on the software RoCE device (the RoCE lab, `qemu/roce/lab.sh`), the
//!   pingpong programs and perftest's `ib_write_bw` / `ib_read_bw` / `ib_atomic_bw` with their
//!   own TCP exchange ([`tcp`], over smoltcp), and the rdma_cm programs (`rping`, `cmatose`,
//!   `udaddy`, perftest with `-R`; [`cm_peer`]) through the connection manager.
//!
//! The binary (`src/main.rs`, booted by the labs) runs the example kernel's demo first
//! (`bareverbs-unikernel`), then the peer mode its command line names, on
//! `bareverbs-platform`'s machine.
#![no_std]
#![deny(
    unsafe_op_in_unsafe_fn,
    missing_docs,
    clippy::undocumented_unsafe_blocks
)]

pub mod cm_peer;
pub mod gids;
pub mod peer;
pub mod qperf_peer;
pub mod roce_peer;
/// The TCP exchange with the unmodified Linux test programs (pingpong, perftest), over smoltcp.
pub mod tcp;

pub use bareverbs_platform::{DisplayGid, Failure, Step};

impl peer::Line for bareverbs_platform::console::Serial {
    fn try_get(&mut self) -> Option<u8> {
        bareverbs_platform::console::try_get()
    }
}
