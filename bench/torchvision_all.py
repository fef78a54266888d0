#!/usr/bin/python3
"""Every torchvision classifier through squish's cpu worker, against torch.

Run with Debian's /usr/bin/python3 (python3-torch 1.13, torchvision 0.14):

    /usr/bin/python3 bench/torchvision_all.py BUILD_DIR WORK_DIR [MODEL...]

For each classifier of torchvision.models (all of them when no MODEL is
named): random weights from a fixed seed, BatchNorm statistics calibrated
as scripts/export_models.py does, exported at opset 13 with a dynamic batch;
then squish-cpu-bench checks the file as an upload does (import and
mdb_model_info), runs one fixed batch-1 image through the cpu backend and
times batch 1. The result (accepted or the refusal, max relative error of
the logits: max |squish - torch| / max |torch|, ms at batch 1) goes to
WORK_DIR/results.json, one entry per model, kept between runs so that an
interrupted sweep resumes; --table prints the markdown table of
bench/RESULTS.md from it.

Models whose ONNX file would pass the 1 GiB upload limit (squish's
SQ_TOO_LARGE, and protobuf's own 2 GiB) are listed as too big, not
exported.
"""
import json
import os
import subprocess
import sys
import time

import numpy
import torch
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import export_models  # noqa: E402  (calibrate, SEED, OPSET)

UPLOAD_LIMIT_BYTES = 1 << 30
THREADS = 2


def classifiers():
    return sorted(torchvision.models.list_models(module=torchvision.models))


def image_hw(name):
    return 299 if name == "inception_v3" else 224


def build(name):
    torch.manual_seed(export_models.SEED)
    kwargs = {"weights": None}
    if name in ("inception_v3", "googlenet"):
        kwargs.update(aux_logits=False, init_weights=True)
    model = getattr(torchvision.models, name)(**kwargs)
    hw = image_hw(name)
    old = export_models.IMAGE_HW
    export_models.IMAGE_HW = hw
    try:
        model = export_models.calibrate(model).eval()
    finally:
        export_models.IMAGE_HW = old
    # ViT zero-initializes its head: every logit 0, in torch and squish
    # alike, proves nothing. Weight matrices left all zero get seeded noise;
    # ConvNeXt's layer scales (1e-6, so that its blocks hardly count) 0.1.
    gen = torch.Generator().manual_seed(export_models.SEED + 11)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() >= 2 and not p.any():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            if pname.endswith("layer_scale"):
                p.fill_(0.1)
    return model


