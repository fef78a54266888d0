"""Crash and restart: squishd SIGKILLed while the planner changes its plan
(and while models are being uploaded) restarts on the same database, finds
it consistent with no partial model, and reapplies the last stored plan
before any request arrives (GET /v1/plan: reason "restored")."""

import json
import os
import signal
import sqlite3
import threading
import time

import tiny_models as tm
import harness
from harness import Squishd, eventually, run, test

# 120 req/s per device at SLO 100 ms: batch 6 in 50 ms, 2 l(6) <= 100.
SLOW = {"name": "slow", "profile": {"alpha_ms": 5.0, "beta_ms": 20.0}, "max_batch": 16,
        "default_slo_ms": 100, "input": {"shape": [3, 4, 4]}, "num_classes": 3}


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def upload_json(s, cfg):
    r = s.request("POST", "/models", body=json.dumps(cfg),
                  headers=dict(auth(s), **{"Content-Type": "application/json"}))
    assert r.status == 201, r
    return r


def loadgen(s, model, rate, seconds, wait=True):
    return harness.loadgen(s, model, rate, seconds, timeout_ms=3000, wait=wait)


def plan(s):
    r = s.get("/v1/plan", schema_name="plan")
    assert r.status == 200, r
    return r.json


def placed(p):
    """{(device, model)} of a /v1/plan body."""
    return {(d["device"], x["model"]) for d in p["devices"] for x in d["sessions"]}


def check_db(path):
    """The database after a crash: sqlite's own checks, then squish's
    invariants: no model row without the rows its upload wrote in the same
    transaction. Returns (last epoch, {(device, model name)} of its
    placements, {model names})."""
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        models = db.execute("SELECT id, name, format, status, EXISTS (SELECT 1 FROM model_files f "
                            "WHERE f.model_id = models.id) FROM models").fetchall()
        for mid, name, fmt, status, has_onnx in models:
            nodes = db.execute("SELECT count(*) FROM model_nodes WHERE model_id = ?", (mid,)).fetchone()[0]
            profiles = db.execute("SELECT count(*) FROM profiles WHERE model_id = ?", (mid,)).fetchone()[0]
            if fmt == "onnx":
                assert has_onnx and nodes > 0, ("ONNX model without its file or nodes", name)
                assert status in ("profiling", "ready", "failed"), (name, status)
            else:
                assert status == "ready" and profiles > 0, ("emulated model without profile", name)
        small = db.execute("SELECT group_id FROM prefix_members GROUP BY group_id "
                           "HAVING count(*) < 2").fetchall()
        assert small == [], ("prefix groups of one", small)
        last = db.execute("SELECT coalesce(max(epoch), 0) FROM plans").fetchone()[0]
        rows = db.execute("SELECT p.device, m.name FROM placements p JOIN models m "
                          "ON m.id = p.model_id WHERE p.epoch = ?", (last,)).fetchall()
        return last, set(rows), {m[1] for m in models}
    finally:
        db.close()


