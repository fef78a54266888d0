"""deploy/: the Kubernetes manifests and systemd units parse, have the
shape the README promises (a 2-replica squishd --role dispatcher whose
readiness is leadership, frontends behind the clients' Service with a
HorizontalPodAutoscaler, a GPU worker DaemonSet with a data listener,
Services whose ports are the processes' own, secrets mounted owner-only,
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


def values_of(args, flag):
    """The values given to flag, as --flag=VALUE or --flag VALUE."""
    out = []
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            out.append(a[len(flag) + 1:])
        elif a == flag and i + 1 < len(args):
            out.append(args[i + 1])
    return out


def port_of(hostport):
    """The port of HOST:PORT (HOST may be $(POD_IP) or a name), or None."""
    m = re.match(r"^(?:tcp://)?(.+):(\d+)$", hostport)
    return int(m.group(2)) if m else None


def host_of(hostport):
    m = re.match(r"^(?:tcp://)?(.+):(\d+)$", hostport)
    return m.group(1) if m else None


def container_ports(c):
    """name -> containerPort, and the set of containerPorts."""
    named = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
    return named, {p["containerPort"] for p in c.get("ports", [])}


def target_port(svc_port, c):
    """The container port a Service port reaches (targetPort by name or
    number; port when there is none)."""
    t = svc_port.get("targetPort", svc_port["port"])
    return container_ports(c)[0].get(t) if isinstance(t, str) else t


def selects(svc, pod_template):
    """Whether the Service's selector matches the pod template's labels."""
    sel = svc["spec"].get("selector") or {}
    labels = pod_template["metadata"].get("labels", {})
    return bool(sel) and all(labels.get(k) == v for k, v in sel.items())


def secret_mounts(pod_spec):
    """mountPath -> secretName of the pod's secret volumes."""
    secret_of = {v["name"]: v["secret"]["secretName"]
                 for v in pod_spec.get("volumes", []) if "secret" in v}
    out = {}
    for c in pod_spec["containers"]:
        for m in c.get("volumeMounts", []):
            if m["name"] in secret_of:
                out[m["mountPath"].rstrip("/")] = secret_of[m["name"]]
    return out


def token_files_from_secrets(what, pod_spec, args):
    """Every --*-token-file lies in a directory that a Secret is mounted
    on, the cluster token's in squish-cluster-token."""
    mounts = secret_mounts(pod_spec)
    for flag, secret in (("--cluster-token-file", "squish-cluster-token"),
                         ("--admin-token-file", "squish-admin-token")):
        for v in values_of(args, flag):
            check(mounts.get(os.path.dirname(v)) == secret,
                  "%s: %s %s is in the mounted Secret %s" % (what, flag, v, secret))


docs = []
for path in sorted(glob.glob(os.path.join(DEPLOY, "kubernetes", "*.yaml"))):
    if os.path.basename(path) == "kustomization.yaml":
        continue  # kustomize's own file, read below
    with open(path) as f:
        for d in yaml.safe_load_all(f):
            if d is not None:
                docs.append((os.path.basename(path), d))
check(len(docs) >= 10, "the manifests parse (%d documents)" % len(docs))
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
dargs = c.get("command", []) + c.get("args", [])
check(values_of(dargs, "--role") == ["dispatcher"], "squishd: --role dispatcher")
check(len(values_of(dargs, "--cluster-listen")) == 1, "squishd: one --cluster-listen")
cluster_listen_port = port_of((values_of(dargs, "--cluster-listen") or [""])[0])
# --advertise is the URL a standby gives clients for the leader: this pod's
# own address and the port of --listen (frontends need none: they use the
# address their link reached).
adv = values_of(dargs, "--advertise")
listen_port = port_of((values_of(dargs, "--listen") or [""])[0])
check(len(adv) == 1 and adv[0] == "http://$(POD_IP):%s" % listen_port,
      "squishd: --advertise is http://$(POD_IP):<port of --listen> %s" % adv)
token_files_from_secrets("squishd", pod["spec"], dargs)

services = {d["metadata"]["name"]: d for d in by_kind.get("Service", [])}
check({"squishd", "squishd-dispatcher", "squishd-cluster"} <= set(services),
      "Services for clients, the dispatcher's HTTP, and the cluster port %s" % sorted(services))
ports = {p["containerPort"] for p in c["ports"]}
for name in ("squishd-dispatcher", "squishd-cluster"):
    svc = services.get(name, {"spec": {"ports": []}})
    check(selects(svc, pod), "%s selects the dispatcher's pods" % name)
    check(svc["spec"]["ports"] and all(target_port(p, c) in ports for p in svc["spec"]["ports"]),
          "%s: its ports are the dispatcher's" % name)
