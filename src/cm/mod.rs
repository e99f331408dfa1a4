//! Connection management on the wire: the InfiniBand communication manager's messages on QP1,
//! as Linux's `ib_cm` and `rdma_cm` speak them over RoCEv2, so that a Linux `rdma_cm` program
//! connects to this side or accepts its connections (`docs/cm.md`).
//!
//! The CM is device-agnostic: it uses the verbs API only (a GSI queue pair, a completion queue,
//! a registered region for its datagrams, address handles) and moves the user's RC queue
//! pairs with [`QueuePair::handshake_with`](crate::verbs::QueuePair::handshake_with). It has no
//! heap (a fixed table of `N` connections, each with its own retransmission buffer), no thread
//! and no waiting: [`Cm::poll`] takes what QP1 received, runs the timers on the embedder's
//! [`Clock`], and hands out one [`CmEvent`] at a time ([`Cm::next_event`]: the same as a
//! future).
//!
//! - IPv4 and IPv6 ([`CmAddr`]): RoCEv2 over either, as the device's GID table has an
//!   IPv4-mapped GID, a global IPv6 GID, or both; rdma_cm's private-data header of either IP
//!   version;
//! - passive: [`Cm::listen`] on an address (or any) and a port, as rdma_cm's service ID
//!   `0x0106_PPPP` (RC) or `0x0111_PPPP` (UD); [`CmEvent::ConnectRequest`] with the request's
//!   values and private data; [`Cm::accept`] takes a RESET QP to RTS from the REQ's values,
//!   then sends the REP; [`Cm::reject`];
//! - active: [`Cm::connect`] sends a REQ for a RESET QP; at the REP the QP goes to RTR and RTS,
//!   the RTU goes out and [`CmEvent::Established`] hands the QP back;
//! - [`Cm::disconnect`] (DREQ/DREP, TIME_WAIT); SIDR for UD services
//!   ([`Cm::sidr_resolve`], [`Cm::sidr_reply`]);
//! - retransmission of REQ, REP, DREQ and SIDR_REQ until the peer's answer or the retry
//!   count, MRA honoured and sent for a duplicate REQ, a duplicate REP answered with the RTU,
//!   a duplicate DREQ with the DREP, stale connections refused;
//! - communication IDs, transaction IDs and starting PSNs from the context's entropy
//!   ([`Context::entropy`]), seeded by the HAL: a test that fixes the seed replays.
//!
//! Every message is network input: it is checked (length, header, class, version, method,
//! attribute) before a field is read, matched to a connection by its communication IDs *and*
//! the address it came from, and never costs more than a bounded amount of work.
//!
//! The CM owns its completion queue: nothing else may use it.
//!
//! # What must run
//!
//! The CM makes progress inside [`Cm::poll`] (and [`Cm::next_event`]): poll it, or await its
//! future, until the connection is up, and on while it lives (the peer's DREQ, resends). Once
//! connected, RDMA READs and WRITEs that the peer aims at this side's memory need nothing of
//! the CM: on PVRDMA the device serves them; on the software RoCE device this side's device
//! serves them inside its own calls — any wait the crate offers (a future of a completion
//! queue or channel, [`Context::block_on`], [`Cm::poll`]), a poll, or
//! [`Context::progress`]. A passive side that waits on nothing of the crate's (a lock, a
//! flag) while its memory is used calls [`Context::progress`] from that loop.
//!
//! # Example
//!
//! Two software RoCE devices on an in-memory Ethernet segment (the test model's): the server
//! listens on rping's port and sends its region's address and key in the REP; the client
//! connects, then RDMA-WRITEs into the server's region, RDMA-READs from it and sends 8
//! messages into the server's 8 receives (`examples/cm.rs`, `cargo run --example cm`):
//!
//! ```
#![doc = include_str!("../../examples/cm.rs")]
//! ```

mod active;
mod addr;
mod disconnect;
mod event;
pub mod mad;
pub mod msg;
mod passive;
mod state;
mod table;
pub mod timer;
mod wait;

