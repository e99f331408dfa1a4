//! QEMU's GSI QP (QP1) and the MAD multiplexer it needs, rdmacm-mux (`docs/pvrdma.md`, "The
//! GSI QP and rdmacm-mux"), as QEMU 7.2–9.0 run them:
//!
//! - QEMU has no host QP for QP1. A send WQE must have exactly two SGEs (the MAD header and
//!   the rest), at most 256 bytes together, read at their addresses as guest-physical (no
//!   lkey is looked at); anything else completes with a general error. The MAD goes to the
//!   mux with the sender's GID (the one the WQE's GID index names) and *not* the destination
//!   the WQE names: QEMU addresses it to that same GID, so it loops back through the host's
//!   device to the mux, which hands it to the guest that owns the connection.
//! - The mux routes by the message: a REQ by the interface ID of its primary remote GID, a
//!   SIDR_REQ by the 8 bytes 44 bytes into its body (rdma_cm's IPv4 destination), each looked
//!   up among the GIDs the guests registered (binding a GID registers it), exactly and then
//!   with `ffff` put in bytes 2–3 (an IPv4-mapped GID); a REP, REJ, DREQ, DREP or RTU by its
//!   remote communication ID, a SIDR_REP by its request ID, each looked up among the IDs the
//!   guests sent first in a REQ, DREQ, SIDR_REQ, REP or DREP. An ID of 0 goes where the last
//!   MAD went. Every other attribute (MRA, ClassPortInfo, …) is dropped, as is a MAD of 24
//!   bytes or fewer.
//! - A guest's receive must be one SGE of at least 296 bytes (QEMU fails others when they are
//!   posted; the model, when a MAD would land in them). QEMU zeroes the buffer, writes a GRH
//!   that has only the payload length, the sender's GID as source and `0::<interface ID>` as
//!   destination, and the MAD after it; the completion counts **the MAD only** (not the 40
//!   bytes before it), with the GRH flag and source QP 0. With no receive posted, the MAD is
//!   dropped.
//!
//! Machines attached to one [`Mux`] are guests of one host. A guest's MADs reach only them:
//! QEMU never puts one on the wire towards another host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::{Cqe, ST_OK};
use crate::device::{Ctx, Device, QPT_GSI};
use crate::{Inner, Model};

/// Bytes of a MAD, at most (QEMU's `RDMA_MAX_PRIVATE_DATA`).
const MAD_MAX: usize = 256;
/// The GRH QEMU writes before a received MAD.
const GRH: usize = 40;
/// The MAD header before a CM message's body.
const HDR: usize = 24;
/// IBV_WC_GENERAL_ERR.
const ST_GENERAL_ERR: u32 = 21;

const REQ: u16 = 0x10;
const REJ: u16 = 0x12;
const REP: u16 = 0x13;
const RTU: u16 = 0x14;
const DREQ: u16 = 0x15;
const DREP: u16 = 0x16;
const SIDR_REQ: u16 = 0x17;
const SIDR_REP: u16 = 0x18;

/// rdmacm-mux with the host device under it: the machines attached to it exchange MADs on
/// their GSI QPs. Clones share it.
#[derive(Clone, Default)]
pub struct Mux {
    st: Arc<Mutex<MuxState>>,
}

#[derive(Default)]
struct MuxState {
    /// The attached machines, by port number.
    hosts: Vec<Weak<Mutex<Inner>>>,
    /// Communication ID → (port, the sender GID's interface ID).
    comm: HashMap<[u8; 4], (usize, [u8; 8])>,
    /// Where the last MAD went (an ID of 0 goes there too).
    last: Option<(usize, [u8; 8])>,
    relayed: u64,
    dropped: u64,
}

/// A machine's place on a mux.
#[derive(Clone)]
pub(crate) struct Port {
    mux: Mux,
    id: usize,
}

impl Mux {
    /// A mux with no machine attached.
    pub fn new() -> Self {
        Mux::default()
    }

    /// MADs handed to a guest so far.
    pub fn relayed(&self) -> u64 {
        self.st.lock().expect("mux").relayed
    }

    /// MADs dropped so far (no route, an attribute the mux does not route, no receive posted,
    /// a receive too small).
    pub fn dropped(&self) -> u64 {
        self.st.lock().expect("mux").dropped
    }

    fn drop_one(&self) {
        self.st.lock().expect("mux").dropped += 1;
    }
}

