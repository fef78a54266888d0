"""Pipelines end to end (complex queries): specs checked and stored, a
detector feeding a classifier on a real cpu worker, fan-out measured and
the SLO split by the query DP, a query dropped whole when a stage cannot
make it, and a worker killed mid-query.

The detector here is tiny_models.brightness_detector: its detections are
known from the frame (a flat gray frame of value 32 has 1, of value 250
has 8), so that the fan-out is exact."""

import base64
import io
import json
import os
import signal
import socket
import threading
import time

import numpy as np
from PIL import Image

import tiny_models as tm
from harness import SOURCE, Skip, Squishd, eventually, run, sanitized, test, timing, validate

PREP = {"mean": [0, 0, 0], "std": [255, 255, 255]}


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def gray(v, size=(64, 48)):
    out = io.BytesIO()
    Image.fromarray(np.full((size[1], size[0], 3), v, np.uint8)).save(out, "JPEG", quality=95)
    return out.getvalue()


def upload(s, name, model_bytes, max_batch=16, preprocess=None):
    cfg = {"name": name, "max_batch": max_batch}
    if preprocess:
        cfg["preprocess"] = preprocess
    body, ctype = tm.multipart([("model", "m.onnx", None, model_bytes),
                                ("config", None, None, json.dumps(cfg).encode())])
    r = s.request("POST", "/models", body=body, headers=dict(auth(s), **{"Content-Type": ctype}))
    assert r.status == 202, r


def wait_ready(s, name):
    def done():
        rec = s.get("/models/" + name, headers=auth(s)).json["versions"][0]
        return rec if rec["status"] != "profiling" else None

    rec = eventually(done, 180, name + " profiled")
    assert rec["status"] == "ready", rec


CROPS = {"stage": "det", "boxes": "boxes", "scores": "scores", "format": "xyxy",
         "normalized": True, "score_threshold": 0.0, "nms_iou": 0.5, "max_crops": 16}


def spec(name="faces", slo_ms=400, crops=None, det="det_m", cls="cls_m", **extra):
    s = {"name": name, "slo_ms": slo_ms,
         "stages": [{"id": "det", "model": det},
                    {"id": "cls", "model": cls, "crops_of": dict(crops or CROPS), "top_k": 3}]}
    s.update(extra)
    return s


def post(s, body, expect=None):
    if expect == 201:
        validate(body, "pipeline_spec")
    r = s.request("POST", "/pipelines", body=json.dumps(body),
                  headers=dict(auth(s), **{"Content-Type": "application/json"}))
    if r.status == 201:
        validate(r.json, "pipeline")
    if expect is not None:
        assert r.status == expect, r
        if r.status >= 400:
            validate(r.json, "error")
    return r


def query(s, body, name="faces", slo=None, ctype="image/jpeg", timeout=30):
    h = {"Content-Type": ctype}
    if slo is not None:
        h["X-SLO-Ms"] = str(slo)
    r = s.request("POST", "/v1/pipelines/%s/infer" % name, body=body, headers=h,
                  timeout=timeout)
    validate(r.json, "pipeline_query_response" if r.status == 200 else "error")
    return r


# The dispatcher's SLO buckets (gateway/slo_buckets.c): a session is a model at one.
SLO_BUCKETS_MS = [5, 10, 15, 20, 25, 30, 40, 50, 60, 75, 100, 125, 150, 200, 250, 300, 400, 500,
                  750, 1000, 1500, 2000, 3000, 5000, 10000, 30000, 60000]


def slo_bucket(ms):
    return max([b for b in SLO_BUCKETS_MS if b <= ms] or [SLO_BUCKETS_MS[0]])


def started(workers="cpu:1"):
    s = Squishd(workers=workers)
    s.wait_ready(workers=1, timeout=60)
    upload(s, "det_m", tm.brightness_detector(), preprocess=PREP)
    upload(s, "cls_m", tm.tiny(3))
    wait_ready(s, "det_m")
    wait_ready(s, "cls_m")
    return s


def stats_count(s, model):
    r = s.get("/v2/models/%s/stats" % model)
    assert r.status == 200, r
    return sum(m["execution_count"] for m in r.json["model_stats"])  # batches run


