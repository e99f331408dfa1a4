//! Links the kernel binary freestanding (the platform's link settings).
const LINKER_SCRIPT: &str = "../linker/unikernel.ld";
include!("../platform/link.rs");
