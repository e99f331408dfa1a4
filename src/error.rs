//! The one error type of the crate: `Copy`, no allocation, with enough detail to act on.

mod handback;
mod text;

// Every `Result` of the crate carries an `Error`: kept small (see `Fault::Value`).
const _: () = assert!(core::mem::size_of::<Error>() <= 32);

/// `Result` with [`Error`] as the default error.
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// Everything that can go wrong, by class (after the ibverbs seed crate) with the detail that
/// lets a caller act: which parameter and which limit, which operation and which status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A parameter is outside what the device (or the driver's fixed capacity) accepts.
    /// Nothing was sent to the device.
    InvalidInput {
        /// The parameter.
        param: Param,
        /// The value given (after the documented rounding, if any).
        value: u64,
        /// The largest value accepted.
        max: u64,
    },
    /// A required attribute for an operation was not given.
    MissingAttribute {
        /// The operation.
        op: Op,
        /// The attribute.
        attr: Attr,
    },
    /// A resource ran out.
    Resource(Resource),
    /// The device refused the operation for lack of permission (EPERM).
    Permission {
        /// The operation.
        op: Op,
    },
    /// The device failed an operation.
    Device {
        /// The operation.
        op: Op,
        /// What the device reported.
        status: DeviceStatus,
    },
    /// The device answered with something that cannot be right (garbage): the answer was not
    /// used.
    Protocol {
        /// The operation.
        op: Op,
        /// What was wrong with the answer.
        fault: Fault,
    },
    /// The device did not answer within the poll bound.
    Timeout {
        /// The operation that was waiting.
        op: Op,
    },
    /// The device or driver does not support what was asked.
    Unsupported(Unsupported),
    /// Something looked for is absent.
    NotFound(NotFound),
    /// The object is in use (for example still attached to a multicast group).
    Busy {
        /// The operation.
        op: Op,
    },
    /// The object is still used by others: `count` of `holder` (destroy them first).
    InUse {
        /// The operation.
        op: Op,
        /// What holds the object.
        holder: Holder,
        /// How many of them.
        count: u32,
    },
    /// A queue has no room for the whole batch: nothing was posted.
    QueueFull {
        /// Which queue.
        queue: Queue,
        /// How many entries it has free.
        free: u32,
    },
}

/// What holds an object, in [`Error::InUse`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Holder {
    /// Queue pairs (a completion queue's or a shared receive queue's users).
    Qps,
    /// The objects created in a protection domain (queue pairs, shared receive queues,
    /// memory regions).
    PdObjects,
    /// Multicast groups a queue pair is attached to.
    McastGroups,
    /// Completion events taken from a completion queue's channel and not yet acknowledged
    /// (`ibv_ack_cq_events`).
    UnackedEvents,
    /// Memory windows bound to a memory region, and fast-registered regions mapping its
    /// memory: they keep remote access to its bytes open.
    Windows,
}

/// A queue named by [`Error::QueueFull`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    /// A QP's send queue (ring slots, or the safe path's buffer slots).
    Send,
    /// A QP's receive queue.
    Recv,
    /// A shared receive queue.
    Srq,
    /// A completion queue that would overflow (the device drops CQEs silently when full).
    Cq,
}

/// The class of an [`Error`], for callers that only branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// [`Error::InvalidInput`] or [`Error::MissingAttribute`].
    InvalidInput,
    /// [`Error::Resource`].
    Resource,
    /// [`Error::Permission`].
    Permission,
    /// [`Error::Device`] or [`Error::Protocol`].
    Device,
    /// [`Error::Timeout`].
    Timeout,
    /// [`Error::Unsupported`].
    Unsupported,
    /// [`Error::NotFound`].
    NotFound,
    /// [`Error::Busy`] or [`Error::InUse`].
    Busy,
}

