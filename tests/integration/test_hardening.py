"""Hardening: every worker killed, hostile and oversized input, an attack
list walked route by route with the documented status for each."""

import io
import json
import os
import signal
import socket
import struct
import time

from PIL import Image

import tiny_models as tm
from harness import Squishd, eventually, run, test

R50 = {"name": "r50", "profile": {"alpha_ms": 1.053, "beta_ms": 5.072}, "max_batch": 32,
       "default_slo_ms": 100}


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def jpeg(w=64, h=48):
    out = io.BytesIO()
    Image.new("RGB", (w, h), (120, 30, 200)).save(out, "JPEG")
    return out.getvalue()


def bomb_jpeg(w, h):
    """A small valid JPEG whose header claims w x h (SOF0 rewritten)."""
    data = bytearray(jpeg(16, 16))
    i = data.find(b"\xff\xc0")
    struct.pack_into(">HH", data, i + 5, h, w)
    return bytes(data)


@test
def all_workers_dead_means_503_at_once_unless_they_are_back_before_the_deadline():
    s = Squishd(workers="emu:2", extra=["--restart-backoff-ms", "1500",
                                        "--restart-backoff-max-ms", "1500"])
    try:
        s.wait_ready(workers=2)
        r = s.request("POST", "/models", body=json.dumps(R50),
                      headers=dict(auth(s), **{"Content-Type": "application/json"}))
        assert r.status == 201, r
        img = jpeg()
        # The first request waits for the model's first load: a long SLO, so
        # that a loaded CI host does not turn it into a deadline drop.
        r = s.request("POST", "/v1/models/r50/infer", body=img, headers={"X-SLO-Ms": "3000"})
        assert r.status == 200, r
        for pid in s.worker_pids().values():
            os.kill(pid, signal.SIGKILL)
        # Both seen dead (ready also turns 503 as soon as the model's load is
        # gone with the first).
        eventually(lambda: (lambda r: r.status == 503 and r.json["error"] ==
                            "no worker is connected")(s.get("/v2/health/ready")), 3,
                   "both workers seen dead")
        # Its workers are restarted in 1.5 s: a request whose SLO ends sooner
        # is answered at once, not at its deadline...
        t0 = time.time()
        r = s.request("POST", "/v1/models/r50/infer", body=img, headers={"X-SLO-Ms": "1000"})
        assert r.status == 503 and r.json["code"] == "no_worker", r
        assert time.time() - t0 < 0.5, "answered at once, not at the deadline"
        assert r.headers.get("retry-after")
        # ...and one whose SLO leaves time waits for them: no request lost.
        r = s.request("POST", "/v1/models/r50/infer", body=img, headers={"X-SLO-Ms": "8000"})
        assert r.status == 200, r
        s.wait_ready(workers=2, timeout=10)
        eventually(lambda: s.request("POST", "/v1/models/r50/infer", body=img).status == 200, 10,
                   "service to come back")
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def the_attack_list_gets_the_documented_status_for_each():
    s = Squishd(workers="emu:1", extra=["--max-body-mb", "4", "--max-images", "4"])
    try:
        s.wait_ready(workers=1)
        r = s.request("POST", "/models", body=json.dumps(R50),
                      headers=dict(auth(s), **{"Content-Type": "application/json"}))
        assert r.status == 201, r
        wrong = {"Authorization": "Bearer " + "f" * len(s.token)}
        cases = [
            # management without or with a wrong token
            ("GET", "/models", None, {}, 401),
            ("GET", "/models", None, wrong, 401),
            ("DELETE", "/models/r50", None, wrong, 401),
            ("POST", "/models", b"{}", dict(wrong, **{"Content-Type": "application/json"}), 401),
            # paths never reach the filesystem
            ("GET", "/models/..%2F..%2Fetc%2Fpasswd", None, auth(s), 404),
            ("GET", "/v2/models/..%2Fadmin.token", None, {}, 404),
            ("POST", "/v1/models/..%2Fsquish.db/infer", jpeg(), {}, 404),
            ("GET", "/../../etc/passwd", None, {}, 404),
            # hostile bodies
            ("POST", "/v1/models/r50/infer", bomb_jpeg(60000, 60000), {}, 413),
            ("POST", "/v1/models/r50/infer", b"\x89PNG\r\n\x1a\n" + b"0" * 100, {}, 415),
            ("POST", "/v1/models/r50/infer", b"\xff\xd8\xff" + os.urandom(2000), {}, 400),
            ("POST", "/v2/models/r50/infer", b"[" * 200000, {}, None),
            ("POST", "/v2/models/r50/infer", b'{"inputs": "' + b"a" * 1000 + b'"}', {}, 400),
            ("POST", "/models", b'{"name": "x", "profile": ' + b"[" * 100000 + b"]" * 100000 + b"}",
             dict(auth(s), **{"Content-Type": "application/json"}), 400),
            ("POST", "/models", b'{"name": "../../x", "profile": {"alpha_ms": 1, "beta_ms": 1}}',
             dict(auth(s), **{"Content-Type": "application/json"}), 400),
        ]
        for method, path, body, headers, want in cases:
            r = s.request(method, path, body=body, headers=headers)
            if want is None:
                assert r.status in (400, 413), (path, r)
            else:
                assert r.status == want, (method, path, want, r)
        # Too many images in one request.
        body, ctype = tm.multipart([("i%d" % i, None, None, jpeg()) for i in range(5)])
        r = s.request("POST", "/v1/models/r50/infer", body=body, headers={"Content-Type": ctype})
        assert r.status == 413 and r.json["code"] == "too_large", r
        # A body over --max-body-mb.
        try:
            r = s.request("POST", "/v1/models/r50/infer", body=b"\xff\xd8" + b"0" * (5 << 20))
            assert r.status == 413, r
        except (ConnectionResetError, BrokenPipeError):
            pass
        # Huge headers are refused, and do not take the server down.
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
        try:
            sock.recv(100)
        except OSError:
            pass
        sock.close()
        # A slow client holding a connection open does not starve others.
        slow = socket.create_connection(("127.0.0.1", s.port))
        slow.sendall(b"POST /v1/models/r50/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        for _ in range(5):
            r = s.request("POST", "/v1/models/r50/infer", body=jpeg(), headers={"X-SLO-Ms": "2000"})
            assert r.status == 200, ("served beside a slow client", r)
        slow.close()
        eventually(lambda: s.get("/v2/health/ready").status == 200, 10, "ready")
        rc = s.stop()
        assert rc == 0, ("clean exit", rc, s.read_log()[-2000:])
    finally:
        s.cleanup()


if __name__ == "__main__":
    run()
