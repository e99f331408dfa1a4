//! The storage seam of the appliance: what a namespace reads and writes, as the NVMe-oF
//! library defines it.

pub use bareverbs_nvmf::{BlockDevice, BlockError};
