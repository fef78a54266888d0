"""bench/gpu/run's export phase: each model exported by this machine's
torch, by each of its exporters, in child processes several at once; which
files squish loads."""

import json
import os
import subprocess
import sys
import time

from gpu_env import last_lines

# ---- export (a child process per file, several at once) ----

EXPORT_PY = r"""
import inspect, json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
name, exporter, path, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, sys.argv[5])
from gpu_models import build
torch.set_num_threads(2)
m = build(name)
x = torch.randn(max(batch, 1), 3, 224, 224)
kw = dict(input_names=["input"], output_names=["output"])
if batch == 0:
    kw["dynamic_axes"] = {"input": {0: "batch"}, "output": {0: "batch"}}
params = inspect.signature(torch.onnx.export).parameters
t = time.time()
if exporter == "legacy":
    kw["opset_version"] = 17
    if "dynamo" in params:
        kw["dynamo"] = False
else:
    if "dynamo" not in params:
        print(json.dumps({"ok": False, "why": "torch %s has no dynamo exporter" % torch.__version__}))
        sys.exit(0)
    kw["dynamo"] = True
    kw["opset_version"] = 18  # the newest squish reads
    if "external_data" in params:
        kw["external_data"] = False
with torch.no_grad():
    torch.onnx.export(m, (x,), path, **kw)
print(json.dumps({"ok": True, "seconds": round(time.time() - t, 1),
                  "checksum": float(sum(p.double().sum() for p in m.parameters()))}))
"""


def export_all(run, jobs):
    """jobs: [(name, exporter, path, batch)], batch 0 = dynamic. Returns
    {path: result}."""
    results, pending = {}, list(jobs)
    running = []
    par = max(1, min(len(jobs), (os.cpu_count() or 2) // 2, 8))
    while pending or running:
        while pending and len(running) < par:
            j = pending.pop(0)
            p = subprocess.Popen([sys.executable, "-c", EXPORT_PY, j[0], j[1], j[2], str(j[3]),
                                  os.path.dirname(os.path.abspath(__file__))],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            running.append((j, p, time.time()))
        for item in list(running):
            j, p, t = item
            if p.poll() is None:
                if time.time() - t > run.a.export_timeout_s:
                    p.kill()
                    p.communicate()
                    results[j[2]] = {"ok": False, "why": "timed out after %d s" % run.a.export_timeout_s}
                    running.remove(item)
                continue
            out, err = p.communicate()
            try:
                results[j[2]] = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                results[j[2]] = {"ok": False, "why": last_lines(err)}
            running.remove(item)
        time.sleep(0.1)
    return results


def squish_loads(run, path, batch=1):
    """Whether squish imports and plans the file on the cpu: None, or why not."""
    rc, out, err = run.kit_run(["squish-cpu-bench", "--threads", "2", "--iters", "1", "--warmup",
                                "0", "--batch", str(batch), path], timeout=180)
    return None if rc == 0 else last_lines(err, 2)


SKELETON_MARK = "squish-skeleton: data dropped"


def skeleton(src, dst, keep_bytes=4096):
    """src's graph with every initializer over keep_bytes emptied (its dims
    and type kept, doc_string marked): what squish refused, in a few
    hundred KB, for a machine without this exporter (reinflate.py)."""
    import onnx
    m = onnx.load(src)
    for t in m.graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        if n * 4 <= keep_bytes:
            continue
        for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                      "uint64_data"):
            t.ClearField(field)
        t.doc_string = SKELETON_MARK
    onnx.save(m, dst)


def keep_skeletons(run, table):
    """The refused exports' skeletons, in one refused.tar.xz beside the
    results (the device tool brings back a few files only)."""
    import tarfile
    refused = [r for r in table if r.get("exported") and r.get("squish_loads") is False]
    if not refused:
        return
    out = os.path.join(run.out, "refused.tar.xz")
    try:
        with tarfile.open(out, "w:xz") as tar:
            for r in refused:
                src = r["path"]
                dst = os.path.join(run.work, os.path.basename(src) + ".skeleton")
                skeleton(src, dst)
                tar.add(dst, arcname=os.path.basename(src))
        run.say("refused exports' skeletons: %s (%d KB)" % (out, os.path.getsize(out) // 1024))
        run.res["refused_skeletons"] = os.path.basename(out)
    except Exception as e:  # the export results stand without them
        run.error("skeletons", e)


def phase_export(run):
    d = os.path.join(run.work, "models")
    os.makedirs(d, exist_ok=True)
    jobs = []
    for m in run.a.models:
        jobs.append((m, "legacy", os.path.join(d, m + ".onnx"), 0))
        if not run.a.dry_run or run.a.both_exporters:
            jobs.append((m, "dynamo", os.path.join(d, m + ".dynamo.onnx"), 0))
    res = export_all(run, jobs)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=max(1, min(6, (os.cpu_count() or 2) // 2))) as pool:
        loads = {path: pool.submit(squish_loads, run, path) for (_, _, path, _) in jobs
                 if res.get(path, {}).get("ok")}
    table = []
    for (m, exp, path, _) in jobs:
        r = res.get(path, {"ok": False, "why": "not run"})
        row = {"model": m, "exporter": exp, "exported": r["ok"], "export_s": r.get("seconds"),
               "why": r.get("why"), "path": path}
        if r["ok"]:
            row["mb"] = round(os.path.getsize(path) / 2**20, 1)
            row["squish_loads_error"] = loads[path].result()
            row["squish_loads"] = row["squish_loads_error"] is None
        table.append(row)
        run.say("export %s %s: %s" % (m, exp, row))
    keep_skeletons(run, table)
    # The file squish runs: the legacy export, else the dynamo one; a model
    # squish refuses with a dynamic batch gets a file fixed at batch 1 (what
    # squish serves of such a model today: one item per run).
    fixed = []
    for m in run.a.models:
        rows = {r["exporter"]: r for r in table if r["model"] == m}
        for exp, suffix in (("legacy", ".onnx"), ("dynamo", ".dynamo.onnx")):
            if rows.get(exp, {}).get("squish_loads"):
                run.models[m] = {"file": os.path.join(d, m + suffix), "exporter": exp,
                                 "fixed_batch": None}
                break
        else:
            if rows.get("legacy", {}).get("exported"):
                fixed.append((m, "legacy", os.path.join(d, m + ".b1.onnx"), 1))
    if fixed:
        res2 = export_all(run, fixed)
        for (m, _, p, b) in fixed:
            r = res2.get(p, {"ok": False, "why": "not run"})
            row = {"model": m, "exporter": "legacy, batch fixed at 1", "exported": r["ok"],
                   "export_s": r.get("seconds"), "why": r.get("why")}
            if r["ok"]:
                row["squish_loads_error"] = squish_loads(run, p)
                row["squish_loads"] = row["squish_loads_error"] is None
                if row["squish_loads"]:
                    run.models[m] = {"file": p, "exporter": row["exporter"], "fixed_batch": 1}
            table.append(row)
            run.say("export %s: %s" % (os.path.basename(p), row))
    run.res["exports"] = table
