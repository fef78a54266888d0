#!/usr/bin/python3
"""Torch side of bench/cpu_bench.sh: the same torchvision models, eval mode,
no_grad, the same thread count and iteration scheme as squish-cpu-bench.
Prints one JSON line per (model, batch), like squish-cpu-bench.

    /usr/bin/python3 bench/torch_bench.py --threads 2 --iters 20 resnet18 ...
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import export_models  # noqa: E402  (the exact models the ONNX files come from)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    # oneDNN flushes denormals; so does torch here, or randomly initialized
    # nets (activations ~1e-9) would measure denormal arithmetic, not torch.
    torch.set_flush_denormal(True)
    batches = a.batch or [1, 8]
    for name in a.models:
        torch.manual_seed(export_models.SEED)
        model = export_models.build(name).eval()
        x = torch.rand(max(batches), 3, 224, 224)
        with torch.no_grad():
            for b in batches:
                xb = x[:b].contiguous()
                for _ in range(3):
                    model(xb)
                ms = []
                c0 = time.process_time()
                for _ in range(a.iters):
                    t = time.perf_counter()
                    model(xb)
                    ms.append((time.perf_counter() - t) * 1e3)
                cpu_ms = (time.process_time() - c0) * 1e3 / a.iters
                ms.sort()
                med = ms[len(ms) // 2]
                print(json.dumps({"engine": "torch", "model": name, "batch": b,
                                  "threads": a.threads, "mean_ms": round(sum(ms) / len(ms), 2),
                                  "median_ms": round(med, 2), "min_ms": round(ms[0], 2),
                                  "images_per_s": round(b * 1000.0 / med, 1),
                                  "cpu_ms": round(cpu_ms, 2)}), flush=True)


if __name__ == "__main__":
    main()
