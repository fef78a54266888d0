#!/usr/bin/python3
"""Writes the generated seed inputs of the fuzz targets (binary ones, too
large or too tied to a library version to check in) into OUT/<target>/:

  ipc          one stream per message type plus mixed and broken streams,
               encoded as common/ipc.c and common/msgs.c encode them
  onnx_import  the tiny conv nets of tests/integration/tiny_models.py and
               the libonnx-testdata node models of the ops modeldb knows
  jpeg         small JPEGs: RGB, gray, CMYK, progressive, odd sizes
  cluster      a remote worker's handshake and batch frames (fuzz_cluster.c)
  front_frames FE_CATALOG, FE_STATE and FE_METRICS payloads, encoded as
               gateway/codec/front_frames.c encodes them

Usage: seeds.py OUT [target...]   (Debian's /usr/bin/python3: onnx, PIL)"""

import io
import os
import re
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# ---- ipc: mirrors common/sq_ipc.h ------------------------------------------

MSG = {"HELLO": 1, "WELCOME": 2, "PING": 3, "PONG": 4, "SHUTDOWN": 5, "ERROR": 6,
       "MODEL_LOAD": 10, "MODEL_CHUNK": 11, "MODEL_LOADED": 12, "MODEL_FAILED": 13,
       "MODEL_UNLOAD": 14, "BATCH": 20, "BATCH_DONE": 21, "BATCH_INPUT": 22,
       "BATCH_OUTPUT": 23, "PROFILE": 30, "PROFILE_PROGRESS": 31, "PROFILE_DONE": 32,
       "AUTH_CHALLENGE": 40, "AUTH_REPLY": 41, "AUTH_PROOF": 42, "MODELS_HELD": 43}


def u8(v): return struct.pack("<B", v)
def u16(v): return struct.pack("<H", v)
def u32(v): return struct.pack("<I", v & 0xffffffff)
def u64(v): return struct.pack("<Q", v)
def f64(v): return struct.pack("<d", v)
def s(v): return u32(len(v)) + v.encode()


def frame(name, payload, fid=0, flags=0, length=None):
    n = len(payload) if length is None else length
    return u32(n) + u16(MSG[name]) + u16(flags) + u64(fid) + payload


def ipc_seeds():
    hello = u32(0x48535153) + u16(1) + s("cpu") + s("cpu") + u64(8 << 30) + u32(4242)
    welcome = u16(1) + u32(3) + u32(250) + u64(64 << 20)
    error = u32(-22) + s("protocol version 2 is not supported")
    load_onnx = (s("ab" * 32) + u8(0) + u8(0) + u64(6000) + u32(16) +
                 b"".join(f64(m) + f64(sd) + u32(c) for m, sd, c in
                          ((123.7, 58.4, 3), (116.3, 57.1, 224), (103.5, 57.4, 224))) +
                 u8(1) + u8(2) + u32(0) + u32(0) + f64(0) + u32(0) +
                 u8(0) + u32(0) + u32(4))  # cache_only, no members, ready_batch
    load_emu = (s("") + u8(1) + u8(1) + u64(0) + u32(8) +
                b"".join(f64(0) + f64(1) + u32(c) for c in (3, 32, 32)) +
                u8(0) + u8(0) + u32(40) + u32(8) + f64(1.5) + u32(4) +
                b"".join(u64(1000 * (b + 1)) for b in range(4)) + u8(0) + u32(0) + u32(0))
    loaded = u64(50 << 20) + u32(32) + u64(3 * 224 * 224) + u64(1000) + u32(224) + u32(224)
    batch = u64(7) + u8(0) + u32(3) + u64(4096) + u64(4000) + u64(0) + u64(150528) + u64(301056)
    done = u32(0) + u64(1200000) + u64(1500000) + s("")
    failed = u32(-5) + u64(0) + u64(10) + s("out of device memory")
    req = u32(64) + u32(2) + u32(5) + u32(2000)
    prof = (u32(0) + s("") + u32(3) +
            b"".join(u32(b) + f64(100.0 * b) + f64(1.5) + u64(b << 20) for b in (1, 2, 4)) +
            u8(2) + f64(0.0125) + f64(0.0004))
    streams = {
        "hello": frame("HELLO", hello),
        "welcome": frame("WELCOME", welcome),
        "error": frame("ERROR", error),
        "model_load": frame("MODEL_LOAD", load_onnx, 1) + frame("MODEL_CHUNK", b"\x08\x07", 1),
        "model_load_emu": frame("MODEL_LOAD", load_emu, 2),
        "model_loaded": frame("MODEL_LOADED", loaded, 1),
        "batch": frame("BATCH", batch, 99),
        "batch_done": frame("BATCH_DONE", done, 99) + frame("BATCH_DONE", failed, 100),
        "profile": frame("PROFILE", req, 1) + frame("PROFILE_PROGRESS", u32(1) + u32(3), 1),
        "profile_done": frame("PROFILE_DONE", prof, 1),
        "models_held": frame("MODELS_HELD", u32(2) + s("ab" * 32) + s("0123456789abcdef" * 4)),
        "remote_batch": (frame("BATCH_INPUT", bytes(48), 9) + frame("BATCH", batch, 9) +
                         frame("BATCH_OUTPUT", bytes(64), 9) + frame("BATCH_DONE", done, 9)),
        "mixed": (frame("PING", b"") + frame("PONG", b"", 5) + frame("BATCH", batch, 1) +
                  frame("BATCH_DONE", done, 1) + frame("MODEL_UNLOAD", b"", 3) +
                  frame("SHUTDOWN", b"")),
        "truncated": frame("BATCH", batch, 1)[:-5],
        "oversized": frame("MODEL_CHUNK", b"x", 1, length=(16 << 20) + 1),
        "flags": frame("PING", b"", flags=1),
        "unknown": u32(0) + u16(99) + u16(0) + u64(0),
    }
    out = {}
    for name, data in streams.items():
        out[name] = u8(0) + data          # all at once
        out[name + ".split"] = u8(7) + data  # in 7-byte chunks
    return out


