#!/usr/bin/python3
"""A 600 KB FP32 input sent as Triton's binary HTTP tensor against the same
tensor handed over in system shared memory (Triton's shared-memory
extension), same squishd, same run, interleaved rounds (A/B/A/B): requests
per second and squishd's CPU per request for each.

    bench/live/shm_ab.py BUILD [--clients 4] [--rounds 2] [--duration 5]
        [--warmup 1] [--shape 3,224,224]

squishd (BUILD/gateway/squishd, one emulated worker of near-zero latency,
so that the device is never the limit) serves a model whose input is FP32
[1, 3, 224, 224] = 602,112 bytes. N client processes each run a closed loop
(one request in flight each) over one keep-alive HTTP/1.1 connection:

- binary: POST /v2/models/big/infer, a JSON header then the tensor's bytes
  (Inference-Header-Content-Length), as tritonclient.http sends
  binary_data=True inputs;
- shm: the client writes the tensor into its own POSIX shared-memory object
  (registered once as a region, with the admin token) and POSTs a JSON
  header naming it (parameters.shared_memory_region, _byte_size), as
  tritonclient.http does after set_shared_memory.

Both answer the model's 10 output floats as JSON. squishd's CPU is utime +
stime of /proc/<pid>/stat (all its threads) over the measured window
(after the warm-up), divided by the requests answered in it, and the share
of it that is system time; the clients' CPU (their own getrusage over the
window) is shown too, since they share the machine. Prints one JSON line
per run, then a markdown table.
Debian's /usr/bin/python3, stdlib only.
"""
import argparse
import json
import mmap
import multiprocessing
import os
import resource
import socket
import statistics
import sys
import time
from multiprocessing import shared_memory

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_live as R  # noqa: E402

MODEL = "big"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_times(pid):
    """(utime, stime) of a process (every thread), in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def cpu_seconds(pid):
    return sum(cpu_times(pid))


class Conn:
    """One keep-alive HTTP/1.1 connection, as light as can be: the client's
    CPU is not what is measured."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def post(self, path, headers, body):
        head = "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n%s\r\n" % (
            path, len(body), "".join("%s: %s\r\n" % kv for kv in headers.items()))
        self.sock.sendall(head.encode() + body if len(body) < 65536 else head.encode())
        if len(body) >= 65536:
            self.sock.sendall(body)
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for ln in lines[1:]:
            k, _, v = ln.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        while len(self.buf) < length:
            self.buf += self._recv()
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, body

    def _recv(self):
        d = self.sock.recv(1 << 16)
        if not d:
            raise ConnectionError("closed")
        return d


def client(mode, port, idx, input_name, shape, tensor, start, end, warm_end, out):
    """One closed-loop client; puts its window's counts on out."""
    conn = Conn(port)
    path = "/v2/models/%s/infer" % MODEL
    nbytes = len(tensor)
    region = None
    if mode == "shm":
        # Its object, made by the parent (the clients are forked: no
        # SharedMemory here, whose resource tracker would unlink it).
        with open("/dev/shm/" + shm_name(os.getppid(), idx), "r+b") as f:
            region = mmap.mmap(f.fileno(), nbytes)
        body = json.dumps({"inputs": [{"name": input_name, "shape": [1] + shape,
                                       "datatype": "FP32", "parameters": {
                                           "shared_memory_region": "c%d" % idx,
                                           "shared_memory_byte_size": nbytes}}]}).encode()
        headers = {"Content-Type": "application/json"}
    else:
        head = json.dumps({"inputs": [{"name": input_name, "shape": [1] + shape,
                                       "datatype": "FP32",
                                       "parameters": {"binary_data_size": nbytes}}]}).encode()
        body = head + tensor
        headers = {"Content-Type": "application/octet-stream",
                   "Inference-Header-Content-Length": str(len(head))}
    while time.time() < start:
        time.sleep(0.001)
    n, bad, lat = 0, 0, []
    cpu0 = None
    while True:
        now = time.time()
        if now >= end:
            break
        if cpu0 is None and now >= warm_end:
            ru = resource.getrusage(resource.RUSAGE_SELF)
            cpu0 = ru.ru_utime + ru.ru_stime
        if region is not None:
            region[:nbytes] = tensor  # the client makes its tensor in the region
        t0 = time.time()
        status, _ = conn.post(path, headers, body)
        t1 = time.time()
        if warm_end <= t1 < end:
            if status == 200:
                n += 1
                lat.append(t1 - t0)
            else:
                bad += 1
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu = ru.ru_utime + ru.ru_stime - (cpu0 if cpu0 is not None else 0)
    if region is not None:
        region.close()
    out.put({"n": n, "bad": bad, "lat": lat, "cpu": cpu})


def shm_name(pid, idx):
    return "squish-shm-ab-%d-%d" % (pid, idx)


