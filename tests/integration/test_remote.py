"""Remote workers over TCP, on 127.0.0.1: squishd --cluster-listen with a
token file, squish-worker --connect tcp://... started by hand. A remote
worker authenticates both ways without sending the token (a worker with no
token or a wrong one is refused, and both logs say why; with TLS, so is one
whose certificate another CA signed), serves batches whose
inputs and outputs travel in frames (answers equal to a local worker's), and
when squishd restarts it reconnects, keeping the model file it holds: squishd
does not send it again."""

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time

import numpy as np
import tiny_models as tm
from harness import SQUISHD, WORKER, Skip, Squishd, eventually, run, test

PHOTO = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
R50 = {"name": "r50", "profile": {"alpha_ms": 1.053, "beta_ms": 5.072}, "max_batch": 32,
       "default_slo_ms": 100}


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def free_port():
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


class Cluster:
    """A temporary directory with the token files, squishd's and the
    workers' logs."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="squish-remote-")
        self.token = os.path.join(self.tmp, "cluster.token")
        self.wrong = os.path.join(self.tmp, "wrong.token")
        for path, text in [(self.token, os.urandom(24).hex()), (self.wrong, "not-the-token")]:
            with open(path, "w") as f:
                f.write(text + "\n")
            os.chmod(path, 0o600)
        self.workers = []

    def squishd(self, workers="none", port=0, extra=()):
        return Squishd(workers=workers, tmp=self.tmp,
                       extra=["--cluster-listen", "127.0.0.1:%d" % port,
                              "--cluster-token-file", self.token,
                              "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "1000"]
                       + list(extra))

    def worker(self, addr, device, host, token="right", extra=()):
        log = os.path.join(self.tmp, "worker-%s-%s-%d.log" % (device.replace(":", ""), host,
                                                              len(self.workers)))
        args = [WORKER, "--connect", "tcp://" + addr, "--device", device, "--host-name", host,
                "--reconnect-max-ms", "400"] + list(extra)
        if token == "right":
            args += ["--cluster-token-file", self.token]
        elif token == "wrong":
            args += ["--cluster-token-file", self.wrong]
        f = open(log, "ab")
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT)
        f.close()
        p.log_path = log
        self.workers.append(p)
        return p

    def cleanup(self):
        for p in self.workers:
            if p.poll() is None:
                p.kill()
                p.wait()
        if not os.environ.get("SQUISH_IT_KEEP"):
            shutil.rmtree(self.tmp, ignore_errors=True)


def only_onednn_leaks(log):
    """Under LeakSanitizer, a cpu worker's exit reports memory oneDNN
    allocated and never frees (its process-wide state: the same with a
    worker on the UNIX socket, before remote workers existed). Any other
    leak, or any other sanitizer report, is ours."""
    if "LeakSanitizer" not in log or "AddressSanitizer: heap" in log or "runtime error" in log:
        return False
    frames = re.findall(r"^\s+#1 .*$", log, re.M)
    return bool(frames) and all("libdnnl" in f for f in frames)


def clean_exit(rc, log):
    return rc == 0 or only_onednn_leaks(log)


def stop_worker(p):
    """SIGTERM stops a remote worker cleanly (exit 0; under the sanitizers,
    with no leak), connected or waiting to reconnect."""
    p.send_signal(signal.SIGTERM)
    rc = p.wait(20)
    assert clean_exit(rc, read(p.log_path)), (rc, read(p.log_path))
    assert "stopping on a signal" in read(p.log_path)


def read(path):
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def cluster_addr(s):
    m = eventually(lambda: re.search(r"cluster listening addr=(\S+)", s.read_log()), 10,
                   "the cluster listener")
    return m.group(1)


def upload_onnx(s, name, onnx_bytes):
    labels = ("\n".join("cls%d" % i for i in range(10)) + "\n").encode()
    body, ctype = tm.multipart([("model", "m.onnx", None, onnx_bytes),
                                ("config", None, None,
                                 json.dumps({"name": name, "max_batch": 8}).encode()),
                                ("labels", "l.txt", None, labels)])
    r = s.request("POST", "/models", body=body, headers=dict(auth(s), **{"Content-Type": ctype}))
    assert r.status == 202, r


def wait_profiled(s, name):
    def ready():
        rec = s.get("/models/" + name, headers=auth(s), schema_name="model").json["versions"][0]
        return rec if rec["status"] != "profiling" else None

    rec = eventually(ready, 90, "profiling to finish")
    assert rec["status"] == "ready", rec


def images():
    rng = np.random.default_rng(11)
    from PIL import Image
    import io
    out = []
    for i in range(4):
        arr = rng.integers(0, 255, (40 + 8 * i, 48, 3), dtype=np.uint8)
        b = io.BytesIO()
        Image.fromarray(arr, "RGB").save(b, "JPEG", quality=92)
        out.append(b.getvalue())
    return out


def scores_of(s, imgs):
    """Scores of each image, alone, then all in one request (one batch)."""
    alone = []
    for img in imgs:
        r = s.request("POST", "/v1/models/tiny/infer?top_k=10", body=img,
                      headers={"X-SLO-Ms": "5000"}, schema_name="infer_v1_response")
        assert r.status == 200, r
        alone.append({p["label"]: p["score"] for p in r.json["predictions"][0]})
    body, ctype = tm.multipart([("i%d" % i, None, None, img) for i, img in enumerate(imgs)])
    r = s.request("POST", "/v1/models/tiny/infer?top_k=10", body=body,
                  headers={"X-SLO-Ms": "5000", "Content-Type": ctype},
                  schema_name="infer_v1_response")
    assert r.status == 200, r
    together = [{p["label"]: p["score"] for p in preds} for preds in r.json["predictions"]]
    return alone, together


def close(a, b):
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-5 for k in a)


@test
def a_remote_emu_worker_serves_and_bad_tokens_are_refused():
    c = Cluster()
    s = None
    try:
        s = c.squishd()
        addr = cluster_addr(s)
        # Its first address has nobody listening: it tries the next.
        dead = "127.0.0.1:%d" % free_port()
        good = c.worker(dead, "emu:0", "hosta", extra=["--connect", "tcp://" + addr])
        s.wait_ready(workers=1)
        assert "cannot connect addr=%s" % dead in read(good.log_path)
        # squishd counts the worker up at the handshake, a moment before the
        # worker logs the WELCOME it got.
        eventually(lambda: "joined squishd addr=%s" % addr in read(good.log_path), 10,
                   "the worker's log of joining")
        r = s.request("POST", "/models", body=json.dumps(R50),
                      headers=dict(auth(s), **{"Content-Type": "application/json"}))
        assert r.status == 201, r
        with open(PHOTO, "rb") as f:
            photo = f.read()
        r = s.request("POST", "/v1/models/r50/infer?top_k=3", body=photo,
                      headers={"X-SLO-Ms": "3000", "Content-Type": "image/jpeg"},
                      schema_name="infer_v1_response")
        assert r.status == 200, r
        # A batch of several images: inputs over TCP, one region each.
        body, ctype = tm.multipart([("i%d" % i, None, None, photo) for i in range(5)])
        r = s.request("POST", "/v1/models/r50/infer", body=body,
                      headers={"X-SLO-Ms": "3000", "Content-Type": ctype},
                      schema_name="infer_v1_response")
        assert r.status == 200 and len(r.json["predictions"]) == 5, r
        assert "worker up id=1000 device=emu:0@hosta" in s.read_log()
        # Its link, measured (heartbeats for the round trip, a probe for the
        # bandwidth), in /v1/plan and /metrics; the dispatcher charges it.
        def link():
            for w in s.get("/v1/plan", schema_name="plan").json.get("workers", []):
                if w["device"] == "emu:0@hosta" and "rtt_ms" in w:
                    return w
            return None
        w = eventually(link, 15, "the remote worker's link measured")
        assert w["host"].startswith("127.0.0.1:") and 0 < w["rtt_ms"] < 100, w
        assert w["bandwidth_mbps"] > 10, w
        text = s.get("/metrics").raw.decode()
        assert re.search(r'^squish_worker_rtt_seconds\{worker="1000",device="emu:0@hosta"\} ',
                         text, re.M), text[-2000:]
        assert "squish_worker_link_bytes_per_second{" in text
        # The planner packs with it: the device of the remote worker sits
        # behind its link, and each of its batches is charged the transfer.
        def planned():
            for d in s.get("/v1/plan", schema_name="plan").json["devices"]:
                if d["device"] == "emu:0@hosta" and "rtt_ms" in d:
                    return d
            return None
        d = eventually(planned, 15, "a plan made with the remote worker's link")
        assert 0 < d["rtt_ms"] < 100 and d["bandwidth_mbps"] > 10, d
        assert all(x.get("transfer_ms", 0) > 0 for x in d["sessions"]), d

        # No token, a wrong token: refused, both sides say why, the worker
        # exits 1 (it never joined: a wrong token does not fix itself).
        none = c.worker(addr, "emu:1", "hostb", token="none")
        wrong = c.worker(addr, "emu:2", "hostc", token="wrong")
        assert none.wait(20) == 1 and wrong.wait(20) == 1
        log = s.read_log()
        assert re.search(r"worker refused addr=127\.0\.0\.1:\d+ reason=no_token", log), log
        assert re.search(r"worker refused addr=127\.0\.0\.1:\d+ reason=.*bad_proof", log), log
        assert "no_token" in read(none.log_path), read(none.log_path)
        assert "refusing squishd reason=\"bad_proof" in read(wrong.log_path), read(wrong.log_path)
        assert "emu:1@hostb" not in log and "emu:2@hostc" not in log
        assert c.token and open(c.token).read().strip() not in log
        # A client that speaks garbage is dropped, squishd goes on.
        with socket.create_connection(tuple([addr.rsplit(":", 1)[0],
                                             int(addr.rsplit(":", 1)[1])])) as so:
            so.sendall(b"\xff" * 64)
            so.settimeout(5)
            try:
                while so.recv(4096):
                    pass
            except OSError:
                pass
        host, cport = addr.rsplit(":", 1)[0], int(addr.rsplit(":", 1)[1])
        # One that announces an 8 MiB handshake frame is closed once it has
        # sent 1 MiB of it (nothing is buffered for it beyond that).
        with socket.create_connection((host, cport)) as so:
            so.sendall(struct.pack("<IHHQ", 8 << 20, 41, 0, 0))
            try:
                for _ in range(64):
                    so.sendall(b"\0" * 65536)
            except OSError:
                pass
        eventually(lambda: re.search(r"ended before its handshake addr=127\.0\.0\.1:\d+ "
                                     r"reason=handshake_too_large", s.read_log()), 10,
                   "the oversized handshake closed")
        # Connections that never speak fill at most 64 handshake slots: the
        # oldest go, and a real worker still joins at once.
        idle = [socket.create_connection((host, cport)) for _ in range(80)]
        try:
            late = c.worker(addr, "emu:3", "hostd")
            s.wait_ready(workers=2, timeout=15)
            assert "too many worker connections in their handshake (max=64)" in s.read_log()
            stop_worker(late)
            eventually(lambda: s.get("/v2/health/ready").json["workers"] == 1, 10,
                       "the late worker gone")
        finally:
            for so in idle:
                so.close()
        assert s.get("/v2/health/ready").json["workers"] == 1
        assert good.poll() is None
        stop_worker(good)
        eventually(lambda: re.search(r"worker lost id=1000 device=emu:0@hosta "
                                     r".*reason=(eof|read_error)", s.read_log()), 10,
                   "squishd to see it go")
        assert s.stop() == 0
    finally:
        if s is not None:
            s.cleanup()
        c.cleanup()


@test
def a_remote_worker_returns_every_output_of_each_item():
    """Over TCP the batch's rows come back in BATCH_OUTPUT frames: each row
    holds every output of its item (here two of an NHWC model), at batch 1
    and at a larger batch."""
    model, reference = tm.two_output_nhwc()
    c = Cluster()
    s = None
    try:
        port = free_port()
        s = c.squishd(port=port)
        c.worker("127.0.0.1:%d" % port, "cpu", "hosta", extra=["--threads", "1"])
        s.wait_ready(workers=1)
        body, ctype = tm.multipart([("model", "m.onnx", None, model),
                                    ("config", None, None,
                                     json.dumps({"name": "two", "max_batch": 4}).encode())])
        r = s.request("POST", "/models", body=body,
                      headers=dict(auth(s), **{"Content-Type": ctype}))
        assert r.status == 202, r
        wait_profiled(s, "two")
        x = np.random.default_rng(4).standard_normal((4, 12, 12, 3)).astype(np.float32)
        logits, feats = reference(x)
        for n in (1, 4):
            req = {"inputs": [{"name": "x", "shape": [n, 12, 12, 3], "datatype": "FP32",
                               "data": x[:n].flatten().tolist()}]}
            r = s.request("POST", "/v2/models/two/infer", body=json.dumps(req),
                          headers={"Content-Type": "application/json"},
                          schema_name="oip_infer_response")
            assert r.status == 200, r
            outs = {o["name"]: o for o in r.json["outputs"]}
            assert list(outs) == ["logits", "features"], r.json
            assert outs["logits"]["shape"] == [n, 5] and outs["features"]["shape"] == [n, 4]
            for name, want in (("logits", logits[:n]), ("features", feats[:n])):
                got = np.asarray(outs[name]["data"], np.float32)
                assert np.abs(got - want.flatten()).max() <= 1e-4 * max(
                    1.0, np.abs(want).max()), (name, got, want)
        assert s.stop() == 0
    finally:
        if s is not None:
            s.cleanup()
        c.cleanup()


@test
def remote_cpu_answers_equal_local_and_a_reconnect_does_not_resend_the_model():
    imgs = images()
    onnx = tm.tiny()
    # The reference: squishd's own cpu worker over the UNIX socket and shm.
    local = Squishd(workers="cpu:1")
    try:
        local.wait_ready(workers=1)
        upload_onnx(local, "tiny", onnx)
        wait_profiled(local, "tiny")
        want_alone, want_together = scores_of(local, imgs)
        assert local.stop() == 0
    finally:
        local.cleanup()

    c = Cluster()
    s = s2 = s3 = None
    try:
        port = free_port()
        s = c.squishd(port=port)
        addr = "127.0.0.1:%d" % port
        w = c.worker(addr, "cpu", "hosta", extra=["--threads", "1", "--kept-models-ms", "2000"])
        s.wait_ready(workers=1)
        upload_onnx(s, "tiny", onnx)
        wait_profiled(s, "tiny")  # measured on the remote worker
        alone, together = scores_of(s, imgs)
        for a, b in zip(alone + together, want_alone + want_together):
            assert close(a, b), (a, b)
        log = s.read_log()
        sent = re.findall(r"model load sent worker=1000 device=cpu@hosta model=tiny version=1 "
                          r"bytes=(\d+) cached=(\d)", log)
        assert sent and int(sent[0][0]) == len(onnx), sent

        # squishd restarts on the same database and port: the worker stays
        # up, reconnects, and holds the file (squishd sends it as cached).
        assert s.stop() == 0
        eventually(lambda: "connection to squishd lost" in read(w.log_path), 10,
                   "the worker to see squishd go")
        assert w.poll() is None, "a remote worker outlives squishd"
        s2 = c.squishd(port=port)
        s2.wait_ready(workers=1, timeout=20)
        again_alone, again_together = scores_of(s2, imgs)
        for a, b in zip(again_alone + again_together, want_alone + want_together):
            assert close(a, b), (a, b)
        log2 = s2.read_log()
        # squishd knows what it holds from the handshake: no bytes read from
        # the database or sent, the load goes as cached.
        assert re.search(r"worker holds model files id=1000 device=cpu@hosta files=1", log2), log2
        assert re.search(r"model load sent worker=1000 device=cpu@hosta model=tiny version=1 "
                         r"bytes=0 cached=1", log2), log2
        since = log2[log2.rindex("worker holds model files"):]  # the log goes on from s's
        assert not re.search(r"model load sent .*model=tiny .*cached=0", since), since
        wlog = read(w.log_path)
        assert "rejoined with model files held=1" in wlog, wlog
        assert len(re.findall(r"model file received", wlog)) == 1, wlog
        # ... and the model it had loaded serves as it was: not imported again.
        assert re.search(r"model kept key=\d+ sha256=\w+ \(loaded before the reconnect\)", wlog)
        assert len(re.findall(r"model loaded key=", wlog)) == 1, wlog
        assert "model dropped" not in wlog, wlog
        assert s2.stop() == 0
        # squishd gone: the worker waits to reconnect, and still stops cleanly.
        eventually(lambda: read(w.log_path).count("connection to squishd lost") >= 2, 10,
                   "the worker to see squishd go again")
        # A squishd on another database never loads tiny: the worker drops
        # it --kept-models-ms after it rejoins.
        other = os.path.join(c.tmp, "other")
        os.mkdir(other)
        s3 = Squishd(workers="none", tmp=other,
                     extra=["--cluster-listen", addr, "--cluster-token-file", c.token])
        s3.wait_ready(workers=1, timeout=20)
        eventually(lambda: re.search(r"model dropped key=\d+ sha256=\w+ reason=\"not loaded again "
                                     r"within 2000 ms of the reconnect\"", read(w.log_path)), 10,
                   "the model nobody loads again dropped")
        assert s3.stop() == 0
        stop_worker(w)
    finally:
        for x in (s, s2, s3):
            if x is not None:
                x.cleanup()
        c.cleanup()


def make_certs(d):
    """A CA, squishd's certificate for 127.0.0.1, a worker's; and a worker
    certificate from another CA. openssl's command line."""
    def run_ssl(*args):
        subprocess.run(["openssl"] + list(args), cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        run_ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "2", "-subj", "/CN=" + ca)
    for name, ca, san in (("gw", "ca", "IP:127.0.0.1"), ("wk", "ca", "DNS:worker-a"),
                          ("rogue", "other-ca", "DNS:worker-b")):
        run_ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name)
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write("subjectAltName=%s\nbasicConstraints=CA:FALSE\n" % san)
        run_ssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
                "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile", name + ".ext")
    for f in os.listdir(d):
        if f.endswith(".key"):
            os.chmod(os.path.join(d, f), 0o600)


