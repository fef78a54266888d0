"""Overload: twice the capacity for 30 s. The capacity is set by an
emulated device (batch 8 in 40 ms: 200 requests/s), far below what this
squishd's HTTP side or the load generator need, so the test measures the
gateway's shedding, not the host. Goodput under 2x stays within 5% of the
peak over the 30 s and within 20% in every 5 s window, every request gets exactly one answer (200, or 503 with
Retry-After), and squishd's memory stays flat. About a minute; in the
"slow" suite (not run under the sanitizers)."""

import json
import re
import threading

import harness
from harness import Squishd, run, test

# l(b) = 4 b + 8 ms, max batch 8: l(8) = 40 ms, 2 l(8) <= 200 ms: one
# device serves at most 8 / 40 ms = 200 requests/s within the SLO.
SLO_MS = 200
CAPACITY = 200.0
CAP = {"name": "cap", "profile": {"alpha_ms": 4.0, "beta_ms": 8.0}, "max_batch": 8,
       "default_slo_ms": SLO_MS, "input": {"shape": [3, 4, 4]}, "num_classes": 3}


def loadgen(s, rate, seconds, warmup=2):
    return harness.loadgen(s, "cap", rate, seconds, slo_ms=SLO_MS, warmup=warmup, seed=7,
                           per_second=True)


def vm_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def exactly_one_answer_each(res):
    assert res["errors"] == 0 and res["timeouts"] == 0 and res["conn_errors"] == 0, res
    assert res["unsent"] == 0 and res["stray_answers"] == 0 and res["no_retry_after"] == 0, res
    assert res["good"] + res["late"] + res["dropped"] == res["requests"], res


@test
def twice_the_capacity_for_30_s_keeps_goodput_and_memory_flat():
    s = Squishd(workers="emu:1")
    try:
        s.wait_ready(workers=1)
        r = s.request("POST", "/models", body=json.dumps(CAP),
                      headers={"Authorization": "Bearer " + s.token,
                               "Content-Type": "application/json"})
        assert r.status == 201, r
        loadgen(s, CAPACITY / 2, 2, warmup=0)  # placed and loaded

        # Peak goodput: at the capacity and a little past it.
        peaks = []
        for rate in (CAPACITY, 1.25 * CAPACITY):
            res = loadgen(s, rate, 8)
            exactly_one_answer_each(res)
            peaks.append(res["goodput_rps"])
        peak = max(peaks)
        assert peak > 0.85 * CAPACITY, ("the device sets the capacity", peaks)

        # Twice the capacity for 30 s, squishd's RSS and in-flight count
        # sampled every second.
        rss, inflight, stop = [], [], threading.Event()

        def sample():
            while not stop.wait(1.0):
                rss.append(vm_rss_kb(s.proc.pid))
                text = s.get("/metrics", timeout=5).raw.decode()
                inflight.append(int(re.search(r"^squish_inflight_requests (\d+)", text,
                                              re.M).group(1)))

        sampler = threading.Thread(target=sample)
        sampler.start()
        res = loadgen(s, 2 * CAPACITY, 30)
        stop.set()
        sampler.join(10)
        print("# peak goodput %s req/s at %s; 2x: goodput %.1f req/s, %d good, %d dropped, "
              "%d late of %d" % (peaks, (CAPACITY, 1.25 * CAPACITY), res["goodput_rps"],
                                 res["good"], res["dropped"], res["late"], res["requests"]))
        print("# good per second: %s" % res["per_second"]["good"][:30])
        print("# VmRSS kB per second: %s" % rss)
        print("# in flight per second: %s" % inflight)

        exactly_one_answer_each(res)
        assert res["dropped"] > 0.3 * res["requests"], ("half of 2x must be shed", res)
        # 0.93: shedding half the requests costs CPU on the same 2 shared
        # cores as the device and the load; CI once saw 0.948 (187.3 of
        # 197.5) where a quiet run holds 0.98-1.0. A collapse is far below.
        assert res["goodput_rps"] >= 0.93 * peak, (res["goodput_rps"], peak)
        # Sustained, not an average over a collapse: every 5 s window at
        # 80% of the peak or more. Without shedding, goodput at 2x falls
        # towards zero within seconds; a stall of the shared host costs a
        # window 10-15% (CI once saw 157, 180, 168 good/s in a row, 0.899
        # of the peak over that window, while the 30 s held 0.97).
        good = res["per_second"]["good"][:30]
        for w in range(0, 30, 5):
            assert sum(good[w:w + 5]) / 5 >= 0.8 * peak, (w, good, peak)
        # Queues bounded by the deadlines: in flight about rate x SLO.
        assert max(inflight) <= 2 * (2 * CAPACITY) * SLO_MS / 1000, inflight
        # Memory flat: the last 10 s no higher than the first 10 s plus 10%
        # and 2 MiB.
        assert len(rss) >= 28, rss
        first, last = max(rss[:10]), max(rss[-10:])
        assert last <= 1.1 * first + 2048, (first, last, rss)
        assert s.stop() == 0
    finally:
        s.cleanup()


if __name__ == "__main__":
    run()
