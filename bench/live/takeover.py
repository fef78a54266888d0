#!/usr/bin/python3
"""Takeover time of a standby squishd: two squishd on one PostgreSQL model
DB (run under tests/modeldb/pg_cluster.py, which starts a private cluster
and sets SQUISH_TEST_PG); the leader is SIGKILLed N times, each time the
survivor should lead. Measured: from the kill to the standby's
/v2/health/ready answering 200 (it leads, read the models and has its
worker up), and to the first 200 inference answer. A fresh squishd then
takes the standby's place for the next round. Prints one line per kill and
the median and max.

    tests/modeldb/pg_cluster.py /usr/bin/python3 bench/live/takeover.py BUILD [--kills 10]
        [--leader-timeout-ms 5000]
"""

import argparse
import http.client
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import tempfile
import time

MODEL = {"name": "m", "profile": {"alpha_ms": 1.0, "beta_ms": 2.0}, "max_batch": 8,
         "default_slo_ms": 100, "input": {"shape": [3, 4, 4]}, "num_classes": 3}


def get(port, path, method="GET", body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    except OSError:
        return None, b""
    finally:
        c.close()


def start(build, d, name, token_file, timeout_ms):
    port_file = os.path.join(d, name + ".port")
    if os.path.exists(port_file):
        os.unlink(port_file)
    log = open(os.path.join(d, name + ".log"), "ab")
    p = subprocess.Popen(
        [os.path.join(build, "gateway", "squishd"), "--listen", "127.0.0.1:0", "--port-file",
         port_file, "--db", os.environ["SQUISH_TEST_PG"], "--admin-token-file", token_file,
         "--socket", os.path.join(d, name + ".sock"), "--workers", "emu:1",
         "--leader-timeout-ms", str(timeout_ms), "--worker-bin",
         os.path.join(build, "worker", "squish-worker")], stdout=log, stderr=subprocess.STDOUT)
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        time.sleep(0.01)
    return p, int(open(port_file).read())


def wait(pred, timeout=30):
    t = time.time() + timeout
    while time.time() < t:
        if pred():
            return time.time()
        time.sleep(0.005)
    raise SystemExit("timed out")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--leader-timeout-ms", type=int, default=5000)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="squish-takeover-")
    token = os.path.join(d, "admin.token")
    with open(token, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    os.chmod(token, 0o600)
    infer = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 4, 4], "datatype": "FP32",
                                    "data": [0.5] * 48}]})
    procs = []
    try:
        leader = start(a.build, d, "s0", token, a.leader_timeout_ms)
        procs.append(leader[0])
        wait(lambda: get(leader[1], "/v2/health/ready")[0] == 200)
        st, _ = get(leader[1], "/models", "POST", json.dumps(MODEL),
                    {"Authorization": "Bearer " + open(token).read().strip(),
                     "Content-Type": "application/json"})
        assert st in (201, 409), st
        ready, served = [], []
        for k in range(a.kills):
            standby = start(a.build, d, "s%d" % (k + 1), token, a.leader_timeout_ms)
            procs.append(standby[0])
            wait(lambda: b'"standby"' in get(standby[1], "/v2/health/ready")[1])
            wait(lambda: get(leader[1], "/v2/models/m/infer", "POST", infer)[0] == 200)
            leader[0].send_signal(signal.SIGKILL)
            leader[0].wait()
            t0 = time.time()
            t_ready = wait(lambda: get(standby[1], "/v2/health/ready")[0] == 200)
            t_served = wait(lambda: get(standby[1], "/v2/models/m/infer", "POST", infer)[0] == 200)
            ready.append(t_ready - t0)
            served.append(t_served - t0)
            print(json.dumps({"kill": k + 1, "ready_s": round(t_ready - t0, 3),
                              "first_200_s": round(t_served - t0, 3)}), flush=True)
            leader = standby
        print("takeover over %d kills (--leader-timeout-ms %d): ready median %.2f s max %.2f s; "
              "first 200 median %.2f s max %.2f s" % (
                  a.kills, a.leader_timeout_ms, statistics.median(ready), max(ready),
                  statistics.median(served), max(served)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