@test
def bad_specs_get_400_naming_the_field_and_good_ones_are_stored():
    s = started()
    try:
        bad = [
            (dict(spec(), stages=[{"id": "det", "model": "nope"}]), "stages[0].model"),
            (spec(crops=dict(CROPS, stage="cls")), "stages[1].crops_of.stage"),  # a cycle
            (spec(crops=dict(CROPS, stage="ghost")), "stages[1].crops_of.stage"),
            (spec(crops=dict(CROPS, boxes="missing")), "stages[1].crops_of"),
            (spec(crops=dict(CROPS, nms_iou=7)), "stages[1].crops_of"),
            (dict(spec(), slo_ms=-1), "slo_ms"),
            (dict(spec(), colour="red"), "colour"),
            (dict(spec(), stages=[{"id": "det", "model": "det_m"},
                                  {"id": "det", "model": "cls_m"}]), "stages[1].id"),
        ]
        for body, field in bad:
            r = post(s, body, expect=400)
            assert r.json["error"].startswith(field), (field, r.json)
        r = s.request("POST", "/pipelines", body="{not json",
                      headers=dict(auth(s), **{"Content-Type": "application/json"}))
        assert r.status == 400 and r.json["code"] == "bad_json", r
        # No token: 401.
        r = s.request("POST", "/pipelines", body=json.dumps(spec()))
        assert r.status == 401, r
        # A pipeline is addressed like a model: it cannot take a model's name.
        assert post(s, spec(name="cls_m"), expect=409).json["code"] == "already_exists"

        r = post(s, spec(), expect=201)
        assert r.json["name"] == "faces" and r.json["split"]["method"] in ("even", "dp"), r.json
        post(s, spec(), expect=409)
        # Management reads take the admin token, as GET /models does.
        assert s.get("/pipelines").status == 401
        assert s.get("/pipelines/faces").status == 401
        r = s.get("/pipelines", headers=auth(s), schema_name="pipelines_list")
        assert r.status == 200 and [p["name"] for p in r.json["pipelines"]] == ["faces"], r
        r = s.get("/pipelines/faces", headers=auth(s), schema_name="pipeline")
        assert r.status == 200 and r.json["spec"]["stages"][1]["crops_of"]["stage"] == "det", r
        assert s.get("/pipelines/nope", headers=auth(s)).status == 404
        r = s.request("DELETE", "/pipelines/faces")
        assert r.status == 401, r
        r = s.request("DELETE", "/pipelines/faces", headers=auth(s))
        assert r.status == 200, r
        assert s.get("/pipelines/faces", headers=auth(s)).status == 404
        assert query(s, gray(32)).status == 404
        post(s, spec(), expect=201)
    finally:
        s.stop()
    # Stored in the model DB: a restarted squishd on the same DB has it.
    s2 = Squishd(workers="cpu:1", tmp=s.tmp)
    try:
        r = s2.get("/pipelines/faces", headers=auth(s2))
        assert r.status == 200 and r.json["slo_ms"] == 400, r
    finally:
        s2.cleanup()


