"""Detectors of the common output layouts and segmenters, on a real cpu
worker: a YOLOv8-style detector (one output [N, 4 + C, A]) uploaded with a
"detector" block answers /v1 with its boxes in the image's pixels, labels
and scores after NMS per class, and feeds a pipeline whose second stage
crops by it (its classes filtered); a YOLO-style detector written in torch
(scripts/export_models.py's yolo_tiny: C2f, SPPF, nearest upsampling, a
decoupled head; within 1e-4 of torch in worker/test_detectors) does the
same, its pipeline's crops those /v1 answers; a segmenter ("segmenter": true)
answers /v1 with its classes by pixel share; a detector block or a
crops_of that does not fit the detector's outputs is a 400 that says what
to send instead."""

import io
import json
import os

import numpy as np
from PIL import Image

import tiny_models as tm
from harness import Squishd, eventually, run, test, validate

PREP = {"mean": [0, 0, 0], "std": [255, 255, 255]}
YOLO = {"layout": "yolo", "score_threshold": 0.5}


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def gray(v, size=(64, 48)):
    out = io.BytesIO()
    Image.fromarray(np.full((size[1], size[0], 3), v, np.uint8)).save(out, "JPEG", quality=95)
    return out.getvalue()


def upload(s, cfg, model_bytes, status=202):
    body, ctype = tm.multipart([("model", "m.onnx", None, model_bytes),
                                ("config", None, None, json.dumps(cfg).encode())])
    r = s.request("POST", "/models", body=body, headers=dict(auth(s), **{"Content-Type": ctype}))
    assert r.status == status, r
    if status >= 400:
        validate(r.json, "error")
    return r


def wait_ready(s, name):
    def done():
        rec = s.get("/models/" + name, headers=auth(s), schema_name="model").json["versions"][0]
        return rec if rec["status"] != "profiling" else None

    rec = eventually(done, 180, name + " profiled")
    assert rec["status"] == "ready", rec
    return rec


def v1(s, name, body):
    r = s.request("POST", "/v1/models/%s/infer" % name, body=body,
                  headers={"Content-Type": "image/jpeg", "X-SLO-Ms": "5000"},
                  schema_name="infer_v1_response")
    assert r.status == 200, r
    return r.json


def near(got, want, tol=0.6):
    return len(got) == len(want) and all(abs(a - b) <= tol for a, b in zip(got, want))


