// A client and a server connected by the CM (rdma_cm's messages on QP1), then the client's
// RDMA WRITE into the server's memory and RDMA READ from it, and SENDs the server receives.
// Two software RoCE devices on the model's in-memory Ethernet segment; on a machine each
// device is over its NIC, and either side may be Linux (`rping`, `ib_write_bw -R`).
//
// `cargo run --example cm`; it is also the `bareverbs::cm` module's example, run by
// `cargo test --doc`.

use bareverbs::Context;
use bareverbs::cm::{AcceptParams, Cm, CmConfig, CmError, CmEvent, ConnectParams, Service};
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_model::link::{Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};

fn main() -> Result<(), CmError> {
    let (model, segment, clock) = (
        Model::new(ModelConfig::default()),
        Segment::new(),
        TestClock::default(),
    );
    let device = |mac, ip| {
        Rxe::new(
            model.clone(),
            segment.attach(mac, 1514),
            clock.clone(),
            Config { ip },
        )
    };
    let client = Context::new(device([2, 0, 0, 0, 0, 1], [10, 0, 0, 1])?);
    let server = Context::new(device([2, 0, 0, 0, 0, 2], [10, 0, 0, 2])?);
    let (client_pd, server_pd) = (client.alloc_pd()?, server.alloc_pd()?);
    // Each CM owns a completion queue; the connections' QPs use others.
    let (client_cm_cq, server_cm_cq) = (client.create_cq(32)?, server.create_cq(32)?);
    let (client_cq, server_cq) = (client.create_cq(64)?, server.create_cq(64)?);
    let mut client_cm: Cm<_, _> = Cm::new(
        &client_pd,
        &client_cm_cq,
        clock.clone(),
        CmConfig::default(),
    )?;
    let mut server_cm: Cm<_, _> = Cm::new(
        &server_pd,
        &server_cm_cq,
        clock.clone(),
        CmConfig::default(),
    )?;

    // The server's memory the client writes and reads: its address and key go to the client
    // in the REP's private data (as rping sends them in a message).
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut exposed = server_pd.register(4096, access)?;
    exposed.as_mut_slice()[2048..2060].copy_from_slice(b"from server!");
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&exposed.addr().to_be_bytes());
    key[8..].copy_from_slice(&exposed.rkey().to_be_bytes());

    server_cm.listen(None, 7174, Service::Rc)?;
    // QpCaps::default(): 16 requests each way, 1 scatter/gather entry each.
    let qp = client_pd.qp_builder(&client_cq, &client_cq).build::<Rc>()?;
    let hello = ConnectParams {
        private_data: b"hello",
        ..ConnectParams::default()
    };
    let id = client_cm.connect(qp, [10, 0, 0, 2], 7174, &hello)?;

    let (mut client_qp, mut server_qp, mut remote) = (None, None, (0, 0));
    for _ in 0..1000 {
        clock.advance(100); // µs: the CM's timers run on the embedder's clock
        if let Some(CmEvent::ConnectRequest(request)) = server_cm.poll() {
            assert_eq!(&request.private_data.as_slice()[..5], b"hello");
            let qp = server_pd.qp_builder(&server_cq, &server_cq).build::<Rc>()?;
            // The QP reaches RTS here, before the REP goes out.
            let params = AcceptParams {
                private_data: &key,
                ..AcceptParams::default()
            };
            server_qp = Some(server_cm.accept(request.id, qp, &params)?);
        }
        if let Some(CmEvent::Established {
            qp: Some(qp),
            private_data,
            ..
        }) = client_cm.poll()
        {
            let p = private_data.as_slice();
            let addr = u64::from_be_bytes(p[..8].try_into().expect("8 bytes"));
            remote = (
                addr,
                u32::from_be_bytes(p[8..12].try_into().expect("4 bytes")),
            );
            client_qp = Some(qp); // in RTS, connected to the server's QP
        }
        if client_qp.is_some() && server_qp.is_some() {
            break;
        }
    }
    let (mut client_qp, mut server_qp) =
        (client_qp.expect("connected"), server_qp.expect("accepted"));
    assert_eq!(client_qp.query()?.dest_qpn, server_qp.qp_num());

    // The server posts 8 receives into its region (its queue holds 16).
    // SAFETY: the bytes 0..1024 of `exposed` are left to the device until the completions.
    unsafe {
        let mut recvs = server_qp.recv_batch();
        for i in 0..8 {
            recvs.recv(i, &[exposed.sge(i as u32 * 128, 128)?])?;
        }
        recvs.finish();
    }

    // The client: a WRITE of 12 bytes to the server's offset 1024, a READ of the server's 12
    // bytes at 2048, then 8 SENDs; 10 requests in one batch, one doorbell.
    let mut local = client_pd.register(4096, AccessFlags::LOCAL_WRITE)?;
    local.as_mut_slice()[..12].copy_from_slice(b"from client!");
    let (addr, rkey) = remote;
    // SAFETY: `local` is left to the device until every completion has been polled.
    unsafe {
        let mut batch = client_qp.send_batch();
        batch.rdma_write(
            100,
            SendFlags::SIGNALED,
            (addr + 1024, rkey),
            &[local.sge(0, 12)?],
        )?;
        batch.rdma_read(
            101,
            SendFlags::SIGNALED,
            (addr + 2048, rkey),
            &[local.sge(64, 12)?],
        )?;
        for i in 0..8 {
            batch.send(200 + i, SendFlags::SIGNALED, &[local.sge(0, 12)?])?;
        }
        batch.finish();
    }

    // Waiting on the client's completions. The server's device serves the WRITE and the READ
    // inside the server's own calls: a wait of the crate's on the server (a future, a poll,
    // `Context::block_on`) or its `progress`. In one thread, the client's wait runs it in
    // its idle step; with a thread each, the server's thread awaiting anything of the crate's
    // is enough.
    let step = || {
        clock.advance(10);
        server.progress();
    };
    for _ in 0..10 {
        let wc = bareverbs::block_on_with(client_cq.next_completion(), step)?;
        assert_eq!(wc.status, WcStatus::Success, "request {}", wc.wr_id);
    }
    assert_eq!(&exposed.as_slice()[1024..1036], b"from client!");
    assert_eq!(&local.as_slice()[64..76], b"from server!");
    let mut received = 0;
    while received < 8 {
        let wc = bareverbs::block_on(server_cq.next_completion())?;
        assert_eq!((wc.opcode, wc.byte_len), (WcOpcode::Recv, 12));
        received += 1;
    }

    client_cm.disconnect(id)?;
    Ok(())
}
