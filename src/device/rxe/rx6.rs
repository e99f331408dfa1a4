//! Received IPv6 frames past the port's first look: those the port leaves to the IP stack
//! are looked at for IPv6 (neighbour discovery, RoCEv2 over IPv6), and RoCEv2 over IPv6 on a
//! held IPv6 path (a connected queue pair's, or an address handle's) is made the same packet
//! over IPv4 and dispatched (`docs/roce-v2.md` §5.1). Out of line: RoCE frames over IPv4
//! never come here. Also the IPv6 paths of address handles, taken and given back.

use bareverbs_hal::{Clock, Hal, Link};

use super::{Core, FRAME, Rxe, port, wire};
use crate::error::{Error, Object, Resource, Result};
use crate::verbs::AddressVector;

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    /// A use of the IPv6 path of an address handle to the IPv6 GID of `av` (from its source
    /// GID, with its flow label), checked as a connected QP's ([`super::qp::ipv6_path`]):
    /// the address by which the transport names the path.
    pub(super) fn hold_ah_path6(&self, av: &AddressVector) -> Result<[u8; 4]> {
        let mut core = self.core.lock();
        let port = &mut core.tables().port;
        let (src, dst) = super::qp::ipv6_path(port, av)?;
        port.hold_path6(src, dst, av.flow_label)
            .ok_or(Error::Resource(Resource::Objects {
                object: Object::Ipv6Path,
                limit: port::PATHS6 as u32,
            }))
    }

    /// Gives back the use of an address handle's IPv6 path `alias` names (nothing for an
    /// IPv4 address).
    pub(super) fn release_ah_path6(&self, alias: [u8; 4]) {
        if port::alias_path(alias).is_some() {
            self.core.lock().tables().port.release_path6(alias);
        }
    }

    /// The received frame of `n` bytes the port left to the IP stack: to the stack, unless
    /// it is IPv6 the port takes itself ([`Port::take_ipv6`]: neighbour discovery answered,
    /// RoCEv2 over IPv6 to the transport or dropped). Out of line: RoCE frames over IPv4 do
    /// not come here.
    #[inline(never)]
    pub(super) fn for_stack(&self, core: &mut Core<L>, n: usize, now: u64) {
        // SAFETY: the receive buffer is FRAME bytes of the device block, reached only
        // through the locked core (`core` is borrowed mutably here).
        let rx = unsafe { core::slice::from_raw_parts_mut(core.rx.as_ptr(), FRAME) };
        let Some(frame) = rx.get(..n) else { return };
        let (link, t) = core.parts();
        match t.port.take_ipv6(link, frame, now) {
            None | Some(port::Ipv6Rx::Stack) => t.stack.push(frame),
            // RoCEv2 over IPv6 on a connected QP's path: carried on as IPv4.
            Some(port::Ipv6Rx::Path(path)) => {
                if let Some(f) = rx.get_mut(..n) {
                    self.take_ipv6(core, f, path, now);
                }
            }
            // A datagram from a peer without a held path: on a path of its own for the
            // time of its delivery (its GRH slot written from it), then given back.
            Some(port::Ipv6Rx::Transient(path)) => {
                if let Some(f) = rx.get_mut(..n) {
                    self.take_ipv6(core, f, path, now);
                }
                let port = &mut core.tables().port;
                port.release_path6(port.alias6(path));
            }
            Some(port::Ipv6Rx::Dropped(_)) => {}
        }
    }

    /// A RoCEv2 packet over IPv6 on the IPv6 path `path` (checked whole by the port): made
    /// the same packet over IPv4 in place, from the address by which the transport names the
    /// path to this interface's IPv4 address, and dispatched if it is RC or UC. One whose QP
    /// is locked elsewhere is lost (as on a wire: its sender retries); out of line, so that
    /// IPv4 frames do not pay for it.
    #[inline(never)]
    fn take_ipv6(&self, core: &mut Core<L>, f: &mut [u8], path: usize, now: u64) {
        let (ip, alias) = (core.tables().port.ip(), core.tables().port.alias6(path));
        let Some(m) = wire::ip6::ipv6_to_ipv4(f, alias, ip) else {
            return;
        };
        let Some(p) = f.get(..m).and_then(wire::packet::view_converted) else {
            return;
        };
        // RC and UC (opcodes 0x00–0x3F), and UD's SENDs to a UD QP or the GSI QP (the CM's
        // datagrams over IPv6): their GRH slot is made the IPv6 header again from the path
        // (the responder).
        let ud = matches!(
            p.opcode(),
            wire::bth::opcode::UD_SEND_ONLY | wire::bth::opcode::UD_SEND_ONLY_IMM
        );
        if p.opcode() >= 0x40 && !ud {
            core.tables().port.unhand();
            return;
        }
        if !self.dispatch(core, &p, now) {
            core.tables().port.unhand();
        }
    }
}
