"""Big models load with the default heartbeats: a 500 MB ONNX model
(a VGG-sized fully connected layer behind a small conv) is uploaded,
sent to the cpu worker, imported, planned and measured while squishd
pings the worker every 200 ms and kills it after 1000 ms of silence
(the defaults). Before the worker answered while it received and squishd
went on while it sent, such a model never loaded: the worker was killed
and the load started over, again and again."""

import http.client
import json
import os
import tempfile
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from harness import Squishd, eventually, run, test

# A Gemm weight of HIDDEN x FEATURES floats: 12 x 32 x 32 features after the
# conv, 10240 hidden units: 503 MB in a 504 MB file.
CONV_CHANNELS = 12
HW = 32
FEATURES = CONV_CHANNELS * HW * HW
HIDDEN = 10240
CLASSES = 10


def _varint(n):
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def write_big_model(f, seed=7):
    """Writes the ONNX file to f and returns its weights (for the expected
    answer). The big initializer's raw_data is written straight from the
    array: python's protobuf never holds (or copies) the 500 MB."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((CONV_CHANNELS, 3, 3, 3)) * 0.2).astype(np.float32)
    b1 = (rng.standard_normal((CONV_CHANNELS,)) * 0.1).astype(np.float32)
    big = np.frombuffer(rng.bytes(HIDDEN * FEATURES), np.int8).astype(np.float32)
    big *= 1.0 / (128 * np.sqrt(FEATURES))
    big = big.reshape(HIDDEN, FEATURES)
    fc_w = (rng.standard_normal((CLASSES, HIDDEN)) * 0.03).astype(np.float32)
    fc_b = (rng.standard_normal((CLASSES,)) * 0.1).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
             numpy_helper.from_array(np.zeros((HIDDEN,), np.float32), "big_b"),
             numpy_helper.from_array(fc_w, "fc_w"), numpy_helper.from_array(fc_b, "fc_b")]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Flatten", ["r1"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "big_w", "big_b"], ["hidden"], transB=1),
        helper.make_node("Relu", ["hidden"], ["rh"]),
        helper.make_node("Gemm", ["rh", "fc_w", "fc_b"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "big",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, HW, HW])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    graph_bytes = model.graph.SerializeToString()
    model.ClearField("graph")
    head = model.SerializeToString()
    # TensorProto big_w: dims, data_type, name, then raw_data (field 9).
    tensor = TensorProto(name="big_w", data_type=TensorProto.FLOAT,
                         dims=big.shape).SerializeToString()
    tensor += b"\x4a" + _varint(big.nbytes)
    # GraphProto.initializer (field 5), ModelProto.graph (field 7).
    graph_bytes += b"\x2a" + _varint(len(tensor) + big.nbytes) + tensor
    graph_len = len(graph_bytes) + big.nbytes
    f.write(head + b"\x3a" + _varint(graph_len) + graph_bytes)
    big.tofile(f)
    return w1, b1, big, fc_w, fc_b


def expected_logits(x, w1, b1, big, fc_w, fc_b):
    """The model on one image x (3 x HW x HW), in numpy."""
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1)))
    conv = np.zeros((CONV_CHANNELS, HW, HW), np.float64)
    for dy in range(3):
        for dx in range(3):
            window = padded[:, dy:dy + HW, dx:dx + HW]
            conv += np.einsum("oc,chw->ohw", w1[:, :, dy, dx], window)
    conv = np.maximum(conv + b1[:, None, None], 0)
    hidden = np.maximum(big @ conv.reshape(-1).astype(np.float32), 0)
    return fc_w @ hidden + fc_b


def peak_rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    return -1


def restarts(s):
    total = 0.0
    for line in s.get("/metrics").raw.decode().splitlines():
        if line.startswith("squish_worker_restarts_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@test
def a_500_mb_model_loads_with_default_heartbeats_and_answers():
    boundary = "squishbigmodel"
    x = np.random.default_rng(3).standard_normal((3, HW, HW)).astype(np.float32)
    with tempfile.TemporaryFile(prefix="squish-big-") as body:
        body.write(("--%s\r\nContent-Disposition: form-data; name=\"config\"\r\n\r\n"
                    % boundary).encode())
        # max_batch 1: one plan, and the profile measures one batch size.
        body.write(json.dumps({"name": "big", "max_batch": 1, "default_slo_ms": 5000}).encode())
        body.write(("\r\n--%s\r\nContent-Disposition: form-data; name=\"model\"; "
                    "filename=\"big.onnx\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                    % boundary).encode())
        start = body.tell()
        weights = write_big_model(body)
        model_bytes = body.tell() - start
        body.write(("\r\n--%s--\r\n" % boundary).encode())
        want = expected_logits(x, *weights)
        del weights
        assert model_bytes > 500 * 1000 * 1000, model_bytes

        s = Squishd(workers="cpu:1")  # default --heartbeat-ms and --heartbeat-timeout-ms
        try:
            s.wait_ready(workers=1, timeout=30)
            pid = s.worker_pids()["cpu"]
            body.seek(0)

            def chunks():  # 4 MB a write (http.client sends a file 8 KB at a time)
                while True:
                    b = body.read(4 << 20)
                    if not b:
                        return
                    yield b

            r = s.request("POST", "/models", body=chunks(),
                          headers={"Content-Type": "multipart/form-data; boundary=" + boundary,
                                   "Content-Length": str(os.fstat(body.fileno()).st_size),
                                   "Authorization": "Bearer " + s.token},
                          schema_name="model_record", timeout=300)
            assert r.status == 202, r
            body.close()

            def ready():
                v = s.get("/models/big", headers={"Authorization": "Bearer " + s.token},
                          timeout=60).json["versions"][0]
                assert v["status"] != "failed", v
                return v["status"] == "ready" or None

            eventually(ready, 240, "the 500 MB model measured", step=0.5)
            req = {"inputs": [{"name": "input", "shape": [1, 3, HW, HW], "datatype": "FP32",
                               "data": x.reshape(-1).tolist()}],
                   "parameters": {"slo_ms": 5000}}
            r = s.request("POST", "/v2/models/big/infer", body=json.dumps(req),
                          headers={"Content-Type": "application/json"},
                          schema_name="oip_infer_response", timeout=60)
            assert r.status == 200, r
            got = np.array(r.json["outputs"][0]["data"], np.float64)
            assert got.shape == (CLASSES,), got
            assert np.allclose(got, want, rtol=1e-3, atol=1e-3), (got, want)

            # Loaded once, by the worker that was there from the start.
            log = s.read_log()
            assert "heartbeat_timeout" not in log, "a worker missed its heartbeats"
            assert restarts(s) == 0, "the worker was restarted"
            assert s.worker_pids().get("cpu") == pid
            assert log.count("model file received") == 1, "the file was sent more than once"
            print("# peak RSS: squishd %d MB, worker %d MB"
                  % (peak_rss_mb(s.proc.pid), peak_rss_mb(pid)), flush=True)
            assert s.stop() == 0
        finally:
            s.cleanup()


if __name__ == "__main__":
    run()
