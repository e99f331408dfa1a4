//! The NVMe/RDMA host: connects the admin queue and I/O queues through the CM, brings the
//! controller up as Linux's host does (Connect, CAP, CC.EN, CSTS.RDY, Identify, Number of
//! Queues), then reads, writes, flushes.
//!
//! Commands go out with [`Host::submit`] (or [`Host::submit_raw`], any bytes) and come back
//! with [`Host::take`] once [`Host::poll`] saw their response; the `…_wait` helpers and the
//! command methods loop on `poll` and an `idle` callback the embedder gives (the tests run
//! the target there; a unikernel polls its network), up to [`HostConfig::timeout_ms`].

mod cmds;
mod error;
mod queue;

pub use error::HostError;

use bareverbs::cm::{Cm, CmEvent, ConnId, ConnectParams};
use bareverbs::hal::Clock;
use bareverbs::verbs::{
    AccessFlags, CompletionQueue, ProtectionDomain, Provider, QpCaps, Rc, WcStatus, WorkCompletion,
};

use crate::wire::cm::{CmRejStatus, CmReq};
use crate::wire::fabrics::Nqn;
use crate::wire::identify::CtrlInfo;
use crate::wire::{CQE_LEN, Cqe, SQE_LEN, Sgl, Sqe};
use queue::{HostQueue, Slot};

/// What the host connects to, and how.
#[derive(Clone, Copy, Debug)]
pub struct HostConfig<'n> {
    /// The target's IPv4 address.
    pub addr: [u8; 4],
    /// Its port (4420).
    pub port: u16,
    /// The subsystem (or the discovery NQN).
    pub subnqn: &'n str,
    /// This host's NQN.
    pub hostnqn: &'n str,
    /// This host's identifier.
    pub hostid: [u8; 16],
    /// I/O queues to ask for (at most the host's `Q − 1`).
    pub io_queues: u16,
    /// I/O queue depth (at most the host's `D`).
    pub io_depth: u16,
    /// Keep-alive timeout asked for (ms; 0: none). The host sends Keep Alive every half.
    pub kato_ms: u32,
    /// Bytes one command moves at most (each slot has a data buffer this big).
    pub max_transfer: u32,
    /// Send write data in the capsule when the controller takes it and it fits.
    pub inline: bool,
    /// How long a command may take (ms).
    pub timeout_ms: u32,
    /// Name the controller in each I/O queue's connection request (the REQ private data's
    /// controller ID, as newer hosts do); off, it is 0, as Linux 6.1's nvme-rdma leaves it.
    pub request_cntlid: bool,
}

impl Default for HostConfig<'_> {
    fn default() -> Self {
        HostConfig {
            addr: [0; 4],
            port: crate::NVME_RDMA_PORT,
            subnqn: "",
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000000",
            hostid: [0; 16],
            io_queues: 1,
            io_depth: 32,
            kato_ms: 5000,
            max_transfer: 32 * 1024,
            inline: true,
            timeout_ms: 10_000,
            request_cntlid: true,
        }
    }
}

/// Data of a command.
#[derive(Clone, Copy, Debug)]
pub enum Data<'b> {
    /// None.
    None,
    /// To the controller (a write): these bytes, copied into the slot's buffer.
    Out(&'b [u8]),
    /// From the controller (a read): this many bytes into the slot's buffer.
    In(u32),
}

/// Admin queue depth the host asks for.
const ADMIN_DEPTH: u16 = 32;

