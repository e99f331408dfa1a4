//! The command channel: one command slot and one response slot, one command at a time.
//!
//! Protocol (L-CMD `pvrdma_cmd_post`, Q-MAIN/Q-CMD; `docs/pvrdma.md` §5.1): write the
//! request, barrier, write 0 to REQUEST; the device runs the command (QEMU: synchronously
//! inside that write), writes the response header (echoed cookie, ack, err) and sets ERR to 0
//! or a negative errno. ERR = 0xFFFF means it was rejected before running, with no response.
//! The driver trusts a status only when ERR and the header's `err` byte agree.

use bareverbs_hal::{Hal, Mmio};

use super::abi::{CMD_SLOT_SIZE, CmdHdr, RESP_SLOT_OFFSET, RESP_SLOT_SIZE, RespHdr, opcode};
use super::regs::{ERR_REJECTED, reg};
use crate::dma::{Dma, Pod};
use crate::error::{DeviceStatus, Error, Fault, Op, Result};

/// A request: a Pod struct starting with [`CmdHdr`].
pub(crate) trait Request: Pod {
    fn hdr_mut(&mut self) -> &mut CmdHdr;
}

/// A response: a Pod struct starting with [`RespHdr`].
pub(crate) trait Response: Pod {}

macro_rules! messages {
    (requests: $($q:ty),*; responses: $($r:ty),*) => {
        $( impl Request for $q { fn hdr_mut(&mut self) -> &mut CmdHdr { &mut self.hdr } } )*
        $( impl Response for $r {} )*
    };
}
use super::abi::*;
messages!(
    requests: QueryPort, QueryPkey, CreatePd, DestroyHandle, CreateCq, CreateBind, DestroyBind,
        CreateQp, ModifyQp, QueryQp, CreateSrq, CreateMr, ResizeCq, ModifySrq, QuerySrq;
    responses: RespHdr, QueryPortResp, QueryPkeyResp, CreatePdResp, CreateCqResp,
        CreateQpRespV1, CreateQpRespV2, QueryQpResp, CreateSrqResp, CreateMrResp, ResizeCqResp,
        QuerySrqResp
);

/// The slots (one DMA page: command at 0, response at [`RESP_SLOT_OFFSET`]) and the cookie;
/// and what the driver learnt of how the device answers.
pub(crate) struct Channel<H: Hal> {
    page: Dma<H>,
    cookie: u64,
    poll_limit: u32,
    /// Whether the device runs another command's handler for MODIFY_SRQ/QUERY_SRQ (QEMU's
    /// table swaps them, `docs/pvrdma.md` §5.2): seen once, remembered.
    pub(crate) srq_swapped: bool,
}

impl<H: Hal> Channel<H> {
    pub(crate) fn new(hal: &H, poll_limit: u32) -> Result<Self> {
        Ok(Channel {
            page: Dma::new(hal, 1)?,
            cookie: 0,
            poll_limit: poll_limit.max(1),
            srq_swapped: false,
        })
    }

    /// Physical address of the command slot.
    pub(crate) fn cmd_paddr(&self) -> u64 {
        self.page.paddr()
    }

    /// Physical address of the response slot.
    pub(crate) fn resp_paddr(&self) -> u64 {
        self.page.paddr() + RESP_SLOT_OFFSET as u64
    }

    /// Runs one command and returns its response, checked: the ack names this command, the
    /// cookie is echoed, ERR is 0. Every wait is bounded by the poll limit. `fill` writes the
    /// request in the command slot ([`Self::slot`]). Only the filling and the copy out depend on
    /// the message types: the protocol is compiled once ([`Self::run`]).
    #[inline]
    pub(crate) fn exec<Q: Request, R: Response>(
        &mut self,
        regs: &impl Mmio,
        (op, code): (Op, u32),
        fill: impl FnOnce(&mut Q),
    ) -> Result<R> {
        self.command(regs, (op, code), fill)?;
        Ok(self.answer())
    }

    /// Runs one command whose response carries nothing beyond its header (checked as
    /// [`Self::exec`] checks it).
    #[inline]
    pub(crate) fn command<Q: Request>(
        &mut self,
        regs: &impl Mmio,
        (op, code): (Op, u32),
        fill: impl FnOnce(&mut Q),
    ) -> Result<()> {
        fill(self.slot(code));
        self.run(regs, op, code)
    }

