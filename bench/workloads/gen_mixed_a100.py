#!/usr/bin/python3
"""Writes mixed_a100_zipf.json: every model of symphony_profiles_a100.csv
(Symphony, appendix C; copied here) at its SLO on 64 devices, popularity
Zipf(0.9) over a fixed shuffle of the models (random.Random(1)), Poisson
arrivals for 10 s. The total rate puts the Nexus lower bound (sum over
models of rate / per-device saturated throughput, 2 l(b) <= SLO) at 64
devices, so that scale 1 is about the cluster's capacity.
Usage: gen_mixed_a100.py > mixed_a100_zipf.json"""
import csv
import json
import os
import random

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "symphony_profiles_a100.csv")) as f:
    rows = list(csv.DictReader(f))
order = list(range(len(rows)))
random.Random(1).shuffle(order)
weights = [0.0] * len(rows)
for rank, i in enumerate(order, 1):
    weights[i] = 1 / rank ** 0.9
total_w = sum(weights)


def saturated_rps(alpha, beta, slo):
    b = int((slo / 2 - beta) // alpha)
    b = max(b, 1)
    return b / (alpha * b + beta) * 1000


devices = 64
per_unit = sum(w / total_w / saturated_rps(float(r["alpha_ms"]), float(r["beta_ms"]),
                                           float(r["slo_ms"]))
               for r, w in zip(rows, weights))
total_rps = devices / per_unit
workload = {
    "devices": {"count": devices},
    "models": [{"name": r["model"], "max_batch": 256,
                "profile": {"alpha_ms": float(r["alpha_ms"]), "beta_ms": float(r["beta_ms"])}}
               for r in rows],
    "sessions": [{"model": r["model"], "slo_ms": float(r["slo_ms"]),
                  "arrivals": {"process": "poisson",
                               "segments": [{"duration_s": 10,
                                             "rate_rps": round(total_rps * w / total_w, 3)}]}}
                 for r, w in zip(rows, weights)],
    "seed": 1,
}
print(json.dumps(workload, indent=1))
