"""squishd's walking skeleton: health, metadata, errors, supervised workers,
hand-started workers, cuda fallback, a cpu worker without the CUDA
libraries, heartbeats, clean shutdown."""

import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time

from harness import (BUILD, SQUISHD, WORKER, Skip, Squishd, eventually, run, sanitized, test,
                     validate)


@test
def live_ready_and_metadata_with_two_emulated_workers():
    s = Squishd(workers="emu:2")
    try:
        r = s.get("/v2/health/live", schema_name="health_live")
        assert r.status == 200, r
        r = s.wait_ready(workers=2)
        validate(r.json, "health_ready")
        r = s.get("/v2", schema_name="server_metadata")
        assert r.status == 200 and r.json["name"] == "squish", r
        # The Triton extensions it implements (each has its own test).
        assert set(r.json["extensions"]) == {
            "binary_tensor_data", "classification", "statistics", "logging", "trace",
            "model_repository", "model_repository(unload_dependents)",
            "model_configuration", "system_shared_memory"}, r
        r = s.get("/v2/", schema_name="server_metadata")
        assert r.status == 200, "a trailing slash is the same route"
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def unknown_routes_are_404_and_wrong_methods_405_with_allow():
    s = Squishd(workers="none")
    try:
        r = s.get("/no/such/thing")
        assert r.status == 404 and r.json["code"] == "not_found", r
        r = s.request("POST", "/v2/health/live", body=b"{}")
        assert r.status == 405 and r.json["code"] == "method_not_allowed", r
        assert r.headers.get("allow") == "GET", r.headers
        r = s.request("DELETE", "/v2")
        assert r.status == 405, r
    finally:
        s.stop()
        s.cleanup()