use bareverbs_hal::Clock;

pub use active::ConnectParams;
pub use addr::CmAddr;
pub use event::{
    CmEvent, ConnId, ConnectRequest, REQ_USER_DATA, SIDR_TIMEOUT, SIDR_USER_DATA, SidrRequest,
};
pub use msg::Private;
pub use passive::AcceptParams;
pub use table::Failure;
pub use wait::NextEvent;

use mad::{MAD_LEN, Mad};
use table::Conn;

use crate::error::Error;
use crate::verbs::{
    AccessFlags, AddressHandle, AddressVector, CompletionQueue, Context, Gsi, MemoryRegion, Mtu,
    ProtectionDomain, Provider, QpCaps, QueuePair, Rts, SendFlags, WcStatus, WorkCompletion,
};

/// The Q_Key of QP1's datagrams.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// Receive buffers QP1 may have posted: as many as its CQ leaves room for beside the send
/// buffers (never fewer than 8, the count of a 24-entry CQ), up to this. A peer that makes
/// a hundred connections at once sends its REQs in one burst; a REQ that finds no receive
/// buffer is lost and comes again only after the peer's retry timer (seconds).
const RECV_SLOTS: usize = 64;
/// Receive buffers of a CQ with too little room for more.
const MIN_RECV_SLOTS: usize = 8;
/// Datagrams being sent at once.
const SEND_SLOTS: usize = 16;
/// Send buffers that answers to datagrams which open no connection may hold (a REJ to a
/// request refused, a DREP to an unknown DREQ, an MRA to a duplicate REQ, SIDR answers): the
/// others stay for the connections' own messages. A send holds its buffer until it leaves,
/// and one to an address that does not resolve waits for the neighbour lookup to give up: a
/// stranger that provokes answers from such addresses would otherwise hold every buffer and
/// keep connections from being made or ended.
const ANSWER_SLOTS: usize = 4;
/// A receive buffer: the 40-byte GRH slot and a MAD.
const RECV_LEN: usize = 40 + MAD_LEN;
/// Receive buffers' stride in the region.
const RECV_STRIDE: usize = 320;
/// Where the send buffers start in the region.
const SEND_AT: usize = RECV_SLOTS * RECV_STRIDE;
/// The region's size.
const REGION: usize = SEND_AT + SEND_SLOTS * MAD_LEN;
/// Work-request IDs: receives are `RECV_TAG + slot`, sends `SEND_TAG + slot`.
const RECV_TAG: u64 = 0x100;
const SEND_TAG: u64 = 0x200;
/// Completions taken per poll, at most (bounded work per call).
const BUDGET: usize = 32;
/// Listening ports, at most.
pub const MAX_LISTEN: usize = 8;

/// How the CM sends its messages and sets up its connections. The defaults are rdma_cm's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmConfig {
    /// The CM response timeout this side advertises and asks for (code; 20: 4.096 s).
    pub response_timeout: u8,
    /// Resends of a REQ, REP, DREQ or SIDR_REQ after the first (at most 15).
    pub max_retries: u8,
    /// The packet lifetime code a REQ's wait adds twice (18: 1.024 s, Linux 6.1's for
    /// RoCE).
    pub packet_life: u8,
    /// The local ACK timeout code of connected QPs (also TIME_WAIT's length; 14: 67 ms).
    pub ack_timeout: u8,
    /// The IP hop limit of connected QPs.
    pub hop_limit: u8,
}

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig {
            response_timeout: 20,
            max_retries: 15,
            packet_life: 18,
            ack_timeout: 14,
            hop_limit: 64,
        }
    }
}

