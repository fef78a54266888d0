"""squish on one GPU, in one command (bench/gpu/run is the entry point).

Runs on a bare, offline machine that has a python3 with torch and numpy,
the NVIDIA driver, and cuDNN, cuBLAS and the CUDA runtime as the python's
pip wheels or a toolkit's lib64; squish itself comes from the kit
(scripts/gpu-kit: the release binaries and every library they load but
glibc's and CUDA's). Phases, each under one global time budget, each
result written out as soon as it is known (a command cut short still
leaves what it measured):

  kit      unpack the kit, check its glibc against the machine's
  env      find cuDNN, cuBLAS and cudart; nvidia-smi, the driver's, cuDNN's
           and cuBLAS's versions; torch, the CPU
  export   each model with this machine's torch, by both exporters where
           torch has two (the legacy TorchScript one and torch.export's);
           which files squish loads
  models   per model: parity, the cuda worker (each precision) and the
           cpu worker against torch fp32 on the same inputs, batch 1 and
           8; then l(b) for b = 1..64, the cuda worker at fp32 and fp16
           against torch eager fp32, fp16 channels_last, and both in CUDA
           graphs, back to back
  e2e      squishd with a cuda worker: JPEGs over /v1 and decoded UINT8
           tensors over /v2 at the highest Poisson rate where 99% meet the
           SLO, and the worker's live l(b) against its profile

--dry-run does the same here with the cpu worker in place of cuda, in a
clean environment (the script re-runs itself under env -i; the kit's
binaries get only the kit's libraries and CUDA's), and fails if any
process of the kit maps a library from anywhere else.

Only the standard library, numpy and torch (onnx is not needed)."""

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_env import LibWatch, check_maps, last_lines, phase_env, phase_kit  # noqa: E402
from gpu_export import phase_export  # noqa: E402
from gpu_report import markdown  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

# LR-ASPP: a segmenter, so that a run checks the cuda backend's Resize
MODELS = ["resnet50", "resnet18", "segmentation.lraspp_mobilenet_v3_large", "mobilenet_v2",
          "efficientnet_b0", "convnext_tiny", "vit_b_16"]
BATCHES = [1, 2, 4, 8, 16, 32, 64]
PARITY_BATCHES = [1, 8]
PRECISIONS = ["fp32", "tf32", "fp16", "bf16"]
SPEED_PRECISIONS = ["fp32", "fp16"]
# Largest |squish - torch fp32| over the outputs, relative to the largest
# |torch fp32| output, that passes. FP32: cuDNN's and torch's algorithms sum
# in other orders (1e-6 relative per op, a few hundred ops deep). TF32 rounds
# every conv and GEMM input to a 10-bit mantissa (2^-11 = 5e-4 relative per
# product, accumulated in FP32), FP16 the same mantissa and the activations
# stored in it as well; BF16 keeps 7 bits (2^-8 = 4e-3). Errors of that size
# per layer grow with depth over 50-200 layers of random weights; the
# bounds are what such a net keeps when nothing is wrong, and a layout or
# indexing bug gives errors of the order of the outputs themselves (1.0).
TOLERANCE = {"fp32": 1e-3, "tf32": 2e-2, "fp16": 3e-2, "bf16": 1e-1}


