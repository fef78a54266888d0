"""Live profiles: a worker that becomes slower than its stored profile (an
emulated device slowed 3x mid-run, as a CPU hog would) is noticed from the
batch times workers report, the dispatcher and the planner switch to the
measured latencies, and SLO attainment recovers within 10 s. And measuring
a new model: a ready model on the same worker keeps its goodput."""

import json
import os
import subprocess
import tempfile
import threading
import time

import tiny_models as tm
from harness import (LOADGEN, Skip, Squishd, eventually, loadgen, run, sanitized, test,
                     timing)
from test_models import auth, upload

SLO_MS = 100
MODEL = {"name": "slow", "profile": {"alpha_ms": 1.053, "beta_ms": 5.072}, "max_batch": 32,
         "default_slo_ms": SLO_MS, "input": {"shape": [3, 4, 4]}, "num_classes": 4}


@test
@timing
def a_slowed_worker_is_replanned_from_measured_latencies_within_10_s():
    """Without the correction the answers of the seconds after the slowdown
    come late (0.94-0.98 good at commit time); with it, the seconds from
    flip + 10 s on are >= 98% good (99-100% on a quiet box)."""
    tmp = tempfile.mkdtemp(prefix="squish-slow-")
    knob = os.path.join(tmp, "slowdown")
    with open(knob, "w") as f:
        f.write("1\n")
    # Deferred dispatch sends each batch as late as its profile allows: with
    # a stale profile, every batch of a slowed device answers late.
    s = Squishd(workers="emu:1", extra=["--policy", "deferred"],
                env={"SQUISH_EMU_SLOWDOWN_FILE": knob})
    try:
        s.wait_ready(workers=1)
        r = s.request("POST", "/models", body=json.dumps(MODEL),
                      headers={"Authorization": "Bearer " + s.token,
                               "Content-Type": "application/json"})
        assert r.status == 201, r
        flip_at = 6

        def slow_down():
            time.sleep(flip_at)
            with open(knob + ".new", "w") as f:
                f.write("3\n")
            os.rename(knob + ".new", knob)

        t = threading.Thread(target=slow_down)
        t.start()
        res = loadgen(s, "slow", 100, 24, slo_ms=SLO_MS, seed=3, per_second=True)
        t.join()
        per = res["per_second"]
        # Outcomes by the second they were answered in.
        done = [g + l + d + b for g, l, d, b in
                zip(per["good"], per["late"], per["dropped"], per["bad"])]
        frac = [g / n if n else 1.0 for g, n in zip(per["good"], done)][:24]
        print("# good fraction per second: %s" % ["%.2f" % x for x in frac], flush=True)
        # Over a window, >= 98% good; no full second below 90%. A shared
        # 2-core box stalls now and then (another test measuring real
        # models on both cores): a second that answered under half its 100
        # requests is a stall, whose few answers say nothing by themselves
        # (CI saw 17 of 19); the window's bound holds them.
        lo, hi = flip_at + 10, 24
        good_after = sum(per["good"][lo:hi])
        done_after = sum(done[lo:hi])
        # Under the sanitizers squishd itself runs several times slower and
        # beside other tests on the same two cores: CI saw seconds before
        # the slowdown at 0.41 good there. The goodput bounds are the
        # release build's; the sanitized run checks the correction itself.
        def worst_full_second(a, b):
            return min([f for f, n in zip(frac[a:b], done[a:b]) if n >= 50], default=1.0)

        if not sanitized():
            assert worst_full_second(1, flip_at - 1) >= 0.95, ("before the slowdown", frac, done)
            assert done_after > 400 and good_after >= 0.98 * done_after, (
                "10 s after the slowdown", good_after, done_after, frac, done)
            assert worst_full_second(lo, hi) >= 0.9, ("10 s after the slowdown", frac, done)
        log = s.read_log()
        assert "profile drift model=slow version=1 kind=emu" in log, log[-3000:]
        # Shown: the metric and the plan carry the correction (about 3).
        text = s.get("/metrics").raw.decode()
        line = [x for x in text.splitlines()
                if x.startswith('squish_profile_scale{model="slow",version="1",kind="emu"}')]
        assert line and 2.5 < float(line[0].split()[-1]) < 3.6, line
        plan = eventually(lambda: (lambda p: p if any(
            "profile_scale" in x for d in p["devices"] for x in d["sessions"]) else None)(
                s.get("/v1/plan", schema_name="plan").json), 10, "a plan with the correction")
        scales = [x["profile_scale"] for d in plan["devices"] for x in d["sessions"]
                  if "profile_scale" in x]
        assert 2.5 < scales[0] < 3.6, plan
        assert s.stop() == 0
    finally:
        s.cleanup()
        for p in (knob,):
            if os.path.exists(p):
                os.unlink(p)
        os.rmdir(tmp)


