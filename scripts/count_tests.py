#!/usr/bin/python3
"""Counts individual tests across meson test logs: each TAP line of a test
program is one test; a test program that failed without reporting a failing
TAP line (a crash, a timeout, a sanitizer abort) counts as one failure.
Prints "N passed, M failed" (and ", K skipped")."""

import json
import sys

passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        failed += 1
        continue
    for line in lines:
        t = json.loads(line)
        out = t.get("stdout") or ""
        ok = nok = sk = 0
        for l in out.splitlines():
            if l.startswith("ok "):
                if "# SKIP" in l or "# skip" in l:
                    sk += 1
                else:
                    ok += 1
            elif l.startswith("not ok "):
                if "# TODO" in l:
                    continue
                nok += 1
        good = t["result"] in ("OK", "EXPECTEDFAIL", "SKIP")
        if ok + nok + sk == 0:
            ok, nok = (1, 0) if good else (0, 1)
        elif not good and nok == 0:
            nok = 1
        passed += ok
        failed += nok
        skipped += sk
line = "%d passed, %d failed" % (passed, failed)
if skipped:
    line += ", %d skipped" % skipped
print(line)
sys.exit(1 if failed else 0)