class Run:
    """The whole run's state: the budget, the results and where they go."""

    def __init__(self, a):
        self.a = a
        self.t0 = time.time()
        self.deadline = self.t0 + a.budget_s
        self.out = a.out
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="squish-gpu-")
        self.res = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    "dry_run": a.dry_run, "device": "cpu" if a.dry_run else a.device,
                    "budget_s": a.budget_s, "phases": [], "errors": []}
        self.kit_bin = self.kit_lib = None
        self.cuda_dirs = []
        self.models = {}  # name -> {"file": path, "static": {b: path}} of the file squish runs
        self.pids = []  # processes of the kit started (for the library check)
        self.log = open(os.path.join(self.out, "gpu_run.log"), "a")

    def left(self):
        return self.deadline - time.time()

    def say(self, *args):
        line = " ".join(str(x) for x in args)
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def error(self, where, what):
        self.res["errors"].append({"where": where, "what": str(what)[-2000:]})
        self.say("ERROR", where + ":", str(what)[-2000:])

    def save(self):
        self.res["elapsed_s"] = round(time.time() - self.t0, 1)
        tmp = os.path.join(self.out, "gpu_results.json.tmp")
        with open(tmp, "w") as f:
            json.dump(self.res, f, indent=1)
        os.replace(tmp, os.path.join(self.out, "gpu_results.json"))
        with open(os.path.join(self.out, "gpu_results.md"), "w") as f:
            f.write(markdown(self.res))

    def phase(self, name, fn, need_s):
        """Runs fn unless less than need_s seconds of the budget are left."""
        t = time.time()
        entry = {"name": name}
        self.res["phases"].append(entry)
        if self.left() < need_s:
            entry.update(status="skipped", why="%.0f s of the budget left, %d needed" % (
                self.left(), need_s))
            self.say("== %s: skipped (%s)" % (name, entry["why"]))
            self.save()
            return False
        self.say("== %s (%.0f s left)" % (name, self.left()))
        try:
            fn()
            entry["status"] = "ok"
        except Exception:  # a phase that fails leaves the others to run
            import traceback
            entry["status"] = "failed"
            self.error(name, traceback.format_exc())
        entry["seconds"] = round(time.time() - t, 1)
        self.save()
        return entry["status"] == "ok"

    # ---- processes of the kit ----

    def kit_env(self, extra=None):
        """The environment of every kit process: nothing of the caller's but
        PATH and a home; the kit's libraries, then CUDA's."""
        env = {"PATH": "/usr/bin:/bin", "HOME": self.work, "TMPDIR": self.work,
               "LD_LIBRARY_PATH": ":".join([self.kit_lib] + self.cuda_dirs),
               "LANG": "C.UTF-8"}
        env.update(extra or {})
        return env

    def kit_run(self, args, timeout, extra_env=None):
        """Runs a kit binary to completion; returns (rc, stdout, stderr)."""
        p = subprocess.Popen([os.path.join(self.kit_bin, args[0])] + args[1:], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=self.kit_env(extra_env))
        self.pids.append(p.pid)
        watch = LibWatch(self, p.pid) if self.a.dry_run else None
        try:
            if watch:
                watch.start()
            out, err = p.communicate(timeout=max(1, timeout))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            return 124, out, err + "\n(timed out after %d s)" % timeout
        finally:
            if watch:
                watch.stop()
        return p.returncode, out, err


# ---- torch on the same inputs ----

def torch_model(name, dev):
    from gpu_models import build
    return build(name).to(dev)


def inputs(batch):
    import numpy as np
    x = np.random.default_rng(1).standard_normal((max(PARITY_BATCHES), 3, 224, 224)).astype(np.float32)
    return np.ascontiguousarray(x[:batch])


def torch_fp32_reference(name, dev):
    """Torch's outputs in exact FP32 (no TF32) for each parity batch, and on
    a GPU torch's own deviation from them at each lower precision (TF32;
    FP16 and BF16 weights and activations, channels_last): {"fp32": {batch:
    outputs}, "torch_rel": {precision: {batch: rel}}}."""
    import torch
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    m = torch_model(name, dev)
    out = {"fp32": {}, "torch_rel": {}}
    with torch.no_grad():
        for b in PARITY_BATCHES:
            out["fp32"][b] = m(torch.from_numpy(inputs(b)).to(dev)).float().cpu().numpy()
        if dev == "cuda":
            for prec in ("tf32", "fp16", "bf16"):
                try:
                    rel = {}
                    torch.backends.cudnn.allow_tf32 = prec == "tf32"
                    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
                    dt = {"tf32": torch.float32, "fp16": torch.float16,
                          "bf16": torch.bfloat16}[prec]
                    mm = torch_model(name, dev).to(dt)
                    if prec != "tf32":
                        mm = mm.to(memory_format=torch.channels_last)
                    for b in PARITY_BATCHES:
                        x = torch.from_numpy(inputs(b)).to(dev).to(dt)
                        got = mm(x).float().cpu().numpy()
                        rel[b] = compare(got, out["fp32"][b])["rel"]
                    out["torch_rel"][prec] = rel
                    del mm
                except Exception:  # torch without that precision here: none to compare
                    pass
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
    del m
    return out


