"""The shipped Grafana dashboard (scripts/grafana-squish.json) and the
metric names of the docs, against a live squishd.

squishd runs on two emu devices with an emulated model that gets traffic
(ok, and refused for an SLO no batch meets), one that never does, and an
emulated pipeline (a detector feeding a classifier on its crops) that
answers queries and refuses some. Debian's real Prometheus (on loopback, its storage in a temporary
directory) scrapes squishd every second. Every expression of every panel,
its Grafana variables replaced by concrete values, is evaluated through
Prometheus's /api/v1/query at each second from the first scrape, through
the traffic, a worker's restart and an idle spell longer than the rate
window: each must succeed and give no NaN (a rate ratio of an idle model,
a quantile of no observations). The restarts panel shows 0 per worker
before the first restart and the restart after it; the pipeline panels
show the pipeline's queries. And every squish_* name written in README.md
and docs/*.md is exported: by this squishd, by a frontend joined to it,
or by a standby (squish_leader; a leader and a standby on a private
PostgreSQL cluster)."""

import glob
import io
import json
import math
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import numpy as np
from PIL import Image

from harness import SOURCE, Skip, Squishd, eventually, run, test
from test_remote import Cluster, cluster_addr

PROMETHEUS = "/usr/bin/prometheus"
DASHBOARD = os.path.join(SOURCE, "scripts", "grafana-squish.json")
JPEG_PATH = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
SCRAPE_S = 1
# What Grafana gives its variables at a 1 s scrape interval and a 1 s step:
# $__rate_interval is max($__interval + scrape interval, 4 x scrape interval).
GRAFANA_VARS = {"__rate_interval": "4s", "__interval": "1s", "__interval_ms": "1000",
                "__range": "5m", "__range_s": "300", "__range_ms": "300000"}
RATE_WINDOW_S = 4

_env = {}  # the squishd, the cluster, Prometheus and the times of the traffic


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def upload(s, cfg):
    r = s.request("POST", "/models", body=json.dumps(cfg).encode(),
                  headers=dict(auth(s), **{"Content-Type": "application/json"}))
    assert r.status in (200, 201, 202), r


def gray_jpeg():
    """A small flat JPEG, for the pipeline's frames."""
    out = io.BytesIO()
    Image.fromarray(np.full((64, 64, 3), 120, np.uint8)).save(out, "JPEG", quality=95)
    return out.getvalue()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def squishd():
    """squishd (cluster listener on, for the frontend of the docs test) on
    emu:2 with r50 (traffic), idle (none) and the pipeline faces."""
    if "s" in _env:
        return _env["s"]
    c = Cluster()
    _env["cluster"] = c
    s = c.squishd(workers="emu:2", extra=["--policy", "early-drop"])
    _env["s"] = s
    s.wait_ready(workers=2, timeout=30)
    upload(s, {"name": "r50", "profile": {"alpha_ms": 1.053, "beta_ms": 5.072},
               "max_batch": 32, "default_slo_ms": 100})
    upload(s, {"name": "idle", "profile": {"alpha_ms": 1.0, "beta_ms": 2.0},
               "max_batch": 8, "default_slo_ms": 100})
    upload(s, {"name": "ssd", "profile": {"alpha_ms": 2, "beta_ms": 3}, "max_batch": 16,
               "input": {"shape": [3, 32, 32]}, "detections": {"mean": 2, "slots": 16}})
    upload(s, {"name": "inc", "profile": {"alpha_ms": 0.5, "beta_ms": 2}, "max_batch": 64,
               "input": {"shape": [3, 16, 16]}, "num_classes": 5})
    crops = {"stage": "det", "boxes": "boxes", "scores": "scores", "format": "xyxy",
             "normalized": True, "score_threshold": 0.5, "nms_iou": 0.5, "max_crops": 16}
    spec = {"name": "faces", "slo_ms": 1000,
            "stages": [{"id": "det", "model": "ssd"},
                       {"id": "cls", "model": "inc", "crops_of": crops, "top_k": 3}]}
    r = s.request("POST", "/pipelines", body=json.dumps(spec),
                  headers=dict(auth(s), **{"Content-Type": "application/json"}))
    assert r.status == 201, r
    for m in ("r50", "idle", "ssd", "inc"):
        eventually(lambda m=m: s.get("/v2/models/%s/ready" % m).status == 200, 30,
                   "model %s ready" % m)
    return s


