"""Precision: a model's config asks for the arithmetic its plans run in
("precision": fp32, tf32, fp16, bf16). The cpu worker runs fp32 for fp16
and tf32, and the model's status says so per device kind, with the
deviation from FP32 its measurement found (0: it is FP32); bf16 on a CPU
without AVX512_BF16 or AMX it refuses, saying why. The setting is
stored with the model: it survives a restart and reaches the worker in
its load again. A value squishd does not take is a 400 naming the field."""

import hashlib
import json
import os

import tiny_models as tm
from harness import Squishd, eventually, run, test
from test_models import auth, upload

PHOTO = open("/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg", "rb").read()


def record(s, name):
    r = s.get("/models/" + name, headers=auth(s), schema_name="model")
    assert r.status == 200, r
    return r.json["versions"][0]


def ready(s, name):
    return record(s, name)["status"] == "ready"


CPU_FP32 = [{"device_kind": "cpu", "runs": "fp32", "max_abs_deviation": 0.0,
             "max_rel_deviation": 0.0}]


def check_measured(s):
    """fp16 asked, fp32 run on cpu, no deviation; the default is fp32."""
    h = record(s, "half")
    assert h["precision"] == {"asked": "fp16", "devices": CPU_FP32}, h["precision"]
    d = record(s, "plain")
    assert d["precision"] == {"asked": "fp32", "devices": CPU_FP32}, d["precision"]
    # Triton's config route says what was asked.
    r = s.get("/v2/models/half/config", schema_name="model_config")
    assert r.status == 200 and r.json["precision"] == "fp16", r
    r = s.get("/v2/models/plain/config", schema_name="model_config")
    assert r.status == 200 and r.json["precision"] == "fp32", r


def worker_loads(log):
    """{precision asked: precision run} of the worker's "model loaded" lines."""
    out = []
    for line in log.splitlines():
        if "model loaded key=" in line and " precision=" in line:
            asked = line.split(" precision=")[1].split()[0]
            runs = line.split(" runs=")[1].split()[0]
            out.append((asked, runs))
    return out


@test
def fp16_asked_runs_fp32_on_the_cpu_worker_says_so_and_survives_a_restart():
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=20)
        r = upload(s, tm.tiny(1), {"name": "half", "precision": "fp16"})
        assert r.status == 202, r
        # Not measured yet: asked, no device.
        assert r.json["precision"] == {"asked": "fp16", "devices": []}, r.json
        r = upload(s, tm.tiny(2), {"name": "plain"})
        assert r.status == 202, r
        assert r.json["precision"] == {"asked": "fp32", "devices": []}, r.json
        eventually(lambda: ready(s, "half") and ready(s, "plain"), 90, "both measured")
        check_measured(s)
        # The worker was asked for fp16 and runs fp32.
        loads = worker_loads(s.read_log())
        assert ("fp16", "fp32") in loads and ("fp32", "fp32") in loads, loads
        r = s.request("POST", "/v1/models/half/infer", body=PHOTO,
                      headers={"X-SLO-Ms": "5000", "Content-Type": "image/jpeg"})
        assert r.status == 200, r
        assert s.stop() == 0

        # A restart on the same database: the setting and what was measured
        # come back, and the loads carry the precision again.
        log_at = os.path.getsize(s.log_path)
        s2 = Squishd(workers="cpu:1", tmp=s.tmp)
        try:
            s2.wait_ready(workers=1, timeout=20)
            check_measured(s2)
            r = s2.request("POST", "/v1/models/half/infer", body=PHOTO,
                           headers={"X-SLO-Ms": "5000", "Content-Type": "image/jpeg"})
            assert r.status == 200, r

            def reloaded():
                with open(s2.log_path, "rb") as f:
                    f.seek(log_at)
                    return ("fp16", "fp32") in worker_loads(f.read().decode(errors="replace"))

            eventually(reloaded, 30, "the worker's load of half after the restart asks fp16")
            assert s2.stop() == 0
        finally:
            s2.cleanup()
    finally:
        s.cleanup()


