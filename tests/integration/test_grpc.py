"""KServe v2 over gRPC (squishd --grpc-listen) on the real squishd, with the
project's own client: Debian's python3-grpcio and message classes built
from gateway/grpc/kserve_v2.proto (protoc-c's descriptor set of it, read
by python3-protobuf), as a Triton user's gRPC client would talk to it.
Each method is checked against what HTTP answers for the same question
(the same facts), and each error against the status Triton gives."""

import json
import os
import re
import socket
import struct
import subprocess
import tempfile
import threading
import time
from multiprocessing import shared_memory

import grpc
from google.protobuf import descriptor_pb2, message_factory

import tiny_models as tm
from harness import SOURCE, Squishd, eventually, run, test

SERVICE = "/inference.GRPCInferenceService/"
# l(b) = 0.5 b + 2 ms; "inc" has a default SLO, "free" none.
INC = {"name": "inc", "profile": {"alpha_ms": 0.5, "beta_ms": 2}, "max_batch": 16,
       "input": {"shape": [3, 16, 16]}, "num_classes": 5, "default_slo_ms": 50}
FREE = {"name": "free", "profile": {"batch": [1, 2, 4, 8], "latency_ms": [2, 3, 4, 6]},
        "input": {"shape": [3, 16, 16]}, "num_classes": 5}
# One row at a time, l(1) = 105 ms: a second call waits for the first.
SLOW = {"name": "slow", "profile": {"alpha_ms": 100.0, "beta_ms": 5.0}, "max_batch": 1,
        "input": {"shape": [3, 4, 4]}, "num_classes": 3}


def messages():
    """The proto's message classes by full name ("inference.X")."""
    out = tempfile.mkdtemp(prefix="squish-grpc-")
    desc = os.path.join(out, "kserve_v2.desc")
    proto_dir = os.path.join(SOURCE, "gateway", "grpc")
    subprocess.run(["protoc-c", "--proto_path=" + proto_dir, "--descriptor_set_out=" + desc,
                    os.path.join(proto_dir, "kserve_v2.proto")], check=True)
    fds = descriptor_pb2.FileDescriptorSet()
    with open(desc, "rb") as f:
        fds.ParseFromString(f.read())
    os.unlink(desc)
    os.rmdir(out)
    return message_factory.GetMessages(list(fds.file))


M = messages()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """A call per method: call(name, request fields) -> the answer."""

    def __init__(self, port):
        self.channel = grpc.insecure_channel("127.0.0.1:%d" % port)

    def call(self, method, req=None, metadata=None, **fields):
        req_cls = M["inference.%sRequest" % method]
        resp_cls = M["inference.%sResponse" % method]
        rpc = self.channel.unary_unary(SERVICE + method,
                                        request_serializer=req_cls.SerializeToString,
                                        response_deserializer=resp_cls.FromString)
        return rpc(req if req is not None else req_cls(**fields), timeout=20,
                    metadata=metadata)

    def error(self, method, metadata=None, **fields):
        """The status a call that must fail ends with: (code, details)."""
        try:
            r = self.call(method, metadata=metadata, **fields)
        except grpc.RpcError as e:
            return e.code(), e.details()
        raise AssertionError("%s(%r) answered %r, expected an error" % (method, fields, r))

    def close(self):
        self.channel.close()


def admin(s):
    return {"Authorization": "Bearer " + s.token, "Content-Type": "application/json"}


_server = None


def server():
    """One squishd for most checks (started once), with "inc" and "free"
    ready."""
    global _server
    if _server is not None:
        return _server
    # Port 0: squishd picks one and logs it (no race for a free port with
    # tests that run beside this one).
    s = Squishd(workers="emu:1", extra=["--grpc-listen", "127.0.0.1:0"])
    s.wait_ready(workers=1, timeout=60)
    s.grpc_port = int(eventually(
        lambda: re.search(r"grpc listening address=127\.0\.0\.1:0 port=(\d+)", s.read_log()),
        10, "the gRPC port in the log").group(1))
    assert s.grpc_port > 0
    for m in (INC, FREE, SLOW):
        r = s.request("POST", "/models", body=json.dumps(m), headers=admin(s))
        assert r.status == 201, r
        eventually(lambda: s.get("/v2/models/%s/ready" % m["name"]).status == 200, 30,
                   m["name"] + " ready")
    eventually(lambda: s.get("/v2/health/ready").status == 200, 30, "server ready")
    _server = s
    return s


def client(s=None):
    return Client((s or server()).grpc_port)


@test
def server_live_answers_live():
    c = client()
    assert c.call("ServerLive").live is True
    c.close()


@test
def server_ready_says_what_http_says():
    s = server()
    c = client(s)
    assert s.get("/v2/health/ready").status == 200
    assert c.call("ServerReady").ready is True
    c.close()


@test
def server_metadata_is_http_v2s():
    s = server()
    c = client(s)
    r = c.call("ServerMetadata")
    h = s.get("/v2").json
    assert r.name == h["name"] == "squish", (r, h)
    assert r.version == h["version"], (r, h)
    assert list(r.extensions) == h["extensions"], (r, h)
    c.close()


def tensors(ts):
    return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in ts]


@test
def model_metadata_is_https_field_by_field():
    s = server()
    c = client(s)
    for path, fields in (("/v2/models/inc", {"name": "inc"}),
                         ("/v2/models/inc/versions/1", {"name": "inc", "version": "1"}),
                         ("/v2/models/free", {"name": "free"})):
        h = s.get(path).json
        r = c.call("ModelMetadata", **fields)
        assert r.name == h["name"] and r.platform == h["platform"], (r, h)
        assert list(r.versions) == h["versions"], (r, h)
        assert tensors(r.inputs) == [{k: t[k] for k in ("name", "datatype", "shape")}
                                     for t in h["inputs"]], (r, h)
        assert tensors(r.outputs) == [{k: t[k] for k in ("name", "datatype", "shape")}
                                      for t in h["outputs"]], (r, h)
        assert r.inputs[0].shape[0] == -1 and r.inputs[0].datatype == "FP32", r
    c.close()


@test
def unknown_model_is_not_found_with_https_reason():
    s = server()
    c = client(s)
    h = s.get("/v2/models/nosuch").json
    for method in ("ModelMetadata", "ModelReady", "ModelConfig"):
        code, details = c.error(method, name="nosuch")
        assert code == grpc.StatusCode.NOT_FOUND, (method, code, details)
        assert "nosuch" in details, (method, details)
    code, details = c.error("ModelMetadata", name="nosuch")
    assert details == h["error"], (details, h)
    # A version the model does not have: not found, naming the versions it has.
    code, details = c.error("ModelMetadata", name="inc", version="7")
    assert code == grpc.StatusCode.NOT_FOUND and "no version 7" in details, (code, details)
    c.close()


@test
def malformed_request_is_invalid_argument():
    c = client()
    for method in ("ModelMetadata", "ModelReady", "ModelConfig"):
        code, details = c.error(method, name="inc", version="one")
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "version" in details, (method, code,
                                                                                    details)
        code, details = c.error(method, name="")
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "name" in details, (method, code,
                                                                                 details)
    # Bytes that are no ModelMetadataRequest (a field 1 of the wrong wire type).
    rpc = c.channel.unary_unary(SERVICE + "ModelMetadata", request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)
    try:
        rpc(b"\x0d\x01\x02", timeout=20)
        raise AssertionError("a garbled request was answered")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    code, details = c.error("RepositoryIndex", repository_name="elsewhere")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "repository_name" in details, details
    c.close()


@test
def model_ready_follows_unload_and_load():
    s = server()
    c = client(s)
    assert c.call("ModelReady", name="free").ready is True
    assert c.call("ModelReady", name="free", version="1").ready is True
    r = s.request("POST", "/v2/repository/models/free/unload", body="{}", headers=admin(s))
    assert r.status == 200, r
    eventually(lambda: s.get("/v2/models/free/ready").status == 400, 30, "free not ready")
    # Not ready is an answer (ready false, status OK), as Triton's.
    assert c.call("ModelReady", name="free").ready is False
    r = s.request("POST", "/v2/repository/models/free/load", body="{}", headers=admin(s))
    assert r.status == 200, r
    eventually(lambda: c.call("ModelReady", name="free").ready, 30, "free ready over gRPC")
    c.close()


