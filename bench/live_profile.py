#!/usr/bin/python3
"""Live batch latencies against the profile they were planned with (issue 26).

    /usr/bin/python3 bench/live_profile.py BUILD_DIR MODEL.onnx... [--closed 1,2,4,8]
        [--seconds 6] [--max-batch 8] [--worker-threads N]

Starts squishd with one cpu worker, uploads each model (its name: the file's
stem), waits until the worker has measured its profile and loaded it, then
drives it with squish-loadgen's closed loops of 1, 2, 4 and 8 requests in
flight (binary OIP tensors, a 60 s SLO so that nothing is dropped), one
model at a time. Reports, per model and batch size that ran, the profile's
l(b), the mean compute time of the live batches of that size (Triton's
batch_stats compute_infer, the worker's own execute time), their ratio, and
how many batches ran. The planner plans with l(b): a ratio above 1 is a
batch slower than planned.

--repeat N measures each model N times in turn, profile then live: the
same file again with a doc_string appended (another sha256, so squishd
measures it afresh instead of taking its twin's profile). A shared host's
speed drifts by tens of percent over minutes; the second profile against
the first says how much of live / profile is that drift, not the model.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))


def upload_and_wait(s, tm, path, max_batch, timeout_s=600, copy=0):
    """Uploads the ONNX file at path (named after its stem) to squishd s and
    waits until the worker has measured and loaded it; returns the name.
    copy > 0: the same graph under STEM_rCOPY, with a doc_string appended
    (ModelProto field 6: the last one read wins), so its bytes differ."""
    name = os.path.splitext(os.path.basename(path))[0]
    with open(path, "rb") as f:
        data = f.read()
    if copy > 0:
        name = "%s_r%d" % (name, copy)
        doc = ("copy %d" % copy).encode()
        data += bytes([0x32, len(doc)]) + doc
    body, ctype = tm.multipart([
        ("model", "m.onnx", "application/octet-stream", data),
        ("config", "config.json", "application/json",
         json.dumps({"name": name, "max_batch": max_batch}).encode())])
    r = s.request("POST", "/models", body=body,
                  headers={"Authorization": "Bearer " + s.token, "Content-Type": ctype})
    assert r.status in (201, 202), r
    deadline = time.time() + timeout_s
    while s.get("/v2/models/%s/ready" % name).status != 200:
        assert time.time() < deadline, "%s never ready" % name
        time.sleep(0.5)
    return name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--closed", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1,
                    help="profile then live, this many times per model (a fresh copy each)")
    ap.add_argument("--env", action="append", default=[],
                    help="NAME=VALUE for squishd and its workers (OMP_WAIT_POLICY=...)")
    a = ap.parse_args()
    os.environ["SQUISH_BUILD_DIR"] = os.path.abspath(a.build)
    import harness
    import tiny_models as tm

    env = dict(e.split("=", 1) for e in a.env)
    s = harness.Squishd(workers="cpu", env=env)
    rows = []
    try:
        s.wait_ready(workers=1, timeout=30)
        auth = {"Authorization": "Bearer " + s.token}
        for path in a.models:
            for rep in range(a.repeat):
                name = upload_and_wait(s, tm, path, a.max_batch, copy=rep)
                rows += measure(a, s, auth, harness, name, rep)
                # Gone before its copy comes: two copies of one graph would
                # form a prefix group and run as one.
                assert s.request("DELETE", "/models/%s" % name, headers=auth).status < 300
    finally:
        s.stop()
        s.cleanup()
    print("\n| model | batch | profile l(b) ms | live ms | live / profile | batches |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if r["profile_ms"] is None:  # beyond the profile's sizes: a prefix group's batch
            continue
        print("| %s | %d | %.2f | %.2f | %.2f | %d |" % (r["model"], r["batch"], r["profile_ms"],
                                                        r["live_ms"], r["ratio"], r["batches"]))
    if a.repeat > 1:
        drift_table(rows, a.repeat)


def profile_of(s, auth, name):
    """The stored cpu profile of model name as {batch: l(b) ms}, and its
    input's CxHxW for squish-loadgen --tensor."""
    rec = s.get("/models/%s" % name, headers=auth).json
    vers = rec.get("versions") or [rec]
    prof = [p for p in vers[-1]["profiles"] if p["device_kind"] == "cpu"][0]
    shape = "x".join(str(d) for d in vers[-1]["input"]["shape"][-3:]) \
        if "input" in vers[-1] else "3x224x224"
    return dict(zip(prof["batch"], prof["latency_ms"])), shape


def closed_loop(s, harness, name, shape, n, seconds):
    """squish-loadgen: n binary FP32 tensors in flight on model name for
    seconds, a 60 s SLO (nothing dropped)."""
    p = subprocess.run([harness.LOADGEN, "--port", str(s.port), "--path",
                        "/v2/models/%s/infer" % name, "--tensor", shape, "--slo-ms", "60000",
                        "--closed", str(n), "--duration", str(seconds), "--warmup", "1",
                        "--timeout-ms", "60000"],
                       capture_output=True, text=True, timeout=seconds + 120)
    assert p.returncode == 0, p.stderr[-1000:]


def measure(a, s, auth, harness, name, rep):
    """Closed loops of each --closed size on model name; its rows (batch
    sizes that ran) with the stored profile's l(b) beside."""
    l, shape = profile_of(s, auth, name)
    for n in [int(x) for x in a.closed.split(",")]:
        closed_loop(s, harness, name, shape, n, a.seconds)
    st = s.get("/v2/models/%s/stats" % name).json["model_stats"][0]
    rows = []
    for bs in st["batch_stats"]:
        b, c = bs["batch_size"], bs["compute_infer"]
        if c["count"] == 0:
            continue
        live = c["ns"] / c["count"] / 1e6
        want = l.get(b) or min((v for k, v in l.items() if k >= b), default=None)
        row = {"model": name, "rep": rep, "batch": b, "profile_ms": want,
               "live_ms": round(live, 3), "ratio": round(live / want, 3) if want else None,
               "batches": c["count"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def drift_table(rows, repeat):
    """Per model and batch size: each round's live / profile, and each later
    profile against the first (the host's drift between measurements)."""
    print("\n| model | batch | live / profile, each round | profile / first profile |")
    print("|---|---|---|---|")
    by = {}
    for r in rows:
        base = r["model"].rsplit("_r", 1)[0] if r["rep"] > 0 else r["model"]
        by.setdefault((base, r["batch"]), {})[r["rep"]] = r
    for (model, b), reps in by.items():
        if len(reps) < repeat or any(x["ratio"] is None for x in reps.values()):
            continue
        first = reps[0]["profile_ms"]
        print("| %s | %d | %s | %s |" % (
            model, b, " ".join("%.2f" % reps[k]["ratio"] for k in range(repeat)),
            " ".join("%.2f" % (reps[k]["profile_ms"] / first) for k in range(1, repeat))))


if __name__ == "__main__":
    main()