@test
def a_plan_below_fp32_is_measured_against_an_fp32_plan():
    """The measurement a cuda worker makes of fp16's deviation, on cpu: the
    worker is made to take the plan as running the precision asked
    (SQUISH_WORKER_FAULT=precision:SHA, worker/wk_fault.h), so its loader
    makes an FP32 plan of batch 1 and the profile compares the two. Both
    run FP32 here: the deviation is a number, and tiny."""
    model = tm.tiny(3)
    sha = hashlib.sha256(model).hexdigest()
    s = Squishd(workers="cpu:1", env={"SQUISH_WORKER_FAULT": "precision:" + sha[:16]})
    try:
        s.wait_ready(workers=1, timeout=20)
        assert upload(s, model, {"name": "low", "precision": "bf16"}).status == 202
        assert upload(s, tm.tiny(4), {"name": "other", "precision": "fp16"}).status == 202
        eventually(lambda: ready(s, "low") and ready(s, "other"), 90, "both measured")
        p = record(s, "low")["precision"]
        assert p["asked"] == "bf16" and len(p["devices"]) == 1, p
        d = p["devices"][0]
        assert d["device_kind"] == "cpu" and d["runs"] == "bf16", d
        assert isinstance(d["max_abs_deviation"], float), d
        assert isinstance(d["max_rel_deviation"], float), d
        assert 0 <= d["max_rel_deviation"] < 1e-4, d
        assert 0 <= d["max_abs_deviation"] < 1e-3, d
        log = s.read_log()
        assert "precision deviation key=" in log and "precision=bf16" in log, log[-3000:]
        # Any other model's plan runs what the cpu backend runs.
        assert record(s, "other")["precision"]["devices"] == CPU_FP32
    finally:
        s.stop()
        s.cleanup()


def cpu_has_bf16():
    """What oneDNN's bf16 kernels need: AVX512_BF16 or AMX (Linux's flags)."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return "avx512_bf16" in flags or "amx_bf16" in flags
    return False


@test
def bf16_on_a_cpu_without_it_is_refused_saying_why():
    """A cpu worker on a CPU without AVX512_BF16 or AMX refuses a bf16 load
    with the reason and what to send instead; the model fails with it (no
    other device kind here), and an fp32 upload of the same file serves.
    On a CPU with them it is served (fp32 still, and says so)."""
    model = tm.tiny(5)
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=20)
        assert upload(s, model, {"name": "brain", "precision": "bf16"}).status == 202
        assert upload(s, model, {"name": "plain32"}).status == 202
        if cpu_has_bf16():
            eventually(lambda: ready(s, "brain"), 90, "bf16 served where the CPU has it")
            assert record(s, "brain")["precision"]["devices"] == CPU_FP32
            return
        eventually(lambda: record(s, "brain")["status"] == "failed", 90, "bf16 refused")
        err = record(s, "brain").get("error", "")
        assert "bf16" in err and "AVX512_BF16 or AMX" in err and '"fp32"' in err, err
        log = s.read_log()
        assert "needs a CPU with AVX512_BF16 or AMX" in log, log[-3000:]
        eventually(lambda: ready(s, "plain32"), 90, "the fp32 upload of the same file")
        r = s.request("POST", "/v1/models/plain32/infer", body=PHOTO,
                      headers={"X-SLO-Ms": "5000", "Content-Type": "image/jpeg"})
        assert r.status == 200, r
    finally:
        s.stop()
        s.cleanup()


@test
def a_precision_squishd_does_not_take_is_400_naming_the_field():
    s = Squishd(workers="none")
    try:
        for bad in ("fp8", "FP16", "int8", "", 16, None, ["fp16"]):
            r = upload(s, tm.tiny(), {"name": "x", "precision": bad})
            assert r.status == 400, (bad, r)
            assert r.json["code"] == "bad_config", (bad, r.json)
            assert r.json["error"] == ('config.precision: expected "fp32" (the default), "tf32", '
                                       '"fp16" or "bf16"'), (bad, r.json)
            r = s.request("POST", "/models",
                          body=json.dumps({"name": "e", "precision": bad,
                                           "profile": {"alpha_ms": 1, "beta_ms": 2}}),
                          headers=dict(auth(s), **{"Content-Type": "application/json"}))
            assert r.status == 400 and r.json["code"] == "bad_config", (bad, r)
            assert "config.precision" in r.json["error"], r.json
        r = s.get("/models", headers=auth(s), schema_name="models_list")
        assert r.status == 200 and r.json["models"] == [], r.json
        # Every value is taken; an emulated model runs fp32 on its emu device.
        for i, p in enumerate(("fp32", "tf32", "fp16", "bf16")):
            r = s.request("POST", "/models",
                          body=json.dumps({"name": "e%d" % i, "precision": p,
                                           "profile": {"alpha_ms": 1, "beta_ms": 2}}),
                          headers=dict(auth(s), **{"Content-Type": "application/json"}),
                          schema_name="model_record")
            assert r.status == 201, (p, r)
            assert r.json["precision"] == {"asked": p, "devices": [
                {"device_kind": "emu", "runs": "fp32", "max_abs_deviation": 0.0,
                 "max_rel_deviation": 0.0}]}, r.json
    finally:
        s.stop()
        s.cleanup()


if __name__ == "__main__":
    run()