@test
def a_ready_model_keeps_its_goodput_while_another_is_measured_on_its_worker():
    """One cpu worker serves a ready model at 40 req/s (SLO 100 ms) while a
    second one, seconds to load and measure, is uploaded: the load runs on
    the worker's loader thread and the measurement in the gaps between
    batches. Before, the worker left service for the whole measurement and
    the load blocked its batches: 0-74% of the answers of the seconds it
    took were good. Goal (issue 15): >= 90% of the goodput before."""
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1)
        assert upload(s, tm.tiny(), {"name": "live"}).status == 202

        def status(name):
            return s.get("/models/" + name, headers=auth(s)).json["versions"][-1]["status"]

        eventually(lambda: status("live") == "ready" or None, 60, "live measured")
        base = loadgen(s, "live", 40, 4, slo_ms=100, tensor="3x32x32", seed=1)
        # The stream covers the upload at 2 s and the measurement after it:
        # 1-2 s in the release build (so 8 s of stream leave it room on a
        # loaded box), 5-10 times that under the sanitizers. Its seconds
        # past the measurement say nothing (they were 16 of 20 here).
        p = loadgen(s, "live", 40, 20 if sanitized() else 8, slo_ms=100, tensor="3x32x32",
                    seed=2, per_second=True, wait=False)
        t0 = time.time()
        time.sleep(2)
        assert upload(s, tm.heavy(hw=320), {"name": "new"}).status == 202
        t_up = time.time() - t0
        eventually(lambda: status("new") != "profiling" or None, 120, "new measured", step=0.1)
        t_done = time.time() - t0
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        per = json.loads(out)["per_second"]
        assert status("new") == "ready"
        # The seconds the upload, load and measurement spanned, within the
        # stream's 20 (on a crowded machine the measurement can outlast it:
        # the seconds both cover are the ones that say something).
        lo, hi = int(t_up), min(int(t_done) + 1, len(per["good"]))
        good = sum(per["good"][lo:hi])
        done = sum(per["good"][i] + per["late"][i] + per["dropped"][i] + per["bad"][i]
                   for i in range(lo, hi))
        before = base["good"] / max(1, base["requests"])
        print("# measured from %.1f s to %.1f s: %d of %d good (%.3f), %.3f before" % (
            t_up, t_done, good, done, good / max(1, done), before), flush=True)
        assert before >= 0.95, base
        # At least a second of the 40 req/s stream (whole seconds: a
        # measurement within one second spans about 30-50 answers). The goal
        # is the release build's; under the sanitizers (scripts/test sets
        # ASAN_OPTIONS for that run) the worker loads the heavy model 5-10
        # times slower, and the second of its upload was seen losing 8-10 of
        # ~40 answers there, at the session's start commit too: that run
        # holds a lower bar and still catches a worker taken out of service.
        goal = 0.75 if "ASAN_OPTIONS" in os.environ else 0.9
        assert done >= 30 and good >= goal * before * done, (good, done, per)
        log = s.read_log()
        assert "profiling done" in log and "worker lost" not in log, log[-3000:]
        assert s.stop() == 0
    finally:
        s.cleanup()