def tls_flags(d, name, ca="ca"):
    return ["--cluster-tls-cert", os.path.join(d, name + ".pem"),
            "--cluster-tls-key", os.path.join(d, name + ".key"),
            "--cluster-tls-ca", os.path.join(d, ca + ".pem")]


@test
def tls_both_ways_serves_and_refuses_strangers():
    if shutil.which("openssl") is None:
        raise Skip("no openssl command to make test certificates")
    c = Cluster()
    s = None
    try:
        make_certs(c.tmp)
        s = c.squishd(extra=tls_flags(c.tmp, "gw"))
        addr = cluster_addr(s)
        assert "tls=yes" in s.read_log()
        good = c.worker(addr, "emu:0", "hosta", extra=tls_flags(c.tmp, "wk"))
        s.wait_ready(workers=1)
        assert 'worker certificate id=1000 subject="/CN=wk"' in s.read_log()
        r = s.request("POST", "/models", body=json.dumps(R50),
                      headers=dict(auth(s), **{"Content-Type": "application/json"}))
        assert r.status == 201, r
        with open(PHOTO, "rb") as f:
            photo = f.read()
        # 16 images: 2.4 MB of inputs through TLS records and partial writes.
        body, ctype = tm.multipart([("i%d" % i, None, None, photo) for i in range(16)])
        r = s.request("POST", "/v1/models/r50/infer", body=body,
                      headers={"X-SLO-Ms": "5000", "Content-Type": ctype},
                      schema_name="infer_v1_response")
        assert r.status == 200 and len(r.json["predictions"]) == 16, r
        assert len({json.dumps(p) for p in r.json["predictions"]}) == 1, "same photo, same answer"

        # A certificate from another CA, and no TLS at all: refused by TLS,
        # before the token is even asked for; both logs say why.
        rogue = c.worker(addr, "emu:1", "hostb", extra=tls_flags(c.tmp, "rogue", ca="other-ca"))
        plain = c.worker(addr, "emu:2", "hostc")
        eventually(lambda: "unknown ca" in s.read_log() and "wrong version number"
                   in s.read_log(), 20, "squishd to refuse both")
        eventually(lambda: "certificate verify failed" in read(rogue.log_path), 10,
                   "the rogue worker to distrust squishd")
        log = s.read_log()
        assert "emu:1@hostb" not in log and "emu:2@hostc" not in log
        assert s.get("/v2/health/ready").json["workers"] == 1
        assert good.poll() is None
        # Half-configured TLS on a worker is refused at start.
        p = subprocess.run([WORKER, "--connect", "tcp://" + addr, "--device", "emu:3",
                            "--cluster-tls-cert", os.path.join(c.tmp, "wk.pem")],
                           capture_output=True, text=True, timeout=20)
        assert p.returncode == 2 and "all three or none" in p.stderr, p
        stop_worker(good)
        assert s.stop() == 0
    finally:
        if s is not None:
            s.cleanup()
        c.cleanup()