@test
def a_detector_feeds_a_classifier_and_gamma_is_measured_for_the_split():
    s = started()
    try:
        post(s, spec(), expect=201)
        # One detection per dark frame, eight per bright one.
        for v, n in ((32, 1), (250, 8)):
            r = query(s, gray(v), slo=3000)
            assert r.status == 200, r
            fr = r.json["frames"][0]
            assert fr["width"] == 64 and fr["height"] == 48, fr
            dets = fr["det"]["cls"]
            assert len(dets) == n, (v, dets)
            for k, d in enumerate(sorted(dets, key=lambda d: d["box"][0])):
                x0, y0, x1, y1 = d["box"]
                # Box k in frame pixels: x in [k/8, (k+1)/8 - 0.01] * 64.
                assert abs(x0 - 64 * k / 8) < 1.01 and abs(x1 - 64 * ((k + 1) / 8 - 0.01)) < 1.01, d
                assert abs(y0 - 4.8) < 1.01 and abs(y1 - 28.8) < 1.01, d
                assert len(d["predictions"]) == 3, d
            assert r.json["stages"]["cls"]["items"] == n, r.json
        # Each crop is a flat gray patch: its classification equals the
        # classifier's on that patch alone.
        r = query(s, gray(250), slo=3000)
        alone = s.request("POST", "/v1/models/cls_m/infer?top_k=3", body=gray(250, (32, 32)),
                          headers={"Content-Type": "image/jpeg", "X-SLO-Ms": "3000"})
        assert alone.status == 200, alone
        want = alone.json["predictions"][0]
        for d in r.json["frames"][0]["det"]["cls"]:
            assert [p["index"] for p in d["predictions"]] == [p["index"] for p in want], (d, want)
            for a, b in zip(d["predictions"], want):
                assert abs(a["score"] - b["score"]) < 0.02, (d, want)

        def measured(gamma, tol):
            p = s.get("/v1/plan", schema_name="plan").json["pipelines"]
            if not p or p[0]["split"]["method"] != "dp":
                return None
            g = p[0]["split"]["gamma"]["cls"]
            return p[0] if abs(g["measured"] - gamma) < tol and abs(g["split_for"] - gamma) < tol else None

        def load(v, n=25, clients=4, frames=4):
            """n queries of `frames` frames from each client at once: a rate
            the DP sees, and enough frames (400) for gamma's EWMA (weight
            0.01 a frame) to settle. A long SLO: the cpu worker is slow
            under ASan, and this measures gamma, not the SLO."""
            codes = []
            body, ctype = tm.multipart([("f%d" % i, "f%d.jpg" % i, "image/jpeg", gray(v))
                                        for i in range(frames)])

            def client():
                for _ in range(n):
                    codes.append(query(s, body, slo=2000, ctype=ctype).status)

            threads = [threading.Thread(target=client) for _ in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert codes.count(200) >= 0.9 * n * clients, codes

        # gamma 1: dark frames; gamma 8: bright frames move the split.
        load(32)
        p1 = eventually(lambda: measured(1, 0.1), 30, "gamma 1 measured and split")
        load(250)
        p8 = eventually(lambda: measured(8, 0.8), 30, "gamma 8 measured and split")
        b1, b8 = p1["split"]["budgets_ms"], p8["split"]["budgets_ms"]
        assert abs(b1["det"] + b1["cls"] - 400) < 1e-6, b1
        assert abs(b8["det"] + b8["cls"] - 400) < 1e-6, b8
        # At this load any split runs on the one device: each stage gets its
        # own costs (margin, decode, a batch of one waited for and run) and
        # an equal share of the rest, whatever gamma (these tiny models cost
        # a few ms), so neither is starved by the other's load.
        for b in (b1, b8):
            assert min(b.values()) > 150, (b1, b8)
        print("# budgets at gamma 1: %s, at gamma 8: %s" % (b1, b8))
        validate(s.get("/v1/plan").json, "plan")
        old = {"det_m": slo_bucket(b1["det"] * 2000 / 400),
               "cls_m": slo_bucket(b1["cls"] * 2000 / 400)}

        def planned():
            # The split as it is now: measured latencies (profile drift on a
            # loaded box) may move it after gamma 8's first split, and the
            # plan follows the split it has, which is the point.
            plan = s.get("/v1/plan").json
            now = plan["pipelines"][0]["split"]["budgets_ms"]
            cur = {"det_m": slo_bucket(now["det"] * 2000 / 400),
                   "cls_m": slo_bucket(now["cls"] * 2000 / 400)}
            busy = {}
            for d in plan["devices"]:
                for x in d["sessions"]:
                    if x["rate_rps"] >= 1:
                        busy.setdefault(x["model"], set()).add(x["slo_ms"])
            return busy if all(busy.get(m) == {b} for m, b in cur.items()) else None

        busy = eventually(planned, 15, "each stage planned at its current bucket only")
        print("# planned with traffic (model: SLO buckets): %s; gamma 1's were %s" % (busy, old))
    finally:
        s.stop()


@test
def at_low_load_a_query_with_eight_crops_answers_far_below_its_slo():
    """One query at a time: the 8 crops of a bright frame reach the
    classifier's session together (one arrival), so they run at once as one
    batch and the query answers in a few ms, like a dark frame's single crop.
    Handed over one by one, the first would run alone and the other seven,
    read as a burst, would wait for their frontrun moment near the SLO.
    The even split: the DP shares the slack by each stage's measured l(1),
    and on a loaded box a noisy profile could leave the classifier a budget
    too short for a batch of 8 (CI once saw 6 and 2), which is not what
    this test is about."""
    s = started()
    try:
        post(s, spec(slo_ms=400, split="even"), expect=201)
        assert query(s, gray(250)).status == 200  # first runs: nothing cold below
        # The largest batch the classifier's profile measured is the largest
        # it runs (sizes past the profile are not assumed): the worker's
        # profiling stops at its time budget, and on a loaded box that was
        # seen below 8 (crops then ran 6 + 2 or 4 + 4, which is right for
        # that profile).
        rec = s.get("/models/cls_m", headers=auth(s)).json["versions"][0]
        largest = max(max(p["batch"]) for p in rec["profiles"] if p["device_kind"] == "cpu")
        print("# the classifier's profile measured batches up to %d" % largest)
        for v, n in ((32, 1), (250, 8)):
            lat = []
            for _ in range(5):
                time.sleep(0.3)  # well apart: the rate the dispatcher sees is low
                r = query(s, gray(v))
                assert r.status == 200, r
                cls = r.json["stages"]["cls"]
                assert cls["items"] == n, r.json
                assert cls["batch_size"] == min(n, largest), ("the crops ran as one batch",
                                                              largest, r.json["stages"])
                lat.append(r.json["latency_ms"])
            lat.sort()
            print("# %d crop(s): latency_ms %s (SLO 400)" % (n, lat))
            assert lat[2] < 400 / 3, (n, lat)
    finally:
        s.stop()


@test
def a_pipeline_is_a_model_over_oip():
    """Triton users address an ensemble as a model: /v2/models/{pipeline}
    (metadata, ready, infer with BYTES JPEGs in, the result as JSON text)."""
    s = started()
    try:
        post(s, spec(), expect=201)
        r = s.get("/v2/models/faces", schema_name="kserve_model_metadata")
        assert r.status == 200 and r.json["inputs"][0]["datatype"] == "BYTES", r
        eventually(lambda: s.get("/v2/models/faces/ready").status == 200, 30, "pipeline ready")
        frames = [gray(32), gray(250)]
        req = {"id": "q-7", "inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [2],
                                         "data": [base64.b64encode(f).decode() for f in frames]}],
               "parameters": {"slo_ms": 3000}}
        r = s.request("POST", "/v2/models/faces/infer", body=json.dumps(req),
                      headers={"Content-Type": "application/json"},
                      schema_name="oip_infer_response")
        assert r.status == 200, r
        out = r.json["outputs"][0]
        assert r.json["id"] == "q-7" and out["name"] == "RESULT" and out["shape"] == [2, 1], r.json
        got = [len(json.loads(t)["det"]["cls"]) for t in out["data"]]
        assert got == [1, 8], got
        # A malformed one: 400 naming the input, nothing run.
        req["inputs"][0]["name"] = "PIXELS"
        r = s.request("POST", "/v2/models/faces/infer", body=json.dumps(req),
                      headers={"Content-Type": "application/json"})
        assert r.status == 400 and "PIXELS" in r.json["error"], r.json
        assert s.get("/pipelines/faces", headers=auth(s)).json["queries"]["ok"] == 1
    finally:
        s.stop()


