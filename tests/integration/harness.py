"""Integration-test harness: starts the real squishd (and its real workers)
on an ephemeral port in a temporary directory, talks HTTP to it, and checks
every JSON body against its JSON Schema in schemas/ (the schemas are the
contract). Prints TAP so that meson counts each check.

Run with Debian's /usr/bin/python3 (python3-jsonschema)."""

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import jsonschema

BUILD = os.environ.get("SQUISH_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build"))
SOURCE = os.environ.get("SQUISH_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))
SQUISHD = os.path.join(BUILD, "gateway", "squishd")
WORKER = os.path.join(BUILD, "worker", "squish-worker")
LOADGEN = os.path.join(BUILD, "bench", "squish-loadgen")
SCHEMAS = os.path.join(SOURCE, "schemas")



def sanitized():
    """Whether the build under test runs with sanitizers (ASan, UBSan): its
    throughput is a fraction of a release build's."""
    try:
        with open(os.path.join(BUILD, "meson-info", "intro-buildoptions.json")) as f:
            opts = json.load(f)
    except OSError:
        return False
    return any(o["name"] == "b_sanitize" and o["value"] not in ("none", "", [])
               for o in opts)


_schema_cache = {}
# squishd instances of the running test; a failure shows the end of their logs.
_started = []
LOG_TAIL = 6000


def loadgen(s, model, rate, seconds, slo_ms=100, warmup=0, timeout_ms=5000, seed=None,
            per_second=False, wait=True, tensor="3x4x4", query=""):
    """Open-loop Poisson load of binary OIP tensors (CxHxW) on model
    through squish-loadgen: its JSON summary, or the process when wait is
    False (communicate() gives the summary). query: appended to the path
    ("?priority=1")."""
    args = [LOADGEN, "--port", str(s.port), "--path", "/v2/models/%s/infer%s" % (model, query),
            "--tensor", tensor, "--slo-ms", str(slo_ms), "--warmup", str(warmup), "--rate",
            str(rate), "--duration", str(seconds), "--timeout-ms", str(timeout_ms)]
    if seed is not None:
        args += ["--seed", str(seed)]
    if per_second:
        args.append("--per-second")
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return p
    out, err = p.communicate(timeout=seconds + warmup + 60)
    assert p.returncode == 0, err[-2000:]
    return json.loads(out)


def schema(name):
    if name not in _schema_cache:
        with open(os.path.join(SCHEMAS, name + ".schema.json")) as f:
            _schema_cache[name] = json.load(f)
    return _schema_cache[name]


def _store():
    store = {}
    for f in os.listdir(SCHEMAS):
        if f.endswith(".schema.json"):
            with open(os.path.join(SCHEMAS, f)) as fh:
                doc = json.load(fh)
            store[doc.get("$id", f)] = doc
    return store


def validate(body, name):
    """Validates body against schemas/<name>.schema.json; $refs between the
    schema files resolve by their $id."""
    s = schema(name)
    cls = jsonschema.validators.validator_for(s)
    cls.check_schema(s)
    resolver = jsonschema.RefResolver(base_uri=s.get("$id", ""), referrer=s, store=_store())
    cls(s, resolver=resolver).validate(body)


class Response:
    def __init__(self, status, headers, raw):
        self.status = status
        self.headers = {k.lower(): v for k, v in headers}
        self.raw = raw
        self.json = None
        if self.headers.get("content-type", "").startswith("application/json"):
            self.json = json.loads(raw)

    def __repr__(self):
        return "<%d %s>" % (self.status, self.raw[:200])


class Squishd:
    """One squishd process with its own temporary directory."""

    def __init__(self, workers="emu:2", extra=(), env=None, tmp=None, prefix=(),
                 host="127.0.0.1"):
        """prefix: a command that runs squishd elsewhere (ip netns exec NS),
        where requests reach it at host (give --listen HOST:0 in extra)."""
        self.host = host
        self.own_tmp = tmp is None
        self.tmp = tmp or tempfile.mkdtemp(prefix="squish-it-")
        self.port_file = os.path.join(self.tmp, "port")
        if os.path.exists(self.port_file):
            os.unlink(self.port_file)
        self.log_path = os.path.join(self.tmp, "squishd.log")
        self.db = os.path.join(self.tmp, "squish.db")
        # A wider dispatch margin than the default: CI machines are noisy, and
        # these tests check behaviour, not how close to the SLO squishd runs.
        args = [SQUISHD, "--listen", "127.0.0.1:0", "--port-file", self.port_file,
                "--db", self.db, "--workers", workers, "--worker-bin", WORKER,
                "--dispatch-margin-us", "10000", "--timer-slack-us", "30000"] + list(extra)
        args = list(prefix) + args
        self.log = open(self.log_path, "ab")
        self.tail = None
        _started.append(self)
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=e)
        self.port = None
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("squishd exited with %d:\n%s" % (self.proc.returncode, self.read_log()))
            if os.path.exists(self.port_file):
                with open(self.port_file) as f:
                    txt = f.read().strip()
                if txt:
                    self.port = int(txt)
                    break
            time.sleep(0.02)
        if self.port is None:
            raise RuntimeError("squishd did not write its port file")

    @property
    def token(self):
        with open(os.path.join(self.tmp, "admin.token")) as f:
            return f.read().strip()

    def read_log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def request(self, method, path, body=None, headers=None, schema_name=None, timeout=30):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            resp = Response(r.status, r.getheaders(), r.read())
        finally:
            conn.close()
        if resp.json is not None:
            # Every error body, whatever the route, is the error schema.
            if resp.status >= 400:
                validate(resp.json, "error")
            elif schema_name is not None:
                validate(resp.json, schema_name)
        return resp

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def wait_ready(self, workers=1, timeout=10):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            last = self.get("/v2/health/ready")
            if last.status == 200 and last.json["workers"] >= workers:
                return last
            time.sleep(0.02)
        raise AssertionError("not ready with %d workers after %ss: %r" % (workers, timeout, last))

    def worker_pids(self):
        """Live child worker processes: {device: pid}."""
        out = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % pid) as f:
                    stat = f.read()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                state = stat.rsplit(")", 1)[1].split()[0]
                if ppid != self.proc.pid or state == "Z":
                    continue
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    argv = f.read().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            if b"--device" in argv:
                out[argv[argv.index(b"--device") + 1].decode()] = int(pid)
        return out

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("squishd did not exit within %ss of %s" % (timeout, sig))
        self.log.close()
        return self.proc.returncode

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self.log.closed:
            self.log.close()
        try:
            self.tail = self.read_log()[-LOG_TAIL:]
        except OSError:
            pass
        if self.own_tmp and not os.environ.get("SQUISH_IT_KEEP"):
            shutil.rmtree(self.tmp, ignore_errors=True)


