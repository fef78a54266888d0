"""Model management: upload (multipart ONNX, JSON emulated), list, get,
delete, KServe metadata, auth, every error path leaving nothing behind,
shared-prefix detection, persistence, and a SIGKILL during a large upload."""

import hashlib
import json
import re
import os
import signal
import socket
import sqlite3
import threading
import time

import tiny_models as tm
from harness import Squishd, eventually, run, schema, test, validate


def upload(s, model_bytes, config, token=None, labels=None, extra=()):
    fields = [("model", "m.onnx", "application/octet-stream", model_bytes),
              ("config", "config.json", "application/json",
               config if isinstance(config, bytes) else json.dumps(config).encode())]
    if labels is not None:
        fields.append(("labels", "labels.txt", "text/plain", labels))
    fields += list(extra)
    body, ctype = tm.multipart(fields)
    return s.request("POST", "/models", body=body,
                     headers={"Content-Type": ctype,
                              "Authorization": "Bearer " + (token or s.token)},
                     schema_name="model_record")


PHOTO_BYTES = open("/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg", "rb").read()


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def names(s):
    r = s.get("/models", headers=auth(s), schema_name="models_list")
    assert r.status == 200, r
    return {m["name"]: m["versions"] for m in r.json["models"]}


@test
def upload_list_get_metadata_and_delete():
    s = Squishd(workers="none")
    try:
        r = upload(s, tm.tiny(), {"name": "tiny", "default_slo_ms": 50})
        # 202: stored; a worker measures its batching profile next (none here).
        assert r.status == 202 and r.json["status"] == "profiling", r
        rec = r.json
        assert rec["name"] == "tiny" and rec["version"] == 1 and rec["format"] == "onnx"
        assert rec["input"]["shape"] == [-1, 3, 32, 32], rec["input"]
        assert rec["outputs"][0]["shape"] == [-1, 10], rec["outputs"]
        assert rec["labels_count"] == 10 and rec["default_slo_ms"] == 50
        assert rec["preprocess"]["channel_order"] == "RGB"
        assert len(rec["sha256"]) == 64

        labels = "\n".join("class_%d" % i for i in range(10)).encode() + b"\n"
        r = upload(s, tm.tiny(), {"name": "tiny", "version": 2}, labels=labels)
        assert r.status == 202 and r.json["version"] == 2, r
        assert names(s) == {"tiny": [1, 2]}

        r = s.get("/models/tiny", headers=auth(s), schema_name="model")
        assert r.status == 200 and [v["version"] for v in r.json["versions"]] == [1, 2], r

        r = s.get("/v2/models/tiny", schema_name="kserve_model_metadata")
        assert r.status == 200 and r.json["versions"] == ["1", "2"], r
        assert r.json["inputs"][0]["datatype"] == "FP32" and r.json["platform"] == "onnxruntime_onnx"
        r = s.get("/v2/models/tiny/versions/1", schema_name="kserve_model_metadata")
        assert r.status == 200, r
        r = s.get("/v2/models/tiny/versions/9", schema_name="kserve_model_metadata")
        assert r.status == 404, r
        # Readiness is the status code (Open Inference Protocol): 400 while
        # profiling, the body saying the same.
        for path in ("/v2/models/tiny/ready", "/v2/models/tiny/versions/2/ready"):
            r = s.get(path)
            assert r.status == 400 and r.json["ready"] is False, ("not ready while profiling", r)
            assert r.json["code"] == "not_ready" and r.json["name"] == "tiny", r
            validate(r.json, "kserve_model_ready")
        assert s.get("/v2/models/tiny/versions/9/ready").status == 404
        assert s.get("/v2/models/nope/ready").status == 404

        r = s.request("DELETE", "/models/tiny/versions/1", headers=auth(s),
                      schema_name="models_delete")
        assert r.status == 200 and r.json["deleted_versions"] == 1, r
        assert names(s) == {"tiny": [2]}
        r = s.request("DELETE", "/models/tiny/versions/1", headers=auth(s))
        assert r.status == 404 and r.json["code"] == "model_not_found", r
        r = s.request("DELETE", "/models/tiny", headers=auth(s), schema_name="models_delete")
        assert r.status == 200, r
        assert names(s) == {}
        assert s.get("/models/tiny", headers=auth(s)).status == 404
    finally:
        s.stop()
        s.cleanup()