def compare(got, ref):
    import numpy as np
    got = got.reshape(ref.shape)
    scale = float(np.abs(ref).max()) or 1.0
    err = float(np.abs(got - ref).max())
    top1 = float((got.argmax(axis=1) == ref.argmax(axis=1)).mean()) if ref.ndim == 2 else None
    finite = bool(np.isfinite(got).all())
    return {"max_abs": err, "max_ref": scale, "rel": err / scale, "top1_agree": top1,
            "finite": finite}


def squish_bench(run, model, device, precision, batches, checks, iters, warmup, timeout,
                 extra_env=None, pixels=False):
    """One squish-cpu-bench process: the checks [(batch, in, out)] written,
    then timed runs at each batch (pixels: also uint8 pixels and UINT8
    rows in, converted by the backend against by the host). A file fixed
    at batch 1 runs batch 1 only. Returns (rows, error)."""
    info = run.models[model]
    if info["fixed_batch"]:
        batches = [b for b in batches if b == info["fixed_batch"]]
        checks = [c for c in checks if c[0] == info["fixed_batch"]]
        if not batches:
            return [], "the file is fixed at batch %d" % info["fixed_batch"]
    args = ["squish-cpu-bench", "--device", device, "--precision", precision, "--iters",
            str(iters), "--warmup", str(warmup)]
    if device == "cpu":
        args += ["--threads", str(os.cpu_count() or 2)]
    for b in batches:
        args += ["--batch", str(b)]
    for (b, i, o) in checks:
        args += ["--check", str(b), i, o]
    if pixels:
        args.append("--pixels")
    args.append(info["file"])
    rc, out, err = run.kit_run(args, timeout=timeout, extra_env=extra_env)
    rows = []
    for line in out.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows, (last_lines(err) if rc != 0 else None)


def parity_rows(run, m, device, prec, checks, rows, err, ref):
    """Compares the outputs one bench process wrote with torch's."""
    import numpy as np
    out = []
    for (b, _, o) in checks:
        row = {"model": m, "device": device.split(":")[0], "precision": prec, "batch": b,
               "runs": rows[0].get("runs") if rows else None}
        if os.path.exists(o) and os.path.getsize(o) == ref["fp32"][b].nbytes:
            row.update(compare(np.fromfile(o, dtype=np.float32), ref["fp32"][b]))
            runs = row["runs"] or prec
            tol = TOLERANCE[runs]
            # torch's own error at this precision, where known: twice it
            # passes too (a net whose logits are near ties, or whose
            # activations span a wide range, loses more than the bound)
            trel = ref["torch_rel"].get(runs, {}).get(b)
            if trel is not None:
                row["torch_rel"] = trel
                tol = max(tol, 2 * trel)
            row["tolerance"] = tol
            row["pass"] = row["finite"] and row["rel"] <= tol
        elif run.models[m]["fixed_batch"] and b != run.models[m]["fixed_batch"]:
            row["pass"] = None
            row["error"] = "squish refuses this model with a dynamic batch"
        else:
            row["pass"] = False
            row["error"] = err or "no output"
        out.append(row)
        run.say("parity %s" % json.dumps(row))
    return out


def speed_row(m, engine, rows):
    return {"model": m, "engine": engine, "runs": rows[0].get("runs"),
            "ms": {r["batch"]: r["backend_median_ms"] for r in rows},
            "wall_ms": {r["batch"]: r["median_ms"] for r in rows},
            "plan_ms": rows[0].get("plan_ms"), "memory_mb": rows[0].get("memory_mb"),
            "bytes_in": {r["batch"]: {k: r[k] for k in PIXEL_FIELDS if k in r}
                         for r in rows if "pixels_median_ms" in r}}


