//! The kernel the QEMU labs boot: the example kernel's PVRDMA demo first (`bareverbs-unikernel`);
//! then, with `bvpeer=A.B.C.D` on the command line (the nested lab, `qemu/lab/`), peer mode
//! on the PVRDMA (`bareverbs_lab_peers::peer`): the kernel binds `::ffff:A.B.C.D` and runs the
//! exchanges the lab's bridge asks for over the console with unmodified Linux programs.
//! Without a PVRDMA and with `bvroce=` (the RoCE lab, `qemu/roce/lab.sh`), peer mode on the
//! software RoCE device (`bareverbs_lab_peers::roce_peer`). Ends with `bareverbs: PASS` or
//! `bareverbs: FAIL <reason>` and exits QEMU through isa-debug-exit.
#![no_std]
#![no_main]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

#[path = "../../../platform/src/rt.rs"]
mod rt;

use core::fmt::Write;

use bareverbs::device::pvrdma::Config;
use bareverbs::hal::{DmaRegion, IdentityHal, x86::PortIoConfig};
use bareverbs_lab_peers::{peer, roce_peer};
use bareverbs_platform::console::{Exit, Serial, exit};
use bareverbs_platform::machine::{
    self, CMDLINE, clock_ms, dma_left, ipv4, pass, roce_device, route_nic_interrupts,
};
use bareverbs_platform::{fw_cfg, irq};
use bareverbs_unikernel::Verdict;
use bareverbs_unikernel::kernel::{fail, fail_dma_left, run_demo};

/// Peer mode on the software RoCE device (`bvroce=` on the command line): the cases against
/// the Linux side of `qemu/roce/lab.sh`. Ends the run with PASS or FAIL.
fn roce_peers(
    pci: &PortIoConfig,
    hal: IdentityHal<'static>,
    dma: &DmaRegion,
    opts: &roce_peer::Options<'_>,
) -> ! {
    let mut nic_interrupts = false;
    let dev = roce_device(pci, hal, opts.net.ip, |nic| {
        nic_interrupts = route_nic_interrupts(pci, hal, nic)
    });
    let idle = roce_peer::Idle {
        halt: &irq::wait,
        nic_interrupts,
    };
    let _ = writeln!(
        Serial,
        "roce: idle waits halt {}",
        if nic_interrupts {
            "until the NIC's interrupt or the timer's"
        } else {
            "after 32 ms without a frame, until the timer's interrupt"
        }
    );
    let served = roce_peer::serve(dev, &mut Serial, opts, &clock_ms, idle);
    // Evidence that the NIC's interrupts arrived (or that waits fell back on the timer).
    let _ = writeln!(
        Serial,
        "roce: NIC interrupts {}, timer ticks {}, halts {}",
        irq::count(irq::DEVICE_VECTORS.start),
        irq::count(irq::TIMER_VECTOR),
        irq::halts()
    );
    match served {
        Ok(o) if o.failed == 0 && dma_left(dma) == 0 => {
            let _ = writeln!(Serial, "roce peer: {} cases passed", o.cases);
            let _ = writeln!(Serial, "DMA pages outstanding: 0");
            pass()
        }
        Ok(o) => {
            let left = dma_left(dma);
            let _ = writeln!(
                Serial,
                "bareverbs: FAIL roce peer: {} of {} cases failed ({} refused), {left} DMA pages not returned",
                o.failed, o.cases, o.refused
            );
            exit(Exit::Fail)
        }
        Err(e) => {
            let _ = writeln!(Serial, "bareverbs: FAIL roce peer: {e}");
            exit(Exit::Fail)
        }
    }
}

/// The case list in fw_cfg file `name` (`bvroce.cases.fw_cfg=`), read into `buf`; ends the
/// run with FAIL when it cannot be read or is not one word.
fn cases_from_fw_cfg<'b>(name: &str, buf: &'b mut [u8]) -> &'b str {
    // SAFETY: this kernel is the only user of the fw_cfg ports, and only here.
    let mut ports = unsafe { fw_cfg::IoPorts::new() };
    match fw_cfg::read_text(&mut ports, name, buf) {
        Ok(t) if !t.bytes().any(|b| b.is_ascii_whitespace()) => {
            let _ = writeln!(
                Serial,
                "roce peer: the cases from fw_cfg {name}: {} bytes, {} cases",
                t.len(),
                t.split('+').filter(|c| !c.is_empty()).count()
            );
            t
        }
        Ok(_) => {
            let _ = writeln!(
                Serial,
                "bareverbs: FAIL bvroce.cases.fw_cfg={name}: the list has whitespace (`,` for a \
                 space, `+` between cases)"
            );
            exit(Exit::Fail)
        }
        Err(e) => {
            let _ = writeln!(Serial, "bareverbs: FAIL bvroce.cases.fw_cfg={name}: {e}");
            exit(Exit::Fail)
        }
    }
}

/// The case list read from fw_cfg (`roce_peer::CASES_MAX` bytes at most).
static CASES: spin::Mutex<[u8; roce_peer::CASES_MAX]> = spin::Mutex::new([0; roce_peer::CASES_MAX]);

#[unsafe(no_mangle)]
extern "C" fn kmain(start_info: u32) -> ! {
    let m = machine::start(
        start_info,
        "bareverbs lab peers: x86_64, PVH entry, polling driver",
    );
    let mut buf = [0u8; CMDLINE];
    let text = m.cmdline(&mut buf).unwrap_or("");
    match run_demo(&m) {
        Ok(Verdict::NoDevice) => {
            let seed = u64::from(irq::count(irq::TIMER_VECTOR)) ^ peer::rdtsc();
            match roce_peer::Options::parse(text, seed) {
                Some(mut opts) => {
                    // A static, not a local: the boot stack is the peers' scarcest memory.
                    let mut cases = CASES.lock();
                    if let Some(name) = opts.cases_fw_cfg {
                        opts.cases = cases_from_fw_cfg(name, &mut cases[..]);
                    }
                    roce_peers(&m.pci, m.hal, m.dma, &opts)
                }
                None => {
                    let _ = writeln!(
                        Serial,
                        "bareverbs: FAIL no PVRDMA, and no well-formed bvroce= on the command line"
                    );
                    exit(Exit::Fail)
                }
            }
        }
        Ok(Verdict::Pass) if m.dma_left() == 0 => {
            let _ = writeln!(Serial, "DMA pages outstanding: 0");
            let peer_ip = text
                .split_ascii_whitespace()
                .find_map(|w| w.strip_prefix("bvpeer="))
                .and_then(ipv4);
            if let Some(ip) = peer_ip {
                match peer::serve(m.hal, &m.pci, &mut Serial, Config::default(), ip) {
                    Ok(o) if o.failed == 0 && m.dma_left() == 0 => {
                        let _ = writeln!(Serial, "peer mode: {} cases passed", o.cases);
                    }
                    Ok(o) => {
                        let left = m.dma_left();
                        let _ = writeln!(
                            Serial,
                            "bareverbs: FAIL peer mode: {} of {} cases failed, {left} DMA pages not returned",
                            o.failed, o.cases
                        );
                        exit(Exit::Fail)
                    }
                    Err(f) => {
                        let _ = writeln!(Serial, "bareverbs: FAIL peer mode: {f}");
                        exit(Exit::Fail)
                    }
                }
            }
            pass()
        }
        Ok(Verdict::Pass) => fail_dma_left(m.dma_left()),
        Err(f) => fail(&f),
    }
}