MODELS = os.environ.get("SQUISH_TEST_MODELS", "")
PHOTO_PATH = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
PHOTO = open(PHOTO_PATH, "rb").read()
# What README states: resnet18 on an idle worker of the CI machine in about
# 10-20 s at most (6-7 s measured); any model within the 30 s measuring
# budget plus its load. A test cannot hold the clock to that on a shared
# box (or under the sanitizers): it holds version 2, measured beside an
# idle version 1, to version 1's own time, with this much slack.
MEASURE_BOUND_S = 20


@test
def measuring_on_an_idle_worker_is_bounded_and_shows_its_progress():
    """Issue 23: resnet18 version 1 was measured in 7 s, version 2 (another
    file, same architecture) in 2 min 18 s on a near-idle box: its idle
    version 1 (SLO 100 ms) reserved half its SLO in every gap, so each
    measurement batch waited for a starved slot. An idle model now holds
    up nothing: each version of resnet18 is ready within the stated bound
    (the 30 s measuring budget plus its load; 14-31 s on a 2-vCPU box), and
    its status shows the measurement's progress meanwhile."""
    r18 = os.path.join(MODELS, "resnet18.onnx")
    r18b = os.path.join(MODELS, "resnet18_ft_a.onnx")
    if not (os.path.exists(r18) and os.path.exists(r18b)):
        raise Skip("the torchvision exports are missing (meson builds them into tests/models)")
    if sanitized():
        # A minute there to show only that it ends: the measuring and its
        # progress run under the sanitizers in this file's other tests.
        raise Skip("time bounds: the release build checks them")
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=60)
        limit = 300
        took = {}
        seen = []
        for version, path in ((1, r18), (2, r18b)):
            with open(path, "rb") as f:
                data = f.read()
            t0 = time.time()
            r = upload(s, data, {"name": "r18", "version": version, "default_slo_ms": 100})
            assert r.status == 202, r
            while True:
                v = [x for x in s.get("/models/r18", headers=auth(s)).json["versions"]
                     if x["version"] == version][0]
                if v["status"] != "profiling":
                    break
                if "profiling" in v:
                    seen.append(v["profiling"])
                assert time.time() - t0 < limit, v
                time.sleep(0.2)
            took[version] = time.time() - t0
            assert v["status"] == "ready", v
            if version == 1:  # served, then idle while version 2 is measured
                for _ in range(3):
                    a = s.request("POST", "/v1/models/r18/versions/1/infer", body=PHOTO)
                    assert a.status == 200, a
        print("# resnet18 measured: version 1 in %.1f s, version 2 in %.1f s" % (took[1], took[2]))
        # The bug made version 2 wait 20 times longer than version 1; on a
        # loaded box both are slower alike (one took 60 s on a CI run beside
        # three builds), so the bound is version 1's time, not the clock's.
        assert took[2] <= 2 * took[1] + MEASURE_BOUND_S, took
        # A progress figure: sizes done of those expected, elapsed, an eta.
        figs = [p for p in seen if p.get("batch_sizes_total", 0) > 0]
        assert figs and all(0 <= p["batch_sizes_done"] <= p["batch_sizes_total"] for p in figs), seen
        assert any("eta_ms" in p for p in figs), seen
        assert s.stop() == 0
    finally:
        s.cleanup()