@test
def a_yolo_detector_answers_v1_with_its_boxes_and_feeds_a_pipeline():
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=60)
        upload(s, {"name": "yolo", "max_batch": 4, "preprocess": PREP, "labels": ["cat", "dog"],
                   "detector": YOLO}, tm.yolo_detector())
        upload(s, {"name": "cls_m", "max_batch": 8}, tm.tiny(3))
        rec = wait_ready(s, "yolo")
        assert rec["detector"]["layout"] == "yolo", rec
        wait_ready(s, "cls_m")
        # /v1: the dog (anchor 3; anchor 7 is its duplicate, gone) and the
        # cat, in the 64 x 48 image's pixels: the 32 x 32 input stretched.
        got = v1(s, "yolo", gray(128))
        dets = got["detections"][0]
        assert [(d["label"], d["index"]) for d in dets] == [("dog", 1), ("cat", 0)], got
        assert abs(dets[0]["score"] - 0.9) < 1e-5 and abs(dets[1]["score"] - 0.8) < 1e-5, dets
        assert near(dets[0]["box"], [16, 12, 48, 24]), dets
        assert near(dets[1]["box"], [8, 30, 24, 42]), dets
        # Two images, one list each.
        body, ctype = tm.multipart([("a", "a.jpg", "image/jpeg", gray(30)),
                                    ("b", "b.jpg", "image/jpeg", gray(200, (32, 32)))])
        r = s.request("POST", "/v1/models/yolo/infer", body=body,
                      headers={"Content-Type": ctype, "X-SLO-Ms": "5000"},
                      schema_name="infer_v1_response")
        assert r.status == 200 and len(r.json["detections"]) == 2, r
        assert near(r.json["detections"][1][0]["box"], [8, 8, 24, 16]), r.json

        # A pipeline crops the dogs only, and classifies each crop.
        crops = {"stage": "det", "layout": "yolo", "score_threshold": 0.5, "classes": [1]}
        spec = {"name": "dogs", "slo_ms": 2000,
                "stages": [{"id": "det", "model": "yolo"},
                           {"id": "cls", "model": "cls_m", "crops_of": crops, "top_k": 2}]}
        validate(spec, "pipeline_spec")
        r = s.request("POST", "/pipelines", body=json.dumps(spec),
                      headers=dict(auth(s), **{"Content-Type": "application/json"}))
        assert r.status == 201, r
        validate(r.json, "pipeline")
        r = s.request("POST", "/v1/pipelines/dogs/infer", body=gray(128),
                      headers={"Content-Type": "image/jpeg", "X-SLO-Ms": "3000"})
        assert r.status == 200, r
        validate(r.json, "pipeline_query_response")
        found = r.json["frames"][0]["det"]["cls"]
        assert len(found) == 1, found
        assert near(found[0]["box"], [16, 12, 48, 24], 1.01), found
        assert len(found[0]["predictions"]) == 2, found
        # Each crop says which class its detection is, by index and name.
        assert found[0]["class"] == 1 and found[0]["label"] == "dog", found
        # Both classes: two crops.
        crops["classes"] = [0, 1]
        spec["name"] = "pets"
        r = s.request("POST", "/pipelines", body=json.dumps(spec),
                      headers=dict(auth(s), **{"Content-Type": "application/json"}))
        assert r.status == 201, r
        r = s.request("POST", "/v1/pipelines/pets/infer", body=gray(128),
                      headers={"Content-Type": "image/jpeg", "X-SLO-Ms": "3000"})
        assert r.status == 200 and len(r.json["frames"][0]["det"]["cls"]) == 2, r
        validate(r.json, "pipeline_query_response")
        assert sorted((c["class"], c["label"]) for c in r.json["frames"][0]["det"]["cls"]) == \
            [(0, "cat"), (1, "dog")], r.json

        # A crops_of that does not fit the detector: 400 saying why.
        for bad, want in (
                (dict(crops, classes=[2]), "classes: class 2, but the detector scores 2 classes"),
                ({"stage": "det", "boxes": "output0", "scores": "output0"}, "layout \"yolo\""),
                ({"stage": "det", "layout": "yolo", "output": "boxes"},
                 "model yolo has no output \"boxes\""),
                ({"stage": "det", "layout": "retinanet"}, "\"boxes_scores\"")):
            spec["name"] = "bad"
            spec["stages"][1]["crops_of"] = bad
            r = s.request("POST", "/pipelines", body=json.dumps(spec),
                          headers=dict(auth(s), **{"Content-Type": "application/json"}))
            assert r.status == 400 and want in r.json["error"], (bad, r)
            validate(r.json, "error")
    finally:
        s.stop()


def gradient(w=96, h=64):
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 2, y * 3, (x + y) % 255], -1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(img).save(out, "JPEG", quality=95)
    return out.getvalue()


