#!/usr/bin/python3
"""Exports the torchvision test models to ONNX, with reference inputs/outputs.

Run with Debian's /usr/bin/python3 (it has python3-torch and torchvision):

    /usr/bin/python3 scripts/export_models.py OUTDIR [STAMP]

Writes into OUTDIR, for each model M (random weights from a fixed seed, eval
mode, opset 13, batch dimension dynamic and named "N"):

    M.onnx
    M.b1.input.f32   M.b1.output.f32    batch 1
    M.b8.input.f32   M.b8.output.f32    batch 8, eight distinct images

The .f32 files are raw little-endian float32 in C order, NCHW for inputs and
[N, classes] for outputs; manifest.json lists every file with its shape.
resnet18_ft_a and resnet18_ft_b share every weight but the final fc (Gemm):
they are the fine-tuned variants the prefix detection tests look for.
vit_tiny is a small ViT (TinyViT below) whose attention merges the batch
with its heads: what the tests of batching such graphs run.

The segmenters (SEGMENTERS: torchvision's LR-ASPP and DeepLabV3 on
MobileNetV3-Large, random weights and backbone) are exported at opset 17
and 3x160x160 (their atrous convs then read only padding with all taps but
the centre), wrapped so that the one output "out" is the dict's "out",
[N, 21, 160, 160] class scores; their manifest entries carry "input" and
"opset" as exported. Their references are at batch 1 and 2 (each output
1.9 MB an image).

upsample_bicubic (BicubicUpsampler below: a conv, then nn.Upsample's
bicubic by 2 and to a size with align_corners, and F.interpolate's bicubic
by 0.5, flattened into one output [N, 4 * (32 * 32 + 20 * 24 + 8 * 8)]) is
exported at opset 17 and 3x16x16, its references at batch 1 and 2.

yolo_tiny (YoloTiny below: a YOLO-style detector written from the public
architecture, C2f blocks, SPPF, nearest upsampling, a decoupled head; one
output [N, 4 + 3, 84] as YOLOv8's) is exported at opset 17 and 3x64x64,
its references at batch 1 and 2.

ssdlite (torchvision's SSDlite320 on MobileNetV3-Large, 91 classes, at
3x320x320) and retinanet_tiny (torchvision's RetinaNet on a ResNet-18 FPN
of 64 channels, 5 classes, at 3x128x128) are exported without their
data-dependent postprocessing (TorchvisionDetector below): two outputs,
"boxes" [N, A, 4] (xyxy, input pixels, decoded against the anchors) and
"scores" [N, A, C] (SSD's softmax, class 0 the background; RetinaNet's
sigmoid); the score threshold, top-k and NMS are squish's crops_of. Their
references are at batch 1 and 2, one file per output (.output.f32 the
boxes, .output1.f32 the scores).

Nothing is downloaded. Models already present with the same script version
are kept, so that a rebuild costs nothing. With SQUISH_TEST_MODELS_FROM set
to another build directory's exports made by this very script (the same
bytes: manifest.json's script_sha256), its files are copied instead of
exported again (scripts/test's sanitizer build takes the release build's).
"""
import hashlib
import json
import os
import shutil
import sys

import torch
import torchvision

SCRIPT_VERSION = 2
OPSET = 13
IMAGE_HW = 224
SEED = 1234
SEGMENTERS = {"lraspp_mobilenet_v3_large": 160, "deeplabv3_mobilenet_v3_large": 160}
SEGMENTER_OPSET = 17
# Small graphs of one op family, exported at SEGMENTER_OPSET: name -> H = W.
SMALL = {"upsample_bicubic": 16, "yolo_tiny": 64}
# torchvision's detectors without their postprocessing: name -> H = W.
DETECTORS = {"ssdlite": 320, "retinanet_tiny": 128}


