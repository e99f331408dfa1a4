//! RESIZE_CQ (`docs/pvrdma.md` §5.2, §5.3): the request names the CQ and the new size,
//! and nothing else — no ring pages. QEMU has no handler (ERR = 0xFFFF, no response).

use bareverbs_hal::Hal;

use super::Pvrdma;
use super::abi::{self, opcode};
use super::cq::Cq;
use crate::error::{DeviceStatus, Error, Fault, Feature, Op, Param, Result, Unsupported};

impl<H: Hal> Pvrdma<H> {
    /// `ibv_resize_cq`: afterwards the CQ has at least `entries`. A size below the CQEs its
    /// queue pairs keep reserved is refused; one the CQ already has needs no command; a larger
    /// one is asked of the device with RESIZE_CQ, which QEMU does not implement
    /// ([`Feature::ResizeCq`] unsupported).
    ///
    /// A device that accepted would have to grow the CQ's ring, which RESIZE_CQ gives it no
    /// pages for: such an answer is not used (a protocol fault; the CQ keeps its size).
    pub(crate) fn resize_cq_impl(&self, cq: &mut Cq<H>, entries: u32) -> Result<()> {
        let op = Op::ResizeCq;
        let max = self.max_cq_entries();
        if entries > max {
            return Err(Error::invalid(Param::CqEntries, entries, max));
        }
        let reserved = cq.reserved();
        if entries < reserved {
            return Err(Error::invalid(Param::CqEntriesInUse, reserved, entries));
        }
        if entries <= cq.entries {
            return Ok(());
        }
        let fill =
            |r: &mut abi::ResizeCq| (r.cq_handle, r.cqe) = (cq.handle, entries.next_power_of_two());
        let r: abi::ResizeCqResp = match self.exec((op, opcode::RESIZE_CQ), fill) {
            Ok(r) => r,
            Err(Error::Device {
                status: DeviceStatus::Rejected,
                ..
            }) => return Err(Error::Unsupported(Unsupported::Feature(Feature::ResizeCq))),
            Err(e) => return Err(e),
        };
        log::warn!("bareverbs: RESIZE_CQ accepted without ring pages: not used");
        Err(Error::Protocol {
            op,
            fault: Fault::Value {
                field: &"RESIZE_CQ cqe (no ring pages to grow into)",
                value: u64::from(r.cqe),
            },
        })
    }
}