# ---- onnx_import -------------------------------------------------------------

ONNX_TESTDATA = "/usr/share/libonnx-testdata/data/node"
# Node tests of the ops modeldb imports (mdb_graph.h MDB_OPS), by test name.
ONNX_OPS = re.compile(r"^test_(conv|relu|clip|leakyrelu|sigmoid|hardsigmoid|hardswish|maxpool|"
                      r"averagepool|globalaveragepool|gemm|matmul|add|mul|sub|div|concat|"
                      r"flatten|reshape|transpose|softmax|pad|dropout|identity|reduce_mean|"
                      r"batchnorm|split|slice|constant|shape|gather|unsqueeze|squeeze|cast)")


def onnx_seeds():
    out = {}
    sys.path.insert(0, os.path.join(HERE, "..", "integration"))
    try:
        import tiny_models
        out["tiny.onnx"] = tiny_models.tiny(1)
        out["variant.onnx"] = tiny_models.variant(2, names="b")
        out["unsupported.onnx"] = tiny_models.unsupported()
    except ImportError as e:  # python3-onnx missing: testdata seeds only
        print("seeds: no tiny models (%s)" % e, file=sys.stderr)
    if os.path.isdir(ONNX_TESTDATA):
        for test in sorted(os.listdir(ONNX_TESTDATA)):
            path = os.path.join(ONNX_TESTDATA, test, "model.onnx")
            if ONNX_OPS.match(test) and os.path.isfile(path) and os.path.getsize(path) < 8192:
                with open(path, "rb") as f:
                    out[test + ".onnx"] = f.read()
    return out


# ---- jpeg --------------------------------------------------------------------

def jpeg_seeds():
    try:
        from PIL import Image
    except ImportError as e:
        print("seeds: no JPEG seeds (%s)" % e, file=sys.stderr)
        return {}
    out = {}
    def save(name, img, **kw):
        b = io.BytesIO()
        img.save(b, "JPEG", **kw)
        out[name] = b.getvalue()
    grad = Image.linear_gradient("L").resize((37, 23))
    rgb = Image.merge("RGB", (grad, grad.rotate(90), grad.transpose(Image.FLIP_LEFT_RIGHT)))
    save("rgb.jpg", rgb, quality=80)
    save("rgb420.jpg", rgb.resize((64, 48)), quality=50, subsampling=2)
    save("rgb444.jpg", rgb.resize((9, 70)), quality=95, subsampling=0)
    save("progressive.jpg", rgb.resize((120, 90)), quality=60, progressive=True)
    save("gray.jpg", grad, quality=70)
    save("cmyk.jpg", rgb.convert("CMYK").resize((17, 5)), quality=70)
    save("tiny.jpg", rgb.resize((1, 1)))
    return out