impl Error {
    /// The class of the error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidInput { .. } | Error::MissingAttribute { .. } => ErrorKind::InvalidInput,
            Error::Resource(_) => ErrorKind::Resource,
            Error::Permission { .. } => ErrorKind::Permission,
            Error::Device { .. } | Error::Protocol { .. } => ErrorKind::Device,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::Busy { .. } | Error::InUse { .. } => ErrorKind::Busy,
            Error::QueueFull { .. } => ErrorKind::Resource,
        }
    }

    /// An [`Error::InvalidInput`].
    pub(crate) fn invalid(param: Param, value: impl Into<u64>, max: impl Into<u64>) -> Self {
        Error::InvalidInput {
            param,
            value: value.into(),
            max: max.into(),
        }
    }

    /// An [`Error::InUse`]: `count` of `holder` still use the object `op` would destroy.
    pub(crate) fn in_use(op: Op, holder: Holder, count: u32) -> Self {
        Error::InUse { op, holder, count }
    }

    /// An [`Error::Protocol`]: the device answered `value` in `field`, which cannot be right.
    pub(crate) fn bad_value(op: Op, field: &'static &'static str, value: impl Into<u64>) -> Self {
        let value = value.into();
        Error::Protocol {
            op,
            fault: Fault::Value { field, value },
        }
    }

    /// The error for a device's negative-errno status on `op`.
    pub(crate) fn from_errno(op: Op, errno: u32) -> Self {
        match errno {
            EPERM => Error::Permission { op },
            ENOMEM | EAGAIN | ENOSPC => Error::Resource(Resource::Device { op, errno }),
            EBUSY => Error::Busy { op },
            _ => Error::Device {
                op,
                status: DeviceStatus::Errno(errno),
            },
        }
    }
}

/// Logs the warning `bareverbs: {before}{e}{after}` (the driver keeps or leaks something on
/// purpose): compiled once, out of the callers' way.
#[cold]
#[inline(never)]
pub(crate) fn warn(before: &'static str, e: &Error, after: &'static str) {
    log::warn!("bareverbs: {before}{e}{after}");
}

/// Logs the warning `bareverbs: {what}`, out of the callers' way.
#[cold]
#[inline(never)]
pub(crate) fn warn_msg(what: &'static str) {
    log::warn!("bareverbs: {what}");
}

/// errno values a device reports (Linux numbering).
pub(crate) const EPERM: u32 = 1;
pub(crate) const EAGAIN: u32 = 11;
pub(crate) const ENOMEM: u32 = 12;
pub(crate) const EBUSY: u32 = 16;
pub(crate) const ENOSPC: u32 = 28;

/// A parameter named by [`Error::InvalidInput`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Param {
    /// Completion queue entries.
    CqEntries,
    /// The CQEs a completion queue must keep room for (reserved by the work queues of its
    /// queue pairs, living or leaked): a resize below them is refused, with `value` the CQEs
    /// in use and `max` the size asked.
    CqEntriesInUse,
    /// The room a shared receive queue's depth needs on a queue pair's receive completion
    /// queue (reserved once per SRQ and CQ, since any of its receives may complete there):
    /// `value` entries needed, `max` free.
    SrqCqRoom,
    /// The receives posted to a shared receive queue and not yet completed: a resize below
    /// them is refused, with `value` the receives outstanding and `max` the size asked.
    SrqWrInUse,
    /// Port number.
    Port,
    /// P_Key table index.
    PkeyIndex,
    /// GID table index.
    GidIndex,
    /// `max_send_wr`.
    MaxSendWr,
    /// `max_recv_wr`.
    MaxRecvWr,
    /// `max_send_sge`.
    MaxSendSge,
    /// `max_recv_sge`.
    MaxRecvSge,
    /// `max_inline_data`.
    MaxInlineData,
    /// Send queue size in pages (the device's per-queue page limit).
    SendQueuePages,
    /// Receive queue size in pages (the device's per-queue page limit).
    RecvQueuePages,
    /// Shared receive queue `max_wr`.
    SrqMaxWr,
    /// Shared receive queue `max_sge`.
    SrqMaxSge,
    /// Shared receive queue size in pages.
    SrqPages,
    /// Shared receive queue limit (low watermark).
    SrqLimit,
    /// Maximum outstanding RDMA reads/atomics.
    MaxRdAtomic,
    /// Path MTU.
    PathMtu,
    /// A queue pair number (24 bits).
    QpNumber,
    /// A packet sequence number (24 bits).
    Psn,
    /// An IPv6 flow label (20 bits).
    FlowLabel,
    /// Scatter/gather entries in one work request.
    NumSge,
    /// A buffer range beyond its memory region.
    BufferRange,
    /// Memory region length.
    MrLength,
    /// A memory window of the other type than the operation takes (`value` the window's
    /// type, 1 or 2; `max` the type the operation takes).
    MwType,
    /// A buffer of another pool than the queue pair's (or a QP without a pool).
    Pool,
    /// Buffers in a pool.
    PoolBuffers,
    /// Bytes per buffer of a pool.
    BufferSize,
    /// Entries of a buffer for a GID table (`ibv_query_gid_table`): `value` the buffer's
    /// length, `max` the valid entries it must hold (a shorter buffer is an error, not a
    /// truncation).
    GidTableBuffer,
    /// A completion vector (`comp_vector`), below the device's `num_comp_vectors`.
    CompVector,
    /// The GRH slot of a UD receive ([`Context::init_ah_from_wc`](crate::Context::init_ah_from_wc)):
    /// `value` the bytes given, `max` the 40 it takes.
    Grh,
    /// A multicast group's GID (`ibv_attach_mcast`): RoCEv2 over IPv4 names a group by the
    /// IPv4-mapped GID of a class D address; `value` the IPv4 address given (as a number),
    /// `max` the last class D one (239.255.255.255).
    McastGid,
}