cluster_svc = services.get("squishd-cluster", {"spec": {"ports": [{"port": None}]}})
cluster_port = cluster_svc["spec"]["ports"][0]
check(cluster_listen_port is not None and target_port(cluster_port, c) == cluster_listen_port,
      "squishd-cluster's targetPort is the dispatcher's --cluster-listen port %s" %
      cluster_listen_port)
# The leader is not ready until a worker joins it, so its cluster port must
# be reachable while it is not ready: every replica's address, dialed in
# turn (only the leader listens). Headless, so no port translation.
check(cluster_svc["spec"].get("clusterIP") == "None" and
      cluster_svc["spec"].get("publishNotReadyAddresses") is True,
      "squishd-cluster: headless, not-ready replicas listed (workers let the leader be ready)")
check(cluster_port["port"] == cluster_listen_port,
      "squishd-cluster: headless, so its port is --cluster-listen's")
http_port = port_of((values_of(dargs, "--listen") or [""])[0])
check(all(p["port"] == http_port for p in services.get("squishd-dispatcher")["spec"]["ports"])
      if "squishd-dispatcher" in services else False,
      "squishd-dispatcher: its port is the dispatcher's --listen port %s" % http_port)

fe = [d for d in by_kind.get("Deployment", []) if d["metadata"]["name"] == "squish-frontend"]
check(len(fe) == 1, "frontends: a Deployment squish-frontend")
fpod = fe[0]["spec"]["template"]
fc = fpod["spec"]["containers"][0]
fargs = fc.get("command", []) + fc.get("args", [])
check(fc.get("command", [None])[0] == "squishd", "frontends: run squishd")
bad = [f for f in flags_of(fargs) if f not in squishd_flags]
check(not bad, "frontends: every flag exists in squishd --help %s" % bad)
check(values_of(fargs, "--role") == ["frontend"], "frontends: --role frontend")
disp = values_of(fargs, "--dispatcher")
daddrs = [a for v in disp for a in v.split(",")]
check(len(disp) == 1 and daddrs and all(
    host_of(a) is not None and host_of(a).split(".")[0] == "squishd-cluster" and
    (host_of(a).count(".") == 0 or host_of(a).split(".")[1] == fe[0]["metadata"]["namespace"]) and
    port_of(a) == cluster_port["port"] for a in daddrs),
    "frontends: --dispatcher is the squishd-cluster Service's name and port %s" % daddrs)
