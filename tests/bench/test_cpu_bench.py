#!/usr/bin/python3
"""squish-cpu-bench on a model of two outputs (a detector's boxes and
scores have two): it times every batch asked and writes each output of a
--check run, one after the other (no timing is checked). The timed runs
gave the plan one output buffer, and the second was written through the
stack. TAP (tests/integration/harness.py). The binary: $SQUISH_CPU_BENCH."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import numpy as np  # noqa: E402

import tiny_models as tm  # noqa: E402
from harness import run, test  # noqa: E402


@test
def a_two_output_model_is_timed_and_checked_at_every_batch():
    bench = os.environ["SQUISH_CPU_BENCH"]
    model, reference = tm.upsampler()
    with tempfile.TemporaryDirectory(prefix="squish-cpu-bench-test-") as tmp:
        path = os.path.join(tmp, "decoder.onnx")
        with open(path, "wb") as f:
            f.write(model)
        x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32)
        x.tofile(os.path.join(tmp, "in.f32"))
        out = os.path.join(tmp, "out.f32")
        r = subprocess.run([bench, "--threads", "1", "--iters", "3", "--warmup", "1", "--batch",
                            "1", "--batch", "2", "--check", "2", os.path.join(tmp, "in.f32"), out,
                            path], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (r.returncode, r.stderr[-500:])
        rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        assert [row["batch"] for row in rows] == [1, 2], rows
        got = np.fromfile(out, dtype=np.float32)
        up, deconv = reference(x.astype(np.float64))
        want = np.concatenate([up.ravel(), deconv.ravel()])
        assert got.shape == want.shape, (got.shape, want.shape)
        assert np.abs(got - want).max() <= 1e-4, np.abs(got - want).max()


if __name__ == "__main__":
    run()
