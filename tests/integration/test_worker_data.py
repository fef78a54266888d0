"""A worker's data listener (squish-worker --data-listen): frontends send it
the rows of batches they hold and take their outputs back, while squishd
(the dispatcher) only decides the batches. A real squish-worker joins a
fake squishd written here (TCP, the token handshake of common/auth.c, the
frames of common/sq_ipc.h) as a remote worker and tells it its data
address; a fake frontend dials that address. An emulated model's outputs
are a hash of each row's input (worker/backend_emu.c, computed here too),
so every row's output is checked: a frontend gets exactly its rows', and
squishd only those of the rows it sent itself. Rows sent absent, rows that
never come (the batch waits 2 s, then the frontend hears they failed) and
a frontend squishd says is gone (FE_GONE: the batch runs at once)."""

import hashlib
import hmac
import mmap
import os
import queue
import shutil
import socket
import ssl
import struct
import subprocess
import tempfile
import threading
import time

from harness import SOURCE, WORKER, Skip, eventually, run, test

MAGIC = 0x48535153


def ipc_version():
    """The protocol version of this tree (common/sq_ipc.h), so that the fake
    squishd below speaks what the worker under test does."""
    with open(os.path.join(SOURCE, "common", "sq_ipc.h")) as f:
        for line in f:
            if line.startswith("#define SQ_IPC_VERSION "):
                return int(line.split()[2])
    raise AssertionError("no SQ_IPC_VERSION in common/sq_ipc.h")


VERSION = ipc_version()
T = {"HELLO": 1, "WELCOME": 2, "PING": 3, "PONG": 4, "SHUTDOWN": 5, "ERROR": 6,
     "MODEL_LOAD": 10, "MODEL_LOADED": 12, "MODEL_FAILED": 13, "BATCH": 20, "BATCH_DONE": 21,
     "BATCH_INPUT": 22, "BATCH_OUTPUT": 23, "AUTH_CHALLENGE": 40, "AUTH_REPLY": 41,
     "AUTH_PROOF": 42, "MODELS_HELD": 43, "FE_GONE": 58, "WORKER_DATA": 59, "DATA_HELLO": 60,
     "DATA_ROWS": 61, "DATA_OUTPUT": 62}
NAME = {v: k for k, v in T.items()}
INPUT_FP32 = 1
IN_CHW = (3, 4, 4)
IN_ELEMS = 48
ROW_BYTES = IN_ELEMS * 4
CLASSES = 5
OUT_STRIDE = CLASSES * 4
MODEL = 77
M64 = (1 << 64) - 1


# ---- the emulated model's outputs (worker/backend_emu.c) ----------------------

