"""Small ONNX models built with Debian's python3-onnx (no torch: fast), for
integration tests of upload, prefix detection and error paths."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _conv_net(seed_backbone, seed_head, classes=10, hw=32, extra_op=None, names="a"):
    rb = np.random.default_rng(seed_backbone)
    rh = np.random.default_rng(seed_head)
    inits = [
        numpy_helper.from_array(rb.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.1, names + "_w1"),
        numpy_helper.from_array(rb.standard_normal((8,)).astype(np.float32) * 0.1, names + "_b1"),
        numpy_helper.from_array(rb.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.1, names + "_w2"),
        numpy_helper.from_array(rh.standard_normal((classes, 16)).astype(np.float32) * 0.1, names + "_fc_w"),
        numpy_helper.from_array(rh.standard_normal((classes,)).astype(np.float32) * 0.1, names + "_fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", names + "_w1", names + "_b1"], [names + "_c1"],
                         pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", [names + "_c1"], [names + "_r1"]),
        helper.make_node("Conv", [names + "_r1", names + "_w2"], [names + "_c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", [names + "_c2"], [names + "_r2"]),
        helper.make_node("GlobalAveragePool", [names + "_r2"], [names + "_gap"]),
        helper.make_node("Flatten", [names + "_gap"], [names + "_flat"], axis=1),
        helper.make_node("Gemm", [names + "_flat", names + "_fc_w", names + "_fc_b"], ["logits"],
                         transB=1),
    ]
    if extra_op is not None:
        nodes.insert(2, helper.make_node(extra_op, [names + "_r1"], [names + "_odd"]))
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, hw, hw])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="squish-tests")
    return model.SerializeToString()


def tiny(seed=1):
    """A 10-class conv net on 3x32x32 images."""
    return _conv_net(seed, seed)


def variant(head_seed, names="a"):
    """Same backbone as tiny(1), another classifier head (a fine-tuned variant);
    tensor names may differ (names) without changing the graph."""
    return _conv_net(1, head_seed, names=names)


def heavy(seed=7, hw=160):
    """The tiny net on hw x hw images: tens of ms a batch on a CPU, so that
    measuring it takes seconds."""
    return _conv_net(seed, seed, hw=hw)


def asymmetric_pads():
    """The tiny net whose second convolution pads only its bottom and right
    edges (as TensorFlow's SAME does): the cpu backend runs it, the cuda
    backend's rules refuse it."""
    m = onnx.load_from_string(_conv_net(3, 3))
    for n in m.graph.node:
        if n.op_type == "Conv" and n.input[0].endswith("_r1"):
            for a in n.attribute:
                if a.name == "pads":
                    a.ints[:] = [0, 0, 1, 1]
    return m.SerializeToString()


def unsupported():
    """Uses an op the worker cannot run (and an odd one in the middle)."""
    return _conv_net(1, 1, extra_op="Round")


def large(megabytes):
    """A valid model carrying `megabytes` of weights (for interrupted uploads)."""
    n = megabytes * 1024 * 1024 // 4 // 16
    w = numpy_helper.from_array(np.ones((n, 16), dtype=np.float32), "big_w")
    nodes = [
        helper.make_node("GlobalAveragePool", ["input"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "proj"], ["p"]),
        helper.make_node("MatMul", ["p", "big_wt"], ["logits"]),
    ]
    proj = numpy_helper.from_array(np.ones((3, 16), dtype=np.float32), "proj")
    wt = numpy_helper.from_array(np.ones((16, n), dtype=np.float32), "big_wt")
    del w
    graph = helper.make_graph(
        nodes, "large",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", n])],
        [proj, wt])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def multipart(fields, boundary="squishboundary42"):
    """Encodes [(name, filename or None, content_type or None, bytes)] as
    multipart/form-data; returns (body, content_type)."""
    out = []
    for name, filename, ctype, data in fields:
        out.append(b"--" + boundary.encode() + b"\r\n")
        disp = 'form-data; name="%s"' % name
        if filename:
            disp += '; filename="%s"' % filename
        out.append(("Content-Disposition: %s\r\n" % disp).encode())
        if ctype:
            out.append(("Content-Type: %s\r\n" % ctype).encode())
        out.append(b"\r\n" + data + b"\r\n")
    out.append(b"--" + boundary.encode() + b"--\r\n")
    return b"".join(out), "multipart/form-data; boundary=" + boundary


def brightness_detector(boxes=8, hw=32, work=0):
    """A detector whose detections are known from its input: `boxes` fixed,
    disjoint boxes side by side (normalized xyxy, box k spans x in
    [k/boxes, (k+1)/boxes - 0.01], y in [0.1, 0.6]), and box k scores
    mean(pixels)/255 - (k + 0.5)/boxes (with preprocess mean 0, std 255:
    inputs in [0, 1]). With score threshold 0, a flat gray frame of value v
    has the boxes k < v/255 * boxes - 0.5: v = 32 gives 1, v = 250 gives 8.
    Outputs "boxes" [N, boxes, 4] and "scores" [N, boxes]. work > 0 adds
    that many 3x3 convolutions of 32 channels on the image whose result
    enters the scores with weight 0: the same detections at a cost that
    grows with the batch, as a real detector's."""
    box = np.array([[k / boxes, 0.1, (k + 1) / boxes - 0.01, 0.6] for k in range(boxes)],
                   np.float32).reshape(-1)
    inits = [
        numpy_helper.from_array(np.zeros((4 * boxes, 3), np.float32), "bw"),
        numpy_helper.from_array(box, "bb"),
        numpy_helper.from_array(np.full((boxes, 3), 1 / 3, np.float32), "sw"),
        numpy_helper.from_array(np.array([-(k + 0.5) / boxes for k in range(boxes)], np.float32),
                                "sb"),
        numpy_helper.from_array(np.array([0, boxes, 4], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("GlobalAveragePool", ["input"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "bw", "bb"], ["flat_boxes"], transB=1),
        helper.make_node("Reshape", ["flat_boxes", "shape"], ["boxes"]),
        helper.make_node("Gemm", ["flat", "sw", "sb"], ["scores"], transB=1),
    ]
    if work > 0:
        rw = np.random.default_rng(11)
        prev, ch = "input", 3
        for i in range(work):
            inits.append(numpy_helper.from_array(
                rw.standard_normal((32, ch, 3, 3)).astype(np.float32) * 0.1, "ww%d" % i))
            nodes.append(helper.make_node("Conv", [prev, "ww%d" % i], ["wc%d" % i],
                                          pads=[1, 1, 1, 1]))
            nodes.append(helper.make_node("Relu", ["wc%d" % i], ["wr%d" % i]))
            prev, ch = "wr%d" % i, 32
        inits.append(numpy_helper.from_array(np.zeros((boxes, 32), np.float32), "wz"))
        nodes += [helper.make_node("GlobalAveragePool", [prev], ["wgap"]),
                  helper.make_node("Flatten", ["wgap"], ["wflat"], axis=1),
                  helper.make_node("Gemm", ["wflat", "wz"], ["wzero"], transB=1)]
        nodes[4] = helper.make_node("Gemm", ["flat", "sw", "sb"], ["scores0"], transB=1)
        nodes.append(helper.make_node("Add", ["scores0", "wzero"], ["scores"]))
    graph = helper.make_graph(
        nodes, "brightness_detector",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, hw, hw])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", boxes, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", boxes])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="squish-tests")
    return model.SerializeToString()