# ---- Prometheus ----------------------------------------------------------------


class Prometheus:
    def __init__(self, target_port):
        if not os.access(PROMETHEUS, os.X_OK):
            raise Skip("needs Debian's prometheus at %s (scripts/bootstrap --test installs it)"
                       % PROMETHEUS)
        self.tmp = tempfile.mkdtemp(prefix="squish-dash-prom-")
        self.port = free_port()
        conf = os.path.join(self.tmp, "prometheus.yml")
        with open(conf, "w") as f:
            f.write("global:\n  scrape_interval: %ds\n  scrape_timeout: %ds\n"
                    "scrape_configs:\n  - job_name: squishd\n    static_configs:\n"
                    "      - targets: ['127.0.0.1:%d']\n" % (SCRAPE_S, SCRAPE_S, target_port))
        self.log_path = os.path.join(self.tmp, "prometheus.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, "--config.file", conf, "--storage.tsdb.path",
             os.path.join(self.tmp, "data"), "--web.listen-address", "127.0.0.1:%d" % self.port,
             "--log.level", "warn"], stdout=self.log, stderr=subprocess.STDOUT)

    def read_log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()[-3000:]

    def api(self, path, **params):
        if self.proc.poll() is not None:
            raise AssertionError("prometheus exited: %s" % self.read_log())
        url = "http://127.0.0.1:%d%s?%s" % (self.port, path, urllib.parse.urlencode(params))
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:  # 400/422: a bad expression, with its error
            return json.load(e)

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = "%.3f" % at
        return self.api("/api/v1/query", **params)

    def samples(self, expr, at=None):
        """The result of an instant query: [(labels, value)]."""
        body = self.query(expr, at)
        assert body.get("status") == "success", (expr, body)
        res = body["data"]["result"]
        if body["data"]["resultType"] == "scalar":
            return [({}, float(res[1]))]
        return [(r["metric"], float(r["value"][1])) for r in res]

    def scrapes(self):
        """How many scrapes of squishd this Prometheus holds in the last minute."""
        try:
            r = self.samples('count_over_time(up{job="squishd"}[1m])')
        except (OSError, AssertionError):
            return 0
        return int(r[0][1]) if r else 0

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def last_scrape(p):
    """The time of Prometheus's last scrape of squishd."""
    r = p.samples('max(timestamp(up{job="squishd"}))')
    return r[0][1] if r else 0


def prometheus():
    if "prom" not in _env:
        s = squishd()
        p = Prometheus(s.port)
        _env["prom"] = p
        eventually(lambda: p.scrapes() >= 1, 30, "prometheus's first scrape of squishd", step=0.2)
        _env["first_scrape"] = time.time()
    return _env["prom"]


# ---- the dashboard --------------------------------------------------------------


def panels():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # a collapsed row's panels
    return dash, out


def template_values(dash):
    """Each dashboard variable's value as Grafana would substitute it with
    "All" selected (a regex), besides the datasource."""
    vals = dict(GRAFANA_VARS)
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "datasource":
            continue
        vals[v["name"]] = ".+"
    return vals


_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def concrete(expr, vals):
    def sub(m):
        name = m.group(1) or m.group(2) or m.group(3)
        assert name in vals, "unknown Grafana variable $%s in %r" % (name, expr)
        return vals[name]
    return _VAR.sub(sub, expr)


