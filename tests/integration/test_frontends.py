"""Frontends around one dispatcher (issue 25), on 127.0.0.1: squishd
--role dispatcher (planner, dispatcher, model DB; no inference traffic of
its own here), two squishd --role frontend joined to its cluster listener,
and two remote emulated workers with data listeners. Clients talk to the
frontends only. Every request is answered once, with the output of its own
input (the emulated device's output is a hash of the input: a row sent to
the wrong request would show); the dispatcher's link carries metadata only
(its own count of bytes per item stays small) while the frontends' links
to the workers carry the tensors; a frontend SIGKILLed under load, or a
worker, loses nothing elsewhere, and management routes on a frontend answer
as the dispatcher does."""

import http.client
import json
import os
import re
import signal
import socket
import struct
import threading
import time

from harness import Squishd, eventually, run, test
from test_remote import Cluster, auth, cluster_addr


SHAPE = [1, 3, 16, 16]
ELEMS = 3 * 16 * 16
MODEL = {"name": "m", "profile": {"alpha_ms": 0.5, "beta_ms": 2.0}, "max_batch": 16,
         "input": {"shape": SHAPE[1:]}, "num_classes": 10, "default_slo_ms": 500}


def tensor_body(seed):
    """A /v2 request with Triton's binary tensor extension: a header, then
    the FP32 input (distinct per seed)."""
    data = struct.pack("<%df" % ELEMS, *[((seed * 7919 + i) % 1000) / 1000.0
                                         for i in range(ELEMS)])
    header = json.dumps({"inputs": [{"name": "input", "shape": SHAPE, "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(data)}}],
                         "outputs": [{"name": "output", "parameters": {"binary_data": False}}]
                         }).encode()
    return header + data, len(header)


def infer(conn, seed):
    body, hlen = tensor_body(seed)
    conn.request("POST", "/v2/models/m/infer", body=body,
                 headers={"Content-Type": "application/octet-stream",
                          "Inference-Header-Content-Length": str(hlen)})
    r = conn.getresponse()
    raw = r.read()
    return r.status, dict(r.getheaders()), raw


def output_of(raw):
    return json.loads(raw)["outputs"][0]["data"]


def metric(port, name, labels=""):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else None


class Fleet:
    """The dispatcher, its workers and frontends."""

    def __init__(self, nworkers=2, nfrontends=2):
        self.c = Cluster()
        self.d = self.c.squishd(extra=["--role", "dispatcher"])
        addr = cluster_addr(self.d)
        self.addr = addr
        for i in range(nworkers):
            self.c.worker(addr, "emu:%d" % i, "host%d" % i,
                          extra=["--data-listen", "127.0.0.1:0"])
        self.d.wait_ready(workers=nworkers, timeout=20)
        self.fronts = [self.frontend() for _ in range(nfrontends)]

    def frontend(self):
        f = Squishd(workers="none", tmp=None,
                    extra=["--role", "frontend", "--dispatcher", self.addr,
                           "--cluster-token-file", self.c.token,
                           "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "1000"])
        # Joined before anything is sent through it (it forwards uploads).
        eventually(lambda: "joined the dispatcher" in f.read_log(), 20, "the frontend joined")
        return f

    def upload_through(self, front):
        r = front.request("POST", "/models", body=json.dumps(MODEL).encode(),
                          headers=dict(auth(self.d), **{"Content-Type": "application/json"}))
        assert r.status in (200, 201, 202), r
        for f in self.fronts:
            eventually(lambda f=f: f.get("/v2/models/m/ready").status == 200, 20,
                       "model m ready through a frontend")

    def cleanup(self):
        for f in self.fronts:
            f.cleanup()
        self.d.cleanup()
        self.c.cleanup()


def reference(fleet, seeds):
    """Each input's output as the dispatcher itself serves it (its own HTTP
    and arena, the same workers)."""
    conn = http.client.HTTPConnection("127.0.0.1", fleet.d.port, timeout=30)
    out = {}
    for s in seeds:
        status, _, raw = infer(conn, s)
        assert status == 200, raw
        out[s] = output_of(raw)
    conn.close()
    return out


def clients(ports, seeds, per_client, results, stop=None):
    """Threads, each on one keep-alive connection to one frontend, sending
    per_client requests: (port, seed, status, headers, raw) each, or the
    exception that ended the connection."""
    def one(port, k):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for i in range(per_client):
            if stop is not None and stop.is_set():
                break
            seed = seeds[(k * 31 + i) % len(seeds)]
            try:
                status, headers, raw = infer(conn, seed)
                results.append((port, seed, status, headers, raw))
            except (OSError, http.client.HTTPException) as e:
                results.append((port, seed, None, None, repr(e)))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.close()
    threads = [threading.Thread(target=one, args=(p, k)) for k, p in enumerate(ports)]
    for t in threads:
        t.start()
    return threads


@test
def two_frontends_serve_every_request_once_with_its_own_output_and_bytes_bypass_the_dispatcher():
    fleet = Fleet()
    try:
        fleet.upload_through(fleet.fronts[0])
        seeds = list(range(1, 25))
        ref = reference(fleet, seeds)
        items0 = metric(fleet.d.port, "squish_frontend_items_total") or 0
        in0 = metric(fleet.d.port, "squish_frontend_link_bytes_total", '{direction="in"}') or 0
        out0 = metric(fleet.d.port, "squish_frontend_link_bytes_total", '{direction="out"}') or 0
        results = []
        ports = [f.port for f in fleet.fronts] * 3
        for t in clients(ports, seeds, 40, results):
            t.join(120)
        assert len(results) == 6 * 40, len(results)
        bad = [r for r in results if r[2] != 200]
        assert not bad, bad[:3]
        for port, seed, status, headers, raw in results:
            assert output_of(raw) == ref[seed], (port, seed)
            # Times measured where the request was answered: from its rows
            # leaving for the worker (a frontend's clock), not from 0.
            params = json.loads(raw).get("parameters", {})
            assert 0 <= params.get("execute_ms", 0) < 10000, params
        # The dispatcher's own count: metadata only, both ways.
        items = metric(fleet.d.port, "squish_frontend_items_total") - items0
        link = (metric(fleet.d.port, "squish_frontend_link_bytes_total", '{direction="in"}') - in0
                + metric(fleet.d.port, "squish_frontend_link_bytes_total",
                         '{direction="out"}') - out0)
        assert items == len(results), items
        per_item = link / items
        # A 3 KB tensor a request went around it: what it carried is the
        # items' offers and assignments.
        assert per_item < 300, per_item
        # The frontends' links to the workers carried the tensors: one view of
        # the cluster from any frontend, each frontend's series labelled (its
        # figures reach the dispatcher every 2 s).
        def rows_out(port):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
            c.close()
            got = re.findall(r'^squish_frontend_bytes_total\{frontend="([^"]+)",'
                             r'link="(?:workers|shared_memory)",direction="out"\} (\S+)$', text,
                             re.M)
            out = {}
            for name, v in got:
                out[name] = out.get(name, 0) + float(v)
            return out
        want = len(results) * ELEMS * 4
        def both():
            views = [rows_out(f.port) for f in fleet.fronts]
            ok = all(len(v) == 2 and sum(v.values()) >= want for v in views)
            return views if ok else None
        views = eventually(both, 10, "both frontends' rows in the one view from either")
        data_out = sum(views[0].values())
        # On one host the workers read the frontends' rows from their arenas.
        for f in fleet.fronts:
            assert "shared_memory=yes" in f.read_log(), f.read_log()[-2000:]
        # Triton's statistics through a frontend count the frontends' requests.
        st = eventually(lambda: [x for x in fleet.fronts[0].get("/v2/models/m/stats").json[
            "model_stats"] if x["inference_count"] >= len(results)], 10, "stats")
        assert st[0]["inference_stats"]["success"]["count"] >= len(results), st
        print("# dispatcher link bytes per item: %.1f; rows to workers: %d bytes"
              % (per_item, data_out))
        # Management through a frontend answers as the dispatcher does.
        a = fleet.fronts[1].get("/v2/models/m")
        b = fleet.d.get("/v2/models/m")
        assert a.status == 200 and a.json == b.json, (a, b)
        plan_a = fleet.fronts[0].get("/v1/plan")
        assert plan_a.status == 200, plan_a
        # Clean stops (under the sanitizers: nothing leaked), frontends first.
        for f in fleet.fronts:
            assert f.stop() == 0, f.read_log()[-3000:]
        assert fleet.d.stop() == 0, fleet.d.read_log()[-3000:]
    finally:
        fleet.cleanup()


@test
def a_frontend_killed_under_load_leaves_the_other_and_the_dispatcher_whole():
    fleet = Fleet()
    try:
        fleet.upload_through(fleet.fronts[0])
        seeds = list(range(1, 13))
        ref = reference(fleet, seeds)
        survivor, victim = fleet.fronts
        results, doomed = [], []
        stop = threading.Event()
        ts = clients([survivor.port] * 3, seeds, 10 ** 6, results, stop)
        tv = clients([victim.port] * 3, seeds, 10 ** 6, doomed, stop)
        time.sleep(1.5)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        eventually(lambda: re.search(r"frontend lost id=\d+", fleet.d.read_log()), 10,
                   "the dispatcher to see the frontend lost")
        time.sleep(1.5)
        stop.set()
        for t in ts + tv:
            t.join(60)
        assert len(results) > 20, len(results)
        for port, seed, status, headers, raw in results:
            assert status == 200, (status, raw)
            assert output_of(raw) == ref[seed]
        # The dispatcher queues nothing of the dead one: a burst on the
        # survivor is served at once.
        more = []
        for t in clients([survivor.port] * 4, seeds, 5, more):
            t.join(60)
        assert [r[2] for r in more] == [200] * 20, more[:2]
    finally:
        fleet.cleanup()


@test
def a_worker_killed_under_load_answers_each_request_once():
    fleet = Fleet()
    try:
        fleet.upload_through(fleet.fronts[0])
        seeds = list(range(1, 13))
        ref = reference(fleet, seeds)
        results = []
        stop = threading.Event()
        ts = clients([f.port for f in fleet.fronts] * 2, seeds, 10 ** 6, results, stop)
        time.sleep(1.0)
        fleet.c.workers[0].send_signal(signal.SIGKILL)
        fleet.c.workers[0].wait()
        time.sleep(2.0)
        stop.set()
        for t in ts:
            t.join(60)
        assert len(results) > 20
        for port, seed, status, headers, raw in results:
            assert status in (200, 503), (status, raw)
            if status == 200:
                assert output_of(raw) == ref[seed]
            else:
                assert "retry-after" in {k.lower() for k in headers}, headers
        # One worker left: everything is served again.
        more = []
        for t in clients([f.port for f in fleet.fronts] * 2, seeds, 5, more):
            t.join(60)
        assert [r[2] for r in more] == [200] * 20, [r[4] for r in more if r[2] != 200][:2]
    finally:
        fleet.cleanup()


@test
def the_workers_a_dispatcher_spawns_take_frontends_rows_and_role_all_mixes_both():
    """--role dispatcher (and all) with workers of its own: it starts them
    with data listeners (the host of --cluster-listen), so a frontend's
    rows reach them; with role all, the process's own HTTP clients share
    batches with the frontend's (rows from the arena and from the frontend
    in one batch), each answered with its own output."""
    for role in ("dispatcher", "all"):
        c = Cluster()
        d = c.squishd(workers="emu:2", extra=["--role", role])
        f = None
        try:
            d.wait_ready(workers=2, timeout=20)
            f = Squishd(workers="none",
                        extra=["--role", "frontend", "--dispatcher", cluster_addr(d),
                               "--cluster-token-file", c.token])
            r = d.request("POST", "/models", body=json.dumps(MODEL).encode(),
                          headers=dict(auth(d), **{"Content-Type": "application/json"}))
            assert r.status in (200, 201, 202), r
            eventually(lambda: f.get("/v2/models/m/ready").status == 200, 20, "m ready")
            seeds = list(range(1, 9))
            fleet = type("F", (), {"d": d})
            ref = reference(fleet, seeds)
            results = []
            for t in clients([f.port, f.port, d.port, d.port], seeds, 25, results):
                t.join(120)
            assert len(results) == 100
            for port, seed, status, headers, raw in results:
                assert status == 200, (role, port, raw)
                assert output_of(raw) == ref[seed], (role, port, seed)
            assert re.search(r"worker data address id=\d+ addr=127\.0\.0\.1:\d+", d.read_log())
        finally:
            if f is not None:
                f.cleanup()
            d.cleanup()
            c.cleanup()


@test
def a_pipeline_query_runs_on_the_frontend_and_its_fanout_reaches_the_dispatchers_split():
    """A detector feeding a classifier on its crops, queried through a
    frontend: the frontend decodes, crops and answers (its rows go to the
    workers), the dispatcher counts the stages' items toward their
    sessions, and the fan-out the frontend measures reaches the
    dispatcher's split (gamma measured from the frontend's reports)."""
    import io
    import tiny_models as tm
    from PIL import Image
    fleet = Fleet(nfrontends=1)
    try:
        front, d = fleet.fronts[0], fleet.d
        h = dict(auth(d), **{"Content-Type": "application/json"})
        for cfg in ({"name": "ssd", "profile": {"alpha_ms": 2, "beta_ms": 3}, "max_batch": 16,
                     "input": {"shape": [3, 32, 32]}, "detections": {"mean": 2, "slots": 16}},
                    {"name": "inc", "profile": {"alpha_ms": 0.5, "beta_ms": 2}, "max_batch": 64,
                     "input": {"shape": [3, 16, 16]}, "num_classes": 5}):
            r = front.request("POST", "/models", body=json.dumps(cfg).encode(), headers=h)
            assert r.status in (200, 201, 202), r
        crops = {"stage": "det", "boxes": "boxes", "scores": "scores", "format": "xyxy",
                 "normalized": True, "score_threshold": 0.5, "nms_iou": 0.5, "max_crops": 16}
        spec = {"name": "emu", "slo_ms": 2000,
                "stages": [{"id": "det", "model": "ssd"},
                           {"id": "cls", "model": "inc", "crops_of": crops, "top_k": 3}]}
        r = front.request("POST", "/pipelines", body=json.dumps(spec).encode(), headers=h)
        assert r.status == 201, r
        eventually(lambda: front.get("/v2/models/emu/ready").status == 200, 20,
                   "the pipeline ready on the frontend")
        out = io.BytesIO()
        Image.new("RGB", (64, 64), (120, 120, 120)).save(out, "JPEG", quality=95)
        frames = 10
        body, ctype = tm.multipart([("f%d" % i, "f%d.jpg" % i, "image/jpeg", out.getvalue())
                                    for i in range(frames)])
        items0 = metric(d.port, "squish_frontend_items_total")
        n_crops = 0
        for _ in range(8):
            r = front.request("POST", "/v1/pipelines/emu/infer", body=body,
                              headers={"Content-Type": ctype})
            assert r.status == 200, r
            assert len(r.json["frames"]) == frames, r.json
            n = sum(len(fr["det"]["cls"]) for fr in r.json["frames"])
            assert r.json["stages"]["cls"]["items"] == n, r.json
            n_crops += n
        # Every frame and crop went through the frontend's link, as items.
        items = metric(d.port, "squish_frontend_items_total") - items0
        assert items == 8 * frames + n_crops, (items, n_crops)
        # The split the dispatcher makes is fed by what the frontend measured.
        g = eventually(lambda: (lambda x: x if x.get("frames", 0) >= 8 * frames else None)(
            d.get("/pipelines/emu", headers=auth(d)).json["split"]["gamma"]["cls"]), 10,
            "the frontend's fan-outs at the dispatcher")
        assert 1 < g["measured"] < 3, g
        # An SLO no retry can meet, on either route: the frontend answers
        # 400 slo_too_tight saying what to ask for, without Retry-After, as
        # the dispatcher itself would.
        for path in ("/v1/pipelines/emu/infer", "/v1/models/inc/infer"):
            r = front.request("POST", path, body=out.getvalue(),
                              headers={"Content-Type": "image/jpeg", "X-SLO-Ms": "1"})
            assert r.status == 400 and r.json["code"] == "slo_too_tight", (path, r)
            assert "retry-after" not in r.headers and "ask for" in r.json["error"], (path, r)
        assert front.stop() == 0, front.read_log()[-3000:]
        assert d.stop() == 0, d.read_log()[-3000:]
    finally:
        fleet.cleanup()


if __name__ == "__main__":
    run()
