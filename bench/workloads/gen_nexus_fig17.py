#!/usr/bin/python3
"""Writes the nine nexus_fig17_g{GAMMA}_slo{SLO}.json workloads: Nexus
(SOSP'19) figure 17's complex query, an SSD object detector X whose every
detection runs an Inception classifier Y (gamma detections per frame on
average, 0.1, 1 or 10), under an end-to-end SLO of 300, 400 or 500 ms, on
8 devices.

Profiles: the Nexus paper does not publish its per-model batch profiles,
so these are the GTX 1080 Ti linear profiles of Symphony's appendix C (the
same numbers as bench/workloads/symphony_1080ti_zipf.json):
SSDMobilenet l(b) = 23.778 b + 9.729 ms and InceptionV3
l(b) = 1.964 b + 8.771 ms, max batch 128 each. Queries arrive as a Poisson
process at 100 queries/s for 30 s (the goodput search scales the rate);
detections per frame are Poisson with mean gamma.
Usage: gen_nexus_fig17.py [DIR]  (default: this script's directory)"""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
out_dir = sys.argv[1] if len(sys.argv) > 1 else here
SSD = {"alpha_ms": 23.778, "beta_ms": 9.729}
INCEPTION = {"alpha_ms": 1.964, "beta_ms": 8.771}

for gamma in ("0.1", "1", "10"):
    for slo in (300, 400, 500):
        w = {
            "description": (
                "Nexus figure 17: SSD (X) then Inception (Y) on each of its detections, "
                f"gamma {gamma}, end-to-end SLO {slo} ms, 8 devices. Profiles: Symphony "
                "appendix C, GTX 1080 Ti (SSDMobilenet 23.778 b + 9.729 ms, InceptionV3 "
                "1.964 b + 8.771 ms); Nexus does not publish its own. "
                "Written by gen_nexus_fig17.py."),
            "devices": {"count": 8},
            "models": [
                {"name": "SSD", "max_batch": 128, "profile": SSD},
                {"name": "Inception", "max_batch": 128, "profile": INCEPTION},
            ],
            "pipelines": [{
                "name": f"ssd_inception_g{gamma}",
                "slo_ms": slo,
                "arrivals": {"process": "poisson",
                             "segments": [{"duration_s": 30, "rate_rps": 100}]},
                "stages": [
                    {"id": "detect", "model": "SSD"},
                    {"id": "classify", "model": "Inception", "after": "detect",
                     "gamma": float(gamma), "gamma_dist": "poisson"},
                ],
            }],
            "seed": 1,
        }
        path = os.path.join(out_dir, f"nexus_fig17_g{gamma}_slo{slo}.json")
        with open(path, "w") as f:
            json.dump(w, f, indent=1)
            f.write("\n")
