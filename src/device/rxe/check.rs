//! The checks a received RoCE packet passes before its queue pair's transport sees it, as
//! Linux's rxe makes them on receive (`check_type_state` and `check_addr` in rxe_recv.c): a
//! packet that fails one is dropped silently — no NAK, no state change, nothing learnt — for
//! it is not the peer's (`docs/security.md`).
//!
//! - The opcode's transport is the queue pair's (an RC opcode to an RC QP, UC to UC, UD to
//!   UD), and the queue pair can receive (RTR or RTS).
//! - A connected queue pair (RC, UC) takes packets from its peer only: the source IPv4
//!   address is the one in the address vector's destination GID, and once the peer's MAC is
//!   known (from ARP), the source MAC is that MAC. The destination address was checked by
//!   the port. A UD queue pair (and the GSI QP, QP1) takes datagrams from anyone; its Q_Key
//!   is checked by the responder.

use super::qp_state::QpCore;
use super::wire::eth::same_mac;
use super::wire::packet::View;
use crate::verbs::{QpState, QpType};

/// Whether `p` may reach the transport of `q`: the QP receives, the opcode's transport (its
/// top three bits) is the QP's, and a connected QP's packet comes from its peer's address
/// (and MAC, once known). `src` is the packet's source address as the device names it
/// (`p.src_ip()`, or over IPv6 the QP's own path when the packet came on another path
/// between the same two addresses: [`Port::same_peer6`](super::port::Port::same_peer6)).
pub(crate) fn admit(q: &QpCore, p: &View<'_>, src: [u8; 4]) -> bool {
    if !matches!(q.state, QpState::Rtr | QpState::Rts) {
        return false;
    }
    // The transport (the opcode's top three bits) each QP type takes, by the type's
    // discriminant (none: 8, no opcode's); one load, no jump table.
    const TRANSPORT: [u8; 7] = {
        let mut t = [8; 7];
        t[QpType::Rc as usize] = 0;
        t[QpType::Uc as usize] = 1;
        // The GSI QP (QP1) is a datagram QP: its Q_Key is checked by the responder.
        t[QpType::Ud as usize] = 3;
        t[QpType::Gsi as usize] = 3;
        t
    };
    let want = TRANSPORT.get(q.qp_type as usize).copied().unwrap_or(8);
    p.opcode() >> 5 == want
        && (!matches!(q.qp_type, QpType::Rc | QpType::Uc) || from_peer(q, p, src))
}

/// A connected QP's packet comes from its peer's address (and MAC, once known).
#[inline(always)]
fn from_peer(q: &QpCore, p: &View<'_>, src: [u8; 4]) -> bool {
    // Compared where the MAC lies in the QP (not the `Option` copied out first).
    src == q.peer_ip
        && match &q.peer_mac {
            Some(m) => same_mac(m, &p.src_mac()),
            None => true,
        }
}
