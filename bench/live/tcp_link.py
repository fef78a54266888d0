#!/usr/bin/python3
"""What one TCP link to a remote worker carries, against the same worker
on the UNIX socket and shared memory, side by side in interleaved rounds
(local, remote, local, remote...): an emulated device fast enough not to be
the bound (l(b) = 0.05 + 0.2 b ms, batches up to 32), 224x224x3 UINT8
tensor requests (150528 bytes in, 4000 out per image) from squish-loadgen
in a closed loop. Per run: requests/s answered 200, batches/s and the mean
batch (from /metrics), and the bytes/s that crossed the link (images in,
outputs back). Everything on 127.0.0.1.

    bench/live/tcp_link.py BUILD [--rounds 2] [--duration 10] [--closed 64]
"""

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.request

IN_BYTES, OUT_BYTES = 3 * 224 * 224, 1000 * 4
MODEL = {"name": "big", "profile": {"alpha_ms": 0.2, "beta_ms": 0.05}, "max_batch": 32,
         "default_slo_ms": 1000, "input": {"shape": [3, 224, 224]}, "num_classes": 1000}


def metric(port, name):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    return sum(float(m.group(1)) for m in
               re.finditer(r"^%s(?:\{[^}]*\})? ([0-9.e+]+)$" % re.escape(name), text, re.M))


def run(a, remote):
    d = tempfile.mkdtemp(prefix="squish-link-")
    token = os.path.join(d, "cluster.token")
    with open(token, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    os.chmod(token, 0o600)
    log = open(os.path.join(d, "squishd.log"), "wb")
    args = [os.path.join(a.build, "gateway", "squishd"), "--listen", "127.0.0.1:0",
            "--port-file", os.path.join(d, "port"), "--db", os.path.join(d, "s.db"),
            "--worker-bin", os.path.join(a.build, "worker", "squish-worker"),
            "--workers", "none" if remote else "emu:1", "--log-level", "warn"]
    if remote:
        args += ["--cluster-listen", "127.0.0.1:0", "--cluster-token-file", token,
                 "--log-level", "info"]
    procs = [subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)]
    try:
        while not (os.path.exists(os.path.join(d, "port")) and
                   open(os.path.join(d, "port")).read().strip()):
            time.sleep(0.01)
        port = int(open(os.path.join(d, "port")).read())
        if remote:
            addr = None
            while addr is None:
                m = re.search(r"cluster listening addr=(\S+)",
                              open(os.path.join(d, "squishd.log")).read())
                addr = m.group(1) if m else None
                time.sleep(0.01)
            procs.append(subprocess.Popen(
                [os.path.join(a.build, "worker", "squish-worker"), "--connect", "tcp://" + addr,
                 "--cluster-token-file", token, "--device", "emu:0", "--host-name", "bench"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        token_admin = open(os.path.join(d, "admin.token")).read().strip()
        for _ in range(500):
            try:
                if urllib.request.urlopen("http://127.0.0.1:%d/v2/health/ready" % port,
                                          timeout=5).status == 200:
                    break
            except OSError:
                time.sleep(0.02)
        req = urllib.request.Request("http://127.0.0.1:%d/models" % port,
                                     data=json.dumps(MODEL).encode(), method="POST",
                                     headers={"Authorization": "Bearer " + token_admin,
                                              "Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10)
        lg = [os.path.join(a.build, "bench", "squish-loadgen"), "--port", str(port), "--path",
              "/v2/models/big/infer", "--tensor", "3x224x224", "--dtype", "UINT8", "--closed",
              str(a.closed), "--slo-ms", "1000", "--timeout-ms", "10000"]
        subprocess.run(lg + ["--duration", "2"], capture_output=True, timeout=120)  # warm
        b0, i0 = metric(port, "squish_batches_total"), metric(port, "squish_batch_size_sum")
        t0 = time.time()
        out = subprocess.run(lg + ["--duration", str(a.duration)], capture_output=True,
                             text=True, timeout=a.duration + 120)
        dt = time.time() - t0
        res = json.loads(out.stdout)
        b1, i1 = metric(port, "squish_batches_total"), metric(port, "squish_batch_size_sum")
        batches, items = b1 - b0, i1 - i0
        return {"link": "tcp" if remote else "unix+shm", "ok_rps": round(res["good"] / dt, 1),
                "batches_per_s": round(batches / dt, 1),
                "mean_batch": round(items / batches, 2) if batches else 0,
                "link_MB_per_s": round(items * (IN_BYTES + OUT_BYTES) / dt / 1e6, 1),
                "errors": res["errors"] + res["conn_errors"] + res["timeouts"]}
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--closed", type=int, default=64)
    a = ap.parse_args()
    for _ in range(a.rounds):
        for remote in (False, True):
            print(json.dumps(run(a, remote)), flush=True)


if __name__ == "__main__":
    main()
