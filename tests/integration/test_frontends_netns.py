"""Frontends around one dispatcher on five "machines" (issue 25): network
namespaces on one bridge stand in for the dispatcher's host (where this
test and its clients run), two frontends' hosts and two worker hosts
(emulated devices). Clients load both frontends; every request gets
exactly one answer (squish-loadgen counts stray answers, and 503s without
Retry-After); the dispatcher's own count of its frontends' link bytes stays
a few hundred bytes an item while the frontends' links to the workers carry
the tensors. Then, under load, one frontend is SIGKILLed and one worker
host is cut off: the other frontend's clients lose nothing (200, or 503
with Retry-After), and nothing is answered twice.

The test creates and removes its namespaces, bridge and veth pairs;
addresses exist only inside them. Needs root and iproute2: skipped
otherwise."""

import json
import os
import re
import secrets
import subprocess
import tempfile
import threading
import time

from harness import WORKER, Skip, Squishd, eventually, run, test
from test_cluster import IP, LOADGEN, Net, sh


PORT = 7100
DATA_PORT = 7300
HOSTS = {"f1": 2, "f2": 3, "h1": 4, "h2": 5}  # 10.78.0.N; the dispatcher's host is .1
MODEL = {"name": "m", "profile": {"alpha_ms": 1.0, "beta_ms": 4.0}, "max_batch": 16,
         "input": {"shape": [3, 32, 32]}, "num_classes": 10, "default_slo_ms": 200}


class Bridge(Net):
    """Namespaces gw (the dispatcher's host; this process enters it), f1,
    f2, h1, h2, each with a veth whose other end is on a bridge in gw:
    10.78.0.1/24 on the bridge, 10.78.0.N/24 in each host."""

    def __init__(self):
        if os.geteuid() != 0 or not os.path.exists(IP):
            raise Skip("needs root and iproute2 for network namespaces")
        tag = secrets.token_hex(3)
        self.ns = {k: "sq%s-%s" % (k, tag) for k in ["gw"] + list(HOSTS)}
        self.veth = {h: ("sqb%s%s" % (h, tag), "sqv%s%s" % (h, tag)) for h in HOSTS}
        self.home = None
        br = "sqbr" + tag
        try:
            for n in self.ns.values():
                sh("netns", "add", n)
                sh("-n", n, "link", "set", "lo", "up")
            gw = self.ns["gw"]
            sh("-n", gw, "link", "add", br, "type", "bridge")
            sh("-n", gw, "addr", "add", "10.78.0.1/24", "dev", br)
            sh("-n", gw, "link", "set", br, "up")
            for h, n in HOSTS.items():
                g, w = self.veth[h]
                sh("link", "add", g, "netns", gw, "type", "veth", "peer", "name", w, "netns",
                   self.ns[h])
                sh("-n", gw, "link", "set", g, "master", br)
                sh("-n", gw, "link", "set", g, "up")
                sh("-n", self.ns[h], "addr", "add", "10.78.0.%d/24" % n, "dev", w)
                sh("-n", self.ns[h], "link", "set", w, "up")
            self.enter(gw)
        except BaseException:
            self.cleanup()
            raise

    def prefix(self, host):
        return [IP, "netns", "exec", self.ns[host]]


def metric(s, name, labels=""):
    text = s.get("/metrics").raw.decode()
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else 0.0