@test
def squishd_killed_during_a_plan_change_restarts_consistent_and_reapplies_the_plan():
    s = Squishd(workers="emu:4", extra=["--epoch-ms", "60000", "--epoch-min-interval-ms", "500"])
    try:
        s.wait_ready(workers=4)
        upload_json(s, SLOW)
        low = loadgen(s, "slow", 60, 2.5)
        assert low["errors"] == 0 and low["good"] > 0.5 * low["requests"], low
        p = eventually(lambda: (lambda p: p if placed(p) else None)(plan(s)), 5,
                       "a plan placing the model")
        before = p["epoch"]

        # Uploads go on while the plan changes: the kill lands between or
        # inside their transactions.
        uploaded, stop = [], threading.Event()

        def uploader():
            i = 0
            while not stop.is_set():
                name = "up%d" % i
                try:
                    if i % 2:
                        body, ctype = tm.multipart([("model", "m.onnx", "application/octet-stream",
                                                     tm.variant(100 + i)),
                                                    ("config", None, None,
                                                     json.dumps({"name": name}).encode())])
                        r = s.request("POST", "/models", body=body,
                                      headers=dict(auth(s), **{"Content-Type": ctype}), timeout=5)
                    else:
                        cfg = dict(SLOW, name=name)
                        r = s.request("POST", "/models", body=json.dumps(cfg), timeout=5,
                                      headers=dict(auth(s), **{"Content-Type": "application/json"}))
                    if r.status in (201, 202):
                        uploaded.append(name)
                except OSError:
                    return  # squishd is gone
                i += 1

        up = threading.Thread(target=uploader)
        up.start()
        # Raise the rate: a scale-up epoch follows within about a second.
        # squishd is killed the moment its log shows that epoch.
        log_at = os.path.getsize(s.log_path)
        high = loadgen(s, "slow", 250, 8, wait=False)
        killed = None
        deadline = time.time() + 8
        while time.time() < deadline and killed is None:
            with open(s.log_path, "rb") as f:
                f.seek(log_at)
                for line in f.read().decode(errors="replace").splitlines():
                    if "level=info epoch=" in line and 'reason="rate change"' in line:
                        epoch = int(line.split("epoch=")[1].split()[0])
                        if epoch > before:
                            s.proc.send_signal(signal.SIGKILL)
                            killed = epoch
                            break
            time.sleep(0.001)
        assert killed is not None, "no plan change within 8 s of raising the rate"
        s.proc.wait(5)
        stop.set()
        up.join(10)
        high.kill()
        high.communicate()
        s.log.close()

        last, stored, models = check_db(s.db)
        assert last in (killed - 1, killed), (last, killed)  # the new epoch, or the one before
        assert stored, ("the stored plan places models", last)
        assert set(uploaded) <= models, ("every acknowledged upload is stored",
                                         set(uploaded) - models)

        s2 = Squishd(workers="emu:4", tmp=s.tmp, extra=["--epoch-min-interval-ms", "5000"])
        try:
            s2.wait_ready(workers=4)
            # Before any request: the stored plan is the current one again.
            p2 = eventually(lambda: (lambda p: p if p["epoch"] > last else None)(plan(s2)), 5,
                            "the restored plan")
            assert p2["reason"] == "restored" and p2.get("restored") is True, p2
            assert p2["restored_from_epoch"] == last and p2["epoch"] == last + 1, (p2, last)
            assert placed(p2) == stored, (placed(p2), stored)
            assert p2["unplaced"] == [], p2
            # The models are loaded on those workers and requests succeed at once.
            t0 = time.time()
            r = s2.request("POST", "/v2/models/slow/infer",
                           body=b"\0" * (3 * 4 * 4 * 4),
                           headers={"Inference-Header-Content-Length": "0"})
            assert r.status == 200, r
            assert time.time() - t0 < 1.0
            res = loadgen(s2, "slow", 60, 2)
            assert res["requests"] > 60 and res["good"] >= 0.95 * res["requests"], res
            assert res["good"] + res["dropped"] == res["requests"], res
            # The restored epoch is stored too (a second crash would find it).
            assert s2.stop() == 0
            db = sqlite3.connect(s2.db)
            reason = db.execute("SELECT reason FROM plans WHERE epoch = ?", (last + 1,)).fetchone()
            db.close()
            assert reason == ("restored",), reason
            m = s2.read_log()
            assert "plan restored from_epoch=%d" % last in m, m[-3000:]
        finally:
            s2.cleanup()
    finally:
        s.cleanup()


@test
def a_restart_with_fewer_workers_and_a_model_gone_places_what_fits():
    s = Squishd(workers="emu:3", extra=["--epoch-ms", "60000", "--epoch-min-interval-ms", "500"])
    try:
        s.wait_ready(workers=3)
        upload_json(s, SLOW)
        upload_json(s, dict(SLOW, name="gone"))
        # The crash comes while the load runs: once it stops, an epoch at
        # the falling rates would consolidate the plan before the crash.
        # 160 req/s: two of the three devices (about 120 req/s each), none
        # of it left unplaced, and more than the one device after the
        # restart can serve.
        a = loadgen(s, "slow", 120, 30, wait=False)
        b = loadgen(s, "gone", 40, 30, wait=False)
        try:
            time.sleep(2)
            p = eventually(lambda: (lambda p: p if {m for _, m in placed(p)} == {"slow", "gone"}
                                    and len({d for d, _ in placed(p)}) >= 2 else None)(plan(s)),
                           20, "a plan placing both models on two devices or more")
            s.proc.send_signal(signal.SIGKILL)
            s.proc.wait(5)
        finally:
            for g in (a, b):
                g.kill()
                g.communicate(timeout=10)
        s.log.close()
        # A delete committed just before the crash, whose epoch was never
        # stored: the stored plan still places the model.
        db = sqlite3.connect(s.db)
        db.execute("PRAGMA foreign_keys = ON")
        db.execute("DELETE FROM models WHERE name = 'gone'")
        db.commit()
        db.close()
        last, stored, _ = check_db(s.db)
        assert {m for _, m in stored} == {"slow"}, stored  # the join drops the deleted model

        s2 = Squishd(workers="emu:1", tmp=s.tmp, extra=["--epoch-min-interval-ms", "5000"])
        try:
            s2.wait_ready(workers=1)
            p2 = eventually(lambda: (lambda p: p if p["epoch"] > last else None)(plan(s2)), 6,
                            "the restored plan")
            assert p2["reason"] == "restored" and p2["restored"] is True, p2
            assert placed(p2) == {("emu:0", "slow")}, p2
            assert all(u["model"] == "slow" for u in p2["unplaced"]), p2
            # Load left without a device: the advice asks for devices, though
            # the one device looks idle (it said "release 1" before).
            assert {u["reason"] for u in p2["unplaced"]} == {"devices"}, p2
            assert p2["advice"]["devices_delta"] >= 1, p2
            r = s2.request("POST", "/v2/models/slow/infer", body=b"\0" * 192,
                           headers={"Inference-Header-Content-Length": "0"})
            assert r.status == 200, r
            r = s2.request("POST", "/v2/models/gone/infer", body=b"\0" * 192,
                           headers={"Inference-Header-Content-Length": "0"})
            assert r.status == 404, r
            assert s2.stop() == 0
        finally:
            s2.cleanup()
    finally:
        s.cleanup()


if __name__ == "__main__":
    run()