@test
def ready_is_503_with_a_reason_until_a_hand_started_worker_joins():
    s = Squishd(workers="none")
    w = None
    try:
        r = s.get("/v2/health/ready")
        assert r.status == 503 and r.json["code"] == "not_ready", r
        assert "worker" in r.json["error"], r.json
        assert r.headers.get("retry-after"), r.headers
        sock = os.path.join(s.tmp, "squishd.sock")
        w = subprocess.Popen([WORKER, "--connect", sock, "--device", "emu:7"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        s.wait_ready(workers=1, timeout=5)
        # A second worker claiming the same device is refused.
        dup = subprocess.run([WORKER, "--connect", sock, "--device", "emu:7"],
                             capture_output=True, timeout=10)
        assert dup.returncode != 0, dup
        assert s.stop() == 0
        assert w.wait(5) == 0, "a hand-started worker exits cleanly on SHUTDOWN"
    finally:
        if w and w.poll() is None:
            w.kill()
        s.cleanup()


@test
def a_sigkilled_worker_is_replaced_within_two_seconds_and_ready_stays_up():
    s = Squishd(workers="emu:2")
    try:
        s.wait_ready(workers=2)
        pids = eventually(lambda: (lambda p: p if len(p) == 2 else None)(s.worker_pids()), 5,
                          "two worker processes")
        victim = pids["emu:0"]
        os.kill(victim, signal.SIGKILL)
        t0 = time.time()
        # Ready never drops: the other worker is still up.
        while True:
            r = s.get("/v2/health/ready")
            assert r.status == 200, r
            now = s.worker_pids()
            if now.get("emu:0") not in (None, victim) and r.json["workers"] == 2:
                break
            assert time.time() - t0 < 2.0, "emu:0 not back within 2 s: %r" % now
            time.sleep(0.02)
        assert now["emu:1"] == pids["emu:1"], "the healthy worker was left alone"
        assert "worker lost" in s.read_log()
        assert s.stop() == 0
        assert s.worker_pids() == {}, "no worker outlives squishd"
    finally:
        s.cleanup()


@test
def a_stopped_worker_misses_heartbeats_and_is_replaced():
    s = Squishd(workers="emu:1", extra=["--heartbeat-ms", "50", "--heartbeat-timeout-ms", "300"])
    try:
        s.wait_ready(workers=1)
        victim = s.worker_pids()["emu:0"]
        os.kill(victim, signal.SIGSTOP)
        eventually(lambda: s.worker_pids().get("emu:0") not in (None, victim), 3,
                   "a replacement for the hung worker")
        s.wait_ready(workers=1, timeout=3)
        assert "heartbeat_timeout" in s.read_log()
        assert s.stop() == 0
    finally:
        s.cleanup()


def workers_up(s):
    """{device: up} from /metrics' squish_worker_up."""
    r = s.get("/metrics")
    assert r.status == 200, r
    return {m.group(1): int(m.group(2)) for m in re.finditer(
        r'^squish_worker_up\{worker="\d+",device="([^"]+)"\} (\d+)$', r.raw.decode(), re.M)}


def no_gpu_here(s):
    """Waits for the cuda slot's verdict; raises Skip where a GPU is up."""
    eventually(lambda: "device unavailable" in s.read_log() or "cuda" in str(workers_up(s)), 20,
               "the cuda worker to come up or report its device unavailable")
    if "device unavailable" not in s.read_log():
        raise Skip("a GPU is up here: no fallback to check")


@test
def a_cuda_worker_without_a_gpu_falls_back_to_cpu():
    s = Squishd(workers="cuda:1")
    try:
        no_gpu_here(s)
        s.wait_ready(workers=1, timeout=15)
        assert "falling back to cpu" in s.read_log()
        assert workers_up(s) == {"cpu": 1}, workers_up(s)
        assert set(s.worker_pids()) == {"cpu"}, s.worker_pids()
        assert s.stop() == 0
    finally:
        s.cleanup()


def cuda_built():
    with open(os.path.join(BUILD, "sq_config.h")) as f:
        return "SQUISH_HAVE_CUDA 1" in f.read()


def status_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (field, pid))


@test
def a_cpu_worker_maps_no_cuda_library_and_holds_little_when_idle():
    # The CUDA libraries cost every process that maps them (libcublasLt's
    # data: an idle cpu worker held 97 MB of anonymous memory with them, 2
    # MB without): a cpu worker is squish-worker, which has none of them.
    s = Squishd(workers="cpu:1")
    try:
        s.wait_ready(workers=1, timeout=30)
        pid = s.worker_pids()["cpu"]
        with open("/proc/%d/maps" % pid) as f:
            maps = f.read()
        cuda = sorted({ln.split()[-1] for ln in maps.splitlines()
                       if re.search(r"/lib(cudart|cudnn|cublas)", ln)})
        assert cuda == [], "a cpu worker maps %s" % cuda
        if not sanitized():  # ASan's shadow and quarantine are anonymous too
            anon = status_kb(pid, "RssAnon")
            assert anon < 32 * 1024, "an idle cpu worker holds %d kB of anonymous memory" % anon
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def a_cuda_device_is_served_by_squish_worker_cuda():
    # squish-worker execs its sibling for a cuda device, with the same
    # arguments: the verdict on the device is the CUDA runtime's own.
    if not cuda_built():
        raise Skip("a build without CUDA: no squish-worker-cuda")
    p = subprocess.run([WORKER, "--connect", "/nonexistent/squishd.sock", "--device", "cuda:0"],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 3:
        raise Skip("a GPU answered here (exit %d): the probe's failure cannot be seen" %
                   p.returncode)
    assert re.search(r"reason=\"cuda\w+: ", p.stderr), p.stderr
    assert "squish-worker-cuda" not in p.stderr, "it ran: %s" % p.stderr


@test
def without_a_gpu_cuda_slots_beside_a_cpu_worker_are_disabled_not_doubled():
    # One cpu worker uses every core: a cuda slot does not become a second
    # one beside it (README), for cpu:1,cuda:1 as for cuda:2.
    for workers in ("cpu:1,cuda:1", "cuda:2"):
        s = Squishd(workers=workers)
        try:
            no_gpu_here(s)
            s.wait_ready(workers=1, timeout=15)
            eventually(lambda: "slot disabled" in s.read_log(), 20, "a cuda slot disabled")
            assert "already uses every core" in s.read_log(), s.read_log()[-3000:]
            time.sleep(0.5)  # a respawned cuda worker would show by now
            assert workers_up(s) == {"cpu": 1}, workers_up(s)
            assert set(s.worker_pids()) == {"cpu"}, s.worker_pids()
            assert s.get("/v2/health/ready").json["workers"] == 1
            assert s.stop() == 0
        finally:
            s.cleanup()


@test
def bad_configuration_exits_2_naming_the_field():
    r = subprocess.run([SQUISHD, "--http-threads", "0"], capture_output=True, timeout=10)
    assert r.returncode == 2, r
    assert b"--http-threads" in r.stderr, r.stderr
    r = subprocess.run([SQUISHD, "--listen", "127.0.0.1:1"], capture_output=True, timeout=10,
                       env=dict(os.environ, SQUISH_WORKERS="gpu:1"))
    assert r.returncode == 2 and b"SQUISH_WORKERS" in r.stderr, r
    r = subprocess.run([SQUISHD, "--help"], capture_output=True, timeout=10)
    assert r.returncode == 0 and b"--listen" in r.stdout
    r = subprocess.run([SQUISHD, "--version"], capture_output=True, timeout=10)
    assert r.returncode == 0 and r.stdout.startswith(b"squishd ")


@test
def a_second_squishd_on_the_same_socket_is_refused_and_the_first_keeps_serving():
    s = Squishd(workers="emu:1")
    try:
        s.wait_ready(workers=1)
        r = subprocess.run([SQUISHD, "--listen", "127.0.0.1:0", "--db", s.db, "--workers", "none"],
                           capture_output=True, timeout=10)
        assert r.returncode != 0 and b"another squishd" in r.stderr, r
        s.wait_ready(workers=1)
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def sigterm_drains_and_exits_zero_and_restart_reuses_the_db():
    s = Squishd(workers="emu:1")
    try:
        s.wait_ready(workers=1)
        token = s.token
        assert oct(os.stat(os.path.join(s.tmp, "admin.token")).st_mode & 0o777) == "0o600"
        assert s.stop() == 0
        assert "stopped" in s.read_log()
        assert not os.path.exists(os.path.join(s.tmp, "squishd.sock"))
        s2 = Squishd(workers="emu:1", tmp=s.tmp)
        try:
            s2.wait_ready(workers=1)
            assert s2.token == token, "the admin token survives a restart"
            assert s2.stop() == 0
        finally:
            s2.cleanup()
    finally:
        s.cleanup()


@test
def a_token_file_readable_by_others_is_refused():
    s = Squishd(workers="none")
    tmp = s.tmp
    try:
        s.stop()
        os.chmod(os.path.join(tmp, "admin.token"), 0o644)
        r = subprocess.run([SQUISHD, "--listen", "127.0.0.1:0", "--db", os.path.join(tmp, "squish.db"),
                            "--workers", "none"], capture_output=True, timeout=10)
        assert r.returncode == 1 and b"chmod 600" in r.stderr, r
    finally:
        s.cleanup()


@test
def sigterm_under_traffic_answers_every_request_exactly_once():
    """Batches run longer than the drain timeout when SIGTERM comes: each
    request sent gets one answer, 200 or 503 (squishd used to
    answer a running batch's requests at the abort and again when the lost
    worker's items came back from the core: a second answer and a use after
    free, which the ASan build turns into a non-zero exit)."""
    s = Squishd(workers="emu:2", extra=["--drain-timeout-ms", "100"])
    try:
        s.wait_ready(workers=2)
        slow = {"name": "slow", "profile": {"alpha_ms": 100, "beta_ms": 400}, "max_batch": 4}
        r = s.request("POST", "/models", body=json.dumps(slow),
                      headers={"Authorization": "Bearer " + s.token,
                               "Content-Type": "application/json"})
        assert r.status == 201, r
        import io
        from PIL import Image
        buf = io.BytesIO()
        Image.new("RGB", (64, 48), (200, 30, 90)).save(buf, "JPEG")
        photo = buf.getvalue()
        outcomes, lock, stop = [], threading.Lock(), threading.Event()
        running = threading.Event()

        def client():
            while not stop.is_set():
                conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
                try:
                    conn.connect()
                except OSError:
                    return  # squishd stopped listening: nothing was sent
                try:
                    conn.request("POST", "/v1/models/slow/infer", body=photo,
                                 headers={"X-SLO-Ms": "1500", "Content-Type": "image/jpeg"})
                except OSError:
                    conn.close()
                    return
                try:
                    resp = conn.getresponse()
                    body = resp.read()
                    code = json.loads(body).get("code", "") if resp.status != 200 else ""
                    got = (resp.status, code)
                except (OSError, http.client.HTTPException, ValueError) as e:
                    got = ("lost", type(e).__name__)
                conn.close()
                with lock:
                    outcomes.append(got)
                if got[0] == 200:
                    running.set()

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        eventually(running.is_set, 20, "a first answer")
        time.sleep(0.4)  # batches of 500-800 ms are running now
        assert s.stop(timeout=30) == 0, s.read_log()[-4000:]
        stop.set()
        for t in threads:
            t.join(30)
        ok = sum(1 for o in outcomes if o[0] == 200)
        shut = sum(1 for o in outcomes if o == (503, "shutting_down"))
        # Eight clients on two emulated devices: some are dropped at once
        # because their deadline cannot be met, which is an answer too.
        answers = {(503, "shutting_down"), (503, "deadline")}
        other = [o for o in outcomes if o[0] != 200 and o not in answers]
        assert ok > 0 and shut > 0 and not other, (ok, shut, other)
        log = s.read_log()
        assert "ERROR: AddressSanitizer" not in log and "runtime error" not in log, log[-4000:]
    finally:
        s.cleanup()


@test
def a_clean_shutdown_logs_each_worker_gone_as_asked_not_as_an_error():
    # Issue 24: every clean stop logged "worker gone ... reason=read_error":
    # squishd kept pinging the workers it had told to stop, a PING left
    # unread when a worker closed its socket made the close a reset, and
    # squishd then SIGKILLed the worker on its way out. The asked-for exit
    # is "reason=shutdown" at info, and nothing from the stop on is a
    # warning or an error.
    s = Squishd(workers="cpu:1,emu:1")
    try:
        s.wait_ready(workers=2, timeout=30)
        assert s.get("/v2/health/live").status == 200
        assert s.stop() == 0
        log = s.read_log()
        assert "signal received" in log, log[-3000:]
        stop = log[log.index("signal received"):]
        for device in ("cpu", "emu:0"):
            gone = r"squishd level=info worker gone id=\d+ device=%s pid=\d+ reason=shutdown\n" % (
                re.escape(device))
            assert re.search(gone, stop), (device, stop)
        bad = [ln for ln in stop.splitlines()
               if "read_error" in ln or "level=warn" in ln or "level=error" in ln]
        assert not bad, bad
    finally:
        s.cleanup()


if __name__ == "__main__":
    run()
