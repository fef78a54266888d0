#!/usr/bin/python3
"""Nexus figure 17 in the simulator: the highest query rate at which at least
99% of an SSD -> Inception query's runs are good (every item within its
stage's deadline, hence the query within its end-to-end SLO) on 8 devices,
with the SLO split among the stages by Nexus's DP (pl_query_split) and
evenly, for gamma 0.1, 1, 10 detections per frame and SLO 300, 400, 500 ms
(bench/workloads/nexus_fig17_*.json, gen_nexus_fig17.py). Prints a markdown
table and the commands. Run from the source root after building:

    meson setup build && ninja -C build
    bench/sim/fig17.py build [--jobs N]

Each cell runs under Nexus's early-drop dispatcher (the one the paper's DP
was evaluated with) and squish's default, deferred (Symphony). "planned
gain" is what the split promises before any simulation: the cost in devices
of the even budgets over the DP's (pl_query_result_t.cost_devices), minus
one, i.e. the throughput the DP should gain if every device ran the
saturated batch of Nexus's rule 2 l(b) <= budget."""
import concurrent.futures
import json
import os
import subprocess
import sys

args = [a for a in sys.argv[1:] if not a.startswith("--")]
build = args[0] if args else "build"
jobs = 2
if "--jobs" in sys.argv:
    jobs = int(sys.argv[sys.argv.index("--jobs") + 1])
    args = [a for a in args if a != str(jobs)]
sim = os.path.join(build, "bench", "squish-sim")
GAMMAS = ("0.1", "1", "10")
SLOS = (300, 400, 500)


POLICIES = ("early-drop", "deferred")


def run(path, split, policy):
    cmd = [sim, path, "--search-goodput", "--split", split, "--policy", policy]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    s = json.loads(p.stdout)
    return s["pipelines"][0], s["search"], " ".join(["./" + os.path.normpath(sim)] + cmd[1:])


cells = [(g, slo, pol, split) for g in GAMMAS for slo in SLOS for pol in POLICIES
         for split in ("dp", "even")]
with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
    futs = {c: ex.submit(run, f"bench/workloads/nexus_fig17_g{c[0]}_slo{c[1]}.json", c[3], c[2])
            for c in cells}
    res = {c: f.result() for c, f in futs.items()}


def gain(a, b):
    return f"{a / b - 1:+.1%}" if b > 0 else "n/a"


print("| gamma | SLO ms | DP budgets ms (detect / classify) | planned gain "
      "| early-drop: DP / even queries/s | DP gain | deferred: DP / even queries/s | DP gain "
      "| gamma measured |")
print("|---|---|---|---|---|---|---|---|---|")
for g in GAMMAS:
    for slo in SLOS:
        row = [g, str(slo)]
        dp0 = res[(g, slo, POLICIES[0], "dp")][0]
        ev0 = res[(g, slo, POLICIES[0], "even")][0]
        b = dp0["budgets_ms"]
        row.append(f"{b['detect']:.1f} / {b['classify']:.1f}")
        row.append(gain(ev0["cost_devices"], dp0["cost_devices"]))
        for pol in POLICIES:
            dp = res[(g, slo, pol, "dp")][0]["goodput_qps"]
            ev = res[(g, slo, pol, "even")][0]["goodput_qps"]
            row += [f"{dp:.1f} / {ev:.1f}", gain(dp, ev)]
        row.append(f"{dp0['gamma_measured']['classify']:.3f}")
        print("| " + " | ".join(row) + " |")
print()
print("Commands:")
print()
for c in cells:
    print("    " + res[c][2])
