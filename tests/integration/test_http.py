"""The HTTP side (gateway/http.c): several HTTP threads that lose no
connection, request header limits (431), model readiness by status code,
and request bodies that never take squishd down."""

import http.client
import json
import os
import resource
import socket
import subprocess

from harness import BUILD, Skip, Squishd, eventually, run, test

LOADGEN = os.path.join(BUILD, "bench", "squish-loadgen")

# A near-zero-latency emulated model (l(b) = 0.001 b + 0.01 ms): the HTTP
# side, not the device, is what the traffic exercises.
FAST = {"name": "fast", "profile": {"alpha_ms": 0.001, "beta_ms": 0.01}, "max_batch": 64,
        "default_slo_ms": 100, "input": {"shape": [3, 16, 16]}, "num_classes": 3}


def add_model(s, cfg):
    r = s.request("POST", "/models", body=json.dumps(cfg),
                  headers={"Authorization": "Bearer " + s.token,
                           "Content-Type": "application/json"})
    assert r.status == 201, r


def closed_loop(s, inflight, seconds):
    """`inflight` requests always in flight for `seconds` (a new one on each
    answer), over as many keep-alive connections: every outcome counted."""
    out = subprocess.run(
        [LOADGEN, "--port", str(s.port), "--path", "/v2/models/fast/infer", "--tensor",
         "3x16x16", "--dtype", "UINT8", "--slo-ms", "100", "--late-ms", "5000",
         "--timeout-ms", "5000", "--closed", str(inflight), "--connections", str(inflight),
         "--duration", str(seconds), "--warmup", "0"],
        capture_output=True, text=True, timeout=seconds + 60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@test
def two_http_threads_answer_every_request_exactly_once():
    # With two threads, h2o state created on the main thread and shared by
    # both loops corrupted the heap within a second or two of this traffic:
    # connections reset, then squishd aborted.
    # Tight timers (the harness's wide ones would hold each batch 30 ms):
    # thousands of answers a second, coming back to both threads at once.
    s = Squishd(workers="emu:1",
                extra=["--http-threads", "2", "--timer-slack-us", "1000", "--dispatch-margin-us",
                       "3000", "--epoch-min-interval-ms", "1000"])
    try:
        s.wait_ready(workers=1)
        add_model(s, FAST)
        total = 0
        for inflight, seconds in ((64, 3), (256, 2)):
            res = closed_loop(s, inflight, seconds)
            assert res["conn_errors"] == 0 and res["timeouts"] == 0, res
            assert res["errors"] == 0 and res["unsent"] == 0 and res["stray_answers"] == 0, res
            assert res["good"] + res["late"] + res["dropped"] == res["requests"], res
            # One connection each: none was closed under the client.
            assert res["connections_opened"] == inflight, res
            total += res["requests"]
        assert total >= 500, total
        assert s.proc.poll() is None, "squishd exited"
        r = s.get("/metrics")
        assert r.status == 200
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def request_headers_past_the_limit_are_431_with_the_error_body():
    s = Squishd(workers="none", extra=["--max-header-kb", "16"])
    try:
        # One 70 KB field, and many small ones adding up past 16 KiB.
        for headers in ({"X-Big": "a" * 70000},
                        {"X-F%02d" % i: "b" * 200 for i in range(90)}):
            r = s.get("/v2", headers=headers)
            assert r.status == 431 and r.json["code"] == "headers_too_large", r
            assert "16 KiB" in r.json["error"], r
        r = s.get("/v2", headers={"X-Fine": "c" * 12000}, schema_name="server_metadata")
        assert r.status == 200, r
        r = s.get("/metrics")
        assert 'route="headers_too_large",code="431"' in r.raw.decode(), r.raw[-2000:]
    finally:
        s.stop()
        s.cleanup()
    # The default: 32 KiB.
    s = Squishd(workers="none")
    try:
        assert s.get("/v2", headers={"X-Big": "a" * 70000}).status == 431
        assert s.get("/v2", headers={"X-Big": "a" * 30000}).status == 200
    finally:
        s.stop()
        s.cleanup()


def vm_size_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1])
    raise AssertionError("no VmSize")


