"""The HTTP side (gateway/http.c): several HTTP threads that lose no
connection, request header limits (431), model readiness by status code,
and request bodies that never take squishd down."""

import json
import os
import resource
import socket
import subprocess

from harness import BUILD, Squishd, run, test

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


if __name__ == "__main__":
    run()
