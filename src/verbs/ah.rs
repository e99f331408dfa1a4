//! Address handles (`ibv_ah`): a UD destination prepared once and named by every send to it.

use super::{
    AddressVector, Context, Gid, GidType, ProtectionDomain, Provider, WcFlags, WorkCompletion,
};
use crate::error::{Attr, Error, Feature, NotFound, Op, Param, Result, Unsupported};

/// A prepared UD destination. It borrows its protection domain; dropping it gives back
/// what the device held for it ([`Provider::destroy_ah`]).
pub struct AddressHandle<'a, P: Provider> {
    raw: P::Ah,
    ctx: &'a Context<P>,
    _pd: core::marker::PhantomData<&'a P::Pd>,
}

impl<P: Provider> Drop for AddressHandle<'_, P> {
    fn drop(&mut self) {
        self.ctx.provider().destroy_ah(&self.raw);
    }
}

impl<'c, P: Provider> ProtectionDomain<'c, P> {
    /// Prepares an address handle for `av` (`ibv_create_ah`); the source GID index must name
    /// a GID of the port's table.
    pub fn create_ah(&self, av: &AddressVector) -> Result<AddressHandle<'_, P>> {
        if av.flow_label > 0xF_FFFF {
            return Err(Error::invalid(Param::FlowLabel, av.flow_label, 0xF_FFFFu32));
        }
        let raw = self.context().provider().create_ah(self.raw(), av)?;
        Ok(AddressHandle {
            raw,
            ctx: self.context(),
            _pd: core::marker::PhantomData,
        })
    }
}

impl<P: Provider> AddressHandle<'_, P> {
    /// The provider's object.
    pub fn raw(&self) -> &P::Ah {
        &self.raw
    }
}

/// Bytes of the GRH slot a UD receive starts with (`struct ibv_grh`).
pub const GRH_LEN: usize = 40;
/// Where a RoCEv2-over-IPv4 datagram's IPv4 header lies in the GRH slot: its last 20 bytes
/// (the first 20 are unspecified).
const IPV4_AT: usize = 20;
/// The IPv6 next header of RoCEv2 (UDP) and of RoCEv1 (the InfiniBand transport).
const NEXT_UDP: u8 = 17;
const NEXT_IB: u8 = 0x1b;

/// The IP version of the header in a GRH slot, as libibverbs tells it: IPv4 when its last
/// 20 bytes are an IPv4 header without options whose checksum holds, else IPv6 when the first
/// nibble says 6; `None` for neither.
fn grh_version(grh: &[u8; GRH_LEN]) -> Option<u8> {
    let ip = &grh[IPV4_AT..];
    if ip[0] == 0x45 && ipv4_checksum_ok(ip) {
        return Some(4);
    }
    (grh[0] >> 4 == 6).then_some(6)
}

