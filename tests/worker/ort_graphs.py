#!/usr/bin/python3
"""Detector- and mobile-style ONNX graphs for tests/worker/test_ort.c, built
with Debian's python3-onnx (no torch, no network):

    /usr/bin/python3 tests/worker/ort_graphs.py OUTDIR [STAMP]

Writes OUTDIR/NAME.onnx for every graph below. Weights come from a fixed
seed; the batch dimension is symbolic ("N") unless a graph says otherwise.
The test runs each through the worker's cpu backend and through ONNX
Runtime and compares; graphs the worker cannot run must be refused at
import with the op and the reason, and never crash anything.
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

OPSET = 13


class Builder:
    """A graph under construction: initializers from one seeded generator."""

    def __init__(self, name, seed):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], 0

    def fresh(self, stem):
        self.count += 1
        return "%s_%d" % (stem, self.count)

    def const(self, value, stem="c"):
        name = self.fresh(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, shape, scale=None):
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        scale = scale if scale is not None else 1.0 / np.sqrt(fan_in)
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), "w")

    def op(self, op_type, inputs, n_out=1, **attrs):
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.fresh(op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    def conv(self, x, cin, cout, k=3, stride=1, pad=None, group=1, dilation=1, bias=True):
        pad = (k // 2) * dilation if pad is None else pad
        ins = [x, self.weight((cout, cin // group, k, k))]
        if bias:
            ins.append(self.weight((cout,), 0.1))
        return self.op("Conv", ins, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[pad] * 4, group=group, dilations=[dilation, dilation])

    def relu6(self, x):
        return self.op("Clip", [x, self.const(np.float32(0)), self.const(np.float32(6))])

    def batchnorm(self, x, c):
        r = self.rng
        return self.op("BatchNormalization",
                       [x, self.const((1 + 0.1 * r.standard_normal(c)).astype(np.float32)),
                        self.const((0.1 * r.standard_normal(c)).astype(np.float32)),
                        self.const((0.1 * r.standard_normal(c)).astype(np.float32)),
                        self.const((1 + 0.1 * r.random(c)).astype(np.float32))],
                       epsilon=1e-3)

    def save(self, outdir, inputs, outputs, opset=OPSET):
        graph = helper.make_graph(
            self.nodes, self.name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
            self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  producer_name="squish-tests")
        model.ir_version = 7  # what ONNX Runtime and the importer both read
        with open(os.path.join(outdir, self.name + ".onnx"), "wb") as f:
            f.write(model.SerializeToString())


def depthwise(outdir):
    """MobileNet blocks: depthwise 3x3 (stride 1 and 2, a dilated one, a
    channel multiplier of 2), pointwise 1x1, BatchNorm, ReLU6, HardSwish,
    and an inverted residual."""
    b = Builder("depthwise", 11)
    x = b.conv("x", 3, 16, stride=2)
    x = b.relu6(b.batchnorm(x, 16))
    y = b.relu6(b.conv(x, 16, 16, group=16, bias=False))
    y = b.conv(y, 16, 16, k=1)
    x = b.op("Add", [x, y])
    x = b.conv(x, 16, 32, group=16, stride=2)  # channel multiplier 2
    x = b.op("HardSwish", [b.batchnorm(x, 32)])
    x = b.conv(x, 32, 32, group=32, dilation=2)
    x = b.op("Relu", [b.conv(x, 32, 24, k=1)])
    x = b.conv(x, 24, 24, k=5, group=24, stride=2)
    b.save(outdir, [("x", ["N", 3, 32, 32])], [x], opset=14)  # HardSwish is opset 14


def nhwc(outdir):
    """A TensorFlow export: NHWC input transposed to NCHW, convs, and heads
    transposed back to NHWC and reshaped to [N, anchors, values]."""
    b = Builder("nhwc", 12)
    x = b.op("Transpose", ["image"], perm=[0, 3, 1, 2])
    x = b.op("Relu", [b.conv(x, 3, 8, stride=2)])
    x = b.op("Relu", [b.conv(x, 8, 8, group=8)])
    boxes = b.op("Transpose", [b.conv(x, 8, 8, k=1)], perm=[0, 2, 3, 1])
    boxes = b.op("Reshape", [boxes, b.const(np.array([0, -1, 4], np.int64))])
    scores = b.op("Transpose", [b.conv(x, 8, 6, k=1)], perm=[0, 2, 3, 1])
    scores = b.op("Reshape", [scores, b.const(np.array([0, -1, 3], np.int64))])
    scores = b.op("Softmax", [scores], axis=-1)
    b.save(outdir, [("image", ["N", 24, 20, 3])], [boxes, scores])


def constant_of_shape(outdir):
    """ConstantOfShape feeding a channel padding Concat (BlazeFace's
    residual trick, here with the batch taken from Shape) and a broadcast
    Add of a filled constant."""
    b = Builder("constant_of_shape", 13)
    x = b.op("Relu", [b.conv("x", 4, 6)])
    shape = b.op("Shape", [x])
    batch = b.op("Slice", [shape, b.const(np.array([0], np.int64)), b.const(np.array([1], np.int64))])
    pad_shape = b.op("Concat", [batch, b.const(np.array([2, 8, 8], np.int64))], axis=0)
    zeros = b.op("ConstantOfShape", [pad_shape],
                 value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0]))
    x = b.op("Concat", [x, zeros], axis=1)
    fill = b.op("ConstantOfShape", [b.const(np.array([1, 8, 1, 1], np.int64))],
                value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5]))
    x = b.op("Add", [x, fill])
    x = b.conv(x, 8, 8, group=8)
    b.save(outdir, [("x", ["N", 4, 8, 8])], [x])


def constant_of_shape_fixed(outdir):
    """BlazeFace's own form: the padding's shape is a constant with batch 1,
    so the graph only holds for batch 1."""
    b = Builder("constant_of_shape_fixed", 14)
    x = b.op("Relu", [b.conv("x", 4, 6)])
    zeros = b.op("ConstantOfShape", [b.const(np.array([1, 2, 8, 8], np.int64))])
    x = b.op("Concat", [x, zeros], axis=1)
    x = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    b.save(outdir, [("x", [1, 4, 8, 8])], [x])


def pads(outdir):
    """Pad in every mode with pads given as an input (opset 11+), uneven
    and one-sided, then pools with padding and ceil_mode."""
    b = Builder("pads", 15)
    x = b.conv("x", 3, 4)
    x = b.op("Pad", [x, b.const(np.array([0, 0, 1, 0, 0, 0, 2, 3], np.int64)),
                     b.const(np.float32(0.25))], mode="constant")
    x = b.op("Pad", [x, b.const(np.array([0, 0, 2, 1, 0, 0, 1, 2], np.int64))], mode="reflect")
    x = b.op("Pad", [x, b.const(np.array([0, 1, 1, 1, 0, 2, 0, 1], np.int64))], mode="edge")
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)
    x = b.op("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 0],
             count_include_pad=0, ceil_mode=1)
    b.save(outdir, [("x", ["N", 3, 15, 13])], [x])


def ssd_heads(outdir):
    """Two feature maps, each with box and class heads; the heads are
    flattened to [N, anchors, k] and concatenated over anchors."""
    b = Builder("ssd_heads", 16)
    f1 = b.op("Relu", [b.conv("x", 3, 8, stride=2)])
    f2 = b.op("Relu", [b.conv(f1, 8, 16, stride=2)])
    boxes, scores = [], []
    for f, c in ((f1, 8), (f2, 16)):
        for k, out in ((4, boxes), (3, scores)):
            h = b.op("Transpose", [b.conv(f, c, 2 * k, k=3)], perm=[0, 2, 3, 1])
            out.append(b.op("Reshape", [h, b.const(np.array([0, -1, k], np.int64))]))
    boxes = b.op("Concat", boxes, axis=1)
    scores = b.op("Sigmoid", [b.op("Concat", scores, axis=1)])
    b.save(outdir, [("x", ["N", 3, 16, 16])], [boxes, scores])


def resize(outdir):
    """An FPN upsampling: Resize (nearest, scale 2) of a coarse map added
    to a fine one."""
    b = Builder("resize", 17)
    fine = b.op("Relu", [b.conv("x", 3, 8)])
    coarse = b.op("Relu", [b.conv(fine, 8, 8, stride=2)])
    up = b.op("Resize", [coarse, "", b.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    b.save(outdir, [("x", ["N", 3, 8, 8])], [b.op("Add", [fine, up])])


def upsample(b, x, mode, ctm=None, nearest=None, scales=None, sizes=None, opset=13, **extra):
    """A Resize of x as the exporters write it: roi and scales empty where
    sizes are given (opset 11-17), scales alone at opset 10; extra
    attributes (cubic_coeff_a, exclude_outside) as given."""
    attrs = dict(extra, mode=mode)
    if ctm is not None:
        attrs["coordinate_transformation_mode"] = ctm
    if nearest is not None:
        attrs["nearest_mode"] = nearest
    if opset < 11:
        return b.op("Resize", [x, b.const(np.array(scales, np.float32))], **attrs)
    empty = b.const(np.array([], np.float32))
    if sizes is not None:
        return b.op("Resize", [x, empty, empty, sizes], **attrs)
    return b.op("Resize", [x, empty, b.const(np.array(scales, np.float32))], **attrs)


def resize_nearest(outdir):
    """Nearest upsampling as torch (asymmetric, floor), ONNX's defaults
    (half_pixel, round_prefer_floor), paddle2onnx and tf2onnx write it: by
    whole factors (oneDNN's resampling), by 1.5 and 0.5 and to sizes (the C
    kernel), each after a conv of a 6x6 map."""
    b = Builder("resize_nearest", 21)
    x = b.op("Relu", [b.conv("x", 3, 4)])
    outs = [
        upsample(b, x, "nearest", "asymmetric", "floor", [1, 1, 2, 2]),
        upsample(b, x, "nearest", None, None, [1, 1, 3, 2]),
        upsample(b, x, "nearest", "pytorch_half_pixel", "round_prefer_ceil", [1, 1, 2, 2]),
        upsample(b, x, "nearest", "half_pixel", "round_prefer_ceil", [1, 1, 1.5, 1.5]),
        upsample(b, x, "nearest", "half_pixel", "round_prefer_floor", [1, 1, 1.5, 0.5]),
        upsample(b, x, "nearest", "asymmetric", "ceil", [1, 1, 1.5, 2]),
        upsample(b, x, "nearest", "align_corners", "round_prefer_floor",
                 sizes=b.const(np.array([1, 4, 9, 11], np.int64))),
        upsample(b, x, "nearest", "asymmetric", "round_prefer_floor", [1, 1, 2, 2]),
    ]
    b.save(outdir, [("x", [1, 3, 6, 6])], outs)


def resize_linear(outdir):
    """Bilinear resizes: torch's align_corners=False (pytorch_half_pixel)
    and ONNX's half_pixel by 2, 1.5 and 0.5 (oneDNN's resampling), torch's
    align_corners=True to sizes and asymmetric (the C kernel)."""
    b = Builder("resize_linear", 22)
    x = b.conv("x", 3, 4)
    outs = [
        upsample(b, x, "linear", "pytorch_half_pixel", None, [1, 1, 2, 2]),
        upsample(b, x, "linear", "half_pixel", None, [1, 1, 1.5, 2]),
        upsample(b, x, "linear", "half_pixel", None, [1, 1, 0.5, 0.5]),
        upsample(b, x, "linear", "half_pixel", None, [1, 1, 1.4, 1.7]),
        upsample(b, x, "linear", "align_corners", None,
                 sizes=b.const(np.array([1, 4, 12, 10], np.int64))),
        upsample(b, x, "linear", "asymmetric", None, [1, 1, 2, 3]),
    ]
    b.save(outdir, [("x", [1, 3, 6, 6])], outs)


def resize_fpn(outdir):
    """A detector's FPN on a symbolic batch: torch's F.interpolate(size=)
    at opset 11 (sizes from the input's Shape, the batch and channels
    sliced off it and the map's size appended) and nn.Upsample(2) at
    opset 10 (Resize with scales), each added to a finer map."""
    b = Builder("resize_fpn", 23)
    fine = b.op("Relu", [b.conv("x", 3, 8)])
    coarse = b.op("Relu", [b.conv(fine, 8, 8, stride=2)])
    nc = b.op("Slice", [b.op("Shape", [coarse]), b.const(np.array([0], np.int64)),
                        b.const(np.array([2], np.int64))])
    sizes = b.op("Concat", [nc, b.const(np.array([8, 8], np.int64))], axis=0)
    up = upsample(b, coarse, "linear", "pytorch_half_pixel", None, sizes=sizes, opset=11)
    p1 = b.op("Add", [fine, up])
    b11 = b
    b11.save(outdir, [("x", ["N", 3, 8, 8])], [p1], opset=11)
    b = Builder("resize_opset10", 24)
    fine = b.op("Relu", [b.conv("x", 3, 8)])
    coarse = b.op("Relu", [b.conv(fine, 8, 8, stride=2)])
    up = upsample(b, coarse, "nearest", scales=[1, 1, 2, 2], opset=10)
    b.save(outdir, [("x", ["N", 3, 8, 8])], [b.op("Add", [fine, up])], opset=10)


def resize_cubic(outdir):
    """Bicubic (the C kernel) as torch writes it (pytorch_half_pixel or
    align_corners, cubic_coeff_a -0.75) and as TensorFlow does (half_pixel
    or asymmetric, -0.5, exclude_outside 1), up and down, by scales and to
    sizes (one of them a row of one pixel), after a conv of a 6x6 map."""
    b = Builder("resize_cubic", 25)
    x = b.conv("x", 3, 4)

    def sizes(h, w):
        return b.const(np.array([1, 4, h, w], np.int64))

    outs = [
        upsample(b, x, "cubic", "pytorch_half_pixel", None, [1, 1, 2, 2], cubic_coeff_a=-0.75),
        upsample(b, x, "cubic", None, None, [1, 1, 1.5, 2]),
        upsample(b, x, "cubic", "half_pixel", None, [1, 1, 0.5, 0.5], cubic_coeff_a=-0.5,
                 exclude_outside=1),
        upsample(b, x, "cubic", "half_pixel", None, [1, 1, 1.4, 0.7], cubic_coeff_a=-0.5),
        upsample(b, x, "cubic", "pytorch_half_pixel", None, [1, 1, 0.6, 1.8], exclude_outside=1),
        upsample(b, x, "cubic", "align_corners", None, sizes=sizes(12, 10)),
        upsample(b, x, "cubic", "align_corners", None, sizes=sizes(4, 3), cubic_coeff_a=-0.5,
                 exclude_outside=1),
        upsample(b, x, "cubic", "asymmetric", None, [1, 1, 2, 3], cubic_coeff_a=-0.5,
                 exclude_outside=1),
        upsample(b, x, "cubic", "asymmetric", None, [1, 1, 0.5, 0.75]),
        upsample(b, x, "cubic", "pytorch_half_pixel", None, sizes=sizes(1, 9)),
    ]
    b.save(outdir, [("x", [1, 3, 6, 6])], outs)


def conv_transpose(outdir):
    """ConvTranspose as segmentation decoders and U-Nets write it: k 4 s 2
    p 1, k 3 s 2 p 1 output_padding 1, k 2 s 2 without a bias, and an
    asymmetric k 3 s 1 after a conv."""
    b = Builder("conv_transpose", 26)
    x = b.op("Relu", [b.conv("x", 3, 6)])

    def deconv(x, cin, cout, k, s, pads, op=None, bias=True):
        ins = [x, b.weight((cin, cout, k, k), 1.0 / np.sqrt(cin * k * k))]
        if bias:
            ins.append(b.weight((cout,), 0.1))
        attrs = {"strides": [s, s], "pads": pads}
        if op is not None:
            attrs["output_padding"] = op
        return b.op("ConvTranspose", ins, **attrs)

    y1 = b.op("Relu", [deconv(x, 6, 4, 4, 2, [1, 1, 1, 1])])
    y2 = deconv(x, 6, 5, 3, 2, [1, 1, 1, 1], [1, 1])
    y3 = deconv(b.conv(y1, 4, 4), 4, 3, 2, 2, [0, 0, 0, 0], bias=False)
    y4 = deconv(x, 6, 2, 3, 1, [0, 1, 2, 1])
    b.save(outdir, [("x", ["N", 3, 5, 5])], [y1, y2, y3, y4])


def conv_transpose_grouped(outdir):
    """A grouped ConvTranspose: not one the worker runs."""
    b = Builder("conv_transpose_grouped", 27)
    b.save(outdir, [("x", ["N", 4, 5, 5])],
           [b.op("ConvTranspose", ["x", b.weight((4, 2, 3, 3))], group=2, strides=[2, 2])])


def heads(outdir):
    """The rest of the runtime ops: BatchNorm, LeakyRelu, HardSigmoid,
    Slice, Split, broadcast Mul/Sub/Div by constants, Reshape to rows,
    MatMul with Softmax, ReduceMean, Flatten and Gemm."""
    b = Builder("heads", 19)
    x = b.op("LeakyRelu", [b.batchnorm(b.conv("x", 3, 8), 8)], alpha=0.1)
    x = b.op("Slice", [x, b.const(np.array([1, 0], np.int64)), b.const(np.array([7, 8], np.int64)),
                       b.const(np.array([2, 3], np.int64)), b.const(np.array([1, 2], np.int64))])
    s1, s2 = b.op("Split", [x, b.const(np.array([3, 5], np.int64))], n_out=2, axis=1)
    x = b.op("Concat", [b.op("HardSigmoid", [s1], alpha=0.3, beta=0.4), b.op("Sigmoid", [s2])],
             axis=1)
    x = b.op("Mul", [x, b.weight((1, 8, 1, 1), 1.0)])
    x = b.op("Sub", [b.const(np.float32(0.5)), x])
    x = b.op("Div", [x, b.const(np.array([1.5], np.float32))])
    rows = b.op("Reshape", [x, b.const(np.array([0, 8, 24], np.int64))])
    probs = b.op("Softmax", [b.op("MatMul", [rows, b.weight((24, 10))])], axis=-1)
    pooled = b.op("ReduceMean", [x], axes=[2, 3], keepdims=1)
    flat = b.op("Flatten", [pooled], axis=1)
    logits = b.op("Relu", [b.op("Gemm", [flat, b.weight((4, 8)), b.weight((4,), 0.1)],
                                transB=1, alpha=0.5, beta=2.0)])
    b.save(outdir, [("x", ["N", 3, 8, 8])], [probs, logits])


def neg_exp(outdir):
    """Neg and Exp after convs (each fused into its conv as a post-op) and
    on their own after a pool."""
    b = Builder("neg_exp", 20)
    x = b.op("Neg", [b.conv("x", 3, 8)])
    x = b.op("Exp", [b.conv(x, 8, 8, k=1)])
    x = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    b.save(outdir, [("x", ["N", 3, 8, 8])], [b.op("Exp", [b.op("Neg", [x])])])


def concat(outdir, n):
    """A Concat of n inputs (n slices of a conv's output along channels)."""
    b = Builder("concat%d" % n, 18)
    x = b.conv("x", 3, n)
    parts = b.op("Split", [x], n_out=n, axis=1) if n > 1 else [x]
    parts = [b.op("Relu", [p]) if i % 2 else p for i, p in enumerate(parts)]
    b.save(outdir, [("x", ["N", 3, 6, 6])], [b.op("Concat", parts, axis=1)])


def main():
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    for make in (depthwise, nhwc, constant_of_shape, constant_of_shape_fixed, pads, ssd_heads,
                 heads, resize, neg_exp, resize_nearest, resize_linear, resize_fpn, resize_cubic,
                 conv_transpose, conv_transpose_grouped):
        make(outdir)
    concat(outdir, 8)
    concat(outdir, 9)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            f.write("ok\n")


if __name__ == "__main__":
    main()