@test
def a_half_configured_cluster_does_not_start():
    tmp = tempfile.mkdtemp(prefix="squish-remote-cfg-")
    try:
        base = [SQUISHD, "--listen", "127.0.0.1:0", "--db", os.path.join(tmp, "db"),
                "--workers", "none"]
        tok = os.path.join(tmp, "t")
        with open(tok, "w") as f:
            f.write("x" * 32)
        os.chmod(tok, 0o600)
        for extra, want in [
                (["--cluster-listen", "127.0.0.1:0"], "needs cluster_token_file"),
                (["--cluster-listen", "127.0.0.1:0", "--cluster-token-file", tok,
                  "--cluster-tls-cert", tok], "all three or none"),
                (["--cluster-listen", "127.0.0.1:0", "--cluster-token-file",
                  os.path.join(tmp, "missing")], "missing"),
                (["--cluster-listen", "nowhere", "--cluster-token-file", tok], "ADDR:PORT")]:
            p = subprocess.run(base + extra, capture_output=True, text=True, timeout=20)
            assert p.returncode != 0 and want in p.stdout + p.stderr, (extra, p)
        # The worker side: tcp:// and a UNIX socket at once, a bad address.
        for extra in [["--connect", "tcp://127.0.0.1:1", "--connect", "/tmp/x.sock"],
                      ["--connect", "tcp://nohost"]]:
            p = subprocess.run([WORKER, "--device", "emu:0"] + extra, capture_output=True,
                               text=True, timeout=20)
            assert p.returncode == 2, (extra, p)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run()
