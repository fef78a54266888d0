#!/usr/bin/python3
"""Nexus figure 17 live: real squishd with 8 emulated devices serving the
SSD -> Inception pipeline over loopback HTTP, next to the simulator on the
same workload (bench/workloads/nexus_fig17_*.json).

The detector is an emulated detector (README, "Pipelines"): an emulated
model with SSDMobilenet's profile whose every frame has a Poisson(gamma)
count of detections, drawn by the emu worker; the classifier is an emulated
model with InceptionV3's profile. squishd measures gamma, splits the SLO
with the query DP (or evenly: the pipeline's "split") and plans the stage
sessions, exactly as for real models. Frames are a 64x64 JPEG and the
emulated models take 32x32 (detector) and 16x16 (classifier) inputs, so
that decoding and cropping cost little: the devices, the split and the
dispatcher are what is measured, not two shared cores' JPEG throughput.

For each cell the simulator's 99% goodput is found first (`squish-sim
--search-goodput`), then live squishd gets a ladder of fractions of it in
ascending order, after a run at the first rate that lets a cold squishd's
plan settle (--settle s, not measured); each a warm-up at that rate, then
the measured run;
live goodput is the highest rate of the ladder with >= 99% of queries good
(200 within the SLO). Prints a markdown table and the commands.

    bench/live/fig17_live.py BUILD [--cells 1:300,0.1:400] [--splits dp,even]
        [--policies deferred] [--ladder 0.85,0.9,0.95,1.0,1.05,1.1] [--duration 10]
        [--warmup 5] [--settle 10] [--verbose]

BUILD holds gateway/squishd, worker/squish-worker, bench/squish-loadgen and
bench/squish-sim. Debian's /usr/bin/python3 with python3-pil.
"""
import argparse
import io
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_live as rl  # noqa: E402

from PIL import Image  # noqa: E402

DEVICES = 8
# The workloads' profiles (gen_nexus_fig17.py: Symphony appendix C, GTX 1080 Ti).
SSD = {"alpha_ms": 23.778, "beta_ms": 9.729}
INCEPTION = {"alpha_ms": 1.964, "beta_ms": 8.771}
MAX_BATCH = 128
# Enough slots that a Poisson(10) count is never cut (P(N > 32) < 1e-7).
SLOTS = 32
SQUISHD_ARGS = ["--epoch-min-interval-ms=1000", "--dispatch-margin-us=3000"]


def workload(gamma, slo):
    return os.path.join("bench", "workloads", "nexus_fig17_g%s_slo%d.json" % (gamma, slo))


def frame_jpeg(path):
    out = io.BytesIO()
    img = Image.new("RGB", (64, 64))
    img.putdata([((7 * i) % 256, (3 * i) % 256, (11 * i) % 256) for i in range(64 * 64)])
    img.save(out, "JPEG", quality=90)
    with open(path, "wb") as f:
        f.write(out.getvalue())


def pipeline_spec(slo, split):
    return {"name": "fig17", "slo_ms": slo, "split": split,
            "stages": [{"id": "detect", "model": "ssd"},
                       {"id": "classify", "model": "inception", "top_k": 1,
                        "crops_of": {"stage": "detect", "boxes": "boxes", "scores": "scores",
                                     "format": "xyxy", "score_threshold": 0.5,
                                     "nms_iou": 0.5, "max_crops": SLOTS}}]}


def model_cfgs(gamma):
    return [{"name": "ssd", "profile": SSD, "max_batch": MAX_BATCH,
             "input": {"shape": [3, 32, 32]},
             "detections": {"mean": float(gamma), "slots": SLOTS}},
            {"name": "inception", "profile": INCEPTION, "max_batch": MAX_BATCH,
             "input": {"shape": [3, 16, 16]}, "num_classes": 10}]


def add_pipeline(d, spec):
    token = open(os.path.join(d.tmp, "admin.token")).read().strip()
    status, body = rl.request(d.port, "POST", "/pipelines", json.dumps(spec),
                              {"Authorization": "Bearer " + token,
                               "Content-Type": "application/json"})
    if status != 201:
        raise RuntimeError("POST /pipelines: %d %s" % (status, body[:300]))


