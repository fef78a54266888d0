#!/usr/bin/python3
"""squish-plan end to end: its output validates against schemas/plan.schema.json,
the workloads against schemas/workload.schema.json, the plan is consistent
with the workload, and a bad workload fails with the JSON path named.
Prints TAP. Usage: test_plan_schema.py SQUISH_PLAN SOURCE_DIR"""
import json
import os
import subprocess
import sys
import tempfile

import jsonschema

squish_plan, source_dir = sys.argv[1], sys.argv[2]
here = os.path.join(source_dir, "tests", "planner", "workloads")
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


plan_schema = load_schema("plan.schema.json")
workload_schema = load_schema("workload.schema.json")


def run_plan(path):
    p = subprocess.run([squish_plan, path], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"exit {p.returncode}: {p.stderr}"
    return json.loads(p.stdout)


def plan_checks(name):
    path = os.path.join(here, name)
    with open(path) as f:
        workload = json.load(f)
    workload_schema.validate(workload)
    plan = run_plan(path)
    plan_schema.validate(plan)
    count = workload.get("devices", {}).get("count", 0)
    if count:
        assert len(plan["devices"]) <= count
    for d in plan["devices"]:
        # Behind a link a batch holds the device for latency + transfer.
        busy = sum(s["latency_ms"] + s.get("transfer_ms", 0) for s in d["sessions"])
        assert busy <= d["duty_cycle_ms"] + 1e-6, d
        for s in d["sessions"]:
            total = d["duty_cycle_ms"] + s["latency_ms"] + s.get("transfer_ms", 0)
            assert total <= s["slo_ms"] + 1e-6, s
        mem = workload.get("devices", {}).get("memory_mb", 0)
        if mem:
            assert d["memory_mb"] <= mem + 1e-6, d
    return workload, plan


def nexus_low():
    _, plan = plan_checks("nexus_low.json")
    shared = [d for d in plan["devices"]
              if sorted(s["model"] for s in d["sessions"] if "pipeline" not in s) == ["A", "B"]]
    assert len(shared) == 1 and shared[0]["duty_cycle_ms"] == 125, plan["devices"]


def mixed():
    workload, plan = plan_checks("mixed.json")
    reasons = {u["model"]: u["reason"] for u in plan["unplaced"]}
    assert reasons.get("huge") == "memory", reasons
    pipes = {p["name"]: p for p in plan["pipelines"]}
    b = pipes["traffic"]["budgets_ms"]
    assert b["det"] + max(b["car"], b["face"]) + b["join"] <= 400 + 1e-6, b
    assert "error" in pipes["too_tight"]
    groups = [s for d in plan["devices"] for s in d["sessions"] if s.get("prefix_group") == "ft"]
    assert groups and len(groups[0]["members"]) == 2, groups
    assert plan["advice"]["devices_delta"] == plan["advice"]["devices_needed"] - 20


def hosts():
    # One local device and three behind an 8 ms round trip at 10 Gbit/s:
    # the 20 ms session cannot pay 8 ms + its transfer on top of a 6 ms
    # batch and a cycle, so it gets the local device; the 400 ms one goes
    # behind the link, which the plan shows.
    _, plan = plan_checks("hosts.json")
    by_model = {s["model"]: d for d in plan["devices"] for s in d["sessions"]}
    tight, loose = by_model["tight"], by_model["loose"]
    assert tight["id"] == 0 and "rtt_ms" not in tight, tight
    assert loose["id"] in (1, 2, 3), loose
    assert loose["rtt_ms"] == 8 and loose["bandwidth_mbps"] == 10000, loose
    s = loose["sessions"][0]
    # 8 ms + batch * (150528 + 4000) bytes at 1250 bytes/us
    assert abs(s["transfer_ms"] - (8 + s["batch"] * 154528 / 1250 / 1000)) < 1e-6, s
    assert plan["unplaced"] == [], plan["unplaced"]


def bad_hosts():
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"devices": {"count": 3, "hosts": [{"count": 1}, {"count": 1, "rtt_ms": 1}]},
                   "models": [{"name": "A", "profile": {"alpha_ms": 1, "beta_ms": 1}}],
                   "sessions": [{"model": "A", "slo_ms": 50, "rate_rps": 1}]}, f)
    try:
        p = subprocess.run([squish_plan, f.name], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(f.name)
    assert p.returncode == 1, p.returncode
    assert "devices.hosts" in p.stderr, p.stderr


def bad_workload():
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"models": [{"name": "A", "profile": {"alpha_ms": 1, "beta_ms": 1}}],
                   "sessions": [{"model": "A", "slo_ms": -5, "rate_rps": 1}]}, f)
    try:
        p = subprocess.run([squish_plan, f.name], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(f.name)
    assert p.returncode == 1, p.returncode
    assert "sessions[0].slo_ms" in p.stderr, p.stderr
    assert p.stdout == "", p.stdout


def schema_rejects_bad_plan():
    bad = {"devices": [{"id": 0, "duty_cycle_ms": 0, "occupancy": 1, "memory_mb": 1,
                        "sessions": []}],
           "lower_bound_devices": 0, "unplaced": [], "pipelines": [], "advice": {}}
    try:
        plan_schema.validate(bad)
    except jsonschema.ValidationError:
        return
    raise AssertionError("an invalid plan passed the schema")


check("nexus low-load plan validates and A+B share a device", nexus_low)
check("mixed workload: schema, SLOs, memory, unplaced, pipelines, prefix group", mixed)
check("hosts: the tight session stays local, the link shows in the plan", hosts)
check("hosts whose counts disagree with devices.count fail", bad_hosts)
check("bad workload fails naming the JSON path", bad_workload)
check("plan schema rejects an invalid plan", schema_rejects_bad_plan)

print(f"1..{len(results)}")
for i, (ok, name, why) in enumerate(results, 1):
    print(f"{'ok' if ok else 'not ok'} {i} - {name}")
    if not ok:
        print(f"# {why}")
sys.exit(0 if all(r[0] for r in results) else 1)
