//! The IP stack: one smoltcp interface with a static IPv4 address, one TCP socket, and
//! bounded blocking helpers on top (accept one, connect with retries, read, write one
//! segment, close).
//!
//! Every wait polls the interface and calls the caller's clock, `now: &mut dyn FnMut() ->
//! u64` (milliseconds), once per round: the clock is also the caller's idle hook (poll the
//! RoCE transport there, or halt until the next interrupt). Every wait ends at the caller's
//! `deadline` (same clock) with [`Error::Timeout`]; a clock that stops moving ends it with
//! [`Error::ClockStuck`].

use bareverbs_hal::Link;
use smoltcp::iface::{Config, Interface, PollResult, SocketHandle, SocketSet, SocketStorage};
use smoltcp::socket::tcp::{self, SocketBuffer, State};
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, Ipv4Address};

use super::device::{DeviceCounts, LinkDevice};
use super::{Error, Step};

/// Bytes of the TCP socket's receive buffer (its window).
pub const RX_BUF: usize = 1024;
/// Bytes of the TCP socket's send buffer.
pub const TX_BUF: usize = 1024;
/// The largest message [`Stack::write_message`] takes: the smallest MSS any IPv4 peer may
/// announce (RFC 1122), so that the message always leaves in one segment.
pub const MAX_MESSAGE: usize = 536;
/// The smallest link frame the stack works with: the 576-byte datagram every IPv4 host must
/// take, plus the Ethernet header.
pub const MIN_FRAME: usize = 576 + 14;
/// Rounds of a wait in which the clock may stand still before the wait gives up.
pub const STUCK_ROUNDS: u32 = 1 << 24;

/// The interface's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// The static IPv4 address.
    pub ip: [u8; 4],
    /// Its prefix length (1..=32).
    pub prefix: u8,
    /// A default gateway, if the peer is not on the segment.
    pub gateway: Option<[u8; 4]>,
    /// Seeds the TCP initial sequence numbers and the local ports: make it differ per boot.
    pub seed: u64,
}

impl Default for NetConfig {
    /// 10.0.0.2/24, no gateway, seed 0.
    fn default() -> Self {
        NetConfig {
            ip: [10, 0, 0, 2],
            prefix: 24,
            gateway: None,
            seed: 0,
        }
    }
}

impl NetConfig {
    /// Parses `a.b.c.d/len` (as a kernel command line gives it; `/len` may be left out for
    /// /24) into a configuration with no gateway and `seed`.
    pub fn from_cidr(s: &str, seed: u64) -> Option<NetConfig> {
        let (ip, prefix) = match s.split_once('/') {
            Some((ip, p)) => (ip, parse_dec(p)?),
            None => (s, 24),
        };
        let ip = parse_ipv4(ip)?;
        let prefix = u8::try_from(prefix).ok()?;
        Some(NetConfig {
            ip,
            prefix,
            gateway: None,
            seed,
        })
    }
}

/// Parses dotted-quad IPv4 text.
pub fn parse_ipv4(s: &str) -> Option<[u8; 4]> {
    let mut out = [0u8; 4];
    let mut parts = s.split('.');
    for b in &mut out {
        *b = u8::try_from(parse_dec(parts.next()?)?).ok()?;
    }
    parts.next().is_none().then_some(out)
}

fn parse_dec(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 9 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(s.bytes().fold(0, |n, c| n * 10 + u32::from(c - b'0')))
}

/// How often and how patiently [`Stack::connect`] tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    /// Connection attempts (a refused attempt — an RST — is followed by the next one).
    pub tries: u32,
    /// Milliseconds between a refused attempt and the next.
    pub pause_ms: u64,
}

impl Default for Retry {
    /// 20 tries, 500 ms apart: a Linux program started up to ten seconds later is still met.
    fn default() -> Self {
        Retry {
            tries: 20,
            pause_ms: 500,
        }
    }
}

/// The memory the stack works in: the socket slot and the TCP buffers. The caller owns it
/// (on its stack or in a static) and lends it to [`Stack::new`] for the stack's life.
pub struct Storage<'a> {
    sockets: [SocketStorage<'a>; 1],
    rx: [u8; RX_BUF],
    tx: [u8; TX_BUF],
}

impl Storage<'_> {
    /// Empty storage.
    pub const fn new() -> Self {
        Storage {
            sockets: [SocketStorage::EMPTY],
            rx: [0; RX_BUF],
            tx: [0; TX_BUF],
        }
    }
}