def mix(x):
    x &= M64
    x ^= x >> 30
    x = (x * 0xbf58476d1ce4e5b9) & M64
    x ^= x >> 27
    x = (x * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


def emu_row(row_bytes, classes=CLASSES):
    """The emulated model's output row (its first `classes` floats, as
    bytes) for an FP32 input row: a hash of the input's float bits."""
    h = 0x5157495348
    for k in range(min(IN_ELEMS, 256)):
        (bits,) = struct.unpack_from("<I", row_bytes, 4 * k)
        h = mix(h ^ bits)
    return b"".join(struct.pack("<f", (mix(h + j) >> 40) / float(1 << 24) * 8.0 - 4.0)
                    for j in range(classes))


def input_row(seed):
    return struct.pack("<%df" % IN_ELEMS, *[float((seed * 31 + k) % 97) for k in range(IN_ELEMS)])


# ---- frames and encodings (common/sq_ipc.h, common/msgs.c) --------------------

def frame(t, ident, payload=b""):
    return struct.pack("<IHHQ", len(payload), T[t], 0, ident) + payload


def s_str(s):
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def read_str(p, off):
    (n,) = struct.unpack_from("<I", p, off)
    return p[off + 4:off + 4 + n].decode(), off + 4 + n


def model_load(classes=CLASSES):
    p = s_str("0" * 64) + struct.pack("<BBQI", 1, 0, 0, 8)
    for i in range(3):
        p += struct.pack("<ddI", 0.0, 1.0, IN_CHW[i])
    # bgr, precision (fp32), classes, detection slots and mean, l(b) count
    p += struct.pack("<BBIIdI", 0, 0, classes, 0, 0.0, 8) + struct.pack("<8Q", *([2000] * 8))
    # not cache-only, no group members, no profile yet (ready_batch 0)
    return p + struct.pack("<BII", 0, 0, 0)


def batch(count, in_off, src, out_off=0, model=MODEL, out_stride=OUT_STRIDE):
    p = struct.pack("<QBIQQ", model, INPUT_FP32, count, out_off, out_stride)
    p += struct.pack("<%dQ" % count, *in_off) + struct.pack("<B", 0)
    p += struct.pack("<B", 1) + struct.pack("<%dI" % count, *src)
    return p


def data_rows(count, rows):
    """rows: [(row, bytes or None for absent)]."""
    p = struct.pack("<IBQI", count, INPUT_FP32, ROW_BYTES, len(rows))
    for r, b in rows:
        p += struct.pack("<IB", r, 0 if b is None else 1)
    p += struct.pack("<B", 0)  # not from the worker's host's shared memory
    return p + b"".join(b for _, b in rows if b is not None)


def data_output(p):
    code, exec_ns, total_ns, count = struct.unpack_from("<iQQI", p, 0)
    msg, off = read_str(p, 24)
    stride, n = struct.unpack_from("<QI", p, off)
    off += 12
    rows = list(struct.unpack_from("<%dI" % n, p, off))
    off += 4 * n
    return {"code": code, "count": count, "message": msg, "stride": stride, "rows": rows,
            "bytes": p[off:]}


def batch_done(p):
    code, exec_ns, total_ns = struct.unpack_from("<iQQ", p, 0)
    msg, _ = read_str(p, 20)
    return code, msg


# ---- the token handshake (common/auth.c) --------------------------------------

LABEL = b"squish-cluster-auth-v1\0"


def mac(token, role, nonce_w, nonce_g):
    return hmac.new(token, LABEL + role + b"\0" + struct.pack("<H", 1) + nonce_w + nonce_g,
                    hashlib.sha256).digest()


class Conn:
    """A framed connection: a reader thread queues frames (PONGs dropped)."""

    def __init__(self, sock):
        self.sock = sock
        self.frames = queue.Queue()
        self.lock = threading.Lock()
        self.closed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        buf = b""
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                buf += data
                while len(buf) >= 16:
                    n, t, _, ident = struct.unpack_from("<IHHQ", buf, 0)
                    if len(buf) < 16 + n:
                        break
                    if t != T["PONG"]:
                        self.frames.put((NAME.get(t, t), ident, buf[16:16 + n]))
                    buf = buf[16 + n:]
        except OSError:
            pass
        self.closed.set()

    def send(self, t, ident=0, payload=b""):
        with self.lock:
            self.sock.sendall(frame(t, ident, payload))

    def next(self, timeout=10):
        return self.frames.get(timeout=timeout)

    def expect(self, t, timeout=10):
        name, ident, p = self.next(timeout)
        assert name == t, "expected %s, got %s id=%d %r" % (t, name, ident, p[:80])
        return ident, p

    def nothing(self, seconds):
        try:
            f = self.next(seconds)
        except queue.Empty:
            return
        raise AssertionError("unexpected frame %s id=%d" % (f[0], f[1]))

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # the reader's recv holds the fd open
            self.sock.close()
        except OSError:
            pass


class SyncConn(Conn):
    """A framed connection read on the caller's thread (a TLS socket is not
    to be read and written from two threads at once)."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.lock = threading.Lock()
        self.closed = threading.Event()

    def next(self, timeout=10):
        deadline = time.time() + timeout
        while True:
            if len(self.buf) >= 16:
                n, t, _, ident = struct.unpack_from("<IHHQ", self.buf, 0)
                if len(self.buf) >= 16 + n:
                    p, self.buf = self.buf[16:16 + n], self.buf[16 + n:]
                    if t == T["PONG"]:
                        continue
                    return NAME.get(t, t), ident, p
            left = deadline - time.time()
            if left <= 0:
                raise queue.Empty()
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:
                raise queue.Empty()
            if not data:
                self.closed.set()
                raise EOFError("connection closed")
            self.buf += data


class FakeSquishd:
    """squishd's side of a remote worker's link: listens, authenticates the
    worker, welcomes it and pings it (the worker drops a silent squishd)."""

    def __init__(self, token, tls=None):
        self.token = token
        self.tls = tls
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(4)
        self.port = self.lsock.getsockname()[1]
        self.conn = None

    def accept(self):
        self.lsock.settimeout(20)
        sock, _ = self.lsock.accept()
        if self.tls is not None:
            sock.settimeout(20)
            c = SyncConn(self.tls.wrap_socket(sock, server_side=True))
        else:
            c = Conn(sock)
        _, p = c.expect("AUTH_CHALLENGE")
        magic, version, has_token = struct.unpack_from("<IHB", p, 0)
        assert magic == MAGIC and version == 1 and has_token == 1
        nonce_w, nonce_g = p[7:39], os.urandom(32)
        c.send("AUTH_REPLY", 0, nonce_g + mac(self.token, b"gateway", nonce_w, nonce_g))
        _, proof = c.expect("AUTH_PROOF")
        assert hmac.compare_digest(proof, mac(self.token, b"worker", nonce_w, nonce_g))
        c.expect("MODELS_HELD")
        c.expect("HELLO")
        c.send("WELCOME", 0, struct.pack("<HIIQ", VERSION, 1, 1000, 0))
        self.conn = c
        if self.tls is None:  # a TLS test ends before the worker misses PINGs (5 s)
            threading.Thread(target=self._ping, args=(c,), daemon=True).start()
        return c

    def _ping(self, c):
        while not c.closed.is_set():
            try:
                c.send("PING", 0, b"")
            except OSError:
                return
            time.sleep(0.3)

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.lsock.close()


ARENA_BYTES = 1 << 20


class FakeLocalSquishd:
    """squishd's side of a local worker's link: a UNIX socket, HELLO, and
    WELCOME with the shared-memory arena's fd (a memfd mapped here too)."""

    def __init__(self, tmp):
        self.path = os.path.join(tmp, "workers.sock")
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lsock.bind(self.path)
        self.lsock.listen(4)
        self.arena_fd = os.memfd_create("squish-test-arena")
        os.ftruncate(self.arena_fd, ARENA_BYTES)
        self.arena = mmap.mmap(self.arena_fd, ARENA_BYTES)
        self.conn = None

    def accept(self):
        self.lsock.settimeout(20)
        sock, _ = self.lsock.accept()
        sock.settimeout(None)
        # HELLO, read before the reader thread starts (WELCOME carries an fd).
        head = b""
        while len(head) < 16:
            head += sock.recv(16 - len(head))
        n, t, _, _ = struct.unpack("<IHHQ", head)
        body = b""
        while len(body) < n:
            body += sock.recv(n - len(body))
        assert t == T["HELLO"], t
        socket.send_fds(sock, [frame("WELCOME", 0, struct.pack("<HIIQ", VERSION, 1, 1000,
                                                                ARENA_BYTES))], [self.arena_fd])
        self.conn = Conn(sock)
        return self.conn

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.lsock.close()
        self.arena.close()
        os.close(self.arena_fd)


def hostport(addr):
    """("host", port) of "host:port" or "[v6]:port"."""
    host, port = addr.rsplit(":", 1)
    return host.strip("[]"), int(port)


def frontend(addr, token, fe_id, verify=True, tls=None):
    """A frontend's data connection: dials, proves the token, DATA_HELLO.
    Returns it and None, or the type of the frame that refused it. tls: a
    client context (the worker's certificate names worker-a)."""
    sock = socket.create_connection(hostport(addr), timeout=10)
    if tls is not None:
        c = SyncConn(tls.wrap_socket(sock, server_hostname="worker-a"))
    else:
        sock.settimeout(None)
        c = Conn(sock)
    nonce_w = os.urandom(32)
    c.send("AUTH_CHALLENGE", 0, struct.pack("<IHB", MAGIC, 1, 1) + nonce_w)
    name, _, p = c.next()
    if name != "AUTH_REPLY":
        return c, name
    nonce_g, mac_g = p[:32], p[32:]
    if verify:
        assert hmac.compare_digest(mac_g, mac(token, b"gateway", nonce_w, nonce_g)), "its proof"
    c.send("AUTH_PROOF", 0, mac(token, b"worker", nonce_w, nonce_g))
    c.send("DATA_HELLO", 0, struct.pack("<I", fe_id))
    return c, None


class Setup:
    """A worker (remote, or local: a UNIX socket and an arena) joined to a
    fake squishd, with a data listener."""

    def __init__(self, listen="127.0.0.1:0", local=False, tls=False):
        self.tmp = tempfile.mkdtemp(prefix="squish-wdata-")
        self.local = local
        extra, self.fe_tls = [], None
        gw_tls = None
        if tls:
            make_certs(self.tmp)
            gw_tls = tls_context(self.tmp, "gw", server=True)
            self.fe_tls = tls_context(self.tmp, "fe", server=False)
            extra = ["--cluster-tls-cert", os.path.join(self.tmp, "wk.pem"),
                     "--cluster-tls-key", os.path.join(self.tmp, "wk.key"),
                     "--cluster-tls-ca", os.path.join(self.tmp, "ca.pem")]
        self.token = os.urandom(24).hex().encode()
        self.token_path = os.path.join(self.tmp, "cluster.token")
        with open(self.token_path, "wb") as f:
            f.write(self.token + b"\n")
        os.chmod(self.token_path, 0o600)
        if local:
            self.squishd = FakeLocalSquishd(self.tmp)
            connect = self.squishd.path
        else:
            self.squishd = FakeSquishd(self.token, gw_tls)
            connect = "tcp://127.0.0.1:%d" % self.squishd.port
        self.log = os.path.join(self.tmp, "worker.log")
        with open(self.log, "ab") as f:
            self.worker = subprocess.Popen(
                [WORKER, "--connect", connect, "--device", "emu:0", "--cluster-token-file",
                 self.token_path, "--data-listen", listen, "--log-level", "debug"] + extra,
                stdout=f, stderr=subprocess.STDOUT)
        self.fes = []
        try:
            self.link = self.squishd.accept()
            _, p = self.link.expect("WORKER_DATA")
            self.addr, _ = read_str(p, 0)
        except Exception:
            self.dump()
            raise

    def load(self):
        self.link.send("MODEL_LOAD", MODEL, model_load())
        _, p = self.link.expect("MODEL_LOADED")
        mem, max_batch, in_elems, out_elems = struct.unpack_from("<QIQQ", p, 0)
        assert (in_elems, out_elems) == (IN_ELEMS, CLASSES), (in_elems, out_elems)

    def frontend(self, fe_id, token=None):
        c, refused = frontend(self.addr, token or self.token, fe_id, tls=self.fe_tls)
        self.fes.append(c)
        assert refused is None, refused
        return c

    def outputs(self, bid, count):
        """BATCH_OUTPUT frames until BATCH_DONE: (bytes, code, message)."""
        out = b""
        while True:
            name, ident, p = self.link.next(10)
            assert ident == bid, (name, ident)
            if name == "BATCH_DONE":
                code, msg = batch_done(p)
                return out, code, msg
            assert name == "BATCH_OUTPUT", name
            out += p

    def dump(self):
        try:
            with open(self.log) as f:
                print("# worker log:\n" + "".join("# " + ln for ln in f.readlines()[-40:]))
        except OSError:
            pass

    def close(self):
        """Stops the worker; a sanitizer's report in its log fails the test."""
        for c in self.fes:
            c.close()
        self.squishd.close()  # a local worker exits (cleanly) when squishd goes
        if not self.local and self.worker.poll() is None:
            self.worker.terminate()  # a remote one reconnects: SIGTERM stops it cleanly
        try:
            self.worker.wait(20)
        except subprocess.TimeoutExpired:
            self.worker.kill()
            self.worker.wait()
        with open(self.log, errors="replace") as f:
            text = f.read()
        shutil.rmtree(self.tmp, ignore_errors=True)
        for mark in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
            at = text.find(mark)
            assert at < 0, "the worker's log:\n" + text[max(0, at - 200):at + 3000]


def with_setup(fn, **kw):
    s = Setup(**kw)
    try:
        fn(s)
    except Exception:
        s.dump()
        raise
    finally:
        s.close()


@test
def worker_tells_squishd_its_data_address():
    def body(s):
        host, port = s.addr.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0, s.addr

    def wildcard(s):
        # A wildcard host is told as this end of the link to squishd.
        host, port = s.addr.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0, s.addr

    def ipv6(s):
        assert s.addr.startswith("[::1]:"), s.addr
        s.frontend(1)
        s.load()

    with_setup(body)
    with_setup(wildcard, listen="0.0.0.0:0")
    with_setup(wildcard, listen="[::]:0")
    if socket.has_ipv6 and os.path.exists("/proc/net/if_inet6"):
        with_setup(ipv6, listen="[::1]:0")


@test
def frontend_rows_run_and_come_back_to_their_frontend():
    def body(s):
        s.load()
        fe = s.frontend(0)
        ins = [input_row(i) for i in range(4)]
        want = [emu_row(b) for b in ins]
        # Batch 100: rows 1 and 3 from frontend 0 (src 1), sent BEFORE the
        # BATCH; rows 0 and 2 from squishd's BATCH_INPUT.
        fe.send("DATA_ROWS", 100, data_rows(4, [(1, ins[1]), (3, ins[3])]))
        time.sleep(0.1)
        s.link.send("BATCH_INPUT", 100, ins[0] + ins[2])
        s.link.send("BATCH", 100, batch(4, [0, 0, ROW_BYTES, 0], [0, 1, 0, 1]))
        out, code, msg = s.outputs(100, 4)
        assert code == 0, msg
        assert len(out) == 4 * OUT_STRIDE, len(out)
        rows = [out[i * OUT_STRIDE:(i + 1) * OUT_STRIDE] for i in range(4)]
        assert rows[0] == want[0] and rows[2] == want[2], "squishd's rows"
        assert rows[1] == bytes(OUT_STRIDE) and rows[3] == bytes(OUT_STRIDE), \
            "a frontend's outputs are not squishd's to see"
        ident, p = fe.expect("DATA_OUTPUT")
        o = data_output(p)
        assert ident == 100 and o["code"] == 0 and o["count"] == 4, o
        assert o["rows"] == [1, 3] and o["stride"] == OUT_STRIDE, o
        assert o["bytes"] == want[1] + want[3], "the frontend's rows' outputs"

        # Batch 101: the BATCH first, the rows later; row 3 absent.
        s.link.send("BATCH_INPUT", 101, ins[0] + ins[2])
        s.link.send("BATCH", 101, batch(4, [0, 0, ROW_BYTES, 0], [0, 1, 0, 1]))
        time.sleep(0.2)
        fe.send("DATA_ROWS", 101, data_rows(4, [(1, ins[1]), (3, None)]))
        out, code, msg = s.outputs(101, 4)
        assert code == 0, msg
        assert out[:OUT_STRIDE] == want[0]
        ident, p = fe.expect("DATA_OUTPUT")
        o = data_output(p)
        assert ident == 101 and o["rows"] == [1] and o["bytes"] == want[1], o
        fe.nothing(0.3)

        # Batch 102: every row the frontend's: no BATCH_INPUT, no BATCH_OUTPUT.
        fe.send("DATA_ROWS", 102, data_rows(2, [(0, ins[3]), (1, ins[2])]))
        s.link.send("BATCH", 102, batch(2, [0, 0], [1, 1]))
        out, code, msg = s.outputs(102, 2)
        assert code == 0 and out == b"", (code, msg, len(out))
        ident, p = fe.expect("DATA_OUTPUT")
        o = data_output(p)
        assert ident == 102 and o["rows"] == [0, 1] and o["bytes"] == want[3] + want[2], o

        # Batch 103 fails (its model is not loaded): the frontend hears why.
        fe.send("DATA_ROWS", 103, data_rows(1, [(0, ins[0])]))
        s.link.send("BATCH", 103, batch(1, [0], [1], model=999))
        out, code, msg = s.outputs(103, 1)
        assert code != 0 and "not loaded" in msg, (code, msg)
        ident, p = fe.expect("DATA_OUTPUT")
        o = data_output(p)
        assert ident == 103 and o["code"] == code and o["rows"] == [0], o
        assert o["bytes"] == b"" and "not loaded" in o["message"], o

    with_setup(body)


@test
def a_local_worker_takes_frontend_rows_beside_the_arena():
    def body(s):
        host, port = s.addr.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0, "a wildcard over a UNIX socket: " + s.addr
        s.load()
        fe = s.frontend(1)
        arena = s.squishd.arena
        ins = [input_row(40 + i) for i in range(4)]
        want = [emu_row(b) for b in ins]
        out_off = 65536
        arena[0:ROW_BYTES] = ins[0]
        arena[4096:4096 + ROW_BYTES] = ins[2]
        arena[out_off:out_off + 4 * OUT_STRIDE] = b"\xab" * (4 * OUT_STRIDE)
        fe.send("DATA_ROWS", 400, data_rows(4, [(1, ins[1]), (3, ins[3])]))
        s.link.send("BATCH", 400, batch(4, [0, 0, 4096, 0], [0, 2, 0, 2], out_off=out_off))
        out, code, msg = s.outputs(400, 4)
        assert code == 0 and out == b"", (code, msg, out)
        rows = [bytes(arena[out_off + i * OUT_STRIDE:out_off + (i + 1) * OUT_STRIDE])
                for i in range(4)]
        assert rows[0] == want[0] and rows[2] == want[2], "squishd's rows in the arena"
        assert rows[1] == rows[3] == b"\xab" * OUT_STRIDE, "the frontend's rows left alone"
        ident, p = fe.expect("DATA_OUTPUT")
        o = data_output(p)
        assert ident == 400 and o["rows"] == [1, 3] and o["bytes"] == want[1] + want[3], o
        # Only frontend rows: the output region (here outside the arena) is
        # not touched.
        fe.send("DATA_ROWS", 401, data_rows(1, [(0, ins[2])]))
        s.link.send("BATCH", 401, batch(1, [0], [2], out_off=1 << 40))
        out, code, msg = s.outputs(401, 1)
        assert code == 0, msg
        ident, p = fe.expect("DATA_OUTPUT")
        assert data_output(p)["bytes"] == want[2]

    with_setup(body, local=True, listen="0.0.0.0:0")


@test
def outputs_past_a_frame_come_in_several():
    # Rows of 6 MiB: two fit a frame (16 MiB at most), the third needs another.
    wide, classes = 78, 3 << 19
    stride = 4 * classes

    def body(s):
        s.link.send("MODEL_LOAD", wide, model_load(classes))
        s.link.expect("MODEL_LOADED")
        fe = s.frontend(3)
        ins = [input_row(60 + i) for i in range(3)]
        fe.send("DATA_ROWS", 500, data_rows(3, [(i, ins[i]) for i in range(3)]))
        s.link.send("BATCH", 500, batch(3, [0, 0, 0], [4, 4, 4], model=wide, out_stride=stride))
        out, code, msg = s.outputs(500, 3)
        assert code == 0 and out == b"", (code, msg)
        got = []
        for _ in range(2):
            ident, p = fe.expect("DATA_OUTPUT", timeout=20)
            o = data_output(p)
            assert ident == 500 and o["code"] == 0 and o["stride"] == stride, o["message"]
            assert len(p) <= 16 << 20 and len(o["bytes"]) == stride * len(o["rows"])
            for k, r in enumerate(o["rows"]):
                got.append(r)
                assert o["bytes"][k * stride:k * stride + 40] == emu_row(ins[r], 10), r
        assert got == [0, 1, 2], got
        fe.nothing(0.3)

    with_setup(body)


@test
def rows_that_never_come_fail_after_the_wait():
    def body(s):
        s.load()
        fe = s.frontend(4)
        ins = [input_row(10 + i) for i in range(2)]
        s.link.send("BATCH_INPUT", 200, ins[0])
        start = time.time()
        s.link.send("BATCH", 200, batch(2, [0, 0], [0, 5]))
        out, code, msg = s.outputs(200, 2)
        waited = time.time() - start
        assert code == 0, msg
        assert 1.8 <= waited < 4, waited
        assert out[:OUT_STRIDE] == emu_row(ins[0])
        ident, p = fe.expect("DATA_OUTPUT")
        o = data_output(p)
        assert ident == 200 and o["code"] != 0 and o["rows"] == [1] and o["bytes"] == b"", o
        assert "did not reach" in o["message"], o
        # Rows that come after their batch ran are dropped, not answered.
        fe.send("DATA_ROWS", 200, data_rows(2, [(1, ins[1])]))
        fe.nothing(0.3)

    with_setup(body)


@test
def a_frontend_gone_lets_its_batch_run():
    def body(s):
        s.load()
        fe = s.frontend(2)
        ins = [input_row(20 + i) for i in range(2)]
        s.link.send("BATCH_INPUT", 300, ins[0])
        start = time.time()
        s.link.send("BATCH", 300, batch(2, [0, 0], [0, 3]))
        time.sleep(0.3)
        s.link.send("FE_GONE", 2)
        out, code, msg = s.outputs(300, 2)
        waited = time.time() - start
        assert code == 0, msg
        assert waited < 1.5, "ran at FE_GONE, not at the 2 s wait: %.2f" % waited
        assert out[:OUT_STRIDE] == emu_row(ins[0])
        fe.nothing(0.3)
        # A frontend squishd said is gone may not come back.
        c, refused = frontend(s.addr, s.token, 2)
        s.fes.append(c)
        if refused is None:
            eventually(lambda: c.closed.is_set(), 5, "the gone frontend's connection closed")
        # A frontend whose connection closes: its rows count as absent at once.
        fe3 = s.frontend(7)
        time.sleep(0.1)
        fe3.close()
        time.sleep(0.2)
        start = time.time()
        s.link.send("BATCH", 301, batch(1, [0], [8]))
        out, code, msg = s.outputs(301, 1)
        assert code == 0 and out == b"" and time.time() - start < 1.5, (code, msg)

    with_setup(body)


@test
def a_frontend_without_the_token_is_refused():
    def body(s):
        c, refused = frontend(s.addr, b"not-the-token", 1, verify=False)
        s.fes.append(c)
        assert refused is None, refused
        name, _, p = c.next()
        assert name == "ERROR" and b"bad_proof" in p, (name, p)
        eventually(lambda: c.closed.is_set(), 5, "the connection closed")
        # Frames before the handshake are refused too.
        raw = socket.create_connection(hostport(s.addr))
        bad = Conn(raw)
        s.fes.append(bad)
        bad.send("DATA_HELLO", 0, struct.pack("<I", 1))
        eventually(lambda: bad.closed.is_set(), 5, "the connection closed")
        # The worker still serves.
        s.load()

    with_setup(body)


def make_certs(d):
    """A CA; squishd's certificate for 127.0.0.1, the worker's (worker-a), a
    frontend's; and a frontend certificate from another CA."""
    def run_ssl(*args):
        subprocess.run(["openssl"] + list(args), cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        run_ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "2", "-subj", "/CN=" + ca)
    for name, ca, san in (("gw", "ca", "IP:127.0.0.1"), ("wk", "ca", "DNS:worker-a"),
                          ("fe", "ca", "DNS:frontend-a"), ("rogue", "other-ca", "DNS:rogue")):
        run_ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name)
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write("subjectAltName=%s\nbasicConstraints=CA:FALSE\n" % san)
        run_ssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
                "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile", name + ".ext")


