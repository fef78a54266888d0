"""Triton's model control and repository index (issue 24): unload takes a
model (or a pipeline) out of service, on every worker and in the DB, and
load brings it back, answering once it is ready; the index lists models
and pipelines with every state Triton reports; a pipeline is a model on
every route that names one; and a 404 says what was not found and what
would work."""

import io
import json
import threading
import time

import numpy as np
from PIL import Image

import tiny_models as tm
from harness import Squishd, eventually, run, test, validate


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def gray(v, size=(32, 32)):
    out = io.BytesIO()
    Image.fromarray(np.full((size[1], size[0], 3), v, np.uint8)).save(out, "JPEG", quality=95)
    return out.getvalue()


FRAME = gray(120)


def emulated(s, cfg):
    r = s.request("POST", "/models", body=json.dumps(cfg),
                  headers=dict(auth(s), **{"Content-Type": "application/json"}))
    assert r.status in (201, 202), r


def onnx(s, name, model_bytes):
    body, ctype = tm.multipart([("model", "m.onnx", None, model_bytes),
                                ("config", None, None, json.dumps({"name": name}).encode())])
    r = s.request("POST", "/models", body=body, headers=dict(auth(s), **{"Content-Type": ctype}))
    assert r.status == 202, r


def control(s, name, what, body=b"", token=True):
    return s.request("POST", "/v2/repository/models/%s/%s" % (name, what), body=body,
                     headers=auth(s) if token else {}, timeout=180)


def index(s, method="POST"):
    r = s.request(method, "/v2/repository/index", body=b"" if method == "POST" else None,
                  schema_name="repository_index")
    assert r.status == 200, r
    return {(x["name"], x["version"]): (x["state"], x.get("reason")) for x in r.json}


def infer(s, name):
    return s.request("POST", "/v1/models/%s/infer" % name, body=FRAME,
                     headers={"Content-Type": "image/jpeg"})


def query(s, name):
    return s.request("POST", "/v1/pipelines/%s/infer" % name, body=FRAME,
                     headers={"Content-Type": "image/jpeg", "X-SLO-Ms": "2000"})


CROPS = {"stage": "det", "boxes": "boxes", "scores": "scores", "format": "xyxy",
         "normalized": True, "score_threshold": 0.5, "nms_iou": 0.5, "max_crops": 16}


def emu_server(tmp=None, restart=False):
    """squishd on one emu device with an emulated classifier "inc", a
    detector "ssd", and a pipeline "emu" of the two."""
    s = Squishd(workers="emu:1", tmp=tmp)
    s.wait_ready(workers=1, timeout=60)
    if restart:
        return s
    emulated(s, {"name": "inc", "profile": {"alpha_ms": 0.5, "beta_ms": 2}, "max_batch": 16,
                 "input": {"shape": [3, 16, 16]}, "num_classes": 5})
    emulated(s, {"name": "ssd", "profile": {"alpha_ms": 1, "beta_ms": 2}, "max_batch": 8,
                 "input": {"shape": [3, 32, 32]}, "detections": {"mean": 2, "slots": 16}})
    spec = {"name": "emu", "slo_ms": 2000,
            "stages": [{"id": "det", "model": "ssd"},
                       {"id": "cls", "model": "inc", "crops_of": CROPS, "top_k": 3}]}
    r = s.request("POST", "/pipelines", body=json.dumps(spec),
                  headers=dict(auth(s), **{"Content-Type": "application/json"}))
    assert r.status == 201, r
    eventually(lambda: s.get("/v2/health/ready").status == 200, 30, "ready")
    return s


