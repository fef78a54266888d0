#!/usr/bin/python3
"""Live benchmarks: real squishd with emulated workers over loopback HTTP,
driven by squish-loadgen, next to the simulator on the same workload; and
the gateway-overhead benchmark (squishd against a bare h2o server, same
loadgen, same run). Prints the markdown sections "Live goodput" and
"Gateway overhead" of bench/RESULTS.md on stdout (bench/run splices them in);
raw JSON of every run on stderr with --verbose.

    bench/live/run_live.py BUILD_DIR [--devices N] [--duration S] [--rounds N]
        [--only goodput|overhead] [--verbose]

BUILD_DIR holds gateway/squishd, worker/squish-worker, bench/squish-loadgen,
bench/squish-bare-h2o and bench/squish-sim (ninja -C BUILD_DIR
gateway/squishd worker/squish-worker bench/squish-loadgen
bench/squish-bare-h2o bench/squish-sim). Debian's /usr/bin/python3, stdlib only.
"""
import argparse
import datetime
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import cpu_model  # noqa: E402

# Symphony table 2, ResNet50 row: l(b) = 1.053 b + 5.072 ms, SLO 25 ms.
ALPHA_MS, BETA_MS, SLO_MS = 1.053, 5.072, 25.0
# squishd and squish-worker from another build dir (--server-build), e.g. a
# clean checkout of a commit while the working tree is mid-edit.
SERVER_BUILD = None
# Near-zero model of the overhead benchmark: the device is never the limit.
TINY_ALPHA_MS, TINY_BETA_MS = 0.001, 0.01
# 61,306 bytes, 512x600 baseline JPEG that Debian ships (python3-matplotlib).
PHOTO = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
# The goodput workload's requests: binary OIP tensors (Triton's extension),
# FP32 [1, 3, 32, 32] = 12 KiB, no JPEG decode, so that the HTTP side of two
# shared cores is not what limits squishd.
GOODPUT_INPUT = [3, 32, 32]
# The overhead benchmark's tensor request: UINT8 [1, 3, 141, 141] = 59,643
# bytes, about the photo's size, for a model of that input.
OVERHEAD_TENSOR = [3, 141, 141]
# Live goodput: offered load as fractions of the simulator's 99% goodput.
LADDER = [0.6, 0.8, 0.9, 1.0, 1.1]


def log(verbose, *a):
    if verbose:
        print(*a, file=sys.stderr, flush=True)


class Proc:
    """A server process on an ephemeral port, in its own temporary directory."""

    def __init__(self, argv, tmp, port_file):
        self.tmp = tmp
        self.log_path = os.path.join(tmp, "server.log")
        self.logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self.logf, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        self.port = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited: %s" % (argv[0], self.read_log()[-2000:]))
            if os.path.exists(port_file):
                txt = open(port_file).read().strip()
                if txt:
                    self.port = int(txt)
                    break
            time.sleep(0.02)
        if self.port is None:
            raise RuntimeError("%s did not write its port file" % argv[0])

    def read_log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()


