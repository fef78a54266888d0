"""scripts/gpu-kit and bench/gpu/run --dry-run, as a GPU session runs them
but on this machine: the kit is built from the build under test, then the
dry run unpacks it, exports a small model with this machine's torch, checks
the cpu worker against torch, times both, and serves the model through
squishd under a Poisson load, all in a clean environment with only the
kit's libraries (and CUDA's). TAP.

    python3 test_gpu_kit.py SOURCE_ROOT BUILD_DIR"""

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time

src, build = sys.argv[1], sys.argv[2]
n = 0
failed = 0


def ok(cond, what, detail=""):
    global n, failed
    n += 1
    if not cond:
        failed += 1
        print("not ok %d - %s" % (n, what))
        for line in str(detail).splitlines()[-40:]:
            print("# " + line)
    else:
        print("ok %d - %s" % (n, what))
    sys.stdout.flush()


def skip_all(why):
    print("1..0 # SKIP " + why)
    sys.exit(0)


if subprocess.run(["/usr/bin/python3", "-c", "import torch, torchvision, numpy"],
                  capture_output=True).returncode != 0:
    skip_all("Debian's python3-torch and -torchvision are missing (scripts/bootstrap --test)")

tmp = tempfile.mkdtemp(prefix="squish-kit-test-")
kit = os.path.join(tmp, "kit")
out = os.path.join(tmp, "out")
t0 = time.time()
p = subprocess.run([os.path.join(src, "scripts", "gpu-kit"), "--build", build, "--out", kit],
                   capture_output=True, text=True, timeout=600)
kit_s = time.time() - t0
ok(p.returncode == 0, "scripts/gpu-kit builds the kit (%.0f s)" % kit_s, p.stdout + p.stderr)
print("# " + p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "# (no output)")
tarball = os.path.join(kit, "squish-kit.tar.xz")
if p.returncode != 0 or not os.path.exists(tarball):
    print("1..%d" % n)
    sys.exit(1)

size = os.path.getsize(tarball)
ok(size < 32 * 2**20, "the kit is under 32 MiB (%.1f MiB)" % (size / 2**20))
with open(os.path.join(kit, "manifest.json")) as f:
    man = json.load(f)
files = set(man["files"])
want = {"bin/squishd", "bin/squish-worker", "bin/squish-cpu-bench", "bin/squish-loadgen",
        "lib/libdnnl.so.2", "lib/libh2o-evloop.so.0.13", "lib/libjansson.so.4",
        "lib/libturbojpeg.so.0", "lib/libsqlite3.so.0", "lib/libprotobuf-c.so.1"}
ok(want <= files, "the kit holds the binaries and the libraries they load",
   "missing: %s" % sorted(want - files))
ok(not any(f.startswith("lib/lib" + x) for f in files
           for x in ("c.so", "m.so", "cudart", "cudnn", "cublas", "cuda.so")),
   "glibc's and CUDA's libraries stay out of the kit", sorted(files))
with tarfile.open(tarball) as t:
    names = t.getnames()
    machine = src.encode()
    leaks = []
    for m in t.getmembers():
        if m.isfile() and machine in t.extractfile(m).read():
            leaks.append(m.name)
ok(not leaks, "no file of the kit names this machine's source path", leaks)
ok(man["glibc_needed"] and man["commit"], "the manifest says the glibc needed and the commit", man)

t0 = time.time()
p = subprocess.run([os.path.join(src, "bench", "gpu", "run"), "--dry-run", "--quick", "--kit", kit,
                    "--out", out], capture_output=True, text=True, timeout=600)
dry_s = time.time() - t0
ok(p.returncode == 0, "bench/gpu/run --dry-run passes (%.0f s)" % dry_s, p.stdout + p.stderr)
try:
    with open(os.path.join(out, "gpu_results.json")) as f:
        res = json.load(f)
except (OSError, ValueError) as e:
    res = {}
    ok(False, "the dry run writes gpu_results.json", e)
phases = {x["name"]: x.get("status") for x in res.get("phases", [])}
ok(phases == {"kit": "ok", "env": "ok", "export": "ok", "models": "ok", "e2e": "ok"},
   "every phase ran and passed", json.dumps(res.get("phases"), indent=1) + "\n" +
   json.dumps(res.get("errors"), indent=1))
ok(res.get("foreign_libraries") == [],
   "the kit's processes map no library from outside the kit but glibc's and CUDA's",
   res.get("foreign_libraries"))
par = res.get("parity", [])
ok(len(par) >= 4 and all(r.get("pass") for r in par),
   "the cpu worker matches torch on the exported model at batch 1 and 8", json.dumps(par, indent=1))
ok(any(r["precision"] == "fp16" and r.get("runs") == "fp32" for r in par),
   "a plan asked for fp16 on the cpu says it runs fp32", json.dumps(par, indent=1))
engines = {r["engine"] for r in res.get("speed", [])}
ok({"torch eager fp32", "squish cpu fp32"} <= engines, "l(b) of squish and of torch, side by side",
   engines)
e2e = res.get("e2e", {})
ok(all(e2e.get(k, {}).get("goodput_rps", 0) > 0 for k in ("jpeg /v1", "uint8 tensor /v2")),
   "squishd serves JPEGs and decoded tensors at a searched goodput", json.dumps(e2e, indent=1))
ok(e2e.get("live_vs_profile"), "the worker's live l(b) beside its profile", e2e)
md = os.path.join(out, "gpu_results.md")
ok(os.path.exists(md) and "## Parity" in open(md).read(), "the markdown table is written")
print("# kit %.0f s, dry run %.0f s" % (kit_s, dry_s))
print("1..%d" % n)
if failed == 0:
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failed else 0)
