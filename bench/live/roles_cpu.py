#!/usr/bin/python3
"""What each role of a squish cluster spends per request (issue 25), and
Symphony's table 2 live through two frontends against one process.

Two set-ups on this machine, interleaved per round (single, split, single,
split ...), at each rate:
  single: squishd --role all with 8 emulated devices; one squish-loadgen.
  split:  squishd --role dispatcher with the same 8 devices (spawned, with
          data listeners) and two squishd --role frontend joined to it; one
          squish-loadgen on each frontend at half the rate.
The model is table 2's: ResNet-50's profile slowed 4x (alpha 4.212 ms, beta
20.288 ms), SLO 100 ms, deferred dispatch, binary FP32 tensors 3x32x32.

Per run: goodput (answered 200 within the SLO, from the loadgens) and the
CPU each process spent over the measured window (utime + stime from /proc,
the workers apart), per request answered: the dispatcher's process and its
dispatch thread (sq-dispatch), each frontend's process. The dispatcher's
own count of its frontends' link bytes is reported per item.

    bench/live/roles_cpu.py BUILD [--rates 300,600,1107,1245,1384] [--rounds 2]
        [--duration 8] [--warmup 2] [--model table2|fast]
"""

import argparse
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))

MODEL = {"name": "resnet50", "profile": {"alpha_ms": 4.212, "beta_ms": 20.288}, "max_batch": 64,
         "default_slo_ms": 100.0, "input": {"shape": [3, 32, 32]}, "num_classes": 10}
# --model fast: a small model at a tight SLO, for the dispatcher's cost at
# rates the table-2 profile cannot reach on 8 devices.
FAST = {"name": "resnet50", "profile": {"alpha_ms": 0.2, "beta_ms": 1.0}, "max_batch": 64,
        "default_slo_ms": 50.0, "input": {"shape": [3, 8, 8]}, "num_classes": 10}
ARGS = ["--policy", "deferred", "--dispatch-margin-us=3000", "--epoch-min-interval-ms=1000",
        "--log-level", "warn"]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid, tid=None):
    path = "/proc/%d/task/%d/stat" % (pid, tid) if tid else "/proc/%d/stat" % pid
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def thread_of(pid, name):
    for tid in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
            if f.read().strip() == name:
                return int(tid)
    return None


def metric(s, name, labels=""):
    text = s.get("/metrics").raw.decode()
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else 0.0


def loadgen(build, port, rate, a, seed):
    return subprocess.Popen(
        [os.path.join(build, "bench", "squish-loadgen"), "--port", str(port), "--path",
         "/v2/models/resnet50/infer", "--tensor", "x".join(map(str, a.model["input"]["shape"])),
         "--slo-ms", str(a.model["default_slo_ms"]), "--duration",
         str(a.duration), "--warmup", str(a.warmup), "--seed", str(seed), "--rate", str(rate)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(a, split, rate):
    from harness import Squishd
    tmp = tempfile.mkdtemp(prefix="squish-roles-")
    token = os.path.join(tmp, "cluster.token")
    with open(token, "w") as f:
        f.write(secrets.token_hex(24))
    os.chmod(token, 0o600)
    procs = []
    try:
        extra = list(ARGS)
        with socket.socket() as so:
            so.bind(("127.0.0.1", 0))
            cport = so.getsockname()[1]
        if split:
            extra += ["--role", "dispatcher", "--cluster-listen", "127.0.0.1:%d" % cport,
                      "--cluster-token-file", token]
        os.mkdir(os.path.join(tmp, "d"))
        d = Squishd(workers="emu:8", tmp=os.path.join(tmp, "d"), extra=extra)
        procs.append(d)
        d.wait_ready(workers=8, timeout=60)
        r = d.request("POST", "/models", body=json.dumps(a.model),
                      headers={"Authorization": "Bearer " + d.token,
                               "Content-Type": "application/json"})
        assert r.status == 201, r
        fronts = []
        if split:
            for k in range(2):
                os.mkdir(os.path.join(tmp, "f%d" % k))
                fronts.append(Squishd(workers="none", tmp=os.path.join(tmp, "f%d" % k),
                                      extra=ARGS + ["--role", "frontend", "--dispatcher",
                                                    "127.0.0.1:%d" % cport,
                                                    "--cluster-token-file", token]))
                procs.append(fronts[-1])
            for f in fronts:
                deadline = time.time() + 30
                while f.get("/v2/models/resnet50/ready").status != 200:
                    assert time.time() < deadline, "frontend not ready"
                    time.sleep(0.05)
        targets = fronts if split else [d]
        lgs = [loadgen(a.build, t.port, rate / len(targets), a, 1 + i)
               for i, t in enumerate(targets)]
        time.sleep(a.warmup)
        tid = thread_of(d.proc.pid, "sq-dispatch")
        c0 = [cpu_s(p.proc.pid) for p in procs] + [cpu_s(d.proc.pid, tid)]
        items0 = metric(d, "squish_frontend_items_total")
        link0 = (metric(d, "squish_frontend_link_bytes_total", '{direction="in"}')
                 + metric(d, "squish_frontend_link_bytes_total", '{direction="out"}'))
        time.sleep(a.duration)
        c1 = [cpu_s(p.proc.pid) for p in procs] + [cpu_s(d.proc.pid, tid)]
        items = metric(d, "squish_frontend_items_total") - items0
        link = (metric(d, "squish_frontend_link_bytes_total", '{direction="in"}')
                + metric(d, "squish_frontend_link_bytes_total", '{direction="out"}') - link0)
        res = [json.loads(lg.communicate(timeout=300)[0]) for lg in lgs]
        answered = sum(x["good"] + x["late"] for x in res)
        requests = sum(x["requests"] for x in res)
        us = [(b - a_) * 1e6 / max(answered, 1) for a_, b in zip(c0, c1)]
        return {"setup": "split" if split else "single", "rate": rate,
                "goodput_rps": round(sum(x["goodput_rps"] for x in res), 1),
                "good_pct": round(100.0 * sum(x["good"] for x in res) / max(requests, 1), 2),
                "answered": answered,
                "dispatcher_proc_us": round(us[0], 1),
                "dispatch_thread_us": round(us[-1], 1),
                "frontend_proc_us": [round(u, 1) for u in us[1:-1]],
                "link_bytes_per_item": round(link / items, 1) if items else None}
    finally:
        for p in reversed(procs):
            p.stop()
            p.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rates", default="300,600,1107,1245,1384")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=8)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--model", choices=("table2", "fast"), default="table2")
    a = ap.parse_args()
    a.model = FAST if a.model == "fast" else MODEL
    a.build = os.path.abspath(a.build)
    os.environ["SQUISH_BUILD_DIR"] = a.build
    rows = []
    for rnd in range(a.rounds):
        for rate in [float(x) for x in a.rates.split(",")]:
            for split in (False, True):
                row = run(a, split, rate)
                row["round"] = rnd + 1
                print(json.dumps(row), flush=True)
                rows.append(row)
    print("\n| round | rate | setup | goodput req/s | good % | dispatcher process us/req | "
          "dispatch thread us/req | frontends us/req | dispatcher link bytes/item |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %d | %g | %s | %.1f | %.2f | %.1f | %.1f | %s | %s |"
              % (r["round"], r["rate"], r["setup"], r["goodput_rps"], r["good_pct"],
                 r["dispatcher_proc_us"], r["dispatch_thread_us"],
                 ", ".join("%.1f" % u for u in r["frontend_proc_us"]) or "-",
                 r["link_bytes_per_item"] if r["link_bytes_per_item"] is not None else "-"))


if __name__ == "__main__":
    main()
