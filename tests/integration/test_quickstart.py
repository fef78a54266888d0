"""The README's quick start works as written: its shell block, run against
a squishd of this build (scripts/run's line left out, the address the
block sets replaced by the test's), exports resnet18 with Debian's torch,
uploads it with its labels, classifies a photo over /v1 and over /v2 from
the request file, each answer as the README promises."""

import json
import os
import re
import subprocess

from harness import SOURCE, Skip, Squishd, run, test


def block():
    with open(os.path.join(SOURCE, "README.md")) as f:
        text = f.read()
    qs = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```sh\n(.*?)```", qs, re.S).group(1)


@test
def the_readme_quick_start_classifies_a_photo():
    try:
        subprocess.run(["/usr/bin/python3", "-c", "import torch, torchvision"], check=True,
                       capture_output=True)
    except (subprocess.CalledProcessError, OSError):
        raise Skip("Debian's python3-torchvision is missing (scripts/bootstrap --test installs it)")
    sh = block()
    lines = sh.splitlines()
    assert lines[0].startswith("scripts/run &"), lines[0]
    assert "S=http://127.0.0.1:8000" in lines, "the block sets the address once"
    s = Squishd(workers="cpu:1")
    try:
        work = os.path.join(s.tmp, "qs")
        os.makedirs(os.path.join(work, "var"))
        os.symlink(os.path.join(s.tmp, "admin.token"), os.path.join(work, "var", "admin.token"))
        script = "\n".join(["set -euo pipefail"] + [
            "S=http://127.0.0.1:%d" % s.port if ln == "S=http://127.0.0.1:8000" else ln
            for ln in lines[1:]])
        p = subprocess.run(["bash", "-c", script], cwd=work, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, (p.returncode, p.stderr[-3000:], p.stdout[-3000:])
        # The three answers, in order: the upload's record, /v1's, /v2's.
        dec = json.JSONDecoder()
        answers, rest = [], p.stdout.strip()
        while rest:
            obj, end = dec.raw_decode(rest)
            answers.append(obj)
            rest = rest[end:].strip()
        upload, v1, v2 = answers
        assert upload["name"] == "resnet18" and upload["labels_count"] == 1000, upload
        preds = v1["predictions"][0]
        assert len(preds) == 5 and all(isinstance(x["label"], str) and not x["label"].isdigit()
                                       for x in preds), preds
        out = v2["outputs"][0]
        assert out["shape"] == [1, 3] and len(out["data"]) == 3, v2
        # score:index:label, the label the /v1 answer gives that class
        top = out["data"][0].split(":", 2)
        assert int(top[1]) == preds[0]["index"] and top[2] == preds[0]["label"], (out, preds)
    finally:
        s.stop()


if __name__ == "__main__":
    run()
