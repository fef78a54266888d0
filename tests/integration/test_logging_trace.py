"""Triton's logging and trace extensions on the real squishd: GET/POST
/v2/logging (the levels and the format change what squishd writes, at
once), GET/POST /v2[/models/{m}]/trace/setting (global and per-model
settings, null back to the global ones), the requests traced by rate and
count, and the trace file's JSON lines (every moment of a request, in
order). Both are admin operations; what squish cannot do is a 400 that says
which and why."""

import json
import os
import re
import shutil
import tempfile
import time

import tiny_models as tm
from harness import Squishd, eventually, run, test, validate

PHOTO = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
# Emulated models without an SLO (best effort: served at once, one at a
# time here), l(1) = 6.1 ms for r50.
R50 = {"name": "r50", "profile": {"alpha_ms": 1.053, "beta_ms": 5.072}, "max_batch": 32,
       "input": {"shape": [3, 8, 8]}}
R18 = dict(R50, name="r18")
STAMPS = ["receive", "decode_start", "decode_end", "queue", "batch", "execute_start",
          "execute_end", "reply"]


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def post(s, path, settings, schema_name=None):
    body = settings if isinstance(settings, (bytes, str)) else json.dumps(settings)
    return s.request("POST", path, body=body, schema_name=schema_name,
                     headers=dict(auth(s), **{"Content-Type": "application/json"}))


def get(s, path, schema_name=None):
    return s.get(path, headers=auth(s), schema_name=schema_name)


def add_emulated(s, cfg):
    r = post(s, "/models", cfg)
    assert r.status == 201, r


def infer_v2(s, model, rid, shape=(1, 3, 8, 8)):
    n = 1
    for d in shape:
        n *= d
    req = {"inputs": [{"name": "input", "shape": list(shape), "datatype": "FP32",
                       "data": [0.5] * n}]}
    return s.request("POST", "/v2/models/%s/infer" % model, body=json.dumps(req),
                     headers={"X-Request-Id": rid, "Content-Type": "application/json"})


def photo():
    with open(PHOTO, "rb") as f:
        return f.read()


def traced_squishd(workers="emu:1"):
    """A squishd whose traces go to trace.jsonl in its directory."""
    tmp = tempfile.mkdtemp(prefix="squish-it-")
    path = os.path.join(tmp, "trace.jsonl")
    return Squishd(workers=workers, extra=["--trace-file", path], tmp=tmp), path


def trace_lines(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f.read().splitlines()]
    except FileNotFoundError:
        return []


def settled_lines(path, n, settle=0.3):
    """The file's lines once it holds n (the writer is a thread of its own),
    and no more a moment later."""
    eventually(lambda: len(trace_lines(path)) >= n, 10, "%d trace lines" % n)
    time.sleep(settle)
    lines = trace_lines(path)
    assert len(lines) == n, [ln["request_id"] for ln in lines]
    return lines


def refused(r, *names):
    assert r.status == 400, r
    for name in names:
        assert name in r.json["error"], (name, r.json)


