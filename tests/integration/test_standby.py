"""A standby takes over (issue 14): two squishd on one PostgreSQL model DB
(a private cluster that tests/modeldb/pg_cluster.py starts; this program
runs under it and reads SQUISH_TEST_PG). One leads; the other answers as a
standby (live 200; ready and every other route 503 {"code": "standby",
"leader": ADDR} with Retry-After). SIGKILL the leader under load: the
standby leads within 5 s, every request of the client is answered (200, or
503 with Retry-After; a client that loses its connection to the dead leader
asks the other address, as a client behind a Kubernetes Service would), and
the DB holds every model version and plan that was acknowledged. A leader
whose DB session was ended, while a standby took the lock, exits (status 3)
instead of leading twice."""

import json
import re
import os
import http.client
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

from harness import Skip, Squishd, eventually, run, test

PG = os.environ.get("SQUISH_TEST_PG")
LOCK_KEY = 0x73717569736864  # gateway/gw_leader.h: "squishd"
MODEL = {"profile": {"alpha_ms": 1.0, "beta_ms": 2.0}, "max_batch": 8, "default_slo_ms": 500,
         "input": {"shape": [3, 4, 4]}, "num_classes": 3}


def pair(tmp):
    """Leader and standby: the same DB and admin token, their own sockets."""
    if PG is None:
        raise Skip("needs PostgreSQL: run under tests/modeldb/pg_cluster.py")
    token = secrets.token_hex(32)
    out = []
    for name in ("a", "b"):
        d = os.path.join(tmp, name)
        os.makedirs(d)
        tf = os.path.join(d, "admin.token")
        with open(tf, "w") as f:
            f.write(token + "\n")
        os.chmod(tf, 0o600)
        out.append(d)
    return out


class Pair:
    """The temporary directory of a test and the squishd started in it
    (a/ and b/, the same admin token), cleaned up on exit."""

    def __enter__(self):
        self.tmp = tempfile.mkdtemp(prefix="squish-standby-")
        self.dirs = pair(self.tmp)
        self.started = []
        return self

    def start(self, which):
        s = start(self.dirs[which])
        self.started.append(s)
        return s

    def __exit__(self, *exc):
        for s in self.started:
            s.cleanup()
        if not os.environ.get("SQUISH_IT_KEEP"):
            shutil.rmtree(self.tmp, ignore_errors=True)


def start(d, leader_timeout_ms=2000):
    return Squishd(workers="emu:1", tmp=d, extra=[
        "--db", PG, "--admin-token-file", os.path.join(d, "admin.token"),
        "--socket", os.path.join(d, "squishd.sock"),
        "--leader-timeout-ms", str(leader_timeout_ms)])