def expressions():
    """[(panel title, refId, concrete expression)] of every panel."""
    dash, ps = panels()
    vals = template_values(dash)
    out = []
    for p in ps:
        if p.get("type") == "row":
            continue
        targets = p.get("targets", [])
        assert targets, "panel %r has no query" % p.get("title")
        for t in targets:
            assert t.get("expr"), "panel %r target %s has no expr" % (p["title"], t.get("refId"))
            out.append((p["title"], t["refId"], concrete(t["expr"], vals)))
    return out


def by_title(title_part):
    out = [e for e in expressions() if title_part in e[0]]
    assert out, "no panel titled *%s*" % title_part
    return out


def check_no_nan(p, at, where):
    """Every expression at time at: success, and no NaN value."""
    for title, ref, expr in expressions():
        body = p.query(expr, at)
        assert body.get("status") == "success", (where, title, ref, expr, body)
        res = body["data"]["result"]
        if body["data"]["resultType"] == "scalar":
            res = [{"value": res}]
        bad = [r for r in res if math.isnan(float(r["value"][1]))]
        assert not bad, "%s: panel %r %s gives NaN: %s\n%s" % (where, title, ref, expr, bad)


# ---- /metrics --------------------------------------------------------------------


def metric_names(text):
    """Every metric name of a Prometheus text exposition: families (HELP,
    TYPE) and samples (histograms' _bucket, _sum and _count too)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, 1)[0])
    return names


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        return r.read().decode()


# ---- the tests -------------------------------------------------------------------


@test
def the_dashboard_is_well_formed_and_names_only_exported_metrics():
    """Unique ids, panels that do not overlap, an expression on every
    panel, and every squish_* name it queries in squishd's /metrics."""
    s = squishd()
    dash, ps = panels()
    ids = [p["id"] for p in ps]
    assert len(ids) == len(set(ids)), ids
    cells = {}
    for p in ps:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        if p.get("type") == "row":
            continue
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, "%r overlaps %r" % (p["title"], cells[(x, y)])
                cells[(x, y)] = p["title"]
    exported = metric_names(scrape(s.port))
    used = set()
    for title, ref, expr in expressions():
        for name in re.findall(r"\b(squish_[a-z0-9_]+|process_[a-z0-9_]+)", expr):
            used.add(name)
            # A histogram's family is exported before its first observation.
            family = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in exported or family in exported, "panel %r %s queries %s, which /metrics lacks" % (
                title, ref, name)
    assert "squish_pipeline_queries_total" in used


@test
def restarts_show_zero_before_the_first():
    """Before any restart the restarts panel gives 0 for every worker (the
    counter exists at 0, so that the first restart is an increase)."""
    p = prometheus()
    eventually(lambda: p.scrapes() >= 3, 30, "three scrapes", step=0.2)
    ((_, _, expr),) = [e for e in by_title("restarts") if "restarts" in e[2]]
    got = {(m.get("worker"), m.get("device")): v for m, v in p.samples(expr)}
    assert got == {("0", "emu:0"): 0.0, ("1", "emu:1"): 0.0}, got