/// An NVMe/RDMA host with room for `Q` queues (the admin queue and `Q − 1` I/O queues) of at
/// most `D` commands.
pub struct Host<'a, 'n, P: Provider, K: Clock, const Q: usize = 5, const D: usize = 32> {
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    clock: K,
    cfg: HostConfig<'n>,
    queues: [HostQueue<'a, P, D>; Q],
    cntlid: u16,
    info: CtrlInfo,
    io_granted: u16,
    /// Entries an I/O queue may have: CAP.MQES + 1.
    max_depth: u16,
    last_keep_alive: u64,
    /// Queues whose connection ended (a disconnection, a failed completion).
    ended: u32,
}

impl<'a, 'n, P: Provider, K: Clock, const Q: usize, const D: usize> Host<'a, 'n, P, K, Q, D> {
    /// A host on `pd`'s device, completing its queues' work on `cq` (room for `Q × 2 × D`).
    pub fn new(
        pd: &'a ProtectionDomain<'a, P>,
        cq: &'a CompletionQueue<'a, P>,
        clock: K,
        cfg: HostConfig<'n>,
    ) -> Self {
        Host {
            pd,
            cq,
            clock,
            cfg,
            queues: core::array::from_fn(|_| HostQueue::free()),
            cntlid: 0,
            info: CtrlInfo::default(),
            io_granted: 0,
            max_depth: 2,
            last_keep_alive: 0,
            ended: 0,
        }
    }

    /// The controller ID the admin Connect returned.
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    /// What Identify Controller said.
    pub fn controller(&self) -> &CtrlInfo {
        &self.info
    }

    /// I/O queues connected.
    pub fn io_queues(&self) -> u16 {
        (1..Q).filter(|&q| self.queues[q].qp.is_some()).count() as u16
    }

    /// Whether queue `qid` is connected.
    pub fn connected(&self, qid: u16) -> bool {
        self.queues
            .get(usize::from(qid))
            .is_some_and(|q| q.qp.is_some())
    }

    /// Queue connections that ended (disconnections, transport errors) since creation.
    pub fn ended(&self) -> u32 {
        self.ended
    }

    /// `(address, key)` of slot `slot`'s data buffer on queue `qid` (tests build their own
    /// SGLs with it).
    pub fn data_key(&self, qid: u16, slot: u16) -> Option<(u64, u32)> {
        let q = self.queues.get(usize::from(qid))?;
        let mr = q.mr.as_ref()?;
        Some((mr.addr() + q.data_at(slot) as u64, mr.rkey()))
    }

