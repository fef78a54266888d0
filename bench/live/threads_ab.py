#!/usr/bin/python3
"""squishd with 1, 2, 4... HTTP threads side by side, in interleaved rounds
(A/B/C/A/B/C), on the overhead benchmark's OIP binary tensor case
(run_live.py --only overhead): for each server, the open-loop ladder's
highest rate with >= 99% answered 200 within 1 s, and a closed-loop run
(N requests always in flight) for throughput; connection errors counted in
both (and what made the ladder stop: the first rate under 99%). Prints
one JSON line per run and a markdown table.

    bench/live/threads_ab.py BUILD [--threads 1,2,4] [--rounds 2] [--closed 256]
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_live as R  # noqa: E402

TENSOR = ["--path", "/v2/models/tiny_t/infer", "--tensor",
          "x".join(map(str, R.OVERHEAD_TENSOR)), "--dtype", "UINT8", "--slo-ms",
          str(R.OVERHEAD_SLO_MS), "--late-ms", str(R.OVERHEAD_LATE_MS), "--connections", "4000"]


def one(a, threads):
    d = R.Squishd(a.build, "emu:1", "deferred",
                  ["--http-threads", str(threads), "--prep-threads", "2"] + R.OVERHEAD_SQUISHD_ARGS)
    try:
        d.add_model(R.model_cfg("tiny_t", R.TINY_ALPHA_MS, R.TINY_BETA_MS, R.OVERHEAD_TENSOR,
                                slo=R.OVERHEAD_SLO_MS))
        common = TENSOR + ["--duration", "2", "--warmup", "2"]
        best, best_s, fail = R.ladder_max(a, d.port, common)
        closed = R.loadgen(a.build, d.port, TENSOR + ["--duration", "3", "--warmup", "1",
                                                      "--closed", str(a.closed)], a.verbose)
        stop = None
        if fail is not None:
            stop = {k: fail[k] for k in ("rate_rps", "requests", "good", "late", "dropped",
                                         "errors", "timeouts", "conn_errors", "unsent")}
        return {"threads": threads, "ladder_rps": best, "ladder_stopped_at": stop,
                "ladder_conn_errors": (best_s or {}).get("conn_errors", 0)
                + (fail or {}).get("conn_errors", 0),
                "closed_rps": closed["answered_rps"], "closed_conn_errors": closed["conn_errors"],
                "closed_bad_rate": closed["bad_rate"], "load1": round(os.getloadavg()[0], 1)}
    finally:
        d.stop()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--threads", default="1,2,4")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--closed", type=int, default=256)
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    runs = []
    for rnd in range(a.rounds):
        for n in threads:
            r = one(a, n)
            r["round"] = rnd + 1
            print(json.dumps(r), flush=True)
            runs.append(r)
    print()
    print("| HTTP threads | ladder req/s (per round) | closed-loop %d in flight, req/s (per round) "
          "| connection errors (all runs) | load average at the end of each run |" % a.closed)
    print("|---|---|---|---|---|")
    for n in threads:
        rs = [r for r in runs if r["threads"] == n]
        print("| %d | %s | %s | %d | %s |" % (
            n, ", ".join(str(r["ladder_rps"]) for r in rs),
            ", ".join("%.0f" % r["closed_rps"] for r in rs),
            sum(r["ladder_conn_errors"] + r["closed_conn_errors"] for r in rs),
            ", ".join(str(r["load1"]) for r in rs)))


if __name__ == "__main__":
    main()