@test
def logging_settings_round_trip_need_the_admin_token_and_refuse_what_squish_cannot_do():
    s = Squishd(workers="none")
    try:
        # Admin operations, with the bearer token a Triton client sends as a
        # header (tritonclient's headers={"Authorization": ...}).
        for method in ("GET", "POST"):
            r = s.request(method, "/v2/logging", body="{}" if method == "POST" else None)
            assert r.status == 401 and r.headers.get("www-authenticate"), r
            r = s.request(method, "/v2/logging", headers={"Authorization": "Bearer nope"},
                          body="{}" if method == "POST" else None)
            assert r.status == 401, r
        assert s.request("DELETE", "/v2/logging", headers=auth(s)).status == 405
        r = s.get("/v2", schema_name="server_metadata")
        assert {"logging", "trace"} <= set(r.json["extensions"]), r
        r = get(s, "/v2/logging", "log_settings")
        assert r.status == 200, r
        assert r.json == {"log_file": "", "log_info": True, "log_warning": True,
                          "log_error": True, "log_verbose_level": 0,
                          "log_format": "default"}, r.json
        # Only what is given changes; the answer is every setting.
        r = post(s, "/v2/logging", {"log_verbose_level": 2, "log_warning": False,
                                    "log_format": "ISO8601"}, "log_settings")
        assert r.status == 200, r
        want = {"log_file": "", "log_info": True, "log_warning": False, "log_error": True,
                "log_verbose_level": 2, "log_format": "ISO8601"}
        assert r.json == want, r.json
        assert get(s, "/v2/logging").json == want
        # null leaves a setting as it is (Triton); an empty body changes nothing.
        assert post(s, "/v2/logging", {"log_info": None, "log_file": None}).json == want
        assert post(s, "/v2/logging", b"").json == want
        # What GET gave may be sent back whole.
        assert post(s, "/v2/logging", want).json == want
        refused(post(s, "/v2/logging", {"log_file": "/tmp/squish.log"}), "log_file",
                "standard error")
        refused(post(s, "/v2/logging", {"log_verbose_level": -1}), "log_verbose_level")
        refused(post(s, "/v2/logging", {"log_verbose_level": "1"}), "log_verbose_level")
        refused(post(s, "/v2/logging", {"log_format": "json"}), "log_format", "ISO8601")
        refused(post(s, "/v2/logging", {"log_info": "yes"}), "log_info")
        refused(post(s, "/v2/logging", {"log_errors": True}), "log_errors", "unknown")
        refused(post(s, "/v2/logging", [1]), "JSON object")
        r = post(s, "/v2/logging", b"{nope")
        assert r.status == 400 and r.json["code"] == "bad_json", r
        # A refused request changes nothing, not even its good part.
        refused(post(s, "/v2/logging", {"log_info": False, "log_format": "xml"}), "log_format")
        assert get(s, "/v2/logging").json == want
        # Without --trace-file there is nowhere to write traces.
        r = get(s, "/v2/trace/setting", "trace_settings")
        assert r.status == 200 and r.json["trace_file"] == "", r
        refused(post(s, "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}), "--trace-file")
        assert s.stop() == 0
    finally:
        s.cleanup()


def http_count(s, route):
    """squish_http_requests_total of route's 200s: counted when h2o frees a
    request, just before its access line."""
    text = s.get("/metrics").raw.decode()
    m = re.search(r'^squish_http_requests_total\{route="%s",code="200"\} (\d+)' % route, text,
                  re.M)
    return int(m.group(1)) if m else 0


@test
def log_levels_and_format_change_what_squishd_writes_at_once():
    s = Squishd(workers="emu:1", extra=["--access-log", "1"])
    try:
        s.wait_ready(workers=1)
        add_emulated(s, R50)
        # Debug lines (Triton's verbose ones): squishd writes one per
        # request before its answer, so its absence is known at the answer.
        assert infer_v2(s, "r50", "quiet-1").status == 200
        assert "request id=quiet-1 " not in s.read_log()
        r = post(s, "/v2/logging", {"log_verbose_level": 1})
        assert r.status == 200 and r.json["log_verbose_level"] == 1, r
        assert infer_v2(s, "r50", "loud-1").status == 200
        assert "request id=loud-1 " in s.read_log()
        assert post(s, "/v2/logging", {"log_verbose_level": 0}).status == 200
        assert infer_v2(s, "r50", "quiet-2").status == 200
        assert "request id=quiet-2 " not in s.read_log()
        # Info lines: --access-log's, written when h2o frees the request.
        # /metrics counts the request in the same hook, just before: once
        # it counted the quiet one, its line would be there.
        assert post(s, "/v2/logging", {"log_info": False}).status == 200
        before = http_count(s, "health_live")
        assert s.get("/v2/health/live?mark=quiet").status == 200
        eventually(lambda: http_count(s, "health_live") > before, 10, "the request counted")
        time.sleep(0.1)
        r = post(s, "/v2/logging", {"log_info": True})
        assert r.status == 200 and r.json["log_info"], r
        assert s.get("/v2/health/live?mark=loud").status == 200
        eventually(lambda: "mark=loud" in s.read_log(), 10, "the access line")
        assert "mark=quiet" not in s.read_log(), "an access line written while info was off"
        # The format: Triton's ISO8601 layout from the next line on (the
        # line that says so is the first), and back.
        r = post(s, "/v2/logging", {"log_format": "ISO8601"})
        assert r.status == 200 and r.json["log_format"] == "ISO8601", r
        iso = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I %d squishd\] log settings changed"
                         % s.proc.pid, re.M)
        assert iso.search(s.read_log()), s.read_log()[-600:]
        assert s.get("/v2/health/live?mark=iso").status == 200
        eventually(lambda: re.search(r"Z I \d+ squishd\] access method=GET "
                                     r'path="/v2/health/live\?mark=iso"', s.read_log()),
                   10, "an access line in ISO8601")
        assert post(s, "/v2/logging", {"log_format": "default"}).status == 200
        assert re.search(r"^\d{4}-\d\d-\d\dT[0-9:.]+Z squishd level=info log settings changed",
                         s.read_log(), re.M)
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def trace_settings_global_and_per_model_with_null_back_to_the_global_ones():
    s, path = traced_squishd()
    try:
        s.wait_ready(workers=1)
        add_emulated(s, R50)
        add_emulated(s, R18)
        for method, url in [("GET", "/v2/trace/setting"), ("POST", "/v2/trace/setting"),
                            ("GET", "/v2/models/r50/trace/setting"),
                            ("POST", "/v2/models/r50/trace/setting")]:
            r = s.request(method, url, body="{}" if method == "POST" else None)
            assert r.status == 401, (method, url, r)
        default = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
                   "log_frequency": "0", "trace_file": path, "trace_mode": "triton"}
        assert get(s, "/v2/trace/setting", "trace_settings").json == default
        assert get(s, "/v2/models/r50/trace/setting", "trace_settings").json == default
        r = get(s, "/v2/models/nope/trace/setting")
        assert r.status == 404 and r.json["code"] == "model_not_found", r
        # A model's own settings over the global ones.
        r = post(s, "/v2/models/r50/trace/setting",
                 {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}, "trace_settings")
        assert r.status == 200, r
        assert r.json == dict(default, trace_level=["TIMESTAMPS"], trace_rate="1"), r.json
        assert get(s, "/v2/trace/setting").json == default
        assert get(s, "/v2/models/r18/trace/setting").json == default
        # Traced: r50's requests, not r18's (global: off).
        for i in range(3):
            assert infer_v2(s, "r50", "a%d" % i).status == 200
            assert infer_v2(s, "r18", "b%d" % i).status == 200
        lines = settled_lines(path, 3)
        assert [(ln["model_name"], ln["request_id"]) for ln in lines] == \
            [("r50", "a0"), ("r50", "a1"), ("r50", "a2")], lines
        # The global settings change what r50 did not set itself.
        r = post(s, "/v2/trace/setting", {"trace_rate": "7", "trace_count": 5})
        assert r.status == 200 and r.json["trace_count"] == "5", r
        r50 = get(s, "/v2/models/r50/trace/setting").json
        assert (r50["trace_level"], r50["trace_rate"], r50["trace_count"]) == \
            (["TIMESTAMPS"], "1", "5"), r50
        # null: back to the global value; all of them: the global setting.
        r = post(s, "/v2/models/r50/trace/setting", {"trace_rate": None})
        assert r.status == 200 and r.json["trace_rate"] == "7" and \
            r.json["trace_level"] == ["TIMESTAMPS"], r
        r = post(s, "/v2/models/r50/trace/setting", {"trace_level": None})
        assert r.json == dict(default, trace_rate="7", trace_count="5"), r.json
        assert infer_v2(s, "r50", "a3").status == 200
        time.sleep(0.3)
        assert len(trace_lines(path)) == 3, "global level OFF: not traced"
        # Refused, each saying which and why; nothing changes.
        before = get(s, "/v2/trace/setting").json
        refused(post(s, "/v2/trace/setting", {"trace_level": ["TENSORS"]}), "TENSORS")
        refused(post(s, "/v2/trace/setting", {"trace_file": "/tmp/elsewhere.json"}),
                "trace_file", "--trace-file")
        refused(post(s, "/v2/models/r50/trace/setting", {"log_frequency": "10"}),
                "log_frequency", "/v2/trace/setting")
        refused(post(s, "/v2/trace/setting", {"trace_mode": "opentelemetry"}), "trace_mode")
        refused(post(s, "/v2/trace/setting", {"trace_rate": "often"}), "trace_rate")
        refused(post(s, "/v2/trace/setting", {"trace_count": "-2"}), "trace_count")
        refused(post(s, "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"],
                                              "trace_rate": "0"}), "trace_rate")
        refused(post(s, "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"], "sampler": 1}),
                "sampler")
        assert get(s, "/v2/trace/setting").json == before
        # What GET gave may be sent back whole.
        assert post(s, "/v2/trace/setting", before).json == before
        assert s.stop() == 0
    finally:
        s.cleanup()
        shutil.rmtree(s.tmp, ignore_errors=True)