@test
def repository_model_unload_and_load_are_https():
    """Unload and load over gRPC, as POST /v2/repository/models/{m}/unload
    and /load: HTTP sees the model go and come back."""
    s = server()
    c = client(s)
    md = [("authorization", "Bearer " + s.token)]
    code, details = c.error("RepositoryModelUnload", model_name="free")
    assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)
    c.call("RepositoryModelUnload", metadata=md, model_name="free")
    assert s.get("/v2/models/free/ready").status == 400
    assert c.call("ModelReady", name="free").ready is False
    # A load answers once the model is ready again, as HTTP's.
    c.call("RepositoryModelLoad", metadata=md, model_name="free")
    assert s.get("/v2/models/free/ready").status == 200
    h = s.request("POST", "/v2/repository/models/nosuch/load", body="{}", headers=admin(s))
    code, details = c.error("RepositoryModelLoad", metadata=md, model_name="nosuch")
    assert code == grpc.StatusCode.NOT_FOUND and h.status == 404 and "nosuch" in details, \
        (code, details, h)
    req = M["inference.RepositoryModelLoadRequest"](model_name="free")
    req.parameters["config"].string_param = "{}"
    code, details = c.error("RepositoryModelLoad", req=req, metadata=md)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "POST /models" in details, details
    req = M["inference.RepositoryModelUnloadRequest"](model_name="free")
    req.parameters["cascade"].bool_param = True
    code, details = c.error("RepositoryModelUnload", req=req, metadata=md)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "unload_dependents" in details, details
    assert s.get("/v2/models/free/ready").status == 200
    c.close()


@test
def model_config_has_what_http_config_has():
    s = server()
    c = client(s)
    h = s.get("/v2/models/inc/config").json
    r = c.call("ModelConfig", name="inc").config
    assert r.name == "inc" and r.platform == h["platform"], (r, h)
    assert r.max_batch_size == h["max_batch_size"] == 16, (r, h)
    dt = M["inference.ModelInput"].DESCRIPTOR.fields_by_name["data_type"].enum_type
    assert [(i.name, dt.values_by_number[i.data_type].name, list(i.dims)) for i in r.input] == \
        [(i["name"], i["data_type"], i["dims"]) for i in h["input"]], (r, h)
    assert [(o.name, dt.values_by_number[o.data_type].name, list(o.dims)) for o in r.output] == \
        [(o["name"], o["data_type"], o["dims"]) for o in h["output"]], (r, h)
    assert r.WhichOneof("scheduling_choice") == "dynamic_batching", r
    db, hdb = r.dynamic_batching, h["dynamic_batching"]
    assert list(db.preferred_batch_size) == hdb["preferred_batch_size"], (db, hdb)
    # The queue delay is read twice (HTTP, then gRPC): the same policy,
    # the same measured l(1), so the same value.
    assert db.max_queue_delay_microseconds == hdb["max_queue_delay_microseconds"], (db, hdb)
    assert db.priority_levels == hdb["priority_levels"] and \
        db.default_priority_level == hdb["default_priority_level"], (db, hdb)
    # squish's own facts, each as a parameter in its JSON text.
    p = {k: v.string_value for k, v in r.parameters.items()}
    assert json.loads(p["default_slo_ms"]) == h["default_slo_ms"] == 50, p
    assert p["status"] == h["status"] and p["precision"] == h["precision"], p
    assert json.loads(p["version"]) == h["version"], p
    assert json.loads(p["preprocessing"]) == h["preprocessing"], p
    c.close()


def duration(d):
    return {"count": d.count, "ns": d.ns}


def stats_rows(r):
    """ModelStatisticsResponse as the JSON of GET .../stats."""
    out = []
    for m in r.model_stats:
        st = m.inference_stats
        out.append({
            "name": m.name, "version": m.version, "last_inference": m.last_inference,
            "inference_count": m.inference_count, "execution_count": m.execution_count,
            "inference_stats": {k: duration(getattr(st, k)) for k in
                                ("success", "fail", "queue", "compute_input", "compute_infer",
                                 "compute_output", "cache_hit", "cache_miss")},
            "batch_stats": [{"batch_size": b.batch_size,
                             "compute_input": duration(b.compute_input),
                             "compute_infer": duration(b.compute_infer),
                             "compute_output": duration(b.compute_output)}
                            for b in m.batch_stats]})
    return out


def http_rows(h):
    keep = ("name", "version", "last_inference", "inference_count", "execution_count",
            "inference_stats", "batch_stats")
    return [{k: row[k] for k in keep} for row in h["model_stats"]]


@test
def model_statistics_are_https_field_by_field():
    s = server()
    c = client(s)
    name = s.get("/v2/models/inc").json["inputs"][0]["name"]
    body = {"inputs": [{"name": name, "shape": [2, 3, 16, 16], "datatype": "FP32",
                        "data": [0.5] * (2 * 3 * 16 * 16)}]}
    for _ in range(3):
        r = s.request("POST", "/v2/models/inc/infer", body=json.dumps(body),
                      headers={"Content-Type": "application/json"})
        assert r.status == 200, r
    for path, fields in (("/v2/models/inc/stats", {"name": "inc"}),
                         ("/v2/models/inc/versions/1/stats", {"name": "inc", "version": "1"}),
                         ("/v2/models/stats", {})):
        h = http_rows(s.get(path).json)
        g = stats_rows(c.call("ModelStatistics", **fields))
        assert g == h, (path, g, h)
    one = stats_rows(c.call("ModelStatistics", name="inc"))[0]
    assert one["inference_count"] >= 6 and one["inference_stats"]["success"]["count"] >= 3, one
    assert {r["name"] for r in stats_rows(c.call("ModelStatistics"))} >= {"inc", "free"}
    code, details = c.error("ModelStatistics", name="nosuch")
    assert code == grpc.StatusCode.NOT_FOUND and "nosuch" in details, (code, details)
    code, details = c.error("ModelStatistics", version="1")
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    c.close()


@test
def repository_index_is_https_rows():
    s = server()
    c = client(s)
    rows = lambda ms: [{k: v for k, v in (("name", m.name), ("version", m.version),
                                          ("state", m.state), ("reason", m.reason)) if v}
                       for m in ms]
    h = s.request("POST", "/v2/repository/index", body="{}").json
    assert rows(c.call("RepositoryIndex").models) == h, h
    h = s.request("POST", "/v2/repository/index", body='{"ready": true}').json
    assert rows(c.call("RepositoryIndex", ready=True).models) == h, h
    assert {m["name"] for m in h} >= {"inc", "free"}, h
    c.close()


@test
def admin_methods_need_the_admin_token():
    s = server()
    c = client(s)
    code, details = c.error("RepositoryModelUnload", model_name="inc")
    assert code == grpc.StatusCode.UNAUTHENTICATED and "authorization" in details, (code, details)
    code, details = c.error("RepositoryModelUnload", model_name="inc",
                            metadata=[("authorization", "Bearer " + "0" * 64)])
    assert code == grpc.StatusCode.UNAUTHENTICATED and "invalid" in details, (code, details)
    assert s.get("/v2/models/inc/ready").status == 200  # nothing was unloaded
    # With the token: past the check.
    r = c.call("CudaSharedMemoryStatus", metadata=[("authorization", "Bearer " + s.token)])
    assert len(r.regions) == 0, r
    # A blank before it, as perf_analyzer's -H "authorization: Bearer ..." sends.
    r = c.call("CudaSharedMemoryStatus", metadata=[("authorization", " Bearer " + s.token)])
    assert len(r.regions) == 0, r
    # What HTTP serves without a token, gRPC does too.
    assert c.call("ModelReady", name="inc").ready is True
    c.close()