# squish-cpu-bench --pixels: a batch of uint8 pixels (and the same bytes as
# a UINT8 tensor) converted by the backend (on cuda: on the GPU) against
# converted by the host first; *_rel: the largest output difference
PIXEL_FIELDS = ("pixels_median_ms", "pixels_host_median_ms", "pixels_rel", "u8_median_ms",
                "u8_host_median_ms", "u8_rel")


def phase_models(run):
    """Per model: parity (the cpu worker in the background meanwhile, as it
    times nothing), then l(b) of squish and torch back to back."""
    import threading
    import torch
    a = run.a
    dev = "cpu" if a.dry_run else "cuda"
    device = "cpu" if a.dry_run else a.device
    d = os.path.join(run.work, "io")
    os.makedirs(d, exist_ok=True)
    parity = run.res.setdefault("parity", [])
    speed = run.res.setdefault("speed", [])
    for b in PARITY_BATCHES:
        inputs(b).tofile(os.path.join(d, "in%d.f32" % b))

    def checks_for(m, dv, prec):
        return [(b, os.path.join(d, "in%d.f32" % b), os.path.join(d, "%s.%s.%s.b%d.f32" % (
            m, dv.replace(":", ""), prec, b))) for b in PARITY_BATCHES]

    # timed: checks and l(b) from one plan (max batch the largest size, as
    # a served model's); checked only: a plan for the parity sizes.
    timed = ["fp32"] if a.dry_run else SPEED_PRECISIONS
    checked = ["fp16"] if a.dry_run else [p for p in PRECISIONS if p not in SPEED_PRECISIONS]
    for m in list(run.models):
        if run.left() < 40:
            run.error("models", "budget spent before %s" % m)
            break
        ref = torch_fp32_reference(m, dev)
        bg = {}
        if not a.dry_run:
            def cpu_parity(m=m):
                ck = checks_for(m, "cpu", "fp32")
                bg["rows"] = (ck,) + squish_bench(run, m, "cpu", "fp32", [1], ck, iters=1,
                                                  warmup=0, timeout=300)
            t = threading.Thread(target=cpu_parity, daemon=True)
            t.start()
        for prec in checked:
            ck = checks_for(m, device, prec)
            rows, err = squish_bench(run, m, device, prec, [1], ck, iters=1, warmup=0,
                                     timeout=min(300, max(10, run.left() - 10)))
            parity += parity_rows(run, m, device, prec, ck, rows, err, ref)
        if not a.dry_run:
            t.join(timeout=max(1, run.left() - 20))
            if "rows" in bg:
                ck, rows, err = bg["rows"]
                parity += parity_rows(run, m, "cpu", "fp32", ck, rows, err, ref)
        run.save()
        for prec in timed:
            ck = checks_for(m, device, prec)
            rows, err = squish_bench(run, m, device, prec, a.batches, ck, iters=a.iters, warmup=3,
                                     timeout=min(300, max(10, run.left() - 10)), pixels=True)
            parity += parity_rows(run, m, device, prec, ck, rows, err, ref)
            if err:
                run.error("speed %s squish %s" % (m, prec), err)
            if rows:
                speed.append(speed_row(m, "squish %s %s" % (device.split(":")[0], prec), rows))
                run.say("speed %s squish %s %s" % (m, prec, speed[-1]["ms"]))
        if a.conv_algo_ab and not a.dry_run:
            # the same plans with algorithms chosen by timing (A/B: the
            # heuristics' rows above, these after)
            for prec in timed:
                ck = checks_for(m, device, prec + "-find")
                rows, err = squish_bench(run, m, device, prec, a.batches, ck, iters=a.iters,
                                         warmup=3, timeout=min(300, max(10, run.left() - 10)),
                                         extra_env={"SQUISH_CUDA_CONV_ALGO": "find"})
                parity += parity_rows(run, m, device, prec, ck, rows, err, ref)
                if err:
                    run.error("speed %s squish %s find" % (m, prec), err)
                if rows:
                    speed.append(speed_row(m, "squish %s %s, algorithms by timing" % (
                        device.split(":")[0], prec), rows))
                    run.say("speed %s squish %s find %s" % (m, prec, speed[-1]["ms"]))
        del ref
        if a.step_times and not a.dry_run:
            for prec in timed:
                step_times(run, m, device, prec, max(a.batches))
        ways = [("torch eager fp32", False, False)]
        if dev == "cuda":
            ways += [("torch eager fp16 channels_last", True, False),
                     ("torch CUDA graph fp32", False, True),
                     ("torch CUDA graph fp16 channels_last", True, True)]
        for (label, fp16, graphs) in ways:
            if run.left() < 20:
                break
            try:
                ms = torch_times(m, dev, a.batches, a.iters, 3, fp16, graphs)
                speed.append({"model": m, "engine": label, "ms": ms})
                run.say("speed %s %s %s" % (m, label, ms))
            except Exception as e:
                run.error("speed %s %s" % (m, label), e)
        if dev == "cuda":
            torch.cuda.empty_cache()
        run.save()