def check_line(ln, model="r50"):
    """A trace line: its schema, the model, and its moments in order, each
    no earlier than the one before."""
    validate(ln, "trace_line")
    assert ln["model_name"] == model and ln["model_version"] == 1, ln
    names = [t["name"] for t in ln["timestamps"]]
    assert names == [n for n in STAMPS if n in names], names
    times = [t["us"] for t in ln["timestamps"]]
    assert times == sorted(times), ln
    return {t["name"]: t["us"] for t in ln["timestamps"]}


@test
def rate_and_count_pick_the_requests_and_each_line_holds_their_moments_in_order():
    s, path = traced_squishd()
    try:
        s.wait_ready(workers=1)
        add_emulated(s, R50)
        assert infer_v2(s, "r50", "warm").status == 200  # its load
        # Rate 2: every second request, 5 of 10 (Triton's sampling).
        r = post(s, "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"], "trace_rate": "2"})
        assert r.status == 200, r
        for i in range(10):
            assert infer_v2(s, "r50", "r%d" % i).status == 200
        lines = settled_lines(path, 5)
        assert [ln["request_id"] for ln in lines] == ["r1", "r3", "r5", "r7", "r9"], lines
        assert [ln["id"] for ln in lines] == [1, 2, 3, 4, 5]
        for ln in lines:
            at = check_line(ln)
            assert ln["status"] == 200 and ln["items"] == 1 and ln["batch_size"] == 1, ln
            assert set(at) == set(STAMPS) - {"decode_start", "decode_end"}, ln
            # The worker's run: an emulated batch of one holds l(1) = 6.1 ms.
            assert 5000 <= at["execute_end"] - at["execute_start"] <= 1000000, at
        # Count 3: three traces, then none; GET says none are left.
        r = post(s, "/v2/trace/setting", {"trace_rate": "1", "trace_count": "3"})
        assert r.status == 200 and r.json["trace_count"] == "3", r
        for i in range(6):
            assert infer_v2(s, "r50", "c%d" % i).status == 200
        lines = settled_lines(path, 8)
        assert [ln["request_id"] for ln in lines[5:]] == ["c0", "c1", "c2"], lines[5:]
        assert get(s, "/v2/trace/setting").json["trace_count"] == "0"
        # JPEGs: their decode too; two in one request are 2 items.
        assert post(s, "/v2/trace/setting", {"trace_count": "-1"}).status == 200
        r = s.request("POST", "/v1/models/r50/infer", body=photo(),
                      headers={"Content-Type": "image/jpeg", "X-Request-Id": "jpeg-1"})
        assert r.status == 200, r
        body, ctype = tm.multipart([("a", None, None, photo()), ("b", None, None, photo())])
        r = s.request("POST", "/v1/models/r50/infer", body=body,
                      headers={"Content-Type": ctype, "X-Request-Id": "jpeg-2"})
        assert r.status == 200, r
        # A request refused after it arrived: traced with its 400.
        r = infer_v2(s, "r50", "bad-1", shape=(1, 3, 8, 7))
        assert r.status == 400, r
        lines = settled_lines(path, 11)
        one, two, bad = lines[8:]
        assert (one["request_id"], two["request_id"], bad["request_id"]) == \
            ("jpeg-1", "jpeg-2", "bad-1")
        at = check_line(one)
        assert set(at) == set(STAMPS) and one["items"] == 1, one
        assert at["decode_end"] > at["decode_start"], "a photo takes some µs to decode"
        at = check_line(two)
        assert set(at) == set(STAMPS) and two["items"] == 2, two
        at = check_line(bad)
        assert bad["status"] == 400 and set(at) == {"receive", "reply"}, bad
        # log_frequency: the next lines in indexed files of 2 each.
        assert post(s, "/v2/trace/setting", {"log_frequency": "2"}).status == 200
        for i in range(4):
            assert infer_v2(s, "r50", "f%d" % i).status == 200
        eventually(lambda: len(trace_lines(path + ".1")) == 2, 10, "trace.jsonl.1")
        assert [ln["request_id"] for ln in trace_lines(path + ".0")] == ["f0", "f1"]
        assert [ln["request_id"] for ln in trace_lines(path + ".1")] == ["f2", "f3"]
        assert len(trace_lines(path)) == 11
        assert s.stop() == 0
    finally:
        s.cleanup()
        shutil.rmtree(s.tmp, ignore_errors=True)