def tls_context(d, name, server):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_cert_chain(os.path.join(d, name + ".pem"), os.path.join(d, name + ".key"))
    ctx.load_verify_locations(os.path.join(d, "ca.pem"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@test
def the_data_listener_speaks_tls_with_the_workers_certificate():
    if shutil.which("openssl") is None:
        raise Skip("no openssl command to make test certificates")

    def body(s):
        s.load()
        fe = s.frontend(6)
        ins = [input_row(80 + i) for i in range(2)]
        fe.send("DATA_ROWS", 600, data_rows(2, [(1, ins[1])]))
        s.link.send("BATCH_INPUT", 600, ins[0])
        s.link.send("BATCH", 600, batch(2, [0, 0], [0, 7]))
        out, code, msg = s.outputs(600, 2)
        assert code == 0 and out[:OUT_STRIDE] == emu_row(ins[0]), (code, msg)
        ident, p = fe.expect("DATA_OUTPUT")
        o = data_output(p)
        assert ident == 600 and o["rows"] == [1] and o["bytes"] == emu_row(ins[1]), o
        # A frontend whose certificate another CA signed does not get in.
        rogue = tls_context(s.tmp, "rogue", server=False)
        try:
            c, refused = frontend(s.addr, s.token, 8, tls=rogue)
            s.fes.append(c)
            c.next(5)
            raise AssertionError("a stranger's certificate was taken")
        except (ssl.SSLError, OSError, EOFError):
            pass
        # Plain TCP does not get in either.
        raw = SyncConn(socket.create_connection(hostport(s.addr)))
        s.fes.append(raw)
        raw.send("AUTH_CHALLENGE", 0, struct.pack("<IHB", MAGIC, 1, 1) + os.urandom(32))
        try:
            f = raw.next(5)
            raise AssertionError("plain TCP answered: %s" % (f[0],))
        except (EOFError, OSError):
            pass

    with_setup(body, tls=True)


@test
def data_listen_needs_a_token():
    p = subprocess.run([WORKER, "--connect", "tcp://127.0.0.1:9", "--device", "emu:0",
                        "--data-listen", "127.0.0.1:0"], capture_output=True, text=True,
                       timeout=20)
    assert p.returncode == 2 and "--cluster-token-file" in p.stderr, p


if __name__ == "__main__":
    run()
