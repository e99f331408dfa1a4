//! The errors' `Display` texts: prose that says what was asked, what was possible and what
//! holds what, so that a log line alone tells the reader what to change.

use core::fmt::{Display, Formatter, Result};

use super::{
    Attr, DeviceStatus, Error, Fault, Feature, Holder, NotFound, Object, Op, Param, Queue,
    Resource, Unsupported,
};

impl Display for Error {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        match *self {
            Error::InvalidInput {
                param: Param::CqEntriesInUse,
                value,
                max,
            } => write!(
                f,
                "{}: {max} completion queue entries asked, but its queue pairs hold {value} \
                 of them; destroy queue pairs or ask for at least {value}",
                Op::ResizeCq
            ),
            Error::InvalidInput {
                param: Param::SrqCqRoom,
                value,
                max,
            } => write!(
                f,
                "{}: its shared receive queue's {value} receives may all complete on its \
                 receive completion queue, which has room for {max} more; create that \
                 completion queue larger, or the shared receive queue smaller",
                Op::CreateQp
            ),
            Error::InvalidInput {
                param: Param::SrqWrInUse,
                value,
                max,
            } => write!(
                f,
                "{}: {max} receives asked, but {value} are posted and not yet taken; \
                 ask for at least {value}, or resize once they have completed",
                Op::ModifySrq
            ),
            Error::InvalidInput {
                param: Param::GidTableBuffer,
                value,
                max,
            } => write!(
                f,
                "a GID table buffer of {value} entries is too small: the device has {max} \
                 valid entries"
            ),
            Error::InvalidInput {
                param: Param::Pool,
                value,
                ..
            } => write!(
                f,
                "buffer {value} is not of this queue pair's pool: the safe posts take buffers \
                 of the pool the queue pair was built with (`.pool(&pool)`, QpBuilder::pool); \
                 build it with one, or post that pool's buffers"
            ),
            Error::InvalidInput {
                param: Param::Grh,
                value,
                max,
            } => write!(
                f,
                "a GRH slot of {value} bytes: a UD receive's GRH slot is {max} bytes, the \
                 first {max} of its buffer"
            ),
            Error::InvalidInput { param, value, max } => {
                write!(f, "{param} of {value} asked, at most {max} possible")
            }
            Error::MissingAttribute { op, attr } => write!(f, "{op} needs {attr}"),
            Error::Resource(r) => write!(f, "{r}"),
            Error::Permission { op } => write!(f, "{op}: the device denied permission"),
            Error::Device { op, status } => write!(f, "{op} failed: {status}"),
            Error::Protocol { op, fault } => {
                write!(f, "{op}: the device's answer was not used: {fault}")
            }
            Error::Timeout { op } => write!(f, "{op}: the device did not answer in time"),
            Error::Unsupported(u) => write!(f, "unsupported: {u}"),
            Error::NotFound(n) => write!(f, "{n}"),
            Error::Busy { op: Op::PollCq } => write!(
                f,
                "{}: another thread is polling it; poll again",
                Op::PollCq
            ),
            Error::Busy { op } => write!(f, "{op}: the object is still in use"),
            Error::InUse { op, holder, count } => {
                write!(
                    f,
                    "{op}: still used by {count} {holder}; {}",
                    holder.remedy()
                )
            }
            Error::QueueFull {
                queue: Queue::Cq,
                free,
            } => write!(
                f,
                "completion queue full: room for {free} more completions (each request \
                 outstanding needs one until its completion is polled); nothing was posted: \
                 poll the completion queue, or create it larger"
            ),
            Error::QueueFull {
                queue: queue @ (Queue::Send | Queue::Recv),
                free,
            } => write!(
                f,
                "{queue} full: room for {free} more requests; nothing was posted: poll for \
                 completions, or build the queue pair deeper with `.caps(...)` \
                 (QpBuilder::caps); without it a queue has the default depth of {} requests \
                 (QpCaps::default())",
                crate::verbs::QpCaps::DEFAULT.max_send_wr
            ),
            Error::QueueFull { queue, free } => write!(
                f,
                "{queue} full: room for {free} more requests; nothing was posted: poll for \
                 completions, or create the queue deeper"
            ),
        }
    }
}