def calibrate(model, image_hw=IMAGE_HW):
    """Sets every BatchNorm's statistics to those of the activations it sees.

    With random weights and BatchNorm's default statistics (mean 0, var 1)
    activations grow or fade layer by layer until every image gives nearly
    the same logits (googlenet, shufflenet), and agreeing with such outputs
    proves little. A few batches in training mode with cumulative averages
    give each BatchNorm the mean and variance of its real input, as trained
    weights would. Deterministic: fixed inputs, fixed seed."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return model
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    gen = torch.Generator().manual_seed(SEED + 3)
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.rand(8, 3, image_hw, image_hw, generator=gen))
    return model.eval()


class TinyViT(torch.nn.Module):
    """A ViT in small: 16x16 patches embedded by a conv, a class token
    concatenated over the batch, positions added, two pre-norm encoder
    blocks (nn.MultiheadAttention, whose export reshapes [tokens, N, C] to
    [tokens, N * heads, d] and back: the batch merged with the heads), a
    GELU MLP, the class token's LayerNorm and a linear head. What
    torchvision's vit_b_16 does, at 64 wide."""

    class Block(torch.nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.ln_1 = torch.nn.LayerNorm(dim)
            self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
            self.ln_2 = torch.nn.LayerNorm(dim)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(),
                                           torch.nn.Linear(2 * dim, dim))

        def forward(self, x):
            y = self.ln_1(x)
            x = x + self.attn(y, y, y, need_weights=False)[0]
            return x + self.mlp(self.ln_2(x))

    def __init__(self, dim=64, heads=4, classes=1000):
        super().__init__()
        self.patch = torch.nn.Conv2d(3, dim, 16, stride=16)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = torch.nn.Parameter(torch.randn(1, (IMAGE_HW // 16) ** 2 + 1, dim) * 0.02)
        self.blocks = torch.nn.Sequential(TinyViT.Block(dim, heads), TinyViT.Block(dim, heads))
        self.ln = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, x):
        n = x.shape[0]
        x = self.patch(x).reshape(n, self.pos.shape[2], -1).permute(0, 2, 1)
        x = torch.cat([self.cls.expand(n, -1, -1), x], dim=1) + self.pos
        x = self.blocks(x)
        return self.head(self.ln(x[:, 0]))


class BicubicUpsampler(torch.nn.Module):
    """torch's bicubic resizes as exported (cubic_coeff_a -0.75): by
    scales up and down (half_pixel at opset 17) and to a size with
    align_corners (sizes from the input's Shape)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.up = torch.nn.Upsample(scale_factor=2, mode="bicubic")
        self.up_corners = torch.nn.Upsample(size=(20, 24), mode="bicubic", align_corners=True)

    def forward(self, x):
        y = self.conv(x)
        down = torch.nn.functional.interpolate(y, scale_factor=0.5, mode="bicubic")
        return torch.cat([self.up(y).flatten(1), self.up_corners(y).flatten(1),
                          down.flatten(1)], dim=1)


class YoloTiny(torch.nn.Module):
    """A YOLO-style detector written from the public architecture (YOLOv5
    and YOLOv8's blocks, at toy width): Conv-BN-SiLU layers, C2f blocks
    (a 1x1 conv split in two, bottlenecks on one half, every part
    concatenated), SPPF (three chained 5x5 max pools, concatenated), an
    FPN neck (nearest 2x upsampling, concatenation) and a decoupled head
    per scale (a box branch and a class branch). Its one output is
    YOLOv8's layout, [N, 4 + C, A]: each anchor's box as centre and size in
    input pixels, then its class scores (sigmoids), the anchors of the
    three scales (strides 8, 16, 32) one after the other."""

    class Conv(torch.nn.Module):
        def __init__(self, cin, cout, k=1, s=1):
            super().__init__()
            self.conv = torch.nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
            self.bn = torch.nn.BatchNorm2d(cout)

        def forward(self, x):
            return torch.nn.functional.silu(self.bn(self.conv(x)))

    class C2f(torch.nn.Module):
        def __init__(self, cin, cout, n=1):
            super().__init__()
            self.c = cout // 2
            self.cv1 = YoloTiny.Conv(cin, 2 * self.c)
            self.cv2 = YoloTiny.Conv((2 + n) * self.c, cout)
            self.m = torch.nn.ModuleList(
                torch.nn.Sequential(YoloTiny.Conv(self.c, self.c, 3), YoloTiny.Conv(self.c, self.c, 3))
                for _ in range(n))

        def forward(self, x):
            y = list(self.cv1(x).chunk(2, 1))
            for m in self.m:
                y.append(y[-1] + m(y[-1]))
            return self.cv2(torch.cat(y, 1))

    class SPPF(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.cv1 = YoloTiny.Conv(c, c // 2)
            self.cv2 = YoloTiny.Conv(2 * c, c)
            self.pool = torch.nn.MaxPool2d(5, 1, 2)

        def forward(self, x):
            x = self.cv1(x)
            a = self.pool(x)
            b = self.pool(a)
            return self.cv2(torch.cat([x, a, b, self.pool(b)], 1))

    def __init__(self, classes=3, hw=64):
        super().__init__()
        C = YoloTiny.Conv
        self.classes = classes
        self.stem = torch.nn.Sequential(C(3, 8, 3, 2), C(8, 16, 3, 2), YoloTiny.C2f(16, 16))
        self.p3 = torch.nn.Sequential(C(16, 32, 3, 2), YoloTiny.C2f(32, 32))        # stride 8
        self.p4 = torch.nn.Sequential(C(32, 48, 3, 2), YoloTiny.C2f(48, 48))        # stride 16
        self.p5 = torch.nn.Sequential(C(48, 64, 3, 2), YoloTiny.C2f(64, 64), YoloTiny.SPPF(64))
        self.up = torch.nn.Upsample(scale_factor=2, mode="nearest")
        self.n4 = YoloTiny.C2f(64 + 48, 48)
        self.n3 = YoloTiny.C2f(48 + 32, 32)
        self.box = torch.nn.ModuleList(
            torch.nn.Sequential(C(c, 32, 3), torch.nn.Conv2d(32, 4, 1)) for c in (32, 48, 64))
        self.cls = torch.nn.ModuleList(
            torch.nn.Sequential(C(c, 32, 3), torch.nn.Conv2d(32, classes, 1)) for c in (32, 48, 64))
        # each scale's cell centres, in cells (constants of the export)
        for i, s in enumerate((8, 16, 32)):
            g = hw // s
            ys, xs = torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij")
            self.register_buffer("grid%d" % i, torch.stack([xs, ys]).float().reshape(1, 2, g * g))

    def forward(self, x):
        x = self.stem(x)
        f3 = self.p3(x)
        f4 = self.p4(f3)
        f5 = self.p5(f4)
        n4 = self.n4(torch.cat([self.up(f5), f4], 1))
        n3 = self.n3(torch.cat([self.up(n4), f3], 1))
        outs = []
        for i, (f, s) in enumerate(((n3, 8), (n4, 16), (f5, 32))):
            n = f.shape[0]
            t = self.box[i](f).reshape(n, 4, -1)
            xy = (torch.sigmoid(t[:, :2]) + getattr(self, "grid%d" % i)) * s
            wh = torch.sigmoid(t[:, 2:]) * (4 * s)
            cls = torch.sigmoid(self.cls[i](f).reshape(n, self.classes, -1))
            outs.append(torch.cat([xy, wh, cls], 1))
        return torch.cat(outs, 2)


class TorchvisionDetector(torch.nn.Module):
    """torchvision's SSD or RetinaNet up to their boxes and scores: the
    model's own normalization, backbone and head, the head's box offsets
    decoded against the anchors (the model's anchor generator, run once
    for the export's size: constants of the export) as its BoxCoder does,
    and the class scores (softmax for SSD, sigmoid for RetinaNet). What
    stays out is the data-dependent part (score threshold, top-k per
    level, NMS: NonZero, TopK, If), which squish's crops_of does.
    Inputs in [0, 1], as the other exports."""

    def __init__(self, model, hw, softmax):
        super().__init__()
        from torchvision.models.detection.image_list import ImageList
        self.model = model.eval()
        self.softmax = softmax
        t = model.transform
        self.register_buffer("mean", torch.tensor(t.image_mean).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(t.image_std).view(1, 3, 1, 1))
        with torch.no_grad():
            x = torch.zeros(1, 3, hw, hw)
            anchors = model.anchor_generator(ImageList(x, [(hw, hw)]), self.features(x))[0]
        self.register_buffer("anchors", anchors)
        self.weights = model.box_coder.weights
        self.clip = model.box_coder.bbox_xform_clip

    def features(self, x):
        f = self.model.backbone((x - self.mean) / self.std)
        return list(f.values()) if isinstance(f, dict) else [f]

    def forward(self, x):
        head = self.model.head(self.features(x))
        rel, logits = head["bbox_regression"], head["cls_logits"]
        a = self.anchors
        wa, ha = a[:, 2] - a[:, 0], a[:, 3] - a[:, 1]
        cxa, cya = a[:, 0] + 0.5 * wa, a[:, 1] + 0.5 * ha
        wx, wy, ww, wh = self.weights
        cx = rel[..., 0] / wx * wa + cxa
        cy = rel[..., 1] / wy * ha + cya
        w = torch.exp(torch.clamp(rel[..., 2] / ww, max=self.clip)) * wa
        h = torch.exp(torch.clamp(rel[..., 3] / wh, max=self.clip)) * ha
        boxes = torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], -1)
        scores = torch.softmax(logits, -1) if self.softmax else torch.sigmoid(logits)
        return boxes, scores


def build_detector(name):
    detection = torchvision.models.detection
    hw = DETECTORS[name]
    if name == "ssdlite":
        model = detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
        softmax = True
    else:
        from torchvision.models.detection.backbone_utils import BackboneWithFPN
        from torchvision.ops.feature_pyramid_network import LastLevelP6P7
        # RetinaNet's own backbone (ResNet, FPN on C3-C5, P6-P7 from P5),
        # at ResNet-18 and 64 channels so that the test model stays small.
        fpn = BackboneWithFPN(torchvision.models.resnet18(weights=None),
                              {"layer2": "0", "layer3": "1", "layer4": "2"}, [128, 256, 512], 64,
                              extra_blocks=LastLevelP6P7(64, 64))
        model = detection.RetinaNet(fpn, num_classes=5, min_size=hw, max_size=hw)
        # RetinaNet's classifier starts at the 1% prior, its convs' weights
        # of std 0.01 shrinking what reaches the logits: every score near
        # 0.01. He-initialized convs and wider logit weights spread them,
        # as training would, so that the tests' detections differ by score.
        gen = torch.Generator().manual_seed(SEED + 11)
        head = model.head.classification_head
        with torch.no_grad():
            for m in list(head.conv.modules()) + [head.cls_logits]:
                if isinstance(m, torch.nn.Conv2d):
                    fan_in = m.weight[0].numel()
                    std = 0.05 if m is head.cls_logits else (2.0 / fan_in) ** 0.5
                    m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * std)
        softmax = False
    return calibrate(TorchvisionDetector(model, hw, softmax), hw)


class OutOnly(torch.nn.Module):
    """A torchvision segmenter with its dict's "out" as its one output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


def build(name):
    models = torchvision.models
    if name in SEGMENTERS:
        seg = getattr(models.segmentation, name)(weights=None, weights_backbone=None)
        return OutOnly(calibrate(seg, SEGMENTERS[name]))
    if name in DETECTORS:
        return build_detector(name)
    if name == "vit_tiny":
        return TinyViT()
    if name == "upsample_bicubic":
        return BicubicUpsampler()
    if name == "yolo_tiny":
        return calibrate(YoloTiny(hw=SMALL[name]), SMALL[name])
    if name == "googlenet":
        # aux heads only exist in training mode; init_weights avoids the
        # scipy-based default warning path.
        return calibrate(models.googlenet(weights=None, aux_logits=False, init_weights=True))
    if name.startswith("resnet18_ft_"):
        torch.manual_seed(SEED)
        model = calibrate(models.resnet18(weights=None))
        # Same backbone for both variants; only the classifier differs.
        fc_seed = {"resnet18_ft_a": 101, "resnet18_ft_b": 202}[name]
        gen = torch.Generator().manual_seed(fc_seed)
        with torch.no_grad():
            model.fc.weight.copy_(torch.randn(model.fc.weight.shape, generator=gen) * 0.01)
            model.fc.bias.copy_(torch.randn(model.fc.bias.shape, generator=gen) * 0.01)
        return model
    return calibrate(getattr(models, name)(weights=None))


MODELS = ["resnet18", "mobilenet_v2", "squeezenet1_1", "shufflenet_v2_x1_0", "googlenet",
          "resnet18_ft_a", "resnet18_ft_b", "vit_tiny"] + list(SEGMENTERS) + list(SMALL) + \
    list(DETECTORS)


def write_f32(path, tensor):
    tensor.detach().contiguous().to(torch.float32).numpy().astype("<f4").tofile(path)


def export(name, outdir, manifest):
    torch.manual_seed(SEED)
    model = build(name).eval()
    onnx_path = os.path.join(outdir, name + ".onnx")
    hw = SEGMENTERS.get(name, SMALL.get(name, DETECTORS.get(name, IMAGE_HW)))
    small = name in SEGMENTERS or name in SMALL or name in DETECTORS
    opset = SEGMENTER_OPSET if small else OPSET
    outputs = ["boxes", "scores"] if name in DETECTORS else ["output"]
    dummy = torch.zeros(1, 3, hw, hw)
    axes = {"input": {0: "N"}}
    axes.update({o: {0: "N"} for o in outputs})
    torch.onnx.export(model, dummy, onnx_path, opset_version=opset,
                      input_names=["input"], output_names=outputs,
                      dynamic_axes=axes, do_constant_folding=True)
    entry = {"onnx": name + ".onnx", "opset": opset, "input": [3, hw, hw], "refs": []}
    if len(outputs) > 1:
        entry["outputs"] = outputs
    gen = torch.Generator().manual_seed(SEED + 7)
    for batch in ((1, 2) if small else (1, 8)):
        images = torch.rand(batch, 3, hw, hw, generator=gen)
        with torch.no_grad():
            out = model(images)
        outs = out if isinstance(out, tuple) else (out,)
        stem = "%s.b%d" % (name, batch)
        write_f32(os.path.join(outdir, stem + ".input.f32"), images)
        ref = {"batch": batch, "input": stem + ".input.f32", "input_shape": list(images.shape)}
        for i, o in enumerate(outs):
            suffix = "" if i == 0 else str(i)
            write_f32(os.path.join(outdir, stem + ".output%s.f32" % suffix), o)
            ref["output" + suffix] = stem + ".output%s.f32" % suffix
            ref["output%s_shape" % suffix] = list(o.shape)
        entry["refs"].append(ref)
    manifest["models"][name] = entry


def script_sha256():
    with open(os.path.abspath(__file__), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def files_of(entry):
    return [entry["onnx"]] + [r[k] for r in entry["refs"] for k in r
                              if not k.endswith("shape") and k != "batch"]


def reused(name, src, src_manifest, outdir, manifest):
    """name's files copied from src, another build directory's
    exports by this very script (the same bytes, so the same models and
    references): scripts/test's sanitizer build takes the release build's
    instead of exporting them again. False when src has no such export."""
    entry = src_manifest.get("models", {}).get(name)
    if entry is None or not all(os.path.exists(os.path.join(src, f)) for f in files_of(entry)):
        return False
    for f in files_of(entry):
        # copies, not links: a later export into either directory writes
        # its files in place
        shutil.copyfile(os.path.join(src, f), os.path.join(outdir, f))
    manifest["models"][name] = entry
    return True


def main():
    if len(sys.argv) not in (2, 3):
        sys.stderr.write("usage: export_models.py OUTDIR [STAMP]\n")
        return 2
    outdir = sys.argv[1]
    stamp = sys.argv[2] if len(sys.argv) == 3 else os.path.join(outdir, "models.stamp")
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    sha = script_sha256()
    manifest_path = os.path.join(outdir, "manifest.json")
    manifest = {"version": SCRIPT_VERSION, "models": {}}
    try:
        with open(manifest_path) as f:
            old = json.load(f)
        if old.get("version") == SCRIPT_VERSION:
            manifest = old
    except (OSError, ValueError):
        pass
    # Whether every model here is this script's: only then may another
    # build directory take them (SQUISH_TEST_MODELS_FROM).
    ours = manifest.get("script_sha256") == sha
    src, src_manifest = os.environ.get("SQUISH_TEST_MODELS_FROM"), {}
    if src and os.path.abspath(src) != os.path.abspath(outdir):
        try:
            with open(os.path.join(src, "manifest.json")) as f:
                src_manifest = json.load(f)
        except (OSError, ValueError):
            pass
        if src_manifest.get("script_sha256") != sha:
            src_manifest = {}
    made = set()
    for name in MODELS:
        entry = manifest["models"].get(name)
        if entry and all(os.path.exists(os.path.join(outdir, p)) for p in files_of(entry)):
            continue
        if not reused(name, src, src_manifest, outdir, manifest):
            export(name, outdir, manifest)
        made.add(name)
        # Written after each model so that an interrupted run keeps its work.
        manifest["script_sha256"] = None
        with open(manifest_path + ".tmp", "w") as f:
            json.dump(manifest, f, indent=1)
        os.replace(manifest_path + ".tmp", manifest_path)
    manifest["script_sha256"] = sha if ours or made >= set(MODELS) else None
    with open(manifest_path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(manifest_path + ".tmp", manifest_path)
    # The stamp meson tracks: written only when every model is present.
    with open(stamp, "w") as f:
        f.write("%d\n" % SCRIPT_VERSION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
