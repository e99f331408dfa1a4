//! The demo as a kernel runs it on the platform's machine: the wait mode from the command
//! line, and the lines a failure ends with. The example kernel and the lab peers' kernel (which
//! runs the demo first) share these.

use core::fmt::Write;

use bareverbs::device::pvrdma::Config;
use bareverbs_platform::console::{Exit, Serial, exit};
use bareverbs_platform::machine::Machine;
use bareverbs_platform::{Failure, irq, wait};

use crate::{Verdict, run};

/// Runs the PVRDMA demo on `m`'s PCI bus: with `bvirq` on the command line (the nested lab
/// passes it) its waits are interrupt-driven (MSI-X, halts), else they poll.
pub fn run_demo(m: &Machine) -> Result<Verdict, Failure> {
    let irq_mode = m.cmdline_has("bvirq");
    let config = Config {
        interrupts: irq_mode,
        ..Config::default()
    };
    let (mut kernel_cpu, mut polling) = (irq::KernelCpu, wait::Polling);
    let cpu: &mut dyn wait::Cpu = if irq_mode {
        &mut kernel_cpu
    } else {
        &mut polling
    };
    run(m.hal, &m.pci, &mut Serial, config, cpu)
}

/// Ends the run with FAIL for `left` DMA pages the demo did not return.
pub fn fail_dma_left(left: usize) -> ! {
    let _ = writeln!(Serial, "bareverbs: FAIL {left} DMA pages not returned");
    exit(Exit::Fail)
}

/// Ends the run with FAIL for `f`, after the CPU's interrupt counts (what a wait saw).
pub fn fail(f: &Failure) -> ! {
    let v = |i: u8| irq::count(irq::DEVICE_VECTORS.start + i);
    let _ = writeln!(
        Serial,
        "CPU: device vectors taken {} / {} / {}, timer ticks {}, halts {}",
        v(0),
        v(1),
        v(2),
        irq::count(irq::TIMER_VECTOR),
        irq::halts()
    );
    let _ = writeln!(Serial, "bareverbs: FAIL {f}");
    exit(Exit::Fail)
}