@test
def a_new_version_without_labels_keeps_the_names_of_the_last():
    # Issue 23: version 2 of a classifier uploaded without labels answered
    # "353" where version 1 had names. Now it keeps the newest version's
    # named labels when they fit its classes; its own labels win; a model
    # never named, or named for another number of classes, gets indices.
    s = Squishd(workers="none")
    try:
        named = "\n".join("class_%d" % i for i in range(10)).encode() + b"\n"
        own = "\n".join("own_%d" % i for i in range(10)).encode() + b"\n"
        assert upload(s, tm.tiny(), {"name": "tiny"}, labels=named).status == 202
        assert upload(s, tm.tiny(), {"name": "tiny", "version": 2}).status == 202
        assert upload(s, tm.tiny(), {"name": "tiny", "version": 3}, labels=own).status == 202
        assert upload(s, tm.tiny(), {"name": "tiny", "version": 4}).status == 202
        assert upload(s, tm.tiny(), {"name": "bare"}).status == 202
        emu = {"name": "emu", "profile": {"alpha_ms": 1, "beta_ms": 1}, "num_classes": 3,
               "input": {"shape": [3, 4, 4]}}
        for cfg in (dict(emu, labels=["cat", "dog", "cow"]), dict(emu, version=2),
                    dict(emu, name="emu5", num_classes=5)):
            r = s.request("POST", "/models", body=json.dumps(cfg),
                          headers=dict(auth(s), **{"Content-Type": "application/json"}))
            assert r.status == 201, r
        db = sqlite3.connect(s.db)
        stored = {(n, v): json.loads(l) for n, v, l in
                  db.execute("SELECT name, version, labels FROM models")}
        db.close()
        assert stored["tiny", 2] == ["class_%d" % i for i in range(10)], stored["tiny", 2]
        assert stored["tiny", 3] == ["own_%d" % i for i in range(10)]
        assert stored["tiny", 4] == ["own_%d" % i for i in range(10)], "the newest's"
        assert stored["bare", 1] == [str(i) for i in range(10)]
        assert stored["emu", 2] == ["cat", "dog", "cow"]
        assert stored["emu5", 1] == [str(i) for i in range(5)]
    finally:
        s.stop()
        s.cleanup()


@test
def management_routes_need_the_admin_token():
    s = Squishd(workers="none")
    try:
        for method, path in [("GET", "/models"), ("GET", "/models/x"), ("DELETE", "/models/x"),
                             ("POST", "/models")]:
            r = s.request(method, path)
            assert r.status == 401 and r.json["code"] == "unauthorized", (path, r)
            assert r.headers.get("www-authenticate", "").startswith("Bearer"), r.headers
            r = s.request(method, path, headers={"Authorization": "Bearer " + "0" * 64})
            assert r.status == 401, (path, r)
            r = s.request(method, path, headers={"Authorization": "Basic " + s.token})
            assert r.status == 401, (path, r)
        r = upload(s, tm.tiny(), {"name": "tiny"}, token=s.token[:-1])
        assert r.status == 401, r
        assert names(s) == {}
    finally:
        s.stop()
        s.cleanup()