/// Whether the 20-byte IPv4 header `h` sums to 0xFFFF (its checksum field included).
fn ipv4_checksum_ok(h: &[u8]) -> bool {
    let mut sum = 0u32;
    for w in h.chunks_exact(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum == 0xFFFF
}

fn no_grh() -> Error {
    Error::MissingAttribute {
        op: Op::CreateAh,
        attr: Attr::Grh,
    }
}

impl<P: Provider> Context<P> {
    /// The address vector that answers a UD datagram (`ibv_init_ah_from_wc`): from its
    /// completion `wc` and the GRH slot `grh` its receive buffer starts with (the first
    /// [`GRH_LEN`] bytes), the sender's GID as the destination, and as the source the index
    /// of the GID of port `port`'s table the datagram was sent to.
    ///
    /// RoCEv2 over IPv4 (the slot's last 20 bytes an IPv4 header whose checksum holds): the
    /// sender's IPv4-mapped GID from its source address, the local GID from its destination
    /// address (a RoCEv2 GID), hop limit its TTL, traffic class its TOS, flow label 0. IPv6
    /// (a GRH proper): the GRH's source GID, the local GID its destination (of RoCEv2 type
    /// for a UDP next header, RoCEv1 for the InfiniBand one), hop limit and traffic class
    /// from it, with its flow label. Service level 0 (RoCE carries none in the datagram).
    ///
    /// # Errors
    ///
    /// - [`Error::MissingAttribute`] with [`Attr::Grh`]: `wc` has no
    ///   [`WcFlags::GRH`], or the slot holds neither header (or an IPv6 next header of
    ///   neither RoCE);
    /// - [`Error::InvalidInput`] for [`Param::Grh`]: `grh` shorter than [`GRH_LEN`];
    /// - [`Error::Unsupported`] ([`Feature::Multicast`])
    ///   when the datagram was sent to a multicast address (no GID of the table answers
    ///   for it);
    /// - [`Error::NotFound`] ([`NotFound::Gid`]) when the
    ///   port's table has no GID of that type for the address it was sent to; a port out of
    ///   range as [`query_gid`](Self::query_gid).
    ///
    /// # Example
    ///
    /// A UD echo on the software RoCE device (in loopback): the server takes a datagram and
    /// answers its sender through an address handle made from the completion and the GRH.
    ///
    /// ```
    /// # include!("../doctests.rs");
    /// # fn main() -> bareverbs::Result<()> {
    /// use bareverbs::verbs::*;
    /// let (ctx, _clock) = rxe_loopback()?;
    /// let pd = ctx.alloc_pd()?;
    /// // One CQ each: a QP's own poll stops at another QP's completion.
    /// let (client_cq, server_cq) = (ctx.create_cq(64)?, ctx.create_cq(64)?);
    /// // UD receives start with the 40-byte GRH slot: buffers of 40 + 64 bytes.
    /// let pool = pd.buffer_pool(8, (GRH_LEN + 64) as u32)?;
    /// let ud = |cq, qkey| -> bareverbs::Result<_> {
    ///     Ok(pd.qp_builder(cq, cq).pool(&pool).build::<Ud>()?.ready(qkey, 0)?)
    /// };
    /// let (mut client, mut server) = (ud(&client_cq, 0x1111)?, ud(&server_cq, 0x2222)?);
    /// client.post_recv(1, pool.alloc().expect("a free buffer"))?;
    /// server.post_recv(2, pool.alloc().expect("a free buffer"))?;
    ///
    /// // The client knows the server's address; the server does not know the client's.
    /// let to_server = pd.create_ah(&AddressVector::new(Gid::from_ipv4([10, 0, 0, 1]), 1))?;
    /// let mut ping = pool.alloc().expect("a free buffer");
    /// ping.set_len(4)?;
    /// ping.as_mut_slice().copy_from_slice(b"ping");
    /// client.post_send_to(3, ping, (&to_server, server.qp_num(), 0x2222))?;
    ///
    /// let got = (0..10_000).find_map(|_| server.poll_one().transpose()).expect("a datagram")?;
    /// let buf = got.buf.expect("the receive's buffer");
    /// assert_eq!(&buf.as_slice()[GRH_LEN..], b"ping");
    /// // The answer's address: from the completion and the buffer's GRH slot.
    /// let grh = &buf.as_slice()[..GRH_LEN];
    /// let back = ctx.init_ah_from_wc(1, &got.wc, grh)?;
    /// assert_eq!(back.dgid, Gid::from_ipv4([10, 0, 0, 1]));
    /// let to_client = pd.create_ah(&back)?; // or pd.create_ah_from_wc(1, &got.wc, grh)
    /// drop(buf);
    /// let mut pong = pool.alloc().expect("a free buffer");
    /// pong.set_len(4)?;
    /// pong.as_mut_slice().copy_from_slice(b"pong");
    /// server.post_send_to(4, pong, (&to_client, got.wc.src_qp, 0x1111))?;
    ///
    /// let answer = (0..10_000)
    ///     .filter_map(|_| client.poll_one().transpose())
    ///     .find(|c| c.as_ref().map_or(true, |c| c.wc.opcode == WcOpcode::Recv))
    ///     .expect("the answer")?;
    /// assert_eq!(&answer.buf.expect("its buffer").as_slice()[GRH_LEN..], b"pong");
    /// # Ok(()) }
    /// ```
    pub fn init_ah_from_wc(
        &self,
        port: u8,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<AddressVector> {
        if !wc.flags.contains(WcFlags::GRH) {
            return Err(no_grh());
        }
        let Some(grh) = grh.first_chunk::<GRH_LEN>() else {
            return Err(Error::invalid(Param::Grh, grh.len() as u64, GRH_LEN as u64));
        };
        let (dgid, local, gid_type, hop_limit, traffic_class, flow_label) = match grh_version(grh) {
            Some(4) => {
                let ip = &grh[IPV4_AT..];
                let (src, dst) = (
                    [ip[12], ip[13], ip[14], ip[15]],
                    [ip[16], ip[17], ip[18], ip[19]],
                );
                // Class D (224.0.0.0/4): multicast, which no GID of the table is.
                if dst[0] >> 4 == 0xE {
                    return Err(Error::Unsupported(Unsupported::Feature(Feature::Multicast)));
                }
                let (ttl, tos) = (ip[8], ip[1]);
                (
                    Gid::from_ipv4(src),
                    Gid::from_ipv4(dst),
                    GidType::RoceV2,
                    ttl,
                    tos,
                    0,
                )
            }
            Some(_) => {
                let mut sgid = [0u8; 16];
                sgid.copy_from_slice(&grh[8..24]);
                let mut dgid = [0u8; 16];
                dgid.copy_from_slice(&grh[24..40]);
                if dgid[0] == 0xFF {
                    return Err(Error::Unsupported(Unsupported::Feature(Feature::Multicast)));
                }
                let gid_type = match grh[6] {
                    NEXT_UDP => GidType::RoceV2,
                    NEXT_IB => GidType::RoceV1,
                    _ => return Err(no_grh()),
                };
                let vtf = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
                let tclass = ((vtf >> 20) & 0xFF) as u8;
                (
                    Gid(sgid),
                    Gid(dgid),
                    gid_type,
                    grh[7],
                    tclass,
                    vtf & 0xF_FFFF,
                )
            }
            None => return Err(no_grh()),
        };
        let index = self
            .gid_table(port)?
            .find(|&(i, g)| g == local && self.provider.gid_type(port, i) == gid_type)
            .map(|(i, _)| i)
            .and_then(|i| u8::try_from(i).ok())
            .ok_or(Error::NotFound(NotFound::Gid { port, gid: local }))?;
        Ok(AddressVector {
            dgid,
            sgid_index: index,
            hop_limit,
            traffic_class,
            flow_label,
            sl: 0,
        })
    }
}

impl<'c, P: Provider> ProtectionDomain<'c, P> {
    /// An address handle that answers a UD datagram (`ibv_create_ah_from_wc`):
    /// [`Context::init_ah_from_wc`] then [`create_ah`](Self::create_ah).
    ///
    /// # Errors
    ///
    /// As both.
    pub fn create_ah_from_wc(
        &self,
        port: u8,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<AddressHandle<'_, P>> {
        let av = self.context().init_ah_from_wc(port, wc, grh)?;
        self.create_ah(&av)
    }
}