@test
def every_panel_evaluates_without_nan_through_traffic_a_restart_and_idleness():
    s = squishd()
    p = prometheus()
    with open(JPEG_PATH, "rb") as f:
        photo = f.read()
    frame = gray_jpeg()
    t0 = time.time()
    # About 5 s of traffic: r50 ok and refused (an SLO no batch meets: 400
    # slo_too_tight, outcome error), the pipeline's queries ok and refused.
    while time.time() < t0 + 5:
        r = s.request("POST", "/v1/models/r50/infer", body=photo,
                      headers={"Content-Type": "image/jpeg", "X-SLO-Ms": "1000"})
        assert r.status == 200, r
        r = s.request("POST", "/v1/models/r50/infer", body=photo,
                      headers={"Content-Type": "image/jpeg", "X-SLO-Ms": "1"})
        assert r.status == 400 and r.json["code"] == "slo_too_tight", r
        r = s.request("POST", "/v1/pipelines/faces/infer", body=frame,
                      headers={"Content-Type": "image/jpeg", "X-SLO-Ms": "2000"})
        assert r.status == 200, r
        r = s.request("POST", "/v1/pipelines/faces/infer", body=frame,
                      headers={"Content-Type": "image/jpeg", "X-SLO-Ms": "2"})
        assert r.status == 400 and r.json["code"] == "slo_too_tight", r
        time.sleep(0.05)
    busy_end = time.time()
    busy_at = busy_end - 1  # the rate window ends inside the traffic
    eventually(lambda: last_scrape(p) > busy_end, 10, "a scrape after the traffic", step=0.2)

    # While busy: the pipeline panel shows faces' ok and refused (error)
    # queries, the HTTP panel r50's refusals by their code, and half of
    # r50's requests and of faces' queries went bad.
    ((_, _, q),) = by_title("Pipeline queries")
    got = {(m["pipeline"], m["outcome"]): v for m, v in p.samples(q, busy_at)}
    assert got.get(("faces", "ok"), 0) > 0 and got.get(("faces", "error"), 0) > 0, got
    ((_, _, codes),) = by_title("HTTP responses")
    got = {(m["route"], m["code"]): v for m, v in p.samples(codes, busy_at)}
    assert got.get(("infer_v1", "400"), 0) > 0 and got.get(("infer_v1", "200"), 0) > 0, got
    for title, label, name in [("Bad rate", "model", "r50"),
                               ("Pipeline bad rate", "pipeline", "faces")]:
        ((_, _, expr),) = by_title(title)
        got = {m[label]: v for m, v in p.samples(expr, busy_at)}
        assert 0.3 < got.get(name, 0) < 0.7, (title, got)

    # A worker's restart shows on the restarts panel.
    os.kill(s.worker_pids()["emu:1"], signal.SIGKILL)
    ((_, _, restarts),) = [e for e in by_title("restarts") if "restarts" in e[2]]

    def restarted():
        got = {(m.get("worker"), m.get("device")): v for m, v in p.samples(restarts)}
        return got.get(("1", "emu:1"), 0) >= 1 and got
    got = eventually(restarted, 30, "the restarts panel to show emu:1's restart", step=0.5)
    assert got.get(("0", "emu:0")) == 0, got

    # Idle: past the rate window with no traffic, then every panel at every
    # second since the first scrape.
    idle_from = time.time()
    eventually(lambda: last_scrape(p) > idle_from + RATE_WINDOW_S + 1, 20,
               "an idle rate window", step=0.2)
    now = time.time()
    at = _env["first_scrape"]
    n = 0
    while at <= now:
        check_no_nan(p, at, "at t=%+.1fs from the traffic's start" % (at - t0))
        at += 1
        n += 1
    assert n >= 10, n
    # Idle: r50's bad rate is 0 (not NaN, not absent), its quantiles absent.
    ((_, _, bad),) = by_title("Bad rate")
    got = {m["model"]: v for m, v in p.samples(bad, now)}
    assert got.get("r50") == 0, got
    for _, ref, expr in by_title("Latency p50 / p99"):
        assert p.samples(expr, now) == [], (ref, p.samples(expr, now))


def documented_names():
    """{squish_* name: [files]} of README.md and docs/*.md."""
    out = {}
    for path in [os.path.join(SOURCE, "README.md")] + sorted(
            glob.glob(os.path.join(SOURCE, "docs", "*.md"))):
        with open(path) as f:
            for name in re.findall(r"\bsquish_[a-z0-9_]+", f.read()):
                out.setdefault(name, []).append(os.path.relpath(path, SOURCE))
    return out


