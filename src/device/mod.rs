//! Device-specific providers. Each submodule holds every hardware fact of one device.

pub mod pvrdma;

pub mod rxe;