    /// Starts command `code` in place: the command slot cleared, its header written, and the
    /// request in the slot handed out to be filled (fields left alone stay zero), then run by
    /// [`Self::run`]. No request is built elsewhere and copied.
    #[inline]
    pub(crate) fn slot<Q: Request>(&mut self, code: u32) -> &mut Q {
        const { assert!(size_of::<Q>() <= CMD_SLOT_SIZE && align_of::<Q>() <= 8) };
        let hdr = self.begin(code);
        // The slot: the page's first CMD_SLOT_SIZE bytes (page-aligned, `Dma::new`), zeroed by
        // `begin`; the device only reads it, after `run`'s fence and doorbell.
        // SAFETY: Q fits the slot and is aligned for it (checked above), is valid as zeros
        // (Pod), and the borrow of `self` keeps every other use of the page out meanwhile.
        let req = unsafe { &mut *self.page.base().as_ptr().cast::<Q>() };
        *req.hdr_mut() = hdr;
        req
    }

    /// The message-independent part of [`Self::slot`]: a new cookie, the command slot cleared,
    /// the header for command `code`.
    #[inline(never)]
    fn begin(&mut self, code: u32) -> CmdHdr {
        self.cookie = self.cookie.wrapping_add(1);
        self.page.zero(0, CMD_SLOT_SIZE);
        CmdHdr {
            response: self.cookie,
            cmd: code,
            reserved: 0,
        }
    }

    /// The response slot, as the answer to the command [`Self::run`] completed.
    #[inline]
    pub(crate) fn answer<R: Response>(&self) -> R {
        self.page.get(RESP_SLOT_OFFSET)
    }

    /// The protocol of a command already written to the command slot.
    #[inline(never)]
    pub(crate) fn run(&mut self, regs: &impl Mmio, op: Op, code: u32) -> Result<()> {
        // A zero ack marks "no response yet".
        self.page.zero(RESP_SLOT_OFFSET, RESP_SLOT_SIZE);
        // The request and the cleared response slot must be in memory before the device is told
        // to read the one and write the other.
        self.page.hal().publish_barrier();
        regs.write32(reg::REQUEST, 0);

        if regs.read32(reg::ERR) == ERR_REJECTED {
            return Err(Error::Device {
                op,
                status: DeviceStatus::Rejected,
            });
        }
        let mut spins = 0;
        let hdr = loop {
            let hdr: RespHdr = self.page.read(RESP_SLOT_OFFSET);
            if hdr.ack != 0 {
                break hdr;
            }
            spins += 1;
            if spins >= self.poll_limit {
                return Err(Error::Timeout { op });
            }
            core::hint::spin_loop();
        };
        // The payload is read after the ack that announced it.
        self.page.hal().consume_barrier();
        let err = regs.read32(reg::ERR);
        let errno = match self.status(hdr, err, code) {
            Ok(errno) => errno,
            Err(fault) => return Err(Error::Protocol { op, fault }),
        };
        if errno != 0 {
            return Err(Error::from_errno(op, errno));
        }
        Ok(())
    }

    /// The errno of the answer `hdr` with ERR = `err` to command `code` (0: success), or what
    /// is wrong with it.
    fn status(&self, hdr: RespHdr, err: u32, code: u32) -> Result<u32, Fault> {
        let expected = opcode::ACK_BIT | code;
        if hdr.ack != expected {
            let found = hdr.ack;
            return Err(Fault::Ack { expected, found });
        }
        if hdr.response != self.cookie {
            return Err(Fault::Cookie);
        }
        // ERR holds a negative errno in two's complement, except where QEMU passes a host
        // verbs call's return through unchanged: a positive errno (ibv_query_qp's EOPNOTSUPP
        // was seen as 95 on QEMU over rxe).
        let (errno, negative) = match err {
            0 => (0, false),
            1..=4095 => (err, false),
            _ if err.wrapping_neg() <= 4095 => (err.wrapping_neg(), true),
            _ => {
                let value = u64::from(err);
                return Err(Fault::Value {
                    field: &"ERR",
                    value,
                });
            }
        };
        // The header's own error byte tells the same story (Q-CMD `pvrdma_exec_cmd`): the
        // negated return when it is negative (errno, truncated to a byte), else 0. A
        // passed-through positive errno may be echoed there too. Any other value means one of
        // the two is wrong, and nothing says which: the answer is not used.
        let agrees = match (errno, negative) {
            (0, _) => hdr.err == 0,
            (e, true) => hdr.err == e as u8,
            (e, false) => hdr.err == 0 || hdr.err == e as u8,
        };
        if !agrees {
            let (register, header) = (err, hdr.err);
            return Err(Fault::StatusMismatch { register, header });
        }
        Ok(errno)
    }
}