@test
def a_query_whose_first_stage_cannot_make_it_is_dropped_whole():
    s = started()
    try:
        post(s, spec(), expect=201)
        assert query(s, gray(250), slo=3000).status == 200
        before = stats_count(s, "cls_m")
        # A 2 ms SLO: below what a decode and a batch of each stage take,
        # refused at once, 400 slo_too_tight saying the least SLO that
        # works, and without Retry-After: no retry can succeed.
        for _ in range(5):
            r = query(s, gray(250), slo=2)
            assert r.status == 400 and r.json["code"] == "slo_too_tight", r
            assert "retry-after" not in r.headers, r.headers
            assert "ask for" in r.json["error"], r.json
            validate(r.json, "error")
        # The same over OIP (the pipeline as a model), from parameters.slo_ms.
        oip = {"inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES",
                           "data": [base64.b64encode(gray(250)).decode()]}],
               "parameters": {"slo_ms": 2}}
        r = s.request("POST", "/v2/models/faces/infer", body=json.dumps(oip),
                      headers={"Content-Type": "application/json"})
        assert r.status == 400 and r.json["code"] == "slo_too_tight", r
        assert "retry-after" not in r.headers and "ask for" in r.json["error"], r
        validate(r.json, "error")
        # From Triton's parameters.timeout (µs: 2000 is 2 ms): the message
        # names the parameter, its unit and the figure that works.
        oip["parameters"] = {"timeout": 2000}
        r = s.request("POST", "/v2/models/faces/infer", body=json.dumps(oip),
                      headers={"Content-Type": "application/json"})
        assert r.status == 400 and r.json["code"] == "slo_too_tight", r
        assert "parameters.timeout 2000" in r.json["error"], r.json
        assert "microseconds" in r.json["error"], r.json
        want = int(r.json["error"].split("send timeout ")[1].split(" ")[0])
        least = int(r.json["error"].rsplit("ask for ", 1)[1].split(" ms or more")[0])
        assert want == least * 1000, r.json
        time.sleep(0.5)
        assert stats_count(s, "cls_m") == before
        # Counted as the caller's errors, not as drops.
        q = s.get("/pipelines/faces", headers=auth(s)).json["queries"]
        assert q["failed"] >= 7 and q["dropped"] == 0, q
    finally:
        s.stop()


def noisy_photo(w=3000, h=2000):
    """A camera file's entropy: its decode is most of what a query takes."""
    a = np.random.default_rng(7).integers(0, 256, (h, w, 3), dtype=np.uint8)
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", quality=92)
    return b.getvalue()


