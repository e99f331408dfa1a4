//! A queue pair's place in the device's busy set (`Rxe::busy`): words of 64 table slots,
//! then one word for the GSI QP. Apart from the tables and the QP state, which both name it.

use super::MAX_QP;

/// Words of the busy set that hold the table's slots: slot `i` is bit `i % 64` of word
/// `i / 64`.
pub(crate) const SLOT_WORDS: usize = MAX_QP.div_ceil(64);
/// Words of the busy set: the slots', then one for the GSI QP.
pub(crate) const BUSY_WORDS: usize = SLOT_WORDS + 1;

const _: () = assert!(
    MAX_QP.is_multiple_of(64),
    "the busy set's slot words are full: a rotation visits every bit of them"
);

/// A queue pair's place in the device's busy set: a word and the bit in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BusyBit {
    /// The word (below [`BUSY_WORDS`]).
    pub(crate) word: usize,
    /// The bit in it (0 for a number the device never gives).
    pub(crate) mask: u64,
}

/// The GSI QP's place in the busy set: the word after the slots'.
pub(crate) const GSI_BIT: BusyBit = BusyBit {
    word: SLOT_WORDS,
    mask: 1,
};
