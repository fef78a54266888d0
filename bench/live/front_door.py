#!/usr/bin/env python3
"""The front door, side by side in one run (issue 25 item 6, the "before").

1. Binary tensors against bare h2o: the same request (Triton's binary tensor
   extension, FP32 [1, 3, 32, 32] and [1, 3, 224, 224]) to squish-bare-h2o
   (bench/live/bare_h2o.c: h2o reads the body and answers a small JSON) and to
   squishd's /v2/models/M/infer for an emulated model of near-zero latency,
   both with --threads HTTP threads, in interleaved rounds (A/B/A/B).
2. JPEG against the machine's decode ceiling: a 512x600 JPEG (grace_hopper
   re-encoded by PIL at quality 90) to squishd's /v1/models/m/infer (input
   [3, 224, 224]) against squish-decode-ceiling (plain tjDecompress2 to RGB
   of the same file on as many threads as the machine has cores; and the
   same at DCT scale 1/2, which is how squishd decodes it for 224x224),
   A/B/A/B.

Load: --clients squish-loadgen processes in closed loop, each with --conns
keep-alive connections, one request in flight on each; req/s is the sum of
their answered_rps. squishd's CPU is utime + stime of /proc/<pid>/stat over
the run; per_core_s is req/s over that (requests per CPU second: on a
machine shared with other work, the cost of a request whatever share of
the cores the run got; squish-decode-ceiling's own images_per_cpu_s for
the ceilings). Every figure is one line of JSON on stdout, then the tables.

    bench/live/front_door.py BUILD [--threads 1] [--rounds 2] [--duration 5]
        [--clients 4] [--conns 16] [--perf-out FILE [--perf-call-graph dwarf]]
        [--before OTHER_BUILD]

--before OTHER_BUILD: a second squishd, OTHER_BUILD/gateway/squishd (say, a
build of an older commit), served the same models and loaded in the same
rounds: bare, before, squishd in odd rounds and bare, squishd, before in even
ones, so that before and after are measured side by side.

--perf-out FILE: after the rounds, one more binary tensor run (--perf-shape:
3x224x224, or 3x32x32; jpeg for the JPEG route) on
squishd under `perf record --call-graph dwarf -F 499` (FILE is perf's data
file; --perf-call-graph fp for frame pointers, which a release build lacks).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_live as R  # noqa: E402

HOPPER = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
MODELS = {"m": [3, 224, 224], "m32": [3, 32, 32]}


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_jpeg(path):
    """grace_hopper.jpg resized to 512x600 (it already is) and re-encoded at
    quality 90, by PIL in the system Python (Debian's python3-pil)."""
    code = ("import sys; from PIL import Image; "
            "Image.open(sys.argv[1]).convert('RGB').resize((512, 600), Image.LANCZOS)"
            ".save(sys.argv[2], quality=90)")
    subprocess.run(["/usr/bin/python3", "-c", code, HOPPER, path], check=True)


def load(a, port, args):
    cmd = [os.path.join(a.build, "bench", "squish-loadgen"), "--port", str(port),
           "--closed", str(a.conns), "--duration", str(a.duration), "--warmup", str(a.warmup),
           "--slo-ms", "1000", "--late-ms", "5000", "--timeout-ms", "10000"] + args
    procs = [subprocess.Popen(cmd + ["--seed", str(i + 1)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(a.clients)]
    outs = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError("loadgen: %s" % err[-1000:])
        outs.append(json.loads(out))
    bad = sum(o["errors"] + o["timeouts"] + o["conn_errors"] + o["dropped"] for o in outs)
    return {"req_s": round(sum(o["answered_rps"] for o in outs), 1),
            "good_or_late": sum(o["good"] + o["late"] for o in outs), "not_200": bad,
            "p50_ms": max(o["latency_ms"]["p50"] for o in outs),
            "p99_ms": max(o["latency_ms"]["p99"] for o in outs),
            "loadgen_cpu": round(sum(o["loadgen_cpu_fraction"] for o in outs), 2)}


def on(a, server, port, pid, args):
    c0, t0 = cpu_seconds(pid), time.time()
    r = load(a, port, args)
    r["server_cores"] = round((cpu_seconds(pid) - c0) / (time.time() - t0), 2)
    r["per_core_s"] = round(r["req_s"] / r["server_cores"], 1) if r["server_cores"] > 0 else 0
    r["server"] = server
    return r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--threads", type=int, default=1, help="HTTP threads of both servers")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=5)
    p.add_argument("--warmup", type=float, default=1)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--conns", type=int, default=16)
    p.add_argument("--perf-out")
    p.add_argument("--perf-call-graph", default="dwarf", help="perf record --call-graph")
    p.add_argument("--perf-shape", default="3x224x224",
                   help="the tensor of the perf run (3x224x224, 3x32x32), or jpeg")
    p.add_argument("--before", help="another build whose squishd is measured beside this one")
    a = p.parse_args()
    cores = os.cpu_count()
    print("# %s; %s" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), R.machine()),
          flush=True)
    tmp = tempfile.mkdtemp(prefix="squish-front-")
    jpeg = os.path.join(tmp, "hopper_512x600_q90.jpg")
    make_jpeg(jpeg)
    bare = R.Bare(a.build, a.threads)
    d = R.Squishd(a.build, "emu:1", "adaptive", ["--http-threads", str(a.threads)])
    servers = {"bare": bare, "squishd": d}
    runs = []
    try:
        if a.before:
            servers["before"] = R.Squishd(a.before, "emu:1", "adaptive",
                                          ["--http-threads", str(a.threads)])
        gateways = [s for s in ("before", "squishd") if s in servers]
        for server in gateways:
            for name, shape in MODELS.items():
                servers[server].add_model(
                    {"name": name, "profile": {"alpha_ms": R.TINY_ALPHA_MS,
                                               "beta_ms": R.TINY_BETA_MS},
                     "max_batch": 64, "input": {"shape": shape}, "num_classes": 10})
        deadline = time.time() + 30
        for server in gateways:
            for name in MODELS:
                while R.request(servers[server].port, "GET",
                                "/v2/models/%s/ready" % name)[0] != 200:
                    if time.time() > deadline:
                        raise RuntimeError("model %s not ready" % name)
                    time.sleep(0.05)
        for rnd in range(1, a.rounds + 1):
            order = gateways if rnd % 2 == 1 else gateways[::-1]
            for name, shape in (("m32", "3x32x32"), ("m", "3x224x224")):
                args = ["--tensor", shape, "--dtype", "FP32"]
                for server in ["bare"] + order:
                    srv = servers[server]
                    r = on(a, server, srv.port, srv.proc.pid,
                           args + ["--path", "/v2/models/%s/infer" % name])
                    r.update(case="tensor " + shape, round=rnd)
                    print(json.dumps(r), flush=True)
                    runs.append(r)
            for server in order:
                srv = servers[server]
                r = on(a, server, srv.port, srv.proc.pid,
                       ["--path", "/v1/models/m/infer", "--body", jpeg,
                        "--content-type", "image/jpeg"])
                r.update(case="jpeg", round=rnd)
                print(json.dumps(r), flush=True)
                runs.append(r)
            for scale, server in (("1/1", "ceiling"), ("1/2", "ceiling_dct_half")):
                out = subprocess.run([os.path.join(a.build, "bench", "squish-decode-ceiling"),
                                      "--jpeg", jpeg, "--threads", str(cores),
                                      "--duration", str(a.duration), "--scale", scale],
                                     capture_output=True, text=True, check=True)
                c = json.loads(out.stdout)
                r = {"case": "jpeg", "server": server, "round": rnd,
                     "req_s": c["images_per_s"], "threads": c["threads"],
                     "per_core_s": c["images_per_cpu_s"]}
                print(json.dumps(r), flush=True)
                runs.append(r)
        if a.perf_out:
            perf = subprocess.Popen(["perf", "record", "--call-graph", a.perf_call_graph, "-F", "499",
                                     "-o", a.perf_out,
                                     "-p", str(d.proc.pid), "--", "sleep",
                                     str(a.duration + a.warmup)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(0.3)
            model = "m32" if a.perf_shape == "3x32x32" else "m"
            if a.perf_shape == "jpeg":
                args = ["--path", "/v1/models/m/infer", "--body", jpeg,
                        "--content-type", "image/jpeg"]
            else:
                args = ["--tensor", a.perf_shape, "--dtype", "FP32",
                        "--path", "/v2/models/%s/infer" % model]
            r = on(a, "squishd", d.port, d.proc.pid, args)
            r.update(case="tensor %s under perf" % a.perf_shape, round=0)
            print(json.dumps(r), flush=True)
            _, err = perf.communicate()
            if perf.returncode != 0:
                print("# perf failed: %s" % err.strip()[-500:], flush=True)
    finally:
        for srv in servers.values():
            srv.stop()
    print("\nJPEG: %s, %d bytes" % (os.path.basename(jpeg), os.path.getsize(jpeg)))
    if a.rounds < 1:
        return

    def rates(case, server, key="req_s"):
        return [r[key] for r in runs if r["case"] == case and r["server"] == server]

    def cost_ratios(case, server, ref):
        """server's requests per CPU second over ref's, round by round: what
        the rate ratio would be with the same CPU for both."""
        return ", ".join("%.0f%%" % (100 * x / y) for x, y in
                         zip(rates(case, server, "per_core_s"), rates(case, ref, "per_core_s")))

    gateways = [g for g in ("before", "squishd") if rates("jpeg", g)]
    print("\n| request | server | bare h2o req/s (per round) | server req/s (per round) | "
          "server / bare (per round) | server cores busy | server req per CPU s / bare's | "
          "not 200 | goal >= 50% |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in ("tensor 3x32x32", "tensor 3x224x224"):
        b = rates(case, "bare")
        for g in gateways:
            s = rates(case, g)
            ratios = [x / y for x, y in zip(s, b)]
            print("| FP32 %s | %s | %s | %s | %s | %s | %s | %d | %s |" % (
                case.split()[1], g, ", ".join("%.0f" % x for x in b),
                ", ".join("%.0f" % x for x in s),
                ", ".join("%.0f%%" % (100 * x) for x in ratios),
                ", ".join("%.2f" % r["server_cores"] for r in runs
                          if r["case"] == case and r["server"] == g),
                cost_ratios(case, g, "bare"),
                sum(r["not_200"] for r in runs if r["case"] == case and r["server"] in ("bare", g)),
                "met" if min(ratios) >= 0.5 else "not met"))
    c = rates("jpeg", "ceiling")
    h = rates("jpeg", "ceiling_dct_half")
    print("\n| JPEG 512x600 | server | decode ceiling images/s, %d threads, full (per round) | "
          "the same at DCT scale 1/2, as squishd decodes | server images/s (per round) | "
          "server / full ceiling | server / 1/2 ceiling | server cores busy | "
          "server images per CPU s / full ceiling's | not 200 | goal >= 90%% |" % cores)
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for g in gateways:
        s = rates("jpeg", g)
        ratios = [x / y for x, y in zip(s, c)]
        print("| /v1/models/m/infer | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |" % (
            g, ", ".join("%.0f" % x for x in c), ", ".join("%.0f" % x for x in h),
            ", ".join("%.0f" % x for x in s),
            ", ".join("%.0f%%" % (100 * x) for x in ratios),
            ", ".join("%.0f%%" % (100 * x / y) for x, y in zip(s, h)),
            ", ".join("%.2f" % r["server_cores"] for r in runs
                      if r["case"] == "jpeg" and r["server"] == g),
            cost_ratios("jpeg", g, "ceiling"),
            sum(r["not_200"] for r in runs if r["case"] == "jpeg" and r["server"] == g),
            "met" if min(ratios) >= 0.9 else "not met"))

if __name__ == "__main__":
    main()