@test
def system_shared_memory_is_https_regions():
    """Register, status and unregister over gRPC, seen by HTTP and back;
    each needs the admin token, as its route does."""
    s = server()
    c = client(s)
    tok = [("authorization", "Bearer " + s.token)]
    shm = shared_memory.SharedMemory(create=True, size=8192)
    key = "/" + shm.name
    try:
        for method in ("SystemSharedMemoryStatus", "SystemSharedMemoryUnregister"):
            code, details = c.error(method)
            assert code == grpc.StatusCode.UNAUTHENTICATED, (method, code, details)
        code, _ = c.error("SystemSharedMemoryRegister", name="g1", key=key, byte_size=1024)
        assert code == grpc.StatusCode.UNAUTHENTICATED
        c.call("SystemSharedMemoryRegister", metadata=tok, name="g1", key=key, offset=4096,
               byte_size=1024)
        h = s.get("/v2/systemsharedmemory/status", headers=admin(s)).json
        assert h == [{"name": "g1", "key": key, "offset": 4096, "byte_size": 1024}], h
        r = c.call("SystemSharedMemoryStatus", metadata=tok)
        got = {k: {"name": v.name, "key": v.key, "offset": v.offset, "byte_size": v.byte_size}
               for k, v in r.regions.items()}
        assert got == {"g1": h[0]}, got
        assert list(c.call("SystemSharedMemoryStatus", name="g1", metadata=tok).regions) == ["g1"]
        # HTTP's refusals, with Triton's codes.
        code, details = c.error("SystemSharedMemoryRegister", metadata=tok, name="g1", key=key,
                                byte_size=1024)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "g1" in details, (code, details)
        code, details = c.error("SystemSharedMemoryRegister", metadata=tok, name="g2", key=key,
                                offset=8000, byte_size=1024)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        code, details = c.error("SystemSharedMemoryRegister", metadata=tok, name="a/b", key=key,
                                byte_size=16)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "region name" in details, details
        code, details = c.error("SystemSharedMemoryStatus", metadata=tok, name="nosuch")
        assert code == grpc.StatusCode.NOT_FOUND and "nosuch" in details, (code, details)
        c.call("SystemSharedMemoryUnregister", metadata=tok, name="g1")
        assert s.get("/v2/systemsharedmemory/status", headers=admin(s)).json == []
        assert len(c.call("SystemSharedMemoryStatus", metadata=tok).regions) == 0
        # Unregistering what is not registered is no error (as Triton).
        c.call("SystemSharedMemoryUnregister", metadata=tok)
    finally:
        shm.close()
        shm.unlink()
        c.close()


@test
def cuda_shared_memory_answers_as_https_routes_without_cuda_ipc():
    """No region is ever registered (squish has no CUDA IPC): the status of
    every region is empty, one's is NOT_FOUND, a register INVALID_ARGUMENT,
    each with HTTP's message; an unregister is no error; each needs the
    admin token, as its route."""
    s = server()
    c = client(s)
    tok = [("authorization", "Bearer " + s.token)]
    for method in ("CudaSharedMemoryStatus", "CudaSharedMemoryUnregister"):
        code, _ = c.error(method)
        assert code == grpc.StatusCode.UNAUTHENTICATED, (method, code)
    code, _ = c.error("CudaSharedMemoryRegister", name="g0", byte_size=64)
    assert code == grpc.StatusCode.UNAUTHENTICATED, code
    assert s.get("/v2/cudasharedmemory/status", headers=admin(s)).json == []
    assert len(c.call("CudaSharedMemoryStatus", metadata=tok).regions) == 0
    h = s.get("/v2/cudasharedmemory/region/g0/status", headers=admin(s))
    code, details = c.error("CudaSharedMemoryStatus", metadata=tok, name="g0")
    assert h.status == 404 and code == grpc.StatusCode.NOT_FOUND, (h, code)
    assert details == h.json["error"], (details, h.json)
    h = s.request("POST", "/v2/cudasharedmemory/region/g0/register", headers=admin(s),
                  body=json.dumps({"raw_handle": {"b64": "AAAA"}, "device_id": 0,
                                   "byte_size": 64}))
    code, details = c.error("CudaSharedMemoryRegister", metadata=tok, name="g0",
                            raw_handle=b"\0" * 64, byte_size=64)
    assert h.status == 400 and code == grpc.StatusCode.INVALID_ARGUMENT, (h, code)
    assert details == h.json["error"] and "systemsharedmemory" in details, (details, h.json)
    code, details = c.error("CudaSharedMemoryRegister", metadata=tok, name="a/b", byte_size=64)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "region name" in details, details
    c.call("CudaSharedMemoryUnregister", metadata=tok)
    c.call("CudaSharedMemoryUnregister", metadata=tok, name="g0")
    c.close()


def trace_map(r):
    return {k: list(v.value) for k, v in r.settings.items()}


def trace_json(h):
    return {k: v if isinstance(v, list) else [v] for k, v in h.items() if v is not None}