impl Default for Storage<'_> {
    fn default() -> Self {
        Storage::new()
    }
}

/// One IPv4 interface over a [`Link`] with one TCP socket.
pub struct Stack<'a, L: Link> {
    device: LinkDevice<L>,
    iface: Interface,
    sockets: SocketSet<'a>,
    tcp: SocketHandle,
    ip: [u8; 4],
    next_port: u16,
}

fn instant(ms: u64) -> Instant {
    Instant::from_millis(i64::try_from(ms).unwrap_or(i64::MAX))
}

fn unicast(ip: [u8; 4]) -> bool {
    let a = Ipv4Address::from(ip);
    !(a.is_unspecified() || a.is_broadcast() || a.is_multicast() || a.is_loopback())
}

impl<'a, L: Link> Stack<'a, L> {
    /// Brings the interface up on `link` with `config`, its TCP socket closed.
    ///
    /// [`Error::Config`] for a link whose frames are below [`MIN_FRAME`], a MAC that is not
    /// unicast, an address that is not unicast, a prefix outside 1..=32, or a gateway that is
    /// not unicast.
    pub fn new(
        link: L,
        storage: &'a mut Storage<'a>,
        config: NetConfig,
        now_ms: u64,
    ) -> Result<Self, Error> {
        let mac = EthernetAddress(link.mac());
        if link.max_frame() < MIN_FRAME {
            return Err(Error::Config);
        }
        if !mac.is_unicast() || mac.0 == [0; 6] {
            return Err(Error::Config);
        }
        if !unicast(config.ip) || !(1..=32).contains(&config.prefix) {
            return Err(Error::Config);
        }
        if config.gateway.is_some_and(|g| !unicast(g)) {
            return Err(Error::Config);
        }
        let mut device = LinkDevice::new(link);
        let mut c = Config::new(HardwareAddress::Ethernet(mac));
        c.random_seed = config.seed;
        let mut iface = Interface::new(c, &mut device, instant(now_ms));
        let cidr = IpCidr::new(IpAddress::Ipv4(Ipv4Address::from(config.ip)), config.prefix);
        let mut pushed = false;
        iface.update_ip_addrs(|a| pushed = a.push(cidr).is_ok());
        if !pushed {
            return Err(Error::Config);
        }
        if let Some(g) = config.gateway {
            iface
                .routes_mut()
                .add_default_ipv4_route(Ipv4Address::from(g))
                .map_err(|_| Error::Config)?;
        }
        let Storage { sockets, rx, tx } = storage;
        let mut sockets = SocketSet::new(&mut sockets[..]);
        let mut socket = tcp::Socket::new(
            SocketBuffer::new(&mut rx[..]),
            SocketBuffer::new(&mut tx[..]),
        );
        // Each message goes out at once, in a segment of its own; ACKs at once too (the
        // last one, for the peer's FIN, would otherwise wait for a poll that may not come).
        socket.set_nagle_enabled(false);
        socket.set_ack_delay(None);
        let tcp = sockets.add(socket);
        let next_port = 49152 + (config.seed % 16384) as u16;
        Ok(Stack {
            device,
            iface,
            sockets,
            tcp,
            ip: config.ip,
            next_port,
        })
    }

    /// The interface's IPv4 address.
    pub fn ip(&self) -> [u8; 4] {
        self.ip
    }

    /// The device (its link and counters).
    pub fn device(&self) -> &LinkDevice<L> {
        &self.device
    }

    /// The device, mutably (to reach the link).
    pub fn device_mut(&mut self) -> &mut LinkDevice<L> {
        &mut self.device
    }

    /// Frames the device handled.
    pub fn counts(&self) -> DeviceCounts {
        self.device.counts()
    }

    /// Receives and sends what is due: `true` when a socket may have changed state.
    pub fn poll(&mut self, now_ms: u64) -> bool {
        let r = self
            .iface
            .poll(instant(now_ms), &mut self.device, &mut self.sockets);
        r == PollResult::SocketStateChanged
    }

    /// Milliseconds until the stack next needs a [`Stack::poll`] without a frame arriving
    /// (a retransmission, a delayed ACK), or `None` when it waits only for frames.
    pub fn poll_delay_ms(&mut self, now_ms: u64) -> Option<u64> {
        self.iface
            .poll_delay(instant(now_ms), &self.sockets)
            .map(|d| d.total_millis())
    }