def standby_metrics():
    """The /metrics of a standby: a leader and a standby squishd on a
    private PostgreSQL cluster (initdb in a temporary directory, a unix
    socket there and no TCP, as tests/modeldb/pg_cluster.py makes), or None
    without PostgreSQL."""
    sys.path.insert(0, os.path.join(SOURCE, "tests", "modeldb"))
    from pg_cluster import find_bindir
    bindir = find_bindir()
    if bindir is None:
        return None
    as_user = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            return None
        as_user = ["runuser", "-u", "postgres", "--"]
    tmp = tempfile.mkdtemp(prefix="squish-dash-pg-")
    if as_user:
        os.chown(tmp, pw.pw_uid, pw.pw_gid)
    data, log = os.path.join(tmp, "data"), os.path.join(tmp, "server.log")

    def pg(*cmd):
        subprocess.run(as_user + [os.path.join(bindir, cmd[0])] + list(cmd[1:]), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=tmp)

    started, squishds = False, []
    try:
        pg("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C",
           "--no-sync", "--no-instructions")
        started = True
        pg("pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "-o",
           "-c listen_addresses='' -c unix_socket_directories='%s' -c fsync=off "
           "-c shared_buffers=16MB -c max_connections=20" % tmp, "start")
        pg("psql", "-X", "-q", "host=%s user=postgres dbname=postgres" % tmp,
           "-c", "CREATE DATABASE squish")
        conninfo = "host=%s user=postgres dbname=squish" % tmp
        token = os.urandom(16).hex()
        for name in ("leader", "standby"):
            d = os.path.join(tmp, name)
            os.makedirs(d)
            tf = os.path.join(d, "admin.token")
            with open(tf, "w") as f:
                f.write(token + "\n")
            os.chmod(tf, 0o600)
            s = Squishd(workers="none", tmp=d, extra=[
                "--db", conninfo, "--admin-token-file", tf,
                "--socket", os.path.join(d, "squishd.sock")])
            squishds.append(s)
            says = ("leader: this squishd leads" if name == "leader" else
                    "standby: another squishd leads")
            eventually(lambda s=s, says=says: says in s.read_log(), 20,
                       "squishd to run as the " + name)
        return scrape(squishds[1].port)
    finally:
        for s in reversed(squishds):
            s.stop()
            s.cleanup()
        if started:
            subprocess.run(as_user + [os.path.join(bindir, "pg_ctl"), "-D", data, "-m",
                                      "immediate", "-w", "stop"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
        shutil.rmtree(tmp, ignore_errors=True)


@test
def every_metric_the_docs_name_is_exported():
    """Every squish_* name in README.md and docs/*.md is in the /metrics of
    this squishd, of a frontend joined to it, or of a standby (on a private
    PostgreSQL cluster; without PostgreSQL, the standby's names are not
    checked and the test says so)."""
    s = squishd()
    c = _env["cluster"]
    f = Squishd(workers="none", extra=["--role", "frontend", "--dispatcher", cluster_addr(s),
                                       "--cluster-token-file", c.token])
    try:
        eventually(lambda: "joined the dispatcher" in f.read_log(), 20, "the frontend joined")
        exported = metric_names(scrape(s.port)) | metric_names(scrape(f.port))
    finally:
        f.stop()
        f.cleanup()
    documented = documented_names()
    standby = standby_metrics()
    if standby is None:
        print("# no PostgreSQL (scripts/bootstrap --test installs postgresql-15): a standby's "
              "metrics not checked", flush=True)
        missing = {n: fs for n, fs in documented.items() if n not in exported}
        assert set(missing) <= {"squish_leader"}, missing
    else:
        exported |= metric_names(standby)
    missing = {n: files for n, files in documented.items() if n not in exported}
    if standby is None:
        missing.pop("squish_leader", None)
    assert not missing, "named in the docs, not in /metrics: %s" % ", ".join(
        "%s (%s)" % (n, ", ".join(sorted(set(fs)))) for n, fs in sorted(missing.items()))


@test
def squishd_exits_cleanly():
    s = squishd()
    rc = s.stop()
    assert rc == 0, (rc, s.read_log()[-3000:])


def cleanup():
    if "prom" in _env:
        _env.pop("prom").stop()
    if "s" in _env:
        s = _env.pop("s")
        s.stop()
        s.cleanup()
    if "cluster" in _env:
        _env.pop("cluster").cleanup()


if __name__ == "__main__":
    try:
        run()
    finally:
        cleanup()