impl Holder {
    fn remedy(self) -> &'static str {
        match self {
            Holder::Qps => "destroy those queue pairs first",
            Holder::PdObjects => "destroy them first",
            Holder::McastGroups => "detach it from them first",
            Holder::UnackedEvents => "acknowledge them first (ack_events)",
            Holder::Windows => {
                "invalidate them (LOCAL_INV), bind them elsewhere or deallocate them first"
            }
        }
    }
}

impl Display for Holder {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.write_str(match self {
            Holder::Qps => "queue pair(s)",
            Holder::PdObjects => {
                "object(s) of the protection domain (queue pairs, shared \
                                  receive queues, memory regions)"
            }
            Holder::McastGroups => "multicast group(s)",
            Holder::UnackedEvents => "completion event(s) taken and not acknowledged",
            Holder::Windows => "memory window(s) or fast-registered region(s) over it",
        })
    }
}

impl Display for Queue {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.write_str(match self {
            Queue::Send => "send queue",
            Queue::Recv => "receive queue",
            Queue::Srq => "shared receive queue",
            Queue::Cq => "completion queue",
        })
    }
}

impl Display for Param {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.write_str(match self {
            Param::CqEntries => "completion queue entries",
            Param::CqEntriesInUse => "completion queue entries in use",
            Param::SrqCqRoom => "completion queue room for a shared receive queue",
            Param::SrqWrInUse => "shared receive queue requests outstanding",
            Param::Port => "port number",
            Param::PkeyIndex => "P_Key index",
            Param::GidIndex => "GID index",
            Param::MaxSendWr => "max_send_wr",
            Param::MaxRecvWr => "max_recv_wr",
            Param::MaxSendSge => "max_send_sge",
            Param::MaxRecvSge => "max_recv_sge",
            Param::MaxInlineData => "max_inline_data",
            Param::SendQueuePages => "send queue pages",
            Param::RecvQueuePages => "receive queue pages",
            Param::SrqMaxWr => "shared receive queue max_wr",
            Param::SrqMaxSge => "shared receive queue max_sge",
            Param::SrqPages => "shared receive queue pages",
            Param::SrqLimit => "shared receive queue srq_limit",
            Param::MaxRdAtomic => "outstanding RDMA reads/atomics",
            Param::PathMtu => "path MTU (ibv_mtu)",
            Param::QpNumber => "queue pair number",
            Param::Psn => "packet sequence number",
            Param::FlowLabel => "flow label",
            Param::NumSge => "scatter/gather entries in a request",
            Param::BufferRange => "buffer bytes",
            Param::MrLength => "memory region length",
            Param::MwType => "memory window type (bind a type 1 window with `bind_mw` on the queue pair, a type 2 window in a send batch)",
            Param::Pool => "buffer pool",
            Param::PoolBuffers => "buffers in a pool",
            Param::BufferSize => "bytes per buffer",
            Param::GidTableBuffer => "GID table buffer entries",
            Param::CompVector => "completion vector",
            Param::Grh => "GRH bytes",
            Param::McastGid => "multicast group address (IPv4 class D, as a number)",
        })
    }
}

impl Display for Attr {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        match self {
            Attr::Address => f.write_str("a destination address (address vector)"),
            Attr::DestQpn => f.write_str("a destination queue pair number"),
            Attr::Qkey => f.write_str("a Q_Key"),
            Attr::SourceGid => f.write_str("a GID bound in port 1's table; bind one first"),
            Attr::BoundGid { index } => write!(
                f,
                "a GID bound at index {index} of port 1's table (the path's sgid_index); \
                 bind one there or name a bound index"
            ),
            Attr::UdDest => f.write_str("a destination (address, remote QPN and Q_Key)"),
            Attr::LocalWrite => f.write_str(
                "local write access: a region remote peers may write or use atomically \
                 must be locally writable",
            ),
            Attr::InitiatorDepth => f.write_str(
                "an initiator depth of at least 1 for an RDMA READ or atomic: this queue pair's \
                 max_rd_atomic (set at RTS, as the device applied it) is 0; set \
                 ConnectedRts::max_rd_atomic or use the handshake",
            ),
            Attr::Grh => f.write_str(
                "a GRH: a UD receive's completion with the GRH flag, its buffer's first 40 \
                 bytes holding RoCEv2's IPv4 header or an IPv6 GRH of RoCE",
            ),
        }
    }
}

