"""Triton's system shared-memory extension on the real squishd (issue 24):
regions registered, listed and unregistered with the admin token; an
inference whose input is in a region gives what the same tensor in the
body gives; an output asked for in a region is written there and answered
without data; every refusal says why; a region unregistered while a
request uses it stays mapped for that request; and the CUDA routes say
that squish has no CUDA IPC. The regions are POSIX shared-memory objects
made here with Python's multiprocessing.shared_memory, as Triton's client
(tritonclient.utils.shared_memory) makes them."""

import base64
import json
import re
import struct
import threading
from multiprocessing import shared_memory

from harness import Squishd, eventually, run, test, validate

PHOTO = open("/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg", "rb").read()
INC = {"name": "inc", "profile": {"alpha_ms": 0.5, "beta_ms": 2}, "max_batch": 16,
       "input": {"shape": [3, 16, 16]}, "num_classes": 5}
ITEM = 3 * 16 * 16
JSON = {"Content-Type": "application/json"}


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def admin(s):
    return dict(auth(s), **JSON)


def upload(s, config):
    r = s.request("POST", "/models", body=json.dumps(config), headers=admin(s))
    assert r.status == 201, r
    eventually(lambda: s.get("/v2/models/%s/ready" % config["name"]).status == 200, 30,
               config["name"] + " ready")


def server(*models):
    s = Squishd(workers="emu:1")
    s.wait_ready(workers=1, timeout=60)
    for m in models or (INC,):
        upload(s, m)
    return s


class Region:
    """A POSIX shared-memory object of size bytes (key "/psm_..."),
    unlinked on exit."""

    def __init__(self, size):
        self.shm = shared_memory.SharedMemory(create=True, size=size)
        self.key = "/" + self.shm.name
        self.buf = self.shm.buf

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.buf = None
        self.shm.close()
        self.shm.unlink()


def register(s, name, key, byte_size, offset=None, headers=None):
    body = {"key": key, "byte_size": byte_size}
    if offset is not None:
        body["offset"] = offset
    return s.request("POST", "/v2/systemsharedmemory/region/%s/register" % name,
                     body=json.dumps(body), headers=admin(s) if headers is None else headers)


def status(s, name=None):
    path = "/v2/systemsharedmemory%s/status" % ("" if name is None else "/region/" + name)
    return s.request("GET", path, headers=auth(s))


def infer(s, body, model="inc", header_len=None, binary=b""):
    headers = dict(JSON)
    data = json.dumps(body).encode()
    if header_len is not None:
        headers = {"Content-Type": "application/octet-stream",
                   "Inference-Header-Content-Length": str(len(data))}
        data += binary
    return s.request("POST", "/v2/models/%s/infer" % model, body=data, headers=headers)


def names(s, model="inc"):
    meta = s.get("/v2/models/" + model).json
    return meta["inputs"][0]["name"], [o["name"] for o in meta["outputs"]]


def tensor(batch, seed=0):
    return [float((i * 7 + seed) % 11) - 5.0 for i in range(batch * ITEM)]


def shm_input(name, shape, datatype, region, byte_size, offset=None):
    p = {"shared_memory_region": region, "shared_memory_byte_size": byte_size}
    if offset is not None:
        p["shared_memory_offset"] = offset
    return {"name": name, "shape": shape, "datatype": datatype, "parameters": p}