/// An attribute named by [`Error::MissingAttribute`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Attr {
    /// The destination GID / address vector.
    Address,
    /// The destination QP number.
    DestQpn,
    /// The Q_Key.
    Qkey,
    /// A bound source GID: the device needs one to reach RTR.
    SourceGid,
    /// A GID bound at this index of port 1's table (the path's `sgid_index`): the device
    /// needs one to reach RTR.
    BoundGid {
        /// The GID table index the path names.
        index: u8,
    },
    /// A UD destination (address vector, remote QPN and Q_Key) on a UD send.
    UdDest,
    /// Local write access ([`AccessFlags::LOCAL_WRITE`](crate::verbs::AccessFlags)): a memory
    /// region that remote peers may write or use atomically must also be locally writable
    /// (the rule of Linux's ib_core, which answers EINVAL).
    LocalWrite,
    /// An initiator depth of at least 1 (`max_rd_atomic`, set at RTS, as the device applied
    /// it): a queue pair of depth 0 may have no RDMA READ or atomic outstanding, so one posted
    /// there is refused instead of stalling or being NAKed at the peer.
    InitiatorDepth,
    /// A GRH: a UD completion with [`WcFlags::GRH`](crate::verbs::WcFlags::GRH) and a slot
    /// holding a RoCE header (RoCEv2's IPv4 header, or an IPv6 GRH), to answer its sender.
    Grh,
}

/// What ran out, in an [`Error::Resource`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resource {
    /// The HAL had no run of free DMA pages this long.
    Dma {
        /// Pages requested.
        pages: usize,
    },
    /// The device's table for this kind of object is full (counted by the driver: the device is
    /// not asked).
    Objects {
        /// Which table.
        object: Object,
        /// Its capacity.
        limit: u32,
    },
    /// The device reported a lack of resources (ENOMEM, EAGAIN, ENOSPC).
    Device {
        /// The operation.
        op: Op,
        /// The errno the device reported.
        errno: u32,
    },
}

/// A kind of device object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Object {
    /// Protection domain.
    Pd,
    /// Completion queue.
    Cq,
    /// Queue pair.
    Qp,
    /// Shared receive queue.
    Srq,
    /// Memory region.
    Mr,
    /// GID table entry.
    Gid,
    /// A completion queue's place in the driver's event state (arming, channels, futures):
    /// a fixed number of CQs can take part in events.
    CqEventSlot,
    /// A completion channel.
    CompletionChannel,
    /// An IPv6 path of the software device's connected queue pairs (its source and
    /// destination addresses and flow label): a fixed number are held at once.
    Ipv6Path,
    /// A multicast group the software device's queue pairs are attached to.
    McastGroup,
}