def split_now(d):
    token = open(os.path.join(d.tmp, "admin.token")).read().strip()
    status, body = rl.request(d.port, "GET", "/pipelines/fig17", None,
                              {"Authorization": "Bearer " + token})
    p = json.loads(body)
    return p.get("split", {})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--cells", default="0.1:300,1:300,10:300,0.1:400,1:400,10:400,"
                                        "0.1:500,1:500,10:500")
    ap.add_argument("--splits", default="dp,even")
    ap.add_argument("--policies", default="deferred")
    ap.add_argument("--ladder", default="0.85,0.9,0.95,1.0,1.05,1.1")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    ladder = [float(x) for x in a.ladder.split(",")]
    frame = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".fig17_frame.jpg")
    frame_jpeg(frame)
    rows, cmds = [], []
    for cell in a.cells.split(","):
        gamma, slo = cell.split(":")
        slo = int(slo)
        wl = workload(gamma, slo)
        for policy in a.policies.split(","):
            for split in a.splits.split(","):
                s, scmd = rl.sim(a.build, [wl, "--search-goodput", "--split", split,
                                           "--policy", policy])
                sp = s["pipelines"][0]
                sim_good = sp["goodput_qps"]
                rates = [round(sim_good * x, 1) for x in ladder]
                d = rl.Squishd(a.build, "emu:%d" % DEVICES, policy, SQUISHD_ARGS)
                runs, splits = [], []
                try:
                    for cfg in model_cfgs(gamma):
                        d.add_model(cfg)
                    add_pipeline(d, pipeline_spec(slo, split))
                    # A cold squishd plans from nothing (a new model on one
                    # device at rate 0): settle the plan at the first rate
                    # first, not measured.
                    rl.loadgen(a.build, d.port, [
                        "--path", "/v1/pipelines/fig17/infer", "--body", frame, "--content-type",
                        "image/jpeg", "--slo-ms", str(slo), "--duration", "%g" % a.settle,
                        "--warmup", "1", "--seed", "99", "--rate", str(rates[0])], a.verbose)
                    for r in rates:
                        args = ["--path", "/v1/pipelines/fig17/infer", "--body", frame,
                                "--content-type", "image/jpeg", "--slo-ms", str(slo),
                                "--duration", "%g" % a.duration, "--warmup", "%g" % a.warmup,
                                "--seed", "1", "--rate", str(r)]
                        runs.append(rl.loadgen(a.build, d.port, args, a.verbose))
                        splits.append(split_now(d))
                finally:
                    d.stop()
                good = [1 - x["bad_rate"] for x in runs]
                passing = [r for r, g in zip(rates, good) if g >= 0.99]
                live = max(passing) if passing else 0
                at1 = runs[ladder.index(1.0)] if 1.0 in ladder else runs[-1]
                sp1 = splits[ladder.index(1.0)] if 1.0 in ladder else splits[-1]
                b = sp1.get("budgets_ms", {})
                g = sp1.get("gamma", {}).get("classify", {}).get("measured", float("nan"))
                rows.append("| %s | %d | %s | %s | %.1f (%g / %g) | %s | %s (%s / %s) | %.3f "
                            "| %s | **%s** | %.1f / %.1f |" % (
                                gamma, slo, policy, split, sim_good,
                                sp["budgets_ms"]["detect"], sp["budgets_ms"]["classify"],
                                " / ".join("%.1f" % (100 * x) for x in good),
                                "%.1f" % live if live else "< %.1f" % rates[0],
                                "%.0f" % b.get("detect", float("nan")),
                                "%.0f" % b.get("classify", float("nan")), g,
                                ", ".join("%g" % r for r in rates),
                                ("%.0f%%" % (100 * live / sim_good)) if live
                                else "< %.0f%%" % (100 * ladder[0]),
                                at1["latency_ms"]["p50"], at1["latency_ms"]["p99"]))
                print(rows[-1], file=sys.stderr, flush=True)
                cmds.append((gamma, slo, policy, split, scmd, rates))
    print("| gamma | SLO ms | policy | split | sim 99%% goodput q/s (budgets ms) | live %% good "
          "at %s x sim | live 99%% goodput q/s (live budgets ms at 1.0x) | gamma measured live "
          "| rates q/s | live / sim | live p50 / p99 ms at 1.0x |"
          % " / ".join("%g" % x for x in ladder))
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(r)
    print()
    print("Commands (PORT: squishd's ephemeral port; R: each rate of the ladder):")
    print()
    for gamma, slo, policy, split, scmd, rates in cmds:
        print("- gamma %s, SLO %d, %s, %s: `%s`; squishd `--workers emu:%d --policy %s %s`, "
              "models %s, pipeline `%s`; `squish-loadgen --port PORT --path "
              "/v1/pipelines/fig17/infer --body FRAME --slo-ms %d --duration %g --warmup %g "
              "--rate R`, R in %s" % (
                  gamma, slo, policy, split, scmd, DEVICES, policy, " ".join(SQUISHD_ARGS),
                  json.dumps(model_cfgs(gamma)), json.dumps(pipeline_spec(slo, split)), slo,
                  a.duration, a.warmup, ", ".join("%g" % r for r in rates)))
    os.unlink(frame)


if __name__ == "__main__":
    main()
