"""The README's pipeline (BlazeFace, then resnet18 on the faces, SLO 300 ms)
on a machine that a neighbour shares: a CPU hog pinned to one core, started
and killed by the test. Photos of every kind (baseline, progressive, 4:4:4,
grey, a 12 MP one) are answered within the SLO with none refused, at 1
query a second with resnet18 and at 10 with a lighter classifier (10 with
resnet18 is this 2-core box's capacity beside the hog: 5-11 of 100
refused, each with a 503 a retry can pass; bench/RESULTS.md); and a restart plans its first query as the later ones (the decode
estimates are stored in the model DB and read at start).

Timing-bound: registered in the 'slow' suite, not run under the sanitizers.
"""
import io
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
from PIL import Image

import tiny_models as tm
from harness import Skip, Squishd, eventually, run, sanitized, test, timing
from test_pipelines import BLAZEFACE, FACE_CROPS, PHOTO, post, query, upload, wait_ready

MODELS = os.environ.get("SQUISH_TEST_MODELS", "")
SLO_MS = 300
FACES_PREP = {"mean": [127.5, 127.5, 127.5], "std": [127.5, 127.5, 127.5]}


def jpeg(img, **kw):
    b = io.BytesIO()
    img.save(b, "JPEG", **kw)
    return b.getvalue()


def photos():
    """grace_hopper.jpg as a phone, a web page and a scanner would send it."""
    src = Image.open(PHOTO).convert("RGB")
    # 720 x 477, progressive: the size of the photo the issue was refused for.
    wide = Image.new("RGB", (720, 477), (90, 90, 90))
    face = src.resize((407, 477), Image.BICUBIC)
    wide.paste(face, ((720 - 407) // 2, 0))
    # 12 MP with a sensor's noise (a camera file's entropy).
    big = src.resize((3000, 3516), Image.BICUBIC)
    a = np.asarray(big).astype(np.int16)
    a += np.random.default_rng(1).integers(-12, 13, a.shape).astype(np.int16)
    big = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
    return {
        "baseline": jpeg(src, quality=90),
        "progressive_720x477": jpeg(wide, quality=90, progressive=True),
        "444": jpeg(src, quality=95, subsampling=0),
        "grey": jpeg(src.convert("L"), quality=90),
        "12MP": jpeg(big, quality=92),
    }


class Hog:
    """A neighbour: a process spinning on one core (the last one)."""

    def __init__(self):
        self.cpu = max(os.sched_getaffinity(0))
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(self.proc.pid, {self.cpu})

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def classifier(light=False):
    """The README's resnet18 (exported by the build's test models), or
    tiny_models.heavy with light, where resnet18 is missing, or with
    SQUISH_LOAD_CLASSIFIER=heavy. Beside the hog resnet18 gets one core's
    worth (a batch of one in 60-65 ms on this 2-core box: the worker's pool
    runs each batch size the fastest way it measured, bench/RESULTS.md "A
    neighbour on a core")."""
    r18 = os.path.join(MODELS, "resnet18.onnx")
    if not light and os.environ.get("SQUISH_LOAD_CLASSIFIER", "resnet18") == "resnet18" \
            and os.path.exists(r18):
        with open(r18, "rb") as f:
            return "resnet18", f.read()
    return "heavy", tm.heavy(hw=224)


def started(tmp=None):
    s = Squishd(workers="cpu:1", tmp=tmp)
    s.wait_ready(workers=1, timeout=60)
    return s


def setup_pipeline(s, name="who", light=False):
    """The pipeline `name` (BlazeFace, then classifier(light) on its faces);
    returns the classifier's name."""
    kind, model = classifier(light)
    if s.get("/models/faces", headers={"Authorization": "Bearer " + s.token}).status != 200:
        with open(BLAZEFACE, "rb") as f:
            upload(s, "faces", f.read(), max_batch=1, preprocess=FACES_PREP)
    upload(s, "cls_" + name, model)
    wait_ready(s, "faces")
    wait_ready(s, "cls_" + name)
    post(s, {"name": name, "slo_ms": SLO_MS,
             "stages": [{"id": "det", "model": "faces"},
                        {"id": "cls", "model": "cls_" + name, "top_k": 3,
                         "crops_of": dict(FACE_CROPS, padding=0.1, square=True)}]},
         expect=201)
    return kind


def load(s, pics, rate, seconds, name="who"):
    """Open loop: a query every 1/rate s, the photos in turn; returns
    (kind, status, latency_ms, body) for each."""
    out = []
    lock = threading.Lock()
    kinds = list(pics)

    def one(kind):
        t0 = time.time()
        r = query(s, pics[kind], name=name, timeout=10)
        lat = r.json.get("latency_ms") if r.status == 200 else (time.time() - t0) * 1000
        with lock:
            out.append((kind, r.status, lat, r.json))

    threads = []
    start = time.time()
    n = int(rate * seconds)
    for i in range(n):
        delay = start + i / rate - time.time()
        if delay > 0:
            time.sleep(delay)
        t = threading.Thread(target=one, args=(kinds[i % len(kinds)],))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(30)
    return out


def report(rate, res):
    lat = sorted(x[2] for x in res if x[1] == 200)
    bad = [(k, st, j.get("error", j)) for k, st, _, j in res if st != 200]
    late = [(k, round(l, 1)) for k, st, l, _ in res if st == 200 and l > SLO_MS]
    p = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]) if lat else (lambda q: float("nan"))
    print("# %g qps: %d queries, %d refused, %d late; latency p50 %.1f p99 %.1f max %.1f ms"
          % (rate, len(res), len(bad), len(late), p(0.5), p(0.99), lat[-1] if lat else 0),
          flush=True)
    for kind in sorted({x[0] for x in res}):
        ks = sorted(x[2] for x in res if x[0] == kind and x[1] == 200)
        if ks:
            print("#   %-20s n=%d max %.1f ms" % (kind, len(ks), ks[-1]), flush=True)
    for b in bad[:5]:
        print("#   refused: %s %s %s" % b, flush=True)
    return bad, late