@test
def unload_takes_a_model_out_of_service_and_load_brings_it_back():
    s = emu_server()
    tmp = s.tmp
    s.own_tmp = False
    try:
        assert infer(s, "inc").status == 200
        # Admin operations: the token, as every management write.
        r = control(s, "inc", "unload", token=False)
        assert r.status == 401, r
        r = control(s, "inc", "unload", body=b'{"parameters": {"force": true}}')
        assert r.status == 400 and "unload_dependents" in r.json["error"], r
        r = control(s, "inc", "load", body=b'{"parameters": {"config": "{}"}}')
        assert r.status == 400 and "POST /models" in r.json["error"], r
        # The pipeline "emu" uses it: refused, naming the pipeline and the
        # ways on; ?force=true unloads it anyway.
        r = control(s, "inc", "unload")
        assert r.status == 409 and r.json["code"] == "in_use", r
        assert "pipeline emu" in r.json["error"] and "?force=true" in r.json["error"], r
        assert "unload_dependents" in r.json["error"], r
        r = control(s, "inc", "unload?force=true")
        assert r.status == 200 and r.json == {}, r
        # Out of service at once: refused with what would serve it again.
        r = infer(s, "inc")
        assert r.status == 409 and r.json["code"] == "model_unloaded", r
        assert "/v2/repository/models/inc/load" in r.json["error"], r
        assert "retry-after" not in r.headers, r.headers
        r = s.get("/v2/models/inc/ready")
        assert r.status == 400, r
        # UNLOADING while its record leaves the dispatcher, then UNAVAILABLE.
        assert index(s)[("inc", "1")][0] in ("UNLOADING", "UNAVAILABLE"), index(s)
        eventually(lambda: index(s)[("inc", "1")] == ("UNAVAILABLE", "unloaded"), 10,
                   "inc unloaded in the index")
        assert index(s, "GET")[("inc", "1")] == ("UNAVAILABLE", "unloaded")
        # Kept in the DB, with its profile; squishd is ready without it.
        rec = s.get("/models/inc", headers=auth(s), schema_name=None).json["versions"][0]
        validate(rec, "model_record")
        assert rec["unloaded"] is True and rec["status"] == "ready", rec
        assert rec["profiles"], rec
        listed = {m["name"]: m for m in s.get("/models", headers=auth(s),
                                              schema_name="models_list").json["models"]}
        assert listed["inc"].get("unloaded") is True and "unloaded" not in listed["ssd"], listed
        eventually(lambda: s.get("/v2/health/ready").status == 200, 10, "ready without inc")
        r = s.request("POST", "/v2/repository/index", body=b'{"ready": true}',
                      schema_name="repository_index")
        assert ("inc", "1") not in {(x["name"], x["version"]) for x in r.json}, r.json
        assert s.get("/v2/models/inc/config", schema_name="model_config").json[
            "status"] == "unloaded"
        # An operator's word outlives a restart.
        s.stop()
        s = emu_server(tmp=tmp, restart=True)
        assert infer(s, "inc").status == 409
        assert index(s)[("inc", "1")] == ("UNAVAILABLE", "unloaded"), index(s)
        # A load answers once the model serves: the next request is a 200.
        r = control(s, "inc", "load")
        assert r.status == 200 and r.json == {}, r
        assert index(s)[("inc", "1")] == ("READY", None), index(s)
        r = infer(s, "inc")
        assert r.status == 200, r
        assert "unloaded" not in s.get("/models/inc", headers=auth(s)).json["versions"][0]
        # Load and unload name what they cannot find.
        r = control(s, "ic", "load")
        assert r.status == 404 and "did you mean inc" in r.json["error"], r
    finally:
        s.stop()
        s.own_tmp = True
        s.cleanup()


@test
def a_load_waits_for_a_model_that_was_being_measured():
    """Unloaded while it was being measured on a cpu worker: its load
    measures it again and answers only once it serves."""
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=60)
        onnx(s, "heavy", tm.heavy())
        assert control(s, "heavy", "unload").status == 200
        assert index(s)[("heavy", "1")][0] in ("UNLOADING", "UNAVAILABLE"), index(s)
        # Its measurement was cut short: not measured, not served.
        rec = s.get("/models/heavy", headers=auth(s)).json["versions"][0]
        assert rec["status"] == "profiling" and rec["unloaded"] is True, rec
        r = control(s, "heavy", "load")
        assert r.status == 200, r
        rec = s.get("/models/heavy", headers=auth(s)).json["versions"][0]
        assert rec["status"] == "ready" and rec["profiles"], rec
        r = s.get("/v2/models/heavy/ready")
        assert r.status == 200, r
        r = infer(s, "heavy")
        assert r.status == 200, r
    finally:
        s.stop()


