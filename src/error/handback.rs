//! The hand-back results' errors, taken by `?` without the object.

use super::Error;

/// The error of a hand-back result, without the object handed back: what `?` uses where the
/// caller does not want the object.
///
/// The calls that consume an object — a queue pair's transitions ([`init`], [`rtr`], [`rts`],
/// [`handshake`]), the safe path's posts ([`post_send`], [`post_recv`]), `destroy` —
/// hand it back with the error, `Err((object, error))`, so a caller may try again or tear it
/// down its own way. A caller that does not want it writes `?`: the object is dropped here,
/// as its `Drop` does (a queue pair destroyed, a buffer back in its pool), and the error goes
/// on. A function whose error type is not [`Error`] (a `Box<dyn Error>`, say) takes it with
/// `.map_err(Error::from)?`; `unwrap` and `expect` take a hand-back as it is (the queue pair
/// and the buffer print their number and state).
///
/// ```
/// # include!("../doctests.rs");
/// use bareverbs::verbs::*;
/// fn bring_up<'a, P: Provider>(
///     qp: QueuePair<'a, P, Rc, Reset>,
/// ) -> bareverbs::Result<QueuePair<'a, P, Rc, Init>> {
///     Ok(qp.init(&ConnectedInit::default())?) // the QP is dropped if the transition fails
/// }
/// # fn main() -> bareverbs::Result<()> {
/// # let (_machine, ctx) = pvrdma()?;
/// # let pd = ctx.alloc_pd()?;
/// # let cq = ctx.create_cq(16)?;
/// let qp = bring_up(pd.qp_builder(&cq, &cq).build::<Rc>()?)?;
/// // Where the object is wanted back, the tuple is still there to match.
/// match qp.rtr(&ConnectedRtr::new(0x11, 0, AddressVector::new(Gid::default(), 9))) {
///     Ok(_) => unreachable!("GID index 9 is not bound"),
///     Err((qp, e)) => {
///         assert!(matches!(e, bareverbs::Error::MissingAttribute { .. }));
///         drop(qp); // or fix the path and try again
///     }
/// }
/// # Ok(()) }
/// ```
///
/// [`init`]: crate::verbs::QueuePair::init
/// [`rtr`]: crate::verbs::QueuePair::rtr
/// [`rts`]: crate::verbs::QueuePair::rts
/// [`handshake`]: crate::verbs::QueuePair::handshake
/// [`post_send`]: crate::verbs::QueuePair::post_send
/// [`post_recv`]: crate::verbs::QueuePair::post_recv
impl<T> From<(T, Error)> for Error {
    fn from((object, e): (T, Error)) -> Self {
        drop(object);
        e
    }
}