    /// Opens queue `qid` through the CM (`depth` commands): REQ with NVMe/RDMA's private
    /// data, waits for the REP (running `cm` and `idle`), posts the response buffers.
    ///
    /// # Errors
    ///
    /// [`HostError::Rejected`] with the REJ's status, [`HostError::ConnectFailed`],
    /// [`HostError::Verbs`], [`HostError::Timeout`].
    pub fn open_queue<C: Clock, const N: usize>(
        &mut self,
        cm: &mut Cm<'a, P, C, N>,
        qid: u16,
        depth: u16,
        idle: &mut dyn FnMut(),
    ) -> Result<(), HostError> {
        let q = usize::from(qid);
        if q >= Q || depth < 2 || usize::from(depth) > D {
            return Err(HostError::TooLarge);
        }
        self.queues[q].close();
        // In-capsule data only on I/O queues of a controller that takes it, and no more than
        // it takes (IOCCSZ): the capsule buffers are as large as that, and no larger.
        let sqe = SQE_LEN as u32;
        let capsule = if qid == 0 || !self.cfg.inline || self.info.sgls & (1 << 20) == 0 {
            sqe
        } else {
            let most = sqe + self.cfg.max_transfer.max(1024);
            self.info.ioccsz.saturating_mul(16).clamp(sqe, most)
        };
        let data_len = self.cfg.max_transfer.max(4096);
        let caps = QpCaps {
            max_send_wr: u32::from(depth) + 1,
            max_recv_wr: u32::from(depth),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = self
            .pd
            .qp_builder(self.cq, self.cq)
            .caps(caps)
            .build::<Rc>()
            .map_err(|_| HostError::Verbs)?;
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let len = HostQueue::<P, D>::region_len(depth, capsule, data_len);
        let mr = self
            .pd
            .register(len, access)
            .map_err(|_| HostError::Verbs)?;
        let req = CmReq {
            recfmt: 0,
            qid,
            hrqsize: depth,
            hsqsize: depth - 1,
            cntlid: if qid == 0 || !self.cfg.request_cntlid {
                0
            } else {
                self.cntlid
            },
        }
        .to_bytes();
        let params = ConnectParams {
            responder_resources: 16,
            initiator_depth: 0,
            private_data: &req,
            ..ConnectParams::default()
        };
        let id = cm
            .connect(qp, self.cfg.addr, self.cfg.port, &params)
            .map_err(|_| HostError::ConnectFailed)?;
        let deadline = self.deadline();
        let qp = loop {
            match cm.poll() {
                Some(CmEvent::Established {
                    id: e,
                    qp: Some(qp),
                    ..
                }) if e == id => break qp,
                Some(CmEvent::Failed {
                    id: e,
                    failure,
                    private_data,
                    ..
                }) if e == id => {
                    return Err(match failure {
                        bareverbs::cm::Failure::Rejected { reason: 28 } => {
                            HostError::Rejected(CmRejStatus::parse(private_data.as_slice()))
                        }
                        bareverbs::cm::Failure::Rejected { .. } => HostError::Rejected(None),
                        _ => HostError::ConnectFailed,
                    });
                }
                Some(ev) => self.on_cm_event(ev),
                None => {
                    self.progress();
                    idle();
                    if self.clock.now_us() > deadline {
                        return Err(HostError::Timeout);
                    }
                }
            }
        };
        let hq = &mut self.queues[q];
        hq.qp = Some(qp);
        hq.mr = Some(mr);
        hq.conn = Some(id);
        hq.depth = depth;
        hq.capsule = capsule;
        hq.data_len = data_len;
        for s in 0..depth {
            hq.post_recv(q, s).map_err(|_| HostError::Verbs)?;
        }
        Ok(())
    }

    /// Takes a CM event of the host's connections (a disconnection ends the queue).
    pub fn on_cm_event(&mut self, ev: CmEvent<'a, P>) {
        if let CmEvent::Disconnected { id } = ev
            && let Some(q) = self.by_conn(id)
        {
            self.queues[q].close();
            self.ended += 1;
        }
    }

    fn by_conn(&self, id: ConnId) -> Option<usize> {
        self.queues.iter().position(|q| q.conn == Some(id))
    }

    fn deadline(&self) -> u64 {
        self.clock.now_us() + u64::from(self.cfg.timeout_ms) * 1000
    }

    /// Disconnects queue `qid` (DREQ) and frees it.
    pub fn close_queue<C: Clock, const N: usize>(&mut self, cm: &mut Cm<'a, P, C, N>, qid: u16) {
        if let Some(q) = self.queues.get_mut(usize::from(qid)) {
            if let Some(id) = q.conn {
                let _ = cm.disconnect(id);
            }
            q.close();
        }
    }

    /// Sends `sqe` on queue `qid` with `data` (the SGL is written here: keyed to the slot's
    /// data buffer, or in the capsule for a write that fits when the controller takes it).
    /// Returns the slot to [`take`](Self::take) the response from.
    ///
    /// # Errors
    ///
    /// [`HostError::NotConnected`], [`HostError::Busy`], [`HostError::TooLarge`],
    /// [`HostError::Verbs`].
    pub fn submit(&mut self, qid: u16, mut sqe: Sqe, data: Data<'_>) -> Result<u16, HostError> {
        let q = usize::from(qid);
        let inline_ok = qid != 0 && self.info.sgls & (1 << 20) != 0 && self.cfg.inline;
        let ioccsz = self.info.ioccsz;
        let hq = self.queues.get_mut(q).ok_or(HostError::NotConnected)?;
        if hq.qp.is_none() {
            return Err(HostError::NotConnected);
        }
        let s = hq.slots[..usize::from(hq.depth)]
            .iter()
            .position(|s| !s.busy)
            .ok_or(HostError::Busy)? as u16;
        hq.seq = hq.seq.wrapping_add(1);
        let cid = (s & 0xFF) | (hq.seq << 8);
        sqe.set_cid(cid);
        let mut len = SQE_LEN as u32;
        let mut read_len = 0;
        let (addr, key) = {
            let mr = hq.mr.as_ref().ok_or(HostError::NotConnected)?;
            (mr.addr() + hq.data_at(s) as u64, mr.rkey())
        };
        match data {
            Data::None => {}
            Data::Out(b) => {
                let n = u32::try_from(b.len()).map_err(|_| HostError::TooLarge)?;
                let room = ioccsz
                    .saturating_mul(16)
                    .saturating_sub(SQE_LEN as u32)
                    .min(hq.capsule - SQE_LEN as u32);
                if inline_ok && n <= room {
                    let at = hq.capsule_at(s) + SQE_LEN;
                    hq.bytes_mut(at, b.len()).copy_from_slice(b);
                    sqe.set_sgl(&Sgl::InCapsule { offset: 0, len: n });
                    len += n;
                } else {
                    if n > hq.data_len {
                        return Err(HostError::TooLarge);
                    }
                    let at = hq.data_at(s);
                    hq.bytes_mut(at, b.len()).copy_from_slice(b);
                    sqe.set_sgl(&Sgl::Keyed {
                        addr,
                        len: n,
                        key,
                        invalidate: false,
                    });
                }
            }
            Data::In(n) => {
                if n > hq.data_len {
                    return Err(HostError::TooLarge);
                }
                read_len = n;
                sqe.set_sgl(&Sgl::Keyed {
                    addr,
                    len: n,
                    key,
                    invalidate: false,
                });
            }
        }
        let at = hq.capsule_at(s);
        hq.bytes_mut(at, SQE_LEN).copy_from_slice(&sqe.0);
        hq.slots[usize::from(s)] = Slot {
            busy: true,
            cid,
            read_len,
            ..Slot::default()
        };
        if hq.post_capsule(q, s, len).is_err() {
            hq.slots[usize::from(s)] = Slot::default();
            return Err(HostError::Verbs);
        }
        Ok(s)
    }

    /// Sends `capsule` (any bytes, at most the queue's capsule size) as it is on queue `qid`;
    /// the response is matched by `cid`.
    ///
    /// # Errors
    ///
    /// As [`submit`](Self::submit).
    pub fn submit_raw(&mut self, qid: u16, capsule: &[u8], cid: u16) -> Result<u16, HostError> {
        let q = usize::from(qid);
        let hq = self.queues.get_mut(q).ok_or(HostError::NotConnected)?;
        if hq.qp.is_none() {
            return Err(HostError::NotConnected);
        }
        if capsule.len() > hq.capsule as usize {
            return Err(HostError::TooLarge);
        }
        let s = hq.slots[..usize::from(hq.depth)]
            .iter()
            .position(|s| !s.busy)
            .ok_or(HostError::Busy)? as u16;
        let at = hq.capsule_at(s);
        hq.bytes_mut(at, capsule.len()).copy_from_slice(capsule);
        hq.slots[usize::from(s)] = Slot {
            busy: true,
            cid,
            ..Slot::default()
        };
        if hq.post_capsule(q, s, capsule.len() as u32).is_err() {
            hq.slots[usize::from(s)] = Slot::default();
            return Err(HostError::Verbs);
        }
        Ok(s)
    }

    /// The response of slot `s` on queue `qid`, if it came (the slot is free again), with the
    /// data the controller wrote.
    pub fn take(&mut self, qid: u16, s: u16) -> Option<(Cqe, &[u8])> {
        let hq = self.queues.get_mut(usize::from(qid))?;
        let slot = hq.slots.get_mut(usize::from(s))?;
        if !slot.busy || !slot.sent {
            return None;
        }
        let cqe = slot.cqe?;
        let n = slot.read_len as usize;
        *slot = Slot::default();
        Some((cqe, hq.bytes(hq.data_at(s), n)))
    }

    /// Completions (responses and sends), and a Keep Alive when half the timeout passed.
    /// Returns the completions taken.
    pub fn poll(&mut self) -> usize {
        let n = self.progress();
        self.keep_alive();
        n
    }

    fn progress(&mut self) -> usize {
        self.cq.context().progress();
        let mut wc = [WorkCompletion::default(); 16];
        let mut taken = 0;
        while taken < 64 {
            let Ok(n) = self.cq.poll(&mut wc) else { break };
            if n == 0 {
                break;
            }
            taken += n;
            for w in &wc[..n] {
                self.completion(w);
            }
        }
        taken
    }

    fn completion(&mut self, w: &WorkCompletion) {
        let Some((q, epoch, send, s)) = queue::decode(w.wr_id) else {
            return;
        };
        let Some(hq) = self.queues.get_mut(q) else {
            return;
        };
        if hq.qp.is_none() || hq.epoch != epoch || usize::from(s) >= D {
            return;
        }
        if w.status != WcStatus::Success {
            hq.close();
            self.ended += 1;
            return;
        }
        if send {
            hq.slots[usize::from(s)].sent = true;
        } else {
            let at = hq.resp_at(s);
            let cqe = if w.byte_len as usize == CQE_LEN {
                Cqe::parse(hq.bytes(at, CQE_LEN))
            } else {
                None
            };
            let _ = hq.post_recv(q, s);
            if let Some(cqe) = cqe
                && let Some(slot) = hq
                    .slots
                    .iter_mut()
                    .find(|x| x.busy && x.cqe.is_none() && x.cid == cqe.cid)
            {
                slot.cqe = Some(cqe);
            }
        }
        // Keep-alives are the host's own: freed here.
        for k in 0..usize::from(hq.depth) {
            let x = hq.slots[k];
            if x.internal && x.sent && x.cqe.is_some() {
                hq.slots[k] = Slot::default();
            }
        }
    }

    fn keep_alive(&mut self) {
        let kato = u64::from(self.cfg.kato_ms) * 1000;
        let now = self.clock.now_us();
        if kato == 0 || self.queues[0].qp.is_none() || now < self.last_keep_alive + kato / 2 {
            return;
        }
        self.last_keep_alive = now;
        let sqe = Sqe::new(crate::wire::opcode::KEEP_ALIVE, 0);
        if let Ok(s) = self.submit(0, sqe, Data::None) {
            self.queues[0].slots[usize::from(s)].internal = true;
        }
    }

    /// Waits (running `poll` and `idle`) for the response of slot `s` on queue `qid`;
    /// copies the data into `out` (its first bytes).
    ///
    /// # Errors
    ///
    /// [`HostError::Status`] for an error status, [`HostError::NotConnected`] when the queue
    /// ends first, [`HostError::Timeout`].
    pub fn wait(
        &mut self,
        qid: u16,
        s: u16,
        out: &mut [u8],
        idle: &mut dyn FnMut(),
    ) -> Result<Cqe, HostError> {
        let deadline = self.deadline();
        loop {
            if !self.connected(qid) {
                return Err(HostError::NotConnected);
            }
            if let Some((cqe, data)) = self.take(qid, s) {
                let n = out.len().min(data.len());
                out[..n].copy_from_slice(&data[..n]);
                if !cqe.status.is_ok() {
                    return Err(HostError::Status(cqe.status));
                }
                return Ok(cqe);
            }
            self.poll();
            idle();
            if self.clock.now_us() > deadline {
                return Err(HostError::Timeout);
            }
        }
    }

    /// [`submit`](Self::submit) then [`wait`](Self::wait).
    ///
    /// # Errors
    ///
    /// As both.
    pub fn exec(
        &mut self,
        qid: u16,
        sqe: Sqe,
        data: Data<'_>,
        out: &mut [u8],
        idle: &mut dyn FnMut(),
    ) -> Result<Cqe, HostError> {
        let s = self.submit(qid, sqe, data)?;
        self.wait(qid, s, out, idle)
    }

    /// The host's NQN and the subsystem's, as the wire carries them.
    fn nqns(&self) -> Result<(Nqn, Nqn), HostError> {
        Ok((
            Nqn::new(self.cfg.hostnqn).ok_or(HostError::TooLarge)?,
            Nqn::new(self.cfg.subnqn).ok_or(HostError::TooLarge)?,
        ))
    }
}