def _measure_then_drive(path):
    """One fresh squishd with one cpu worker: mobilenet_v2 uploaded and
    measured, then closed loops of 1 and 4 JPEG requests. Returns
    ({batch size: live / profile} of the sizes that served >= 15 batches,
    {loop: slowest answer ms})."""
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=60)
        with open(path, "rb") as f:
            r = upload(s, f.read(), {"name": "mv2", "max_batch": 4})
        assert r.status == 202, r
        # Polled as a readiness probe would, not 50 times a second: each
        # probe wakes squishd's threads beside the worker's two, and on two
        # cores 50 a second still measured l(1) 9.5-12.3 ms against 6.3
        # (before migration 7 each probe also read the model's whole file
        # from the model DB: 13 ms, and the CI failure this test had).
        eventually(lambda: s.get("/v2/models/mv2/ready").status == 200 or None, 300,
                   "mobilenet_v2 measured and ready", step=0.25)
        v = s.get("/models/mv2", headers=auth(s)).json["versions"][-1]
        prof = [p for p in v["profiles"] if p["device_kind"] == "cpu"][0]
        l = dict(zip(prof["batch"], prof["latency_ms"]))
        worst = {}
        for n in (1, 4):
            p = subprocess.run([LOADGEN, "--port", str(s.port), "--path", "/v1/models/mv2/infer",
                                "--body", PHOTO_PATH, "--content-type", "image/jpeg",
                                "--slo-ms", "60000", "--closed", str(n), "--duration", "3",
                                "--timeout-ms", "60000"], capture_output=True, text=True,
                               timeout=120)
            assert p.returncode == 0, p.stderr[-2000:]
            j = json.loads(p.stdout)
            assert j["good"] > 0 and j["dropped"] == 0 and j["errors"] == 0, j
            worst[n] = j["latency_ms"]["max"]
        st = s.get("/v2/models/mv2/stats").json["model_stats"][0]
        ratios = {}
        for bs in st["batch_stats"]:
            b, c = bs["batch_size"], bs["compute_infer"]
            if c["count"] >= 15 and b in l:
                ratios[b] = (c["ns"] / c["count"] / 1e6) / l[b]
                print("# batch %d: profile %.2f ms, live %.2f ms over %d batches (%.2fx)" % (
                    b, l[b], c["ns"] / c["count"] / 1e6, c["count"], ratios[b]), flush=True)
        print("# closed loops, slowest answer: %s ms" % worst, flush=True)
        assert 1 in ratios, st["batch_stats"]
        assert s.stop() == 0
        return ratios, worst
    finally:
        s.cleanup()


@test
def a_cpu_model_runs_live_as_fast_as_it_was_measured():
    """Issue 26: a RegNetY measured l(1) = 33.7 ms ran live batches of 70 ms,
    and the live correction then planned with 1.93x the profile. The cpu
    worker's profile is the planner's input: a model measured on an idle
    worker (mobilenet_v2) and then driven by closed loops of 1 and 4 JPEG
    requests runs each batch size that served at least 15 batches within
    [0.5, 1.5] of its profile here (bench/live_profile.py holds the exact
    figures, within 10% on a quiet box; a loaded 2-core CI box moves live
    batches by tens of percent, and this host's speed moves in steps of up
    to 30% lasting seconds: 0.59-1.43 seen in one hour). A second fresh
    squishd measures and drives again when the first is outside: the bug
    is in every run, a slow stretch of the host in one. And no request of a
    closed loop waits for its SLO (60 s): a deferred batch held to its
    frontrun moment once the client stopped sending waited 1-10 s (p50
    5 ms)."""
    path = os.path.join(MODELS, "mobilenet_v2.onnx")
    if not os.path.exists(path):
        raise Skip("the torchvision exports are missing (meson builds them into tests/models)")
    seen = []
    for _ in range(2):
        ratios, worst = _measure_then_drive(path)
        seen.append(ratios)
        assert worst[1] < (3000 if sanitized() else 1000), worst
        # Under the sanitizers the worker's own code runs several times
        # slower, and the profile's first runs more so (l(1) 11.3 ms against
        # 5.5 live): only the closed loop's bound holds there.
        if sanitized() or all(0.5 <= x <= 1.5 for x in ratios.values()):
            return
    raise AssertionError("live / profile outside [0.5, 1.5] twice: %s" % seen)

if __name__ == "__main__":
    run()
