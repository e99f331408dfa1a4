//! The host's commands: the controller's bring-up, and the admin and NVM commands.

use bareverbs::cm::Cm;
use bareverbs::hal::Clock;
use bareverbs::verbs::Provider;

use super::{ADMIN_DEPTH, Data, Host, HostError};
use crate::wire::fabrics::{CNTLID_DYNAMIC, CONNECT_DATA_LEN, Connect, ConnectData, Property};
use crate::wire::identify::{CtrlInfo, IDENTIFY_LEN, IdNs, cns, cntrltype};
use crate::wire::{Sqe, feature, le64, opcode, prop};

impl<'a, P: Provider, K: Clock, const Q: usize, const D: usize> Host<'a, '_, P, K, Q, D> {
    /// Connects: the admin queue and its Connect, CC.EN and CSTS.RDY, Identify Controller
    /// (its controller ID must be the Connect's), then for an I/O subsystem Number of Queues
    /// and each I/O queue with its Connect.
    ///
    /// # Errors
    ///
    /// [`HostError`]: a rejection, an error status, a timeout.
    pub fn connect<C: Clock, const N: usize>(
        &mut self,
        cm: &mut Cm<'a, P, C, N>,
        idle: &mut dyn FnMut(),
    ) -> Result<(), HostError> {
        self.open_queue(cm, 0, ADMIN_DEPTH, idle)?;
        self.cntlid = self.fabrics_connect(0, ADMIN_DEPTH, idle)?;
        self.last_keep_alive = self.clock.now_us();
        self.property_get(prop::CAP, true, idle)?;
        let cc = prop::CC_EN | (6 << 16) | (4 << 20);
        self.property_set(prop::CC, cc, idle)?;
        let deadline = self.deadline();
        while self.property_get(prop::CSTS, false, idle)? as u32 & prop::CSTS_RDY == 0 {
            if self.clock.now_us() > deadline {
                return Err(HostError::Timeout);
            }
        }
        let mut id = [0u8; IDENTIFY_LEN];
        self.identify(cns::CONTROLLER, 0, &mut id, idle)?;
        self.info = CtrlInfo::parse(&id).ok_or(HostError::Protocol)?;
        if self.info.cntlid != self.cntlid || self.info.icdoff != 0 {
            return Err(HostError::Protocol);
        }
        if self.info.cntrltype == cntrltype::DISCOVERY || self.cfg.io_queues == 0 {
            return Ok(());
        }
        let want = self.cfg.io_queues.min(Q as u16 - 1).max(1);
        let z = u32::from(want - 1);
        let mut s = Sqe::new(opcode::SET_FEATURES, 0);
        s.set_cdw(10, u32::from(feature::NUM_QUEUES));
        s.set_cdw(11, z | (z << 16));
        let cqe = self.exec(0, s, Data::None, &mut [], idle)?;
        let granted = ((cqe.result as u32 & 0xFFFF).min(cqe.result as u32 >> 16) + 1) as u16;
        self.io_granted = granted.min(want);
        let depth = self.cfg.io_depth.min(D as u16).min(self.info.maxcmd.max(2));
        for qid in 1..=self.io_granted {
            self.open_queue(cm, qid, depth, idle)?;
            let got = self.fabrics_connect(qid, depth, idle)?;
            if got != self.cntlid {
                return Err(HostError::Protocol);
            }
        }
        Ok(())
    }

    /// The Connect command on queue `qid`: returns the controller ID.
    fn fabrics_connect(
        &mut self,
        qid: u16,
        depth: u16,
        idle: &mut dyn FnMut(),
    ) -> Result<u16, HostError> {
        let (hostnqn, subnqn) = self.nqns()?;
        let c = Connect {
            recfmt: 0,
            qid,
            sqsize: depth - 1,
            cattr: 0,
            kato_ms: if qid == 0 { self.cfg.kato_ms } else { 0 },
        };
        let mut d = [0u8; CONNECT_DATA_LEN];
        ConnectData {
            hostid: self.cfg.hostid,
            cntlid: if qid == 0 {
                CNTLID_DYNAMIC
            } else {
                self.cntlid
            },
            subnqn,
            hostnqn,
        }
        .write(&mut d);
        let cqe = self.exec(qid, c.to_sqe(0), Data::Out(&d), &mut [], idle)?;
        Ok(cqe.result as u16)
    }

    /// Property Get of `offset` (8 bytes when `size8`).
    ///
    /// # Errors
    ///
    /// [`HostError`].
    pub fn property_get(
        &mut self,
        offset: u32,
        size8: bool,
        idle: &mut dyn FnMut(),
    ) -> Result<u64, HostError> {
        let p = Property {
            size8,
            offset,
            value: 0,
        };
        Ok(self
            .exec(0, p.to_sqe(0, false), Data::None, &mut [], idle)?
            .result)
    }

    /// Property Set of the 4-byte property at `offset`.
    ///
    /// # Errors
    ///
    /// [`HostError`].
    pub fn property_set(
        &mut self,
        offset: u32,
        value: u32,
        idle: &mut dyn FnMut(),
    ) -> Result<(), HostError> {
        let p = Property {
            size8: false,
            offset,
            value: u64::from(value),
        };
        self.exec(0, p.to_sqe(0, true), Data::None, &mut [], idle)?;
        Ok(())
    }

    /// Identify with `cns` for `nsid` into `out` (4096 bytes).
    ///
    /// # Errors
    ///
    /// [`HostError`].
    pub fn identify(
        &mut self,
        cns: u8,
        nsid: u32,
        out: &mut [u8],
        idle: &mut dyn FnMut(),
    ) -> Result<(), HostError> {
        let mut s = Sqe::new(opcode::IDENTIFY, 0);
        s.set_nsid(nsid);
        s.set_cdw(10, u32::from(cns));
        self.exec(0, s, Data::In(IDENTIFY_LEN as u32), out, idle)?;
        Ok(())
    }

    /// Identify Namespace `nsid`.
    ///
    /// # Errors
    ///
    /// [`HostError`].
    pub fn identify_namespace(
        &mut self,
        nsid: u32,
        idle: &mut dyn FnMut(),
    ) -> Result<IdNs, HostError> {
        let mut b = [0u8; IDENTIFY_LEN];
        self.identify(cns::NAMESPACE, nsid, &mut b, idle)?;
        IdNs::parse(&b).ok_or(HostError::Protocol)
    }

    /// Get Log Page `lid` from byte `offset`, `out.len()` bytes (a multiple of 4).
    ///
    /// # Errors
    ///
    /// [`HostError`].
    pub fn get_log_page(
        &mut self,
        lid: u8,
        offset: u64,
        out: &mut [u8],
        idle: &mut dyn FnMut(),
    ) -> Result<(), HostError> {
        let len = u32::try_from(out.len()).map_err(|_| HostError::TooLarge)?;
        if len < 4 || len % 4 != 0 {
            return Err(HostError::TooLarge);
        }
        let numd = len / 4 - 1;
        let mut s = Sqe::new(opcode::GET_LOG_PAGE, 0);
        s.set_cdw(10, u32::from(lid) | ((numd & 0xFFFF) << 16));
        s.set_cdw(11, numd >> 16);
        s.set_cdw(12, offset as u32);
        s.set_cdw(13, (offset >> 32) as u32);
        self.exec(0, s, Data::In(len), out, idle)?;
        Ok(())
    }

    /// The discovery log's `(generation, number of records)` and, in `out`, its first
    /// `out.len()` bytes (header included).
    ///
    /// # Errors
    ///
    /// [`HostError`].
    pub fn discovery_log(
        &mut self,
        out: &mut [u8],
        idle: &mut dyn FnMut(),
    ) -> Result<(u64, u64), HostError> {
        self.get_log_page(crate::wire::log::DISCOVERY, 0, out, idle)?;
        Ok((le64(out, 0), le64(out, 8)))
    }

    /// Reads `nlb` blocks from `slba` of namespace `nsid` on I/O queue `qid` into `buf`
    /// (`nlb` × block size bytes).
    ///
    /// # Errors
    ///
    /// [`HostError`].
    pub fn read(
        &mut self,
        qid: u16,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: &mut [u8],
        idle: &mut dyn FnMut(),
    ) -> Result<(), HostError> {
        let len = u32::try_from(buf.len()).map_err(|_| HostError::TooLarge)?;
        let s = Sqe::rw(opcode::READ, 0, nsid, slba, nlb);
        self.exec(qid, s, Data::In(len), buf, idle)?;
        Ok(())
    }

    /// Writes `buf` (`nlb` blocks) at `slba` of namespace `nsid` on I/O queue `qid`.
    ///
    /// # Errors
    ///
    /// [`HostError`].
    pub fn write(
        &mut self,
        qid: u16,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: &[u8],
        idle: &mut dyn FnMut(),
    ) -> Result<(), HostError> {
        let s = Sqe::rw(opcode::WRITE, 0, nsid, slba, nlb);
        self.exec(qid, s, Data::Out(buf), &mut [], idle)?;
        Ok(())
    }

    /// Write Zeroes of `nlb` blocks at `slba`.
    ///
    /// # Errors
    ///
    /// [`HostError`].
    pub fn write_zeroes(
        &mut self,
        qid: u16,
        nsid: u32,
        slba: u64,
        nlb: u32,
        idle: &mut dyn FnMut(),
    ) -> Result<(), HostError> {
        let s = Sqe::rw(opcode::WRITE_ZEROES, 0, nsid, slba, nlb);
        self.exec(qid, s, Data::None, &mut [], idle)?;
        Ok(())
    }

    /// Flush of namespace `nsid`.
    ///
    /// # Errors
    ///
    /// [`HostError`].
    pub fn flush(&mut self, qid: u16, nsid: u32, idle: &mut dyn FnMut()) -> Result<(), HostError> {
        let mut s = Sqe::new(opcode::FLUSH, 0);
        s.set_nsid(nsid);
        self.exec(qid, s, Data::None, &mut [], idle)?;
        Ok(())
    }

    /// Shuts the controller down (CC.SHN, then CSTS.SHST) and disconnects every queue, I/O
    /// queues first.
    ///
    /// # Errors
    ///
    /// [`HostError`] from the shutdown (the queues are disconnected anyway).
    pub fn disconnect<C: Clock, const N: usize>(
        &mut self,
        cm: &mut Cm<'a, P, C, N>,
        idle: &mut dyn FnMut(),
    ) -> Result<(), HostError> {
        for qid in (1..Q as u16).rev() {
            self.close_queue(cm, qid);
        }
        let shut = (|| {
            self.property_set(prop::CC, (1 << 14) | (6 << 16) | (4 << 20), idle)?;
            let st = self.property_get(prop::CSTS, false, idle)? as u32;
            if st & prop::CSTS_SHST_DONE == 0 {
                return Err(HostError::Protocol);
            }
            Ok(())
        })();
        self.close_queue(cm, 0);
        self.io_granted = 0;
        shut
    }
}