@test
def an_input_in_shared_memory_gives_what_the_body_gives():
    s = server()
    try:
        inp, outs = names(s)
        r = s.get("/v2", schema_name="server_metadata")
        assert "system_shared_memory" in r.json["extensions"], r
        values = tensor(2)
        raw = struct.pack("<%df" % len(values), *values)
        with Region(3 * 4096) as reg:
            # The region starts at 100 in the object (no page boundary), and
            # the tensor at 28 in the region.
            reg.buf[128:128 + len(raw)] = raw
            r = register(s, "in", reg.key, 2 * 4096, offset=100)
            assert r.status == 200, r
            validate(r.json, "shm_region")
            assert r.json == {"name": "in", "key": reg.key, "offset": 100,
                              "byte_size": 2 * 4096}, r
            r = infer(s, {"inputs": [shm_input(inp, [2, 3, 16, 16], "FP32", "in", len(raw), 28)]})
            assert r.status == 200, r
            validate(r.json, "oip_infer_response")
            from_shm = r.json["outputs"]
            # The same tensor as JSON and as Triton's binary data.
            r = infer(s, {"inputs": [{"name": inp, "shape": [2, 3, 16, 16], "datatype": "FP32",
                                      "data": values}]})
            assert r.status == 200 and r.json["outputs"] == from_shm, (r, from_shm)
            r = infer(s, {"inputs": [{"name": inp, "shape": [2, 3, 16, 16], "datatype": "FP32",
                                      "parameters": {"binary_data_size": len(raw)}}]},
                      header_len=True, binary=raw)
            assert r.status == 200 and r.json["outputs"] == from_shm, (r, from_shm)
            # Other inputs, other answers: the region's bytes are what is read.
            reg.buf[128:132] = struct.pack("<f", 1e6)
            r = infer(s, {"inputs": [shm_input(inp, [2, 3, 16, 16], "FP32", "in", len(raw), 28)]})
            assert r.status == 200 and r.json["outputs"] != from_shm, r

            # UINT8 and a JPEG (BYTES, as Triton's binary format: a 4-byte
            # little-endian length, then its bytes).
            u8 = bytes(i % 256 for i in range(ITEM))
            reg.buf[100:100 + ITEM] = u8
            r = infer(s, {"inputs": [shm_input(inp, [1, 3, 16, 16], "UINT8", "in", ITEM)]})
            assert r.status == 200, r
            r2 = infer(s, {"inputs": [{"name": inp, "shape": [1, 3, 16, 16], "datatype": "UINT8",
                                       "data": list(u8)}]})
            assert r2.status == 200 and r2.json["outputs"] == r.json["outputs"], (r, r2)
        with Region(len(PHOTO) + 4) as reg:
            element = struct.pack("<I", len(PHOTO)) + PHOTO
            reg.buf[:len(element)] = element
            assert register(s, "jpeg", reg.key, len(element)).status == 200
            r = infer(s, {"inputs": [shm_input(inp, [1], "BYTES", "jpeg", len(element))]})
            assert r.status == 200, r
            r2 = infer(s, {"inputs": [{"name": inp, "shape": [1], "datatype": "BYTES",
                                       "data": [base64.b64encode(PHOTO).decode()]}]})
            assert r2.status == 200 and r2.json["outputs"] == r.json["outputs"], (r, r2)
        s.stop()
    finally:
        s.cleanup()


@test
def an_output_in_shared_memory_is_written_there_and_answered_without_data():
    s = server()
    try:
        inp, outs = names(s)
        values = tensor(3, seed=4)
        body_input = {"name": inp, "shape": [3, 3, 16, 16], "datatype": "FP32", "data": values}
        want = infer(s, {"inputs": [body_input]}).json["outputs"][0]
        assert want["shape"] == [3, 5], want
        with Region(4096) as reg:
            assert register(s, "out", reg.key, 4096).status == 200
            r = infer(s, {"inputs": [body_input],
                          "outputs": [{"name": outs[0], "parameters": {
                              "binary_data": False, "shared_memory_region": "out",
                              "shared_memory_offset": 64, "shared_memory_byte_size": 60}}]})
            assert r.status == 200, r
            validate(r.json, "oip_infer_response")
            o = r.json["outputs"][0]
            # As Triton answers it: name, datatype and shape alone. Triton's
            # C++ client reads an output with "parameters" as binary data
            # and fails without binary_data_size.
            assert o == {"name": outs[0], "datatype": "FP32", "shape": [3, 5]}, o
            assert bytes(reg.buf[64:124]) == struct.pack("<15f", *want["data"]), want
            # With binary_data_output, the other outputs stay binary in the body.
            r = infer(s, {"inputs": [body_input], "parameters": {"binary_data_output": True},
                          "outputs": [{"name": outs[0], "parameters": {
                              "shared_memory_region": "out", "shared_memory_byte_size": 60}}]})
            assert r.status == 200 and "inference-header-content-length" not in r.headers, r
            # Too small for the output: refused before it runs.
            r = infer(s, {"inputs": [body_input],
                          "outputs": [{"name": outs[0], "parameters": {
                              "shared_memory_region": "out", "shared_memory_byte_size": 59}}]})
            assert r.status == 400 and "59 bytes cannot hold FP32 [3,5] (60 bytes)" in \
                r.json["error"], r
            # Past the region's end.
            r = infer(s, {"inputs": [body_input],
                          "outputs": [{"name": outs[0], "parameters": {
                              "shared_memory_region": "out", "shared_memory_offset": 4040,
                              "shared_memory_byte_size": 60}}]})
            assert r.status == 400 and "invalid offset + byte size for shared memory region " \
                "'out'" in r.json["error"], r
            # Not with classification (as Triton).
            r = infer(s, {"inputs": [body_input],
                          "outputs": [{"name": outs[0], "parameters": {
                              "classification": 2, "shared_memory_region": "out",
                              "shared_memory_byte_size": 60}}]})
            assert r.status == 400 and "classification" in r.json["error"], r
        s.stop()
    finally:
        s.cleanup()