@test
def a_pipeline_is_a_model_on_every_route():
    s = emu_server()
    try:
        assert query(s, "emu").status == 200
        for path in ("/v2/models/emu/config", "/v2/models/emu/versions/1/config"):
            r = s.get(path, schema_name="pipeline_config")
            assert r.status == 200, r
            assert [x["model_name"] for x in r.json["ensemble_scheduling"]["step"]] == [
                "ssd", "inc"], r.json
            assert r.json["ensemble_scheduling"]["step"][1]["crops_of"] == "det", r.json
        for path in ("/v2/models/emu/ready", "/v2/models/emu/versions/1/ready"):
            assert s.get(path).status == 200, path
        r = s.get("/v2/models/emu/versions/1", schema_name="kserve_model_metadata")
        assert r.status == 200 and r.json["platform"] == "squish_pipeline", r
        r = s.get("/v2/models/emu/stats", schema_name="model_stats")
        assert r.status == 200 and r.json["model_stats"][0]["name"] == "emu", r
        assert r.json["model_stats"][0]["inference_count"] >= 1, r.json
        assert r.json["model_stats"][0]["inference_stats"]["success"]["ns"] > 0, r.json
        r = s.get("/v2/models/stats", schema_name="model_stats")
        assert {x["name"] for x in r.json["model_stats"]} == {"emu", "inc", "ssd"}, r.json
        assert index(s)[("emu", "1")] == ("READY", None), index(s)
        assert index(s, "GET")[("emu", "1")] == ("READY", None)
        # Unloaded as a whole: its models stay.
        assert control(s, "emu", "unload").status == 200
        r = query(s, "emu")
        assert r.status == 409 and r.json["code"] == "model_unloaded", r
        assert index(s)[("emu", "1")] == ("UNAVAILABLE", "unloaded"), index(s)
        r = s.get("/v2/models/emu/ready")
        assert r.status != 200 and "unloaded" in r.json["error"], r
        assert infer(s, "inc").status == 200
        r = s.get("/v2/models/emu/config", schema_name="pipeline_config")
        assert r.json["unloaded"] is True, r.json
        r = control(s, "emu", "load")
        assert r.status == 200, r
        assert query(s, "emu").status == 200
        # A stage's model unloaded: the pipeline says which, and loading
        # the pipeline loads it (Triton's ensembles load their models).
        assert control(s, "inc", "unload?force=true").status == 200
        eventually(lambda: index(s)[("emu", "1")][0] == "UNAVAILABLE", 10, "emu unavailable")
        assert index(s)[("emu", "1")][1] == "stage cls: model inc: unloaded", index(s)
        r = s.get("/v2/models/emu/ready", schema_name="kserve_model_ready")
        assert r.status == 400 and r.json["error"].startswith(
            "stage cls: model inc is unloaded"), r
        r = query(s, "emu")
        assert r.status == 409 and "stage cls: model inc is unloaded" in r.json["error"], r
        r = control(s, "emu", "load")
        assert r.status == 200, r
        assert index(s)[("inc", "1")] == ("READY", None), index(s)
        assert query(s, "emu").status == 200
        # unload_dependents takes its models with it.
        r = control(s, "emu", "unload", body=b'{"parameters": {"unload_dependents": true}}')
        assert r.status == 200, r
        st = index(s)
        assert st[("emu", "1")][0] == "UNAVAILABLE" and st[("ssd", "1")][0] in (
            "UNLOADING", "UNAVAILABLE") and st[("inc", "1")][0] in ("UNLOADING", "UNAVAILABLE"), st
    finally:
        s.stop()


@test
def a_404_names_what_was_not_found_and_what_would_work():
    s = emu_server()
    try:
        cases = [
            ("POST", "/v1/models/inc_/infer", "no model or pipeline named inc_; did you mean inc?"),
            ("POST", "/v2/models/ssdd/infer", "did you mean ssd?"),
            ("GET", "/v2/models/inc/versions/3", "model inc has no version 3; its version is 1"),
            ("POST", "/v1/models/inc/versions/2/infer", "model inc has no version 2"),
            ("GET", "/v2/models/inc/versions/x1/config", "'x1' is not a version"),
            ("POST", "/v1/models/emu/infer", "use POST /v1/pipelines/emu/infer"),
            ("POST", "/v1/pipelines/inc/infer", "use POST /v1/models/inc/infer"),
            ("GET", "/models/emu", "use GET or DELETE /pipelines/emu"),
            ("GET", "/pipelines/inc", "use GET or DELETE /models/inc"),
            ("DELETE", "/models/zzz", "no model or pipeline named zzz; GET /v2/repository/index"),
            ("GET", "/v2/models/emu/versions/2/ready", "whose one version is 1"),
            ("GET", "/v2/models/nope/stats", "no model or pipeline named nope"),
            ("GET", "/v2/models/inc/versions/9/stats", "has no version 9"),
        ]
        for method, path, want in cases:
            body = FRAME if method == "POST" else None
            r = s.request(method, path, body=body,
                          headers=dict(auth(s), **{"Content-Type": "image/jpeg"}))
            assert r.status == 404, (path, r)
            assert want in r.json["error"], (path, r.json)
    finally:
        s.stop()


@test
def unload_and_load_under_traffic_answer_every_request_once():
    """Several clients send while the model is unloaded and loaded again:
    every request gets one answer, 200 or 409 model_unloaded (one caught
    between the two may get 503 not_ready, "being loaded again"), and
    once the load has answered, 200 again."""
    s = emu_server()
    try:
        answers, stop = [], threading.Event()

        def client():
            while not stop.is_set():
                r = infer(s, "inc")
                answers.append((r.status, (r.json or {}).get("code")))

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            for _ in range(3):
                time.sleep(0.2)
                assert control(s, "inc", "unload?force=true").status == 200
                time.sleep(0.2)
                assert control(s, "inc", "load").status == 200
            time.sleep(0.2)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        kinds = set(answers)
        assert kinds <= {(200, None), (409, "model_unloaded"), (503, "not_ready")}, kinds
        assert (200, None) in kinds and (409, "model_unloaded") in kinds, kinds
        assert infer(s, "inc").status == 200
    finally:
        s.stop()


if __name__ == "__main__":
    run()
