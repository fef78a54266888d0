#!/usr/bin/python3
"""The resident memory of a cpu worker holding models: starts squishd with
one cpu worker (from SQUISH_BUILD_DIR, default build/), uploads each model
given (max_batch 64 unless --max-batch), waits until every one is measured
and ready, and prints the worker's VmRSS (and of it RssAnon, the
memory the worker allocated, and RssFile, its libraries' pages) and Pss
(/proc/PID/status, smaps_rollup) and, per model, its profiled batch sizes
and the memory the worker reported for each. Models that share all but
their last layers form a prefix group once ready, which the worker loads
and measures besides them: the worker is measured once every group formed
is ready too (or not used), and the groups are listed; --no-groups starts
squishd with prefix batching off.

    bench/worker_memory.py build/tests/models/resnet18.onnx
    bench/worker_memory.py --max-batch 64 build/tests/models/{resnet18,resnet50}.onnx
"""

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))

import tiny_models as tm  # noqa: E402
from harness import Squishd, eventually  # noqa: E402


def proc_kb(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                out[line.split(":")[0]] = int(line.split()[1])
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1])
    return out


def mappings(pid, top):
    """The worker's resident memory by mapping: [heap], its anonymous
    mappings (largest first), and file mappings summed; kB."""
    rows, cur = [], None
    with open("/proc/%d/smaps" % pid) as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                cur = {"name": head[5] if len(head) > 5 else "[anon]",
                       "size_kb": (hi - lo) // 1024, "rss_kb": 0}
                rows.append(cur)
            elif head and head[0] == "Rss:" and cur is not None:
                cur["rss_kb"] = int(head[1])
    anon = sorted((r for r in rows if not r["name"].startswith("/")),
                  key=lambda r: -r["rss_kb"])
    files = sum(r["rss_kb"] for r in rows if r["name"].startswith("/"))
    small = anon[top:]
    return {"top": anon[:top], "other_anon_kb": sum(r["rss_kb"] for r in small),
            "other_anon_maps": len(small), "file_kb": files}


def settled_groups(s, timeout):
    """Waits until every prefix group squishd formed is ready, retired or
    not used; returns their log lines."""
    formed = re.findall(r"prefix group formed group=(\S+)", s.read_log())
    done = {}
    for g in formed:
        pat = re.compile(r"prefix group (ready|retired|not used)[^\n]*group=%s\b[^\n]*"
                         % re.escape(g))
        eventually(lambda: pat.search(s.read_log()) or None, timeout, "group %s settled" % g,
                   step=0.5)
        done[g] = pat.search(s.read_log()).group(0)
    return done


def upload(s, name, data, max_batch):
    cfg = {"name": name, "max_batch": max_batch}
    body, ctype = tm.multipart([("model", name + ".onnx", "application/octet-stream", data),
                                ("config", "config.json", "application/json",
                                 json.dumps(cfg).encode())])
    r = s.request("POST", "/models", body=body,
                  headers={"Content-Type": ctype, "Authorization": "Bearer " + s.token})
    assert r.status == 202, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--maps", type=int, default=0,
                    help="also print the worker's N largest anonymous mappings once loaded")
    ap.add_argument("--no-groups", action="store_true",
                    help="prefix batching off: the worker holds the models given and no group")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    s = Squishd(workers="cpu:1", extra=["--prefix-batching", "0"] if a.no_groups else [])
    try:
        s.wait_ready(workers=1)
        pid = list(s.worker_pids().values())[0]
        print(json.dumps({"state": "idle", **proc_kb(pid)}))
        names = []
        for path in a.models:
            name = os.path.basename(path).rsplit(".", 1)[0].replace(".", "_")
            with open(path, "rb") as f:
                upload(s, name, f.read(), a.max_batch)
            names.append(name)
            eventually(lambda: s.get("/v2/models/%s/ready" % name).status == 200 or None,
                       a.timeout, "%s measured and ready" % name, step=0.5)
        for name in names:
            rec = s.get("/models/" + name,
                        headers={"Authorization": "Bearer " + s.token}).json["versions"][0]
            p = [p for p in rec["profiles"] if p["device_kind"] == "cpu"][0]
            print(json.dumps({"model": name, "profiled_batches": p["batch"],
                              "memory_mb": [round(m / 2**20, 1) for m in p["peak_memory_bytes"]]}))
        time.sleep(2)
        groups = settled_groups(s, a.timeout)
        if groups:
            print(json.dumps({"prefix_groups": groups}))
        time.sleep(1)
        print(json.dumps({"state": "loaded", "models": len(names), **proc_kb(pid)}))
        if a.maps:
            print(json.dumps({"mappings": mappings(pid, a.maps)}))
    finally:
        s.stop()
        s.cleanup()


if __name__ == "__main__":
    main()