@test
def bad_uploads_get_the_right_status_and_leave_nothing_behind():
    s = Squishd(workers="none")
    try:
        good = tm.tiny()
        cases = [
            ("garbage", upload(s, os.urandom(5000), {"name": "g"}), 400, "bad_model"),
            ("truncated", upload(s, good[: len(good) // 2], {"name": "t"}), 400, "bad_model"),
            ("unsupported op", upload(s, tm.unsupported(), {"name": "u"}), 422, "unsupported_model"),
            ("config not JSON", upload(s, good, b"{name:"), 400, "bad_json"),
            ("config bad field", upload(s, good, {"name": "x", "version": 0}), 400, "bad_config"),
            ("config unknown field", upload(s, good, {"name": "x", "colour": 1}), 400, "bad_config"),
            ("config bad name", upload(s, good, {"name": "../etc/passwd"}), 400, "bad_config"),
            ("labels mismatch", upload(s, good, {"name": "x", "labels": ["a", "b"]}), 400, "bad_config"),
            ("unknown part", upload(s, good, {"name": "x"}, extra=[("evil", None, None, b"1")]), 400,
             "bad_multipart"),
        ]
        for what, r, status, code in cases:
            assert r.status == status and r.json["code"] == code, (what, r)
        # The refused op named once, with the node that uses it.
        err = cases[2][1].json["error"]
        assert err.count("Round") == 1 and "the node writing 'a_odd'" in err, err
        assert err.startswith("unsupported operators (opset "), err
        # A dozen missing ops (a detector exported with its postprocessing):
        # every one named with its node, the answer not cut at 512 bytes.
        from onnx import TensorProto, helper
        ops = ["Unknown%02d" % i for i in range(12)]
        nodes = [helper.make_node(op, ["x" if i == 0 else "t%d" % (i - 1)], ["t%d" % i],
                                  name="/model/postprocess/stage_%02d/%s" % (i, op))
                 for i, op in enumerate(ops)]
        g = helper.make_graph(nodes, "many", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, ["N", 3, 8, 8])], [helper.make_tensor_value_info(
                "t11", TensorProto.FLOAT, None)])
        many = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
        r = upload(s, many, {"name": "many"})
        assert r.status == 422 and r.json["code"] == "unsupported_model", r
        for i, op in enumerate(ops):
            want = "%s (node '/model/postprocess/stage_%02d/%s')" % (op, i, op)
            assert want in r.json["error"], (want, r.json["error"])
        r = s.request("POST", "/models", body=b"hello", headers=dict(auth(s), **{"Content-Type": "text/plain"}))
        assert r.status == 415 and r.json["code"] == "unsupported_media_type", r
        body, ctype = tm.multipart([("config", None, None, b'{"name": "x"}')])
        r = s.request("POST", "/models", body=body, headers=dict(auth(s), **{"Content-Type": ctype}))
        assert r.status == 400 and "model" in r.json["error"], r
        body, ctype = tm.multipart([("model", "m.onnx", None, good), ("config", None, None, b'{"name":"x"}')])
        r = s.request("POST", "/models", body=body[:-30], headers=dict(auth(s), **{"Content-Type": ctype}))
        assert r.status == 400 and r.json["code"] == "bad_multipart", r
        r = s.request("POST", "/models", body=body,
                      headers=dict(auth(s), **{"Content-Type": "multipart/form-data"}))
        assert r.status == 400, r
        assert "Round" in cases[2][1].json["error"], cases[2][1].json
        assert "version" in cases[4][1].json["error"], cases[4][1].json
        assert names(s) == {}, "nothing stored"
        # A model that exists is a conflict, and stays as it was.
        assert upload(s, good, {"name": "tiny"}).status == 202
        r = upload(s, tm.tiny(2), {"name": "tiny"})
        assert r.status == 409 and r.json["code"] == "already_exists", r
        sha = s.get("/models/tiny", headers=auth(s)).json["versions"][0]["sha256"]
        assert sha == hashlib.sha256(good).hexdigest()
    finally:
        s.stop()
        s.cleanup()


def served_on_cpu_only(s, name, model, why):
    """Uploads model as name (max batch 2), waits until the cpu worker has
    measured it, and checks that its record says the cuda backend cannot
    run it, for why; returns the record."""
    r = upload(s, model, {"name": name, "max_batch": 2})
    assert r.status == 202, r
    eventually(lambda: s.get("/v2/models/%s/ready" % name).status == 200 or None, 60,
               "the model measured on the cpu worker")
    rec = s.get("/models/" + name, headers=auth(s), schema_name="model").json["versions"][0]
    assert list(rec["not_on"]) == ["cuda"], rec["not_on"]
    assert why in rec["not_on"]["cuda"], rec["not_on"]
    return rec


@test
def a_model_one_backend_cannot_run_says_why_and_runs_on_the_others():
    """The importer's rules per device kind: a convolution padded on two
    edges only runs on the cpu backend, not the cuda one. Its record says
    which kind cannot run it and why (a cuda worker is never asked to load
    it), and it is measured and served on a cpu worker."""
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1)
        rec = served_on_cpu_only(s, "same", tm.asymmetric_pads(), "asymmetric pads")
        assert [p["device_kind"] for p in rec["profiles"]] == ["cpu"], rec["profiles"]
        x = [0.5] * (3 * 32 * 32)
        body = {"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32",
                            "data": x}]}
        a = s.request("POST", "/v2/models/same/infer", body=json.dumps(body),
                      headers={"Content-Type": "application/json"})
        assert a.status == 200 and a.json["outputs"][0]["shape"] == [1, 10], a
        # A model every backend runs has none.
        assert upload(s, tm.tiny(), {"name": "plain"}).status == 202
        rec = s.get("/models/plain", headers=auth(s)).json["versions"][0]
        assert rec["not_on"] == {}, rec["not_on"]
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def a_model_with_upsample_and_conv_transpose_is_served_over_v2():
    """nn.Upsample as torch exports it (Resize, nearest, constant scales)
    and a ConvTranspose2d: the upload imports, the record says the cuda
    backend has no ConvTranspose kernel (its Resize it runs), and a cpu
    worker serves both outputs over /v2, each within 1e-4 of numpy's."""
    import numpy as np
    model, reference = tm.upsampler()
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1)
        r = upload(s, model, {"name": "decoder", "max_batch": 2})
        assert r.status == 202, r
        eventually(lambda: s.get("/v2/models/decoder/ready").status == 200 or None, 60,
                   "the model measured on the cpu worker")
        rec = s.get("/models/decoder", headers=auth(s), schema_name="model").json["versions"][0]
        assert list(rec["not_on"]) == ["cuda"], rec["not_on"]
        assert "no ConvTranspose kernel" in rec["not_on"]["cuda"], rec["not_on"]
        x = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)
        body = {"inputs": [{"name": "input", "shape": [2, 3, 8, 8], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}
        a = s.request("POST", "/v2/models/decoder/infer", body=json.dumps(body),
                      headers={"Content-Type": "application/json"})
        assert a.status == 200, a
        got = {o["name"]: o for o in a.json["outputs"]}
        want = dict(zip(("up", "deconv"), reference(x.astype(np.float64))))
        for name, shape in (("up", [2, 4, 16, 16]), ("deconv", [2, 2, 16, 16])):
            assert got[name]["shape"] == shape, got[name]["shape"]
            diff = np.abs(np.asarray(got[name]["data"]) - want[name].ravel()).max()
            assert diff <= 1e-4, (name, diff)
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def a_torch_bicubic_upsample_is_served_over_v2_as_torch_computes_it():
    """nn.Upsample(mode="bicubic") exported by Debian's torch at opset 17
    with a dynamic batch (by scales, and to a size with align_corners): the
    upload imports, the record says every device kind runs it (the cuda
    backend's k_resize takes the cpu's transforms), and a cpu worker serves
    both outputs over /v2 within 1e-4 of torch."""
    import io
    import warnings

    import numpy as np
    import torch

    class Bicubic(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 1)
            self.up = torch.nn.Upsample(scale_factor=2, mode="bicubic")
            self.corners = torch.nn.Upsample(size=(12, 12), mode="bicubic", align_corners=True)

        def forward(self, x):
            y = self.conv(x)
            return self.up(y), self.corners(y)

    torch.manual_seed(5)
    net = Bicubic().eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the exporter's own shape-inference notes
        warnings.simplefilter("ignore")
        torch.onnx.export(net, torch.zeros(1, 3, 8, 8), buf, opset_version=17,
                          input_names=["input"], output_names=["up", "corners"],
                          dynamic_axes={k: {0: "N"} for k in ("input", "up", "corners")})
    x = np.random.default_rng(4).standard_normal((2, 3, 8, 8)).astype(np.float32)
    with torch.no_grad():
        want = dict(zip(("up", "corners"), (t.numpy() for t in net(torch.from_numpy(x)))))
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1)
        r = upload(s, buf.getvalue(), {"name": "bicubic", "max_batch": 2})
        assert r.status == 202, r
        eventually(lambda: s.get("/v2/models/bicubic/ready").status == 200 or None, 60,
                   "the model measured on the cpu worker")
        rec = s.get("/models/bicubic", headers=auth(s), schema_name="model").json["versions"][0]
        assert rec["not_on"] == {}, rec["not_on"]
        body = {"inputs": [{"name": "input", "shape": [2, 3, 8, 8], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}
        a = s.request("POST", "/v2/models/bicubic/infer", body=json.dumps(body),
                      headers={"Content-Type": "application/json"})
        assert a.status == 200, a
        got = {o["name"]: o for o in a.json["outputs"]}
        for name, shape in (("up", [2, 4, 16, 16]), ("corners", [2, 4, 12, 12])):
            assert got[name]["shape"] == shape, got[name]["shape"]
            diff = np.abs(np.asarray(got[name]["data"]) - want[name].ravel()).max()
            assert diff <= 1e-4, (name, diff)
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def emulated_models_carry_their_profile():
    s = Squishd(workers="none")
    try:
        cfg = {"name": "resnet50", "profile": {"alpha_ms": 1.053, "beta_ms": 5.072},
               "max_batch": 32, "memory_mb": 300, "default_slo_ms": 25}
        r = s.request("POST", "/models", body=json.dumps(cfg),
                      headers=dict(auth(s), **{"Content-Type": "application/json"}),
                      schema_name="model_record")
        assert r.status == 201 and r.json["format"] == "emulated", r
        prof = r.json["profiles"][0]
        assert prof["device_kind"] == "emu" and prof["batch"] == list(range(1, 33)), prof
        assert abs(prof["latency_ms"][15] - (1.053 * 16 + 5.072)) < 1e-9
        # An emulated model is measured at once, but without an emu worker
        # nothing can serve it: its readiness says so (and so does the
        # server's, once a worker of another kind is up, see test_skeleton).
        for path in ("/v2/models/resnet50/ready", "/v2/models/resnet50/versions/1/ready"):
            r = s.get(path, schema_name="kserve_model_ready")
            assert r.status == 400 and r.json["ready"] is False, r
            assert r.json["error"] == "no worker that can run the model is up", r
        table = {"name": "A", "profile": {"batch": [4, 8, 16], "latency_ms": [50, 75, 100]}}
        r = s.request("POST", "/models", body=json.dumps(table),
                      headers=dict(auth(s), **{"Content-Type": "application/json"}),
                      schema_name="model_record")
        assert r.status == 201 and r.json["max_batch"] == 16, r
        bad = {"name": "B", "profile": {"batch": [4, 8], "latency_ms": [50]}}
        r = s.request("POST", "/models", body=json.dumps(bad),
                      headers=dict(auth(s), **{"Content-Type": "application/json"}))
        assert r.status == 400 and "profile" in r.json["error"], r
        r = s.request("POST", "/models", body=json.dumps({"name": "C"}),
                      headers=dict(auth(s), **{"Content-Type": "application/json"}))
        assert r.status == 400 and "profile" in r.json["error"], r
        assert sorted(names(s)) == ["A", "resnet50"]
    finally:
        s.stop()
        s.cleanup()


@test
def shared_prefixes_are_detected_automatically_and_shown():
    s = Squishd(workers="none")
    try:
        assert upload(s, tm.variant(5), {"name": "base"}).status == 202
        # Same backbone, renamed tensors, another head: a fine-tuned variant.
        r = upload(s, tm.variant(9, names="b"), {"name": "ft"})
        assert r.status == 202, r
        g = r.json["prefix_group"]
        assert g is not None, r.json
        members = {(m["name"], m["cut_tensor"]) for m in g["members"]}
        assert ("base", "a_flat") in members and ("ft", "b_flat") in members, g
        # An unrelated model (other backbone weights) shares nothing.
        r = upload(s, tm.tiny(3), {"name": "other"})
        assert r.status == 202 and r.json["prefix_group"] is None, r.json
        r = s.get("/models/base", headers=auth(s), schema_name="model")
        assert r.json["versions"][0]["prefix_group"]["id"] == g["id"]
        # Deleting one of two members dissolves the group.
        assert s.request("DELETE", "/models/ft", headers=auth(s)).status == 200
        r = s.get("/models/base", headers=auth(s), schema_name="model")
        assert r.json["versions"][0]["prefix_group"] is None, r.json
    finally:
        s.stop()
        s.cleanup()


@test
def a_new_version_never_takes_traffic_from_a_ready_one():
    """Requests without a version go to the newest ready version: while a
    new one profiles, and after it failed, the old one answers every
    request; once a newer one is ready, it takes over. Triton's repository
    index and model config show each version as it is."""
    v1, v2, v3 = tm.tiny(1), tm.tiny(2), tm.tiny(3)
    bad = hashlib.sha256(v2).hexdigest()
    s = Squishd(workers="cpu:1", env={"SQUISH_WORKER_FAULT": "refuse:%s" % bad[:16]})
    try:
        s.wait_ready(workers=1, timeout=20)

        def state(v):
            r = s.get("/models/roll", headers=auth(s), schema_name="model")
            return {x["version"]: x for x in r.json["versions"]}.get(v, {}).get("status")

        def infer():
            r = s.request("POST", "/v1/models/roll/infer", body=PHOTO_BYTES,
                          headers={"X-SLO-Ms": "5000", "Content-Type": "image/jpeg"})
            return r.status, (r.json or {}).get("version")

        before = time.time()
        r = upload(s, v1, {"name": "roll"})
        assert r.status == 202, r
        # Wall-clock times to the ms, not in 7 significant digits (which
        # were 1.795424e9, up to 100 s off).
        assert abs(r.json["created_at"] - before) < 5, r.json["created_at"]
        assert "e+09" not in r.raw.decode(), r.raw
        eventually(lambda: state(1) == "ready", 60, "version 1 ready")
        # ?pretty indents any JSON answer for a reader.
        r = s.get("/models/roll?pretty", headers=auth(s))
        assert r.status == 200 and r.raw.decode().startswith("{\n  "), r.raw[:40]
        assert s.get("/models/roll", headers=auth(s)).raw.decode().startswith('{"'), "compact"
        answers, stop = [], threading.Event()

        def traffic():
            while not stop.is_set():
                answers.append(infer())
                time.sleep(0.01)

        t = threading.Thread(target=traffic)
        t.start()
        try:
            time.sleep(0.3)
            r = upload(s, v2, {"name": "roll", "version": 2})
            assert r.status == 202, r
            eventually(lambda: state(2) == "failed", 60, "version 2 refused by the worker")
            time.sleep(0.3)
        finally:
            stop.set()
            t.join()
        assert len(answers) > 10, answers
        assert all(a == (200, 1) for a in answers), [a for a in answers if a != (200, 1)][:5]
        # The model's readiness and metadata follow the version that serves.
        r = s.get("/v2/models/roll/ready")
        assert r.status == 200 and r.json["ready"] is True, r
        assert s.get("/v2/models/roll/versions/2/ready").status == 400
        # A newer version, once ready, takes the requests without a version.
        assert upload(s, v3, {"name": "roll", "version": 3}).status == 202
        eventually(lambda: state(3) == "ready", 60, "version 3 ready")
        assert infer() == (200, 3)
        # Triton's repository index and model configuration.
        r = s.request("POST", "/v2/repository/index", body=b"", schema_name="repository_index")
        assert r.status == 200, r
        assert [(x["name"], x["version"], x["state"]) for x in r.json] == [
            ("roll", "1", "READY"), ("roll", "2", "UNAVAILABLE"), ("roll", "3", "READY")], r.json
        assert "refus" in r.json[1]["reason"], r.json[1]
        r = s.request("POST", "/v2/repository/index", body=b'{"ready": true}',
                      schema_name="repository_index")
        assert [x["version"] for x in r.json] == ["1", "3"], r.json
        assert s.request("POST", "/v2/repository/index", body=b"[1]").status == 400
        r = s.get("/v2/models/roll/config", schema_name="model_config")
        assert r.status == 200 and r.json["version"] == 3, r
        assert r.json["input"][0]["dims"] == [3, 32, 32] and r.json["max_batch_size"] >= 1, r.json
        assert r.json["output"][0]["dims"] == [10] and r.json["profiled_on"] == ["cpu"], r.json
        assert r.json["preprocessing"]["channel_order"] == "rgb", r.json
        r = s.get("/v2/models/roll/versions/2/config", schema_name="model_config")
        assert r.status == 200 and r.json["status"] == "failed" and r.json["error"], r.json
        assert s.get("/v2/models/roll/versions/9/config").status == 404
        assert s.get("/v2/models/nope/config").status == 404
        # A version policy (Triton's): the newest upload's applies. Latest 1
        # ready: version 4 once ready, and nothing else, is served.
        bad = upload(s, tm.tiny(4), {"name": "roll", "version": 4,
                                     "version_policy": {"latest": {"num_versions": 0}}})
        assert bad.status == 400 and "config.version_policy.latest.num_versions" in bad.json[
            "error"], bad
        r = upload(s, tm.tiny(4), {"name": "roll", "version": 4,
                                   "version_policy": {"latest": {"num_versions": 1}}})
        assert r.status == 202 and r.json["version_policy"] == {"latest": {"num_versions": 1}}, r
        assert infer() in ((200, 3), (200, 4)), "3 until 4 is ready"
        eventually(lambda: state(4) == "ready", 60, "version 4 ready")
        assert infer() == (200, 4)
        r = s.request("POST", "/v1/models/roll/versions/3/infer", body=PHOTO_BYTES,
                      headers={"X-SLO-Ms": "5000"})
        assert r.status == 404 and "not served: its version_policy serves the latest 1" in r.json[
            "error"], r
        assert s.get("/v2/models/roll/versions/3/ready").status == 400
        # READY is what the dispatcher last published (each 50 ms tick): the
        # worker holding version 4 shows there a tick after it answered.
        eventually(lambda: [x["version"] for x in s.request(
            "POST", "/v2/repository/index", body=b'{"ready": true}',
            schema_name="repository_index").json] == ["4"], 5, "the index: only 4 ready")
        # Specific versions, given by a newer upload, replace it.
        r = upload(s, tm.tiny(5), {"name": "roll", "version": 5,
                                   "version_policy": {"specific": {"versions": [1, 5]}}})
        assert r.status == 202, r
        # Readiness without a version follows the same choice as requests:
        # version 1 while 5 measures (4 is out of the policy), then 5.
        # Version 1 left the plan while 4 alone was served, so it may need a
        # load first: not ready "being loaded", never "being profiled" (5).
        r = s.get("/v2/models/roll/ready")
        assert r.status == 200 or "being loaded" in r.json["error"], r
        eventually(lambda: s.get("/v2/models/roll/ready").status == 200 or None, 60,
                   "version 1 ready again")
        eventually(lambda: state(5) == "ready", 60, "version 5 ready")
        assert infer() == (200, 5)
        r = s.request("POST", "/v1/models/roll/versions/1/infer", body=PHOTO_BYTES,
                      headers={"X-SLO-Ms": "5000"})
        assert r.status == 200 and r.json["version"] == 1, r
        r = s.request("POST", "/v1/models/roll/versions/4/infer", body=PHOTO_BYTES,
                      headers={"X-SLO-Ms": "5000"})
        assert r.status == 404 and "versions 1, 5" in r.json["error"], r
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def an_upload_being_measured_says_where_to_follow_it():
    s = Squishd(workers="none")
    try:
        r = upload(s, tm.tiny(), {"name": "wait"})
        assert r.status == 202 and r.headers["location"] == "/models/wait", r.headers
        r = s.get("/models/wait", headers=auth(s), schema_name="model")
        v = r.json["versions"][0]
        assert v["status"] == "profiling", v
        assert v["profiling"] == {"state": "waiting for a cpu or cuda worker"}, v
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def models_survive_a_restart():
    s = Squishd(workers="none")
    try:
        assert upload(s, tm.tiny(), {"name": "keep"}).status == 202
        assert s.stop() == 0
        s2 = Squishd(workers="none", tmp=s.tmp)
        try:
            assert names(s2) == {"keep": [1]}
            r = s2.get("/models/keep", headers=auth(s2), schema_name="model")
            assert r.status == 200
        finally:
            s2.stop()
            s2.cleanup()
    finally:
        s.cleanup()


@test
def a_reloaded_cpu_model_makes_the_batch_sizes_its_profile_reaches():
    """A cpu worker holds a batch size's kernels (JIT code, megabytes a
    size) when the model's profile on its kind reaches it: a first load,
    to be profiled, makes every size, and the profile gives back those past
    its reach; a load after the profile (here: the worker killed and
    restarted) makes the sizes the profile reaches, and no other."""
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=30)
        assert upload(s, tm.tiny(), {"name": "lazy", "max_batch": 16}).status == 202
        eventually(lambda: s.get("/v2/models/lazy/ready").status == 200 or None, 120,
                   "lazy measured and ready", step=0.2)
        rec = s.get("/models/lazy", headers=auth(s)).json["versions"][0]
        reach = max(max(p["batch"]) for p in rec["profiles"] if p["device_kind"] == "cpu")

        def loads():
            return re.findall(r"model loaded key=\d+ sha256=\S+ backend=cpu max_batch=\d+ "
                              r"planned_batch=(\d+) ready_batch=(\d+) sizes_ready=(-?\d+)",
                              s.read_log())

        first = loads()
        planned = int(first[0][0])
        assert len(first) == 1 and first[0][1] == "0" and int(first[0][2]) >= planned, first
        # the small batches' plan may hold the first size of the large ones' too
        kept = re.findall(r"profile done key=\d+ reach=(\d+) sizes_ready=(\d+)", s.read_log())
        assert len(kept) == 1 and int(kept[0][0]) == reach, (kept, reach)
        assert int(kept[0][1]) - min(reach, planned) in (0, 1), (kept, planned)
        pid = list(s.worker_pids().values())[0]
        os.kill(pid, signal.SIGKILL)
        eventually(lambda: len(loads()) == 2 or None, 120, "the model loaded again", step=0.2)
        again = loads()[1]
        assert again[1] == str(min(reach, 16)), (again, reach)
        assert int(again[2]) - min(reach, planned) in (0, 1), (again, reach, planned)
        eventually(lambda: s.get("/v2/models/lazy/ready").status == 200 or None, 60,
                   "lazy ready again", step=0.2)
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 32, 32],
                                       "datatype": "FP32", "data": [0.5] * 3072}]})
        r = s.request("POST", "/v2/models/lazy/infer", body=body,
                      headers={"Content-Type": "application/json"})
        assert r.status == 200, r
    finally:
        s.stop()
        s.cleanup()