@test
def status_lists_regions_and_every_route_needs_the_admin_token():
    s = server()
    try:
        with Region(8192) as reg:
            for name, off in (("b", 0), ("a", 4096)):
                assert register(s, name, reg.key, 4096, offset=off).status == 200
            r = status(s)
            assert r.status == 200, r
            validate(r.json, "shm_status")
            assert [e["name"] for e in r.json] == ["b", "a"], r
            assert r.json[1] == {"name": "a", "key": reg.key, "offset": 4096, "byte_size": 4096}
            r = status(s, "a")
            assert r.status == 200 and r.json == [{"name": "a", "key": reg.key, "offset": 4096,
                                                   "byte_size": 4096}], r
            r = status(s, "zz")
            assert r.status == 404 and "Unable to find system shared memory region: 'zz'" in \
                r.json["error"], r
            # Without the token (or with a wrong one): 401, nothing changed.
            for path, method in (("/v2/systemsharedmemory/status", "GET"),
                                 ("/v2/systemsharedmemory/region/a/status", "GET"),
                                 ("/v2/systemsharedmemory/region/c/register", "POST"),
                                 ("/v2/systemsharedmemory/region/a/unregister", "POST"),
                                 ("/v2/systemsharedmemory/unregister", "POST"),
                                 ("/v2/cudasharedmemory/status", "GET"),
                                 ("/v2/cudasharedmemory/unregister", "POST")):
                for h in ({}, {"Authorization": "Bearer nope"}):
                    body = json.dumps({"key": reg.key, "byte_size": 64}) if method == "POST" \
                        else None
                    r = s.request(method, path, body=body, headers=h)
                    assert r.status == 401, (path, h, r)
            assert [e["name"] for e in status(s).json] == ["b", "a"]
            # Inference with a registered region needs no token.
            inp, _ = names(s)
            r = infer(s, {"inputs": [shm_input(inp, [1, 3, 16, 16], "FP32", "a", ITEM * 4)]})
            assert r.status == 200, r
            assert s.request("POST", "/v2/systemsharedmemory/unregister",
                             headers=auth(s)).status == 200
        s.stop()
    finally:
        s.cleanup()


