//! The unikernel's RoCE demo (what it runs over virtio-net when the bus has no PVRDMA), on
//! the host: the software device over an in-memory link, every line of its report, and every
//! DMA page back.

use bareverbs::device::rxe::{Config, Rxe};
use bareverbs_model::link::{Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};

#[test]
fn the_roce_demo_passes_over_loopback_and_returns_every_page() {
    let model = Model::new(ModelConfig::default());
    let seg = Segment::new();
    let link = seg.attach([0x52, 0x54, 0, 0x12, 0x34, 0x56], 1514);
    let clk = TestClock::default();
    let dev = Rxe::new(
        model.clone(),
        link,
        clk.clone(),
        Config { ip: [10, 0, 2, 15] },
    )
    .unwrap();
    let mut out = String::new();
    let mut waits = 0;
    let r = bareverbs_unikernel::roce::demo(dev, clk.clone(), &mut out, &mut || {
        clk.advance(1000);
        waits += 1;
        waits < 10_000
    });
    assert_eq!(r, Ok(()), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(
        lines[0],
        "roce: software RoCEv2, IPv4 10.0.2.15, active MTU 1024, GID[1] 0000:0000:0000:0000:0000:ffff:0a00:020f"
    );
    assert!(
        lines[1].starts_with("roce: RC 16 <-> 17 at MTU 1024: SEND 3000 B"),
        "{out}"
    );
    assert!(lines[1].ends_with("checked"), "{out}");
    assert!(
        lines[2].starts_with("roce: UD 16 -> 17: 40 GRH + 512 B, source 10.0.2.15"),
        "{out}"
    );
    assert_eq!(
        lines[3],
        "cm: connected to 10.0.2.15:7471 on the software RoCE device (loopback): SEND, WRITE, READ 1500 B; 4500 bytes checked; disconnected"
    );
    assert!(seg.sent().is_empty(), "loopback: nothing on the wire");
    assert_eq!(model.outstanding_pages(), 0);
    assert!(model.check_guards());
}