@test
def a_model_deleted_while_it_loads_does_not_hold_up_the_next():
    """The only worker is busy loading a large model to measure it when the
    model is deleted: the worker is released at once, and a model uploaded
    next is measured and served."""
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1)
        for round_ in range(2):
            big = "big%d" % round_
            assert upload(s, tm.large(24), {"name": big}).status == 202
            r = s.request("DELETE", "/models/" + big, headers=auth(s))
            assert r.status in (200, 204), r
            small = "small%d" % round_
            assert upload(s, tm.tiny(round_ + 1), {"name": small}).status == 202

            def ready():
                v = s.get("/models/" + small, headers=auth(s)).json["versions"][0]
                return v["status"] == "ready" or None

            eventually(ready, 30, small + " measured")
            r = s.request("POST", "/v2/models/%s/infer" % small,
                          body=b"\0" * (3 * 32 * 32 * 4),
                          headers={"Inference-Header-Content-Length": "0"})
            assert r.status == 200, r
        assert "big0" not in names(s) and "big1" not in names(s)
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def sigkill_during_a_large_upload_leaves_the_db_intact_and_the_model_absent():
    s = Squishd(workers="none")
    try:
        assert upload(s, tm.tiny(), {"name": "before"}).status == 202
        big = tm.large(48)
        body, ctype = tm.multipart([("model", "big.onnx", None, big),
                                    ("config", None, None, b'{"name": "big"}')])
        head = ("POST /models HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nAuthorization: Bearer %s\r\n"
                "Content-Length: %d\r\n\r\n" % (ctype, s.token, len(body))).encode()
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.sendall(head + body[: len(body) // 2])
        time.sleep(0.2)
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait(10)
        sock.close()
        db = sqlite3.connect(s.db)
        assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        db.close()
        s2 = Squishd(workers="none", tmp=s.tmp)
        try:
            assert names(s2) == {"before": [1]}
            # Now the whole upload, and a kill while squishd is storing it.
            t = threading.Thread(target=lambda: _quiet(upload, s2, big, {"name": "big"}))
            t.start()
            time.sleep(0.5)
            s2.proc.send_signal(signal.SIGKILL)
            s2.proc.wait(10)
            t.join(30)
            s3 = Squishd(workers="none", tmp=s.tmp)
            try:
                listed = names(s3)
                assert "before" in listed
                if "big" in listed:  # the upload won the race: it must be whole
                    r = s3.get("/models/big", headers=auth(s3), schema_name="model")
                    assert r.json["versions"][0]["sha256"] == hashlib.sha256(big).hexdigest()
                db = sqlite3.connect(s.db)
                assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
                db.close()
            finally:
                s3.stop()
                s3.cleanup()
        finally:
            s2.cleanup()
    finally:
        s.cleanup()


def _quiet(fn, *a):
    try:
        fn(*a)
    except Exception:  # noqa: BLE001 - the server is being killed
        pass


@test
def bodies_over_the_limit_are_413():
    s = Squishd(workers="none", extra=["--max-body-mb", "1"])
    try:
        body, ctype = tm.multipart([("model", "m.onnx", None, b"x" * (2 << 20)),
                                    ("config", None, None, b'{"name": "x"}')])
        try:
            r = s.request("POST", "/models", body=body, headers=dict(auth(s), **{"Content-Type": ctype}))
            assert r.status == 413, r
        except (ConnectionResetError, BrokenPipeError):
            pass  # h2o may close before reading the whole body: still refused
        assert names(s) == {}
        # h2o refuses by the Content-Length, before any body: squish's JSON
        # error naming the limit and the flag (h2o's own was plain text that
        # named neither), on an upload as on an inference.
        for path in ("/models", "/v2/models/x/infer"):
            with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
                c.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           "Content-Length: %d\r\n\r\n" % (path, 3 << 20)).encode())
                raw = b""
                while b"}" not in raw:
                    chunk = c.recv(4096)
                    if not chunk:
                        break
                    raw += chunk
            head, _, body = raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 413"), raw
            assert b"content-type: application/json" in head.lower(), raw
            err = json.loads(body)
            assert err["code"] == "too_large", err
            assert "--max-body-mb 1," in err["error"], err
    finally:
        s.stop()
        s.cleanup()