    fn socket(&mut self) -> &mut tcp::Socket<'a> {
        self.sockets.get_mut::<tcp::Socket>(self.tcp)
    }

    /// The TCP socket's state.
    pub fn state(&mut self) -> State {
        self.socket().state()
    }

    /// The connected peer's address and port.
    pub fn peer(&mut self) -> Option<([u8; 4], u16)> {
        let e = self.socket().remote_endpoint()?;
        match e.addr {
            IpAddress::Ipv4(a) => Some((a.octets(), e.port)),
        }
    }

    /// Starts listening on `port` (already listening there: nothing to do). Listen before the
    /// Linux client starts: its connect is not retried, and a SYN that finds no listener is
    /// answered with a reset. [`Error::Busy`] while a connection is open.
    pub fn listen(&mut self, port: u16) -> Result<(), Error> {
        let s = self.socket();
        if s.is_listening() && s.listen_endpoint().port == port {
            return Ok(());
        }
        if s.is_open() {
            return Err(Error::Busy);
        }
        s.listen(port).map_err(|_| Error::Socket(Step::Accept))
    }

    /// Listens on `port` (see [`Stack::listen`]) and waits for one connection; returns the
    /// client's address and port. Nobody else is accepted while it lasts. A connection reset
    /// before it was seen established ends the wait with [`Error::Closed`].
    pub fn accept(
        &mut self,
        port: u16,
        deadline: u64,
        now: &mut dyn FnMut() -> u64,
    ) -> Result<([u8; 4], u16), Error> {
        self.listen(port)?;
        self.wait(Step::Accept, deadline, now, |s, _| match s.state() {
            State::Established | State::CloseWait => Some(Ok(())),
            // A connection reset before a poll saw it established leaves the socket closed,
            // not listening: the attempt ended, as `accept` on a reset connection ends in
            // Linux's stack. (A reset during the handshake goes back to listening.)
            State::Closed => Some(Err(Error::Closed(Step::Accept))),
            _ => None,
        })?;
        self.peer().ok_or(Error::Closed(Step::Accept))
    }

    fn local_port(&mut self) -> u16 {
        let p = self.next_port;
        self.next_port = if p == u16::MAX { 49152 } else { p + 1 };
        p
    }

    /// Connects to `ip`:`port`: an attempt the peer refuses (nobody listens yet) is
    /// followed by another after `retry.pause_ms`, up to `retry.tries`
    /// ([`Error::Refused`]); an unanswered one goes on (TCP retransmits the SYN) until the
    /// deadline.
    pub fn connect(
        &mut self,
        ip: [u8; 4],
        port: u16,
        retry: Retry,
        deadline: u64,
        now: &mut dyn FnMut() -> u64,
    ) -> Result<(), Error> {
        if self.socket().is_open() {
            return Err(Error::Busy);
        }
        let remote = (IpAddress::Ipv4(Ipv4Address::from(ip)), port);
        for attempt in 0..retry.tries {
            if attempt > 0 {
                let until = now().saturating_add(retry.pause_ms);
                self.wait(Step::Connect, deadline, now, |_, t| {
                    (t >= until).then_some(Ok(()))
                })?;
            }
            let local = self.local_port();
            let cx = self.iface.context();
            let s = self.sockets.get_mut::<tcp::Socket>(self.tcp);
            s.connect(cx, remote, local)
                .map_err(|_| Error::Socket(Step::Connect))?;
            let r = self.wait(Step::Connect, deadline, now, |s, _| match s.state() {
                State::Established | State::CloseWait => Some(Ok(true)),
                // Refused (reset), or given up.
                State::Closed => Some(Ok(false)),
                _ => None,
            });
            match r {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    self.socket().abort();
                    return Err(e);
                }
            }
        }
        Err(Error::Refused)
    }

    /// Reads exactly `buf.len()` bytes (gathered from as many segments as they came in).
    /// [`Error::Closed`] when the peer closes or resets first.
    pub fn read_exact(
        &mut self,
        buf: &mut [u8],
        deadline: u64,
        now: &mut dyn FnMut() -> u64,
    ) -> Result<(), Error> {
        let n = buf.len();
        self.wait(Step::Read, deadline, now, |s, _| {
            if s.recv_queue() >= n {
                Some(match s.recv_slice(buf) {
                    Ok(got) if got == n => Ok(()),
                    _ => Err(Error::Closed(Step::Read)),
                })
            } else if !s.may_recv() {
                Some(Err(Error::Closed(Step::Read)))
            } else {
                None
            }
        })
    }

    /// Reads what has arrived, up to `buf.len()` bytes, as one `read()` of a socket does:
    /// waits for at least one byte, returns how many it took. [`Error::Closed`] when the
    /// peer closes or resets with nothing left to read.
    pub fn read_once(
        &mut self,
        buf: &mut [u8],
        deadline: u64,
        now: &mut dyn FnMut() -> u64,
    ) -> Result<usize, Error> {
        self.wait(Step::Read, deadline, now, |s, _| {
            if s.can_recv() {
                Some(s.recv_slice(buf).map_err(|_| Error::Closed(Step::Read)))
            } else if !s.may_recv() {
                Some(Err(Error::Closed(Step::Read)))
            } else {
                None
            }
        })
    }

    /// Sends `msg` as one message: enqueued whole once the send buffer has room for it, and
    /// pushed out at once. At most [`MAX_MESSAGE`] bytes ([`Error::TooLarge`]), and Nagle's
    /// algorithm is off, so it leaves in one segment (a retransmission may join it to the
    /// previous message, never split it) and the peer's single `read()` of its length gets
    /// all of it.
    pub fn write_message(
        &mut self,
        msg: &[u8],
        deadline: u64,
        now: &mut dyn FnMut() -> u64,
    ) -> Result<(), Error> {
        if msg.is_empty() || msg.len() > MAX_MESSAGE {
            return Err(Error::TooLarge);
        }
        self.wait(Step::Write, deadline, now, |s, _| {
            if !s.may_send() {
                return Some(Err(Error::Closed(Step::Write)));
            }
            if s.send_capacity() - s.send_queue() < msg.len() {
                return None;
            }
            Some(match s.send_slice(msg) {
                Ok(n) if n == msg.len() => Ok(()),
                _ => Err(Error::Closed(Step::Write)),
            })
        })?;
        let t = now();
        self.poll(t);
        Ok(())
    }

    /// Waits until the peer acknowledged everything written (a frame the transmit ring
    /// deferred goes out meanwhile): for a last message before a wait that does not poll
    /// the stack. [`Error::Closed`] when the connection ends first.
    pub fn flush(&mut self, deadline: u64, now: &mut dyn FnMut() -> u64) -> Result<(), Error> {
        self.wait(Step::Write, deadline, now, |s, _| {
            if s.send_queue() == 0 {
                Some(Ok(()))
            } else if !s.may_send() {
                Some(Err(Error::Closed(Step::Write)))
            } else {
                None
            }
        })
    }

    /// Closes the connection: what was written goes out first, then a FIN; waits until the
    /// peer closed its side too (or reset). At the deadline the connection is reset
    /// ([`Error::Timeout`]). The socket can listen or connect again afterwards.
    pub fn close(&mut self, deadline: u64, now: &mut dyn FnMut() -> u64) -> Result<(), Error> {
        self.socket().close();
        let r = self.wait(Step::Close, deadline, now, |s, _| {
            // Data the peer sent after its last message (perftest's "done") is not wanted.
            while s.can_recv() {
                let mut sink = [0u8; 64];
                if s.recv_slice(&mut sink).is_err() {
                    break;
                }
            }
            (!s.is_open()).then_some(Ok(()))
        });
        if r.is_err() {
            self.abort();
        }
        r
    }

    /// Resets the connection (or stops listening) at once; the reset goes out at the next
    /// [`Stack::poll`].
    pub fn abort(&mut self) {
        self.socket().abort();
    }

    /// Waits until `ready` gives an answer, polling; [`Error::Timeout`] at the deadline.
    fn wait<T>(
        &mut self,
        step: Step,
        deadline: u64,
        now: &mut dyn FnMut() -> u64,
        mut ready: impl FnMut(&mut tcp::Socket<'a>, u64) -> Option<Result<T, Error>>,
    ) -> Result<T, Error> {
        let mut last = None;
        let mut still = 0u32;
        loop {
            let t = now();
            self.poll(t);
            if let Some(r) = ready(self.socket(), t) {
                return r;
            }
            if t >= deadline {
                return Err(Error::Timeout(step));
            }
            if last == Some(t) {
                still += 1;
                if still >= STUCK_ROUNDS {
                    return Err(Error::ClockStuck);
                }
            } else {
                still = 0;
                last = Some(t);
            }
        }
    }
}