def run(a, d, mode, input_name, tensor):
    shape = [int(x) for x in a.shape.split(",")]
    q = multiprocessing.Queue()
    start = time.time() + 0.5
    warm_end = start + a.warmup
    end = warm_end + a.duration
    procs = [multiprocessing.Process(target=client, args=(mode, d.port, i, input_name, shape,
                                                          tensor, start, end, warm_end, q))
             for i in range(a.clients)]
    for p in procs:
        p.start()
    while time.time() < warm_end:
        time.sleep(0.001)
    (u0, s0), wcpu0 = cpu_times(d.proc.pid), sum(cpu_seconds(w) for w in worker_pids(d))
    while time.time() < end:
        time.sleep(0.001)
    (u1, s1), wcpu1 = cpu_times(d.proc.pid), sum(cpu_seconds(w) for w in worker_pids(d))
    cpu0, cpu1 = u0 + s0, u1 + s1
    res = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join()
    n = sum(r["n"] for r in res)
    lat = sorted(x for r in res for x in r["lat"])
    return {"mode": mode, "clients": a.clients, "requests": n,
            "errors": sum(r["bad"] for r in res), "req_s": round(n / a.duration, 1),
            "squishd_cpu_us_per_req": round((cpu1 - cpu0) / n * 1e6, 1) if n else None,
            "squishd_cores": round((cpu1 - cpu0) / a.duration, 2),
            "squishd_system_share": round((s1 - s0) / (cpu1 - cpu0), 2) if cpu1 > cpu0 else None,
            "worker_cpu_us_per_req": round((wcpu1 - wcpu0) / n * 1e6, 1) if n else None,
            "clients_cpu_us_per_req": round(sum(r["cpu"] for r in res) / n * 1e6, 1)
            if n else None,
            "p50_ms": round(statistics.median(lat) * 1e3, 2) if lat else None,
            "p99_ms": round(lat[int(0.99 * (len(lat) - 1))] * 1e3, 2) if lat else None,
            "load1": round(os.getloadavg()[0], 1)}


def worker_pids(d):
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == d.proc.pid:
                    out.append(int(pid))
        except (OSError, IndexError, ValueError):
            continue
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=5)
    p.add_argument("--warmup", type=float, default=1)
    p.add_argument("--shape", default="3,224,224")
    a = p.parse_args()
    shape = [int(x) for x in a.shape.split(",")]
    print("# %s; %s" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), R.machine()),
          flush=True)
    # Requests without an SLO (best effort): every policy dispatches them at
    # once, so the numbers are squishd's work, not a wait.
    d = R.Squishd(a.build, "emu:1", "adaptive")
    regions = []
    try:
        d.add_model({"name": MODEL, "profile": {"alpha_ms": R.TINY_ALPHA_MS,
                                                "beta_ms": R.TINY_BETA_MS},
                     "max_batch": 64, "input": {"shape": shape}, "num_classes": 10})
        deadline = time.time() + 30
        while R.request(d.port, "GET", "/v2/models/%s/ready" % MODEL)[0] != 200:
            if time.time() > deadline:
                raise RuntimeError("model not ready")
            time.sleep(0.05)
        input_name = json.loads(R.request(d.port, "GET", "/v2/models/" + MODEL)[1])[
            "inputs"][0]["name"]
        n = 1
        for s in shape:
            n *= s
        # Some tensor: the values do not matter to an emulated model.
        tensor = bytes(range(256)) * (4 * n // 256) + bytes(4 * n % 256)
        token = open(os.path.join(d.tmp, "admin.token")).read().strip()
        for i in range(a.clients):
            shm = shared_memory.SharedMemory(name=shm_name(os.getpid(), i), create=True,
                                             size=len(tensor))
            regions.append(shm)
            status, body = R.request(
                d.port, "POST", "/v2/systemsharedmemory/region/c%d/register" % i,
                json.dumps({"key": "/" + shm.name, "offset": 0, "byte_size": len(tensor)}),
                {"Authorization": "Bearer " + token, "Content-Type": "application/json"})
            if status != 200:
                raise RuntimeError("register: %d %s" % (status, body[:300]))
        runs = []
        for rnd in range(a.rounds):
            for mode in ("binary", "shm"):
                r = run(a, d, mode, input_name, tensor)
                r["round"] = rnd + 1
                print(json.dumps(r), flush=True)
                runs.append(r)
    finally:
        d.stop()
        for shm in regions:
            shm.close()
            shm.unlink()
    print()
    print("| input (%s bytes FP32) | req/s (per round) | squishd CPU us/request (per round) | "
          "squishd cores busy | squishd system time share | worker CPU us/request | "
          "clients' CPU us/request | p50 / p99 ms (per round) | errors |"
          % format(len(tensor), ","))
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, label in (("binary", "binary HTTP (Triton's binary tensor extension)"),
                        ("shm", "system shared memory (Triton's extension)")):
        rs = [r for r in runs if r["mode"] == mode]
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %d |" % (
            label, ", ".join("%.0f" % r["req_s"] for r in rs),
            ", ".join("%.0f" % r["squishd_cpu_us_per_req"] for r in rs),
            ", ".join("%.2f" % r["squishd_cores"] for r in rs),
            ", ".join("%.0f%%" % (100 * r["squishd_system_share"]) for r in rs),
            ", ".join("%.0f" % r["worker_cpu_us_per_req"] for r in rs),
            ", ".join("%.0f" % r["clients_cpu_us_per_req"] for r in rs),
            ", ".join("%.2f / %.2f" % (r["p50_ms"], r["p99_ms"]) for r in rs),
            sum(r["errors"] for r in rs)))


if __name__ == "__main__":
    main()