/// What the CM refuses to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmError {
    /// The verbs layer failed (setting up QP1, posting, moving a QP).
    Verbs(Error),
    /// No free entry in the connection table (or the listener table).
    TableFull,
    /// No live connection with that ID.
    UnknownConnection,
    /// The connection is not in a state where this is done.
    WrongState,
    /// The port already has a listener of that kind.
    PortInUse,
    /// More private data than the message carries (the most it carries).
    PrivateDataTooLong(usize),
    /// The device has no GID on port 1 for the address family: an IPv4-mapped GID for
    /// IPv4, a global IPv6 GID for IPv6 ([`Cm::new`] wants one or the other).
    NoAddress,
}

impl core::fmt::Display for CmError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CmError::Verbs(e) => write!(f, "CM: {e}"),
            CmError::TableFull => f.write_str("CM: no free entry in the table"),
            CmError::UnknownConnection => f.write_str("CM: no such connection"),
            CmError::WrongState => f.write_str("CM: not in a state where this is done"),
            CmError::PortInUse => f.write_str("CM: the port has a listener"),
            CmError::PrivateDataTooLong(n) => write!(f, "CM: private data over {n} bytes"),
            CmError::NoAddress => f.write_str("CM: no GID of the address's family on port 1"),
        }
    }
}

impl core::error::Error for CmError {}

impl From<Error> for CmError {
    fn from(e: Error) -> Self {
        CmError::Verbs(e)
    }
}

/// A verbs hand-back's error, the object dropped (as [`Error`]'s own conversion does): `?`
/// on a queue pair's transition in a function that returns a `CmError`.
impl<T> From<(T, Error)> for CmError {
    fn from((object, e): (T, Error)) -> Self {
        drop(object);
        CmError::Verbs(e)
    }
}

/// The CM's hand-back's error ([`Cm::connect`], [`Cm::accept`] hand the queue pair back with
/// it), the queue pair dropped: `?` where the caller does not want it back.
impl<T> From<(T, CmError)> for CmError {
    fn from((object, e): (T, CmError)) -> Self {
        drop(object);
        e
    }
}

/// Which rdma_cm port space a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// RC connections (`RDMA_PS_TCP`: REQ/REP/RTU).
    Rc,
    /// UD services (`RDMA_PS_UDP`: SIDR).
    Ud,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Listener {
    ip: Option<CmAddr>,
    port: u16,
    service: Service,
}

/// What the CM counted (messages it took, dropped, sent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmCounts {
    /// CM messages taken (well-formed).
    pub received: u64,
    /// Datagrams dropped as malformed (length, header, class, version, method, attribute,
    /// no usable source address).
    pub malformed: u64,
    /// Well-formed messages that matched no connection, or came from another address than
    /// the connection's peer, or did not fit its state.
    pub unmatched: u64,
    /// Messages sent (first sends and resends).
    pub sent: u64,
    /// Resends on timeout.
    pub resent: u64,
    /// Messages not sent for lack of a send buffer (the timers resend what needs it).
    pub send_dropped: u64,
    /// Half-open requests dropped to make room for a new one.
    pub evicted: u64,
    /// REQs and SIDR_REQs to a listener refused (REJ "consumer defined", SIDR_REP
    /// "unsupported") for their rdma_cm header: too short, another version or IP version,
    /// a source address other than the datagram's, a destination other than this side's
    /// (or the listener's).
    pub bad_header: u64,
}