@test
def refusals_say_why_and_change_nothing():
    s = server()
    try:
        inp, _ = names(s)
        with Region(4096) as reg:
            assert register(s, "in", reg.key, 4096).status == 200
            bad = [
                # (name, body, what the error says)
                ("in", {"key": reg.key, "byte_size": 64},
                 "shared memory region 'in' is already registered"),
                ("x", {"key": "/squish-no-such-object", "byte_size": 64},
                 "no shared-memory object '/squish-no-such-object'"),
                ("x", {"key": "/", "byte_size": 64}, "invalid shm key '/'"),
                ("x", {"key": "/../etc/passwd", "byte_size": 64}, "invalid shm key"),
                ("x", {"key": reg.key, "byte_size": 4097},
                 "offset 0 + byte_size 4097 is past the end of '%s' (4096 bytes)" % reg.key),
                ("x", {"key": reg.key, "offset": 4000, "byte_size": 97},
                 "offset 4000 + byte_size 97 is past the end of"),
                ("x", {"key": reg.key, "byte_size": 0}, "byte_size: expected an integer >= 1"),
                ("x", {"key": reg.key, "byte_size": -1}, "byte_size: expected an integer >= 0"),
                ("x", {"key": reg.key}, "no 'byte_size' field"),
                ("x", {"byte_size": 64}, "no 'key' field"),
                ("x", {"key": 7, "byte_size": 64}, "key: expected"),
                ("a%20b", {"key": reg.key, "byte_size": 64}, "region name 'a b': expected"),
            ]
            for name, body, what in bad:
                r = s.request("POST", "/v2/systemsharedmemory/region/%s/register" % name,
                              body=json.dumps(body), headers=admin(s))
                assert r.status == 400 and what in r.json["error"], (name, body, r)
            r = s.request("POST", "/v2/systemsharedmemory/region/x/register", body=b"{nope",
                          headers=admin(s))
            assert r.status == 400 and "invalid JSON" in r.json["error"], r
            assert [e["name"] for e in status(s).json] == ["in"], "nothing registered"

            good = shm_input(inp, [1, 3, 16, 16], "FP32", "in", ITEM * 4)
            assert infer(s, {"inputs": [good]}).status == 200
            inference = [
                (shm_input(inp, [1, 3, 16, 16], "FP32", "in", ITEM * 4 - 4),
                 "inputs[0].parameters.shared_memory_byte_size: 3068 bytes, but FP32 "
                 "[1,3,16,16] takes 3072"),
                (shm_input(inp, [1, 3, 16, 16], "FP32", "nowhere", ITEM * 4),
                 "inputs[0].parameters.shared_memory_region: Unable to find shared memory "
                 "region: 'nowhere'"),
                (shm_input(inp, [1, 3, 16, 16], "FP32", "in", ITEM * 4, offset=4096),
                 "invalid offset for shared memory region 'in'"),
                (shm_input(inp, [1, 3, 16, 16], "FP32", "in", ITEM * 4, offset=1025),
                 "invalid offset + byte size for shared memory region 'in': 1025 + 3072 is "
                 "past its end (4096 bytes)"),
                (dict(good, data=[0.0] * ITEM), "set only one of data"),
                ({"name": inp, "shape": [1, 3, 16, 16], "datatype": "FP32",
                  "parameters": {"shared_memory_region": "in"}},
                 "shared_memory_byte_size: missing"),
                (shm_input(inp, [1], "BYTES", "in", 4096),
                 "inputs[0] (region \"in\"): element 0: empty image"),
            ]
            for tensor_in, what in inference:
                r = infer(s, {"inputs": [tensor_in]})
                assert r.status == 400 and what in r.json["error"], (tensor_in, r)
            # Unregistering a region never registered is no error (as Triton).
            r = s.request("POST", "/v2/systemsharedmemory/region/nowhere/unregister",
                          headers=auth(s))
            assert r.status == 200 and r.json == {"unregistered": []}, r
            validate(r.json, "shm_unregister")
            assert [e["name"] for e in status(s).json] == ["in"]
            assert s.request("POST", "/v2/systemsharedmemory/unregister",
                             headers=auth(s)).status == 200
        s.stop()
    finally:
        s.cleanup()


def inflight(s):
    r = s.get("/metrics")
    m = re.search(rb"^squish_inflight_requests (\d+)$", r.raw, re.M)
    return int(m.group(1)) if m else 0


