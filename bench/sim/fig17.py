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

"planned" is what the split promises before any simulation: the cost in
devices of the even budgets over the DP's (pl_query_result_t.cost_devices),
minus one, i.e. the throughput the DP should gain if devices were fluid."""
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


def run(path, split):
    cmd = [sim, path, "--search-goodput", "--split", split]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    s = json.loads(p.stdout)
    return s["pipelines"][0], s["search"], " ".join(["./" + os.path.normpath(sim)] + cmd[1:])


cells = [(g, slo, split) for g in GAMMAS for slo in SLOS for split in ("dp", "even")]
with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
    futs = {c: ex.submit(run, f"bench/workloads/nexus_fig17_g{c[0]}_slo{c[1]}.json", c[2])
            for c in cells}
    res = {c: f.result() for c, f in futs.items()}

print("| gamma | SLO ms | DP budgets ms (detect / classify) | DP queries/s | even queries/s "
      "| DP gain | planned gain | gamma measured (DP run) |")
print("|---|---|---|---|---|---|---|---|")
for g in GAMMAS:
    for slo in SLOS:
        dp, _, _ = res[(g, slo, "dp")]
        ev, _, _ = res[(g, slo, "even")]
        b = dp["budgets_ms"]
        gain = dp["goodput_qps"] / ev["goodput_qps"] - 1 if ev["goodput_qps"] > 0 else float("nan")
        planned = ev["cost_devices"] / dp["cost_devices"] - 1 if dp["cost_devices"] > 0 else 0
        print(f"| {g} | {slo} | {b['detect']:g} / {b['classify']:g} | {dp['goodput_qps']:.1f} "
              f"| {ev['goodput_qps']:.1f} | {gain:+.1%} | {planned:+.1%} "
              f"| {dp['gamma_measured']['classify']:.3f} |")
print()
print("Commands:")
print()
for c in cells:
    print("    " + res[c][2])
