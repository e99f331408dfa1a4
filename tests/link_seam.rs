//! The link seam's in-place methods (`hal/src/link.rs`): `transmit_with`, `receive_with` and
//! `receive_if` as their default methods give them to a NIC that only copies, and as the
//! in-memory segment's NIC (`MemLink`, which models virtio-net's own buffers) gives them.

use std::collections::VecDeque;

use bareverbs::hal::{Link, LinkError};
use bareverbs_model::link::Segment;

/// A NIC with only the copying methods: the trait's defaults do the rest.
struct CopyOnly {
    out: Vec<Vec<u8>>,
    inbox: VecDeque<Vec<u8>>,
}

impl Link for CopyOnly {
    fn mac(&self) -> [u8; 6] {
        [2, 0, 0, 0, 0, 1]
    }
    fn max_frame(&self) -> usize {
        64
    }
    fn transmit(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        if frame.len() > 64 {
            return Err(LinkError::Size);
        }
        self.out.push(frame.to_vec());
        Ok(())
    }
    fn receive(&mut self, buf: &mut [u8]) -> Option<usize> {
        loop {
            let f = self.inbox.pop_front()?;
            if let Some(dst) = buf.get_mut(..f.len()) {
                dst.copy_from_slice(&f);
                return Some(f.len());
            }
        }
    }
}

#[test]
fn the_defaults_build_in_scratch_and_copy() {
    let mut l = CopyOnly {
        out: Vec::new(),
        inbox: VecDeque::new(),
    };
    let mut scratch = [0u8; 100];
    let sent = l.transmit_with(&mut scratch, |b| {
        assert_eq!(
            b.len(),
            64,
            "the scratch buffer, bounded by the largest frame"
        );
        b[..3].copy_from_slice(b"abc");
        Some(3)
    });
    assert_eq!(sent, Ok(Some(3)));
    assert_eq!(l.out, vec![b"abc".to_vec()]);
    assert_eq!(l.transmit_with(&mut scratch, |_| None), Ok(None));
    assert_eq!(
        l.transmit_with(&mut scratch, |_| Some(65)),
        Err(LinkError::Size),
        "longer than the buffer build had"
    );
    assert_eq!(
        l.transmit_with(&mut scratch, |_| Some(0)),
        Err(LinkError::Size)
    );
    assert_eq!(l.out.len(), 1, "nothing else was sent");

    l.inbox.push_back(b"first".to_vec());
    l.inbox.push_back(b"second".to_vec());
    l.inbox.push_back(b"third".to_vec());
    assert_eq!(
        l.receive_with(&mut scratch, |f| f.to_vec()),
        Some(b"first".to_vec())
    );
    let mut buf = [0u8; 16];
    assert_eq!(l.receive_if(&mut buf, |f| f == b"nope"), Some(None));
    assert_eq!(l.receive_if(&mut buf, |f| f == b"third"), Some(Some(5)));
    assert_eq!(&buf[..5], b"third");
    assert_eq!(l.receive_if(&mut buf, |_| true), None, "nothing left");
}

#[test]
fn a_memlink_builds_in_place_and_drops_refused_frames_uncopied() {
    let seg = Segment::new();
    let mut a = seg.attach([2, 0, 0, 0, 0, 0xa], 128);
    let mut b = seg.attach([2, 0, 0, 0, 0, 0xb], 128);
    let sent = a.transmit_with(&mut [], |buf| {
        assert_eq!(
            buf.len(),
            128,
            "the NIC's own buffer, the largest frame long"
        );
        buf[..4].copy_from_slice(b"ping");
        Some(4)
    });
    assert_eq!(sent, Ok(Some(4)));
    a.transmit(b"pong").unwrap();
    a.transmit(b"long frame").unwrap();
    assert_eq!(b.pending(), 3);

    let mut buf = [0xEEu8; 8];
    assert_eq!(b.receive_if(&mut buf, |f| f == b"nope"), Some(None));
    assert_eq!(buf, [0xEE; 8], "a refused frame is not copied");
    assert_eq!(b.receive_if(&mut buf, |f| f == b"pong"), Some(Some(4)));
    assert_eq!(&buf[..4], b"pong");
    assert_eq!(
        b.receive_if(&mut buf, |_| true),
        Some(None),
        "longer than the buffer: dropped, not cut"
    );
    assert_eq!(buf[4..], [0xEE; 4]);
    assert_eq!(b.receive_if(&mut buf, |_| true), None);

    // A declined build gives its transmit slot back.
    seg.set_tx_credit(a.id(), Some(1));
    assert_eq!(a.transmit_with(&mut [], |_| None), Ok(None));
    assert!(a.tx_ready(), "the credit is still there");
    a.transmit(b"x").unwrap();
    assert_eq!(a.transmit(b"y"), Err(LinkError::Busy));
    assert_eq!(
        a.transmit_with(&mut [], |_| panic!("built without a slot")),
        Err(LinkError::Busy)
    );
}
