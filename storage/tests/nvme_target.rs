//! The NVMe-oF target serving a namespace of the NVMe controller model, end to end: a host on
//! software RoCE device A writes and reads through the target on device B, whose DMA memory
//! (its queues' registered regions) is the controller model's own. The host's data lands by
//! RDMA READ in the target's buffer and the controller reads it from there by DMA; for a
//! read the controller writes the buffer the RDMA WRITE sends from. No byte is copied, as
//! the target's and the driver's counts say, and the bytes are checked on the model's medium
//! and back at the host.

use std::cell::RefCell;

use bareverbs::Context;
use bareverbs::cm::{Cm, CmConfig, Service};
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::{CompletionQueue, ProtectionDomain, Provider};
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::nvme::{Fault, NvmeConfig, NvmeModel};
use bareverbs_model::{Model, ModelConfig};
use bareverbs_nvmf::block::BlockDevice;
use bareverbs_nvmf::host::{Host, HostConfig, HostError};
use bareverbs_nvmf::target::{Subsystem, Target, TargetConfig};
use bareverbs_nvmf::wire::Status;
use bareverbs_storage::nvme::{NsDisk, Nvme, Options, State};

type RA = Rxe<Model, MemLink, TestClock>;
type RB = Rxe<NvmeModel, MemLink, TestClock>;

const IP_A: [u8; 4] = [10, 0, 0, 2];
const IP_B: [u8; 4] = [10, 0, 0, 3];
const NQN: &str = "nqn.2026-11.io.bareverbs:nvme0";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001";

/// A clock for the driver's bounded waits: a millisecond at every look.
fn tick() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static T: AtomicU64 = AtomicU64::new(0);
    T.fetch_add(1, Ordering::Relaxed)
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

struct Side<'c, P: Provider> {
    pd: ProtectionDomain<'c, P>,
    mcq: CompletionQueue<'c, P>,
    dcq: CompletionQueue<'c, P>,
}

fn side<P: Provider>(ctx: &Context<P>) -> Side<'_, P> {
    Side {
        pd: ctx.alloc_pd().unwrap(),
        mcq: ctx.create_cq(64).unwrap(),
        dcq: ctx.create_cq(4096).unwrap(),
    }
}

