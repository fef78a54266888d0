#!/usr/bin/python3
"""squish-sim end to end: the workloads in bench/workloads validate against
schemas/workload.schema.json, every summary (plain, --dump, --search-goodput,
both policies) against schemas/simulation.schema.json, the output is the same
for the same seed, and bad input fails with the right status.
Prints TAP. Usage: test_sim_schema.py SQUISH_SIM SOURCE_DIR"""
import json
import os
import re
import subprocess
import sys
import tempfile

import jsonschema

squish_sim, source_dir = sys.argv[1], sys.argv[2]
workloads = os.path.join(source_dir, "bench", "workloads")
schemas = os.path.join(source_dir, "schemas")
results = []


def check(name, fn):
    try:
        fn()
        results.append((True, name, ""))
    except Exception as e:  # any failure is a "not ok" with its reason
        results.append((False, name, repr(e)))


def load_schema(name):
    with open(os.path.join(schemas, name)) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


sim_schema = load_schema("simulation.schema.json")
workload_schema = load_schema("workload.schema.json")


def sim(*args, status=0):
    p = subprocess.run([squish_sim, *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == status, f"exit {p.returncode}: {p.stderr}"
    return p


def workloads_validate():
    names = sorted(n for n in os.listdir(workloads) if n.endswith(".json"))
    assert names, "no workloads"
    for n in names:
        with open(os.path.join(workloads, n)) as f:
            workload_schema.validate(json.load(f))


def example_dump():
    path = os.path.join(workloads, "symphony_section33_example.json")
    out = sim(path, "--dump").stdout
    s = json.loads(out)
    sim_schema.validate(s)
    assert s["dropped"] == 0 and s["late"] == 0, s
    assert {b["size"] for b in s["batches"]} == {4}, s["batch_sizes"]
    assert len(s["requests"]) == s["request_count"]
    again = json.loads(sim(path, "--dump").stdout)
    for k in ("cpu_s", "cpu_us_per_request"):  # measured, not simulated
        assert k in s and k in again
        del s[k], again[k]
    assert s == again, "same seed, different output"


def table2_both_policies_and_search():
    path = os.path.join(workloads, "symphony_table2_resnet50.json")
    for policy in ("deferred", "early-drop"):
        s = json.loads(sim(path, "--policy", policy, "--scale", "0.5").stdout)
        sim_schema.validate(s)
        assert s["policy"] == policy and s["bad_rate"] < 0.01, s
    small = {"devices": {"count": 2},
             "models": [{"name": "m", "profile": {"alpha_ms": 1, "beta_ms": 5}}],
             "sessions": [{"model": "m", "slo_ms": 25,
                           "arrivals": {"process": "poisson",
                                        "segments": [{"duration_s": 2, "rate_rps": 800}]}}]}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(small, f)
        f.flush()
        s = json.loads(sim(f.name, "--search-goodput").stdout)
        sim_schema.validate(s)
        assert s["search"]["ok_fraction"] >= 0.99 and s["goodput_rps"] == s["offered_rps"], s


def pipelines_validate():
    path = os.path.join(workloads, "nexus_fig17_g1_slo400.json")
    budgets = {}
    for split in ("dp", "even"):
        s = json.loads(sim(path, "--split", split, "--dump").stdout)
        sim_schema.validate(s)
        p = s["pipelines"][0]
        assert p["split"] == split and p["queries"] > 0, p
        assert abs(p["gamma_measured"]["classify"] - 1) < 0.05, p
        assert {r.get("stage") for r in s["requests"]} == {"detect", "classify"}, "items"
        budgets[split] = p["budgets_ms"]
    assert budgets["even"] == {"detect": 200, "classify": 200}, budgets
    assert budgets["dp"] != budgets["even"], budgets
    s = json.loads(sim(path, "--search-goodput").stdout)
    sim_schema.validate(s)
    assert s["search"]["ok_fraction"] >= 0.99, s["search"]
    assert s["pipelines"][0]["goodput_qps"] == s["pipelines"][0]["offered_qps"], s["pipelines"]
    sim(path, "--split", "uneven", status=2)


def duration_wins_over_the_workloads():
    # A bundled workload with one 30 s segment, and the ramp of seven
    # segments (56 s): --duration sets how long arrivals last.
    path = os.path.join(workloads, "symphony_table2_resnet50.json")
    full = json.loads(sim(path, "--scale", "0.2").stdout)
    assert full["horizon_s"] > 29, full["horizon_s"]
    short = json.loads(sim(path, "--scale", "0.2", "--duration", "2").stdout)
    sim_schema.validate(short)
    assert short["horizon_s"] <= 2, short["horizon_s"]
    # The same rate for 2 s of the 30: about a fifteenth of the requests.
    ratio = short["request_count"] / full["request_count"]
    assert 0.05 < ratio < 0.085, (short["request_count"], full["request_count"])
    assert abs(short["offered_rps"] - full["offered_rps"]) < 0.1 * full["offered_rps"], \
        (short["offered_rps"], full["offered_rps"])
    ramp = os.path.join(workloads, "ramp_3models_6devices.json")
    longer = json.loads(sim(ramp, "--duration", "70", "--epoch-s", "5").stdout)
    sim_schema.validate(longer)
    assert 69 < longer["horizon_s"] <= 70, longer["horizon_s"]
    # The ramp's steps are stretched with it: seven, the last ending at 70 s.
    assert len(longer["steps"]) == 7 and longer["steps"][-1]["end_s"] == 70, longer["steps"]
    # A trace is cut at --duration.
    trace = {"devices": {"count": 1},
             "models": [{"name": "m", "profile": {"alpha_ms": 1, "beta_ms": 1}}],
             "sessions": [{"model": "m", "slo_ms": 50,
                           "arrivals": {"times_ms": [0, 500, 1000, 1500, 2500, 4000]}}]}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(trace, f)
        f.flush()
        assert json.loads(sim(f.name).stdout)["request_count"] == 6
        assert json.loads(sim(f.name, "--duration", "1.5").stdout)["request_count"] == 3


def version():
    out = sim("--version").stdout
    assert re.fullmatch(r"squish-sim \d+\.\d+\.\d+\n", out), out


def bad_input():
    sim(status=2)
    path = os.path.join(workloads, "symphony_section33_example.json")
    sim(path, "--policy", "lazy", status=2)
    sim(path, "--scale", "0", status=2)
    sim(path, "--duration", "0", status=2)
    # re-planning on a workload that sizes its devices by the plan: said so
    p = sim(os.path.join(workloads, "symphony_1080ti_zipf.json"), "--epoch-s", "1", status=2)
    assert "devices.count" in p.stderr and "--epoch-s" in p.stderr, p.stderr
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        f.write('{"devices": {"count": 1}, "models": [], "sessions": [{"model": "x", "slo_ms": 5}]}')
        f.flush()
        p = sim(f.name, status=1)
        assert "sessions[0]" in p.stderr, p.stderr


check("bench workloads validate against workload.schema.json", workloads_validate)
check("Symphony example: schema, --dump, batches of 4, deterministic", example_dump)
check("table-2 workload under both policies and a goodput search validate", table2_both_policies_and_search)
check("pipelines: both splits, --dump and a goodput search validate", pipelines_validate)
check("--duration wins over a bundled workload's segments and a trace", duration_wins_over_the_workloads)
check("--version prints one line and exits 0", version)
check("bad arguments exit 2 (--epoch-s without devices.count says so), a bad workload exits 1 naming the JSON path", bad_input)

print(f"1..{len(results)}")
for i, (ok, name, why) in enumerate(results, 1):
    print(f"{'ok' if ok else 'not ok'} {i} - {name}")
    if not ok:
        print("# " + why.replace("\n", "\n# "))
sys.exit(0 if all(r[0] for r in results) else 1)