def request(port, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


class Squishd(Proc):
    def __init__(self, build, workers, policy, extra=()):
        tmp = tempfile.mkdtemp(prefix="squish-live-")
        build = SERVER_BUILD or build
        port_file = os.path.join(tmp, "port")
        self.argv = [os.path.join(build, "gateway", "squishd"), "--listen", "127.0.0.1:0",
                     "--port-file", port_file, "--db", os.path.join(tmp, "squish.db"),
                     "--workers", workers, "--policy", policy, "--log-level", "warn"] + list(extra)
        super().__init__(self.argv, tmp, port_file)
        self.nworkers = sum(int(w.split(":")[1]) for w in workers.split(","))
        deadline = time.time() + 30
        while time.time() < deadline:
            status, body = request(self.port, "GET", "/v2/health/ready")
            if status == 200 and json.loads(body).get("workers", 0) >= self.nworkers:
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("squishd not ready with %d workers" % self.nworkers)

    def add_model(self, cfg):
        token = open(os.path.join(self.tmp, "admin.token")).read().strip()
        status, body = request(self.port, "POST", "/models", json.dumps(cfg),
                               {"Authorization": "Bearer " + token,
                                "Content-Type": "application/json"})
        if status != 201:
            raise RuntimeError("POST /models: %d %s" % (status, body[:300]))

    def stop(self):
        super().stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


class Bare(Proc):
    def __init__(self, build, threads):
        tmp = tempfile.mkdtemp(prefix="squish-bare-")
        port_file = os.path.join(tmp, "port")
        self.argv = [os.path.join(build, "bench", "squish-bare-h2o"), "--listen", "127.0.0.1:0",
                     "--port-file", port_file, "--threads", str(threads)]
        super().__init__(self.argv, tmp, port_file)

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.logf.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def loadgen(build, port, args, verbose):
    cmd = [os.path.join(build, "bench", "squish-loadgen"), "--port", str(port)] + args
    log(verbose, "+", " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    if p.stderr.strip():
        log(verbose, p.stderr.strip()[-1500:])
    out = json.loads(p.stdout)
    log(verbose, json.dumps(out.get("best", out)))
    return out


def shown(build, tool, args):
    """The command as a reader would type it (PORT for the ephemeral port)."""
    return "./" + " ".join([os.path.normpath(os.path.join(build, "bench", tool))] + args)


# ---- live goodput ---------------------------------------------------------

def model_cfg(name, alpha, beta, shape, slo=SLO_MS):
    return {"name": name, "profile": {"alpha_ms": alpha, "beta_ms": beta}, "max_batch": 64,
            "default_slo_ms": slo, "input": {"shape": shape}, "num_classes": 10}


def sim_workload(path, devices, k, rate, duration_s):
    """The live run's workload for squish-sim: profile and SLO times k."""
    w = {"devices": {"count": devices},
         "models": [{"name": "ResNet50", "max_batch": 64,
                     "profile": {"alpha_ms": round(ALPHA_MS * k, 6), "beta_ms": round(BETA_MS * k, 6)}}],
         "sessions": [{"model": "ResNet50", "slo_ms": SLO_MS * k,
                       "arrivals": {"process": "poisson",
                                    "segments": [{"duration_s": duration_s, "rate_rps": rate}]}}],
         "seed": 1}
    with open(path, "w") as f:
        json.dump(w, f, indent=1)
        f.write("\n")


def sim(build, args):
    cmd = [os.path.join(build, "bench", "squish-sim")] + args
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(p.stdout), "./" + " ".join([os.path.normpath(cmd[0])] + args)


def staggered_bound(n, k=1.0):
    """Symphony's staggered bound for n devices (profile and SLO times k)."""
    b = int((SLO_MS / (1 + 1 / n) - BETA_MS) // ALPHA_MS)
    return n * b / (ALPHA_MS * b + BETA_MS) * 1000 / k, b


def rel(path):
    """A path as a command line shows it: ./build/x, or /abs/x."""
    path = os.path.normpath(path)
    return path if os.path.isabs(path) else "./" + path


def squishd_cmd(a, n, policy):
    return "%s --listen 127.0.0.1:0 --workers emu:%d --policy %s %s" % (
        rel(os.path.join(SERVER_BUILD or a.build, "gateway", "squishd")), n, policy,
        " ".join(a.squishd_args))


def live_goodput(a, out):
    w = out.append
    w("## Live goodput")
    w("")
    w("Real `squishd` with N emulated workers (`--workers emu:N`; an emu worker holds a "
      "batch of b for exactly l(b)) serving Symphony's table-2 ResNet50 (`l(b) = %.3f b + %.3f` "
      "ms, SLO %g ms) over loopback HTTP/1.1 keep-alive, driven by `squish-loadgen` (open-loop "
      "Poisson; the SLO clock runs from each request's first byte written to its answer's last "
      "byte read, so HTTP both ways counts). Requests are binary OIP tensors (`POST "
      "/v2/models/resnet50/infer`, Triton's binary extension, FP32 [1, 3, 32, 32] = 12 KiB, SLO "
      "in `parameters.slo_ms`): no JPEG decode, so that squishd's batching and dispatch, not "
      "two shared cores' HTTP capacity, are what is measured." % (ALPHA_MS, BETA_MS, SLO_MS))
    w("")
    w("**Scale.** 8 devices at the paper's profile need ~5500 req/s through the HTTP "
      "stack of squishd and the loadgen on the same 2 shared cores, and millisecond "
      "wake-up delays on a box at load average ~15 eat a 25 ms SLO; so two reductions, "
      "each said in its row: (a) **fewer devices**, the paper's profile and SLO on N = %s "
      "emulated devices; (b) **a slower profile**, the paper's 8 devices with the profile and "
      "the SLO both x%g (`l(b) = %.3f b + %.3f` ms, SLO %g ms): the same batch sizes and "
      "schedule as table 2 in dilated time, at 1/%g of the rate. squishd runs with `%s`: "
      "its default dispatch margin is 1 ms, and on this loaded box the answer's way back from "
      "the dispatch thread through the HTTP loop takes longer than that at the tail, so that a "
      "deferred batch, sent as late as it can be, answers past the SLO; and its live planner "
      "places a new model on one device (rate 0) and re-plans on a rate change no sooner than "
      "`--epoch-min-interval-ms` (10 s by default) after the last epoch, so 1 s here, and "
      "every trial starts with a warm-up at its own rate (not counted) for the plan to follow "
      "the load." % (
          ", ".join(str(c[0]) for c in a.configs if c[1] == 1) or "-",
          max(c[1] for c in a.configs), ALPHA_MS * max(c[1] for c in a.configs),
          BETA_MS * max(c[1] for c in a.configs), SLO_MS * max(c[1] for c in a.configs),
          max(c[1] for c in a.configs), " ".join(a.squishd_args)))
    w("")
    w("The simulator runs exactly the same workload (workload files in bench/live/, written "
      "by this script: same devices, profile, SLO, Poisson arrivals, %g s) and finds its 99%% "
      "goodput (`--search-goodput`: the highest rate with >= 99%% of requests within SLO); "
      "live squishd then gets that rate and fractions of it. Goal: live >= 90%% of the "
      "simulator." % a.duration)
    w("")
    w("| devices, profile | policy | sim 99%% goodput req/s | live %% good at %s x the sim's goodput (sim %% good at the same rate) | live 99%% goodput: highest of those rates with >= 99%% good | live / sim | live at 1.0x: dropped / late / errors of requests, p50 / p99 ms, loadgen send lag p99 ms |" % " / ".join("%g" % k for k in LADDER))
    w("|---|---|---|---|---|---|---|")
    cmds = []
    for n, k in a.configs:
        bound, b = staggered_bound(n, k)
        wl = os.path.join("bench", "live", "resnet50_%ddev_x%g.json" % (n, k))
        wl_rate = round(bound)
        sim_workload(wl, n, k, wl_rate, a.duration)
        alpha, beta, slo = ALPHA_MS * k, BETA_MS * k, SLO_MS * k
        cfg = model_cfg("resnet50", round(alpha, 6), round(beta, 6), GOODPUT_INPUT, slo=slo)
        label = "%d, %s" % (n, "paper" if k == 1 else "x%g" % k)
        for policy in ("deferred", "early-drop"):
            s, scmd = sim(a.build, [wl, "--policy", policy, "--search-goodput"])
            sim_good = s["goodput_rps"]
            rates = [round(sim_good * x) for x in LADDER]
            sim_at = [sim(a.build, [wl, "--policy", policy, "--scale", "%.4f" % (r / wl_rate)])[0]
                      for r in rates]
            runs = [[] for _ in rates]  # per rate, one summary per round
            for rnd in range(a.rounds):
                d = Squishd(a.build, "emu:%d" % n, policy, a.squishd_args)
                try:
                    d.add_model(cfg)
                    # Ascending, so that the live planner only ever scales up.
                    for i, r in enumerate(rates):
                        args = ["--path", "/v2/models/resnet50/infer", "--tensor",
                                "x".join(map(str, GOODPUT_INPUT)), "--slo-ms", "%g" % slo,
                                "--duration", "%g" % a.duration, "--warmup", "%g" % a.warmup,
                                "--seed", str(rnd + 1), "--rate", str(r)]
                        runs[i].append(loadgen(a.build, d.port, args, a.verbose))
                finally:
                    d.stop()
            good = [max(1 - x["bad_rate"] for x in rr) for rr in runs]
            passing = [r for r, g in zip(rates, good) if g >= 0.99]
            live = max(passing) if passing else 0
            at1 = max(runs[LADDER.index(1.0)], key=lambda x: 1 - x["bad_rate"])
            nreq = max(at1["requests"], 1)
            w("| %s | %s | %.0f | %s | %s | **%s** | %.1f%% / %.1f%% / %.1f%%, %.1f / %.1f, %.1f |" % (
                label, policy, sim_good,
                " / ".join("%.1f (%.1f)" % (100 * g, 100 * (1 - sa["bad_rate"])) for g, sa in zip(good, sim_at)),
                "%d" % live if live else "< %d" % rates[0],
                ("%.0f%%" % (100 * live / sim_good)) if live else "< %.0f%%" % (100 * LADDER[0]),
                100 * at1["dropped"] / nreq, 100 * at1["late"] / nreq,
                100 * (at1["errors"] + at1["timeouts"] + at1["conn_errors"] + at1["unsent"]) / nreq,
                at1["latency_ms"]["p50"], at1["latency_ms"]["p99"], at1["send_lag_ms"]["p99"]))
            cmds.append((label, policy, scmd, squishd_cmd(a, n, policy), json.dumps(cfg),
                         shown(a.build, "squish-loadgen", ["--port", "PORT", "--path",
                               "/v2/models/resnet50/infer", "--tensor", "x".join(map(str, GOODPUT_INPUT)),
                               "--slo-ms", "%g" % slo, "--duration", "%g" % a.duration,
                               "--warmup", "%g" % a.warmup, "--seed", "1", "--rate", "R"]),
                         ", ".join(str(r) for r in rates), wl_rate))
    w("")
    w("Each live cell is the best of %d round(s) (a fresh squishd per round, the rates in "
      "ascending order, %g s measured after %g s of warm-up at the same rate); the simulator's "
      "cell in parentheses is the same workload at the same rate (`--scale rate / workload "
      "rate`). Live goodput is read off this ladder rather than bisected: with the live "
      "planner (below) the fraction of good requests is not monotone in the load, and a "
      "bisection that steps down lands on a worse plan. 1.0x passing means live >= the "
      "simulator's goodput within the ladder's resolution." % (a.rounds, a.duration, a.warmup))
    w("")
    w("Commands (`bench/live/run_live.py %s --only goodput` runs them all; PORT is squishd's "
      "ephemeral port, R each rate of the ladder):" % a.build)
    w("")
    for label, policy, scmd, dcmd, cfg, lcmd, rates, wl_rate in cmds:
        w("- %s, %s: simulator `%s` (and `--scale R/%d` per rate); squishd `%s` + `POST /models` "
          "`%s`; live, R in %s: `%s`" % (label, policy, scmd, wl_rate, dcmd, cfg, rates, lcmd))
    w("")


# ---- gateway overhead -----------------------------------------------------

# Open-loop offered rates of the overhead runs, ascending; a server's rate
# is the highest one it answers with >= 99% of requests 200 within
# OVERHEAD_SLO_MS. Open loop because squishd batches: a closed loop would
# measure connections / batching delay, not capacity.
OVERHEAD_LADDER = [250, 500, 1000, 2000, 3000, 4000, 6000, 8000, 12000, 16000, 24000, 32000]
OVERHEAD_SLO_MS = 100
# Capacity, not SLO keeping: an answer counts if it is a 200 within this.
OVERHEAD_LATE_MS = 1000
# Deferred: the live planner's duty cycles pace early-drop at about one
# batch per SLO for a model this fast (answers land late); see RESULTS.md.
OVERHEAD_SQUISHD_ARGS = ["--policy=deferred", "--dispatch-margin-us=3000",
                         "--epoch-min-interval-ms=1000"]


def ladder_max(a, port, common):
    """Climbs the ladder until a rate fails; (highest passing rate, its
    summary, the first failing summary or None)."""
    best, best_s = 0, None
    for r in OVERHEAD_LADDER:
        res = loadgen(a.build, port, common + ["--rate", str(r)], a.verbose)
        if 1 - res["bad_rate"] < 0.99:
            return best, best_s, res
        best, best_s = r, res
    return best, best_s, None


def overhead(a, out):
    w = out.append
    threads = a.http_threads
    w("## Gateway overhead")
    w("")
    w("Highest request rate, open loop: `squish-loadgen` offers Poisson load at %s req/s in "
      "turn with an SLO of %d ms (%g s measured after %g s of warm-up at each rate, which also "
      "lets squishd's live planner plan for the load), and a server's rate is the highest of "
      "those at which it answers >= 99%% of requests with a 200 within %d ms (capacity, not "
      "SLO keeping: squishd's deferred policy answers near the SLO by design). Servers: `squishd` serving an emulated model of "
      "near-zero latency (`l(b) = %g b + %g` ms, 1 emu worker, `%s`; deferred holds a request "
      "until about its deadline minus the margins, by design, so latencies sit near the SLO) and "
      "`squish-bare-h2o` (bench/live/bare_h2o.c: the same libh2o-evloop setup as "
      "gateway/http.c, h2o reads the whole body, answers 200 with a 400-byte JSON), both with "
      "%d HTTP thread(s), same loadgen, same run, %d round(s). squishd decodes and resizes the "
      "JPEG to 224x224 (its preprocess pool, %d threads), batches, and round-trips each batch "
      "through the worker over its socket and shared memory: all of that is its overhead. The "
      "tensor case sends a UINT8 [1, 3, 141, 141] binary OIP tensor (59,643 bytes, Triton's "
      "binary extension) to a model of that input: no decode. All processes (loadgen "
      "included) share the 2 cores."
      % (", ".join(str(r) for r in OVERHEAD_LADDER), OVERHEAD_SLO_MS, a.overhead_duration,
         a.overhead_warmup,
         OVERHEAD_LATE_MS,
         TINY_ALPHA_MS, TINY_BETA_MS, " ".join(OVERHEAD_SQUISHD_ARGS), threads, a.rounds,
         a.prep_threads))
    w("")
    w("| request | body bytes | squishd req/s (per round) | bare h2o req/s (per round) | squishd / bare (best rounds) | squishd p50 / p99 ms at its rate | squishd at the next rate: 200 within 1 s / dropped / later / errors | loadgen CPU at bare's rate | goal >= 50% |")
    w("|---|---|---|---|---|---|---|---|---|")
    photo_len = os.path.getsize(PHOTO)
    tensor_len = 3 * 141 * 141
    cases = [
        ("JPEG 512x600 `POST /v1/models/tiny/infer`", "%d" % photo_len,
         ["--path", "/v1/models/tiny/infer", "--body", PHOTO, "--content-type", "image/jpeg"]),
        ("OIP binary tensor `POST /v2/models/tiny_t/infer`", "%d + JSON header" % tensor_len,
         ["--path", "/v2/models/tiny_t/infer", "--tensor", "x".join(map(str, OVERHEAD_TENSOR)),
          "--dtype", "UINT8"]),
    ]
    cmds = []
    for label, blen, args in cases:
        common = args + ["--duration", "%g" % a.overhead_duration, "--warmup",
                         "%g" % a.overhead_warmup, "--slo-ms", str(OVERHEAD_SLO_MS), "--late-ms", str(OVERHEAD_LATE_MS),
                         "--connections", "4000"]
        sq, bare = [], []
        for rnd in range(a.rounds):
            d = Squishd(a.build, "emu:1", "deferred",
                        ["--http-threads", str(threads), "--prep-threads", str(a.prep_threads)]
                        + OVERHEAD_SQUISHD_ARGS)
            try:
                d.add_model(model_cfg("tiny", TINY_ALPHA_MS, TINY_BETA_MS, [3, 224, 224],
                                      slo=OVERHEAD_SLO_MS))
                d.add_model(model_cfg("tiny_t", TINY_ALPHA_MS, TINY_BETA_MS, OVERHEAD_TENSOR,
                                      slo=OVERHEAD_SLO_MS))
                sq.append(ladder_max(a, d.port, common))
            finally:
                d.stop()
            b = Bare(a.build, threads)
            try:
                bare.append(ladder_max(a, b.port, common))
            finally:
                b.stop()
        sbest = max(sq, key=lambda x: x[0])
        bbest = max(bare, key=lambda x: x[0])
        capped = bbest[2] is None
        ratio = sbest[0] / bbest[0] if bbest[0] else 0
        lat = sbest[1]["latency_ms"] if sbest[1] else {"p50": 0, "p99": 0}
        nxt = sbest[2]
        nxt_txt = "-" if nxt is None else "%.1f%% / %.1f%% / %.1f%% / %.1f%% at %d" % (
            100 * (1 - nxt["bad_rate"]), 100 * nxt["dropped_rate"], 100 * nxt["late_rate"],
            100 * nxt["error_rate"], nxt["rate_rps"])
        w("| %s | %s | %s | %s | **%s%.0f%%** | %.1f / %.1f | %s | %.2f | %s |" % (
            label, blen, " / ".join(str(x[0]) for x in sq),
            " / ".join(("%d" % x[0]) + ("+" if x[2] is None else "") for x in bare),
            "<= " if capped else "", 100 * ratio, lat["p50"], lat["p99"], nxt_txt,
            bbest[1]["loadgen_cpu_fraction"] if bbest[1] else 0,
            "met" if ratio >= 0.5 else "**not met**"))
        cmds.append((label, shown(a.build, "squish-loadgen", ["--port", "PORT"] + common +
                                  ["--rate", "R"])))
    w("")
    w("A `+` after bare's rate: it passed the whole ladder (its real capacity is higher, and "
      "the ratio is then an upper bound). \"Loadgen CPU\": the loadgen's CPU time over wall "
      "time. Commands (`bench/live/run_live.py %s --only overhead` runs them; PORT is the "
      "server's ephemeral port, R each rate):" % a.build)
    w("")
    w("- squishd: `%s --listen 127.0.0.1:0 --workers emu:1 --http-threads %d "
      "--prep-threads %d %s` + `POST /models` `%s` (and `tiny_t`, "
      "input %s); bare: `%s --listen 127.0.0.1:0 --threads %d`" % (
          rel(os.path.join(SERVER_BUILD or a.build, "gateway", "squishd")), threads,
          a.prep_threads, " ".join(OVERHEAD_SQUISHD_ARGS),
          json.dumps(model_cfg("tiny", TINY_ALPHA_MS, TINY_BETA_MS, [3, 224, 224], slo=OVERHEAD_SLO_MS)),
          OVERHEAD_TENSOR, rel(os.path.join(a.build, "bench", "squish-bare-h2o")), threads))
    for label, c in cmds:
        w("- %s: `%s`" % (label.split(" `")[0], c))
    w("")


def machine():
    model = cpu_model()
    load = os.getloadavg()
    return "%s, %d cores, load average %.1f at the start" % (model, os.cpu_count(), load[0])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--server-build", help="squishd and squish-worker from here")
    p.add_argument("--config", action="append", metavar="N:K",
                   help="live goodput on N devices with the profile and SLO times K "
                        "(repeatable; default 4:1 and 8:4)")
    p.add_argument("--squishd-arg", action="append", dest="squishd_args", metavar="ARG",
                   help="extra squishd argument for the goodput runs (repeatable; default "
                        "--dispatch-margin-us=3000)")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--overhead-duration", type=float, default=2.0)
    p.add_argument("--overhead-warmup", type=float, default=2.0)
    p.add_argument("--http-threads", type=int, default=1)
    p.add_argument("--prep-threads", type=int, default=2)
    p.add_argument("--only", choices=["goodput", "overhead"])
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args()
    global SERVER_BUILD
    SERVER_BUILD = a.server_build
    a.configs = [(int(c.split(":")[0]), float(c.split(":")[1])) for c in (a.config or ["4:1", "8:4"])]
    a.squishd_args = a.squishd_args or ["--dispatch-margin-us=3000", "--epoch-min-interval-ms=1000"]
    out = []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    server = "squishd of this tree (commit %s)" % commit
    if SERVER_BUILD:
        mark = os.path.join(SERVER_BUILD, "..", "COMMIT")
        server = "squishd and squish-worker from `--server-build %s`%s" % (
            SERVER_BUILD, " (a clean checkout of commit %s)" % open(mark).read().strip()
            if os.path.exists(mark) else "")
    stamp = "Measured by `bench/live/run_live.py %s%s` on %s UTC; %s; %s." % (
        a.build, " --server-build " + SERVER_BUILD if SERVER_BUILD else "",
        datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), server, machine())
    if a.only in (None, "goodput"):
        live_goodput(a, out)
        out.insert(out.index("## Live goodput") + 2, stamp)
        out.insert(out.index("## Live goodput") + 3, "")
    if a.only in (None, "overhead"):
        at = len(out)
        overhead(a, out)
        out.insert(at + 2, stamp)
        out.insert(at + 3, "")
    print("\n".join(out))


if __name__ == "__main__":
    main()