def run_one(name, build_dir, work):
    entry = {"model": name}
    t0 = time.time()
    # The weights' metadata knows the size without building the model (a
    # 644M-parameter RegNet takes minutes here).
    params = torchvision.models.get_model_weights(name).DEFAULT.meta["num_params"]
    entry["params"] = params
    if params * 4 > UPLOAD_LIMIT_BYTES:
        entry["accepted"] = False
        entry["why"] = "too big: %.1f GiB of float32 weights, past the 1 GiB upload limit" % (
            params * 4 / (1 << 30))
        return entry
    model = build(name)
    hw = image_hw(name)
    onnx_path = os.path.join(work, name + ".onnx")
    gen = torch.Generator().manual_seed(export_models.SEED + 7)
    image = torch.rand(1, 3, hw, hw, generator=gen)
    with torch.no_grad():
        want = model(image)
        t, c = time.time(), time.process_time()
        model(image)  # the first call above warmed up
        entry["torch_ms"] = (time.time() - t) * 1000
        entry["torch_cpu_ms"] = (time.process_time() - c) * 1000
    in_path = os.path.join(work, name + ".in.f32")
    out_path = os.path.join(work, name + ".out.f32")
    export_models.write_f32(in_path, image)
    # A dynamic batch first; a graph that computes with the batch (ViT's
    # and Swin's attention reshape to N * heads) is refused that way, and
    # is exported again for batch 1, which squish serves one item per run.
    for dynamic in (True, False):
        torch.onnx.export(model, torch.zeros(1, 3, hw, hw), onnx_path,
                          opset_version=export_models.OPSET, input_names=["input"],
                          output_names=["output"],
                          dynamic_axes={"input": {0: "N"}, "output": {0: "N"}} if dynamic else None,
                          do_constant_folding=True)
        cmd = [os.path.join(build_dir, "bench", "squish-cpu-bench"), "--threads", str(THREADS),
               "--iters", "3", "--warmup", "1", "--batch", "1", "--input", in_path, "--output", out_path,
               onnx_path]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        why = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "rc %d" % (
            proc.returncode)
        if proc.returncode == 0 or "import:" not in proc.stderr:
            break
        if dynamic:
            entry["dynamic_refused"] = why.split(": import: ")[-1]
    if not dynamic and proc.returncode == 0:
        entry["why"] = "batch-1 export (dynamic: %s)" % entry["dynamic_refused"]
    if proc.returncode != 0:
        entry["accepted"] = "upload:" not in proc.stderr and "import:" not in proc.stderr
        entry["why"] = why
        return entry
    entry["accepted"] = True
    bench = json.loads(proc.stdout.strip().splitlines()[-1])
    entry["ms_b1"] = bench["median_ms"]
    entry["cpu_ms_b1"] = bench["cpu_ms"]
    got = torch.from_numpy(numpy.fromfile(out_path, dtype="<f4"))
    ref = want.detach().flatten()
    if got.numel() != ref.numel():
        entry["why"] = "squish wrote %d values, torch %d" % (got.numel(), ref.numel())
        return entry
    entry["max_rel_err"] = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    entry["same_top1"] = bool(got.argmax() == ref.argmax())
    entry["seconds"] = time.time() - t0
    for p in (onnx_path, in_path, out_path):
        os.remove(p)
    return entry


def table(results):
    rows = ["| model | params (M) | accepted | max rel. error | same top-1 | squish ms (b1) "
            "| squish CPU ms | torch ms (b1) | torch CPU ms | note |",
            "|---|---:|---|---:|---|---:|---:|---:|---:|---|"]
    for name in sorted(results):
        e = results[name]
        err = "%.1e" % e["max_rel_err"] if "max_rel_err" in e else "-"
        rows.append("| %s | %.1f | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            name, e.get("params", 0) / 1e6, "yes" if e.get("accepted") else "no", err,
            {True: "yes", False: "no"}.get(e.get("same_top1"), "-"),
            "%.1f" % e["ms_b1"] if "ms_b1" in e else "-",
            "%.1f" % e["cpu_ms_b1"] if "cpu_ms_b1" in e else "-",
            "%.1f" % e["torch_ms"] if "torch_ms" in e else "-",
            "%.1f" % e["torch_cpu_ms"] if "torch_cpu_ms" in e else "-",
            note(e)))
    return "\n".join(rows)


def note(e):
    """The table's note: short, the full reason stays in results.json."""
    why = e.get("why", "")
    if why.startswith("batch-1 export"):
        return "batch-1 export (the dynamic-batch one is refused: the graph computes with N)"
    if why.startswith("export: ") and "aten::zero" in why:
        return "torch 1.13 cannot export it at opset 13 (aten::zero)"
    return why.replace("|", "/")[:160]


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        with open(os.path.join(sys.argv[2], "results.json")) as f:
            print(table(json.load(f)))
        return 0
    if len(sys.argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    build_dir, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(THREADS)
    path = os.path.join(work, "results.json")
    results = {}
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    names = sys.argv[3:] or classifiers()
    for name in names:
        if name in results and not sys.argv[3:]:
            continue
        try:
            results[name] = run_one(name, build_dir, work)
        except Exception as e:  # an export failure is a row too
            results[name] = {"model": name, "accepted": False,
                             "params": torchvision.models.get_model_weights(name).DEFAULT.meta[
                                 "num_params"],
                             "why": "export: %s" % str(e).splitlines()[0][:200]}
        print(json.dumps(results[name]), flush=True)
        with open(path + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
