"""deploy/: the Kubernetes manifests and systemd units parse, have the
shape the README promises (a 2-replica squishd whose readiness is
leadership, Services, a GPU worker DaemonSet, secrets mounted owner-only,
Prometheus annotations), and name only flags and SQUISH_* variables that
the real squishd and squish-worker accept (their --help, run here). No API
server runs here, so kubectl's dry-run cannot; this reads the files with
python3-yaml. Usage: test_manifests.py BUILD_DIR SOURCE_DIR"""

import glob
import os
import re
import subprocess
import sys

import yaml

BUILD, SOURCE = sys.argv[1], sys.argv[2]
DEPLOY = os.path.join(SOURCE, "deploy")
n = 0
failed = 0


def check(ok, what):
    global n, failed
    n += 1
    print("%s %d - %s" % ("ok" if ok else "not ok", n, what))
    failed += not ok


def help_flags(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    text = out.stdout + out.stderr
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", text))


squishd_flags = help_flags(os.path.join(BUILD, "gateway", "squishd"))
worker_flags = help_flags(os.path.join(BUILD, "worker", "squish-worker"))
assert "--listen" in squishd_flags and "--device" in worker_flags, "--help lists no flags"


def flags_of(args):
    out = []
    for a in args:
        for m in re.finditer(r"(?:^|\s)(--[a-z][a-z0-9-]*)", a):
            out.append(m.group(1))
    return out


docs = []
for path in sorted(glob.glob(os.path.join(DEPLOY, "kubernetes", "*.yaml"))):
    if os.path.basename(path) == "kustomization.yaml":
        continue  # kustomize's own file, read below
    with open(path) as f:
        for d in yaml.safe_load_all(f):
            if d is not None:
                docs.append((os.path.basename(path), d))
check(len(docs) >= 6, "the manifests parse (%d documents)" % len(docs))
by_kind = {}
for name, d in docs:
    check(isinstance(d, dict) and "apiVersion" in d and "kind" in d and "metadata" in d,
          "%s: %s has apiVersion, kind, metadata" % (name, d.get("kind")))
    by_kind.setdefault(d["kind"], []).append(d)

squishd = [d for d in by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])
           if d["metadata"]["name"] == "squishd"]
check(len(squishd) == 1 and squishd[0]["spec"]["replicas"] == 2, "squishd: 2 replicas")
pod = squishd[0]["spec"]["template"]
c = pod["spec"]["containers"][0]
check(c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready",
      "squishd: readiness is /v2/health/ready (the standby answers 503)")
check(c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live", "squishd: liveness probe")
ann = pod["metadata"].get("annotations", {})
check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/path") == "/metrics",
      "squishd: Prometheus scrape annotations")
bad = [f for f in flags_of(c.get("command", []) + c.get("args", [])) if f not in squishd_flags]
check(not bad, "squishd: every flag exists in squishd --help %s" % bad)
envs = [e["name"] for e in c.get("env", []) if e["name"].startswith("SQUISH_")]
bad = [e for e in envs if "--" + e[len("SQUISH_"):].lower().replace("_", "-") not in squishd_flags]
check(envs and not bad, "squishd: every SQUISH_* variable is a flag's %s" % bad)
check(any(e["name"] == "SQUISH_DB" and "secretKeyRef" in e.get("valueFrom", {})
          for e in c.get("env", [])), "squishd: the DB URL comes from a Secret")

services = {d["metadata"]["name"]: d for d in by_kind.get("Service", [])}
check("squishd" in services and "squishd-cluster" in services,
      "Services for clients and for workers")
ports = {p["containerPort"] for p in c["ports"]}
check(all(p["port"] in ports or p.get("targetPort") in [q["name"] for q in c["ports"]]
          for s in services.values() for p in s["spec"]["ports"]),
      "the Services' ports are squishd's")

ds = [d for d in by_kind.get("DaemonSet", []) if d["metadata"]["name"] == "squish-worker"]
check(len(ds) == 1, "workers: a DaemonSet")
wc = ds[0]["spec"]["template"]["spec"]["containers"][0]
check(str(wc["resources"]["limits"].get("nvidia.com/gpu")) == "1",
      "workers: each requests nvidia.com/gpu: 1")
wargs = wc.get("command", []) + wc.get("args", [])
bad = [f for f in flags_of(wargs) if f not in worker_flags]
check(not bad, "workers: every flag exists in squish-worker --help %s" % bad)
check(any(a.startswith("--connect=tcp://squishd-cluster") for a in wargs),
      "workers connect to the squishd-cluster Service over TCP")

secrets = {d["metadata"]["name"] for d in by_kind.get("Secret", [])}
used = set()
for d in squishd + ds:
    spec = d["spec"]["template"]["spec"]
    for v in spec.get("volumes", []):
        if "secret" in v:
            used.add(v["secret"]["secretName"])
            check(v["secret"].get("defaultMode") == 0o400,
                  "%s: secret %s mounted owner-only" % (d["metadata"]["name"], v["name"]))
    for e in spec["containers"][0].get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            used.add(ref["name"])
check(used and used <= secrets, "every Secret used is in secrets.example.yaml %s" % (used - secrets))
for name, d in docs:
    if d["kind"] == "Secret":
        vals = list(d.get("stringData", {}).values())
        check(all("CHANGE-ME" in v for v in vals), "%s: placeholders, no real secret" % name)
with open(os.path.join(DEPLOY, "kubernetes", "kustomization.yaml")) as f:
    kz = yaml.safe_load(f)
check(all(os.path.exists(os.path.join(DEPLOY, "kubernetes", r)) for r in kz["resources"]),
      "kustomization: its resources exist")


def exec_start(unit):
    with open(unit) as f:
        text = f.read().replace("\\\n", " ")
    m = re.search(r"^ExecStart=(.*)$", text, re.M)
    return m.group(1).split() if m else []


for unit, flags, binary in (("squishd.service", squishd_flags, "squishd"),
                            ("squish-worker@.service", worker_flags, "squish-worker")):
    words = exec_start(os.path.join(DEPLOY, "systemd", unit))
    check(words and words[0].endswith("/" + binary), "%s runs %s" % (unit, binary))
    bad = [f for f in flags_of(words[1:]) if f not in flags]
    check(not bad, "%s: every flag exists in %s --help %s" % (unit, binary, bad))

print("1..%d" % n)
sys.exit(1 if failed else 0)