@test
def the_upload_config_schema_is_what_squishd_takes():
    """schemas/model_upload_config.schema.json lists every field squishd
    takes, no more: a field of the schema is never "unknown", one outside
    it always is (the refusal lists the same fields), and configs the
    schema accepts are stored."""
    sch = schema("model_upload_config")
    fields = set(sch["properties"])
    s = Squishd(workers="none")
    try:
        def post(cfg):
            return s.request("POST", "/models", body=json.dumps(cfg),
                             headers=dict(auth(s), **{"Content-Type": "application/json"}))

        for f in sorted(fields - {"name"}):
            r = post({"name": "x", f: "not this"})
            assert r.status == 400 and "unknown field" not in r.json["error"], (f, r)
        r = post({"name": "x", "slo_ms": 100})
        assert r.status == 400 and "did you mean default_slo_ms" in r.json["error"], r
        listed = r.json["error"].split("the fields are ")[1]
        assert {x.strip() for x in listed.split(",")} == fields, (listed, fields)
        good = [
            {"name": "a", "profile": {"alpha_ms": 1, "beta_ms": 2}, "default_slo_ms": 50,
             "max_batch": 8, "input": {"shape": [3, 16, 16]}, "num_classes": 2,
             "labels": ["cat", "dog"], "memory_mb": 10, "version": 2,
             "version_policy": {"latest": {"num_versions": 1}},
             "preprocess": {"mean": [1, 2, 3], "std": [4, 5, 6], "resize": "nearest",
                            "channel_order": "BGR"}},
            {"name": "d", "profile": {"batch": [1, 2], "latency_ms": [3, 4],
                                      "latency_std_ms": [0.1, 0.1]},
             "detections": {"mean": 2, "slots": 16}, "default_slo_ms": None},
        ]
        for cfg in good:
            validate(cfg, "model_upload_config")
            r = post(cfg)
            assert r.status == 201, r
    finally:
        s.stop()