def step_times(run, m, device, prec, batch):
    """The cuda worker's time per step at one batch size (eager, timed by
    events: SQUISH_CUDA_STEP_TIMES=1), as it prints them."""
    info = run.models[m]
    if info["fixed_batch"]:
        return
    rc, out, err = run.kit_run(["squish-cpu-bench", "--device", device, "--precision", prec,
                                "--iters", "5", "--warmup", "1", "--batch", str(batch),
                                info["file"]], timeout=min(120, max(10, run.left() - 10)),
                               extra_env={"SQUISH_CUDA_STEP_TIMES": "1"})
    lines = [ln for ln in err.splitlines() if ln.startswith(("cuda step times", "  kind", "  step"))]
    run.res.setdefault("step_times", []).append(
        {"model": m, "precision": prec, "batch": batch, "rc": rc, "table": lines})
    run.say("step times %s %s b=%d (rc %d):\n%s" % (m, prec, batch, rc, "\n".join(lines)))


def torch_times(name, dev, batches, iters, warmup, fp16, graphs):
    """Torch as a server runs a batch: a pinned host input to the device,
    the forward pass, the output back to the host; median ms per batch."""
    import torch
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    m = torch_model(name, dev)
    dtype = torch.float16 if fp16 else torch.float32
    if fp16:
        m = m.half().to(memory_format=torch.channels_last)
    out = {}
    for b in batches:
        host = torch.randn(b, 3, 224, 224).to(dtype)
        if dev == "cuda":
            host = host.pin_memory()
        x = torch.empty_like(host, device=dev)
        if fp16:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            if graphs:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        y = m(x)
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    y = m(x)

                def step():
                    x.copy_(host, non_blocking=True)
                    g.replay()
                    return y.cpu()
            else:
                def step():
                    x.copy_(host, non_blocking=True)
                    return m(x).cpu()
            for _ in range(warmup):
                step()
            if dev == "cuda":
                torch.cuda.synchronize()
            ms = []
            for _ in range(iters):
                t = time.perf_counter()
                step()
                if dev == "cuda":
                    torch.cuda.synchronize()
                ms.append((time.perf_counter() - t) * 1e3)
        ms.sort()
        out[b] = round(ms[len(ms) // 2], 3)
        if graphs:
            del g
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out


# ---- end to end: squishd and its worker, over HTTP ----

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_req(port, method, path, body=None, headers=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
    finally:
        c.close()
    try:
        return r.status, json.loads(data) if data else None
    except ValueError:
        return r.status, data


def multipart(fields):
    boundary = "squishgpu%d" % int(time.time() * 1000)
    out = []
    for (name, filename, data) in fields:
        disp = 'form-data; name="%s"' % name + ('; filename="%s"' % filename if filename else "")
        out.append(b"--" + boundary.encode() + b"\r\nContent-Disposition: " + disp.encode() +
                   b"\r\nContent-Type: application/octet-stream\r\n\r\n" + data + b"\r\n")
    out.append(b"--" + boundary.encode() + b"--\r\n")
    return b"".join(out), "multipart/form-data; boundary=" + boundary


def phase_e2e(run):
    """The end-to-end load once per precision of --e2e-precision, each in a
    squishd of its own; the first's results are res["e2e"], the others'
    res["e2e_more"]."""
    for i, prec in enumerate(run.a.e2e_precision.split(",")):
        if i > 0 and run.left() < 90:
            run.error("e2e", "budget spent before %s" % prec)
            break
        e2e = {"model": run.a.e2e_model, "slo_ms": run.a.slo_ms, "precision_asked": prec}
        if i == 0:
            run.res["e2e"] = e2e
        else:
            run.res.setdefault("e2e_more", []).append(e2e)
        try:
            e2e_one(run, prec, e2e)
        except Exception as ex:  # the next precision still runs
            e2e["error"] = str(ex)
            if i == 0:
                raise
            run.error("e2e %s" % prec, ex)
        run.save()


def e2e_one(run, precision, e2e):
    a = run.a
    model = a.e2e_model
    if model not in run.models or run.models[model]["fixed_batch"]:
        raise RuntimeError("%s has no file squish loads with a dynamic batch" % model)
    # a squishd and model DB of its own per precision: the same model name
    # uploaded again into the first's DB is answered 409 already_exists
    d = os.path.join(run.work, "squishd-" + precision)
    os.makedirs(d, exist_ok=True)
    port = free_port()
    workers = "cpu:1" if a.dry_run else "cuda:1"
    args = [os.path.join(run.kit_bin, "squishd"), "--listen", "127.0.0.1:%d" % port,
            "--db", os.path.join(d, "squish.db"), "--workers", workers,
            "--worker-bin", os.path.join(run.kit_bin, "squish-worker"),
            "--prep-threads", str(max(2, (os.cpu_count() or 2) - 4)),
            "--http-threads", "2" if (os.cpu_count() or 2) >= 8 else "1"]
    log = open(os.path.join(run.out, "squishd.log"), "ab")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=run.kit_env())
    run.pids.append(p.pid)
    watch = LibWatch(run, p.pid) if a.dry_run else None
    if watch:
        watch.start()
    e2e["workers"] = workers
    try:
        wait_for(lambda: http_ok(port, "/v2/health/live"), 30, "squishd live")
        wait_for(lambda: os.path.exists(os.path.join(d, "admin.token")), 10, "admin token")
        with open(os.path.join(d, "admin.token")) as f:
            token = f.read().strip()
        cfg = {"name": model, "max_batch": a.e2e_max_batch}
        if precision != "fp32":
            cfg["precision"] = precision
        with open(run.models[model]["file"], "rb") as f:
            body, ctype = multipart([("model", "m.onnx", f.read()),
                                     ("config", None, json.dumps(cfg).encode())])
        t = time.time()
        st, j = http_req(port, "POST", "/models", body,
                         {"Authorization": "Bearer " + token, "Content-Type": ctype}, timeout=120)
        if st not in (201, 202):
            raise RuntimeError("upload: %d %s" % (st, j))
        # first also needs the worker up: it may still be starting (cuDNN's load)
        wait_for(lambda: http_ok(port, "/v2/models/%s/ready" % model), min(240, run.left() - 60),
                 "%s measured and ready" % model)
        e2e["ready_after_upload_s"] = round(time.time() - t, 1)
        st, j = http_req(port, "GET", "/models/" + model, headers={"Authorization": "Bearer " + token})
        v = j["versions"][-1]
        kind = "cpu" if a.dry_run else "cuda"
        prof = [x for x in v.get("profiles", []) if x.get("device_kind") == kind]
        if prof:
            e2e["profile_ms"] = dict(zip(prof[0]["batch"], prof[0]["latency_ms"]))
        if "precision" in v:
            e2e["precision"] = v["precision"]
        photo = os.path.join(os.path.dirname(run.kit_lib), "share", "photo.jpg")
        trials = [("jpeg /v1", ["--path", "/v1/models/%s/infer" % model, "--body", photo,
                                "--content-type", "image/jpeg"]),
                  ("uint8 tensor /v2", ["--path", "/v2/models/%s/infer" % model, "--tensor",
                                        "3x224x224", "--dtype", "UINT8"])]
        for (label, targs) in trials:
            if label.startswith("jpeg") and not os.path.exists(photo):
                e2e[label] = {"error": "the kit has no photo"}
                continue
            if run.left() < a.e2e_trial_s * 6 + 20:
                e2e[label] = {"skipped": "%.0f s left" % run.left()}
                continue
            rate = a.e2e_start_rps
            args = ["squish-loadgen", "--port", str(port), "--slo-ms", str(a.slo_ms),
                    "--rate", str(rate), "--duration", str(a.e2e_trial_s), "--warmup", "1",
                    "--search-goodput", "--precision", str(a.e2e_search_rel), "--pause-ms",
                    "300" if not a.quick else "50",
                    "--connections", "2048"] + targs
            rc, out, err = run.kit_run(args, timeout=int(min(run.left() - 15, 200)))
            try:
                res = json.loads(out)
                e2e[label] = {"goodput_rps": res["goodput_rps"], "best": res["best"],
                              "trials": [{k: t.get(k) for k in ("rate_rps", "goodput_rps", "bad_rate",
                                                                 "latency_ms", "dropped", "late")}
                                         for t in res["trials"]]}
            except (ValueError, KeyError):
                e2e[label] = {"error": last_lines(err) or out[-500:], "rc": rc}
            run.say("e2e %s: %s" % (label, json.dumps(e2e[label])[:400]))
            run.save()
        # the GPU series squishd reads from NVML for its local cuda worker
        # (what perf_analyzer --collect-metrics scrapes)
        st, text = http_req(port, "GET", "/metrics")
        if isinstance(text, bytes):
            e2e["gpu_metrics"] = [ln for ln in text.decode(errors="replace").splitlines()
                                  if ln.startswith("nv_")]
        st, j = http_req(port, "GET", "/v2/models/%s/stats" % model)
        live = {}
        for bs in (j or {}).get("model_stats", [{}])[0].get("batch_stats", []):
            c = bs["compute_infer"]
            if c["count"] > 0:
                live[bs["batch_size"]] = {"batches": c["count"],
                                          "live_ms": round(c["ns"] / c["count"] / 1e6, 3)}
        for b, x in live.items():
            lp = e2e.get("profile_ms", {}).get(b)
            if lp:
                x["profile_ms"] = lp
                x["live_over_profile"] = round(x["live_ms"] / lp, 3)
        e2e["live_vs_profile"] = live
    finally:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
        if watch:
            watch.stop()
        log.close()


def http_ok(port, path):
    try:
        return http_req(port, "GET", path, timeout=5)[0] == 200
    except OSError:
        return False


def wait_for(pred, timeout, what):
    deadline = time.time() + max(1, timeout)
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.25)
    raise RuntimeError("timed out (%d s) waiting for %s" % (timeout, what))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kit", default=os.path.join(ROOT, "gpu-kit"))
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "build", "gpu-run"))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--models", default=None, help="comma-separated torchvision names")
    ap.add_argument("--batches", default=None, help="l(b) batch sizes, comma-separated")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--budget-s", type=float, default=450)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--export-timeout-s", type=int, default=150)
    ap.add_argument("--both-exporters", action="store_true",
                    help="dry run: also try the dynamo exporter (always on a GPU run)")
    ap.add_argument("--conv-algo-ab", action="store_true",
                    help="also time the cuda worker with convolution algorithms chosen by "
                         "timing (SQUISH_CUDA_CONV_ALGO=find)")
    ap.add_argument("--step-times", action="store_true",
                    help="also time the cuda worker's steps at the largest batch (eager)")
    ap.add_argument("--skip", default="", help="phases to skip, comma-separated")
    ap.add_argument("--slo-ms", type=float, default=25)
    ap.add_argument("--e2e-model", default=None)
    ap.add_argument("--e2e-max-batch", type=int, default=None)
    ap.add_argument("--e2e-precision", default=None,
                    help="comma-separated, each in a squishd of its own (default fp32,fp16 on "
                         "a GPU, fp32 in a dry run)")
    ap.add_argument("--e2e-trial-s", type=float, default=3)
    ap.add_argument("--e2e-start-rps", type=float, default=None)
    ap.add_argument("--e2e-search-rel", type=float, default=0.1,
                    help="the goodput search stops when its bracket is this narrow")
    ap.add_argument("--quick", action="store_true",
                    help="short trials and few runs: proves the script, measures little (CI)")
    a = ap.parse_args()
    if a.quick:
        a.iters, a.e2e_trial_s, a.e2e_search_rel = 3, 1, 0.5
    if a.dry_run and os.environ.get("SQUISH_GPU_RUN_CLEAN") != "1":
        # Again in a clean environment: nothing of this shell's leaks in.
        env = {"PATH": "/usr/bin:/bin", "HOME": tempfile.mkdtemp(prefix="squish-home-"),
               "SQUISH_GPU_RUN_CLEAN": "1", "LANG": "C.UTF-8"}
        argv = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:]
        if "--out" not in sys.argv:
            argv += ["--out", a.out]
        os.execve("/usr/bin/env", ["env", "-i"] + ["%s=%s" % kv for kv in env.items()] + argv, {})
    if a.dry_run:
        a.models = (a.models or "squeezenet1_0").split(",")
        a.batches = [int(x) for x in (a.batches or "1,2").split(",")]
        a.e2e_model = a.e2e_model or a.models[0]
        a.e2e_max_batch = a.e2e_max_batch or 4
        a.e2e_start_rps = a.e2e_start_rps or 10
        a.e2e_precision = a.e2e_precision or "fp32"
        a.slo_ms = a.slo_ms if "--slo-ms" in sys.argv else 500
    else:
        a.models = (a.models or ",".join(MODELS)).split(",")
        a.batches = [int(x) for x in (a.batches or ",".join(map(str, BATCHES))).split(",")]
        a.e2e_model = a.e2e_model or "resnet50"
        a.e2e_max_batch = a.e2e_max_batch or 32
        a.e2e_start_rps = a.e2e_start_rps or 1000
        a.e2e_precision = a.e2e_precision or "fp32,fp16"
    run = Run(a)
    skip = set(x for x in a.skip.split(",") if x)
    ok = run.phase("kit", lambda: phase_kit(run), 0)
    ok = ok and run.phase("env", lambda: phase_env(run), 0)
    ok = ok and ("export" in skip or run.phase("export", lambda: phase_export(run), 60))
    if ok:
        # serving first: the end-to-end figures are the headline, and a run
        # cut short by its budget should lose the last models' l(b) instead
        for (name, fn, need) in (("e2e", phase_e2e, 60), ("models", phase_models, 40)):
            if name not in skip:
                run.phase(name, lambda fn=fn: fn(run), need)
    if a.dry_run:
        check_maps(run, [])
    run.save()
    shutil.rmtree(run.work, ignore_errors=True)
    failed = [p["name"] for p in run.res["phases"] if p.get("status") == "failed"]
    bad_parity = [r for r in run.res.get("parity", []) if r.get("pass") is False]
    print(markdown(run.res))
    if failed or run.res.get("foreign_libraries"):
        return 1
    if a.dry_run and bad_parity:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
