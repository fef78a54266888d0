"""Model churn under traffic: prefix-group variants and a lone model are
uploaded and deleted at random (a fixed seed) on one cpu worker and one
emulated worker, one of which is SIGKILLed every few seconds, while six
clients send requests to all of them. Every
request gets exactly one documented answer (200; 404 for a model that is not
there; 503 with Retry-After and a JSON error otherwise), never a 5xx other
than 503, and squishd logs no error or warning and exits 0 (under the
sanitizers too: the ASan build runs this test).

Found before it existed, in a hand-run version of it: a deleted model's id
reused by the next upload, a worker left marked as measuring a withdrawn
model, a load answer taken for a newer load of the same model (batches
sent to a worker that had unloaded it: 500), and the requests of a batch
lost with its worker after their model was deleted (never answered)."""

import collections
import io
import json
import os
import random
import signal
import threading
import time

from PIL import Image

import tiny_models as tm
from harness import Squishd, run, test

SECONDS = 25
KILL_EVERY_S = 4
SEED = int(os.environ.get("SQUISH_CHURN_SEED", "4"))
NAMES = ["va", "vb", "vc", "lone", "emu"]
EMU = {"name": "emu", "profile": {"alpha_ms": 1.0, "beta_ms": 4.0}, "max_batch": 8,
       "default_slo_ms": 300, "input": {"shape": [3, 32, 32]}, "num_classes": 10}


def jpeg():
    out = io.BytesIO()
    Image.effect_noise((64, 64), 60).convert("RGB").save(out, "JPEG")
    return out.getvalue()


@test
def random_uploads_and_deletes_under_traffic_lose_no_request():
    s = Squishd(workers="cpu:1,emu:1")
    try:
        s.wait_ready(workers=2)
        auth = {"Authorization": "Bearer " + s.token}
        blobs = {"va": tm.variant(11), "vb": tm.variant(22, names="b"),
                 "vc": tm.variant(33, names="c"), "lone": tm.tiny(5)}

        def upload(name):
            if name == "emu":
                return s.request("POST", "/models", body=json.dumps(EMU),
                                 headers=dict(auth, **{"Content-Type": "application/json"}))
            body, ctype = tm.multipart([
                ("model", "m.onnx", "application/octet-stream", blobs[name]),
                ("config", "c.json", "application/json", json.dumps({"name": name}).encode())])
            return s.request("POST", "/models", body=body,
                             headers=dict(auth, **{"Content-Type": ctype}))

        img = jpeg()
        seen = collections.Counter()
        bad = []
        stop = time.time() + SECONDS

        def client(k):
            rng = random.Random(SEED * 100 + k)
            while time.time() < stop:
                name = rng.choice(NAMES)
                slo = rng.choice([200, 500, 2000])
                try:
                    r = s.request("POST", "/v1/models/%s/infer" % name, body=img,
                                  headers={"X-SLO-Ms": str(slo)}, timeout=slo / 1000 + 10)
                except Exception as e:  # noqa: BLE001 - a hang or reset is a finding
                    bad.append(("no answer", name, repr(e)))
                    continue
                code = (r.json or {}).get("code")
                seen[(r.status, code)] += 1
                if r.status == 200:
                    continue
                if r.status not in (404, 503) or r.json is None:
                    bad.append((r.status, name, r.raw[:200]))
                elif r.status == 503 and "retry-after" not in r.headers:
                    bad.append(("503 without Retry-After", name, r.raw[:200]))

        clients = [threading.Thread(target=client, args=(k,)) for k in range(6)]
        for t in clients:
            t.start()
        rng = random.Random(SEED)
        kills, last_kill = 0, time.time()
        while time.time() < stop:
            name = rng.choice(NAMES)
            pids = s.worker_pids()
            if time.time() - last_kill > KILL_EVERY_S and pids:
                # A worker dies: what it ran and held is answered or rerun.
                os.kill(pids[rng.choice(sorted(pids))], signal.SIGKILL)
                kills += 1
                last_kill = time.time()
            elif rng.random() < 0.55:
                r = upload(name)
                seen[("upload", r.status)] += 1
                if r.status not in (201, 202, 409):
                    bad.append(("upload", name, r.status, r.raw[:200]))
            else:
                r = s.request("DELETE", "/models/" + name, headers=auth)
                seen[("delete", r.status)] += 1
                if r.status not in (200, 204, 404):
                    bad.append(("delete", name, r.status, r.raw[:200]))
            time.sleep(rng.choice([0.005, 0.02, 0.1, 0.3]))
        for t in clients:
            t.join(60)
        print("# answers: %s" % sorted(seen.items(), key=str), flush=True)
        assert not bad, (bad[:10], dict(seen))
        # The churn did happen, and requests were served through it.
        assert seen[(200, None)] >= 20 and seen[("delete", 200)] >= 5 and kills >= 3, (
            kills, dict(seen))
        assert s.proc.poll() is None, "squishd alive"
        assert s.stop() == 0
        # The test's own SIGKILLs show as "worker lost", or, when one lands
        # as squishd stops, as a worker that exited while stopping on signal 9.
        noisy = [line for line in s.read_log().splitlines()
                 if "level=error" in line or ("level=warn" in line and "squishd" in line
                                              and "worker lost" not in line
                                              and not ("worker exited while stopping" in line
                                                       and "signal=9" in line))]
        assert not noisy, noisy[:10]
    finally:
        s.cleanup()


if __name__ == "__main__":
    run()
