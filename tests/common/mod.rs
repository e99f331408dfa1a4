//! Shared helpers of the firmware-style tests: a model machine and a driver brought up on it.
#![allow(dead_code)] // each test binary uses a different subset

use bareverbs::Context;
use bareverbs::device::pvrdma::{Config, Opcodes, Pvrdma};
use bareverbs::verbs::{
    AccessFlags, AddressVector, ConnectedInit, ConnectedRtr, ConnectedRts, Gid, QueuePair, Rc,
    Reset, Rts,
};
use bareverbs_model::{Model, ModelConfig};

pub type Ctx = Context<Pvrdma<Model>>;

/// A poll bound small enough that a silent device fails fast in tests; every opcode posted
/// (the model executes them all under `Semantics::Verbs`).
pub const CONFIG: Config = Config {
    poll_limit: 10_000,
    opcodes: Opcodes::All,
    interrupts: false,
};

/// Pages the driver holds while a device is up and no object exists (measured:
/// `model.outstanding_pages()` right after bring-up): the DSR, the command page, the QP table
/// (2048 entries of 32 bytes — twice the 1024 QPs the driver lets live, for open addressing —
/// 16 pages), and two notification rings of 2 pages, each with a directory and a table page
/// (the DSR and the rings are one block of 9 pages, and one more page of it for the event
/// state), and the page of bound GID values that ends the QP table's block.
pub const DEVICE_PAGES: usize = 1 + 1 + 16 + 2 * (2 + 2) + 1 + 1;

pub fn model() -> Model {
    Model::new(ModelConfig::default())
}

pub fn up(model: &Model) -> Ctx {
    Context::new(Pvrdma::probe(model.clone(), model, CONFIG).expect("bring-up"))
}

/// The machine is clean: nothing QEMU would mishandle happened.
pub fn assert_clean(model: &Model) {
    let v = model.violations();
    assert!(v.is_empty(), "violations: {v:#?}");
}

/// Tears the context down and checks that every DMA page came back and nothing went wrong.
pub fn teardown(model: &Model, ctx: Ctx) {
    drop(ctx);
    assert_eq!(model.outstanding_pages(), 0, "DMA pages leaked");
    assert!(!model.active(), "device not reset at teardown");
    assert_clean(model);
}

/// Runs `f` on a thread with a large stack. Queue pairs no longer need it (their safe-path
/// bookkeeping lives in DMA memory, not inline): the QP tests run on the test thread; kept for
/// the test files that still call it.
pub fn big_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(f)
        .expect("spawn")
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
}

/// The driver on the model.
pub type P = Pvrdma<Model>;

/// Brings an RC QP through INIT (with `access`), RTR to QP `peer` over the GID at index 0,
/// and RTS, as the tests connect their pairs.
pub fn rc_up<'a>(
    qp: QueuePair<'a, P, Rc, Reset>,
    peer: u32,
    gid: Gid,
    access: AccessFlags,
) -> QueuePair<'a, P, Rc, Rts> {
    let init = ConnectedInit {
        access,
        ..Default::default()
    };
    let qp = qp.init(&init).map_err(|(_, e)| e).unwrap();
    let av = AddressVector::new(gid, 0);
    let qp = qp
        .rtr(&ConnectedRtr::new(peer, 0, av))
        .map_err(|(_, e)| e)
        .unwrap();
    qp.rts(&ConnectedRts::new(0)).map_err(|(_, e)| e).unwrap()
}
