#!/usr/bin/python3
"""Symphony's table 2 live (ResNet50 profile x4 slowed, 8 emulated devices,
SLO 100 ms, deferred dispatch) with the devices local against the same 8
devices spread over two "hosts": network namespaces joined to squishd's by
veth pairs (4 remote emu workers each, over TCP with the cluster token).
Interleaved rounds (local, split, local, split...) at fixed rates; per run
the goodput (answered 200 within the SLO) from squish-loadgen. Needs root
and iproute2; the namespaces are removed afterwards.

    bench/live/netns_table2.py BUILD [--rates 1107,1245,1384] [--rounds 2]
"""

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
os.environ.setdefault("SQUISH_BUILD_DIR", sys.argv[1] if len(sys.argv) > 1 else "build")
import test_cluster as TC  # noqa: E402  (its Net: namespaces and veths)
from harness import Squishd  # noqa: E402

MODEL = {"name": "resnet50", "profile": {"alpha_ms": 4.212, "beta_ms": 20.288}, "max_batch": 64,
         "default_slo_ms": 100.0, "input": {"shape": [3, 32, 32]}, "num_classes": 10}
ARGS = ["--policy", "deferred", "--dispatch-margin-us=3000", "--epoch-min-interval-ms=1000",
        "--log-level", "warn"]


def run(a, net, split, rate):
    tmp = tempfile.mkdtemp(prefix="squish-t2-")
    token = os.path.join(tmp, "cluster.token")
    with open(token, "w") as f:
        f.write(secrets.token_hex(24))
    os.chmod(token, 0o600)
    workers = []
    extra = list(ARGS)
    if split:
        extra += ["--cluster-listen", "0.0.0.0:%d" % TC.PORT, "--cluster-token-file", token]
    s = Squishd(workers="none" if split else "emu:8", tmp=tmp, extra=extra)
    try:
        if split:
            for i, h in ((1, "h1"), (2, "h2")):
                for k in range(4):
                    workers.append(net.exec(h, [TC.WORKER, "--connect",
                                                "tcp://10.77.%d.1:%d" % (i, TC.PORT),
                                                "--cluster-token-file", token, "--device",
                                                "emu:%d" % k, "--host-name", h],
                                            os.path.join(tmp, "w-%s-%d.log" % (h, k))))
        s.wait_ready(workers=8, timeout=30)
        r = s.request("POST", "/models", body=json.dumps(MODEL),
                      headers={"Authorization": "Bearer " + s.token,
                               "Content-Type": "application/json"})
        assert r.status == 201, r
        out = subprocess.run(
            [TC.LOADGEN, "--port", str(s.port), "--path", "/v2/models/resnet50/infer", "--tensor",
             "3x32x32", "--slo-ms", "100", "--duration", str(a.duration), "--warmup", "3",
             "--seed", "1", "--rate", str(rate)], capture_output=True, text=True, timeout=300)
        res = json.loads(out.stdout)
        return {"devices": "2 netns hosts x 4 (TCP)" if split else "8 local", "rate": rate,
                "goodput_rps": res["goodput_rps"], "good": res["good"],
                "dropped": res["dropped"], "late": res["late"], "requests": res["requests"]}
    finally:
        s.stop()
        for w in workers:
            w.terminate()
            try:
                w.wait(10)
            except subprocess.TimeoutExpired:
                w.kill()
        s.cleanup()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rates", default="1107,1245,1384")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=int, default=5)
    a = ap.parse_args()
    net = TC.Net()
    rows = []
    try:
        for _ in range(a.rounds):
            for rate in [int(x) for x in a.rates.split(",")]:
                for split in (False, True):
                    r = run(a, net, split, rate)
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    finally:
        net.cleanup()
    for rate in sorted({r["rate"] for r in rows}):
        loc = [r["goodput_rps"] for r in rows if r["rate"] == rate and r["devices"] == "8 local"]
        spl = [r["goodput_rps"] for r in rows if r["rate"] == rate and r["devices"] != "8 local"]
        print("rate %d: local %s, split %s, split/local %.3f" % (
            rate, loc, spl, sum(spl) / max(sum(loc), 1e-9)))


if __name__ == "__main__":
    main()