impl Model {
    /// Connects this machine's device to `mux` (QEMU's `mad-chardev`): its GSI QP's MADs go
    /// through it, to it and to the other machines attached.
    pub fn attach_mux(&self, mux: &Mux) {
        let id = {
            let mut st = mux.st.lock().expect("mux");
            st.hosts.push(Arc::downgrade(&self.inner));
            st.hosts.len() - 1
        };
        self.lock().dev.mux = Some(Port {
            mux: mux.clone(),
            id,
        });
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn bytes<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(s) = b.get(at..at + N) {
        out.copy_from_slice(s);
    }
    out
}

/// Whether `gids` holds a GID with interface ID `ifid`.
fn owns(gids: &[Option<[u8; 16]>], ifid: &[u8; 8]) -> bool {
    gids.iter().flatten().any(|g| g[8..] == ifid[..])
}

/// Runs a GSI send WQE of `dev`: the MAD relayed through the mux. The completion status.
pub(super) fn send(
    dev: &mut Device,
    ctx: &mut Ctx<'_>,
    hdr: &[u8],
    sges: &[(u64, u32, u32)],
) -> u32 {
    let [(a0, l0, _), (a1, l1, _)] = sges else {
        return ST_GENERAL_ERR;
    };
    let len = *l0 as usize + *l1 as usize;
    if len > MAD_MAX {
        return ST_GENERAL_ERR;
    }
    let Some(sgid) = dev.gids.get(usize::from(hdr[0x41])).copied().flatten() else {
        return ST_GENERAL_ERR;
    };
    let (Some(h), Some(d)) = (
        ctx.mem.read(*a0, *l0 as usize),
        ctx.mem.read(*a1, *l1 as usize),
    ) else {
        return ST_GENERAL_ERR;
    };
    let mad = [h, d].concat();
    let Some(port) = dev.mux.clone() else {
        return ST_OK; // no mux: the MAD goes nowhere
    };
    match route(&port, dev, &sgid, &mad) {
        Some((to, ifid)) if to == port.id => deliver(dev, ctx, &port.mux, &sgid, &ifid, &mad),
        Some((to, ifid)) => {
            let host = port.mux.st.lock().expect("mux").hosts[to].upgrade();
            match host {
                Some(host) => deliver_to(&host, &port.mux, &sgid, &ifid, &mad),
                None => port.mux.drop_one(),
            }
        }
        None => port.mux.drop_one(),
    }
    ST_OK
}

/// The mux's choice for a MAD sent by port `from` (whose device is `dev`) from `sgid`: the
/// port it goes to and the interface ID written as the GRH's destination.
fn route(from: &Port, dev: &Device, sgid: &[u8; 16], mad: &[u8]) -> Option<(usize, [u8; 8])> {
    if mad.len() <= HDR {
        return None;
    }
    let attr = be16(mad, 16);
    let sender: [u8; 8] = bytes(sgid, 8);
    let hosts = {
        let mut st = from.mux.st.lock().expect("mux");
        if matches!(attr, REQ | DREQ | SIDR_REQ | REP | DREP) {
            st.comm.insert(bytes(mad, HDR), (from.id, sender));
        }
        st.hosts.clone()
    };
    let by_ifid = |mut ifid: [u8; 8]| {
        for _ in 0..2 {
            for (i, h) in hosts.iter().enumerate() {
                let found = if i == from.id {
                    owns(&dev.gids, &ifid)
                } else {
                    h.upgrade()
                        .is_some_and(|h| owns(&h.lock().expect("machine").dev.gids, &ifid))
                };
                if found {
                    return Some((i, ifid));
                }
            }
            ifid[2..4].copy_from_slice(&[0xFF, 0xFF]); // then as IPv4
        }
        None
    };
    let by_comm = |id: [u8; 4]| {
        let st = from.mux.st.lock().expect("mux");
        if id == [0; 4] {
            return st.last;
        }
        st.comm.get(&id).copied()
    };
    let to = match attr {
        REQ if mad.len() >= HDR + 80 + 8 => by_ifid(bytes(mad, HDR + 80)),
        SIDR_REQ if mad.len() >= HDR + 44 + 8 => by_ifid(bytes(mad, HDR + 44)),
        REP | REJ | DREQ | DREP | RTU if mad.len() >= HDR + 4 => by_comm(bytes(mad, HDR + 4)),
        SIDR_REP if mad.len() >= HDR + 4 => by_comm(bytes(mad, HDR)),
        _ => None,
    }?;
    from.mux.st.lock().expect("mux").last = Some(to);
    Some(to)
}

/// Delivers a MAD to another machine's device, as its QEMU would from the mux's socket.
fn deliver_to(host: &Mutex<Inner>, mux: &Mux, sgid: &[u8; 16], ifid: &[u8; 8], mad: &[u8]) {
    let mut g = host.lock().expect("machine");
    let Inner {
        cfg,
        mem,
        pci,
        dev,
        violations,
        liar,
    } = &mut *g;
    let mut ctx = Ctx {
        cfg,
        mem,
        violations,
        liar,
        bus_master: pci.pvrdma_bus_master(),
        msix_live: pci.msix_unmasked(),
    };
    deliver(dev, &mut ctx, mux, sgid, ifid, mad);
    g.deliver_interrupts();
}

/// A MAD from `sgid` landing in the next receive of `dev`'s GSI QP.
fn deliver(
    dev: &mut Device,
    ctx: &mut Ctx<'_>,
    mux: &Mux,
    sgid: &[u8; 16],
    ifid: &[u8; 8],
    mad: &[u8],
) {
    let Some(i) = dev
        .qps
        .iter()
        .position(|q| q.as_ref().is_some_and(|q| q.qp_type == QPT_GSI))
    else {
        return mux.drop_one();
    };
    let Some(r) = dev.pop_recv(ctx, i) else {
        return mux.drop_one(); // QEMU: "No more free MADs buffers"
    };
    let qp = dev.qps[i].as_ref().expect("indexed");
    let (qpn, rcq) = (qp.qpn, qp.rcq);
    let mut cqe = Cqe {
        wr_id: r.wr_id,
        qp: qpn,
        opcode: 128,
        status: ST_GENERAL_ERR,
        byte_len: 0,
        imm: 0,
        src_qp: 0,
        flags: 0,
    };
    match r.sges[..] {
        [(addr, len, _)] if len as usize >= MAD_MAX + GRH && len as usize >= mad.len() + GRH => {
            let mut buf = vec![0u8; len as usize];
            buf[4..6].copy_from_slice(&(mad.len() as u16).to_be_bytes());
            buf[8..24].copy_from_slice(sgid);
            buf[32..40].copy_from_slice(ifid);
            buf[GRH..GRH + mad.len()].copy_from_slice(mad);
            if ctx.mem.write(addr, &buf) {
                (cqe.status, cqe.byte_len, cqe.flags) = (ST_OK, mad.len() as u32, 1);
                mux.st.lock().expect("mux").relayed += 1;
            }
        }
        _ => mux.drop_one(),
    }
    dev.post_cqe(ctx, rcq, cqe);
}
