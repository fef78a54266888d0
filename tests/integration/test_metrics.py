"""Observability: GET /metrics and Triton's /v2/models/.../stats on a live
squishd with emulated workers. Traffic with known outcomes (ok, dropped for
an SLO no batch can meet, bad input, unknown model) must move the counters
by exactly what was sent; `promtool check metrics` must accept a live
scrape; a worker killed by SIGKILL is counted as a restart and no counter
goes backwards; and a real Prometheus server (Debian's, on loopback, with a
temporary data directory) scrapes squishd and answers a query with the
expected squish_requests_total."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

from harness import Squishd, eventually, run, test, validate

JPEG_PATH = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
PROMTOOL = "/usr/bin/promtool"
PROMETHEUS = "/usr/bin/prometheus"
N_OK = 5
SLO_OK_MS = 1000
N_DROPPED = 3
N_BAD = 2

_s = None   # one squishd for every test: starting one costs seconds here
_sent = {}  # what the first test sent: the later tests check against it


def squishd():
    global _s
    if _s is None:
        # early-drop sends a batch as soon as a worker is free: the ok
        # requests finish far from their deadline even on a loaded machine
        # (deferred holds them until their frontrun moment, close to it).
        _s = Squishd(workers="emu:2", extra=["--policy", "early-drop"])
        _s.wait_ready(workers=2, timeout=20)
    return _s


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def parse(text):
    """Prometheus text format -> {(name, ((label, value), ...)): float};
    also checks that every sample's family has HELP and TYPE before it."""
    out = {}
    typed = set()
    helped = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
            continue
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, "bad sample line: %r" % line
        name, labels = m.group(1), ()
        if m.group(3):
            pairs = _LABEL.findall(m.group(3))
            labels = tuple(sorted((k, v.encode().decode("unicode_escape")) for k, v in pairs))
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or family in typed, "no TYPE before %s" % name
        assert name in helped or family in helped, "no HELP before %s" % name
        out[(name, labels)] = float(m.group(4))
    return out


