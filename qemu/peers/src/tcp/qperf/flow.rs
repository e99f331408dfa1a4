//! qperf's control connection in both roles: [`serve`] (the unikernel as qperf's server) and
//! [`run_client`] (as its client), each around the verbs side's hooks.

use bareverbs_hal::Link;

use super::super::Error as TcpError;
use super::super::stack::Stack;
use super::{
    Error, NODE_LEN, Node, PORT, REQ_LEN, Request, STAT_LEN, SYNC_AFTER, SYNC_BEFORE, Stat, Test,
};

/// What the server does for an RC test once the request was taken: the verbs side of
/// [`serve`].
pub trait Hooks {
    /// The hook's failure.
    type Error;
    /// The time in milliseconds; polls whatever must go on meanwhile (the device, the CM).
    fn now(&mut self) -> u64;
    /// Starts listening through the CM for the test's QP; returns the port.
    fn listen(&mut self, test: Test, req: &Request) -> Result<u16, Self::Error>;
    /// Accepts the client's connection (its REQ to that port); returns this side's node.
    fn accept(&mut self) -> Result<Node, Self::Error>;
    /// Runs the test for the request's time against the client's node; returns the stats.
    fn run(&mut self, peer: &Node) -> Result<Stat, Self::Error>;
    /// Waits for the client's disconnection and frees the QP.
    fn finish(&mut self) -> Result<(), Self::Error>;
}

/// A served connection's failure: qperf's exchange, or the hooks'.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure<E> {
    /// The exchange (or the request) failed.
    Qperf(Error),
    /// A hook failed.
    Hook(E),
}

impl<E> From<Error> for Failure<E> {
    fn from(e: Error) -> Self {
        Failure::Qperf(e)
    }
}

impl<E> From<TcpError> for Failure<E> {
    fn from(e: TcpError) -> Self {
        Failure::Qperf(Error::Tcp(e))
    }
}

