"""Answers as Triton's own clients parse them, on the real squishd: every
field that Triton's C++ client (triton-inference-server/client,
src/c++/library/http_client.cc) and perf_analyzer
(triton-inference-server/perf_analyzer, src/model_parser.cc and
src/client_backend/triton/triton_client_backend.cc) read from the
statistics, model config, model and server metadata, shared-memory status
and inference answers, with the JSON type they read it as (rapidjson's
GetUint64 and GetString, TritonJson's MemberAsUInt: a field of another
type, or none, aborts a debug build and is garbage in a release one).
One check per field, each named by its path."""

import json
import struct
from multiprocessing import shared_memory

from harness import Squishd, eventually, run, test, validate

ITEM = 3 * 16 * 16
# l(b) = 0.5 b + 2 ms: l(1) = 2.5 ms. "inc" has a default SLO, "free" none.
INC = {"name": "inc", "profile": {"alpha_ms": 0.5, "beta_ms": 2}, "max_batch": 16,
       "input": {"shape": [3, 16, 16]}, "num_classes": 5, "default_slo_ms": 50}
FREE = {"name": "free", "profile": {"batch": [1, 2, 4, 8], "latency_ms": [2, 3, 4, 6]},
        "input": {"shape": [3, 16, 16]}, "num_classes": 5}
JSON = {"Content-Type": "application/json"}


def admin(s):
    return {"Authorization": "Bearer " + s.token, "Content-Type": "application/json"}


def server():
    s = Squishd(workers="emu:1")
    s.wait_ready(workers=1, timeout=60)
    for m in (INC, FREE):
        r = s.request("POST", "/models", body=json.dumps(m), headers=admin(s))
        assert r.status == 201, r
        eventually(lambda: s.get("/v2/models/%s/ready" % m["name"]).status == 200, 30,
                   m["name"] + " ready")
    return s


def infer(s, body, model="inc"):
    return s.request("POST", "/v2/models/%s/infer" % model, body=json.dumps(body).encode(),
                     headers=JSON)


def at(obj, path):
    for key in path.split("."):
        assert isinstance(obj, dict) and key in obj, "no %s (at %r)" % (path, key)
        obj = obj[key]
    return obj