@test
def deleting_a_model_a_pipeline_uses_says_so_and_force_goes_ahead():
    """A model a stored pipeline uses is not deleted (every version, or the
    version its stage runs) without ?force=true: 409 in_use naming the
    pipeline and the ways on. Forced, the pipeline's readiness names the
    stage whose model is gone. A version no stage runs is deleted as ever."""
    s = Squishd(workers="emu:1")
    try:
        s.wait_ready(workers=1, timeout=60)

        def emulated(cfg):
            r = s.request("POST", "/models", body=json.dumps(cfg),
                          headers=dict(auth(s), **{"Content-Type": "application/json"}))
            assert r.status == 201, r

        inc = {"name": "inc", "profile": {"alpha_ms": 0.5, "beta_ms": 2}, "max_batch": 16,
               "input": {"shape": [3, 16, 16]}, "num_classes": 5}
        emulated(inc)
        emulated({"name": "ssd", "profile": {"alpha_ms": 1, "beta_ms": 2}, "max_batch": 8,
                  "input": {"shape": [3, 32, 32]}, "detections": {"mean": 2, "slots": 16}})
        crops = {"stage": "det", "boxes": "boxes", "scores": "scores", "score_threshold": 0.5}
        for name in ("p1", "p2"):
            spec = {"name": name, "slo_ms": 2000,
                    "stages": [{"id": "det", "model": "ssd"},
                               {"id": "cls", "model": "inc", "crops_of": crops}]}
            r = s.request("POST", "/pipelines", body=json.dumps(spec),
                          headers=dict(auth(s), **{"Content-Type": "application/json"}))
            assert r.status == 201, r
        for path in ("/models/inc", "/models/inc/versions/1"):
            r = s.request("DELETE", path, headers=auth(s))
            assert r.status == 409 and r.json["code"] == "in_use", (path, r)
            validate(r.json, "error")
            assert "pipelines p1, p2" in r.json["error"], r.json
            assert "?force=true" in r.json["error"] and "DELETE /pipelines" in r.json["error"], r
        assert names(s)["inc"] == [1]
        # A second version: the stages (without a version) run it now, so
        # version 1 goes as ever, and version 2 is the one in use.
        emulated(dict(inc, version=2))
        r = eventually(lambda: (lambda r: r if r.status != 409 else None)(
            s.request("DELETE", "/models/inc/versions/1", headers=auth(s))), 5, "v1 deleted")
        assert r.status == 200, r
        r = s.request("DELETE", "/models/inc/versions/2", headers=auth(s))
        assert r.status == 409 and "model inc version 2" in r.json["error"], r
        # Forced: deleted, and the pipelines say which stage's model is gone.
        r = s.request("DELETE", "/models/ssd?force=true", headers=auth(s),
                      schema_name="models_delete")
        assert r.status == 200 and r.json["deleted_versions"] == 1, r
        r = s.get("/v2/models/p1/ready", schema_name="kserve_model_ready")
        assert r.status == 400 and r.json["ready"] is False, r
        assert r.json["error"].startswith("stage det: model ssd is gone (deleted)"), r.json
        r = s.request("POST", "/v1/pipelines/p1/infer", body=PHOTO_BYTES,
                      headers={"Content-Type": "image/jpeg"})
        assert r.status == 404 and "stage det" in r.json["error"], r
        # Once the pipelines are gone, so is the refusal.
        for name in ("p1", "p2"):
            assert s.request("DELETE", "/pipelines/" + name, headers=auth(s)).status == 200
        assert s.request("DELETE", "/models/inc", headers=auth(s)).status == 200
    finally:
        s.stop()