@test
def a_yolo_style_detector_exported_by_torch_feeds_a_pipeline_its_v1_boxes():
    path = os.path.join(os.environ.get("SQUISH_TEST_MODELS", ""), "yolo_tiny.onnx")
    with open(path, "rb") as f:
        model = f.read()
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=60)
        det = {"layout": "yolo", "score_threshold": 0.5}
        upload(s, {"name": "yolo", "max_batch": 4, "preprocess": PREP, "labels": ["a", "b", "c"],
                   "detector": det}, model)
        upload(s, {"name": "cls_m", "max_batch": 8}, tm.tiny(3))
        assert wait_ready(s, "yolo")["detector"]["layout"] == "yolo"
        wait_ready(s, "cls_m")
        photo = gradient()
        dets = v1(s, "yolo", photo)["detections"][0]
        # seeded weights and a fixed image: the same eight every run
        assert len(dets) >= 3, dets
        for d in dets:
            assert d["score"] >= 0.5 and d["label"] == "abc"[d["index"]], d
            x0, y0, x1, y1 = d["box"]
            assert 0 <= x0 < x1 <= 96 and 0 <= y0 < y1 <= 64, d
        spec = {"name": "yolo_crops", "slo_ms": 3000,
                "stages": [{"id": "det", "model": "yolo"},
                           {"id": "cls", "model": "cls_m",
                            "crops_of": dict(det, stage="det"), "top_k": 1}]}
        r = s.request("POST", "/pipelines", body=json.dumps(spec),
                      headers=dict(auth(s), **{"Content-Type": "application/json"}))
        assert r.status == 201, r
        r = s.request("POST", "/v1/pipelines/yolo_crops/infer", body=photo,
                      headers={"Content-Type": "image/jpeg", "X-SLO-Ms": "3000"})
        assert r.status == 200, r
        validate(r.json, "pipeline_query_response")
        crops = r.json["frames"][0]["det"]["cls"]
        # the pipeline crops what /v1 answers, box for box
        want = sorted((d["index"], [round(v, 2) for v in d["box"]]) for d in dets)
        got = sorted((c["class"], [round(v, 2) for v in c["box"]]) for c in crops)
        assert len(got) == len(want), (got, want)
        for (gc, gb), (wc, wb) in zip(got, want):
            assert gc == wc and near(gb, wb, 0.02), (got, want)
        assert all(len(c["predictions"]) == 1 for c in crops), crops
    finally:
        s.stop()


@test
def torchvision_s_ssdlite_and_retinanet_answer_v1_and_feed_pipelines():
    """SSDlite320 and a RetinaNet exported up to their boxes and scores
    (worker/test_detectors holds them to torch): boxes in input pixels,
    per-class scores; SSDlite's class 0 is its background, never a
    detection. Each answers /v1 with boxes in the photo's pixels, and a
    pipeline crops what /v1 answers."""
    models = os.environ.get("SQUISH_TEST_MODELS", "")
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=60)
        upload(s, {"name": "cls_m", "max_batch": 8}, tm.tiny(3))
        cases = (("ssdlite", {"background": 0, "score_threshold": 0.04}, 91),
                 ("retinanet_tiny", {"score_threshold": 0.5}, 5))
        for name, extra, classes in cases:
            det = dict({"layout": "boxes_scores", "boxes": "boxes", "scores": "scores",
                        "normalized": False, "max_crops": 6}, **extra)
            with open(os.path.join(models, name + ".onnx"), "rb") as f:
                upload(s, {"name": name, "max_batch": 1, "preprocess": PREP, "detector": det},
                       f.read())
        wait_ready(s, "cls_m")
        photo = gradient(160, 120)
        for name, extra, classes in cases:
            rec = wait_ready(s, name)
            assert rec["detector"]["layout"] == "boxes_scores", rec["detector"]
            assert rec["detector"].get("background") == extra.get("background"), rec["detector"]
            dets = v1(s, name, photo)["detections"][0]
            # seeded weights and a fixed photo: the same detections every run
            assert 1 <= len(dets) <= 6, (name, dets)
            for d in dets:
                assert d["score"] >= extra["score_threshold"], (name, d)
                assert 0 <= d["index"] < classes and d["index"] != extra.get("background"), d
            spec = {"name": name + "_crops", "slo_ms": 5000,
                    "stages": [{"id": "det", "model": name},
                               {"id": "cls", "model": "cls_m",
                                "crops_of": dict(det, stage="det"), "top_k": 1}]}
            r = s.request("POST", "/pipelines", body=json.dumps(spec),
                          headers=dict(auth(s), **{"Content-Type": "application/json"}))
            assert r.status == 201, r
            r = s.request("POST", "/v1/pipelines/%s_crops/infer" % name, body=photo,
                          headers={"Content-Type": "image/jpeg", "X-SLO-Ms": "5000"})
            assert r.status == 200, r
            validate(r.json, "pipeline_query_response")
            crops = r.json["frames"][0]["det"]["cls"]
            want = sorted((d["index"], [round(v, 2) for v in d["box"]]) for d in dets)
            got = sorted((c["class"], [round(v, 2) for v in c["box"]]) for c in crops)
            assert len(got) == len(want), (name, got, want)
            for (gc, gb), (wc, wb) in zip(got, want):
                assert gc == wc and near(gb, wb, 0.02), (name, got, want)
    finally:
        s.stop()


