#!/usr/bin/env python3
"""CPU time squishd spends per readiness probe, beside the cheapest route:
one squishd (SQUISH_BUILD_DIR, default build) with one cpu worker and
mobilenet_v2 uploaded and measured; then N GET requests each of
/v2/health/live, /v2/models/mv2/ready and /v2/health/ready on one
connection, squishd's user + system CPU (from /proc) per request.

  /usr/bin/python3 bench/ready_cost.py [N]

Prints one JSON line per route."""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
os.environ.setdefault("SQUISH_BUILD_DIR", os.path.join(HERE, "..", "build"))
os.environ.setdefault("SQUISH_SOURCE_DIR", os.path.join(HERE, ".."))
os.environ.setdefault("SQUISH_TEST_MODELS", os.path.join(HERE, "..", "build", "tests", "models"))
from harness import Squishd  # noqa: E402
from test_models import upload  # noqa: E402


def cpu_s(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=60)
        with open(os.path.join(os.environ["SQUISH_TEST_MODELS"], "mobilenet_v2.onnx"), "rb") as f:
            upload(s, f.read(), {"name": "mv2", "max_batch": 4})
        while s.get("/v2/models/mv2/ready").status != 200:
            time.sleep(0.25)
        for path in ("/v2/health/live", "/v2/models/mv2/ready", "/v2/health/ready"):
            c0, t0 = cpu_s(s.proc.pid), time.time()
            for _ in range(n):
                assert s.get(path).status == 200
            print(json.dumps({"route": path, "requests": n,
                              "squishd_cpu_ms_per_request": round((cpu_s(s.proc.pid) - c0) * 1000 / n, 3),
                              "wall_ms_per_request": round((time.time() - t0) * 1000 / n, 3)}),
                  flush=True)
    finally:
        s.stop()
        s.cleanup()


if __name__ == "__main__":
    main()
