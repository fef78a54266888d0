"""Input sizes pinned at upload: a model exported by torch with a dynamic
height and width (dynamic_axes on H and W, as detectors, OCR and
segmentation models are) is refused without a pin, with what to send; with
the upload config's "input": {"shape": [C, H, W]} it is served at that size
everywhere (the importer, the cpu worker's plan, /v1's resize, /v2's shape
check, Triton's metadata and config) and answers as the same net exported
at that size does, and as torch does; a restart keeps the pin."""

import io
import json
import os
import tempfile

import numpy as np
import torch
from PIL import Image

import tiny_models as tm
from harness import Squishd, eventually, run, test

C, H, W = 3, 48, 64


class _Net(torch.nn.Module):
    """A small conv net whose pooling computes with the input's height and
    width (Shape -> Reshape in the export): only a static size folds it."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.c2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.c2(torch.relu(self.c1(x))))
        x = x.reshape(x.shape[0], x.shape[1], -1).mean(-1)
        return self.fc(x)


def _export(dynamic_hw):
    """The net's ONNX (opset 13), the batch dynamic and, if dynamic_hw, the
    height and width too; else fixed at H x W. The same weights each time."""
    torch.manual_seed(20)
    net = _Net().eval()
    axes = {0: "batch", 2: "height", 3: "width"} if dynamic_hw else {0: "batch"}
    out = io.BytesIO()
    torch.onnx.export(net, torch.zeros(1, C, H, W), out, opset_version=13,
                      input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": axes, "logits": {0: "batch"}})
    return net, out.getvalue()


NET, DYNAMIC = _export(True)
_, STATIC = _export(False)


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def upload(s, name, onnx_bytes, **cfg):
    body, ctype = tm.multipart([("model", "m.onnx", None, onnx_bytes),
                                ("config", None, None,
                                 json.dumps(dict(cfg, name=name, max_batch=4)).encode())])
    return s.request("POST", "/models", body=body, headers=dict(auth(s), **{"Content-Type": ctype}))


def jpeg(w=200, h=120):
    rng = np.random.default_rng(3)
    img = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), "RGB")
    out = io.BytesIO()
    img.save(out, "JPEG", quality=90)
    return out.getvalue()


def infer_v2(s, name, x):
    req = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                       "data": x.flatten().tolist()}], "parameters": {"slo_ms": 5000}}
    return s.request("POST", "/v2/models/%s/infer" % name, body=json.dumps(req),
                     headers={"Content-Type": "application/json"})


def wait_ready(s, name):
    def status():
        st = s.get("/models/" + name, headers=auth(s)).json["versions"][0]["status"]
        return st if st != "profiling" else None
    assert eventually(status, 120, name + " measured") == "ready"


@test
def a_dynamic_height_and_width_without_a_pin_is_400_saying_what_to_send():
    s = Squishd(workers="none")
    try:
        r = upload(s, "dyn", DYNAMIC)
        assert r.status == 400 and r.json["code"] == "bad_config", r
        err = r.json["error"]
        # The key, the file's shape and an example of this model's rank.
        assert "config.input.shape: required" in err, err
        assert "[batch, 3, height, width]" in err, err
        assert '"input": {"shape": [3, 224, 224]}' in err, err
        assert s.get("/models/dyn", headers=auth(s)).status == 404
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def a_pin_that_contradicts_a_static_size_is_400_naming_the_dimension():
    s = Squishd(workers="none")
    try:
        r = upload(s, "dyn", DYNAMIC, input={"shape": [4, H, W]})
        assert r.status == 400 and r.json["code"] == "bad_config", r
        assert "config.input.shape[0]: 4, but input 'input' has 3 there" in r.json["error"], r
        r = upload(s, "fixed", STATIC, input={"shape": [C, H + 1, W]})
        assert r.status == 400 and "config.input.shape[1]: %d, but input 'input' has %d there" % (
            H + 1, H) in r.json["error"], r
        r = upload(s, "dyn", DYNAMIC, input={"shape": [H, W]})
        assert r.status == 400 and "2 sizes" in r.json["error"], r
        r = upload(s, "dyn", DYNAMIC, input={"shape": [C, 0, W]})
        assert r.status == 400 and "config.input.shape[1]" in r.json["error"], r
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def a_pinned_model_is_served_at_its_pin_like_the_static_export_and_after_a_restart():
    tmp = tempfile.mkdtemp(prefix="squish-it-")
    x = np.random.default_rng(5).standard_normal((2, C, H, W)).astype(np.float32)
    with torch.no_grad():
        want = NET(torch.from_numpy(x)).numpy()
    s = Squishd(workers="cpu:1", tmp=tmp)
    try:
        s.wait_ready(workers=1, timeout=60)
        r = upload(s, "pinned", DYNAMIC, input={"shape": [C, H, W]})
        assert r.status == 202, r
        r = upload(s, "fixed", STATIC)
        assert r.status == 202, r
        wait_ready(s, "pinned")
        wait_ready(s, "fixed")
        rec = s.get("/models/pinned", headers=auth(s), schema_name="model").json["versions"][0]
        assert rec["input"]["shape"] == [-1, C, H, W], rec["input"]
        # Triton's metadata and config report the pinned dims.
        meta = s.get("/v2/models/pinned").json
        assert meta["inputs"][0]["shape"] == [-1, C, H, W], meta
        conf = s.get("/v2/models/pinned/config", schema_name="model_config").json
        assert conf["input"][0]["dims"] == [C, H, W], conf
        # /v2 at the pinned size: torch's answer, and the static export's.
        r = infer_v2(s, "pinned", x)
        assert r.status == 200, r
        got = np.array(r.json["outputs"][0]["data"], dtype=np.float32).reshape(2, 10)
        assert np.allclose(got, want, atol=1e-4), (got, want)
        r = infer_v2(s, "fixed", x)
        assert r.status == 200, r
        assert np.allclose(np.array(r.json["outputs"][0]["data"]).reshape(2, 10), got, atol=1e-5)
        # Another size is refused, naming the one served.
        r = infer_v2(s, "pinned", np.zeros((1, C, W, H), np.float32))
        assert r.status == 400, r
        assert "expected [N,3,%d,%d]" % (H, W) in r.json["error"], r
        # /v1 resizes a JPEG to the pinned H x W: the static export at that
        # size scores it the same.
        img = jpeg()
        v1 = {}
        for name in ("pinned", "fixed"):
            r = s.request("POST", "/v1/models/%s/infer?top_k=10" % name, body=img,
                          headers={"X-SLO-Ms": "5000"}, schema_name="infer_v1_response")
            assert r.status == 200, r
            v1[name] = {p["label"]: p["score"] for p in r.json["predictions"][0]}
        assert v1["pinned"].keys() == v1["fixed"].keys()
        for k in v1["pinned"]:
            assert abs(v1["pinned"][k] - v1["fixed"][k]) < 1e-5, (k, v1)
        assert s.stop() == 0
    finally:
        s.log.close() if not s.log.closed else None

    # A restart serves it pinned: the worker imports the file with the
    # stored pin (else the symbolic sizes would refuse its load).
    s = Squishd(workers="cpu:1", tmp=tmp)
    try:
        s.wait_ready(workers=1, timeout=60)
        assert s.get("/v2/models/pinned").json["inputs"][0]["shape"] == [-1, C, H, W]
        r = eventually(lambda: (lambda r: r if r.status == 200 else None)(infer_v2(s, "pinned", x)),
                       60, "an answer after the restart", step=0.5)
        got = np.array(r.json["outputs"][0]["data"], dtype=np.float32).reshape(2, 10)
        assert np.allclose(got, want, atol=1e-4), (got, want)
        assert s.stop() == 0
    finally:
        s.cleanup()


if __name__ == "__main__":
    run()