@test
def trace_setting_is_https_settings():
    """TraceSetting reads and changes the settings /v2[/models/{m}]/trace/setting
    does (no setting given: a GET), refuses what it refuses with its
    message, and needs the admin token, as the route."""
    s = server()
    c = client(s)
    tok = [("authorization", "Bearer " + s.token)]
    code, _ = c.error("TraceSetting")
    assert code == grpc.StatusCode.UNAUTHENTICATED, code
    g = M["inference.TraceSettingRequest"]
    h = s.get("/v2/trace/setting", headers=admin(s)).json
    assert trace_map(c.call("TraceSetting", metadata=tok)) == trace_json(h), h
    # A model's own rate, then cleared (a setting without values).
    req = g(model_name="inc")
    req.settings["trace_rate"].value.append("7")
    r = c.call("TraceSetting", req=req, metadata=tok)
    h = s.get("/v2/models/inc/trace/setting", headers=admin(s)).json
    assert h["trace_rate"] == "7" and trace_map(r) == trace_json(h), (r, h)
    req = g(model_name="inc")
    req.settings["trace_rate"].SetInParent()
    r = c.call("TraceSetting", req=req, metadata=tok)
    h = s.get("/v2/models/inc/trace/setting", headers=admin(s)).json
    assert h["trace_rate"] == s.get("/v2/trace/setting", headers=admin(s)).json["trace_rate"]
    assert trace_map(r) == trace_json(h), (r, h)
    # HTTP's refusals, with its messages.
    req = g()
    req.settings["trace_rate"].value.append("often")
    code, details = c.error("TraceSetting", req=req, metadata=tok)
    hr = s.request("POST", "/v2/trace/setting", headers=admin(s),
                   body=json.dumps({"trace_rate": "often"}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and hr.status == 400, (code, hr)
    assert details == hr.json["error"], (details, hr.json)
    code, details = c.error("TraceSetting", metadata=tok, model_name="nosuch")
    assert code == grpc.StatusCode.NOT_FOUND and "no such model" in details, (code, details)
    assert trace_map(c.call("TraceSetting", metadata=tok)) == \
        trace_json(s.get("/v2/trace/setting", headers=admin(s)).json)
    c.close()


def log_map(r):
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in r.settings.items()}


@test
def log_settings_are_https_settings():
    """LogSettings reads and changes what /v2/logging does, each value of
    its kind (bool_param, uint32_param, string_param), refuses what it
    refuses with its message, and needs the admin token, as the route."""
    s = server()
    c = client(s)
    tok = [("authorization", "Bearer " + s.token)]
    code, _ = c.error("LogSettings")
    assert code == grpc.StatusCode.UNAUTHENTICATED, code
    h = s.get("/v2/logging", headers=admin(s)).json
    r = c.call("LogSettings", metadata=tok)
    assert log_map(r) == h, (log_map(r), h)
    assert r.settings["log_info"].WhichOneof("parameter_choice") == "bool_param"
    assert r.settings["log_verbose_level"].WhichOneof("parameter_choice") == "uint32_param"
    assert r.settings["log_format"].WhichOneof("parameter_choice") == "string_param"
    req = M["inference.LogSettingsRequest"]()
    req.settings["log_format"].string_param = "ISO8601"
    req.settings["log_warning"].bool_param = True
    r = c.call("LogSettings", req=req, metadata=tok)
    h = s.get("/v2/logging", headers=admin(s)).json
    assert h["log_format"] == "ISO8601" and log_map(r) == h, (log_map(r), h)
    req = M["inference.LogSettingsRequest"]()
    req.settings["log_format"].string_param = h0_format = "default"
    c.call("LogSettings", req=req, metadata=tok)
    assert s.get("/v2/logging", headers=admin(s)).json["log_format"] == h0_format
    # HTTP's refusals, with its messages; a refused change changes nothing.
    req = M["inference.LogSettingsRequest"]()
    req.settings["log_file"].string_param = "/tmp/x.log"
    req.settings["log_info"].bool_param = False
    code, details = c.error("LogSettings", req=req, metadata=tok)
    hr = s.request("POST", "/v2/logging", headers=admin(s),
                   body=json.dumps({"log_file": "/tmp/x.log"}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and hr.status == 400, (code, hr)
    assert details == hr.json["error"], (details, hr.json)
    assert s.get("/v2/logging", headers=admin(s)).json["log_info"] is True
    req = M["inference.LogSettingsRequest"]()
    req.settings["log_info"].uint32_param = 1
    code, details = c.error("LogSettings", req=req, metadata=tok)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "log_info" in details, (code, details)
    c.close()


@test
def unknown_methods_are_unimplemented_naming_those_served():
    c = client()
    rpc = c.channel.unary_unary(SERVICE + "NoSuchMethod", request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)
    try:
        rpc(b"", timeout=20)
        raise AssertionError("an unknown method was answered")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNIMPLEMENTED and "NoSuchMethod" in e.details(), e
        assert "LogSettings" in e.details() and "CudaSharedMemory{" in e.details(), e
    c.close()


# ---- ModelInfer ----

def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


def unf32(raw):
    return list(struct.unpack("<%df" % (len(raw) // 4), raw))


def as_f32(vals):
    """JSON numbers as the float32 they stand for."""
    return unf32(f32(vals))


def infer_input(name, shape, datatype, **contents):
    t = M["inference.ModelInferRequest"]().inputs.add(name=name, shape=shape, datatype=datatype)
    for k, v in contents.items():
        getattr(t.contents, k).extend(v)
    return t


def infer(c, model, inputs, raw=None, outputs=(), params=None, version="", id="", timeout=20,
          metadata=None):
    req = M["inference.ModelInferRequest"](model_name=model, model_version=version, id=id)
    req.inputs.extend(inputs)
    if raw is not None:
        req.raw_input_contents.extend(raw)
    for name, p in outputs:
        o = req.outputs.add(name=name)
        for k, v in p.items():
            set_param(o.parameters[k], v)
    for k, v in (params or {}).items():
        set_param(req.parameters[k], v)
    rpc = c.channel.unary_unary(SERVICE + "ModelInfer",
                                 request_serializer=type(req).SerializeToString,
                                 response_deserializer=M["inference.ModelInferResponse"].FromString)
    return rpc(req, timeout=timeout, metadata=metadata)


def set_param(p, v):
    if isinstance(v, bool):
        p.bool_param = v
    elif isinstance(v, int):
        p.int64_param = v
    elif isinstance(v, float):
        p.double_param = v
    else:
        p.string_param = v


def infer_error(c, *args, **kw):
    try:
        r = infer(c, *args, **kw)
    except grpc.RpcError as e:
        return e.code(), e.details()
    raise AssertionError("ModelInfer answered %r, expected an error" % r)


def http_infer(s, model, body):
    r = s.request("POST", "/v2/models/%s/infer" % model, body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
    assert r.status == 200, r
    return r.json


def pixels(n, seed=1):
    return [((i * 7 + seed * 13) % 23) / 23.0 for i in range(n)]


@test
def model_infer_answers_what_http_v2_answers_raw_and_typed():
    s = server()
    c = client(s)
    x = pixels(2 * 3 * 16 * 16)
    h = http_infer(s, "inc", {"inputs": [{"name": "input", "shape": [2, 3, 16, 16],
                                          "datatype": "FP32", "data": x}]})
    out = h["outputs"][0]
    for how in ("raw", "typed"):
        if how == "raw":
            r = infer(c, "inc", [infer_input("input", [2, 3, 16, 16], "FP32")], raw=[f32(x)],
                      id="req-7")
        else:
            r = infer(c, "inc", [infer_input("input", [2, 3, 16, 16], "FP32", fp32_contents=x)],
                      id="req-7")
        assert r.model_name == "inc" and r.model_version == h["model_version"] == "1", r
        assert r.id == "req-7", r
        assert len(r.outputs) == len(h["outputs"]) == 1 and len(r.raw_output_contents) == 1, r
        assert r.outputs[0].name == out["name"] and r.outputs[0].datatype == out["datatype"], r
        assert list(r.outputs[0].shape) == out["shape"] == [2, 5], (r, out)
        assert unf32(r.raw_output_contents[0]) == as_f32(out["data"]), (how, r, out)
        # The answer's parameters, as HTTP's: timings and the SLO it was served under.
        p = r.parameters
        assert p["slo_source"].string_param == "model" and p["slo_ms"].double_param == 50, p
        assert p["total_ms"].double_param > 0 and "queue_ms" in p, p
    # Without an id, the one squish gave it (as HTTP's answer has); a
    # version may be named.
    r = infer(c, "inc", [infer_input("input", [1, 3, 16, 16], "FP32")], raw=[f32(x[:768])],
              version="1")
    assert r.id != "" and r.id != "req-7" and r.model_version == "1", r
    c.close()


@test
def model_infer_takes_uint8_raw_and_typed_and_classification():
    s = server()
    c = client(s)
    x = [(i * 5) % 256 for i in range(3 * 16 * 16)]
    h = http_infer(s, "free", {"inputs": [{"name": "input", "shape": [1, 3, 16, 16],
                                           "datatype": "UINT8", "data": x}]})
    for r in (infer(c, "free", [infer_input("input", [1, 3, 16, 16], "UINT8")], raw=[bytes(x)]),
              infer(c, "free", [infer_input("input", [1, 3, 16, 16], "UINT8", uint_contents=x)])):
        assert unf32(r.raw_output_contents[0]) == as_f32(h["outputs"][0]["data"]), (r, h)
    # Triton's classification extension: top-k "score:index[:label]" BYTES,
    # each a 4-byte length and its bytes in raw_output_contents.
    name = h["outputs"][0]["name"]
    hc = s.request("POST", "/v2/models/free/infer", body=json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "UINT8", "data": x}],
         "outputs": [{"name": name, "parameters": {"classification": 2}}]}),
        headers={"Content-Type": "application/json"}).json["outputs"][0]
    r = infer(c, "free", [infer_input("input", [1, 3, 16, 16], "UINT8")], raw=[bytes(x)],
              outputs=[(name, {"classification": 2})])
    assert r.outputs[0].datatype == "BYTES" == hc["datatype"], (r, hc)
    assert list(r.outputs[0].shape) == hc["shape"], (r, hc)
    raw, got = r.raw_output_contents[0], []
    while raw:
        n = struct.unpack("<I", raw[:4])[0]
        got.append(raw[4:4 + n].decode())
        raw = raw[4 + n:]
    assert got == hc["data"], (got, hc)
    c.close()


@test
def model_infer_takes_jpeg_bytes():
    s = server()
    c = client(s)
    from test_infer import jpeg  # noqa: E402 - the JPEG maker of the infer tests
    img = jpeg(size=(24, 20))
    import base64
    h = http_infer(s, "inc", {"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES",
                                          "data": [base64.b64encode(img).decode()]}]})
    for r in (infer(c, "inc", [infer_input("input", [1], "BYTES", bytes_contents=[img])]),
              infer(c, "inc", [infer_input("input", [1], "BYTES")],
                    raw=[struct.pack("<I", len(img)) + img])):
        assert unf32(r.raw_output_contents[0]) == as_f32(h["outputs"][0]["data"]), (r, h)
    c.close()


@test
def model_infer_reads_and_writes_system_shared_memory():
    s = server()
    c = client(s)
    md = (("authorization", "Bearer " + s.token),)
    x = pixels(3 * 16 * 16, seed=3)
    h = http_infer(s, "inc", {"inputs": [{"name": "input", "shape": [1, 3, 16, 16],
                                          "datatype": "FP32", "data": x}]})
    shm_in = shared_memory.SharedMemory(create=True, size=4096)
    shm_out = shared_memory.SharedMemory(create=True, size=256)
    try:
        shm_in.buf[:len(x) * 4] = f32(x)
        for name, key, size in (("gin", shm_in.name, 4096), ("gout", shm_out.name, 256)):
            c.call("SystemSharedMemoryRegister", metadata=md, name=name, key="/" + key,
                   offset=0, byte_size=size)
        inp = infer_input("input", [1, 3, 16, 16], "FP32")
        for k, v in (("shared_memory_region", "gin"), ("shared_memory_byte_size", len(x) * 4)):
            set_param(inp.parameters[k], v)
        r = infer(c, "inc", [inp], outputs=[(h["outputs"][0]["name"],
                                             {"shared_memory_region": "gout",
                                              "shared_memory_offset": 16,
                                              "shared_memory_byte_size": 20})])
        assert r.outputs[0].datatype == "FP32" and list(r.outputs[0].shape) == [1, 5], r
        assert r.raw_output_contents[0] == b"", r  # in the region, not here
        assert unf32(bytes(shm_out.buf[16:36])) == as_f32(h["outputs"][0]["data"]), h
        # A region too small for the output: refused, as HTTP refuses it.
        code, details = infer_error(c, "inc", [inp], outputs=[(h["outputs"][0]["name"], {
            "shared_memory_region": "gout", "shared_memory_byte_size": 8})])
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "byte_size" in details, details
        code, details = infer_error(c, "inc", [inp], outputs=[(h["outputs"][0]["name"], {
            "shared_memory_region": "nosuch", "shared_memory_byte_size": 20})])
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "nosuch" in details, details
        c.call("SystemSharedMemoryUnregister", metadata=md, name="")
    finally:
        shm_in.close()
        shm_in.unlink()
        shm_out.close()
        shm_out.unlink()
        c.close()


@test
def model_infer_refuses_bad_requests_with_https_reasons():
    s = server()
    c = client(s)
    x = pixels(768)
    # An unknown model: NOT_FOUND, HTTP's message.
    h = s.request("POST", "/v2/models/nosuch/infer", body=json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32", "data": x}]}),
        headers={"Content-Type": "application/json"})
    code, details = infer_error(c, "nosuch", [infer_input("input", [1, 3, 16, 16], "FP32")],
                                raw=[f32(x)])
    assert code == grpc.StatusCode.NOT_FOUND and h.status == 404, (code, details, h)
    assert "nosuch" in details, details
    code, details = infer_error(c, "inc", [infer_input("input", [1, 3, 16, 16], "FP32")],
                                raw=[f32(x)], version="9")
    assert code == grpc.StatusCode.NOT_FOUND and "9" in details, details
    cases = [
        # a wrong shape, raw and typed
        ([infer_input("input", [1, 3, 8, 8], "FP32")], [f32(x[:192])], "shape"),
        ([infer_input("input", [1, 3, 8, 8], "FP32", fp32_contents=x[:192])], None, "shape"),
        # a datatype the model does not take, raw and typed
        ([infer_input("input", [1, 3, 16, 16], "INT32")], [f32(x)], "datatype"),
        ([infer_input("input", [1, 3, 16, 16], "INT32", int_contents=[1] * 768)], None,
         "datatype"),
        # typed contents in another list than the datatype's, or too few
        ([infer_input("input", [1, 3, 16, 16], "FP32", uint_contents=[1] * 768)], None,
         "fp32_contents"),
        ([infer_input("input", [1, 3, 16, 16], "FP32", fp32_contents=x[:700])], None,
         "fp32_contents"),
        ([infer_input("input", [1, 3, 16, 16], "UINT8", uint_contents=[300] * 768)], None,
         "uint_contents"),
        # raw bytes that do not fill the tensor
        ([infer_input("input", [1, 3, 16, 16], "FP32")], [f32(x[:100])], "input"),
        # no input, an input of another name, one without data
        ([], None, "input"),
        ([infer_input("image", [1, 3, 16, 16], "FP32")], [f32(x)], "image"),
        ([infer_input("input", [1, 3, 16, 16], "FP32")], None, "no data"),
        # raw and typed at once
        ([infer_input("input", [1, 3, 16, 16], "FP32", fp32_contents=x)], [f32(x)], "raw"),
    ]
    for inputs, raw, word in cases:
        code, details = infer_error(c, "inc", inputs, raw=raw)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (inputs, code, details)
        assert word in details, (word, details)
    code, details = infer_error(c, "inc", [infer_input("input", [1, 3, 16, 16], "FP32")],
                                raw=[f32(x)], params={"priority": "high"})
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "priority" in details, details
    code, details = infer_error(c, "inc", [infer_input("input", [1, 3, 16, 16], "FP32")],
                                raw=[f32(x)], outputs=[("nosuch", {})])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "nosuch" in details, details
    c.close()


@test
def model_infer_refuses_an_slo_no_request_can_meet():
    s = server()
    c = client(s)
    x = pixels(768)
    inp = [infer_input("input", [1, 3, 16, 16], "FP32")]
    h = s.request("POST", "/v2/models/inc/infer", body=json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32", "data": x}],
         "parameters": {"slo_ms": 0.5}}), headers={"Content-Type": "application/json"})
    assert h.status == 400 and h.json["code"] == "slo_too_tight", h
    code, details = infer_error(c, "inc", inp, raw=[f32(x)], params={"slo_ms": 0.5})
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details == h.json["error"], (details, h)
    # Triton's timeout is in microseconds: 500 us is the same half millisecond.
    code, details = infer_error(c, "inc", inp, raw=[f32(x)], params={"timeout": 500})
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "microseconds" in details, details
    # One it can meet, and a priority: served under it.
    r = infer(c, "inc", inp, raw=[f32(x)], params={"slo_ms": 400.0, "priority": 1})
    assert r.parameters["slo_ms"].double_param == 400 and \
        r.parameters["slo_source"].string_param == "request", r.parameters
    r = infer(c, "inc", inp, raw=[f32(x)], params={"timeout": 300000})
    assert r.parameters["slo_ms"].double_param == 300, r.parameters
    c.close()