@test
def a_detector_block_that_does_not_fit_the_outputs_is_refused_at_upload():
    s = Squishd(workers="none")
    try:
        for det, want in (
                ({"layout": "yolo", "classes": [5]},
                 "config.detector.classes: class 5, but the detector scores 2 classes"),
                ({"layout": "boxes_scores", "boxes": "boxes", "scores": "scores"},
                 "config.detector.boxes: model y has no output \"boxes\""),
                ({"layout": "yolo", "padding": 9}, "config.detector.padding"),
                ({"layout": "ssd"}, "config.detector.layout: expected \"yolo\"")):
            r = upload(s, {"name": "y", "detector": det}, tm.yolo_detector(), status=400)
            assert want in r.json["error"], (det, r.json)
        r = upload(s, {"name": "y", "detector": YOLO, "labels": ["a", "b", "c"]},
                   tm.yolo_detector(), status=400)
        assert "3 labels for an output of 2 classes" in r.json["error"], r.json
        r = upload(s, {"name": "y", "detector": YOLO}, tm.segmenter(), status=400)
        assert "config.detector.output: output \"out\" is [" in r.json["error"], r.json
        assert "expected [N, 4 + C, A] (YOLOv8)" in r.json["error"], r.json
        r = upload(s, {"name": "y", "segmenter": True}, tm.yolo_detector(), status=400)
        assert "expected [N, C, H, W]" in r.json["error"], r.json
    finally:
        s.stop()


@test
def a_segmenter_answers_v1_with_its_classes_by_pixel_share():
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=60)
        upload(s, {"name": "seg", "max_batch": 4, "labels": ["bg", "cat", "dog"],
                   "segmenter": True}, tm.segmenter())
        upload(s, {"name": "plain", "max_batch": 4}, tm.segmenter())
        rec = wait_ready(s, "seg")
        assert rec["segmenter"] is True, rec
        got = v1(s, "seg", gray(90))
        assert got["segments"] == [[{"index": 2, "label": "dog", "share": 0.5},
                                    {"index": 0, "label": "bg", "share": 0.25},
                                    {"index": 1, "label": "cat", "share": 0.25}]], got
        # Without the flag /v1 says how to get the summary; /v2 has the mask.
        wait_ready(s, "plain")
        r = s.request("POST", "/v1/models/plain/infer", body=gray(90),
                      headers={"Content-Type": "image/jpeg"}, schema_name="error")
        assert r.status == 400 and "\"segmenter\": true" in r.json["error"], r
        x = np.zeros((1, 3, 16, 16), np.float32)
        req = {"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32",
                           "data": x.flatten().tolist()}]}
        r = s.request("POST", "/v2/models/seg/infer", body=json.dumps(req),
                      headers={"Content-Type": "application/json"},
                      schema_name="oip_infer_response")
        assert r.status == 200 and r.json["outputs"][0]["shape"] == [1, 3, 16, 16], r
    finally:
        s.stop()


if __name__ == "__main__":
    run()