_tests = []


class Skip(Exception):
    """Raised by a test that cannot run here (a dependency scripts/bootstrap
    installs is absent): reported as TAP "ok ... # SKIP reason"."""


def test(fn):
    _tests.append(fn)
    return fn


def timing(fn):
    """Marks a test whose bounds are times on a shared host: a failed
    assertion is retried once, the first failure shown. This guest's speed
    moves in steps of up to 30% that last seconds (bench/RESULTS.md,
    session 17), and three such tests failed together in one CI run; the
    bugs they are named after (a burst held for its SLO, a drift never
    corrected) fail both tries."""
    fn.timing = True
    return fn


def _run_one(t):
    try:
        t()
    except AssertionError:
        if not getattr(t, "timing", False):
            raise
        tb = traceback.format_exc().splitlines()
        print("# %s: a timing bound failed once; retried. %s" % (t.__name__, tb[-1]), flush=True)
        sys.stderr.write("=== %s: retried after\n%s\n" % (t.__name__, "\n".join(tb)))
        del _started[:]
        t()


def run():
    """Runs every @test function; each is one TAP line. A failure prints the
    traceback as TAP diagnostics, and to stderr with the end of the logs of
    the squishd processes the test started (meson and CI show stderr)."""
    only = sys.argv[1:]
    # A file that imports another test file's helpers registers that
    # file's tests too: run only the ones of the script that was started.
    mine = [t for t in _tests if t.__module__ == "__main__"]
    chosen = [t for t in mine if not only or t.__name__ in only]
    print("1..%d" % len(chosen), flush=True)
    failed = 0
    for i, t in enumerate(chosen, 1):
        start = time.time()
        del _started[:]
        try:
            _run_one(t)
            print("ok %d - %s (%.2fs)" % (i, t.__name__, time.time() - start), flush=True)
        except Skip as why:
            print("ok %d - %s # SKIP %s" % (i, t.__name__, why), flush=True)
        except Exception:  # noqa: BLE001 - report every failure as TAP
            failed += 1
            print("not ok %d - %s" % (i, t.__name__), flush=True)
            tb = traceback.format_exc()
            for line in tb.splitlines():
                print("# " + line, flush=True)
            sys.stderr.write("=== %s failed (%.2fs)\n%s" % (t.__name__, time.time() - start, tb))
            shown = set()
            for n, s in reversed(list(enumerate(_started))):
                if s.log_path in shown:  # restarts on one directory share a log
                    continue
                shown.add(s.log_path)
                tail = s.tail
                if tail is None:
                    try:
                        tail = s.read_log()[-LOG_TAIL:]
                    except OSError:
                        tail = "(log gone)"
                sys.stderr.write("--- squishd #%d log, last %d chars:\n%s\n" % (n, LOG_TAIL, tail))
            sys.stderr.flush()
    sys.exit(1 if failed else 0)


def eventually(pred, timeout, what, step=0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