/// An operation, as named in errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// PCI probe and BAR setup.
    Probe,
    /// Handing the device its shared region and reading its capabilities.
    LoadSharedRegion,
    /// Activating the device.
    Activate,
    /// Querying a port.
    QueryPort,
    /// Querying a P_Key.
    QueryPkey,
    /// Creating a protection domain.
    CreatePd,
    /// Destroying a protection domain.
    DestroyPd,
    /// Creating a completion queue.
    CreateCq,
    /// Destroying a completion queue.
    DestroyCq,
    /// Creating a queue pair.
    CreateQp,
    /// Modifying a queue pair.
    ModifyQp,
    /// Querying a queue pair.
    QueryQp,
    /// Destroying a queue pair.
    DestroyQp,
    /// Attaching a queue pair to a multicast group.
    AttachMcast,
    /// Creating a shared receive queue.
    CreateSrq,
    /// Destroying a shared receive queue.
    DestroySrq,
    /// Registering a memory region.
    CreateMr,
    /// Deregistering a memory region.
    DestroyMr,
    /// Allocating a memory window or a region for fast registration.
    AllocMw,
    /// Adding a GID to the port's table.
    BindGid,
    /// Removing a GID from the port's table.
    UnbindGid,
    /// Posting send work requests.
    PostSend,
    /// Posting receive work requests.
    PostRecv,
    /// Polling a completion queue.
    PollCq,
    /// Resizing a completion queue.
    ResizeCq,
    /// Modifying a shared receive queue (arming its limit).
    ModifySrq,
    /// Querying a shared receive queue.
    QuerySrq,
    /// Reading a GID table entry.
    QueryGid,
    /// Resolving a peer's link address (ARP).
    ResolveAddress,
    /// Making an address handle (or its address vector) from a completion.
    CreateAh,
}

/// What a device reported in an [`Error::Device`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceStatus {
    /// A (positive) errno value.
    Errno(u32),
    /// The device rejected the command before running it (no shared region loaded, or an
    /// opcode it does not implement).
    Rejected,
    /// The device's error register was not 0 after activation.
    NotActive(u32),
}

/// Why a device's answer was not used, in an [`Error::Protocol`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The response acknowledged another command.
    Ack {
        /// The acknowledgement expected.
        expected: u32,
        /// The acknowledgement found.
        found: u32,
    },
    /// The response did not echo the request's cookie.
    Cookie,
    /// The error register and the response header's own error field disagree (one says
    /// success, the other failure, or they name different errnos).
    StatusMismatch {
        /// The error register (ERR) as read.
        register: u32,
        /// The response header's `err` byte.
        header: u8,
    },
    /// A field held an impossible value.
    Value {
        /// The field's name. A reference to the name (one word, where `&str` takes two) keeps
        /// [`Error`] at 32 bytes: every `Result` of the crate is returned and moved at that
        /// size (40 bytes with `&'static str`).
        field: &'static &'static str,
        /// Its value.
        value: u64,
    },
}

/// What is unsupported, in an [`Error::Unsupported`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unsupported {
    /// The device reports an interface version this driver does not speak.
    DeviceVersion(u32),
    /// The device's transport mode (PVRDMA: 0 = RoCE, 1 = iWARP, 2 = IB) is not RoCE.
    TransportMode(u8),
    /// The device's GID types do not fit its version.
    GidTypes(u8),
    /// A BAR of a reserved or unexpected type.
    BarType {
        /// BAR index.
        bar: u8,
    },
    /// A queue pair type the device does not implement.
    QpType(crate::verbs::qp_types::QpType),
    /// An optional feature of the verbs API (an `_ex` field, inline data, atomics…).
    Feature(Feature),
}

