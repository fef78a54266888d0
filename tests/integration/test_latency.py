"""The serving contract's latency (issue 23): a request waits only when
waiting buys something. A burst of k concurrent requests to an idle
emulated device (l(b) = b + 5 ms) is answered within 3 l(k) + 10 ms of its
arrival, at a 2000 ms SLO and at 200 ms, not near its SLO; Poisson load at
half the device's capacity stays within its SLO. Times are squishd's own
(the answer's total_ms, arrival to answer), not the Python client's."""

import http.client
import json
import threading
import time

from harness import Skip, Squishd, loadgen, run, sanitized, test, timing

EMU = {"name": "emu", "profile": {"alpha_ms": 1.0, "beta_ms": 5.0}, "max_batch": 64,
       "input": {"shape": [3, 4, 4]}, "num_classes": 3}
TENSOR = b"\0" * (3 * 4 * 4 * 4)


def upload(s, cfg):
    r = s.request("POST", "/models", body=json.dumps(cfg),
                  headers={"Authorization": "Bearer " + s.token,
                           "Content-Type": "application/json"})
    assert r.status == 201, r


def burst(s, n, slo_ms):
    """n requests at once (one connection each): [(status, total_ms)]."""
    ready = threading.Barrier(n)
    out = [None] * n

    def one(i):
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        conn.connect()
        ready.wait()
        conn.request("POST", "/v2/models/emu/infer", body=TENSOR,
                     headers={"Inference-Header-Content-Length": "0",
                              "X-SLO-Ms": str(slo_ms)})
        r = conn.getresponse()
        raw = r.read()
        body = json.loads(raw[:int(r.getheader("Inference-Header-Content-Length", len(raw)))])
        out[i] = (r.status, body.get("parameters", {}).get("total_ms"), body)
        conn.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(o is not None for o in out), "every request answered"
    return out


@test
@timing
def bursts_to_an_idle_device_are_answered_at_once():
    s = Squishd(workers="emu:1")
    try:
        s.wait_ready(workers=1)
        upload(s, EMU)
        assert burst(s, 1, 2000)[0][0] == 200  # loaded and planned
        time.sleep(0.6)
        worst = {}
        # Under the sanitizers, beside another test's measuring on the
        # same two cores, one lone request took 32 ms (7 ms alone): twice
        # the bound there, which still fails a burst held toward its SLO
        # (16 at 200 ms: 146 ms).
        slack = 2 if sanitized() else 1
        for slo in (2000, 200):
            for k in (1, 2, 4, 8, 16):
                bound = slack * (3 * (k + 5) + 10)
                for _ in range(3):
                    for status, total, body in burst(s, k, slo):
                        assert status == 200, body
                        assert total is not None, body
                        worst[slo, k] = max(worst.get((slo, k), 0), total)
                    time.sleep(0.5)
                assert worst[slo, k] <= bound, (
                    "bursts of %d at SLO %d ms: %.1f ms, bound %d ms" % (k, slo, worst[slo, k],
                                                                         bound))
        print("# worst total_ms by (SLO, burst): %s" % {
            "%d/%d" % key: round(v, 1) for key, v in sorted(worst.items())})
        assert s.stop() == 0
    finally:
        s.cleanup()


@test
def half_the_device_capacity_stays_within_the_slo():
    # Capacity at SLO 200 ms: batches of 64 in l(64) = 69 ms, 927 req/s.
    if sanitized():
        raise Skip("464 req/s for 10 s needs a release build")
    s = Squishd(workers="emu:1")
    try:
        s.wait_ready(workers=1)
        upload(s, EMU)
        assert burst(s, 1, 200)[0][0] == 200
        out = loadgen(s, "emu", 464, 10, slo_ms=200, warmup=1, seed=7)
        good, n = out["good"], out["requests"]
        print("# 50%% of capacity: %d of %d good, p50 %.1f ms, p99 %.1f ms" % (
            good, n, out["latency_ms"]["p50"], out["latency_ms"]["p99"]))
        assert good >= 0.999 * n, out
        assert s.stop() == 0
    finally:
        s.cleanup()



@test
def every_answer_says_the_slo_it_was_served_under():
    # Issue 23: a 200 carried nothing that said which SLO applied, nor
    # whether it was late. Headers x-slo-ms and x-slo-source (request, model,
    # server or none), OIP parameters slo_source, slo_ms and late_ms (0: in
    # time); a late
    # answer also gets x-slo-late-ms.
    s = Squishd(workers="emu:1")
    try:
        s.wait_ready(workers=1)
        upload(s, EMU)
        upload(s, dict(EMU, name="emu_d", default_slo_ms=700))
        # Without default_slo_ms or an SLO asked: best effort (test_slo.py).
        for model, hdrs, slo, source in (("emu", {"X-SLO-Ms": "300"}, 300, "request"),
                                         ("emu_d", {}, 700, "model")):
            r = s.request("POST", "/v2/models/%s/infer" % model, body=TENSOR,
                          headers=dict({"Inference-Header-Content-Length": "0"}, **hdrs))
            assert r.status == 200, r
            hl = int(r.headers.get("inference-header-content-length", len(r.raw)))
            body = json.loads(r.raw[:hl])
            assert r.headers["x-slo-source"] == source, (model, r.headers)
            if slo is not None:
                assert float(r.headers["x-slo-ms"]) == slo, r.headers
            assert body["parameters"]["slo_ms"] == float(r.headers["x-slo-ms"]), body
            assert body["parameters"]["late_ms"] == 0, body
            assert body["parameters"]["slo_source"] == source, body
            assert "x-slo-late-ms" not in r.headers, r.headers
        assert s.stop() == 0
    finally:
        s.cleanup()

if __name__ == "__main__":
    run()
