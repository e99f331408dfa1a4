#!/usr/bin/python3
"""The lab's bridge: Debian's unmodified ibv_rc_pingpong / ibv_ud_pingpong talk TCP, the
unikernel talks over its serial console (a unix socket of the inner QEMU). This carries the
programs' connection exchange across, both ways, and runs the cases.

    bridge.py SOCKET GID_INDEX CASE [CASE...]      CASE = "rc-server -s 4096 -n 200", ...

The console's lines that start with "@@BV " are the protocol (qemu/peers/src/peer.rs);
every other line is the unikernel's log and is copied to stdout. For each case it prints
"linux-peer <case>: PASS <iters> iters <bytes> bytes" (from the Linux program's own summary,
after its exit code 0 and the unikernel's DONE ok) or "linux-peer <case>: FAIL <why>".
"""
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

PORT = 18515
LINUX_TIMEOUT = 240  # seconds a Linux program may run (it has no timeout of its own)
STEP_TIMEOUT = 120  # seconds to wait for the unikernel's next protocol line


def log(msg):
    print(f"bvpeer: {msg}", flush=True)


class Console:
    """The inner QEMU's serial socket: a reader thread queues protocol lines, prints logs."""

    def __init__(self, path):
        deadline = time.time() + 60
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(path)
                break
            except OSError:
                self.sock.close()
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        pending = b""
        while True:
            data = self.sock.recv(4096)
            if not data:
                break
            pending += data
            while b"\n" in pending:
                raw, pending = pending.split(b"\n", 1)
                text = raw.replace(b"\r", b"").decode("utf-8", "replace")
                if text.startswith("@@BV "):
                    print(f"bvpeer: <- {text}", flush=True)
                    self.lines.put(text[5:])
                else:
                    print(text, flush=True)
        if pending:
            print(pending.decode("utf-8", "replace"), flush=True)
        self.lines.put(None)

    def send(self, text):
        print(f"bvpeer: -> @@BV {text}", flush=True)
        self.sock.sendall(f"@@BV {text}\n".encode())

    def expect(self, word, timeout=STEP_TIMEOUT):
        """The next protocol line, which must start with `word`; returns the rest."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise Failed(f"no '{word}' from the unikernel within {timeout} s")
        if line is None:
            self.lines.put(None)  # closed for every later call too
            raise Failed("the unikernel's console closed")
        if line.split(" ", 1)[0] != word:
            raise Failed(f"expected '{word}', the unikernel said '{line}'", line.startswith("DONE"))
        return line[len(word):].strip()


class Failed(Exception):
    def __init__(self, why, guest_done=False):
        super().__init__(why)
        self.guest_done = guest_done  # the unikernel has already ended the case


def read_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def addr(text):
    if not re.fullmatch(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{6}:[0-9a-fA-F]{6}:[0-9a-fA-F]{32}", text):
        raise Failed(f"not a pingpong address: {text!r}")
    return text


def run_case(con, gid_index, spec):
    name, *opts = spec.split()
    prog = {"rc": "ibv_rc_pingpong", "ud": "ibv_ud_pingpong"}[name[:2]]
    linux_server = name.endswith("-server")
    cmd = ["timeout", str(LINUX_TIMEOUT), prog, "-d", "rxe0", "-g", str(gid_index), "-e", *opts]
    listener = None
    if not linux_server:
        # The client connects once, without retrying: listen before it starts.
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", PORT))
        listener.listen(1)
        listener.settimeout(STEP_TIMEOUT)
        cmd.append("127.0.0.1")
    con.send(f"CASE {name} {' '.join(opts)}".strip())
    t0 = time.time()
    log(f"{name}: {' '.join(cmd)}")
    # A session of its own: on failure the whole group goes (timeout and the program).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        if linux_server:
            ours = addr(con.expect("ADDR"))
            deadline = time.time() + 30
            while True:
                try:
                    conn = socket.create_connection(("127.0.0.1", PORT), timeout=STEP_TIMEOUT)
                    break
                except OSError:
                    if time.time() > deadline or proc.poll() is not None:
                        raise Failed("the Linux server did not accept a connection")
                    time.sleep(0.1)
            with conn:
                conn.sendall(ours.encode() + b"\0")  # 52 bytes in one send
                theirs = read_exact(conn, 52)
                if len(theirs) != 52 or theirs[51] != 0:
                    raise Failed(f"the Linux server sent {theirs!r}")
                conn.sendall(b"done\0")
            con.send(f"PEER {addr(theirs[:51].decode())}")
        else:
            conn, _ = listener.accept()
            listener.close()
            listener = None
            with conn:
                conn.settimeout(STEP_TIMEOUT)
                theirs = read_exact(conn, 52)
                if len(theirs) != 52 or theirs[51] != 0:
                    raise Failed(f"the Linux client sent {theirs!r}")
                con.send(f"PEER {addr(theirs[:51].decode())}")
                ours = addr(con.expect("ADDR"))
                conn.sendall(ours.encode() + b"\0")
                done = read_exact(conn, 5)
                if done != b"done\0":
                    raise Failed(f"the Linux client ended the exchange with {done!r}")
        result = con.expect("DONE", timeout=LINUX_TIMEOUT + 30)
        out, _ = proc.communicate(timeout=LINUX_TIMEOUT + 30)
    except (Failed, subprocess.TimeoutExpired, OSError) as e:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        for line in out.splitlines():
            log(f"{name}: linux: {line}")
        if not getattr(e, "guest_done", False):
            con.send("ABORT")
            try:
                log(f"{name}: after ABORT: {con.expect('DONE', timeout=60)}")
            except Failed as e2:
                log(f"{name}: after ABORT: {e2}")
        raise Failed(str(e)) from e
    finally:
        if listener:
            listener.close()
    for line in out.splitlines():
        log(f"{name}: linux: {line}")
    secs = time.time() - t0
    if proc.returncode != 0:
        raise Failed(f"{prog} exited {proc.returncode} (unikernel: {result})")
    if not result.startswith("ok"):
        raise Failed(f"the unikernel: {result}")
    if "invalid data" in out:
        raise Failed(f"{prog} found invalid data")
    m = re.search(r"^(\d+) bytes in [\d.]+ seconds", out, re.M)
    n = re.search(r"^(\d+) iters in [\d.]+ seconds", out, re.M)
    if not m or not n:
        raise Failed(f"{prog} printed no summary")
    ok = result.split()
    if ok[1:] != [n.group(1), n.group(1), m.group(1)]:
        raise Failed(f"counts differ: {prog} {n.group(1)} iters {m.group(1)} bytes, unikernel {result}")
    return f"PASS {n.group(1)} iters {m.group(1)} bytes", secs


def main():
    path, gid_index, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
    con = Console(path)
    try:
        con.expect("HELLO", timeout=300)
    except Failed as e:
        log(f"no peer mode: {e}")
        for spec in specs:
            print(f"linux-peer {spec.split()[0]}: FAIL no peer mode ({e})", flush=True)
        return
    for spec in specs:
        name = spec.split()[0]
        try:
            verdict, secs = run_case(con, gid_index, spec)
            print(f"linux-peer {name}: {verdict}", flush=True)
            log(f"{name} took {secs:.1f} s ({spec})")
        except Failed as e:
            print(f"linux-peer {name}: FAIL {e}", flush=True)
    con.send("END")
    # Keep copying the console until the inner QEMU exits.
    while con.lines.get() is not None:
        pass


if __name__ == "__main__":
    main()