/// The connection manager over QP1 of one device, with room for `N` connections.
pub struct Cm<'a, P: Provider, C: Clock, const N: usize = 16> {
    ctx: &'a Context<P>,
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    // Declared before the region: the QP (which may still use the buffers) goes first.
    gsi: QueuePair<'a, P, Gsi, Rts>,
    /// Each send buffer's address handle, kept until the send completes: one to an IPv6
    /// address holds an IPv6 path of the device, which the send goes by (and which waits
    /// for neighbour discovery).
    ahs: [Option<AddressHandle<'a, P>>; SEND_SLOTS],
    mr: MemoryRegion<'a, P>,
    clock: C,
    cfg: CmConfig,
    guid: u64,
    /// This side's IPv4 address and its GID's index, if it has one.
    local4: Option<(u32, CmAddr)>,
    /// This side's (first) global IPv6 address and its GID's index, if it has one.
    local6: Option<(u32, CmAddr)>,
    mtu: Mtu,
    hi_tid: u32,
    send_busy: u16,
    /// Receive buffers posted (slots `0..recv_slots`): [`MIN_RECV_SLOTS`] to [`RECV_SLOTS`].
    recv_slots: usize,
    /// Datagrams received and not handled yet, oldest first: (receive slot, length). Their
    /// slots are not reposted, so their buffers still hold them. They are handled while a
    /// send buffer is free: a burst of messages that each want an answer (a hundred DREQs)
    /// waits in its buffers instead of losing the answers for want of a send buffer.
    held: heapless::Deque<(u8, u16), RECV_SLOTS>,
    listeners: [Option<Listener>; MAX_LISTEN],
    conns: [Conn<'a, P>; N],
    cursor: usize,
    counts: CmCounts,
}

impl<'a, P: Provider, C: Clock, const N: usize> Cm<'a, P, C, N> {
    /// Opens QP1 on `pd`'s device, with `cq` (which the CM owns from now on: at least 24
    /// entries) for its completions, and the clock its timers run on. QP1 gets as many
    /// receive buffers as `cq` holds beyond its 16 send buffers, from 8 to 64: a CQ of 80
    /// entries or more takes a burst of 64 messages (`cmtime`'s hundred REQs at once).
    ///
    /// # Errors
    ///
    /// [`CmError::NoAddress`] with neither an IPv4-mapped nor a global IPv6 GID on port 1
    /// (an IPv6 address given to the device later is found when first needed);
    /// [`CmError::Verbs`] when
    /// QP1, its region or its receives cannot be set up (a device has one QP1: one CM per
    /// device).
    pub fn new(
        pd: &'a ProtectionDomain<'a, P>,
        cq: &'a CompletionQueue<'a, P>,
        clock: C,
        cfg: CmConfig,
    ) -> Result<Self, CmError> {
        let ctx = pd.context();
        let (local4, local6) = local_addrs(ctx)?;
        if local4.is_none() && local6.is_none() {
            return Err(CmError::NoAddress);
        }
        let mtu = ctx.query_port(1)?.active_mtu;
        let recv_slots = (cq.entries() as usize)
            .saturating_sub(SEND_SLOTS)
            .clamp(MIN_RECV_SLOTS, RECV_SLOTS);
        let caps = QpCaps {
            max_send_wr: SEND_SLOTS as u32,
            max_recv_wr: recv_slots as u32,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let gsi = pd.qp_builder(cq, cq).caps(caps).build::<Gsi>()?;
        let gsi = gsi.ready(GSI_QKEY, 0)?;
        let mr = pd.register(REGION, AccessFlags::LOCAL_WRITE)?;
        let entropy = ctx.entropy();
        let mut cm = Cm {
            ctx,
            pd,
            cq,
            gsi,
            ahs: core::array::from_fn(|_| None),
            mr,
            clock,
            cfg: CmConfig {
                max_retries: cfg.max_retries.min(15),
                ..cfg
            },
            guid: u64::from_be_bytes(ctx.caps().node_guid.to_ne_bytes()),
            local4,
            local6,
            mtu,
            hi_tid: entropy.next_u64() as u32,
            send_busy: 0,
            recv_slots,
            held: heapless::Deque::new(),
            listeners: [None; MAX_LISTEN],
            conns: core::array::from_fn(|_| Conn::idle()),
            cursor: 0,
            counts: CmCounts::default(),
        };
        for slot in 0..recv_slots {
            cm.post_recv(slot)?;
        }
        Ok(cm)
    }

    /// This side's IPv4 address (from its GID), `0.0.0.0` on a device with IPv6 only.
    pub fn ip(&self) -> [u8; 4] {
        self.local4.map_or([0; 4], |(_, a)| a.ipv4_or_zero())
    }

    /// This side's global IPv6 address (its first global IPv6 GID), if it has one.
    pub fn ip6(&self) -> Option<[u8; 16]> {
        self.local6.and_then(|(_, a)| a.ipv6())
    }

    /// The GID index and address this side speaks from to `peer` (of `peer`'s family: its
    /// IPv4-mapped GID, or its first global IPv6 GID), `None` without one. An IPv6 address
    /// the device got after [`Cm::new`] is looked up here.
    pub fn local_for(&mut self, peer: CmAddr) -> Option<(u32, CmAddr)> {
        if !peer.is_ipv6() {
            return self.local4;
        }
        if self.local6.is_none() {
            self.local6 = local_addrs(self.ctx).ok().and_then(|(_, six)| six);
        }
        self.local6
    }

    /// What the CM counted so far.
    pub fn counts(&self) -> CmCounts {
        self.counts
    }

    /// Live connections (and ended ones with events not yet taken).
    pub fn in_use(&self) -> usize {
        self.conns.iter().filter(|c| !c.is_free()).count()
    }

    /// Listens on `port` of `service`'s port space, at IPv4 address `ip` (`None`: any
    /// address of this device, IPv4 or IPv6).
    ///
    /// # Errors
    ///
    /// [`CmError::PortInUse`], [`CmError::TableFull`] (at most [`MAX_LISTEN`] listeners).
    pub fn listen(
        &mut self,
        ip: Option<[u8; 4]>,
        port: u16,
        service: Service,
    ) -> Result<(), CmError> {
        self.listen_at(ip.map(CmAddr::from), port, service)
    }

    /// Listens on `port` of `service`'s port space, at `addr`, IPv4 or IPv6 (`None`: any
    /// address of this device).
    ///
    /// # Errors
    ///
    /// [`CmError::PortInUse`], [`CmError::TableFull`] (at most [`MAX_LISTEN`] listeners).
    pub fn listen_at(
        &mut self,
        ip: Option<CmAddr>,
        port: u16,
        service: Service,
    ) -> Result<(), CmError> {
        let taken = self
            .listeners
            .iter()
            .flatten()
            .any(|l| l.port == port && l.service == service);
        if taken {
            return Err(CmError::PortInUse);
        }
        let slot = self
            .listeners
            .iter_mut()
            .find(|l| l.is_none())
            .ok_or(CmError::TableFull)?;
        *slot = Some(Listener { ip, port, service });
        Ok(())
    }

    /// Stops listening on `port` of `service`'s space (requests already received stay).
    pub fn unlisten(&mut self, port: u16, service: Service) {
        for l in self.listeners.iter_mut() {
            if l.is_some_and(|l| l.port == port && l.service == service) {
                *l = None;
            }
        }
    }

    /// Makes progress and returns the next event, if any: takes up to a bounded number of
    /// QP1 completions (each received message handled at once), runs the timers, then
    /// reports one pending event. Never waits.
    pub fn poll(&mut self) -> Option<CmEvent<'a, P>> {
        self.progress();
        self.take_event()
    }

    fn progress(&mut self) {
        // The device's own work first (the software device's frames: this side's peers are
        // served, its QP1 datagrams taken), then QP1's completions.
        self.ctx.progress();
        let mut wc = [WorkCompletion::default(); 8];
        let mut taken = 0;
        while taken < BUDGET {
            let Ok(n) = self.cq.poll(&mut wc) else { break };
            if n == 0 {
                break;
            }
            taken += n;
            for w in &wc[..n] {
                self.completion(w);
            }
            self.handle_held();
        }
        let now = self.clock.now_us();
        self.run_timers(now);
    }

    /// Handles the held datagrams, oldest first, while a send buffer is free (each is then
    /// reposted).
    fn handle_held(&mut self) {
        const ALL_BUSY: u16 = u16::MAX >> (16 - SEND_SLOTS);
        // Bounded: each held datagram once (at most RECV_SLOTS).
        while self.send_busy != ALL_BUSY {
            let Some((slot, len)) = self.held.pop_front() else {
                break;
            };
            let (slot, len) = (slot as usize, len as usize);
            let at = slot * RECV_STRIDE;
            let mut buf = [0u8; RECV_LEN];
            buf[..len].copy_from_slice(&self.mr.as_slice()[at..at + len]);
            let now = self.clock.now_us();
            match (source_ip(&buf[..len]), buf.get(40..len)) {
                (Some(ip), Some(mad)) => self.on_datagram(ip, mad, now),
                _ => self.counts.malformed += 1,
            }
            // A failed repost leaves one buffer fewer: QP1 keeps working with the others.
            let _ = self.post_recv(slot);
        }
    }

    fn completion(&mut self, w: &WorkCompletion) {
        // By work-request ID alone: a failed completion's opcode may mean nothing.
        if let Some(slot) = w
            .wr_id
            .checked_sub(SEND_TAG)
            .filter(|&s| s < SEND_SLOTS as u64)
        {
            self.send_busy &= !(1 << slot);
            self.ahs[slot as usize] = None;
            return;
        }
        let Some(slot) = w
            .wr_id
            .checked_sub(RECV_TAG)
            .map(|s| s as usize)
            .filter(|&s| s < self.recv_slots)
        else {
            return;
        };
        // A slot completes once per posting, so at most RECV_SLOTS are held; a slot already
        // held (a device that completed it twice) is not held again.
        if self.held.iter().any(|&(s, _)| usize::from(s) == slot) {
            return;
        }
        let len = (w.byte_len as usize).min(RECV_LEN);
        if w.status != WcStatus::Success || self.held.push_back((slot as u8, len as u16)).is_err() {
            // A failed repost leaves one buffer fewer: QP1 keeps working with the others.
            let _ = self.post_recv(slot);
        }
    }

    fn post_recv(&mut self, slot: usize) -> Result<(), Error> {
        let sge = self.mr.sge((slot * RECV_STRIDE) as u32, RECV_LEN as u32)?;
        // SAFETY: the region outlives QP1 (declared after it in `Cm`, so dropped after it),
        // and the CM does not touch a receive buffer until its completion.
        unsafe {
            let mut r = self.gsi.recv_batch();
            r.recv(RECV_TAG + slot as u64, &[sge])?;
            r.finish();
        }
        Ok(())
    }

    /// Sends a connection's message `m` to QP1 at `ip`; dropped (and counted) when every
    /// send buffer is in flight. It takes the buffers answers may not first.
    fn send(&mut self, ip: CmAddr, m: &Mad) {
        let free = (0..SEND_SLOTS)
            .rev()
            .find(|s| self.send_busy & (1 << s) == 0);
        self.send_in(free, ip, m);
    }

    /// Sends `m`, an answer to a datagram that opens no connection, to QP1 at `ip`, in one
    /// of the [`ANSWER_SLOTS`] buffers answers may hold; dropped (and counted) when those are
    /// in flight.
    fn answer(&mut self, ip: CmAddr, m: &Mad) {
        let free = (0..ANSWER_SLOTS).find(|s| self.send_busy & (1 << s) == 0);
        self.send_in(free, ip, m);
    }

    fn send_in(&mut self, free: Option<usize>, ip: CmAddr, m: &Mad) {
        // From this side's address of the peer's family (none: nothing to send from).
        let (Some(slot), Some((sgid_index, _))) = (free, self.local_for(ip)) else {
            self.counts.send_dropped += 1;
            return;
        };
        let at = SEND_AT + slot * MAD_LEN;
        self.mr.as_mut_slice()[at..at + MAD_LEN].copy_from_slice(&m.0);
        let mut av = AddressVector::new(ip.gid(), sgid_index as u8);
        av.hop_limit = self.cfg.hop_limit;
        let sent = (|| -> Result<AddressHandle<'a, P>, Error> {
            let ah = self.pd.create_ah(&av)?;
            // Two pieces, the header and the rest, as QEMU's PVRDMA wants a GSI send (one
            // gather list either way on other devices).
            let hdr = self.mr.sge(at as u32, mad::HDR_LEN as u32)?;
            let body = (at + mad::HDR_LEN) as u32;
            let rest = self.mr.sge(body, (MAD_LEN - mad::HDR_LEN) as u32)?;
            // SAFETY: as in `post_recv`; the send buffer is not written again until its
            // completion frees the slot.
            unsafe {
                let mut s = self.gsi.send_batch();
                s.send_to(
                    SEND_TAG + slot as u64,
                    SendFlags::SIGNALED,
                    (&ah, 1, GSI_QKEY),
                    &[hdr, rest],
                )?;
                s.finish();
            }
            Ok(ah)
        })();
        match sent {
            Ok(ah) => {
                self.ahs[slot] = Some(ah);
                self.send_busy |= 1 << slot;
                self.counts.sent += 1;
            }
            Err(_) => self.counts.send_dropped += 1,
        }
    }

    /// A fresh communication ID: non-zero, unused in the table (a random one; after a few
    /// draws that collide, which a working generator never gives, the first unused small
    /// number: the table has `N` entries, so one of `1..=N + 1` is free).
    fn new_id(&self) -> u32 {
        let unused =
            |id: u32| id != 0 && self.conns.iter().all(|c| c.is_free() || c.local_id != id);
        (0..8)
            .map(|_| self.ctx.entropy().next_u64() as u32)
            .find(|&id| unused(id))
            .or_else(|| (1..=N as u32 + 1).find(|&id| unused(id)))
            .unwrap_or(1)
    }

    /// The transaction ID of a request this side starts.
    fn tid_for(&self, local_id: u32) -> u64 {
        (u64::from(self.hi_tid) << 32) | u64::from(local_id)
    }
}