def metric(s, name, model, extra=""):
    text = s.get("/metrics").raw.decode()
    total = 0.0
    for labels, v in re.findall(r"^%s\{([^}]*)\} (\S+)" % name, text, re.M):
        if 'model="%s"' % model in labels and extra in labels:
            total += float(v)
    return total


@test
def a_cancelled_model_infer_leaves_its_item_unrun():
    """Calls whose client gives up while their item waits behind another
    (l(1) = 105 ms, one row at a time) are withdrawn, never run: one batch
    runs, the first call's."""
    s = server()
    c = client(s)
    x = [0.0] * 48
    inp = [infer_input("input", [1, 3, 4, 4], "FP32")]
    infer(c, "slow", inp, raw=[f32(x)])  # warm
    time.sleep(0.2)
    batches = metric(s, "squish_batches_total", "slow")
    gone = metric(s, "squish_items_withdrawn_total", "slow", 'reason="client_gone"')
    req = M["inference.ModelInferRequest"](model_name="slow")
    req.inputs.extend(inp)
    req.raw_input_contents.append(f32(x))
    rpc = c.channel.unary_unary(SERVICE + "ModelInfer",
                                 request_serializer=type(req).SerializeToString,
                                 response_deserializer=M["inference.ModelInferResponse"].FromString)
    first = rpc.future(req, timeout=20)
    time.sleep(0.02)
    later = [rpc.future(req, timeout=20) for _ in range(3)]
    time.sleep(0.03)
    for f in later:
        f.cancel()
    assert first.result().model_name == "slow"
    for f in later:
        assert f.cancelled() or f.exception().code() == grpc.StatusCode.CANCELLED, f
    time.sleep(0.4)  # any batch sent for them would have run by now
    assert metric(s, "squish_batches_total", "slow") == batches + 1, \
        (batches, metric(s, "squish_batches_total", "slow"))
    assert metric(s, "squish_items_withdrawn_total", "slow",
                  'reason="client_gone"') == gone + 3, s.get("/metrics").raw.decode()[-3000:]
    c.close()


@test
def model_infer_on_a_real_onnx_model_answers_as_http():
    s = Squishd(workers="cpu:1", extra=["--grpc-listen", "127.0.0.1:0"])
    try:
        s.wait_ready(workers=1, timeout=60)
        port = int(eventually(lambda: re.search(r"grpc listening address=\S+ port=(\d+)",
                                                s.read_log()), 10, "the port").group(1))
        body, ctype = tm.multipart([("model", "m.onnx", None, tm.tiny()),
                                    ("config", None, None, b'{"name": "tiny"}')])
        r = s.request("POST", "/models", body=body, headers={
            "Authorization": "Bearer " + s.token, "Content-Type": ctype})
        assert r.status == 202, r
        eventually(lambda: s.get("/v2/models/tiny/ready").status == 200, 60, "tiny ready")
        meta = s.get("/v2/models/tiny").json
        inp = meta["inputs"][0]
        shape = [2] + inp["shape"][1:]
        n = 1
        for d in shape:
            n *= d
        x = pixels(n, seed=5)
        h = http_infer(s, "tiny", {"inputs": [{"name": inp["name"], "shape": shape,
                                               "datatype": "FP32", "data": x}]})
        c = Client(port)
        r = infer(c, "tiny", [infer_input(inp["name"], shape, "FP32")], raw=[f32(x)])
        assert [o.name for o in r.outputs] == [o["name"] for o in h["outputs"]], (r, h)
        for i, o in enumerate(h["outputs"]):
            assert list(r.outputs[i].shape) == o["shape"], (r, o)
            assert unf32(r.raw_output_contents[i]) == as_f32(o["data"]), (r, o)
        c.close()
        assert s.stop() == 0, s.read_log()[-3000:]
    finally:
        s.cleanup()


