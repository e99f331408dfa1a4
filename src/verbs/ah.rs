//! Address handles (`ibv_ah`): a UD destination prepared once and named by every send to it.

use super::{AddressVector, ProtectionDomain, Provider};
use crate::error::{Error, Param, Result};

/// A prepared UD destination. It borrows its protection domain.
pub struct AddressHandle<'a, P: Provider> {
    raw: P::Ah,
    _pd: core::marker::PhantomData<&'a P::Pd>,
}

impl<'c, P: Provider> ProtectionDomain<'c, P> {
    /// Prepares an address handle for `av` (`ibv_create_ah`); the source GID index must name
    /// a GID of the port's table.
    pub fn create_ah(&self, av: &AddressVector) -> Result<AddressHandle<'_, P>> {
        if av.flow_label > 0xF_FFFF {
            return Err(Error::invalid(Param::FlowLabel, av.flow_label, 0xF_FFFFu32));
        }
        let raw = self.context().provider().create_ah(self.raw(), av)?;
        Ok(AddressHandle {
            raw,
            _pd: core::marker::PhantomData,
        })
    }
}

impl<P: Provider> AddressHandle<'_, P> {
    /// The provider's object.
    pub fn raw(&self) -> &P::Ah {
        &self.raw
    }
}
