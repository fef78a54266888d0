#!/usr/bin/python3
"""Latency and goodput of the dispatch policies side by side, live: real
squishd with emulated workers (Symphony's table-2 ResNet50 profile) over
loopback HTTP, squish-loadgen at fractions of the simulator's 99% goodput,
the policies in turn within each round (A/B/C, A/B/C: the box is shared
and noisy). Prints a markdown table for bench/RESULTS.md on stdout.

    bench/live/latency_ab.py BUILD_DIR [--devices N] [--rounds N]
        [--loads 0.05,0.25,0.5,1,2] [--policies deferred,adaptive,early-drop]
        [--duration S] [--warmup S] [--squishd-arg ARG]... [--verbose]

Debian's /usr/bin/python3, stdlib only; uses run_live.py's helpers.
"""
import argparse
import datetime
import os
import platform
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_live as rl  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--loads", default="0.05,0.25,0.5,1,2")
    p.add_argument("--policies", default="deferred,adaptive,early-drop")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--squishd-arg", action="append", dest="squishd_args",
                   default=None)
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args()
    if a.squishd_args is None:
        a.squishd_args = ["--dispatch-margin-us=3000", "--epoch-min-interval-ms=1000"]
    loads = [float(x) for x in a.loads.split(",")]
    policies = a.policies.split(",")
    n = a.devices
    bound, _ = rl.staggered_bound(n)
    wl = os.path.join("bench", "live", "resnet50_%ddev_x1.json" % n)
    rl.sim_workload(wl, n, 1, round(bound), a.duration)
    # The reference rate: the simulator's 99% goodput under deferred.
    ref, _ = rl.sim(a.build, [wl, "--policy", "deferred", "--search-goodput"])
    ref_rps = ref["goodput_rps"]
    sims = {}
    for pol in policies:
        for x in loads:
            s, _ = rl.sim(a.build, [wl, "--policy", pol, "--scale",
                                    "%.4f" % (ref_rps * x / round(bound))])
            sims[pol, x] = s
    cfg = rl.model_cfg("resnet50", rl.ALPHA_MS, rl.BETA_MS, rl.GOODPUT_INPUT)
    runs = {}
    started = datetime.datetime.now(datetime.timezone.utc)
    load_avg = os.getloadavg()[0]
    for rnd in range(a.rounds):
        for pol in policies:
            d = rl.Squishd(a.build, "emu:%d" % n, pol, a.squishd_args)
            try:
                d.add_model(cfg)
                for x in loads:
                    args = ["--path", "/v2/models/resnet50/infer", "--tensor",
                            "x".join(map(str, rl.GOODPUT_INPUT)), "--slo-ms", "%g" % rl.SLO_MS,
                            "--duration", "%g" % a.duration, "--warmup", "%g" % a.warmup,
                            "--seed", str(rnd + 1), "--rate", str(max(1, round(ref_rps * x)))]
                    runs.setdefault((pol, x), []).append(rl.loadgen(a.build, d.port, args,
                                                                    a.verbose))
            finally:
                d.stop()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    out = []
    w = out.append
    w("Measured by `bench/live/latency_ab.py %s` on %s UTC; squishd of this tree (commit %s); "
      "%s, %d cores, load average %.1f at the start. %d emulated devices, l(b) = %.3f b + %.3f "
      "ms (l(1) = %.1f ms), SLO %g ms, binary OIP tensors over loopback HTTP; load as a share "
      "of the simulator's 99%% goodput under deferred (%.0f req/s); %d round(s), the policies "
      "in turn within each round, each cell the median of the rounds (goodput: the best)."
      % (a.build, started.strftime("%Y-%m-%d %H:%M"), commit, platform.processor() or "cpu",
         os.cpu_count(), load_avg, n, rl.ALPHA_MS, rl.BETA_MS, rl.ALPHA_MS + rl.BETA_MS,
         rl.SLO_MS, ref_rps, a.rounds))
    w("")
    w("| load | policy | offered req/s | live good % | live p50 / p99 ms | sim good % | sim p50 / p99 ms |")
    w("|---|---|---|---|---|---|---|")
    for x in loads:
        for pol in policies:
            rr = runs[pol, x]
            good = max(1 - r["bad_rate"] for r in rr)
            p50 = sorted(r["latency_ms"]["p50"] for r in rr)[len(rr) // 2]
            p99 = sorted(r["latency_ms"]["p99"] for r in rr)[len(rr) // 2]
            s = sims[pol, x]
            m = s["models"][0]
            w("| %g%% | %s | %.0f | %.1f | %.1f / %.1f | %.1f | %.1f / %.1f |" % (
                100 * x, pol, ref_rps * x, 100 * good, p50, p99, 100 * (1 - s["bad_rate"]),
                m["latency_ms_p50"], m["latency_ms_p99"]))
    print("\n".join(out))


if __name__ == "__main__":
    main()