impl Display for Resource {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        match self {
            Resource::Dma { pages } => {
                write!(
                    f,
                    "out of DMA memory: the HAL had no run of {pages} free pages"
                )
            }
            Resource::Objects {
                object: Object::CqEventSlot,
                limit,
            } => write!(
                f,
                "out of event slots: at most {limit} completion queues take part in events \
                 (arming, channels); destroy one of them first"
            ),
            Resource::Objects { object, limit } => write!(
                f,
                "out of {object}s: the device holds at most {limit}; destroy one first"
            ),
            Resource::Device { op, errno } => {
                write!(f, "{op}: the device is out of resources (errno {errno})")
            }
        }
    }
}

impl Display for Object {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.write_str(match self {
            Object::Pd => "protection domain",
            Object::Cq => "completion queue",
            Object::Qp => "queue pair",
            Object::Srq => "shared receive queue",
            Object::Mr => "memory region",
            Object::Gid => "GID table entrie",
            Object::CqEventSlot => "completion queue event slot",
            Object::CompletionChannel => "completion channel",
            Object::Ipv6Path => "IPv6 path",
            Object::McastGroup => "multicast group",
        })
    }
}

impl Display for Op {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.write_str(match self {
            Op::Probe => "probing the device",
            Op::LoadSharedRegion => "loading the device's shared region",
            Op::Activate => "activating the device",
            Op::QueryPort => "querying a port",
            Op::QueryPkey => "querying a P_Key",
            Op::CreatePd => "creating a protection domain",
            Op::DestroyPd => "destroying a protection domain",
            Op::CreateCq => "creating a completion queue",
            Op::DestroyCq => "destroying a completion queue",
            Op::CreateQp => "creating a queue pair",
            Op::ModifyQp => "modifying a queue pair",
            Op::QueryQp => "querying a queue pair",
            Op::DestroyQp => "destroying a queue pair",
            Op::AttachMcast => "attaching a queue pair to a multicast group",
            Op::CreateSrq => "creating a shared receive queue",
            Op::DestroySrq => "destroying a shared receive queue",
            Op::CreateMr => "registering a memory region",
            Op::DestroyMr => "deregistering a memory region",
            Op::AllocMw => "allocating a memory window or a fast-registration region",
            Op::BindGid => "binding a GID",
            Op::UnbindGid => "unbinding a GID",
            Op::PostSend => "posting send requests",
            Op::PostRecv => "posting receive requests",
            Op::PollCq => "polling a completion queue",
            Op::ResizeCq => "resizing a completion queue",
            Op::ModifySrq => "modifying a shared receive queue",
            Op::QuerySrq => "querying a shared receive queue",
            Op::QueryGid => "reading a GID table entry",
            Op::ResolveAddress => "resolving a peer's link address",
            Op::CreateAh => "making an address handle from a completion",
        })
    }
}

impl Display for DeviceStatus {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        match self {
            DeviceStatus::Errno(e) => write!(f, "the device answered errno {e}"),
            DeviceStatus::Rejected => f.write_str(
                "the device rejected the command (no shared region, or an opcode it lacks)",
            ),
            DeviceStatus::NotActive(r) => {
                write!(f, "the device did not activate (error register {r:#x})")
            }
        }
    }
}

impl Display for Fault {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        match self {
            Fault::Ack { expected, found } => write!(
                f,
                "it acknowledged command {found:#x} where {expected:#x} was expected"
            ),
            Fault::Cookie => f.write_str("it did not echo the request's cookie"),
            Fault::StatusMismatch { register, header } => write!(
                f,
                "its error register ({register:#x}) and response header ({header:#x}) disagree"
            ),
            Fault::Value { field, value } => write!(f, "its {field} of {value} cannot be right"),
        }
    }
}