check(fc["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready",
      "frontends: readiness is /v2/health/ready (503 without a dispatcher)")
check(fc["livenessProbe"]["httpGet"]["path"] == "/v2/health/live", "frontends: liveness probe")
fnamed, fports = container_ports(fc)
for probe in ("readinessProbe", "livenessProbe"):
    pp = fc[probe]["httpGet"]["port"]
    check((fnamed.get(pp) if isinstance(pp, str) else pp) ==
          port_of((values_of(fargs, "--listen") or [""])[0]),
          "frontends: the %s asks the --listen port" % probe)
check(fc.get("resources", {}).get("requests", {}).get("cpu") is not None,
      "frontends: a CPU request (the HPA's utilization is relative to it)")
fann = fpod["metadata"].get("annotations", {})
# Every frontend's /metrics is the cluster's one view (the dispatcher's,
# every frontend's series labelled): scraping each would count it N times.
check(fann.get("prometheus.io/scrape") != "true",
      "frontends: not scraped one by one (the dispatcher's /metrics is the one view)")
check(values_of(fargs, "--cluster-token-file"), "frontends: a --cluster-token-file")
token_files_from_secrets("frontends", fpod["spec"], fargs)
clients = services.get("squishd", {"spec": {"ports": []}})
check(selects(clients, fpod), "squishd (the clients' Service) selects the frontends' pods")
check(not selects(clients, pod), "squishd (the clients' Service) does not select the dispatcher")
check(clients["spec"]["ports"] and all(target_port(p, fc) in fports
                                       for p in clients["spec"]["ports"]),
      "squishd (the clients' Service): its ports are the frontends'")

hpas = [d for d in by_kind.get("HorizontalPodAutoscaler", [])]
check(len(hpas) == 1 and hpas[0]["apiVersion"] == "autoscaling/v2",
      "frontends: one autoscaling/v2 HorizontalPodAutoscaler")
ref = hpas[0]["spec"]["scaleTargetRef"] if hpas else {}
check(ref.get("kind") == "Deployment" and ref.get("name") == fe[0]["metadata"]["name"] and
      ref.get("apiVersion") == "apps/v1",
      "the HPA scales the frontend Deployment %s" % ref)
check(hpas and any(m.get("type") == "Resource" and m["resource"]["name"] == "cpu" and
                   m["resource"]["target"]["type"] == "Utilization"
                   for m in hpas[0]["spec"].get("metrics", [])),
      "the HPA targets CPU utilization")
check(hpas and 1 <= hpas[0]["spec"].get("minReplicas", 1) <= hpas[0]["spec"]["maxReplicas"],
      "the HPA: 1 <= minReplicas <= maxReplicas")
check("replicas" not in fe[0]["spec"],
      "frontends: no replicas in the Deployment (the HPA owns the count)")

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
check(all(port_of(a) == cluster_port["port"] for a in values_of(wargs, "--connect")),
      "workers: --connect's port is squishd-cluster's")
token_files_from_secrets("workers", ds[0]["spec"]["template"]["spec"], wargs)
dl, dadv = values_of(wargs, "--data-listen"), values_of(wargs, "--data-advertise")
_, wports = container_ports(wc)
check(len(dl) == 1 and port_of(dl[0]) is not None and port_of(dl[0]) != 0,
      "workers: --data-listen on a fixed port %s" % dl)
check(len(dadv) == 1 and dl and port_of(dadv[0]) == port_of(dl[0]),
      "workers: --data-advertise's port is --data-listen's %s %s" % (dadv, dl))
check(dl and port_of(dl[0]) in wports, "workers: the data port is a declared containerPort")
pod_ip_env = [e["name"] for e in wc.get("env", [])
              if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP"]
check(len(dadv) == 1 and host_of(dadv[0]) in ["$(%s)" % n for n in pod_ip_env],
      "workers: --data-advertise's host is the pod IP (downward API) %s" % dadv)

secrets = {d["metadata"]["name"] for d in by_kind.get("Secret", [])}
used = set()
for d in squishd + fe + ds:
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
# Every manifest is applied, but the secrets' template (created by hand).
manifests = {os.path.basename(p) for p in glob.glob(os.path.join(DEPLOY, "kubernetes", "*.yaml"))}
missing = manifests - {"kustomization.yaml", "secrets.example.yaml"} - set(kz["resources"])
check(not missing, "kustomization: lists every manifest %s" % sorted(missing))


def exec_start(unit):
    with open(unit) as f:
        text = f.read().replace("\\\n", " ")
    m = re.search(r"^ExecStart=(.*)$", text, re.M)
    return (m.group(1).split() if m else []), text


units = sorted(os.path.basename(p) for p in glob.glob(os.path.join(DEPLOY, "systemd", "*.service")))
check({"squishd.service", "squish-dispatcher.service", "squish-frontend.service",
       "squish-worker@.service"} <= set(units), "systemd: the four units %s" % units)
unit_words = {}
for unit in units:
    words, text = exec_start(os.path.join(DEPLOY, "systemd", unit))
    unit_words[unit] = words
    binary = words[0].rsplit("/", 1)[-1] if words else None
    flags = {"squishd": squishd_flags, "squish-worker": worker_flags}.get(binary)
    check(flags is not None, "%s runs squishd or squish-worker (%s)" % (unit, binary))
    bad = [f for f in flags_of(words[1:]) if f not in (flags or set())]
    check(not bad, "%s: every flag exists in %s --help %s" % (unit, binary, bad))
    check(re.search(r"^Restart=always$", text, re.M) is not None, "%s: Restart=always" % unit)

sd = unit_words.get("squishd.service", [])
check(values_of(sd, "--role") in ([], ["all"]), "squishd.service: the single process (role all)")
dw = unit_words.get("squish-dispatcher.service", [])
check(values_of(dw, "--role") == ["dispatcher"] and len(values_of(dw, "--cluster-listen")) == 1,
      "squish-dispatcher.service: --role dispatcher with --cluster-listen")
with open(os.path.join(DEPLOY, "systemd", "squish-dispatcher.service")) as f:
    check(re.search(r"^Conflicts=squishd\.service$", f.read(), re.M) is not None,
          "squish-dispatcher.service conflicts with squishd.service (same ports and DB)")
fw = unit_words.get("squish-frontend.service", [])
check(values_of(fw, "--role") == ["frontend"] and len(values_of(fw, "--dispatcher")) == 1 and
      values_of(fw, "--cluster-token-file") and not values_of(fw, "--cluster-listen"),
      "squish-frontend.service: --role frontend, --dispatcher, the cluster token")
ww = unit_words.get("squish-worker@.service", [])
check(len(values_of(ww, "--data-listen")) == 1 and values_of(ww, "--cluster-token-file"),
      "squish-worker@.service: --data-listen (frontends' rows) with the cluster token")

print("1..%d" % n)
sys.exit(1 if failed else 0)