@test
@timing
def a_large_photo_borrows_its_decode_from_the_crops_share_and_is_not_refused():
    """A large photo's decode moves its detector stage's deadline into the
    crops' share (root_start): the least SLO a query is told, and whether a
    drop is a 400 (no retry can help) or a 503 (a retry can), count the
    decode in the whole chain, not against the detector's share alone.
    Seen: the README's pipeline answered a 12 MP photo in 106 ms, yet
    refused the first 12 MP photo of a run at 300 ms as 400 slo_too_tight
    ("ask for 320 ms"): the pool had not seen a large file's time per byte,
    its decode overran the detector's share, and the drop was then judged
    against that share. And the least SLO at arrival counts the frame's own
    size, not only the usual frame's decode."""
    if sanitized():
        raise Skip("timing-bound")
    big = noisy_photo()
    s = started()
    try:
        post(s, spec(slo_ms=400, split="even"), expect=201)
        lat = []
        for _ in range(3):
            r = query(s, big, slo=5000)
            assert r.status == 200, r
            lat.append(r.json["latency_ms"])
    finally:
        s.stop()
    took = sorted(lat)[1]
    # The even split gives the detector half of an SLO of 1.6x what the
    # query takes: less than the photo's decode, which is most of it, while
    # the chain fits with room to spare.
    slo = max(30, int(1.6 * took))

    def least_named(r):
        return int(r.json["error"].rsplit("ask for ", 1)[1].split(" ms or more")[0])

    s = started()  # a fresh model DB: no large file's time per byte known
    try:
        post(s, spec(slo_ms=400, split="even"), expect=201)
        for _ in range(30):  # the usual frames are small
            assert query(s, gray(250), slo=5000).status == 200
        seen, named = [], []
        for _ in range(3):
            r = query(s, big, slo=slo)
            seen.append((r.status, r.json.get("latency_ms", r.json.get("error"))))
            if r.status == 400:  # hopeless only where the chain itself is longer
                named.append(least_named(r))
            elif r.status != 200:  # a loaded box: a retry can make it
                assert r.status == 503 and "retry-after" in r.headers, (r, seen)
        # What the photo takes now, on this box as loaded as it is.
        now = sorted(query(s, big, slo=5000).json["latency_ms"] for _ in range(3))[1]
        # An SLO below the chain: refused at arrival, naming one that works.
        r = query(s, big, slo=int(0.4 * now))
        assert r.status == 400 and r.json["code"] == "slo_too_tight", r
        assert "retry-after" not in r.headers, r.headers
        named.append(least_named(r))
        print("# a %d KB photo: queries take %.1f ms (%s), then %.1f; at SLO %d ms on a fresh "
              "DB: %s; least SLOs named %s" % (len(big) // 1024, took, lat, now, slo, seen, named))
        # Every least named is about what the photo takes (the old one
        # judged its whole decode against the detector's half: twice it).
        assert all(0.4 * now < n <= 1.6 * now + 10 for n in named), (named, now)
        assert any(st == 200 for st, _ in seen), seen
    finally:
        s.stop()


@test
def a_worker_killed_mid_query_leaves_every_query_answered_once():
    s = started(workers="cpu:2")
    try:
        post(s, spec(), expect=201)
        assert query(s, gray(250), slo=3000).status == 200
        codes = []
        lock = threading.Lock()

        def client():
            for _ in range(15):
                r = query(s, gray(250), slo=1500, timeout=60)
                with lock:
                    codes.append(r.status)

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        pids = s.worker_pids()
        assert pids, "no worker pid"
        os.kill(sorted(pids.values())[0], signal.SIGKILL)
        for t in threads:
            t.join(120)
        assert len(codes) == 60, len(codes)
        assert set(codes) <= {200, 503}, codes
        assert codes.count(200) > 0, codes
    finally:
        s.stop()


NPM = os.path.join(SOURCE, "third_party", "npm")
BLAZEFACE = os.path.join(NPM, "blazeface", "face_detection_front_128x128_barracuda.onnx")
PHOTO = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
# BlazeFace's face on grace_hopper.jpg (512x600): decoded from ONNX
# Runtime's outputs by tests/gateway/test_detect_reference.py's numpy
# MediaPipe decode (and checked by eye), with PIL's resize to 128x128.
FACE = (177.8, 142.6, 353.8, 348.9)
FACE_CROPS = {"stage": "det", "boxes": ["Identity_2:0", "Identity_3:0"],
              "scores": ["Identity:0", "Identity_1:0"], "anchors": "mediapipe_face_front_128",
              "sigmoid": True, "score_clip": 100, "score_threshold": 0.75, "nms": "weighted",
              "nms_iou": 0.3, "max_crops": 16}


def tiled(k):
    """grace_hopper.jpg tiled 2x1 (k=2) or 2x2 (k=4): k faces."""
    img = Image.open(PHOTO).convert("RGB")
    cols, rows = (2, 1) if k == 2 else (2, 2)
    out = Image.new("RGB", (img.width * cols, img.height * rows))
    for i in range(k):
        out.paste(img, ((i % cols) * img.width, (i // cols) * img.height))
    b = io.BytesIO()
    out.save(b, "JPEG", quality=95)
    return b.getvalue()


@test
def blazeface_finds_the_face_and_its_crop_is_classified_like_the_classifier_alone():
    if not os.path.exists(BLAZEFACE):
        raise Skip("BlazeFace is missing (scripts/bootstrap installs it into third_party/npm)")
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=60)
        with open(BLAZEFACE, "rb") as f:
            upload(s, "blazeface", f.read(), max_batch=1,
                   preprocess={"mean": [127.5, 127.5, 127.5], "std": [127.5, 127.5, 127.5]})
        upload(s, "cls_m", tm.tiny(3))
        wait_ready(s, "blazeface")
        wait_ready(s, "cls_m")
        post(s, spec(name="who", det="blazeface", crops=FACE_CROPS, slo_ms=2000), expect=201)
        with open(PHOTO, "rb") as f:
            photo = f.read()
        r = query(s, photo, name="who", slo=5000)
        assert r.status == 200, r
        dets = r.json["frames"][0]["det"]["cls"]
        assert len(dets) == 1, dets
        box = dets[0]["box"]
        # The gateway resizes with its own arithmetic, the reference with
        # PIL's: a few pixels apart on a 176 px box.
        assert all(abs(a - b) < 6 for a, b in zip(box, FACE)), (box, FACE)
        assert dets[0]["score"] > 0.75, dets
        # The classifier alone on that crop (cut and resized here, sent as
        # a normalized tensor): the same classes and scores.
        x0, y0 = int(np.floor(box[0])), int(np.floor(box[1]))
        x1, y1 = int(np.ceil(box[2])), int(np.ceil(box[3]))
        crop = Image.open(io.BytesIO(photo)).convert("RGB").crop((x0, y0, x1, y1))
        pix = np.asarray(crop.resize((32, 32), Image.BILINEAR), np.float32)
        mean = np.array([0.485, 0.456, 0.406], np.float32) * 255
        std = np.array([0.229, 0.224, 0.225], np.float32) * 255
        x = ((pix - mean) / std).transpose(2, 0, 1)[None]
        req = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                           "data": x.flatten().tolist()}], "parameters": {"slo_ms": 5000}}
        alone = s.request("POST", "/v2/models/cls_m/infer", body=json.dumps(req),
                          headers={"Content-Type": "application/json"})
        assert alone.status == 200, alone
        logits = np.asarray(alone.json["outputs"][0]["data"], np.float64)
        prob = np.exp(logits - logits.max())
        prob /= prob.sum()
        for p in dets[0]["predictions"]:
            assert abs(p["score"] - prob[p["index"]]) < 0.03, (p, prob)
        top = int(np.argmax(prob))
        if prob[top] - np.sort(prob)[-2] > 0.03:
            assert dets[0]["predictions"][0]["index"] == top, (dets[0], prob)
        # Tiled frames: one face per tile; gamma is measured per frame.
        for k in (2, 4):
            r = query(s, tiled(k), name="who", slo=5000)
            assert r.status == 200, r
            assert len(r.json["frames"][0]["det"]["cls"]) == k, (k, r.json["frames"][0])
        four = tiled(4)
        codes = []

        def client():
            for _ in range(5):
                codes.append(query(s, four, name="who", slo=1500).status)

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert codes == [200] * 20, codes
        g = s.get("/pipelines/who", headers=auth(s),
                  schema_name="pipeline").json["split"]["gamma"]["cls"]
        assert abs(g["measured"] - 4) < 0.4, g
    finally:
        s.stop()


def upload_emulated(s, cfg):
    r = s.request("POST", "/models", body=json.dumps(cfg),
                  headers=dict(auth(s), **{"Content-Type": "application/json"}))
    assert r.status in (200, 201, 202), r
    return r


def emulated_pipeline_models(det_profile, det_max_batch, mean):
    """squishd on two emu devices with an emulated detector "ssd" (its
    profile, max batch and mean detections per frame, 16 slots) and an
    emulated classifier "inc"."""
    s = Squishd(workers="emu:2")
    try:
        s.wait_ready(workers=2, timeout=60)
        upload_emulated(s, {"name": "ssd", "profile": det_profile, "max_batch": det_max_batch,
                            "input": {"shape": [3, 32, 32]},
                            "detections": {"mean": mean, "slots": 16}})
        upload_emulated(s, {"name": "inc", "profile": {"alpha_ms": 0.5, "beta_ms": 2},
                            "max_batch": 64, "input": {"shape": [3, 16, 16]}, "num_classes": 5})
    except BaseException:
        s.stop()
        raise
    return s


@test
def an_emulated_detector_fans_out_by_its_mean_into_an_emulated_classifier():
    """The emulated pipeline that the live figure-17 benchmark runs: a
    detector on emu devices whose detection count per frame is Poisson with
    the mean its upload gives, feeding a classifier on its crops."""
    s = emulated_pipeline_models({"alpha_ms": 2, "beta_ms": 3}, 16, 2)
    try:
        rec = s.get("/models/ssd", headers=auth(s)).json["versions"][0]
        assert rec["detections"] == {"mean": 2, "slots": 16}, rec
        assert [(o["name"], o["shape"]) for o in rec["outputs"]] == \
            [("boxes", [-1, 16, 4]), ("scores", [-1, 16])], rec["outputs"]
        validate(rec, "model_record")
        crops = dict(CROPS, score_threshold=0.5)
        post(s, spec(name="emu", det="ssd", cls="inc", crops=crops), expect=201)
        frame = gray(120, (64, 64))
        frames = 20
        body, ctype = tm.multipart([("f%d" % i, "f%d.jpg" % i, "image/jpeg", frame)
                                    for i in range(frames)])
        counts = []
        for _ in range(10):
            r = query(s, body, name="emu", slo=2000, ctype=ctype)
            assert r.status == 200, r
            assert len(r.json["frames"]) == frames, r.json
            n = 0
            for fr in r.json["frames"]:
                dets = fr["det"]["cls"]
                counts.append(len(dets))
                n += len(dets)
                for d in dets:
                    # A box is the middle 70% of its cell of a 4x4 grid: 11.2 px of 64.
                    x0, y0, x1, y1 = d["box"]
                    assert abs((x1 - x0) - 11.2) < 1.01 and abs((y1 - y0) - 11.2) < 1.01, d
                    assert abs(d["score"] - 0.9) < 1e-6, d
                    assert len(d["predictions"]) == 3, d
            assert r.json["stages"]["cls"]["items"] == n, r.json
        # 200 frames of Poisson(2): the mean's standard error is 0.1.
        mean = sum(counts) / len(counts)
        var = sum((c - mean) ** 2 for c in counts) / len(counts)
        assert abs(mean - 2) < 0.4, (mean, counts)
        assert 1 < var < 3.5, (var, counts)
        assert len(set(counts)) >= 4, counts  # equal frames, varying counts
        g = s.get("/pipelines/emu", headers=auth(s),
                  schema_name="pipeline").json["split"]["gamma"]["cls"]
        assert 1 < g["measured"] < 3, g
        print("# emulated detector: mean %.2f, variance %.2f over %d frames; gamma measured %.2f"
              % (mean, var, len(counts), g["measured"]))
    finally:
        s.stop()



def withdrawn_gone(s, model):
    text = s.get("/metrics").raw.decode()
    for line in text.splitlines():
        if line.startswith('squish_items_withdrawn_total{model="%s",reason="client_gone"}' % model):
            return float(line.split()[-1])
    return 0.0


def phone_photo(scale=6.5):
    """grace_hopper.jpg enlarged uniformly to a phone camera's size (512 x
    600 x 6.5: 3328 x 3900, 13 MP), as a camera would encode it."""
    img = Image.open(PHOTO).convert("RGB")
    big = img.resize((int(img.width * scale), int(img.height * scale)), Image.BICUBIC)
    # A sensor's noise: a camera file's entropy (4 MB, not 1.2 MB smooth).
    a = np.asarray(big).astype(np.int16)
    a += np.random.default_rng(1).integers(-12, 13, a.shape).astype(np.int16)
    b = io.BytesIO()
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(b, "JPEG", quality=92)
    return b.getvalue()


@test
def a_phone_photo_goes_through_the_pipeline_within_its_slo():
    """Issue 23: a 4000 x 3000 photo into a 300 ms BlazeFace -> classifier
    pipeline got 503 "stage det: the deadline passed during preprocessing"
    after 45 ms, every time: the root frame was decoded at full size (its
    crops are cut from it) within a budget sized by the pool's mean decode.
    Now a large frame is decoded at the smallest DCT scale that still covers
    every stage's input, and its decode is planned from its own size. Boxes
    come back in the photo's own pixels."""
    if not os.path.exists(BLAZEFACE):
        raise Skip("BlazeFace is missing (scripts/bootstrap installs it into third_party/npm)")
    if sanitized():
        raise Skip("timing-bound: the sanitizers decode a 13 MP photo several times slower")
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=60)
        with open(BLAZEFACE, "rb") as f:
            upload(s, "blazeface", f.read(), max_batch=1,
                   preprocess={"mean": [127.5, 127.5, 127.5], "std": [127.5, 127.5, 127.5]})
        upload(s, "cls_m", tm.heavy(hw=320))  # tens of ms a batch: most of the 300 ms
        wait_ready(s, "blazeface")
        wait_ready(s, "cls_m")
        # The pipeline (300 ms, the DP's split), and a tighter sibling
        # whose detector's share (75 ms) is about what decoding this photo at
        # full size takes on this CPU.
        post(s, spec(name="phone", det="blazeface", crops=FACE_CROPS, slo_ms=300), expect=201)
        post(s, spec(name="tight", det="blazeface", crops=FACE_CROPS, slo_ms=150, split="even"),
             expect=201)
        with open(PHOTO, "rb") as f:
            small = f.read()
        photo = phone_photo()
        for name, slo in (("phone", 300), ("tight", 150)):
            for _ in range(5):  # the pool's mean decode is a small frame's
                assert query(s, small, name=name).status == 200
            for i in range(5):
                r = query(s, photo, name=name)
                assert r.status == 200, (name, r)
                fr = r.json["frames"][0]
                assert (fr["width"], fr["height"]) == (3328, 3900), fr
                dets = fr["det"]["cls"]
                assert len(dets) == 1, dets
                want = [v * 6.5 for v in FACE]
                # In the photo's pixels, though the detector saw a smaller decode.
                assert all(abs(a - b) < 6 * 6.5 for a, b in zip(dets[0]["box"], want)), \
                    (dets[0]["box"], want)
                print("# 13 MP photo through %s (%d ms): %.1f ms" % (name, slo,
                                                                   r.json["latency_ms"]))
                assert r.json["latency_ms"] <= slo, r.json
    finally:
        s.stop()


