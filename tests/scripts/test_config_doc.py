#!/usr/bin/env python3
"""docs/configuration.md's reference is the code's, as scripts/config_doc.py
generates it from gateway/config.c's option table, worker/main.c's and the
JSON schemas: every setting listed once with its default, none stale; and
the check fails when a default or a help text changes in config.c, or a
schema field is added, without the page being regenerated. TAP.
Usage: test_config_doc.py SOURCE_ROOT"""

import os
import re
import shutil
import subprocess
import sys
import tempfile


def check(root):
    return subprocess.run([sys.executable, os.path.join(root, "scripts", "config_doc.py"),
                           "--check"], capture_output=True, text=True)


def copy_tree(root, tmp):
    """The files the generator reads, and the page, in a scratch tree."""
    os.makedirs(os.path.join(tmp, "gateway"))
    os.makedirs(os.path.join(tmp, "worker"))
    os.makedirs(os.path.join(tmp, "docs"))
    shutil.copytree(os.path.join(root, "scripts"), os.path.join(tmp, "scripts"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(os.path.join(root, "schemas"), os.path.join(tmp, "schemas"))
    shutil.copy(os.path.join(root, "gateway", "config.c"), os.path.join(tmp, "gateway"))
    for fn in os.listdir(os.path.join(root, "gateway")):
        if fn.endswith(".h"):
            shutil.copy(os.path.join(root, "gateway", fn), os.path.join(tmp, "gateway"))
    for fn in os.listdir(os.path.join(root, "worker")):
        if fn == "main.c" or fn.endswith(".h"):
            shutil.copy(os.path.join(root, "worker", fn), os.path.join(tmp, "worker"))
    shutil.copy(os.path.join(root, "docs", "configuration.md"), os.path.join(tmp, "docs"))


def edit(path, old, new):
    with open(path) as f:
        text = f.read()
    assert old in text, (path, old)
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))


def main():
    root = sys.argv[1]
    ok = []
    p = check(root)
    ok.append((p.returncode == 0,
               "docs/configuration.md is what config.c, main.c and schemas/ give " + p.stderr.strip()))

    with open(os.path.join(root, "gateway", "config.c")) as f:
        names = re.findall(r'^\s*\{"([a-z_0-9]+)",', f.read(), re.M)
    with open(os.path.join(root, "docs", "configuration.md")) as f:
        doc = f.read()
    listed = re.findall(r"^\| `--([a-z0-9-]+)` \| `SQUISH_", doc, re.M)
    want = [n.replace("_", "-") for n in names]
    ok.append((listed == want and len(listed) > 40,
               "every squishd setting is listed once, in the table's order (missing %s, stale %s)"
               % (sorted(set(want) - set(listed)), sorted(set(listed) - set(want)))))
    row = re.search(r"^\| `--http-threads` \| `SQUISH_HTTP_THREADS` \| integer \| `(\d+)` \| "
                    r"(\d+)\.\.(\d+) \|", doc, re.M)
    ok.append((row is not None and row.groups() == ("1", "1", "64"),
               "a row gives the default and the bounds of config.c (--http-threads 1, 1..64)"))

    with tempfile.TemporaryDirectory() as tmp:
        copy_tree(root, tmp)
        p = check(tmp)
        ok.append((p.returncode == 0, "the scratch copy passes before any edit " + p.stderr.strip()))
        cfg = os.path.join(tmp, "gateway", "config.c")
        # A default changed in the table, the page not regenerated.
        with open(cfg) as f:
            orig = f.read()
        m = re.search(r'(\{"http_threads", INT\(http_threads\), 1, 64, )"(\d+)"', orig)
        edit(cfg, m.group(0), m.group(1) + '"%d"' % (int(m.group(2)) + 1))
        p = check(tmp)
        ok.append((p.returncode == 1 and "config_doc.py --write" in p.stderr,
                   "a default changed in gateway/config.c fails the check"))
        # A help text changed.
        with open(cfg, "w") as f:
            f.write(orig)
        edit(cfg, '"HTTP event-loop threads"', '"HTTP event-loop threads (one per core)"')
        p = check(tmp)
        ok.append((p.returncode == 1, "a help text changed in gateway/config.c fails the check"))
        # A new option.
        with open(cfg, "w") as f:
            f.write(orig)
        edit(cfg, '    {"http_threads",',
             '    {"brand_new", INT(http_threads), 0, 1, "0", "a new setting"},\n    {"http_threads",')
        p = check(tmp)
        ok.append((p.returncode == 1, "an option added to gateway/config.c fails the check"))
        # --write brings the page back in step, and names the new option.
        subprocess.run([sys.executable, os.path.join(tmp, "scripts", "config_doc.py"), "--write"],
                       check=True)
        p = check(tmp)
        with open(os.path.join(tmp, "docs", "configuration.md")) as f:
            regenerated = f.read()
        ok.append((p.returncode == 0 and "`--brand-new` | `SQUISH_BRAND_NEW`" in regenerated,
                   "--write regenerates the page, which then passes"))
        # A schema field added (config.c and the page as they were).
        with open(cfg, "w") as f:
            f.write(orig)
        shutil.copy(os.path.join(root, "docs", "configuration.md"), os.path.join(tmp, "docs"))
        edit(os.path.join(tmp, "schemas", "pipeline_spec.schema.json"), '"slo_ms": {',
             '"brand_new": {"type": "integer"},\n    "slo_ms": {')
        p = check(tmp)
        ok.append((p.returncode == 1, "a field added to a schema fails the check"))

    print("1..%d" % len(ok))
    for i, (good, what) in enumerate(ok, 1):
        print("%s %d - %s" % ("ok" if good else "not ok", i, what))
    return 0 if all(g for g, _ in ok) else 1


if __name__ == "__main__":
    sys.exit(main())