@test
def model_stream_infer_answers_each_request_on_the_stream():
    s = server()
    c = client(s)
    x = pixels(768, seed=7)
    h = http_infer(s, "inc", {"inputs": [{"name": "input", "shape": [1, 3, 16, 16],
                                          "datatype": "FP32", "data": x}]})
    reqs = []
    for i, model in enumerate(("inc", "nosuch", "inc")):
        req = M["inference.ModelInferRequest"](model_name=model, id="s%d" % i)
        req.inputs.add(name="input", shape=[1, 3, 16, 16], datatype="FP32")
        req.raw_input_contents.append(f32(x))
        reqs.append(req)
    rpc = c.channel.stream_stream(SERVICE + "ModelStreamInfer",
                                   request_serializer=type(reqs[0]).SerializeToString,
                                   response_deserializer=M["inference.ModelStreamInferResponse"]
                                   .FromString)
    answers = list(rpc(iter(reqs), timeout=20))
    assert len(answers) == 3, answers
    ok = {a.infer_response.id: a.infer_response for a in answers if not a.error_message}
    errors = [a.error_message for a in answers if a.error_message]
    assert sorted(ok) == ["s0", "s2"], answers
    for r in ok.values():
        assert unf32(r.raw_output_contents[0]) == as_f32(h["outputs"][0]["data"]), (r, h)
    assert len(errors) == 1 and "nosuch" in errors[0], errors
    # A stream the client ends at once is ended OK, with no answer.
    assert list(rpc(iter([]), timeout=20)) == []
    c.close()


@test
def a_cancelled_stream_leaves_its_queued_items_unrun():
    """A stream of four requests on one-row-at-a-time "slow", cancelled
    while the first runs: the other three are withdrawn, never run."""
    s = server()
    c = client(s)
    req = M["inference.ModelInferRequest"](model_name="slow")
    req.inputs.add(name="input", shape=[1, 3, 4, 4], datatype="FP32")
    req.raw_input_contents.append(f32([0.0] * 48))
    time.sleep(0.3)  # calls of the tests before have run
    batches = metric(s, "squish_batches_total", "slow")
    gone = metric(s, "squish_items_withdrawn_total", "slow", 'reason="client_gone"')
    hold = threading.Event()

    def requests():
        for _ in range(4):
            yield req
        hold.wait(5)  # the client sends no last message: the stream stays open

    rpc = c.channel.stream_stream(SERVICE + "ModelStreamInfer",
                                   request_serializer=type(req).SerializeToString,
                                   response_deserializer=M["inference.ModelStreamInferResponse"]
                                   .FromString)
    call = rpc(requests(), timeout=20)
    time.sleep(0.05)
    call.cancel()
    hold.set()
    time.sleep(0.5)  # any batch sent for them would have run by now
    assert metric(s, "squish_batches_total", "slow") == batches + 1, \
        (batches, metric(s, "squish_batches_total", "slow"))
    assert metric(s, "squish_items_withdrawn_total", "slow",
                  'reason="client_gone"') == gone + 3
    c.close()


@test
def many_concurrent_calls_are_all_answered():
    """Calls answered from the DB thread and from the queue's, at once."""
    c = client()
    futures = []
    for i in range(64):
        method = ("ModelMetadata", "ModelReady", "ModelConfig", "ServerReady",
                  "ModelStatistics")[i % 5]
        req = M["inference.%sRequest" % method](**({} if method == "ServerReady" else
                                                   {"name": "inc"}))
        rpc = c.channel.unary_unary(SERVICE + method, request_serializer=type(req).SerializeToString,
                                     response_deserializer=M["inference.%sResponse" % method].FromString)
        futures.append((method, rpc.future(req, timeout=20)))
    for method, f in futures:
        r = f.result()
        if method == "ModelMetadata":
            assert r.name == "inc", r
        elif method == "ModelConfig":
            assert r.config.name == "inc", r
        elif method == "ModelStatistics":
            assert [m.name for m in r.model_stats] == ["inc"], r
        else:
            assert r.ready is True, (method, r)
    c.close()


@test
def requests_past_max_body_mb_are_refused():
    """A request message is held to --max-body-mb, as an HTTP body is: the
    core refuses a larger one (RESOURCE_EXHAUSTED) before buffering it."""
    port = free_port()
    s = Squishd(workers="emu:1", extra=["--grpc-listen", "127.0.0.1:%d" % port,
                                        "--max-body-mb", "1"])
    s.grpc_port = port
    try:
        # Its listener up first: a call before it was refused the
        # connection (UNAVAILABLE), once in a loaded ASan run.
        s.wait_ready(workers=1, timeout=60)
        eventually(lambda: "grpc listening" in s.read_log(), 30, "the gRPC listener")
        c = client(s)
        code, details = c.error("ModelMetadata", name="x" * (2 << 20))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        # Under the limit it is read, and its name checked.
        code, details = c.error("ModelMetadata", name="x" * (512 << 10))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "name" in details, (code, details)
        assert c.call("ServerLive").live
        c.close()
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def bad_grpc_listen_is_refused_at_start():
    try:
        Squishd(workers="emu:1", extra=["--grpc-listen", "nowhere"])
        raise AssertionError("squishd started with --grpc-listen nowhere")
    except RuntimeError as e:
        assert "grpc_listen" in str(e), e


@test
def off_unless_asked_for():
    s = Squishd(workers="emu:1")
    try:
        s.wait_ready(workers=1, timeout=60)
        assert "grpc listening" not in s.read_log()
    finally:
        assert s.stop() == 0
        s.cleanup()


@test
def stops_cleanly_with_calls_under_way():
    """SIGTERM while calls come and go: squishd exits 0 (the queue drained,
    every call freed; ASan/LSan builds fail a leak here)."""
    port = free_port()
    s = Squishd(workers="emu:1", extra=["--grpc-listen", "127.0.0.1:%d" % port])
    s.grpc_port = port
    try:
        s.wait_ready(workers=1, timeout=60)
        assert "grpc listening" in s.read_log()
        c = client(s)
        assert c.call("ServerLive").live  # connected
        req = M["inference.ModelReadyRequest"](name="absent")
        rpc = c.channel.unary_unary(SERVICE + "ModelReady",
                                     request_serializer=type(req).SerializeToString,
                                     response_deserializer=M["inference.ModelReadyResponse"].FromString)
        futures = [rpc.future(req, timeout=20) for _ in range(400)]
        # Answered from the DB thread while the rest still come in.
        eventually(lambda: any(f.done() for f in futures), 10, "a first answer")
        assert s.stop() == 0
        answered = 0
        for f in futures:
            try:
                f.result()
            except grpc.RpcError as e:  # not found, or cut off by the stop
                assert e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE,
                                    grpc.StatusCode.CANCELLED), e
                answered += e.code() == grpc.StatusCode.NOT_FOUND
        assert answered > 0
        c.close()
        assert "stopped" in s.read_log()
    finally:
        s.cleanup()