def post_raw(port, path, body, headers):
    """A request whose body is sent in pieces; (status, json) or the
    connection error."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        head = "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % (path, len(body))
        head += "".join("%s: %s\r\n" % kv for kv in headers.items()) + "\r\n"
        s.sendall(head.encode())
        view = memoryview(body)
        for off in range(0, len(body), 1 << 20):
            s.sendall(view[off:off + (1 << 20)])
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + int(
                [l for l in data.split(b"\r\n") if l.lower().startswith(b"content-length:")][0]
                .split(b":")[1]):
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionResetError("closed after %d bytes" % len(data))
            data += chunk
        status = int(data.split(b" ", 2)[1])
        return status, json.loads(data[data.index(b"\r\n\r\n") + 4:])
    finally:
        s.close()


# 120 MiB: h2o buffers it in a 128 MiB mapping (doubling from 64 MiB, so
# 192 MiB at its peak); a second copy of the body needs 120 MiB more.
BIG = 120 << 20
HEADROOM = 224 << 20


@test
def a_body_squishd_cannot_copy_is_answered_not_fatal():
    # squishd's address space is capped a little above what h2o needs to
    # buffer the body: the old second copy of every request body (aborting
    # allocation) killed squishd here; now the body is read where h2o holds
    # it, and the requests get their answers (not an image, bad multipart).
    s = Squishd(workers="emu:1", extra=["--http-threads", "1"])
    try:
        s.wait_ready(workers=1)
        add_model(s, FAST)
        junk = b"\x00not an image" * 16
        r = s.request("POST", "/v1/models/fast/infer", body=junk)
        assert r.status == 415 and r.json["code"] == "unsupported_media_type", r
        # At rest first: the first epoch planned (on the planner thread,
        # whose first allocation maps a malloc arena: 64 MB and more of
        # address space) and its report stored, before the cap is measured.
        eventually(lambda: s.get("/v1/plan").json.get("epoch", 0) >= 1, 10, "the first plan")
        base = vm_size_kb(s.proc.pid) * 1024
        if base > (1 << 40):
            raise Skip("an ASan build reserves terabytes of address space")
        limit = base + HEADROOM
        resource.prlimit(s.proc.pid, resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
        big = bytes(BIG)
        status, body = post_raw(s.port, "/v1/models/fast/infer", big,
                                {"Content-Type": "image/jpeg"})
        assert status == 415 and body["code"] == "unsupported_media_type", (status, body)
        status, body = post_raw(s.port, "/models", big,
                                {"Content-Type": "multipart/form-data; boundary=xyz",
                                 "Authorization": "Bearer " + s.token})
        assert status == 400 and body["code"] == "bad_multipart", (status, body)
        resource.prlimit(s.proc.pid, resource.RLIMIT_AS,
                         (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        assert s.proc.poll() is None, "squishd exited"
        assert s.get("/v2/health/ready").status == 200
        assert s.stop() == 0
    finally:
        s.cleanup()



@test
def compressed_bodies_are_inflated_within_the_body_limit():
    # Issue 24: Triton's client sends request_compression_algorithm bodies
    # (Content-Encoding gzip or deflate); squishd answered 400 "invalid JSON
    # at byte 0". Inflated before any route reads them, with --max-body-mb
    # applied to what they inflate to: a zip bomb is 413, not memory.
    import gzip
    import zlib
    s = Squishd(workers="emu:1", extra=["--max-body-mb", "2"])
    try:
        s.wait_ready(workers=1)
        add_model(s, FAST)
        row = [0.5] * (3 * 16 * 16)
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16],
                                       "datatype": "FP32", "data": row}]}).encode()
        header = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16],
                                         "datatype": "FP32",
                                         "parameters": {"binary_data_size": 3 * 16 * 16 * 4}}]})
        binary = header.encode() + b"\0" * (3 * 16 * 16 * 4)
        url = "/v2/models/fast/infer"
        for name, enc, data, extra in (
                ("gzip", "gzip", gzip.compress(body), {}),
                ("zlib", "deflate", zlib.compress(body), {}),
                ("raw deflate", "deflate", zlib.compress(body)[2:-4], {}),
                ("binary gzip", "gzip", gzip.compress(binary),
                 {"Inference-Header-Content-Length": str(len(header))})):
            r = s.request("POST", url, body=data,
                          headers=dict({"Content-Encoding": enc}, **extra))
            assert r.status == 200, (name, r)
        # 64 MiB of zeros is 64 KiB of gzip: past the 2 MiB limit once inflated.
        bomb = gzip.compress(b"\0" * (64 << 20))
        r = s.request("POST", url, body=bomb, headers={"Content-Encoding": "gzip"})
        assert r.status == 413 and "--max-body-mb" in r.json["error"], r
        r = s.request("POST", url, body=b"not gzip", headers={"Content-Encoding": "gzip"})
        assert r.status == 400 and "inflated" in r.json["error"], r
        r = s.request("POST", url, body=gzip.compress(body)[:-20],
                      headers={"Content-Encoding": "gzip"})
        assert r.status == 400, r
        r = s.request("POST", url, body=body, headers={"Content-Encoding": "br"})
        assert r.status == 415 and "gzip" in r.json["error"], r
        assert s.request("POST", url, body=body).status == 200  # and plain still works
        assert s.stop() == 0
    finally:
        s.cleanup()


# Many classes: answers of a few KiB, above the size from which squishd
# compresses (1 KiB), JSON and binary alike.
WIDE = {"name": "wide", "profile": {"alpha_ms": 0.001, "beta_ms": 0.01}, "max_batch": 8,
        "default_slo_ms": 1000, "input": {"shape": [3, 4, 4]}, "num_classes": 300}


def fetch(s, method, path, body=None, headers=None):
    """(status, lower-case headers, raw body): the body as it came, not
    decoded (the harness reads JSON bodies as text)."""
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


@test
def answers_are_compressed_as_accept_encoding_asks():
    # Issue 24: Triton's client asks for compressed answers with
    # response_compression_algorithm (Accept-Encoding: gzip or deflate) and
    # decodes them by Content-Encoding (gzip; deflate as zlib); squishd
    # ignored the header. Bodies from 1 KiB on are compressed when the
    # client accepts it (q-values and identity honoured), with Vary.
    import gzip
    import zlib
    s = Squishd(workers="emu:1")
    try:
        s.wait_ready(workers=1)
        add_model(s, WIDE)
        url = "/v2/models/wide/infer"
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 4, 4],
                                       "datatype": "FP32", "data": [0.25] * 48}]})
        status, h, plain = fetch(s, "POST", url, body)
        assert status == 200 and "content-encoding" not in h, (status, h)
        assert len(plain) > 1024 and h["vary"] == "accept-encoding", (len(plain), h)
        want = json.loads(plain)["outputs"]
        for accept, coding, decode in (("gzip", "gzip", gzip.decompress),
                                       ("deflate", "deflate", zlib.decompress),
                                       ("gzip;q=0.5, deflate;q=0.9", "deflate", zlib.decompress),
                                       ("identity;q=0.1, *", "gzip", gzip.decompress)):
            status, h, raw = fetch(s, "POST", url, body, {"Accept-Encoding": accept})
            assert status == 200 and h.get("content-encoding") == coding, (accept, h)
            assert h["vary"] == "accept-encoding" and int(h["content-length"]) == len(raw), h
            assert len(raw) < len(plain), (accept, len(raw), len(plain))
            answer = json.loads(decode(raw))
            assert answer["outputs"] == want, accept
        for accept in ("gzip;q=0", "identity", "br", "gzip;q=0.5, identity"):
            status, h, raw = fetch(s, "POST", url, body, {"Accept-Encoding": accept})
            assert status == 200 and "content-encoding" not in h, (accept, h)
            assert json.loads(raw)["outputs"] == want, accept
        # Triton's binary extension: the header's length is that of the
        # inflated body's JSON part.
        header = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 4, 4],
                                         "datatype": "FP32",
                                         "parameters": {"binary_data_size": 48 * 4}}],
                             "parameters": {"binary_data_output": True}}).encode()
        status, h, raw = fetch(s, "POST", url, header + b"\0" * (48 * 4),
                               {"Inference-Header-Content-Length": str(len(header)),
                                "Accept-Encoding": "gzip"})
        assert status == 200 and h.get("content-encoding") == "gzip", h
        assert h["content-type"] == "application/octet-stream", h
        inflated = gzip.decompress(raw)
        hl = int(h["inference-header-content-length"])
        head = json.loads(inflated[:hl])
        assert head["outputs"][0]["parameters"]["binary_data_size"] == 300 * 4, head
        assert len(inflated) == hl + 300 * 4, (len(inflated), hl)
        # Tiny answers go as they are, whatever was asked.
        status, h, raw = fetch(s, "GET", "/v2/health/live", None, {"Accept-Encoding": "gzip"})
        assert status == 200 and "content-encoding" not in h and "vary" not in h, h
        assert json.loads(raw) == {"live": True}
        # /metrics: plain text for a scraper that does not ask, gzip for
        # one that does (Prometheus does).
        status, h, text = fetch(s, "GET", "/metrics")
        assert status == 200 and "content-encoding" not in h and b"# HELP" in text, h
        status, h, raw = fetch(s, "GET", "/metrics", None, {"Accept-Encoding": "gzip"})
        assert status == 200 and h.get("content-encoding") == "gzip", h
        assert gzip.decompress(raw).startswith(b"# HELP"), raw[:40]
        # Compressed both ways, as Triton's client sends with both options.
        status, h, raw = fetch(s, "POST", url, gzip.compress(body.encode()),
                               {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"})
        assert status == 200 and h.get("content-encoding") == "gzip", h
        assert json.loads(gzip.decompress(raw))["outputs"] == want
        assert s.stop() == 0
    finally:
        s.cleanup()


def gzip_of_spaces(prefix, mib):
    """prefix, then mib MiB of spaces, gzipped (about 1 KiB per MiB)."""
    import zlib
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b" " * (1 << 20)
    parts = [z.compress(prefix)] + [z.compress(chunk) for _ in range(mib)]
    return b"".join(parts) + z.flush()


@test
def a_large_compressed_body_inflates_without_holding_up_other_requests():
    # Issue 24: the inflate ran on the HTTP thread that read the body (about
    # 3 ms per MB here): while a body inflated to hundreds of MB, every
    # other connection of that thread waited. A body that inflates past
    # 1 MiB goes on inflating on the offload thread, and its route runs
    # once it is back. One HTTP thread: a short request sent while 240 MiB
    # inflate is answered first (the large one's route, a 404, answers at
    # once after its inflate: with the inflate on the loop it came first).
    import gzip
    import threading
    import time
    s = Squishd(workers="emu:1", extra=["--http-threads", "1"])
    try:
        s.wait_ready(workers=1)
        add_model(s, FAST)
        big = gzip_of_spaces(b"{}", 240)
        assert len(big) < (1 << 20), len(big)
        done = {}
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/v2/no/such/route", body=big, headers={"Content-Encoding": "gzip"})

        def answer():
            r = conn.getresponse()
            done["big"] = (time.monotonic(), r.status, r.read())

        reader = threading.Thread(target=answer)
        reader.start()
        time.sleep(0.05)  # the body is in, its inflate under way
        small = s.get("/v2/health/live")
        done["small"] = time.monotonic()
        reader.join(60)
        conn.close()
        assert small.status == 200, small
        assert "big" in done, "no answer to the large body"
        at, status, raw = done["big"]
        assert status == 404 and b"no such route" in raw, (status, raw)
        assert done["small"] < at, "the short request waited for the inflate (%.3f s after)" % (
            done["small"] - at)
        # What inflates off the loop reaches its route whole, and its
        # errors are the same: a request padded past 1 MiB is served...
        row = [0.5] * (3 * 16 * 16)
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16],
                                       "datatype": "FP32", "data": row}]}).encode()
        r = s.request("POST", "/v2/models/fast/infer", body=gzip_of_spaces(body, 8),
                      headers={"Content-Encoding": "gzip"})
        assert r.status == 200 and r.json["outputs"][0]["shape"] == [1, 3], r
        # ...and one that breaks off after 8 MiB is a 400, as inline.
        r = s.request("POST", "/v2/models/fast/infer", body=gzip_of_spaces(body, 8)[:-200],
                      headers={"Content-Encoding": "gzip"})
        assert r.status == 400 and "truncated" in r.json["error"], r
        assert s.stop() == 0
    finally:
        s.cleanup()


if __name__ == "__main__":
    run()