@test
def a_query_whose_client_goes_away_runs_nothing_more():
    """Issue 23, the pipeline sibling of test_admission's clients that go
    away: 16 clients send a frame each to a pipeline whose detector runs one
    frame at a time (l(1) = 105 ms, on two devices) and close after 0.35 s.
    The frames not yet in a batch then are withdrawn, never run."""
    s = emulated_pipeline_models({"alpha_ms": 100, "beta_ms": 5}, 1, 2)
    try:
        post(s, spec(name="slowdet", det="ssd", cls="inc", crops=dict(CROPS, score_threshold=0.5)),
             expect=201)
        frame = gray(120, (64, 64))
        assert query(s, frame, name="slowdet", slo=5000).status == 200  # loaded
        time.sleep(0.3)
        before = stats_count(s, "ssd")
        clients = 16
        go = threading.Barrier(clients)

        def one():
            c = socket.create_connection(("127.0.0.1", s.port))
            go.wait()
            c.sendall(("POST /v1/pipelines/slowdet/infer HTTP/1.1\r\nHost: x\r\n"
                       "Content-Type: image/jpeg\r\nX-SLO-Ms: 5000\r\n"
                       "Content-Length: %d\r\n\r\n" % len(frame)).encode() + frame)
            time.sleep(0.35)
            c.close()

        threads = [threading.Thread(target=one) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        eventually(lambda: withdrawn_gone(s, "ssd") >= 4, 5, "frames of gone clients withdrawn")
        time.sleep(0.6)  # any frame sent would have answered by now
        ran = stats_count(s, "ssd") - before
        gone = withdrawn_gone(s, "ssd")
        print("# %d clients: %d frames ran, %d withdrawn" % (clients, ran, gone))
        assert ran + gone == clients, (ran, gone)
        assert ran <= 12, ran
        assert query(s, frame, name="slowdet", slo=5000).status == 200
    finally:
        s.stop()


@test
def a_stage_is_planned_for_its_budget_not_its_slo_bucket():
    """A stage's session is keyed by the SLO bucket of its budget (355 ms
    is bucket 300), but the planner packs it for the budget itself, as the
    simulator does: Nexus's saturated batch of l(b) = 20 b + 5 ms is the
    largest b with 2 l(b) <= 355, 8 (165 ms); planned for the bucket's 300
    ms it would be 7, and the stage would need more devices than it does."""
    s = emulated_pipeline_models({"alpha_ms": 20, "beta_ms": 5}, 32, 0.5)
    try:
        crops = dict(CROPS, score_threshold=0.5)
        post(s, spec(name="emu", det="ssd", cls="inc", crops=crops, slo_ms=710, split="even"),
             expect=201)
        body, ctype = tm.multipart([("f%d" % i, "f%d.jpg" % i, "image/jpeg", gray(120, (64, 64)))
                                    for i in range(20)])

        def ssd_batches():
            # About 60 frames a second from one client (20-frame queries),
            # more than one device serves at batch 8 (48 a second): one
            # device saturated at the stage's budget.
            for _ in range(8):
                query(s, body, name="emu", ctype=ctype)
            return sorted(x["batch"] for d in s.get("/v1/plan", schema_name="plan").json["devices"]
                          for x in d["sessions"] if x["model"] == "ssd" and x["rate_rps"] >= 1)

        batches = eventually(lambda: (lambda b: b if b and max(b) >= 8 else None)(ssd_batches()),
                             30, "the detector saturated at its budget's batch")
        assert max(batches) == 8, batches
        print("# the detector's planned batches at budget 355 ms (bucket 300): %s" % batches)
    finally:
        s.stop()



@test
def a_refused_query_names_the_least_slo_and_retry_after_only_when_a_retry_can_succeed():
    """A stage's share too small: with an even split each stage gets half
    the query's SLO, so an SLO whose half is below the detector's batch of
    one (l(1) = 25 ms and the dispatch margin) fails the same way on every
    retry, even though the chain of stages fits in it: refused at once,
    without Retry-After, naming the stage and the least SLO. Asking for
    that least is not refused. A feasible SLO dropped under load carries
    Retry-After and says a retry can make it."""
    s = emulated_pipeline_models({"alpha_ms": 20, "beta_ms": 5}, 1, 0.5)
    try:
        crops = dict(CROPS, score_threshold=0.5)
        post(s, spec(name="even", det="ssd", cls="inc", crops=crops, slo_ms=400, split="even"),
             expect=201)
        frame = gray(120, (64, 64))
        assert query(s, frame, name="even", slo=2000).status == 200  # loaded
        # Chain: decode + 25 ms + margin, then inc's 2.5 ms + margin, about
        # 50 ms; half of 60 ms is below the detector's 35 ms.
        for _ in range(3):
            r = query(s, frame, name="even", slo=60)
            assert r.status == 400 and r.json["code"] == "slo_too_tight", r
            assert "retry-after" not in r.headers, r.headers
            assert "stage det" in r.json["error"], r.json
            least = int(r.json["error"].rsplit("ask for ", 1)[1].split(" ms or more")[0])
            assert 60 < least <= 120, r.json
        print("# refused: %s" % r.json["error"])
        # The least it named: not refused for its SLO (at most dropped, then
        # 503 deadline with Retry-After, the machine being busy).
        r = query(s, frame, name="even", slo=least)
        assert r.status == 200 or (r.status == 503 and r.json["code"] == "deadline" and
                                   "retry-after" in r.headers), r
        assert "ask for" not in (r.json or {}).get("error", ""), r.json

        # Under load: 12 frames at once, the detector running one at a time
        # on two devices in 25 ms, its share 150 ms of an SLO of 300: the
        # later frames are dropped, and a retry can make it.
        body, ctype = tm.multipart([("f%d" % i, "f%d.jpg" % i, "image/jpeg", frame)
                                    for i in range(12)])
        answers = []
        lock = threading.Lock()

        def client():
            r = query(s, body, name="even", slo=300, ctype=ctype)
            with lock:
                answers.append(r)

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        dropped = [r for r in answers if r.status == 503]
        assert len(answers) == 4 and dropped, answers
        for r in dropped:
            assert r.json["code"] == "deadline", r.json
            assert "retry-after" in r.headers, (r.headers, r.json)
            assert "a retry can make it" in r.json["error"], r.json
        print("# dropped under load: %s" % dropped[0].json["error"])
    finally:
        s.stop()


if __name__ == "__main__":
    run()
