//! The machine of an execution, drawn from its seed.

use super::*;

/// The machine of an execution; whether it is honest (it tells no lie); whether it is plain
/// (default limits, plenty of DMA memory); and its description.
/// Which devices the executions get (`FUZZ_MODE`): `honest` (no lie; faults injected as
/// usual), `hostile` (every one lies somewhere), anything else a mix (one in eight honest).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Mixed,
    Honest,
    Hostile,
}

pub(crate) fn mode() -> Mode {
    static MODE: std::sync::OnceLock<Mode> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("FUZZ_MODE").as_deref() {
        Ok("honest") => Mode::Honest,
        Ok("hostile") => Mode::Hostile,
        _ => Mode::Mixed,
    })
}

pub(crate) fn machine(r: &mut Rng) -> (ModelConfig, bool, bool, String) {
    let mut cfg = ModelConfig {
        version: r.pick(&[17, 17, 17, 17, 17, 18, 19, 20]),
        bar2_64bit: r.below(8) == 0,
        port_active: r.below(4) != 0,
        semantics: if r.below(4) == 0 {
            Semantics::Qemu
        } else {
            Semantics::Verbs
        },
        ..Default::default()
    };
    if r.below(6) == 0 {
        let c = &mut cfg.caps;
        c.max_pd = 1 + r.below(4) as u32;
        c.max_cq = 1 + r.below(4) as u32;
        c.max_qp = 1 + r.below(6) as u32;
        c.max_mr = 1 + r.below(4) as u32;
        c.max_srq = 1 + r.below(3) as u32;
    }
    if r.below(10) == 0 {
        cfg.dma_pages = 10 + r.below(300) as usize;
    }
    let mut odd = "";
    if r.below(8) == 0 {
        // An honest device with odd limits: the driver must cope without being lied to.
        let c = &mut cfg.caps;
        let big = [
            1,
            2,
            3,
            5,
            255,
            256,
            0x0100_0000,
            0x0800_0000,
            0x0FFF_FFFF,
            u32::MAX,
        ];
        odd = match r.below(8) {
            0 => {
                c.max_sge = r.pick(&big);
                "max_sge"
            }
            1 => {
                c.max_qp_wr = r.pick(&big);
                "max_qp_wr"
            }
            2 => {
                c.max_cqe = r.pick(&big);
                "max_cqe"
            }
            3 => {
                c.max_srq_sge = r.pick(&big);
                c.max_srq_wr = r.pick(&big);
                "max_srq_sge, max_srq_wr"
            }
            4 => {
                c.gid_tbl_len = r.pick(&big);
                "gid_tbl_len"
            }
            5 => {
                c.max_mr_size = r.pick(&[1, 4096, 4097, 1 << 30, u64::MAX]);
                "max_mr_size"
            }
            6 => {
                c.phys_port_cnt = r.pick(&[2, 255]);
                "phys_port_cnt"
            }
            _ => {
                c.max_qp = r.pick(&big);
                c.max_cq = r.pick(&big);
                c.max_pd = r.pick(&big);
                "max_qp, max_cq, max_pd"
            }
        };
    }
    let mut rate = r.pick(&[0, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 512, 4096, 0, 16]);
    match mode() {
        Mode::Honest => rate = 0,
        Mode::Hostile if rate == 0 => rate = 16,
        _ => {}
    }
    let points = if r.below(3) == 0 {
        point::ALL
    } else {
        (r.next_u64() as u32 & point::ALL).max(1 << r.below(9))
    };
    if rate != 0 {
        let mut h = Hostile::new(r.next_u64(), rate).at(points);
        if r.below(3) == 0 {
            // Some points lie at their own rate.
            for p in 0..9 {
                if r.below(3) == 0 {
                    h = h.rate_at(1 << p, r.pick(&[1, 2, 4, 16, 256]));
                }
            }
        }
        cfg.hostile = Some(h);
    }
    let desc = format!(
        "version {}, bar2_64bit {}, semantics {:?}, dma_pages {}, small tables {}, \
         odd caps [{odd}] {:?}, hostile {:?}",
        cfg.version,
        cfg.bar2_64bit,
        cfg.semantics,
        cfg.dma_pages,
        cfg.caps.max_pd < 1024,
        cfg.caps,
        cfg.hostile
    );
    let plain = odd.is_empty() && cfg.caps.max_pd == 1024 && cfg.dma_pages >= 1 << 20;
    (cfg, rate == 0, plain, desc)
}