def psql(sql):
    out = subprocess.run(["psql", PG, "-Atc", sql], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def upload(s, name, version):
    body = dict(MODEL, name=name, version=version)
    return s.request("POST", "/models", body=json.dumps(body),
                     headers={"Authorization": "Bearer " + s.token,
                              "Content-Type": "application/json"})


def infer_once(port, name, timeout=5):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 4, 4],
                                       "datatype": "FP32", "data": [0.5] * 48}]})
        conn.request("POST", "/v2/models/%s/infer" % name, body=body,
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.getheader("retry-after"), r.read()
    finally:
        conn.close()


class Client(threading.Thread):
    """Requests one after another, each answered once: a connection error
    sends the same request to the other address (the load balancer's
    part); 503 standby too. The answer that counts is the final one."""

    def __init__(self, ports, name):
        super().__init__(daemon=True)
        self.ports, self.name = ports, name
        self.stop = threading.Event()
        self.answers = []  # (status, retry_after, code, when)
        self.resent = 0

    def run(self):
        i = 0
        while not self.stop.is_set():
            deadline = time.time() + 15
            while True:
                port = self.ports[i % 2]
                try:
                    status, ra, body = infer_once(port, self.name)
                except (OSError, http.client.HTTPException):
                    status = None
                if status == 503 and b'"standby"' in body:
                    status = None
                if status is not None:
                    code = json.loads(body).get("code") if status != 200 else None
                    self.answers.append((status, ra, code, time.time()))
                    break
                self.resent += 1
                i += 1
                if time.time() > deadline:
                    self.answers.append(("unanswered", None, None, time.time()))
                    break
                time.sleep(0.05)
            time.sleep(0.01)


@test
def a_standby_answers_and_takes_over_after_a_sigkill_under_load():
    with Pair() as P:
        a = P.start(0)
        a.wait_ready(workers=1)
        b = P.start(1)
        r = eventually(lambda: b.get("/v2/health/ready").json.get("leader"), 10,
                       "the standby names the leader")
        r = b.get("/v2/health/ready")
        assert r.status == 503 and r.json["code"] == "standby", r
        assert r.json["leader"] == "http://127.0.0.1:%d" % a.port, r.json
        assert r.headers.get("retry-after") == "1", r
        assert b.get("/v2/health/live").status == 200
        for path in ("/models", "/v2/models/x", "/v1/plan"):
            r = b.get(path)
            assert r.status == 503 and r.json["code"] == "standby", (path, r)

        # Three acknowledged versions of two models, a plan.
        for name, v in (("m", 1), ("m", 2), ("n", 1)):
            r = upload(a, name, v)
            assert r.status == 201, r
        st, _, _ = infer_once(a.port, "m")
        assert st == 200
        epoch = eventually(lambda: a.get("/v1/plan").json.get("epoch"), 15, "a plan")

        clients = [Client([a.port, b.port], "m") for _ in range(4)]
        for c in clients:
            c.start()
        time.sleep(2.0)
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        t0 = time.time()
        eventually(lambda: b.get("/v2/health/ready").status == 200, 10, "the standby leads")
        t_ready = time.time()
        took = t_ready - t0
        time.sleep(3.0)
        for c in clients:
            c.stop.set()
        for c in clients:
            c.join(30)
        answers = [x for c in clients for x in c.answers]
        print("# takeover %.2f s; %d requests, %d sent again to the other address, %d answered "
              "503 (with Retry-After)" % (took, len(answers), sum(c.resent for c in clients),
                                         sum(1 for x in answers if x[0] == 503)))
        assert took < 5.0, took
        bad = [x for x in answers if not (x[0] == 200 or (x[0] == 503 and x[1] is not None))]
        assert not bad, bad[:10]
        before = sum(1 for x in answers if x[0] == 200 and x[3] < t0)
        after = sum(1 for x in answers if x[0] == 200 and x[3] > t_ready)
        assert before > 0 and after > 0, (before, after)
        assert all(c.answers and c.answers[-1][0] == 200 for c in clients), \
            [c.answers[-3:] for c in clients]

        # Nothing acknowledged is lost.
        auth = {"Authorization": "Bearer " + b.token}
        got = b.get("/models/m", headers=auth).json
        assert [v["version"] for v in got["versions"]] == [1, 2], got
        assert b.get("/models/n", headers=auth).status == 200
        m = re.search(r"plan to reapply epoch=(\d+)", b.read_log())
        assert m and int(m.group(1)) >= epoch, (epoch, b.read_log()[-3000:])
        assert b.stop() == 0


def free_port():
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


@test
def a_frontend_rejoins_the_standby_that_takes_over_and_answers_each_request_once():
    """Issue 25: dispatchers as leader and standby (--role dispatcher), a
    frontend given both cluster addresses. The leader SIGKILLed under load
    through the frontend: each request is answered once, 200 or 503 with
    Retry-After (the frontend answers what it held when its dispatcher went);
    the frontend joins the standby once it leads, and serves again."""
    with Pair() as P:
        ctoken = os.path.join(P.tmp, "cluster.token")
        with open(ctoken, "w") as f:
            f.write(secrets.token_hex(24))
        os.chmod(ctoken, 0o600)
        ports = [free_port(), free_port()]
        ds = []
        for i in range(2):
            d = Squishd(workers="emu:1", tmp=P.dirs[i], extra=[
                "--db", PG, "--admin-token-file", os.path.join(P.dirs[i], "admin.token"),
                "--socket", os.path.join(P.dirs[i], "squishd.sock"), "--leader-timeout-ms",
                "2000", "--role", "dispatcher", "--cluster-listen", "127.0.0.1:%d" % ports[i],
                "--cluster-token-file", ctoken])
            P.started.append(d)
            ds.append(d)
            if i == 0:
                d.wait_ready(workers=1)
        a, b = ds
        os.makedirs(os.path.join(P.tmp, "f"))
        f = Squishd(workers="none", tmp=os.path.join(P.tmp, "f"), extra=[
            "--role", "frontend", "--cluster-token-file", ctoken, "--dispatcher",
            "127.0.0.1:%d,127.0.0.1:%d" % tuple(ports)])
        P.started.append(f)
        eventually(lambda: re.search(r"joined the dispatcher", f.read_log()), 15, "joined")
        body = dict(MODEL, name="fm", version=1)
        r = f.request("POST", "/models", body=json.dumps(body),  # forwarded to the leader
                      headers={"Authorization": "Bearer " + a.token,
                               "Content-Type": "application/json"})
        assert r.status == 201, r
        eventually(lambda: f.get("/v2/models/fm/ready").status == 200, 15, "fm ready")
        clients = [Client([f.port, f.port], "fm") for _ in range(3)]
        for c in clients:
            c.start()
        time.sleep(1.5)
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        t0 = time.time()
        eventually(lambda: re.search(r"joined the dispatcher addr=127\.0\.0\.1:%d" % ports[1],
                                     f.read_log()), 15, "the frontend joined the new leader")
        eventually(lambda: f.get("/v2/health/ready").status == 200, 15,
                   "the frontend ready on the new leader")
        took = time.time() - t0
        time.sleep(2.0)
        for c in clients:
            c.stop.set()
        for c in clients:
            c.join(30)
        answers = [x for c in clients for x in c.answers]
        print("# frontend back in %.2f s; %d requests, %d answered 503 (with Retry-After)"
              % (took, len(answers), sum(1 for x in answers if x[0] == 503)))
        bad = [x for x in answers if not (x[0] == 200 or (x[0] == 503 and x[1] is not None))]
        assert not bad, bad[:10]
        assert all(c.answers and c.answers[-1][0] == 200 for c in clients), \
            [c.answers[-3:] for c in clients]


@test
def a_leader_whose_lock_was_taken_stops_serving():
    with Pair() as P:
        a = P.start(0)
        a.wait_ready(workers=1)
        # The leader's DB session ends (a DB failover, say) and another
        # session takes the lock before the leader's watchdog comes back for
        # it: psql here, queued for the lock before the leader's session is
        # ended (PostgreSQL grants a queued waiter at the release, ahead of
        # any later try), holding it for 3 s.
        holder = subprocess.Popen(
            ["psql", PG, "-Atc", "SELECT pg_advisory_lock(%d); SELECT pg_sleep(3);" % LOCK_KEY],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        waiting = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                   "AND objid::bigint = %d" % (LOCK_KEY & 0xffffffff))
        eventually(lambda: psql(waiting) == "1", 10, "psql waits for the lock")
        psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
             "WHERE application_name LIKE 'squishd %'")
        eventually(lambda: a.proc.poll() is not None or holder.poll() is not None, 10,
                   "the old leader exits")
        assert a.proc.poll() is not None, ("psql", holder.returncode, holder.stderr.read())
        assert a.proc.returncode == 3, (a.proc.returncode, a.read_log()[-2000:])
        assert "lost leadership" in a.read_log()
        assert holder.wait(30) == 0, holder.stderr.read()


@test
def the_model_db_connection_comes_back_after_the_server_drops_it():
    with Pair() as P:
        a = P.start(0)
        a.wait_ready(workers=1)
        assert upload(a, "before", 1).status == 201
        # The server ends squishd's DB sessions (not the leadership one: that
        # is the test above): the next job reconnects instead of failing.
        psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> "
             "pg_backend_pid() AND datname = current_database() AND "
             "application_name NOT LIKE 'squishd %'")
        time.sleep(1.2)
        r = upload(a, "after", 1)
        assert r.status == 201, (r, a.read_log()[-2000:])
        assert "model database reconnected" in a.read_log()
        assert a.get("/models/after", headers={"Authorization": "Bearer " + a.token}).status == 200
        assert a.stop() == 0


if __name__ == "__main__":
    run()