@test
def a_cpu_worker_plans_16_and_serves_a_larger_batch_in_pieces():
    """A model uploaded with max_batch 40 is planned on a cpu worker for
    batches up to 16 (each size its own primitives at load); the worker
    still takes 40, a larger batch run in pieces of 16
    (tests/worker/test_serve_state.c), and 24 rows in one request answer
    what each row alone does."""
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1)
        assert upload(s, tm.tiny(), {"name": "wide", "max_batch": 40}).status == 202
        eventually(lambda: s.get("/v2/models/wide/ready").status == 200 or None, 60,
                   "the model measured on the cpu worker")
        log = s.read_log()
        assert "max_batch=40 planned_batch=16" in log, log[-3000:]
        n, item = 24, 3 * 32 * 32
        data = [((i * 7919) % 1000) / 1000.0 for i in range(n * item)]
        def infer(rows, x):
            body = {"inputs": [{"name": "input", "shape": [rows, 3, 32, 32], "datatype": "FP32",
                                "data": x}]}
            r = s.request("POST", "/v2/models/wide/infer", body=json.dumps(body),
                          headers={"Content-Type": "application/json", "X-SLO-Ms": "5000"})
            assert r.status == 200, r
            return r.json["outputs"][0]["data"]
        together = infer(n, data)
        for i in range(n):
            alone = infer(1, data[i * item:(i + 1) * item])
            got = together[i * 10:(i + 1) * 10]
            assert max(abs(a - b) for a, b in zip(alone, got)) <= 1e-4 * max(map(abs, alone)), \
                (i, alone, got)
        assert s.stop() == 0
    finally:
        s.cleanup()


if __name__ == "__main__":
    run()