@test
def served_squishd_stops_cleanly():
    """The squishd the checks above called (about 150 calls, some answered
    from the DB thread) exits 0 on SIGTERM: under ASan/LSan a call's state
    left behind fails it here."""
    global _server
    s = server()
    _server = None
    try:
        # ModelInfer calls under way too: one running, three queued behind
        # it (l(1) = 105 ms, one row at a time) when SIGTERM comes.
        c = client(s)
        req = M["inference.ModelInferRequest"](model_name="slow")
        req.inputs.add(name="input", shape=[1, 3, 4, 4], datatype="FP32")
        req.raw_input_contents.append(f32([0.0] * 48))
        rpc = c.channel.unary_unary(SERVICE + "ModelInfer",
                                     request_serializer=type(req).SerializeToString,
                                     response_deserializer=M["inference.ModelInferResponse"].FromString)
        futures = [rpc.future(req, timeout=20) for _ in range(4)]
        time.sleep(0.05)
        assert s.stop() == 0, s.read_log()[-3000:]
        assert "stopped" in s.read_log()
        for f in futures:
            try:
                assert f.result().model_name == "slow"
            except grpc.RpcError as e:  # refused or cut off by the stop
                assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), e
        c.close()
    finally:
        s.cleanup()


# ---- pipelines ----

def unbytes(raw):
    """BYTES raw contents (each a 4-byte little-endian length, then its
    bytes) as their texts."""
    out, at = [], 0
    while at < len(raw):
        n = struct.unpack_from("<I", raw, at)[0]
        out.append(raw[at + 4:at + 4 + n].decode())
        at += 4 + n
    return out


@test
def a_pipeline_is_a_models_name_and_infers_over_grpc_as_its_http_route():
    """A pipeline is addressed as a model: its metadata, readiness and
    config over gRPC are HTTP's, and ModelInfer (and ModelStreamInfer)
    with its name answers what POST /v2/models/{p}/infer answers for the
    same request: RESULT's texts, id, SLO and priority parameters, and its
    refusals (an SLO no query can meet, a wrong input) with HTTP's
    message, mapped as a model's are."""
    s = server()
    c = client(s)
    # No detections (mean 0): the emulated detector draws them at random,
    # so that its crops' stage is empty; the whole frame's stage is
    # deterministic (an emulated model's answer is its input's).
    det = {"name": "gdet", "profile": {"alpha_ms": 1, "beta_ms": 2}, "max_batch": 8,
           "input": {"shape": [3, 32, 32]}, "detections": {"mean": 0, "slots": 16}}
    r = s.request("POST", "/models", body=json.dumps(det), headers=admin(s))
    assert r.status in (201, 202), r
    crops = {"stage": "det", "boxes": "boxes", "scores": "scores", "format": "xyxy",
             "normalized": True, "score_threshold": 0.5, "nms_iou": 0.5, "max_crops": 16}
    spec = {"name": "gpipe", "slo_ms": 2000,
            "stages": [{"id": "det", "model": "gdet"},
                       {"id": "cls", "model": "inc", "crops_of": crops, "top_k": 3},
                       {"id": "whole", "model": "inc", "top_k": 3}]}
    r = s.request("POST", "/pipelines", body=json.dumps(spec), headers=admin(s))
    assert r.status == 201, r
    eventually(lambda: s.get("/v2/models/gpipe/ready").status == 200, 30, "gpipe ready")
    assert c.call("ModelReady", name="gpipe").ready is True
    h = s.get("/v2/models/gpipe").json
    m = c.call("ModelMetadata", name="gpipe")
    assert m.name == "gpipe" and list(m.versions) == h["versions"], (m, h)
    assert [(t.name, t.datatype) for t in m.inputs] == \
        [(t["name"], t["datatype"]) for t in h["inputs"]], (m, h)
    assert c.call("ModelConfig", name="gpipe").config.name == "gpipe"

    from test_infer import jpeg  # noqa: E402 - the JPEG maker of the infer tests
    import base64
    frames = [jpeg(size=(24, 20)), jpeg(size=(40, 30))]

    def http(params, name="IMAGE"):
        return s.request("POST", "/v2/models/gpipe/infer", body=json.dumps(
            {"id": "p-1", "inputs": [{"name": name, "shape": [2], "datatype": "BYTES",
                                      "data": [base64.b64encode(f).decode() for f in frames]}],
             "parameters": params}), headers={"Content-Type": "application/json"})

    h = http({"slo_ms": 2000, "priority": 1})
    assert h.status == 200, h
    want = h.json["outputs"][0]
    assert len(want["data"]) == 2 and all(json.loads(t)["det"] == {"cls": []} and
                                          len(json.loads(t)["whole"]["predictions"]) == 3
                                          for t in want["data"]), want
    typed = [infer_input("IMAGE", [2], "BYTES", bytes_contents=frames)]
    raw = [b"".join(struct.pack("<I", len(f)) + f for f in frames)]
    for r in (infer(c, "gpipe", typed, id="p-1", params={"slo_ms": 2000.0, "priority": 1}),
              infer(c, "gpipe", [infer_input("IMAGE", [2], "BYTES")], raw=raw, id="p-1",
                    params={"slo_ms": 2000, "priority": 1}),
              infer(c, "gpipe", typed, version="1", id="p-1",
                    params={"timeout": 2000000, "priority": 1})):
        assert (r.model_name, r.model_version, r.id) == \
            (h.json["model_name"], h.json["model_version"], "p-1") == ("gpipe", "1", "p-1"), r
        assert [(o.name, o.datatype, list(o.shape)) for o in r.outputs] == \
            [(want["name"], want["datatype"], want["shape"])], r
        assert unbytes(r.raw_output_contents[0]) == want["data"], (r, want)
        assert r.parameters["slo_ms"].double_param == h.json["parameters"]["slo_ms"] == 2000, r
        assert r.parameters["whole_budget_ms"].double_param == \
            h.json["parameters"]["whole_budget_ms"], (r, h)
    # ModelStreamInfer takes it too, beside a model's request.
    reqs = [M["inference.ModelInferRequest"](model_name="gpipe", id="s0"),
            M["inference.ModelInferRequest"](model_name="inc", id="s1")]
    reqs[0].inputs.extend(typed)
    reqs[1].inputs.add(name="input", shape=[1, 3, 16, 16], datatype="FP32")
    reqs[1].raw_input_contents.append(f32(pixels(768)))
    rpc = c.channel.stream_stream(SERVICE + "ModelStreamInfer",
                                   request_serializer=type(reqs[0]).SerializeToString,
                                   response_deserializer=M["inference.ModelStreamInferResponse"]
                                   .FromString)
    answers = {a.infer_response.id: a for a in rpc(iter(reqs), timeout=20)}
    assert sorted(answers) == ["s0", "s1"] and not any(a.error_message
                                                       for a in answers.values()), answers
    assert unbytes(answers["s0"].infer_response.raw_output_contents[0]) == want["data"], answers
    # Refused as HTTP refuses it, with its message: an SLO no query can
    # meet (also from Triton's timeout, in microseconds), a wrong input.
    h = http({"slo_ms": 0.5})
    assert h.status == 400 and h.json["code"] == "slo_too_tight", h
    code, details = infer_error(c, "gpipe", typed, id="p-1", params={"slo_ms": 0.5})
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details == h.json["error"], (details, h)
    h = http({"timeout": 500})
    assert h.status == 400 and h.json["code"] == "slo_too_tight", h
    code, details = infer_error(c, "gpipe", typed, id="p-1", params={"timeout": 500})
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details == h.json["error"], (details, h)
    assert "microseconds" in details, details
    h = http({"slo_ms": 2000}, name="PIXELS")
    assert h.status == 400 and "PIXELS" in h.json["error"], h
    code, details = infer_error(c, "gpipe", [infer_input("PIXELS", [2], "BYTES",
                                                         bytes_contents=frames)])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "PIXELS" in details, details
    # A version other than its one (1) is no model's, as over HTTP.
    code, details = infer_error(c, "gpipe", typed, version="2")
    assert code == grpc.StatusCode.NOT_FOUND, (code, details)
    c.close()