#[test]
fn the_target_and_the_controller_share_buffers_with_no_copy() {
    let nvme_model = NvmeModel::new(NvmeConfig::default());
    let model = Model::new(ModelConfig::default());
    let seg = Segment::new();
    let clk = TestClock::default();
    let la = seg.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    let lb = seg.attach([0x52, 0x54, 0, 0, 0, 3], 1514);
    let a: Context<RA> =
        Context::new(Rxe::new(model, la, clk.clone(), Config { ip: IP_A }).unwrap());
    // The target's device takes its DMA memory from the controller model: the registered
    // regions are memory the controller reaches.
    let b: Context<RB> =
        Context::new(Rxe::new(nvme_model.clone(), lb, clk.clone(), Config { ip: IP_B }).unwrap());
    let (sa, sb) = (side(&a), side(&b));
    let mut cma: Cm<'_, RA, TestClock, 8> =
        Cm::new(&sa.pd, &sa.mcq, clk.clone(), CmConfig::default()).unwrap();
    let mut cmb: Cm<'_, RB, TestClock, 8> =
        Cm::new(&sb.pd, &sb.mcq, clk.clone(), CmConfig::default()).unwrap();
    cmb.listen(None, 4420, Service::Rc).unwrap();

    // SAFETY: the model's function is this driver's alone; the model maps its BAR.
    let nvme = unsafe {
        Nvme::new(
            nvme_model.clone(),
            &nvme_model,
            NvmeModel::address(),
            tick,
            Options {
                command_timeout_ms: 50,
                ..Options::default()
            },
        )
    }
    .unwrap();
    let nvme = RefCell::new(nvme);
    let mut disk = NsDisk::new(&nvme, 1).unwrap();
    // SAFETY: the target gives the DMA entries only its regions' buffers, memory of the
    // model's DMA blocks, which outlive the controller's use (it stops when told).
    unsafe { disk.allow_dma() };
    let bs = disk.block_size() as usize;
    {
        let mut nss: [&mut dyn BlockDevice; 1] = [&mut disk];
        let mut subs = [Subsystem::new(NQN, &mut nss)];
        let tcfg = TargetConfig {
            max_io_queues: 2,
            io_depth: 32,
            inline_data: 4096,
            max_transfer: 64 * 1024,
            data_slots: 4,
            ..TargetConfig::default()
        };
        let mut t: Target<'_, '_, RB, TestClock, 8, 32> =
            Target::new(&sb.pd, &sb.dcq, clk.clone(), IP_B, tcfg, &mut subs).unwrap();
        let hcfg = HostConfig {
            addr: IP_B,
            subnqn: NQN,
            hostnqn: HOST,
            io_queues: 2,
            io_depth: 16,
            kato_ms: 5000,
            max_transfer: 64 * 1024,
            timeout_ms: 5000,
            ..HostConfig::default()
        };
        let mut h: Host<'_, '_, RA, TestClock, 3, 32> =
            Host::new(&sa.pd, &sa.dcq, clk.clone(), hcfg);
        let mut idle = || {
            clk.advance(20);
            t.poll(&mut cmb);
        };
        h.connect(&mut cma, &mut idle).unwrap();
        let list_before = nvme_model.counters().prp_list_entries;
        // In the capsule (4 KiB), and fetched by RDMA READ (16 KiB, 64 KiB).
        let mut at = 8u64;
        for (k, len) in [4096usize, 16 * 1024, 64 * 1024].into_iter().enumerate() {
            let data = pattern(len, k as u32 + 1);
            let nlb = (len / bs) as u32;
            let r = h.write(1 + k as u16 % 2, 1, at, nlb, &data, &mut idle);
            assert_eq!(r, Ok(()), "a write of {len} bytes");
            let medium: Vec<u8> = (at..at + u64::from(nlb))
                .flat_map(|l| nvme_model.block(1, l))
                .collect();
            assert_eq!(medium, data, "{len} bytes on the controller's medium");
            let mut back = vec![0u8; len];
            h.read(2 - k as u16 % 2, 1, at, nlb, &mut back, &mut idle)
                .unwrap();
            assert_eq!(back, data, "{len} bytes back at the host");
            at += u64::from(nlb);
        }
        assert!(
            nvme_model.counters().prp_list_entries > list_before,
            "the larger buffers went through PRP lists"
        );
        // The controller fails a write, then withholds a read's completion: the host gets
        // a write fault and a media error, the target stays up, and after the controller's
        // reset the next command goes through, still with no copy.
        let data = pattern(16 * 1024, 9);
        let nlb = (data.len() / bs) as u32;
        nvme_model.inject(Fault::Status(0x281));
        assert_eq!(
            h.write(1, 1, 500, nlb, &data, &mut idle),
            Err(HostError::Status(Status::WRITE_FAULT))
        );
        nvme_model.inject(Fault::Withheld);
        let mut back = vec![0u8; data.len()];
        assert_eq!(
            h.read(2, 1, 500, nlb, &mut back, &mut idle),
            Err(HostError::Status(Status::MEDIA_ERROR))
        );
        assert_eq!(nvme.borrow().state(), State::Failed);
        nvme.borrow_mut().reset().unwrap();
        h.write(1, 1, 500, nlb, &data, &mut idle).unwrap();
        h.read(2, 1, 500, nlb, &mut back, &mut idle).unwrap();
        assert_eq!(back, data);
        let io = t.io_counts();
        assert_eq!((io.writes, io.reads, io.errors), (4, 4, 2));
        assert_eq!(io.bytes_written, (4 + 16 + 64 + 16) * 1024);
        assert_eq!(io.bytes_copied, 0, "the target copied nothing");
        drop(h);
    }
    let s = nvme.borrow().stats();
    assert_eq!(s.copied, 0);
    assert_eq!(s.direct, 2 * (4 + 16 + 64 + 16) * 1024);
    assert_eq!(s.transfers, 10);
    assert_eq!(s.submitted, s.completed + s.timeouts + s.violations);
    assert_eq!((s.status_errors, s.timeouts), (1, 1));
    assert!(
        nvme_model.violations().is_empty(),
        "{:?}",
        nvme_model.violations()
    );
}