def is_uint(v):
    """rapidjson's IsUint64 (bool is not a number in JSON)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check(obj, path, kind, failures):
    try:
        v = at(obj, path)
    except AssertionError as e:
        failures.append(str(e))
        return
    ok = {"uint": is_uint, "string": lambda x: isinstance(x, str),
          "object": lambda x: isinstance(x, dict), "array": lambda x: isinstance(x, list),
          "bool": lambda x: isinstance(x, bool)}[kind](v)
    if not ok:
        failures.append("%s: %r is not a %s" % (path, v, kind))


DURATIONS = ["success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
             "cache_hit", "cache_miss"]
# perf_analyzer's TritonClientBackend::ParseStatistics (HTTP), field by
# field, plus the rest of Triton's model_stats entry (core's
# TRITONSERVER_ServerModelStatistics).
STAT_FIELDS = [("name", "string"), ("version", "string"), ("last_inference", "uint"),
               ("inference_count", "uint"), ("execution_count", "uint"),
               ("inference_stats", "object"), ("response_stats", "object"),
               ("batch_stats", "array"), ("memory_usage", "array")] + \
    [("inference_stats.%s.%s" % (d, f), "uint") for d in DURATIONS for f in ("count", "ns")]


@test
def statistics_carry_every_field_perf_analyzer_reads():
    s = server()
    try:
        body = {"inputs": [{"name": "input", "shape": [2, 3, 16, 16], "datatype": "FP32",
                            "data": [0.5] * (2 * ITEM)}]}
        inp = s.get("/v2/models/inc").json["inputs"][0]["name"]
        body["inputs"][0]["name"] = inp
        for _ in range(3):
            assert infer(s, body).status == 200
        for path in ("/v2/models/inc/stats", "/v2/models/stats", "/v2/models/inc/versions/1/stats"):
            r = s.get(path, schema_name="model_stats")
            assert r.status == 200, r
            for st in r.json["model_stats"]:
                failures = []
                for field, kind in STAT_FIELDS:
                    check(st, field, kind, failures)
                for b in st["batch_stats"]:
                    check(b, "batch_size", "uint", failures)
                    for d in ("compute_input", "compute_infer", "compute_output"):
                        check(b, d + ".count", "uint", failures)
                        check(b, d + ".ns", "uint", failures)
                assert not failures, (path, st["name"], failures)
                # No response cache: Triton's zeros. No per-response or
                # memory statistics: Triton's empty ones.
                assert st["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}, st
                assert st["inference_stats"]["cache_miss"] == {"count": 0, "ns": 0}, st
                assert st["response_stats"] == {} and st["memory_usage"] == [], st
        st = s.get("/v2/models/inc/stats").json["model_stats"][0]
        assert st["inference_count"] == 6 and st["inference_stats"]["success"]["count"] == 3, st
        assert st["execution_count"] >= 1 and st["batch_stats"], st
        s.stop()
    finally:
        s.cleanup()


def plan_batches(s, name):
    plan = s.get("/v1/plan").json
    return sorted({x["batch"] for d in plan.get("devices", []) for x in d["sessions"]
                   if x.get("model") == name and x.get("version") == 1})


@test
def the_config_has_dynamic_batching_as_squish_batches():
    s = server()
    try:
        for name in ("inc", "free"):
            r = s.get("/v2/models/%s/config" % name, schema_name="model_config")
            assert r.status == 200, r
            failures = []
            # What perf_analyzer's ModelParser reads, then Triton's
            # ModelDynamicBatching as its ModelConfigToJson writes it.
            check(r.json, "max_batch_size", "uint", failures)
            check(r.json, "dynamic_batching", "object", failures)
            check(r.json, "dynamic_batching.preferred_batch_size", "array", failures)
            check(r.json, "dynamic_batching.max_queue_delay_microseconds", "uint", failures)
            check(r.json, "dynamic_batching.preserve_ordering", "bool", failures)
            check(r.json, "dynamic_batching.priority_levels", "uint", failures)
            check(r.json, "dynamic_batching.default_priority_level", "uint", failures)
            check(r.json, "dynamic_batching.priority_queue_policy", "object", failures)
            assert not failures, (name, failures)
            db = r.json["dynamic_batching"]
            assert all(is_uint(b) and b >= 1 for b in db["preferred_batch_size"]), db
            assert db["priority_levels"] == 4 and db["default_priority_level"] == 2, db
            assert db["preserve_ordering"] is False and db["priority_queue_policy"] == {}, db
        # The queue delay its policy allows a request that names no SLO:
        # the SLO (50 ms) less l(1) (2.5 ms) and the dispatch margin (the
        # harness's 10 ms). Without an SLO (best effort): 0.
        db = s.get("/v2/models/inc/config").json["dynamic_batching"]
        assert db["max_queue_delay_microseconds"] == 50000 - 2500 - 10000, db
        db = s.get("/v2/models/free/config").json["dynamic_batching"]
        assert db["max_queue_delay_microseconds"] == 0, db

        # Preferred sizes: the plan's batch for each session of the model;
        # with the model in no plan, its measured sizes (a table: 1, 2, 4,
        # 8; a linear profile has none: any size up to max_batch_size).
        def consistent(name, measured):
            before = plan_batches(s, name)
            got = s.get("/v2/models/%s/config" % name).json["dynamic_batching"][
                "preferred_batch_size"]
            after = plan_batches(s, name)
            return before == after and got == (before or measured)

        eventually(lambda: consistent("free", [1, 2, 4, 8]), 10, "free's sizes")
        eventually(lambda: consistent("inc", []), 10, "inc's sizes")
        body = {"inputs": [{"name": s.get("/v2/models/inc").json["inputs"][0]["name"],
                            "shape": [1, 3, 16, 16], "datatype": "FP32", "data": [0.0] * ITEM}]}
        for _ in range(5):
            assert infer(s, body).status == 200
        planned = eventually(lambda: plan_batches(s, "inc"), 30, "inc planned")
        eventually(lambda: consistent("inc", []) and plan_batches(s, "inc"), 10,
                   "inc's planned sizes")
        assert planned, planned
        s.stop()
    finally:
        s.cleanup()


@test
def metadata_and_config_agree_as_perf_analyzer_reads_them():
    s = server()
    try:
        r = s.get("/v2", schema_name="server_metadata")
        assert all(isinstance(e, str) for e in r.json["extensions"]), r
        for name in ("inc", "free"):
            meta = s.get("/v2/models/" + name).json
            cfg = s.get("/v2/models/%s/config" % name).json
            failures = []
            check(meta, "name", "string", failures)
            for side in ("inputs", "outputs"):
                for i, t in enumerate(meta[side]):
                    check(t, "name", "string", failures)
                    check(t, "datatype", "string", failures)
                    check(t, "shape", "array", failures)
                    if not all(isinstance(d, int) for d in t["shape"]):
                        failures.append("%s[%d].shape: %r" % (side, i, t["shape"]))
                    # With max_batch_size > 0 the first dimension is the batch's.
                    if t["shape"][:1] != [-1]:
                        failures.append("%s[%d].shape: %r has no -1 first" % (side, i, t["shape"]))
            assert not failures, (name, failures)
            # ModelParser: each config input and output must be in the
            # metadata ("no metadata found for input tensor").
            assert {t["name"] for t in cfg["input"]} <= {t["name"] for t in meta["inputs"]}
            assert {t["name"] for t in cfg["output"]} <= {t["name"] for t in meta["outputs"]}
            assert cfg["max_batch_size"] >= 1 and "sequence_batching" not in cfg, cfg
        s.stop()
    finally:
        s.cleanup()


def cpp_client_outputs(r):
    """InferResultHttp's parse (http_client.cc): an output with
    "parameters" is binary and must carry binary_data_size (MemberAsUInt);
    else one with "data" is JSON; else (an output in shared memory) nothing
    is read. Returns {name: (kind, bytes or None)}."""
    header_len = r.headers.get("inference-header-content-length")
    body = r.raw
    header = json.loads(body[:int(header_len)] if header_len else body)
    offset = int(header_len) if header_len else 0
    assert isinstance(header["model_name"], str) and isinstance(header["model_version"], str)
    out = {}
    for o in header["outputs"]:
        assert isinstance(o["name"], str) and isinstance(o["datatype"], str), o
        assert all(is_uint(d) for d in o["shape"]), o
        if "parameters" in o:
            size = o["parameters"].get("binary_data_size")
            assert is_uint(size), ("an output with parameters needs binary_data_size", o)
            out[o["name"]] = ("binary", body[offset:offset + size])
            offset += size
        elif "data" in o:
            out[o["name"]] = ("json", o["data"])
        else:
            out[o["name"]] = ("shm", None)
    return out


@test
def infer_answers_parse_as_tritons_cpp_client_reads_them():
    s = server()
    shm = shared_memory.SharedMemory(create=True, size=4096)
    try:
        inp = s.get("/v2/models/inc").json["inputs"][0]["name"]
        out = s.get("/v2/models/inc").json["outputs"][0]["name"]
        data = [float(i % 7) for i in range(2 * ITEM)]
        base = {"inputs": [{"name": inp, "shape": [2, 3, 16, 16], "datatype": "FP32",
                            "data": data}]}
        r = infer(s, base)
        assert r.status == 200 and cpp_client_outputs(r)[out][0] == "json", r
        want = r.json["outputs"][0]["data"]
        r = infer(s, dict(base, outputs=[{"name": out, "parameters": {"binary_data": True}}]))
        kind, raw = cpp_client_outputs(r)[out]
        assert kind == "binary" and list(struct.unpack("<10f", raw)) == \
            [struct.unpack("<f", struct.pack("<f", v))[0] for v in want], (kind, raw, want)
        r = infer(s, dict(base, outputs=[{"name": out, "parameters": {"classification": 2,
                                                                      "binary_data": True}}]))
        assert cpp_client_outputs(r)[out][0] == "binary", r
        # An output in shared memory: neither data nor parameters (Triton's
        # answer); the client reads it from the region it named.
        r = s.request("POST", "/v2/systemsharedmemory/region/out/register",
                      body=json.dumps({"key": "/" + shm.name, "byte_size": 4096}),
                      headers=admin(s))
        assert r.status == 200, r
        st = s.request("GET", "/v2/systemsharedmemory/status",
                       headers={"Authorization": "Bearer " + s.token})
        assert st.status == 200, st
        validate(st.json, "shm_status")
        failures = []
        for e in st.json:
            for field, kind in (("name", "string"), ("key", "string"), ("offset", "uint"),
                                ("byte_size", "uint")):
                check(e, field, kind, failures)
        assert not failures and st.json, (failures, st.json)
        r = infer(s, dict(base, outputs=[{"name": out, "parameters": {
            "shared_memory_region": "out", "shared_memory_byte_size": 40}}]))
        assert r.status == 200, r
        validate(r.json, "oip_infer_response")
        assert cpp_client_outputs(r)[out] == ("shm", None), r.json
        assert r.json["outputs"][0] == {"name": out, "datatype": "FP32", "shape": [2, 5]}, r.json
        assert list(struct.unpack("<10f", bytes(shm.buf[:40]))) == \
            [struct.unpack("<f", struct.pack("<f", v))[0] for v in want]
        s.stop()
    finally:
        shm.close()
        shm.unlink()
        s.cleanup()


if __name__ == "__main__":
    run()
