#!/usr/bin/env python3
"""docs/operations.md's error-code table is the code's (common/sq_error.h), as
scripts/error_table.py generates it: every code with its HTTP status, none
missing, none stale; and the check fails when the two differ. TAP.
Usage: test_error_table.py SOURCE_ROOT"""

import os
import re
import shutil
import subprocess
import sys
import tempfile


def main():
    root = sys.argv[1]
    script = os.path.join(root, "scripts", "error_table.py")
    ok = []
    p = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True)
    ok.append((p.returncode == 0,
               "docs/operations.md's table is the one sq_error.h gives " + p.stderr.strip()))
    with open(os.path.join(root, "common", "sq_error.h")) as f:
        names = set(re.findall(r'X\(\w+,\s*"([a-z_]+)"', re.sub(r"\\\n", " ", f.read())))
    with open(os.path.join(root, "docs", "operations.md")) as f:
        doc = f.read()
    listed = set(re.findall(r"^\| \d{3} \| `([a-z_]+)` \|", doc, re.M))
    ok.append((names - {"ok"} == listed and len(listed) > 20,
               "every code is listed once (missing %s, stale %s)"
               % (sorted(names - {"ok"} - listed), sorted(listed - names))))
    # A code added to the header and not to the page fails the check.
    with tempfile.TemporaryDirectory() as tmp:
        for d in ("scripts", "common", "docs"):
            os.makedirs(os.path.join(tmp, d))
        shutil.copy(script, os.path.join(tmp, "scripts"))
        shutil.copy(os.path.join(root, "scripts", "doc_markers.py"), os.path.join(tmp, "scripts"))
        shutil.copy(os.path.join(root, "docs", "operations.md"), os.path.join(tmp, "docs"))
        with open(os.path.join(root, "common", "sq_error.h")) as f:
            h = f.read().replace('X(OK, "ok", 200, "success")',
                                 'X(OK, "ok", 200, "success") X(NEW, "brand_new", 418, "x")')
        with open(os.path.join(tmp, "common", "sq_error.h"), "w") as f:
            f.write(h)
        p = subprocess.run([sys.executable, os.path.join(tmp, "scripts", "error_table.py"),
                            "--check"], capture_output=True, text=True)
        ok.append((p.returncode == 1, "a code missing from docs/operations.md fails the check"))
    print("1..%d" % len(ok))
    for i, (good, what) in enumerate(ok, 1):
        print("%s %d - %s" % ("ok" if good else "not ok", i, what))
    return 0 if all(g for g, _ in ok) else 1


if __name__ == "__main__":
    sys.exit(main())