@test
def a_cancelled_pipeline_model_infer_leaves_its_items_unrun():
    """A pipeline's calls whose client gives up while their frames wait
    behind another's on its stage (l(1) = 405 ms, one row at a time) are
    withdrawn, never run, as a model's: one batch runs, the first call's."""
    s = server()
    c = client(s)
    slower = dict(SLOW, name="gslower", profile={"alpha_ms": 400.0, "beta_ms": 5.0})
    r = s.request("POST", "/models", body=json.dumps(slower), headers=admin(s))
    assert r.status == 201, r
    eventually(lambda: s.get("/v2/models/gslower/ready").status == 200, 30, "gslower ready")
    r = s.request("POST", "/pipelines", body=json.dumps(
        {"name": "gslowpipe", "slo_ms": 5000, "stages": [{"id": "only", "model": "gslower"}]}),
        headers=admin(s))
    assert r.status == 201, r
    eventually(lambda: s.get("/v2/models/gslowpipe/ready").status == 200, 30, "ready")
    from test_infer import jpeg  # noqa: E402 - the JPEG maker of the infer tests
    inp = [infer_input("IMAGE", [1], "BYTES", bytes_contents=[jpeg(size=(8, 8))])]
    r = infer(c, "gslowpipe", inp)  # warm
    assert json.loads(unbytes(r.raw_output_contents[0])[0])["only"]["predictions"], r
    time.sleep(0.2)
    batches = metric(s, "squish_batches_total", "gslower")
    req = M["inference.ModelInferRequest"](model_name="gslowpipe")
    req.inputs.extend(inp)
    rpc = c.channel.unary_unary(SERVICE + "ModelInfer",
                                 request_serializer=type(req).SerializeToString,
                                 response_deserializer=M["inference.ModelInferResponse"].FromString)
    first = rpc.future(req, timeout=20)
    time.sleep(0.02)
    later = [rpc.future(req, timeout=20) for _ in range(3)]
    time.sleep(0.03)
    for f in later:
        f.cancel()
    assert first.result().model_name == "gslowpipe"
    for f in later:
        assert f.cancelled() or f.exception().code() == grpc.StatusCode.CANCELLED, f
    time.sleep(1.0)  # any batch sent for them would have run by now
    assert metric(s, "squish_batches_total", "gslower") == batches + 1, \
        (batches, metric(s, "squish_batches_total", "gslower"))
    c.close()


# ---- on a frontend ----

def grpc_port_of(s):
    return int(eventually(
        lambda: re.search(r"grpc listening address=127\.0\.0\.1:0 port=(\d+)", s.read_log()),
        10, "the gRPC port in the log").group(1))


@test
def a_frontend_answers_every_method_as_its_http_routes():
    """squishd --role frontend --grpc-listen: each method answers what the
    same route on the frontend's HTTP answers (its own catalog for
    readiness, its dispatcher's answer for the routes it forwards, with the
    dispatcher's token for model control), and ModelInfer what the
    dispatcher's own answers."""
    from test_remote import Cluster, cluster_addr
    cl = Cluster()
    fronts = []
    try:
        d = cl.squishd(extra=["--role", "dispatcher", "--grpc-listen", "127.0.0.1:0"])
        fronts.append(d)
        addr = cluster_addr(d)
        cl.worker(addr, "emu:0", "host0", extra=["--data-listen", "127.0.0.1:0"])
        d.wait_ready(workers=1, timeout=20)
        f = Squishd(workers="none", tmp=None,
                    extra=["--role", "frontend", "--dispatcher", addr,
                           "--cluster-token-file", cl.token, "--grpc-listen", "127.0.0.1:0",
                           "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "1000"])
        fronts.append(f)
        eventually(lambda: "joined the dispatcher" in f.read_log(), 20, "the frontend joined")
        r = d.request("POST", "/models", body=json.dumps(INC), headers=admin(d))
        assert r.status == 201, r
        eventually(lambda: f.get("/v2/models/inc/ready").status == 200, 30, "inc ready on f")
        eventually(lambda: f.get("/v2/health/ready").status == 200, 30, "f ready")
        c = Client(grpc_port_of(f))
        dc = Client(grpc_port_of(d))
        assert c.call("ServerLive").live is True
        assert c.call("ServerReady").ready is True
        assert c.call("ModelReady", name="inc").ready is True
        assert c.call("ModelReady", name="inc", version="1").ready is True
        # Metadata, config, statistics and the index: the dispatcher's, as
        # the frontend's HTTP forwards them.
        h = f.get("/v2/models/inc").json
        m = c.call("ModelMetadata", name="inc")
        assert m.name == h["name"] == "inc" and list(m.versions) == h["versions"], (m, h)
        assert [(t.name, t.datatype, list(t.shape)) for t in m.inputs] == \
            [(t["name"], t["datatype"], t["shape"]) for t in h["inputs"]], (m, h)
        h = f.get("/v2/models/inc/config").json
        cfg = c.call("ModelConfig", name="inc").config
        assert cfg.name == "inc" and cfg.max_batch_size == h["max_batch_size"], (cfg, h)
        assert [i.name for i in cfg.input] == [i["name"] for i in h["input"]], (cfg, h)
        rows = lambda ms: [(m.name, m.version, m.state) for m in ms]
        h = f.request("POST", "/v2/repository/index", body="{}").json
        assert rows(c.call("RepositoryIndex").models) == \
            [(r["name"], r.get("version", ""), r.get("state", "")) for r in h], h
        # ModelInfer through the frontend: the dispatcher's own answer.
        x = pixels(2 * 3 * 16 * 16)
        ins = [infer_input("input", [2, 3, 16, 16], "FP32")]
        got, want = infer(c, "inc", ins, raw=[f32(x)]), infer(dc, "inc", ins, raw=[f32(x)])
        assert got.model_name == "inc" and list(got.outputs[0].shape) == [2, 5], got
        assert got.raw_output_contents == want.raw_output_contents, (got, want)
        # And on a stream, the same answer.
        req = M["inference.ModelInferRequest"](model_name="inc", id="fs")
        req.inputs.extend(ins)
        req.raw_input_contents.append(f32(x))
        rpc = c.channel.stream_stream(SERVICE + "ModelStreamInfer",
                                       request_serializer=type(req).SerializeToString,
                                       response_deserializer=M["inference.ModelStreamInferResponse"]
                                       .FromString)
        answers = list(rpc(iter([req]), timeout=20))
        assert len(answers) == 1 and not answers[0].error_message, answers
        assert answers[0].infer_response.raw_output_contents == want.raw_output_contents
        # Statistics count it (the frontend reports to the dispatcher every 2 s).
        st = lambda: stats_rows(c.call("ModelStatistics", name="inc"))
        eventually(lambda: st()[0]["inference_count"] >= 2, 10, "the frontend's count")
        assert [(r["name"], r["version"]) for r in st()] == \
            [(r["name"], r["version"]) for r in f.get("/v2/models/inc/stats").json["model_stats"]]
        # Unknown models: NOT_FOUND, as the frontend's 404s.
        for method in ("ModelReady", "ModelMetadata", "ModelConfig", "ModelStatistics"):
            code, details = c.error(method, name="nosuch")
            assert code == grpc.StatusCode.NOT_FOUND and "nosuch" in details, \
                (method, code, details)
        code, details = infer_error(c, "nosuch", ins, raw=[f32(x)])
        assert code == grpc.StatusCode.NOT_FOUND, (code, details)
        # Model control: forwarded, so the dispatcher's token decides.
        code, details = c.error("RepositoryModelUnload", model_name="inc")
        assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)
        code, _ = c.error("RepositoryModelUnload", model_name="inc",
                          metadata=[("authorization", "Bearer " + f.token)])
        assert code == grpc.StatusCode.UNAUTHENTICATED and f.token != d.token, code
        assert f.get("/v2/models/inc/ready").status == 200  # nothing was unloaded
        tok = [("authorization", "Bearer " + d.token)]
        c.call("RepositoryModelUnload", model_name="inc", metadata=tok)
        eventually(lambda: c.call("ModelReady", name="inc").ready is False, 10, "inc unloaded")
        assert f.get("/v2/models/inc/ready").status == 400
        c.call("RepositoryModelLoad", model_name="inc", metadata=tok)
        eventually(lambda: c.call("ModelReady", name="inc").ready is True, 30, "inc loaded")
        # The frontend's own shared-memory table: its own token, as its route.
        code, _ = c.error("SystemSharedMemoryStatus")
        assert code == grpc.StatusCode.UNAUTHENTICATED, code
        assert len(c.call("SystemSharedMemoryStatus",
                          metadata=[("authorization", "Bearer " + f.token)]).regions) == 0
        c.close()
        dc.close()
        assert f.stop() == 0, f.read_log()[-3000:]
        assert d.stop() == 0, d.read_log()[-3000:]
    finally:
        for s in fronts:
            s.cleanup()
        cl.cleanup()


if __name__ == "__main__":
    try:
        run()
    finally:
        if _server is not None:
            _server.stop()
            _server.cleanup()