def budgets(s, name="who"):
    r = s.get("/pipelines/" + name, headers={"Authorization": "Bearer " + s.token})
    return r.json.get("split", r.json)


@test
@timing
def the_readmes_pipeline_beside_a_busy_neighbour_meets_its_slo_for_every_kind_of_photo():
    if not os.path.exists(BLAZEFACE):
        raise Skip("BlazeFace is missing (scripts/bootstrap installs it into third_party/npm)")
    if sanitized():
        raise Skip("timing-bound")
    pics = photos()
    hog = Hog()
    s = None
    try:
        s = started()
        cls = setup_pipeline(s)
        # Above 1 q/s resnet18 beside the hog is this box's capacity: one
        # free core for decoding (a 12 MP photo in five, 130-150 ms each) and
        # resnet18 (60 ms an item); measured with SQUISH_LOAD_CLASSIFIER=
        # resnet18 (bench/RESULTS.md). The faster rates run the lighter one.
        forced = os.environ.get("SQUISH_LOAD_CLASSIFIER") == "resnet18"
        light = None if forced else setup_pipeline(s, "who_light", light=True)
        print("# classifiers %s, %s; photo sizes %s"
              % (cls, light, {k: len(v) for k, v in pics.items()}), flush=True)
        # Warm-up: the pool's estimates and the split see each kind once.
        for name in ("who", "who_light") if light else ("who",):
            for kind, body in pics.items():
                r = query(s, body, name=name)
                print("# warm-up %s %s: %d %s"
                      % (name, kind, r.status, r.json.get("latency_ms", r.json)), flush=True)
                # The first 12 MP photo of a new model DB too: no large
                # file's time per byte is known yet, and its decode borrows
                # from the crops' share by small files' (which errs long).
                assert r.status == 200, (name, kind, r.json)
        time.sleep(1)
        failures = []
        rates = [float(x) for x in os.environ.get("SQUISH_LOAD_RATES", "1,10").split(",")]
        for rate in rates:
            name = "who" if rate <= 1 or not light else "who_light"
            res = load(s, pics, rate, 12 if rate <= 1 else 10, name)
            print("# %s, split at %g qps: %s" % (name, rate, json.dumps(budgets(s, name))),
                  flush=True)
            bad, late = report(rate, res)
            if bad or late:
                failures.append((rate, bad[:3], late[:5]))
        assert not failures, failures
    finally:
        hog.stop()
        if s is not None:
            s.stop()


@test
@timing
def after_a_restart_the_first_query_is_planned_as_the_later_ones():
    if not os.path.exists(BLAZEFACE):
        raise Skip("BlazeFace is missing (scripts/bootstrap installs it into third_party/npm)")
    if sanitized():
        raise Skip("timing-bound")
    pics = photos()
    hog = Hog()
    s = s2 = None
    try:
        s = started()
        setup_pipeline(s, light=True)  # the decode estimates, not the classifier, are the point
        for _ in range(3):
            for kind in ("baseline", "progressive_720x477", "444", "grey"):
                assert query(s, pics[kind], name="who").status == 200
        before = budgets(s)
        assert s.stop() == 0
        s2 = started(tmp=s.tmp)
        eventually(lambda: s2.get("/v2/models/who/ready").status == 200, 60, "pipeline ready")
        log = s2.read_log()
        assert "decode costs loaded" in log.split("signal received")[-1], "not read at start"
        after = budgets(s2)
        print("# split before the restart %s, after %s" % (json.dumps(before), json.dumps(after)),
              flush=True)
        res = []
        for kind in ("progressive_720x477", "baseline", "444", "grey", "progressive_720x477",
                     "baseline"):
            r = query(s2, pics[kind], name="who")
            res.append((kind, r.status, r.json.get("latency_ms", r.json.get("error"))))
        print("# first queries after the restart: %s" % res, flush=True)
        assert all(st == 200 and lat <= SLO_MS for _, st, lat in res), res
    finally:
        hog.stop()
        if s2 is not None:
            s2.stop()
        elif s is not None:
            s.stop()


if __name__ == "__main__":
    run()
