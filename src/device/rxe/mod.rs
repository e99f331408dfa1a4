//! Software RoCEv2 over a plain Ethernet NIC (a [`Link`](crate::hal::Link)), interoperating
//! with Linux's `rdma_rxe`: what `rdma_rxe` is for Linux, without an OS.
//!
//! Built in layers, each with every fact of its own (`shared/roce-v2.md`):
//! - [`wire`]: the frames — Ethernet, ARP, IPv4, UDP 4791, the base transport header and its
//!   extended headers, the ICRC — parsed with every length checked and built byte for byte as
//!   Linux builds them;
//! - [`port`]: the interface — its addresses and GIDs, the neighbour cache (ARP answered and
//!   resolved), and the demultiplexing of received frames between RoCE and the IP stack;
//! - [`seq`]: PSN arithmetic and how a message is cut into packets at a path MTU.

pub mod port;
pub mod seq;
pub mod wire;