impl Display for Unsupported {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        match self {
            Unsupported::DeviceVersion(v) => {
                write!(
                    f,
                    "the device speaks interface version {v}, which the driver does not"
                )
            }
            Unsupported::TransportMode(m) => {
                write!(f, "the device's transport mode {m} is not RoCE")
            }
            Unsupported::GidTypes(t) => {
                write!(f, "the device's GID types {t:#x} do not fit its version")
            }
            Unsupported::BarType { bar } => {
                write!(f, "BAR {bar} has a reserved or unexpected type")
            }
            Unsupported::QpType(t) => write!(f, "the device has no {t:?} queue pairs"),
            Unsupported::Feature(x) => write!(f, "{x}"),
        }
    }
}

impl Display for Feature {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.write_str(match self {
            Feature::CreateFlags => "queue pair create_flags",
            Feature::SourceQpn => "a queue pair's source_qpn",
            Feature::Rss => "receive-side scaling (rx_hash_conf)",
            Feature::Tso => "TCP segmentation offload (max_tso_header)",
            Feature::Xrc => "XRC domains",
            Feature::InlineData => {
                "inline data beyond the queue pair's max_inline_data (or on a READ/atomic)"
            }
            Feature::SrqOnQpType => {
                "this receive on a queue pair with a shared receive queue (post to the SRQ)"
            }
            Feature::Atomics => "atomic operations on this device",
            Feature::Multicast => "multicast on this device",
            Feature::ResizeCq => "resizing completion queues on this device",
            Feature::OpcodeForQpType => "this operation on this queue pair type",
            Feature::NotExecutedByDevice => {
                "this operation: the device would run it as a plain SEND"
            }
            Feature::ReinitAfterReset => {
                "initializing again a queue pair reset from RTR/RTS on this device: destroy \
                 it and create a new one"
            }
            Feature::UserMemory => "registering memory the HAL cannot translate",
            Feature::Interrupts => "interrupts: the device has no usable MSI-X vector",
            Feature::SrqModify => "modifying a shared receive queue on this device",
            Feature::Ipv6 => {
                "an IPv6 GID where the software device takes none: UD address handles, mixed IPv4 and IPv6 GIDs, loopback over IPv6 (RC and UC connect by IPv6 GIDs)"
            }
            Feature::ReregMr => "changing a memory region in place on this device",
            Feature::MemoryWindows => {
                "memory windows on this device: grant access through a region's own rkey"
            }
            Feature::FastRegistration => {
                "fast registration on this device: register the memory with `register`"
            }
            Feature::Invalidation => {
                "invalidating keys by work request on this device: deregister the region \
                 instead"
            }
        })
    }
}

impl Display for NotFound {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        match self {
            NotFound::Device => f.write_str("no supported RDMA device on the bus"),
            NotFound::PairedFunction => f.write_str(
                "the network function the RDMA function pairs with (function 0) is absent",
            ),
            NotFound::Bar { bar } => write!(f, "BAR {bar} is absent or too small"),
            NotFound::GidEntry { port, index } => {
                write!(f, "no GID is bound at index {index} of port {port}")
            }
            NotFound::McastMember { gid } => write!(
                f,
                "the queue pair is not attached to the multicast group {:02x?}",
                gid.0
            ),
            NotFound::Gid { port, gid } => {
                let g = gid.0;
                match gid.ipv4() {
                    Some([a, b, c, d]) => write!(
                        f,
                        "port {port}'s GID table has no GID of this type for {a}.{b}.{c}.{d}"
                    ),
                    None => write!(
                        f,
                        "port {port}'s GID table has no GID of this type for \
                         {:02x}{:02x}:{:02x}{:02x}:…:{:02x}{:02x}",
                        g[0], g[1], g[2], g[3], g[14], g[15]
                    ),
                }
            }
            NotFound::Pkey { port, pkey } => {
                write!(f, "port {port}'s P_Key table has no P_Key {pkey:#06x}")
            }
        }
    }
}
