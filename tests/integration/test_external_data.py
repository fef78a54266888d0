"""ONNX external data: a model saved with save_as_external_data (its weights
in a file beside the .onnx, as any model past protobuf's 2 GB must be) is
uploaded as its .onnx plus that file, each data part named by the location
the .onnx gives it; it answers as the same model saved in one file does,
on a cpu worker and after a restart. A missing data file is a 400 naming
it, and a part whose name leaves the model's directory is refused."""

import json
import os
import tempfile

import numpy as np
import onnx

import tiny_models as tm
from harness import Squishd, eventually, run, test

SINGLE = tm.tiny(seed=4)


def _external(single, location="tiny.onnx.data"):
    """single re-saved as onnx.save_model(..., save_as_external_data=True)
    writes it: (the .onnx's bytes, {location: the data file's bytes})."""
    d = tempfile.mkdtemp(prefix="squish-ext-")
    onnx.save_model(onnx.load_from_string(single), os.path.join(d, "model.onnx"),
                    save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)
    with open(os.path.join(d, "model.onnx"), "rb") as f:
        model = f.read()
    with open(os.path.join(d, location), "rb") as f:
        data = f.read()
    return model, {location: data}


MODEL, DATA = _external(SINGLE)


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def upload(s, name, model, data, **cfg):
    parts = [("model", "model.onnx", None, model),
             ("config", None, None, json.dumps(dict(cfg, name=name, max_batch=2)).encode())]
    parts += [(loc, loc, "application/octet-stream", b) for loc, b in data.items()]
    body, ctype = tm.multipart(parts)
    return s.request("POST", "/models", body=body,
                     headers=dict(auth(s), **{"Content-Type": ctype}))


def infer_v2(s, name, x):
    req = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                       "data": x.flatten().tolist()}], "parameters": {"slo_ms": 5000}}
    return s.request("POST", "/v2/models/%s/infer" % name, body=json.dumps(req),
                     headers={"Content-Type": "application/json"})


def answer(s, name, x):
    r = eventually(lambda: (lambda r: r if r.status == 200 else None)(infer_v2(s, name, x)),
                   90, name + " answers", step=0.3)
    return np.array(r.json["outputs"][0]["data"], dtype=np.float32).reshape(x.shape[0], -1)


@test
def data_parts_are_checked_a_missing_file_named_a_traversing_name_refused():
    assert len(MODEL) < 2000 and len(DATA["tiny.onnx.data"]) > 5000, "the weights left the .onnx"
    s = Squishd(workers="none")
    try:
        r = upload(s, "alone", MODEL, {})
        assert r.status == 400 and r.json["code"] == "bad_model", r
        assert "'tiny.onnx.data' was not uploaded" in r.json["error"], r
        r = upload(s, "elsewhere", MODEL, {"../tiny.onnx.data": DATA["tiny.onnx.data"]})
        assert r.status == 400 and r.json["code"] == "bad_multipart", r
        assert "'../tiny.onnx.data'" in r.json["error"], r
        # The same data file twice; then the parts in another order serve.
        body, ctype = tm.multipart(
            [("tiny.onnx.data", None, None, DATA["tiny.onnx.data"]),
             ("tiny.onnx.data", None, None, DATA["tiny.onnx.data"]),
             ("model", None, None, MODEL), ("config", None, None, b'{"name": "twice"}')])
        r = s.request("POST", "/models", body=body,
                      headers=dict(auth(s), **{"Content-Type": ctype}))
        assert r.status == 400 and "'tiny.onnx.data' given twice" in r.json["error"], r
        body, ctype = tm.multipart(
            [("tiny.onnx.data", None, None, DATA["tiny.onnx.data"]),
             ("config", None, None, b'{"name": "reordered"}'), ("model", None, None, MODEL)])
        r = s.request("POST", "/models", body=body,
                      headers=dict(auth(s), **{"Content-Type": ctype}))
        assert r.status == 202, r
        # A data file shorter than its tensors say.
        r = upload(s, "short", MODEL, {"tiny.onnx.data": DATA["tiny.onnx.data"][:-4]})
        assert r.status == 400 and "tiny.onnx.data" in r.json["error"], r
        for name in ("alone", "elsewhere", "short"):
            assert s.get("/models/" + name, headers=auth(s)).status == 404
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def an_external_data_model_answers_as_its_single_file_save_and_after_a_restart():
    tmp = tempfile.mkdtemp(prefix="squish-it-")
    x = np.random.default_rng(9).standard_normal((2, 3, 32, 32)).astype(np.float32)
    s = Squishd(workers="cpu:1", tmp=tmp)
    try:
        s.wait_ready(workers=1, timeout=60)
        r = upload(s, "external", MODEL, DATA)
        assert r.status == 202, r
        r = upload(s, "single", SINGLE, {})
        assert r.status == 202, r
        want = answer(s, "single", x)
        got = answer(s, "external", x)
        assert np.array_equal(got, want), (got, want)
        assert s.stop() == 0
    finally:
        s.log.close() if not s.log.closed else None
    # The bundle is read back from the DB and sent to a new worker.
    s = Squishd(workers="cpu:1", tmp=tmp)
    try:
        s.wait_ready(workers=1, timeout=60)
        # (another plan may sum in another order: equal to float rounding)
        again = answer(s, "external", x)
        assert np.allclose(again, want, rtol=0, atol=1e-5), (again, want)
        assert s.stop() == 0
    finally:
        s.cleanup()


if __name__ == "__main__":
    run()