def cluster_seeds():
    """Byte 0 picks fuzz_cluster.c's path (0 before HELLO, 1 batch frames,
    2 the pure handshake)."""
    challenge = u32(0x48535153) + u16(1) + u8(1) + bytes(range(32))
    held = u32(2) + s("ab" * 32) + s("0123456789abcdef" * 4)
    hello = u32(0x48535153) + u16(3) + s("cpu") + s("cpu@h1") + u64(8 << 30) + u32(4242)
    done = u32(0) + u64(1000) + u64(2000) + s("")
    return {
        "before-hello": u8(0) + frame("AUTH_CHALLENGE", challenge) +
        frame("AUTH_PROOF", bytes(32)) + frame("MODELS_HELD", held) + frame("HELLO", hello),
        "no-token": u8(0) + frame("AUTH_CHALLENGE", challenge[:6] + u8(0) + challenge[7:]),
        "hello-first": u8(0) + frame("HELLO", hello),
        "outputs": u8(1) + frame("BATCH_OUTPUT", bytes(100), fid=7) +
        frame("BATCH_OUTPUT", bytes(92), fid=7) + frame("BATCH_DONE", done, fid=7),
        "short-outputs": u8(1) + frame("BATCH_OUTPUT", bytes(100), fid=7) +
        frame("BATCH_DONE", done, fid=7),
        "too-many-outputs": u8(1) + frame("BATCH_OUTPUT", bytes(300), fid=7),
        "handshake": u8(2) + challenge + bytes(64) + bytes(32),
    }


def front_frames_seeds():
    """Payloads of gateway/codec/gw_codec_fe.h's frames (fuzz_front_frames.c
    tries each under every type)."""
    kinds = 3  # SQ_DEV_KIND_COUNT: cpu, cuda, emu
    rec = '{"id":7,"name":"m","version":1,"format":"onnx"}'
    catalog = u32(2) + u64(7) + s(rec) + u64(9) + s(rec.replace("7", "9"))
    fleet = b"".join(u32(k + 1) + u32(k) + u64((-1 if k == 0 else 1000 * k) & 0xffffffffffffffff) for k in range(kinds))
    pipe = s('{"name":"p"}') + u8(0) + u32(2) + f64(10) + f64(10) + f64(20) + f64(30)
    table = (u64(7) + u8(0) + u8(0) + f64(0) + f64(0) + u32(8) + f64(1e6) + f64(0) + u32(2) +
             u32(1) + f64(1000) + f64(10) + u32(8) + f64(4000) + f64(40))
    linear = u64(9) + u8(2) + u8(1) + f64(100) + f64(900) + u32(16) + f64(0) + f64(0) + u32(0)
    state = (s("") + u32(3) + u8(1) + u8(0) + u32(kinds) + fleet + u32(2) + u64(7) + u64(9) +
             u32(1) + u64(11) + u32(1) + pipe + u32(2) + table + linear)
    metrics = (s("# TYPE x counter\nx 1\n") + u32(1) + s("m") + s("1") +
               s('{"name":"m","version":"1"}') + u32(1) + s("p") + s('{"queries":1}'))
    return {"catalog": catalog, "catalog-empty": u32(0), "state": state,
            "state-not-ready": s("no worker") + state[4:], "metrics": metrics,
            "huge-count": u32(0xffffffff) + u64(7)}


TARGETS = {"cluster": cluster_seeds, "front_frames": front_frames_seeds, "ipc": ipc_seeds, "onnx_import": onnx_seeds, "jpeg": jpeg_seeds}


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir, names = sys.argv[1], sys.argv[2:] or list(TARGETS)
    for name in names:
        if name not in TARGETS:
            continue  # a target whose seeds are all checked in
        d = os.path.join(outdir, name)
        os.makedirs(d, exist_ok=True)
        for fname, data in TARGETS[name]().items():
            with open(os.path.join(d, "seed-" + fname), "wb") as f:
                f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
