//! The benchmarks' wire: an in-memory link between two devices that costs what the HAL's
//! virtio-net link costs the driver: each frame built in place in a transmit buffer
//! (`Link::transmit_with`), looked at in place and copied once out of a receive buffer into
//! the device's (`Link::receive_if`), with no allocation (the model's `MemLink` allocates per
//! frame: not this). Shared by `tests/bench/rxe.rs` and `nvmf/benches/target.rs`.

use std::cell::RefCell;
use std::rc::Rc as Shared;

use bareverbs::device::rxe::FRAME;
use bareverbs::hal::{Link, LinkError};

/// One direction of the wire: a ring of `SLOTS` frame buffers, as a NIC's descriptor ring.
pub struct Ring<const SLOTS: usize> {
    buf: Vec<u8>,
    len: [usize; SLOTS],
    head: usize,
    /// Frames transmitted so far (the next one's slot, modulo `SLOTS`).
    pub tail: usize,
}

/// One end of the wire: transmits into `tx`, receives from `rx`.
pub struct Wire<const SLOTS: usize> {
    mac: [u8; 6],
    tx: Shared<RefCell<Ring<SLOTS>>>,
    rx: Shared<RefCell<Ring<SLOTS>>>,
}

/// The two ends of a wire (MACs 52:54:00:00:00:02 and :03) and its two directions, A to B
/// first.
#[allow(clippy::type_complexity)]
pub fn wire<const SLOTS: usize>() -> (Wire<SLOTS>, Wire<SLOTS>, [Shared<RefCell<Ring<SLOTS>>>; 2]) {
    let ring = || {
        Shared::new(RefCell::new(Ring {
            buf: vec![0; SLOTS * FRAME],
            len: [0; SLOTS],
            head: 0,
            tail: 0,
        }))
    };
    let (ab, ba) = (ring(), ring());
    let a = Wire {
        mac: [0x52, 0x54, 0, 0, 0, 2],
        tx: ab.clone(),
        rx: ba.clone(),
    };
    let b = Wire {
        mac: [0x52, 0x54, 0, 0, 0, 3],
        tx: ba.clone(),
        rx: ab.clone(),
    };
    (a, b, [ab, ba])
}

impl<const SLOTS: usize> Link for Wire<SLOTS> {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn max_frame(&self) -> usize {
        FRAME
    }

    fn transmit(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        if frame.is_empty() || frame.len() > FRAME {
            return Err(LinkError::Size);
        }
        let mut r = self.tx.borrow_mut();
        if r.tail - r.head == SLOTS {
            return Err(LinkError::Busy);
        }
        let slot = r.tail % SLOTS;
        r.buf[slot * FRAME..][..frame.len()].copy_from_slice(frame);
        r.len[slot] = frame.len();
        r.tail += 1;
        Ok(())
    }

    fn tx_ready(&mut self) -> bool {
        let r = self.tx.borrow();
        r.tail - r.head < SLOTS
    }

    fn receive(&mut self, buf: &mut [u8]) -> Option<usize> {
        let mut r = self.rx.borrow_mut();
        while r.head != r.tail {
            let slot = r.head % SLOTS;
            r.head += 1;
            let n = r.len[slot];
            if n <= buf.len() {
                buf[..n].copy_from_slice(&r.buf[slot * FRAME..][..n]);
                return Some(n);
            }
        }
        None
    }

    /// Built in the transmit slot, as the virtio-net link builds in its transmit buffer.
    #[inline]
    fn transmit_with<F>(&mut self, _: &mut [u8], build: F) -> Result<Option<usize>, LinkError>
    where
        F: FnOnce(&mut [u8]) -> Option<usize>,
    {
        let mut r = self.tx.borrow_mut();
        if r.tail - r.head == SLOTS {
            return Err(LinkError::Busy);
        }
        let slot = r.tail % SLOTS;
        let Some(n) = build(&mut r.buf[slot * FRAME..][..FRAME]) else {
            return Ok(None);
        };
        if n == 0 || n > FRAME {
            return Err(LinkError::Size);
        }
        r.len[slot] = n;
        r.tail += 1;
        Ok(Some(n))
    }

    /// Looked at in the receive slot, copied only when taken, as the virtio-net link does.
    #[inline]
    fn receive_with<T, F>(&mut self, _: &mut [u8], f: F) -> Option<T>
    where
        F: FnOnce(&[u8]) -> T,
    {
        let mut r = self.rx.borrow_mut();
        if r.head == r.tail {
            return None;
        }
        let slot = r.head % SLOTS;
        r.head += 1;
        let n = r.len[slot];
        Some(f(&r.buf[slot * FRAME..][..n]))
    }

    #[inline]
    fn receive_if<F>(&mut self, buf: &mut [u8], want: F) -> Option<Option<usize>>
    where
        F: FnOnce(&[u8]) -> bool,
    {
        self.receive_with(&mut [], |frame| bareverbs::hal::copy_if(frame, buf, want))
    }
}
