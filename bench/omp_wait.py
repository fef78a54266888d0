#!/usr/bin/python3
"""The cpu worker's OpenMP wait policies, side by side (issue 26, item 2).

    /usr/bin/python3 bench/omp_wait.py BUILD_DIR MODEL.onnx... [--batches 1,8]
        [--policies spin0,spin50] [--rounds 3]
        [--iters 20] [--threads 2] [--busy 0,2] [--gap-ms 0,2] [--pin]

The worker runs oneDNN on its own OpenMP pool (worker/omp_pool.c): while
a graph runs, its threads wait for the next region spinning up to
SQUISH_CPU_SPIN_US (the policies here: spin0 sleeps at once, as libgomp's
OMP_WAIT_POLICY=passive did; spinN caps the spin at N us) and each batch
size keeps spinning only where its runs measure faster. Every policy runs
each model and batch in squish-cpu-bench, interleaved A/B/C per round (the
order rotated each round), with `--busy N` processes spinning beside it (a
neighbour taking the cores: squishd's decode and HTTP threads, another
worker) and `--gap-ms G` of sleep between runs (a live worker idles between
batches; `--pin` pins each to a core of its own, the last first). The
policies sleep, spin and alone force the way a graph runs
(SQUISH_CPU_WAY, worker/backend_cpu.c); auto is the worker's default,
which times the ways per batch size and takes the fastest. Reports the
median over rounds of the median ms per run and the
CPU ms per run (the process's: what spinning takes from neighbours).
(Before session 18 the policies were libgomp's GOMP_SPINCOUNT values; the
worker no longer runs on libgomp.)
"""
import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys

POLICIES = {
    "spin0": {"SQUISH_CPU_SPIN_US": "0"},
    "spin20": {"SQUISH_CPU_SPIN_US": "20"},
    "spin50": {"SQUISH_CPU_SPIN_US": "50"},
    "spin200": {"SQUISH_CPU_SPIN_US": "200"},
    # The ways a graph runs (worker/backend_cpu.c), forced, and picked per
    # batch size by measuring them (auto, the worker's default).
    "sleep": {"SQUISH_CPU_WAY": "sleep"},
    "spin": {"SQUISH_CPU_WAY": "spin"},
    "alone": {"SQUISH_CPU_WAY": "alone"},
    "auto": {},
}


def spin(stop, cpu=None):
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    x = 0
    while not stop.is_set():
        for _ in range(100000):
            x += 1


def bench(a, model, batch, policy, gap_ms):
    env = {k: v for k, v in os.environ.items()
           if k not in ("SQUISH_CPU_SPIN_US", "SQUISH_CPU_WAY")}
    env.update(POLICIES[policy])
    args = [os.path.join(a.build, "bench", "squish-cpu-bench"), "--threads", str(a.threads),
            "--iters", str(a.iters), "--warmup", "3", "--batch", str(batch)]
    if gap_ms:
        args += ["--gap-ms", str(gap_ms)]
    out = subprocess.run(args + [model], capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-500:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--policies", default="spin0,spin50")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--busy", default="0,2")
    ap.add_argument("--gap-ms", default="0")
    ap.add_argument("--pin", action="store_true",
                    help="pin the i-th neighbour to the i-th last CPU (a neighbour on a core)")
    a = ap.parse_args()
    policies = a.policies.split(",")
    res = {}
    print("# %s, %d cpus" % (open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0]
                             .strip(" :\t"), os.cpu_count()), flush=True)
    for busy in [int(x) for x in a.busy.split(",")]:
        stop = multiprocessing.Event()
        cpus = sorted(os.sched_getaffinity(0), reverse=True)
        hogs = [multiprocessing.Process(target=spin,
                                        args=(stop, cpus[i % len(cpus)] if a.pin else None))
                for i in range(busy)]
        for h in hogs:
            h.start()
        try:
            for gap in [float(x) for x in a.gap_ms.split(",")]:
                for r in range(a.rounds):
                    order = policies[r % len(policies):] + policies[:r % len(policies)]
                    for m in a.models:
                        for b in [int(x) for x in a.batches.split(",")]:
                            for p in order:
                                j = bench(a, m, b, p, gap)
                                key = (busy, gap, j["model"], b, p)
                                res.setdefault(key, []).append((j["median_ms"], j["cpu_ms"]))
                                print(json.dumps({"busy": busy, "gap_ms": gap, "policy": p,
                                                  "round": r, **j}), flush=True)
        finally:
            stop.set()
            for h in hogs:
                h.join()
    print("\n| neighbours spinning | gap ms | model | batch | " +
          " | ".join("%s ms (CPU ms)" % p for p in policies) + " |")
    print("|---|---|---|---|" + "---|" * len(policies))
    for key in sorted({k[:4] for k in res}):
        cells = []
        for p in policies:
            v = res.get(key + (p,), [])
            cells.append("%.2f (%.2f)" % (statistics.median(x[0] for x in v),
                                          statistics.median(x[1] for x in v)) if v else "-")
        print("| %d | %g | %s | %d | %s |" % (key + (" | ".join(cells),)))


if __name__ == "__main__":
    sys.exit(main())