/// The sender's address from the 40-byte GRH slot of a received datagram: the IPv4 header
/// in its last 20 bytes after 20 zero bytes (RoCEv2 over IPv4, as rxe and Linux report it),
/// or the source GID of a GRH — the IPv6 header of RoCEv2 over IPv6, or QEMU's PVRDMA's GRH
/// (its version field 0: byte 20 is then the source address's first octet, and 64.0.0.0/4
/// must not read as an IPv4 header). No answer goes to a source no station may have: the
/// unspecified address, a multicast one (`ff00::/8`), `0.0.0.0`.
fn source_ip(buf: &[u8]) -> Option<CmAddr> {
    let grh = buf.get(..40)?;
    if grh[20] >> 4 == 4 && grh[..20].iter().all(|&b| b == 0) {
        let ip = [grh[32], grh[33], grh[34], grh[35]];
        return (ip != [0; 4]).then(|| CmAddr::from(ip));
    }
    let mut g = [0u8; 16];
    g.copy_from_slice(&grh[8..24]);
    let a = CmAddr::from(g);
    let nobody = g == [0; 16] || g[0] == 0xFF || a == CmAddr::UNSPECIFIED;
    (!nobody).then_some(a)
}

/// This side's addresses from port 1's GID table: the first IPv4-mapped GID and the first
/// global IPv6 GID (not link-local `fe80::/10`, not multicast), each with its index.
#[allow(clippy::type_complexity)]
fn local_addrs<P: Provider>(
    ctx: &Context<P>,
) -> Result<(Option<(u32, CmAddr)>, Option<(u32, CmAddr)>), Error> {
    let (mut four, mut six) = (None, None);
    for (i, g) in ctx.gid_table(1)? {
        let a = CmAddr::from(g);
        let link_local = g.0[0] == 0xFE && g.0[1] & 0xC0 == 0x80;
        if !a.is_ipv6() {
            four = four.or(Some((i, a)));
        } else if !link_local && g.0[0] != 0xFF && g.0 != [0; 16] {
            six = six.or(Some((i, a)));
        }
    }
    Ok((four, six))
}
