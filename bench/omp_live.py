#!/usr/bin/python3
"""The cpu worker's OpenMP wait policy where it runs: under squishd (issue 26,
item 2). bench/omp_wait.py measures the bare kernels; here the neighbours
are squishd's own HTTP and JPEG-decode threads.

    /usr/bin/python3 bench/omp_live.py BUILD_DIR MODEL.onnx... [--policies spin0,spin50]
        [--rounds 2] [--seconds 8] [--closed 1,8]

For each policy (A/B/A/B, the order swapped each round) squishd starts
with one cpu worker under that policy (the worker's own OpenMP pool,
worker/omp_pool.c: SQUISH_CPU_SPIN_US, 0 sleeping at once between regions,
50 the default; the GOMP_* and OMP_WAIT_POLICY policies were libgomp's,
which the worker no longer runs on), each model
is uploaded and measured, and squish-loadgen sends the grace_hopper JPEG
to /v1/models/M/infer in closed loops of N requests in flight: N = 1 gives
the latency of an otherwise idle server, N = 8 the throughput of a loaded
one. Reports the median over rounds of p50 latency and answers per second,
and the worker process's CPU seconds per answer.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)
import live_profile  # noqa: E402  (upload_and_wait)
PHOTO = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
POLICIES = {
    "spin0": {"SQUISH_CPU_SPIN_US": "0"},
    "spin20": {"SQUISH_CPU_SPIN_US": "20"},
    "spin50": {"SQUISH_CPU_SPIN_US": "50"},
    "spin200": {"SQUISH_CPU_SPIN_US": "200"},
}


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(a, harness, tm, policy, rows, rnd):
    env = dict(POLICIES[policy])
    s = harness.Squishd(workers="cpu", env=env)
    try:
        s.wait_ready(workers=1, timeout=30)
        wpid = list(s.worker_pids().values())[0]
        for path in a.models:
            name = live_profile.upload_and_wait(s, tm, path, 8)
            for n in [int(x) for x in a.closed.split(",")]:
                c0 = cpu_s(wpid)
                p = subprocess.run([harness.LOADGEN, "--port", str(s.port), "--path",
                                    "/v1/models/%s/infer" % name, "--body", PHOTO,
                                    "--content-type", "image/jpeg", "--slo-ms", "60000",
                                    "--closed", str(n), "--duration", str(a.seconds),
                                    "--warmup", "1", "--timeout-ms", "60000"],
                                   capture_output=True, text=True, timeout=a.seconds + 120)
                assert p.returncode == 0, p.stderr[-1000:]
                j = json.loads(p.stdout)
                answers = j["answered_rps"] * a.seconds
                row = {"round": rnd, "policy": policy, "model": name, "closed": n,
                       "p50_ms": j["latency_ms"]["p50"], "p99_ms": j["latency_ms"]["p99"],
                       "max_ms": j["latency_ms"]["max"], "answered_rps": j["answered_rps"],
                       "worker_cpu_ms_per_answer": round(
                           (cpu_s(wpid) - c0) * 1e3 / max(answers, 1), 2)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        s.stop()
        s.cleanup()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--policies", default="spin0,spin50")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--closed", default="1,8")
    a = ap.parse_args()
    os.environ["SQUISH_BUILD_DIR"] = os.path.abspath(a.build)
    import harness
    import tiny_models as tm
    pol = a.policies.split(",")
    rows = []
    for r in range(a.rounds):
        for p in (pol if r % 2 == 0 else pol[::-1]):
            one(a, harness, tm, p, rows, r)
    print("\n| model | in flight | " + " | ".join(
        "%s p50 ms / answers/s / worker CPU ms per answer" % p for p in pol) + " |")
    print("|---|---|" + "---|" * len(pol))
    for key in sorted({(x["model"], x["closed"]) for x in rows}):
        cells = []
        for p in pol:
            v = [x for x in rows if (x["model"], x["closed"]) == key and x["policy"] == p]
            cells.append("%.2f / %.1f / %.2f" % (
                statistics.median(x["p50_ms"] for x in v),
                statistics.median(x["answered_rps"] for x in v),
                statistics.median(x["worker_cpu_ms_per_answer"] for x in v)))
        print("| %s | %d | %s |" % (key + (" | ".join(cells),)))


if __name__ == "__main__":
    main()
