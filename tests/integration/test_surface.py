"""What every reply and every binary has in common, whatever the route: the
standard reason phrase on each status line (not "202 OK" or "503 Error"),
reals as the shortest decimal that reads back as the same double (not
0.025000000000000001, and no digit cut off either), and --version on every
binary, all with meson's project version."""

import gzip
import http.client
import json
import math
import os
import re
import socket
import subprocess
from decimal import Decimal

import tiny_models as tm
from harness import BUILD, SOURCE, SQUISHD, WORKER, Squishd, eventually, run, test

R50 = {"name": "r50", "profile": {"alpha_ms": 1.053, "beta_ms": 5.072}, "max_batch": 32,
       "default_slo_ms": 100, "input": {"shape": [3, 8, 8]}, "num_classes": 5}


def raw(s, method, path, body=None, headers=None):
    """(status, reason, body bytes) as the status line and body read."""
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.reason, r.read()
    finally:
        conn.close()


def auth(s, **more):
    return dict({"Authorization": "Bearer " + s.token}, **more)


def upload_body(model_bytes, name):
    return tm.multipart([("model", "m.onnx", "application/octet-stream", model_bytes),
                         ("config", "config.json", "application/json",
                          json.dumps({"name": name}).encode())])


@test
def status_lines_carry_the_standard_reason_phrase():
    s = Squishd(workers="none", extra=["--max-header-kb", "16", "--max-body-mb", "1"])
    try:
        infer = "/v2/models/r50/infer"
        cases = [
            ("GET", "/v2", None, {}, 200, "OK"),
            ("GET", "/metrics", None, {}, 200, "OK"),
            ("POST", "/models", json.dumps(R50), auth(s, **{"Content-Type": "application/json"}),
             201, "Created"),
            ("POST", "/models", b"{not json", auth(s, **{"Content-Type": "application/json"}),
             400, "Bad Request"),
            ("GET", "/models", None, {}, 401, "Unauthorized"),
            ("GET", "/no/such/route", None, {}, 404, "Not Found"),
            ("DELETE", "/v2", None, {}, 405, "Method Not Allowed"),
            # What the body inflates to is over --max-body-mb.
            ("POST", infer, gzip.compress(b" " * (2 << 20)),
             {"Content-Type": "application/json", "Content-Encoding": "gzip"}, 413,
             "Request Entity Too Large"),
            ("POST", infer, b"{}", {"Content-Type": "application/json",
                                    "Content-Encoding": "br"}, 415, "Unsupported Media Type"),
            ("GET", "/v2", None, {"X-Big": "a" * 20000}, 431, "Request Header Fields Too Large"),
            ("GET", "/v2/health/ready", None, {}, 503, "Service Unavailable"),
        ]
        body, ctype = upload_body(tm.tiny(), "tiny")
        cases.append(("POST", "/models", body, auth(s, **{"Content-Type": ctype}), 202,
                      "Accepted"))
        body, ctype = upload_body(tm.tiny(2), "tiny")
        cases.append(("POST", "/models", body, auth(s, **{"Content-Type": ctype}), 409,
                      "Conflict"))
        body, ctype = upload_body(tm.unsupported(), "u")
        cases.append(("POST", "/models", body, auth(s, **{"Content-Type": ctype}), 422,
                      "Unprocessable Entity"))
        for method, path, body, headers, status, reason in cases:
            got = raw(s, method, path, body, headers)
            assert got[:2] == (status, reason), (method, path, got[:2], got[2][:200])
        # h2o's own 413, on the Content-Length alone (no body is sent: h2o
        # answers and closes at once), has the same phrase as squishd's.
        with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
            sock.sendall(b"POST %s HTTP/1.1\r\nHost: squish\r\nContent-Type: application/json"
                         b"\r\nContent-Length: %d\r\n\r\n" % (infer.encode(), 2 << 20))
            r = http.client.HTTPResponse(sock)
            r.begin()
            assert (r.status, r.reason) == (413, "Request Entity Too Large"), (r.status, r.reason)
        assert s.stop() == 0
    finally:
        s.cleanup()


def check_reals(text, seen):
    """Parses a JSON reply, asserting of every real in it that it is the
    shortest decimal reading back as its double (Python's repr is: digits
    compared, not the layout) and that no NaN or Infinity is in it."""
    def real(token):
        x = float(token)
        assert math.isfinite(x), token
        got = Decimal(token).normalize().as_tuple()
        want = Decimal(repr(x)).normalize().as_tuple()
        assert got == want, "%s is not the shortest text of %r" % (token, x)
        seen.append(token)
        return x

    def constant(name):
        raise AssertionError("%s in a reply" % name)

    return json.loads(text, parse_float=real, parse_constant=constant)


@test
def reals_in_replies_are_the_shortest_text_that_reads_back():
    s = Squishd(workers="emu:1")
    try:
        s.wait_ready(workers=1)
        status, _, body = raw(s, "POST", "/models", json.dumps(R50),
                              auth(s, **{"Content-Type": "application/json"}))
        assert status == 201, body
        seen = []
        req = json.dumps({"parameters": {"slo_ms": 1000},
                          "inputs": [{"name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32",
                                      "data": [0.5] * 192}]})
        for _ in range(8):
            status, _, body = raw(s, "POST", "/v2/models/r50/infer", req,
                                  {"Content-Type": "application/json"})
            assert status == 200, body
            reply = check_reals(body, seen)
            assert "queue_ms" in reply["parameters"], reply
        # The timings: a real each unless it happened to be whole.
        assert len(seen) >= 8, seen
        for path in ("/v2/models/stats", "/v2/models/r50", "/v2/models/r50/config", "/v1/plan",
                     "/v2/health/ready"):
            status, _, body = raw(s, "GET", path)
            assert status == 200, (path, body)
            check_reals(body, seen)
        status, _, body = raw(s, "GET", "/models/r50", headers=auth(s))
        assert status == 200, body
        check_reals(body, seen)
        # The plan holds rates and duty cycles once an epoch has seen traffic.
        eventually(lambda: raw(s, "GET", "/v1/plan")[0] == 200, 10, "a plan")
        check_reals(raw(s, "GET", "/v1/plan?pretty=1")[2], seen)
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def every_binary_prints_its_version_and_exits_0():
    with open(os.path.join(SOURCE, "meson.build")) as f:
        version = re.search(r"version:\s*'([^']+)'", f.read()).group(1)
    binaries = {"squishd": SQUISHD, "squish-worker": WORKER,
                "squish-sim": os.path.join(BUILD, "bench", "squish-sim"),
                "squish-plan": os.path.join(BUILD, "planner", "squish-plan")}
    for name, path in binaries.items():
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (name, r)
        line = r.stdout
        assert line.count("\n") == 1 and line.startswith("%s %s" % (name, version)), (name, line)
        assert r.stderr == "", (name, r.stderr)


if __name__ == "__main__":
    run()