def loadgen(host, port, rate, seconds):
    return subprocess.Popen(
        [LOADGEN, "--host", host, "--port", str(port), "--path", "/v2/models/m/infer",
         "--tensor", "3x32x32", "--slo-ms", "200", "--warmup", "0", "--rate", str(rate),
         "--duration", str(seconds), "--timeout-ms", "5000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(p):
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    r = json.loads(out)
    # loadgen counts a 503 other than a shed (worker_lost, not_ready) as an
    # error and logs the first five errors: here each must be such a 503
    # (no_retry_after says each 503 had Retry-After).
    r["other_errors"] = r["errors"] - len(re.findall(r"status 503: ", err))
    r["stderr"] = err[-600:]
    return r


@test
def five_hosts_every_request_answered_once_through_a_frontend_and_a_worker_host_lost():
    net = Bridge()
    tmp = tempfile.mkdtemp(prefix="squish-fe-netns-")
    token = os.path.join(tmp, "cluster.token")
    with open(token, "w") as f:
        f.write(secrets.token_hex(24))
    os.chmod(token, 0o600)
    procs, fronts, d = [], [], None
    try:
        os.mkdir(os.path.join(tmp, "d"))
        d = Squishd(workers="none", tmp=os.path.join(tmp, "d"),
                    extra=["--role", "dispatcher", "--listen", "10.78.0.1:0",
                           "--cluster-listen", "10.78.0.1:%d" % PORT, "--cluster-token-file",
                           token, "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "1000"],
                    host="10.78.0.1")
        for h in ("h1", "h2"):
            procs.append(net.exec(h, [WORKER, "--connect", "tcp://10.78.0.1:%d" % PORT,
                                      "--cluster-token-file", token, "--device", "emu:0",
                                      "--host-name", h, "--data-listen",
                                      "0.0.0.0:%d" % DATA_PORT],
                                  os.path.join(tmp, "worker-%s.log" % h)))
        d.wait_ready(workers=2, timeout=30)
        for h in ("f1", "f2"):
            os.mkdir(os.path.join(tmp, h))
            fronts.append(Squishd(
                workers="none", tmp=os.path.join(tmp, h), prefix=net.prefix(h),
                host="10.78.0.%d" % HOSTS[h],
                extra=["--role", "frontend", "--listen", "0.0.0.0:0", "--dispatcher",
                       "10.78.0.1:%d" % PORT, "--cluster-token-file", token]))
        for f in fronts:
            eventually(lambda f=f: "joined the dispatcher" in f.read_log(), 20, "joined")
        # The workers tell their addresses on their own hosts, not a wildcard.
        log = d.read_log()
        for h in ("h1", "h2"):
            assert "addr=10.78.0.%d:%d" % (HOSTS[h], DATA_PORT) in log, log[-2000:]
        r = fronts[0].request("POST", "/models", body=json.dumps(MODEL).encode(),
                              headers={"Authorization": "Bearer " + d.token,
                                       "Content-Type": "application/json"})
        assert r.status in (200, 201, 202), r
        for f in fronts:
            eventually(lambda f=f: f.get("/v2/health/ready").status == 200, 30,
                       "frontend ready")
            eventually(lambda f=f: f.get("/v2/models/m/ready").status == 200, 30, "m ready")

        # Both frontends under load: every request answered once, rows around
        # the dispatcher.
        items0 = metric(d, "squish_frontend_items_total")
        link0 = (metric(d, "squish_frontend_link_bytes_total", '{direction="in"}')
                 + metric(d, "squish_frontend_link_bytes_total", '{direction="out"}'))
        ps = [loadgen("10.78.0.%d" % HOSTS[h], f.port, 150, 4) for h, f in
              zip(("f1", "f2"), fronts)]
        res = [result(p) for p in ps]
        for r in res:
            assert r["stray_answers"] == 0 and r["no_retry_after"] == 0, r
            assert r["errors"] == 0 and r["timeouts"] == 0 and r["conn_errors"] == 0, r
            assert r["good"] + r["late"] + r["dropped"] == r["requests"], r
            assert r["good"] >= 0.95 * r["requests"], r
        items = metric(d, "squish_frontend_items_total") - items0
        link = (metric(d, "squish_frontend_link_bytes_total", '{direction="in"}')
                + metric(d, "squish_frontend_link_bytes_total", '{direction="out"}') - link0)
        answered = sum(r["requests"] for r in res)
        assert items >= answered, (items, answered)
        per_item = link / items
        assert per_item < 300, per_item
        def rows_out():
            text = d.get("/metrics").raw.decode()
            return sum(float(v) for v in re.findall(
                r'^squish_frontend_bytes_total\{frontend="[^"]+",link="workers",'
                r'direction="out"\} (\S+)$', text, re.M))
        rows = eventually(lambda: rows_out() >= answered * 3 * 32 * 32 * 4 and rows_out(), 10,
                          "the frontends' rows in the dispatcher's one view")
        assert rows >= answered * 3 * 32 * 32 * 4, rows
        print("# dispatcher link %.1f bytes an item; %.1f MB of rows frontend -> worker"
              % (per_item, rows / 1e6), flush=True)

        # A frontend SIGKILLed and a worker host cut off, under load.
        ps = [loadgen("10.78.0.%d" % HOSTS[h], f.port, 100, 5) for h, f in
              zip(("f1", "f2"), fronts)]
        time.sleep(1.5)
        fronts[1].proc.kill()
        time.sleep(1.0)
        net.link("h2", False)
        survivor, victim = result(ps[0]), result(ps[1])
        for r in (survivor, victim):
            assert r["stray_answers"] == 0 and r["no_retry_after"] == 0, r
        # The surviving frontend's clients: 200 or 503 with Retry-After, each once.
        assert survivor["errors"] <= 5 and survivor["other_errors"] == 0, survivor
        assert survivor["timeouts"] == 0, survivor
        assert survivor["conn_errors"] == 0, survivor
        assert (survivor["good"] + survivor["late"] + survivor["dropped"] + survivor["errors"]
                == survivor["requests"]), survivor
        assert survivor["good"] >= 0.8 * survivor["requests"], survivor
        print("# surviving frontend: %d of %d good, %d shed, %d other 503 %s"
              % (survivor["good"], survivor["requests"], survivor["dropped"], survivor["errors"],
                 re.findall(r'"code":"(\w+)"', survivor["stderr"])), flush=True)
        eventually(lambda: re.search(r"frontend lost id=\d+", d.read_log()), 10, "frontend lost")
        eventually(lambda: re.search(r"worker lost id=\d+ device=emu:0@h2", d.read_log()), 10,
                   "the cut-off worker host lost")
        # After both: the survivor serves on the remaining worker host.
        r = result(loadgen("10.78.0.2", fronts[0].port, 50, 2))
        assert r["good"] == r["requests"] and r["stray_answers"] == 0, r
    finally:
        for f in fronts:
            f.cleanup()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if d is not None:
            d.cleanup()
        net.cleanup()
        if not os.environ.get("SQUISH_IT_KEEP"):
            subprocess.run(["rm", "-rf", tmp], check=False)


if __name__ == "__main__":
    run()