@test
def unregistering_a_region_a_request_uses_keeps_it_mapped_for_that_request():
    slow = dict(INC, name="slow", profile={"alpha_ms": 1500, "beta_ms": 1})
    s = server(INC, slow)
    try:
        inp, outs = names(s, "slow")
        values = tensor(1, seed=2)
        raw = struct.pack("<%df" % len(values), *values)
        want = infer(s, {"inputs": [{"name": inp, "shape": [1, 3, 16, 16], "datatype": "FP32",
                                     "data": values}]}, model="slow")
        assert want.status == 200, want
        with Region(8192) as reg:
            reg.buf[:len(raw)] = raw
            assert register(s, "io", reg.key, 8192).status == 200
            answer = {}

            def send():
                answer["r"] = infer(s, {"inputs": [shm_input(inp, [1, 3, 16, 16], "FP32", "io",
                                                             len(raw))],
                                        "outputs": [{"name": outs[0], "parameters": {
                                            "shared_memory_region": "io",
                                            "shared_memory_offset": 4096,
                                            "shared_memory_byte_size": 20}}]}, model="slow")

            t = threading.Thread(target=send)
            t.start()
            # Admitted (its regions looked up, on the one HTTP loop) and not
            # answered: its batch runs for 1.5 s.
            eventually(lambda: inflight(s) == 1, 10, "the request in flight")
            r = s.request("POST", "/v2/systemsharedmemory/unregister", headers=auth(s))
            assert r.status == 200 and r.json == {"unregistered": ["io"]}, r
            assert status(s).json == []
            t.join(30)
            assert not t.is_alive()
            r = answer["r"]
            assert r.status == 200, r
            # Its output went into the region it held, unregistered meanwhile.
            assert bytes(reg.buf[4096:4116]) == \
                struct.pack("<5f", *want.json["outputs"][0]["data"]), want
            # A new request cannot name it; squishd is alive and serving.
            r = infer(s, {"inputs": [shm_input(inp, [1, 3, 16, 16], "FP32", "io", len(raw))]},
                      model="inc")
            assert r.status == 400 and "Unable to find shared memory region: 'io'" in \
                r.json["error"], r
            assert s.get("/v2/health/live").status == 200
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def unregister_all_and_the_cuda_routes():
    s = server()
    try:
        with Region(4096) as reg:
            for name in ("r1", "r2", "r3"):
                assert register(s, name, reg.key, 1024).status == 200
            r = s.request("POST", "/v2/systemsharedmemory/region/r2/unregister", headers=auth(s))
            assert r.status == 200 and r.json == {"unregistered": ["r2"]}, r
            assert [e["name"] for e in status(s).json] == ["r1", "r3"]
            # The name is free again.
            assert register(s, "r2", reg.key, 64).status == 200
            r = s.request("POST", "/v2/systemsharedmemory/unregister", headers=auth(s))
            assert r.status == 200 and sorted(r.json["unregistered"]) == ["r1", "r2", "r3"], r
            validate(r.json, "shm_unregister")
            assert status(s).json == []
            r = s.request("POST", "/v2/systemsharedmemory/unregister", headers=auth(s))
            assert r.status == 200 and r.json == {"unregistered": []}, r

            # CUDA shared memory: none, ever (Triton's client clears it at start).
            r = s.request("GET", "/v2/cudasharedmemory/status", headers=auth(s))
            assert r.status == 200 and r.json == [], r
            r = s.request("POST", "/v2/cudasharedmemory/unregister", headers=auth(s))
            assert r.status == 200 and r.json == {"unregistered": []}, r
            r = s.request("POST", "/v2/cudasharedmemory/region/g/unregister", headers=auth(s))
            assert r.status == 200, r
            raw_handle = {"b64": base64.b64encode(b"\0" * 64).decode()}
            r = s.request("POST", "/v2/cudasharedmemory/region/g/register",
                          body=json.dumps({"raw_handle": raw_handle, "device_id": 0,
                                           "byte_size": 64}), headers=admin(s))
            assert r.status == 400 and "does not support CUDA shared memory" in \
                r.json["error"] and "/v2/systemsharedmemory" in r.json["error"], r
            assert register(s, "sys", reg.key, 64).status == 200
            r = s.request("GET", "/v2/cudasharedmemory/region/sys/status", headers=auth(s))
            assert r.status == 404 and "registered as system shared memory" in \
                r.json["error"], r
            r = s.request("GET", "/v2/cudasharedmemory/region/g/status", headers=auth(s))
            assert r.status == 404 and "does not support CUDA shared memory" in \
                r.json["error"], r
        s.stop()
    finally:
        s.cleanup()


if __name__ == "__main__":
    run()