def two_output_nhwc():
    """x[N,12,12,3] (NHWC) -> Transpose -> Conv 3x3 -> Relu -> GAP -> Flatten,
    which is output "features" [N,4], -> Gemm -> output "logits" [N,5].
    Returns the model bytes and a numpy function computing (logits, features)."""
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
        return feats @ fw.T + fb, feats

    return model.SerializeToString(), reference


def upsampler():
    """A torch-like decoder: x[N,3,8,8] -> 1x1 Conv -> Relu, then
    nn.Upsample(scale_factor=2) as torch exports it at opset 13 (Resize,
    nearest, asymmetric, floor, empty roi, constant scales) to output "up"
    [N,4,16,16], and nn.ConvTranspose2d(4, 2, 2, stride=2) to output
    "deconv" [N,2,16,16]. Returns the model bytes and a numpy function
    computing (up, deconv)."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((4, 3, 1, 1)).astype(np.float32) * 0.5
    b = rng.standard_normal(4).astype(np.float32) * 0.1
    dw = rng.standard_normal((4, 2, 2, 2)).astype(np.float32) * 0.5
    db = rng.standard_normal(2).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Resize", ["r", "roi", "scales"], ["up"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("ConvTranspose", ["r", "dw", "db"], ["deconv"], kernel_shape=[2, 2],
                         strides=[2, 2], pads=[0, 0, 0, 0]),
    ]
    inits = [numpy_helper.from_array(a, n) for a, n in (
        (w, "w"), (b, "b"), (dw, "dw"), (db, "db"), (np.array([], np.float32), "roi"),
        (np.array([1, 1, 2, 2], np.float32), "scales"))]
    graph = helper.make_graph(
        nodes, "upsampler",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("up", TensorProto.FLOAT, ["N", 4, 16, 16]),
         helper.make_tensor_value_info("deconv", TensorProto.FLOAT, ["N", 2, 16, 16])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="squish-tests")

    def reference(x):
        r = np.maximum(np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0]) + b[None, :, None, None], 0)
        up = r.repeat(2, axis=2).repeat(2, axis=3)
        deconv = np.einsum("nchw,coab->nohawb", r, dw).reshape(x.shape[0], 2, 16, 16)
        return up, deconv + db[None, :, None, None]

    return model.SerializeToString(), reference


def yolo_detector(hw=32, anchors=16, rows=None):
    """A YOLOv8-style detector whose detections are fixed: one output
    "output0" [N, 4 + 2, anchors] (centre x, centre y, width, height in
    input pixels, then the scores of classes 0 and 1), made by a head of
    zero weights (its bias the table) over a tiny conv. rows maps an anchor
    to its six numbers; the other anchors score 0.01 for both classes.
    Default: anchor 3 a class-1 box centred (16, 12), 16 x 8, scored 0.9;
    anchor 7 the same box, class 1, 0.6 (NMS drops it); anchor 10 a class-0
    box centred (8, 24), 8 x 8, scored 0.8."""
    if rows is None:
        rows = {3: [16, 12, 16, 8, 0.05, 0.9], 7: [16.5, 12, 16, 8, 0.05, 0.6],
                10: [8, 24, 8, 8, 0.8, 0.1]}
    table = np.zeros((6, anchors), np.float32)
    table[0:4, :] = [[hw / 2], [hw / 2], [2], [2]]
    table[4:6, :] = 0.01
    for a, v in rows.items():
        table[:, a] = v
    rw = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rw.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.1, "cw"),
        numpy_helper.from_array(np.zeros((6 * anchors, 4), np.float32), "hw"),
        numpy_helper.from_array(table.reshape(-1), "hb"),
        numpy_helper.from_array(np.array([0, 6, anchors], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "cw"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "hw", "hb"], ["head"], transB=1),
        helper.make_node("Reshape", ["head", "shape"], ["output0"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny_yolo",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, hw, hw])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["N", 6, anchors])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="squish-tests")
    return model.SerializeToString()


def segmenter(hw=16):
    """A segmenter whose class map is fixed: output "out" [N, 3, hw, hw],
    a 1x1 conv of zero weights plus a constant map: class 2 on the left
    half, class 1 on the top right quarter, class 0 on the bottom right
    one (shares 0.5, 0.25, 0.25)."""
    m = np.zeros((1, 3, hw, hw), np.float32)
    h = hw // 2
    m[0, 2, :, :h] = 3
    m[0, 1, :h, h:] = 2
    m[0, 0, h:, h:] = 1
    inits = [
        numpy_helper.from_array(np.zeros((3, 3, 1, 1), np.float32), "w"),
        numpy_helper.from_array(m, "map"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["z"]),
        helper.make_node("Add", ["z", "map"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny_segmenter",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, hw, hw])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3, hw, hw])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="squish-tests")
    return model.SerializeToString()