def scrape(s):
    r = s.get("/metrics")
    assert r.status == 200, r
    ctype = r.headers["content-type"]
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype, ctype
    return r.raw.decode(), parse(r.raw.decode())


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples, name, **labels):
    """Sum over the series of name whose labels include the given ones."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def upload_r50(s):
    r = s.request("POST", "/models",
                  body=json.dumps({"name": "r50", "profile": {"alpha_ms": 1.053, "beta_ms": 5.072},
                                   "max_batch": 32, "default_slo_ms": 100}).encode(),
                  headers={"Content-Type": "application/json",
                           "Authorization": "Bearer " + s.token},
                  schema_name="model_record")
    assert r.status == 201, r


def infer(s, body, slo_ms=None, model="r50"):
    headers = {"Content-Type": "image/jpeg"}
    if slo_ms is not None:
        headers["X-SLO-Ms"] = str(slo_ms)
    return s.request("POST", "/v1/models/%s/infer" % model, body=body, headers=headers)


@test
def counters_move_by_exactly_the_traffic_sent():
    s = squishd()
    _, before = scrape(s)
    # An upload without the token is rejected and counted by its reason.
    r = s.request("POST", "/models", body=b"{}", headers={"Content-Type": "application/json"})
    assert r.status == 401, r
    upload_r50(s)
    with open(JPEG_PATH, "rb") as f:
        jpeg = f.read()
    # Meant to be ok: one at a time, with a generous SLO. The dispatcher
    # decides (on a loaded machine one may still be dropped, or answered
    # late); each answer says which, and the counters must agree exactly.
    oks = [infer(s, jpeg, slo_ms=SLO_OK_MS) for _ in range(N_OK)]
    assert all(r.status in (200, 503) for r in oks), oks
    answered = [r for r in oks if r.status == 200]
    n_ok = len(answered)
    assert n_ok >= 1, oks
    # The metric's total is taken just before the body's: a body within the
    # SLO is surely counted ok; one past it is late (or ok by a hair).
    surely_ok = sum(1 for r in answered if r.json["timing_ms"]["total"] <= SLO_OK_MS)
    n_503 = N_OK - n_ok
    # refused: no batch meets 3 ms (l(1) = 6.1 ms): 400 slo_too_tight at
    # once, the caller's error (outcome error), not a drop.
    drops = [infer(s, jpeg, slo_ms=3) for _ in range(N_DROPPED)]
    assert all(r.status == 400 and r.json["code"] == "slo_too_tight" for r in drops), drops
    # bad input: not an image (415, unsupported_media_type): outcome error.
    bads = [infer(s, b"this is not a JPEG at all") for _ in range(N_BAD)]
    assert all(r.status == 415 for r in bads), bads
    # An unknown model: a 404 that never becomes a model label value.
    assert infer(s, jpeg, model="no-such-model").status == 404
    text, after = scrape(s)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    req = "squish_requests_total"
    ok = delta(req, model="r50", version="1", slo_ms=str(SLO_OK_MS), outcome="ok")
    late = delta(req, model="r50", version="1", slo_ms=str(SLO_OK_MS), outcome="late")
    assert ok + late == n_ok and ok >= surely_ok, (ok, late, n_ok, surely_ok, text)
    assert delta(req, model="r50", version="1", slo_ms=str(SLO_OK_MS), outcome="dropped") == n_503
    # The dispatcher's SLO buckets: 3 ms falls in the smallest, 5 ms.
    assert delta(req, model="r50", version="1", slo_ms="5", outcome="error") == N_DROPPED, text
    assert delta(req, model="r50", version="1", slo_ms="5", outcome="dropped") == 0, text
    # No SLO given: the model's default, 100 ms.
    assert delta(req, model="r50", version="1", slo_ms="100", outcome="error") == N_BAD, text
    assert delta(req) == N_OK + N_DROPPED + N_BAD, text
    # No priority asked: all at the default level, 2.
    prio = "squish_priority_requests_total"
    assert delta(prio, priority="2") == N_OK + N_DROPPED + N_BAD, text
    assert delta(prio, priority="2", outcome="error") == N_BAD + N_DROPPED, text
    assert delta(prio) == delta(prio, priority="2"), text
    assert "no-such-model" not in text
    http = "squish_http_requests_total"
    assert delta(http, route="infer_v1", code="200") == n_ok
    assert delta(http, route="infer_v1", code="503") == n_503
    assert delta(http, route="infer_v1", code="400") == N_DROPPED
    assert delta(http, route="infer_v1", code="415") == N_BAD
    assert delta(http, route="infer_v1", code="404") == 1
    assert delta(http, route="models_upload", code="401") == 1
    assert delta(http, route="models_upload", code="201") == 1
    assert delta("squish_uploads_total", outcome="created") == 1
    assert delta("squish_uploads_total", outcome="unauthorized") == 1
    assert delta("squish_request_duration_seconds_count", model="r50") == n_ok
    assert delta("squish_queue_duration_seconds_count", model="r50") == n_ok
    assert delta("squish_preprocess_duration_seconds_count", model="r50") == n_ok
    assert delta("squish_dispatch_drops_total", model="r50") <= N_DROPPED + n_503
    # Every answered image ran in exactly one batch.
    batches = delta("squish_batches_total", model="r50")
    assert 1 <= batches <= n_ok, text
    assert delta("squish_batch_size_sum", model="r50") == n_ok, text
    assert delta("squish_batch_size_count", model="r50") == batches
    assert delta("squish_execute_duration_seconds_count", model="r50") == batches
    busy = delta("squish_worker_busy_seconds_total")
    assert busy >= batches * 0.006, (busy, batches)  # each batch holds l(b) >= 6.1 ms
    for w in ("0", "1"):
        assert value(after, "squish_worker_up", worker=w, device="emu:" + w) == 1, text
    assert value(after, "process_resident_memory_bytes") > 1e6
    assert value(after, "process_open_fds") > 3
    assert abs(value(after, "process_start_time_seconds") - time.time()) < 3600
    _sent.update(answered=n_ok, failed=n_503 + N_DROPPED + N_BAD, batches=batches)


@test
def stats_routes_follow_the_triton_extension():
    s = squishd()
    r = s.get("/v2/models/r50/stats", schema_name="model_stats")
    assert r.status == 200, r
    (st,) = r.json["model_stats"]
    assert st["name"] == "r50" and st["version"] == "1", st
    n_ok = _sent["answered"]
    assert st["inference_count"] == n_ok, st
    inf = st["inference_stats"]
    assert inf["success"]["count"] == n_ok and inf["success"]["ns"] > 0, inf
    assert inf["fail"]["count"] == _sent["failed"], inf
    for k in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inf[k]["count"] == n_ok, (k, inf)
    # The live profile: per batch size, runs and their time.
    assert st["execution_count"] == _sent["batches"], st
    bs = st["batch_stats"]
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in bs) == n_ok, bs
    for b in bs:
        # An emulated device holds a batch for l(b) = 1.053 b + 5.072 ms.
        mean_ms = b["compute_infer"]["ns"] / b["compute_infer"]["count"] / 1e6
        assert mean_ms >= 1.053 * b["batch_size"] + 5.072 - 0.5, (b, mean_ms)
    assert time.time() * 1000 - st["last_inference"] < 600000, st
    r = s.get("/v2/models/stats", schema_name="model_stats")
    assert r.status == 200 and [m["name"] for m in r.json["model_stats"]] == ["r50"], r
    r = s.get("/v2/models/r50/versions/1/stats", schema_name="model_stats")
    assert r.status == 200 and len(r.json["model_stats"]) == 1, r
    assert s.get("/v2/models/r50/versions/2/stats").status == 404
    assert s.get("/v2/models/nope/stats").status == 404
    # /v2/models/stats is not a model called "stats".
    assert s.get("/v2/models/stats").json.get("model_stats") is not None


@test
def promtool_accepts_a_live_scrape():
    s = squishd()
    text, _ = scrape(s)
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    assert p.returncode == 0, p.stdout.decode()
    assert p.stdout.strip() == b"", p.stdout.decode()  # not even a lint warning


@test
def a_worker_restart_counts_and_no_counter_goes_back():
    s = squishd()
    _, before = scrape(s)
    pid = s.worker_pids()["emu:1"]
    os.kill(pid, signal.SIGKILL)

    def restarted():
        _, now = scrape(s)
        return (value(now, "squish_worker_restarts_total", worker="1", device="emu:1") >= 1 and
                value(now, "squish_worker_up", worker="1", device="emu:1") == 1 and now)

    after = eventually(restarted, 20, "the emu:1 worker to come back")
    for (name, labels), v in before.items():
        if name.endswith("_total") or name.endswith("_count") or name.endswith("_bucket"):
            if name.startswith("process_"):
                continue
            assert after.get((name, labels), 0) >= v, (name, labels, v, after.get((name, labels)))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@test
def a_real_prometheus_scrapes_and_answers_a_query():
    s = squishd()
    tmp = tempfile.mkdtemp(prefix="squish-prom-")
    port = free_port()
    with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                "scrape_configs:\n  - job_name: squishd\n    static_configs:\n"
                "      - targets: ['127.0.0.1:%d']\n" % s.port)
    log = open(os.path.join(tmp, "prometheus.log"), "wb")
    proc = subprocess.Popen([PROMETHEUS, "--config.file", os.path.join(tmp, "prometheus.yml"),
                             "--storage.tsdb.path", os.path.join(tmp, "data"),
                             "--web.listen-address", "127.0.0.1:%d" % port,
                             "--log.level", "warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    # The 200 answers of the first test (ok or late): from the traffic.
    want = _sent["answered"]
    query = 'sum(squish_requests_total{job="squishd",model="r50",outcome=~"ok|late"})'

    def answer():
        if proc.poll() is not None:
            raise AssertionError("prometheus exited: %s" %
                                 open(os.path.join(tmp, "prometheus.log")).read())
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": query}))
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.load(r)
        except OSError:
            return None
        last[0] = body
        result = body["data"]["result"]
        return result and float(result[0]["value"][1]) == want and body

    last = [None]
    try:
        try:
            body = eventually(answer, 90, "prometheus to report %d ok requests" % want, step=0.5)
        except AssertionError:
            targets = None
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/api/v1/targets" % port,
                                            timeout=5) as r:
                    targets = json.load(r)["data"]["activeTargets"]
            except OSError as e:
                targets = repr(e)
            with open(os.path.join(tmp, "prometheus.log"), errors="replace") as f:
                plog = f.read()[-2000:]
            raise AssertionError("last answer %r; targets %r; log %s" % (last[0], targets, plog))
        assert body["status"] == "success", body
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (
            port, urllib.parse.urlencode({"query": 'up{job="squishd"}'}))
        with urllib.request.urlopen(url, timeout=5) as r:
            up = json.load(r)["data"]["result"]
        assert up and up[0]["value"][1] == "1", up
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


@test
def squishd_exits_cleanly():
    global _s
    s = squishd()
    rc = s.stop()
    log = s.read_log()
    s.cleanup()
    _s = None
    assert rc == 0, (rc, log[-3000:])
    assert "Sanitizer" not in log and "runtime error" not in log, log[-3000:]


if __name__ == "__main__":
    try:
        run()
    finally:
        if _s is not None:
            _s.stop()
            _s.cleanup()