/// An optional verbs feature, in [`Unsupported::Feature`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Feature {
    /// `ibv_qp_init_attr_ex.create_flags`.
    CreateFlags,
    /// `source_qpn`.
    SourceQpn,
    /// RSS (`rx_hash_conf` / `rwq_ind_tbl`).
    Rss,
    /// `max_tso_header`.
    Tso,
    /// An XRC domain.
    Xrc,
    /// Inline data in send WQEs.
    InlineData,
    /// A shared receive queue on a queue pair type that cannot use one.
    SrqOnQpType,
    /// Atomic operations.
    Atomics,
    /// Multicast.
    Multicast,
    /// The device's own completion-queue resize.
    ResizeCq,
    /// An operation the QP's transport cannot carry (e.g. RDMA on UD).
    OpcodeForQpType,
    /// An operation the device would not execute faithfully (QEMU's PVRDMA runs every send
    /// as a plain SEND); see `device::pvrdma::Opcodes`.
    NotExecutedByDevice,
    /// RESET → INIT of a queue pair that had gone beyond INIT (to RTR or RTS) before it was
    /// reset. PVRDMA as QEMU emulates it only records RESET: the host QP behind it keeps its
    /// state, and the host refuses INIT from RTR/RTS (QEMU answers EIO). No command resets
    /// the host QP, so such a QP cannot be reused: destroy it and create a new one (which gets
    /// a new QP number). A QP reset from INIT can be initialized again.
    ReinitAfterReset,
    /// Registering memory the embedder owns (the HAL cannot translate its addresses).
    UserMemory,
    /// Interrupts: the device has no usable MSI-X capability (or too few vectors, or a table
    /// outside its BAR), or the HAL routes no message for one of its vectors.
    Interrupts,
    /// Modifying a shared receive queue (arming its limit): QEMU's PVRDMA runs another
    /// command's handler for it (its MODIFY_SRQ and QUERY_SRQ handlers are swapped).
    SrqModify,
    /// An IPv6 (non IPv4-mapped) GID where the software device takes none: in an address
    /// handle (UD runs over IPv4 only), as the source of an IPv4-mapped destination or the
    /// reverse, or as a destination that is this interface's own (loopback over IPv6) or no
    /// station's. RC and UC queue pairs connect by IPv6 GIDs.
    Ipv6,
    /// Changing a memory region in place (`ibv_rereg_mr`).
    ReregMr,
    /// Memory windows (`ibv_alloc_mw`, `ibv_bind_mw`, `IBV_WR_BIND_MW`): QEMU's PVRDMA has
    /// none; grant remote access through a memory region's own rkey instead.
    MemoryWindows,
    /// Fast registration (`IB_WR_REG_MR` of a region allocated for it): QEMU's PVRDMA has
    /// none; register the memory with `ProtectionDomain::register` instead.
    FastRegistration,
    /// Invalidating a key by a work request (`IBV_WR_LOCAL_INV`, `IBV_WR_SEND_WITH_INV`):
    /// QEMU's PVRDMA has none; deregister the region instead, and send without invalidate.
    Invalidation,
}

/// What was not found, in an [`Error::NotFound`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotFound {
    /// No device of the supported kind on the bus.
    Device,
    /// The network function the RDMA function must be paired with (PVRDMA: a vmxnet3 at
    /// function 0 of the same slot) is absent.
    PairedFunction,
    /// A BAR the device needs is not implemented or is too small.
    Bar {
        /// BAR index.
        bar: u8,
    },
    /// No GID is bound at this index of the port's table (`ibv_query_gid_ex`'s ENODATA).
    GidEntry {
        /// The port.
        port: u8,
        /// The index.
        index: u32,
    },
    /// The port's GID table holds no such GID (of the type needed).
    Gid {
        /// The port.
        port: u8,
        /// The GID looked for.
        gid: crate::verbs::Gid,
    },
    /// The queue pair is not attached to this multicast group (`ibv_detach_mcast`).
    McastMember {
        /// The group's GID.
        gid: crate::verbs::Gid,
    },
    /// The port's P_Key table holds no such P_Key (`ibv_get_pkey_index`'s -1).
    Pkey {
        /// The port.
        port: u8,
        /// The P_Key looked for.
        pkey: u16,
    },
}

impl core::error::Error for Error {}