/// Reads the two bytes strings of a synchronization and compares.
fn sync<L: Link>(
    stack: &mut Stack<'_, L>,
    msg: &[u8],
    write_first: bool,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<(), Error> {
    if write_first {
        stack.write_message(msg, deadline, now)?;
    }
    let mut got = [0u8; 32];
    let got = &mut got[..msg.len()];
    stack.read_exact(got, deadline, now)?;
    if got != msg {
        return Err(Error::Sync);
    }
    Ok(())
}

/// Serves one connection on [`PORT`]: accepts it, takes the request; `quit` is answered (its
/// synchronization, then the client's close); an RC test runs through `hooks` (steps 2 to 6
/// of the table above). Returns the request and, for a test, the stats sent. A request the
/// peer does not run resets the connection (qperf's client then exits with an error).
pub fn serve<L: Link, H: Hooks>(
    stack: &mut Stack<'_, L>,
    hooks: &mut H,
    deadline: u64,
) -> Result<(Request, Test, Option<Stat>), Failure<H::Error>> {
    stack.accept(PORT, deadline, &mut || hooks.now())?;
    let mut b = [0u8; REQ_LEN];
    stack.read_exact(&mut b, deadline, &mut || hooks.now())?;
    let req = Request::decode(&b);
    let test = match req.test() {
        Ok(t) => t,
        Err(e) => {
            stack.abort();
            let t = hooks.now();
            stack.poll(t);
            return Err(e.into());
        }
    };
    if test == Test::Quit {
        sync(stack, SYNC_BEFORE, true, deadline, &mut || hooks.now())?;
        // The client exits: its close (or reset) ends the connection.
        let mut sink = [0u8; 16];
        while stack
            .read_once(&mut sink, deadline, &mut || hooks.now())
            .is_ok()
        {}
        let _ = stack.close(deadline, &mut || hooks.now());
        return Ok((req, test, None));
    }
    let r = rc_test(stack, hooks, &req, test, deadline);
    if r.is_err() {
        stack.abort();
        let t = hooks.now();
        stack.poll(t);
        return r.map(|s| (req, test, Some(s)));
    }
    let _ = stack.close(deadline, &mut || hooks.now());
    r.map(|s| (req, test, Some(s)))
}

fn rc_test<L: Link, H: Hooks>(
    stack: &mut Stack<'_, L>,
    hooks: &mut H,
    req: &Request,
    test: Test,
    deadline: u64,
) -> Result<Stat, Failure<H::Error>> {
    let port = hooks.listen(test, req).map_err(Failure::Hook)?;
    stack.write_message(&u32::from(port).to_le_bytes(), deadline, &mut || {
        hooks.now()
    })?;
    let me = hooks.accept().map_err(Failure::Hook)?;
    stack.write_message(&me.encode(), deadline, &mut || hooks.now())?;
    let mut b = [0u8; NODE_LEN];
    stack.read_exact(&mut b, deadline, &mut || hooks.now())?;
    let peer = Node::decode(&b);
    sync(stack, SYNC_BEFORE, true, deadline, &mut || hooks.now())?;
    let stat = hooks.run(&peer).map_err(Failure::Hook)?;
    stack.write_message(&stat.encode(), deadline, &mut || hooks.now())?;
    sync(stack, SYNC_AFTER, false, deadline, &mut || hooks.now())?;
    hooks.finish().map_err(Failure::Hook)?;
    Ok(stat)
}

/// What the client does for an RC test around qperf's exchange: the verbs side of
/// [`run_client`].
pub trait ClientHooks {
    /// The hook's failure.
    type Error;
    /// The time in milliseconds; polls whatever must go on meanwhile (the device, the CM).
    fn now(&mut self) -> u64;
    /// Connects the test's QP through the CM to the server's `port`; returns this side's
    /// node.
    fn connect(&mut self, port: u16) -> Result<Node, Self::Error>;
    /// Runs the test against the server's node; returns this side's statistics.
    fn run(&mut self, peer: &Node) -> Result<Stat, Self::Error>;
    /// Disconnects the QP (once the results are exchanged) and frees it.
    fn finish(&mut self) -> Result<(), Self::Error>;
}

/// Runs `req`'s test as qperf's client against the server at `server` (connecting with
/// `retry` while it does not listen yet): the request, the CM port, the nodes, the
/// synchronization, the test, the server's statistics, the last synchronization. Returns
/// this side's statistics and the server's. The connection is reset on a failure.
pub fn run_client<L: Link, H: ClientHooks>(
    stack: &mut Stack<'_, L>,
    server: [u8; 4],
    retry: crate::tcp::Retry,
    req: &Request,
    hooks: &mut H,
    deadline: u64,
) -> Result<(Stat, Stat), Failure<H::Error>> {
    stack.connect(server, PORT, retry, deadline, &mut || hooks.now())?;
    let r = client_test(stack, req, hooks, deadline);
    if r.is_err() {
        stack.abort();
        let t = hooks.now();
        stack.poll(t);
    } else {
        let _ = stack.close(deadline, &mut || hooks.now());
    }
    r
}

fn client_test<L: Link, H: ClientHooks>(
    stack: &mut Stack<'_, L>,
    req: &Request,
    hooks: &mut H,
    deadline: u64,
) -> Result<(Stat, Stat), Failure<H::Error>> {
    stack.write_message(&req.encode(), deadline, &mut || hooks.now())?;
    let mut p = [0u8; 4];
    stack.read_exact(&mut p, deadline, &mut || hooks.now())?;
    let port = u32::from_le_bytes(p);
    let port = u16::try_from(port)
        .ok()
        .filter(|&p| p != 0)
        .ok_or(Error::Port(port))?;
    let me = hooks.connect(port).map_err(Failure::Hook)?;
    stack.write_message(&me.encode(), deadline, &mut || hooks.now())?;
    let mut b = [0u8; NODE_LEN];
    stack.read_exact(&mut b, deadline, &mut || hooks.now())?;
    let peer = Node::decode(&b);
    sync(stack, SYNC_BEFORE, true, deadline, &mut || hooks.now())?;
    let mine = hooks.run(&peer).map_err(Failure::Hook)?;
    let mut s = [0u8; STAT_LEN];
    stack.read_exact(&mut s, deadline, &mut || hooks.now())?;
    let theirs = Stat::decode(&s);
    stack.write_message(SYNC_AFTER, deadline, &mut || hooks.now())?;
    // The server waits for it before it takes the DREQ; `finish` polls only the CM.
    stack.flush(deadline, &mut || hooks.now())?;
    hooks.finish().map_err(Failure::Hook)?;
    Ok((mine, theirs))
}

/// `qperf <server> quit`: the request, the synchronization, then the close; the server
/// exits.
pub fn quit<L: Link>(
    stack: &mut Stack<'_, L>,
    server: [u8; 4],
    retry: crate::tcp::Retry,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<(), Error> {
    stack.connect(server, PORT, retry, deadline, now)?;
    let r = (|| {
        let req = Request::new(Test::Quit, 0, 2, 5);
        stack.write_message(&req.encode(), deadline, now)?;
        sync(stack, SYNC_BEFORE, true, deadline, now)
    })();
    if r.is_err() {
        stack.abort();
        let t = now();
        stack.poll(t);
        return r;
    }
    stack.close(deadline, now).map_err(Error::from)
}
