#!/usr/bin/python3
"""squish's cpu backend against ONNX Runtime, side by side (issue 26).

    /usr/bin/python3 bench/ort_ab.py BUILD_DIR WORK_DIR [--models a,b] [--batches 1,8]
        [--rounds 2] [--iters 10] [--threads 2] [--baseline OTHER_BUILD_DIR]

The same ONNX files (torchvision classifiers with seeded weights, exported
at opset 13 with a dynamic batch by bench/torchvision_all.py's builder, kept
in WORK_DIR; a model already there is used as it is, at its input's size:
the detectors of RESULTS are exported by scripts/export_models.py's
TorchvisionDetector), the same batch and threads, interleaved A/B/A/B: per round and
model and batch, squish-cpu-bench (on the worker's own OpenMP pool, as
squishd's workers run) and ONNX Runtime 1.30 (npm onnxruntime-node,
bench/ort_bench.js, every graph optimization on), their order swapped every
round. Reports the median over rounds of each run's median ms per batch and
CPU ms per batch, and squish's speed relative to ONNX Runtime (ORT ms /
squish ms: above 1 is faster). Needs node and third_party/npm's
onnxruntime-node (scripts/bootstrap --test installs it). --baseline adds a
third engine in the same rounds, squish-cpu-bench of another build (an
earlier commit's): before and after side by side, each against ORT;
--baseline-env NAME=VALUE makes the baseline this build with that variable
set (SQUISH_CPU_SPIN_US=0: threads that never spin).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT = "resnet18,resnet50,mobilenet_v2,mobilenet_v3_large,efficientnet_b0,googlenet"


def export(name, path):
    import torch
    sys.path.insert(0, HERE)
    import torchvision_all as tv
    model = tv.build(name)
    hw = tv.image_hw(name)
    torch.onnx.export(model, torch.zeros(1, 3, hw, hw), path, opset_version=13,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "N"}, "output": {0: "N"}},
                      do_constant_folding=True)


# Warm-up runs of squish: the cpu backend first tries each way a graph can
# run (threads sleeping, spinning, the leader alone) WAY_MIN = 3 times
# (worker/backend_cpu.c), then runs the fastest; a served model is past
# that after its first nine batches. Three warm-ups left six of those
# tries, the leader alone among them, in the timed runs.
SQUISH_WARMUP = 12


def squish(a, path, batch, build=None, extra_env=None):
    env = dict(os.environ, **(extra_env or {}))
    out = subprocess.run([os.path.join(build or a.build, "bench", "squish-cpu-bench"), "--threads",
                          str(a.threads), "--iters", str(a.iters), "--warmup", str(SQUISH_WARMUP),
                          "--batch", str(batch), path], capture_output=True, text=True, env=env,
                         timeout=1800)
    if out.returncode != 0:
        raise RuntimeError("squish-cpu-bench %s: %s" % (path, out.stderr[-500:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def ort(a, path, batch, hw):
    env = dict(os.environ, NODE_PATH=os.path.join(ROOT, "third_party", "npm", "node_modules"))
    out = subprocess.run(["node", os.path.join(HERE, "ort_bench.js"), path, str(batch),
                          str(a.threads), str(a.iters), "3", str(hw)], capture_output=True,
                         text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError("ort_bench %s: %s" % (path, out.stderr[-500:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def input_hw(path, default):
    """The model's input height where the export fixes it (a detector at
    320 or 512), else default: ort_bench.js feeds square images."""
    import onnx
    dims = onnx.load(path, load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    return dims[2].dim_value if len(dims) == 4 and dims[2].dim_value > 0 else default


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("work")
    ap.add_argument("--models", default=DEFAULT)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--baseline-env", default=None)
    a = ap.parse_args()
    base_env = None
    if a.baseline_env:
        name, _, value = a.baseline_env.partition("=")
        base_env = {name: value}
        a.baseline = a.baseline or a.build
    os.makedirs(a.work, exist_ok=True)
    models = a.models.split(",")
    batches = [int(b) for b in a.batches.split(",")]
    for m in models:
        path = os.path.join(a.work, m + ".onnx")
        if not os.path.exists(path):
            print("# exporting %s" % m, file=sys.stderr, flush=True)
            export(m, path)
    rows = []
    for r in range(a.rounds):
        for m in models:
            path = os.path.join(a.work, m + ".onnx")
            hw = input_hw(path, 299 if m == "inception_v3" else 224)
            for b in batches:
                order = ("squish", "ort") if r % 2 == 0 else ("ort", "squish")
                if a.baseline:
                    order = ("base",) + order if r % 2 == 0 else order + ("base",)
                for engine in order:
                    res = (squish(a, path, b) if engine == "squish" else
                           squish(a, path, b, a.baseline, base_env) if engine == "base" else
                           ort(a, path, b, hw))
                    row = {"round": r + 1, "model": m, "batch": b, "engine": engine,
                           "median_ms": res["median_ms"], "cpu_ms": res["cpu_ms"]}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    base = "| baseline ms | baseline / ORT speed " if a.baseline else ""
    print("\n| model | batch " + base + "| squish ms | ORT ms | squish / ORT speed | squish CPU ms |"
          " ORT CPU ms | squish / ORT (CPU) |")
    print("|---|---|" + ("---|---|" if a.baseline else "") + "---|---|---|---|---|---|")
    speeds, bspeeds = [], []
    for m in models:
        for b in batches:
            def med(engine, key):
                return statistics.median(x[key] for x in rows if x["model"] == m and
                                         x["batch"] == b and x["engine"] == engine)
            s, o = med("squish", "median_ms"), med("ort", "median_ms")
            sc, oc = med("squish", "cpu_ms"), med("ort", "cpu_ms")
            speeds.append(o / s)
            cells = ""
            if a.baseline:
                bs = med("base", "median_ms")
                bspeeds.append(o / bs)
                cells = "| %.1f | %.2fx " % (bs, o / bs)
            print("| %s | %d %s| %.1f | %.1f | **%.2fx** | %.1f | %.1f | %.2fx |"
                  % (m, b, cells, s, o, o / s, sc, oc, oc / sc))
    print("\nmedian speed: %.2fx ONNX Runtime" % statistics.median(speeds))
    if a.baseline:
        print("baseline median speed: %.2fx ONNX Runtime" % statistics.median(bspeeds))


if __name__ == "__main__":
    main()
