//! Controller IDs from a configured range (each appliance serving a subsystem has its own,
//! so that a host's paths never share one), and the multipath configuration a target
//! refuses.

mod common;

use bareverbs_nvmf::block::BlockDevice;
use bareverbs_nvmf::host::HostError;
use bareverbs_nvmf::target::{Multipath, NsIds, Subsystem, TargetConfig, TargetError};
use bareverbs_nvmf::wire::Status;
use common::*;

#[test]
fn controller_ids_stay_in_range_and_a_full_range_refuses() {
    let l = lab();
    let (sa, sb) = (side(&l.a), side(&l.b));
    let sides: Vec<_> = (0..3).map(|_| side(&l.a)).collect();
    let mut cma = cm(&sa, &l.clk);
    let mut cmb = target_cm(&sb, &l.clk);
    let mut mem = vec![0u8; 1 << 20];
    let mut disk = bareverbs_nvmf::block::RamDisk::new(&mut mem, 512);
    let mut nss: [&mut dyn BlockDevice; 1] = [&mut disk];
    let mut subs = [Subsystem::new(NQN, &mut nss)];
    // Refused ranges.
    for (lo, hi) in [(0, 5), (6, 5), (1, 0xFFF0)] {
        let bad = TargetConfig {
            cntlid_min: lo,
            cntlid_max: hi,
            ..tcfg()
        };
        assert_eq!(
            T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, bad, &mut []).err(),
            Some(TargetError::Config("cntlid range"))
        );
    }
    // Identities that name a group out of range, or two namespaces alike, are refused.
    let bad_ids = [NsIds {
        anagrpid: 5,
        ..NsIds::default()
    }];
    let mut m2 = vec![0u8; 4096];
    let mut d2 = bareverbs_nvmf::block::RamDisk::new(&mut m2, 512);
    let mut ns2: [&mut dyn BlockDevice; 1] = [&mut d2];
    let mut bad_subs = [Subsystem {
        multipath: Multipath::new(&bad_ids),
        ..Subsystem::new(NQN, &mut ns2)
    }];
    assert_eq!(
        T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, tcfg(), &mut bad_subs).err(),
        Some(TargetError::Config("anagrpid"))
    );
    // A range of two IDs: two controllers get them, the third is refused as busy.
    let cfg = TargetConfig {
        cntlid_min: 0x100,
        cntlid_max: 0x101,
        ..tcfg()
    };
    let mut t: T = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, cfg, &mut subs).unwrap();
    let clk = l.clk.clone();
    let mut hosts: Vec<H> = sides
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let mut c = hcfg(HOST_A);
            c.hostid = [k as u8 + 1; 16];
            c.io_queues = 0;
            H::new(&s.pd, &s.dcq, l.clk.clone(), c)
        })
        .collect();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    let mut ids = Vec::new();
    for h in hosts.iter_mut().take(2) {
        h.connect(&mut cma, &mut idle).unwrap();
        ids.push(h.cntlid());
    }
    ids.sort();
    assert_eq!(ids, vec![0x100, 0x101]);
    assert_eq!(
        hosts[2].connect(&mut cma, &mut idle),
        Err(HostError::Status(Status::CONNECT_BUSY))
    );
}
