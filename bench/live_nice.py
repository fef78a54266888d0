#!/usr/bin/python3
"""Is a live batch slower than its profile because of squishd's own threads
on the same cores? (issue 26, item 3)

    /usr/bin/python3 bench/live_nice.py BUILD_DIR MODEL.onnx [--closed 2]
        [--rounds 3] [--nice -10|fifo] [--seconds 5]

Starts squishd with one cpu worker, uploads the model and waits for its
profile, then runs closed loops of --closed requests in flight (binary FP32
tensors, a 60 s SLO), alternating rounds with the worker's threads at nice
0 and at --nice (root only). Prints, per round and batch size with at least
5 batches, the mean live compute time (batch_stats compute_infer, the
difference over the round) and its ratio to the profile's l(b). If the
worker's priority changes the ratio, the cores' other tenants are the
cause.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))


def renice(pid, nice):
    """nice: a nice value, or "fifo" (SCHED_FIFO priority 1: the worker's
    threads run whenever they are runnable, before squishd and the client)."""
    for t in os.listdir("/proc/%s/task" % pid):
        if nice == "fifo":
            os.sched_setscheduler(int(t), os.SCHED_FIFO, os.sched_param(1))
        else:
            os.sched_setscheduler(int(t), os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, int(t), nice)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("model")
    ap.add_argument("--closed", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nice", default="-10", help="a nice value, or fifo")
    ap.add_argument("--seconds", type=float, default=5)
    a = ap.parse_args()
    os.environ["SQUISH_BUILD_DIR"] = os.path.abspath(a.build)
    import harness
    import live_profile
    import tiny_models as tm

    s = harness.Squishd(workers="cpu")
    try:
        s.wait_ready(workers=1, timeout=30)
        name = live_profile.upload_and_wait(s, tm, a.model, 8)
        auth = {"Authorization": "Bearer " + s.token}
        l, shape = live_profile.profile_of(s, auth, name)
        pids = subprocess.run(["pgrep", "-f", "squish-worker"], capture_output=True,
                              text=True).stdout.split()

        def stats():
            st = s.get("/v2/models/%s/stats" % name).json["model_stats"][0]
            return {b["batch_size"]: (b["compute_infer"]["count"], b["compute_infer"]["ns"])
                    for b in st["batch_stats"]}

        for rnd in range(a.rounds):
            for nice in (0, a.nice if a.nice == "fifo" else int(a.nice)):
                for p in pids:
                    renice(p, nice)
                before = stats()
                live_profile.closed_loop(s, harness, name, shape, a.closed, a.seconds)
                after = stats()
                cells = []
                for b in sorted(after):
                    n = after[b][0] - before.get(b, (0, 0))[0]
                    ns = after[b][1] - before.get(b, (0, 0))[1]
                    if n >= 5 and b in l:
                        ms = ns / n / 1e6
                        cells.append("batch %d: %.2f ms x%.2f (%d)" % (b, ms, ms / l[b], n))
                print("round %d nice %4s: %s" % (rnd + 1, nice, "; ".join(cells)), flush=True)
    finally:
        s.stop()
        s.cleanup()


if __name__ == "__main__":
    main()