@test
def a_cpu_worker_logs_at_squishds_log_level():
    """--log-level reaches every worker squishd starts: a cpu worker once
    lost it with the emulator's --memory-mb, and logged at info while
    squishd logged at debug."""
    s = Squishd(workers="cpu:1", extra=["--log-level", "debug"])
    try:
        s.wait_ready(workers=1)
        body, ctype = tm.multipart([
            ("model", "m.onnx", None, tm.tiny()),
            ("config", None, None, json.dumps({"name": "tiny", "max_batch": 2}).encode())])
        r = s.request("POST", "/models", body=body,
                      headers=dict(auth(s), **{"Content-Type": ctype}))
        assert r.status == 202, r
        eventually(lambda: s.get("/v2/models/tiny/ready").status == 200, 60, "tiny measured")
        r = s.request("POST", "/v2/models/tiny/infer", body=json.dumps({"inputs": [{
            "name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32],
            "data": [0.5] * (3 * 32 * 32)}]}), headers={"Content-Type": "application/json"})
        assert r.status == 200, r
        eventually(lambda: re.search(r"squish-worker\[cpu[^\]]*\] level=debug batch done",
                                     s.read_log()), 10, "the worker's debug line")
        assert s.stop() == 0
    finally:
        s.cleanup()


if __name__ == "__main__":
    run()
