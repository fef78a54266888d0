#!/usr/bin/python3
"""Counts individual tests across meson test logs: each TAP line of a test
program is one test; a test program that failed without reporting a failing
TAP line (a crash, a timeout, a sanitizer abort) counts as one failure, and
one without TAP lines that meson reports SKIP counts as one skipped.
A file ending in .tap is read as TAP itself (scripts/fuzz writes one): each
"ok"/"not ok" line is a test, and a plan ("1..N") that the lines fall short
of counts the missing ones as failures.
Prints "N passed, M failed" (and ", K skipped")."""

import json
import re
import sys


def count_tap(lines):
    """(passed, failed, skipped) of a TAP stream."""
    ok = nok = sk = 0
    planned = None
    for l in lines:
        m = re.match(r"^1\.\.(\d+)", l)
        if m:
            planned = int(m.group(1))
        elif l.startswith("ok "):
            if "# SKIP" in l or "# skip" in l:
                sk += 1
            else:
                ok += 1
        elif l.startswith("not ok ") and "# TODO" not in l:
            nok += 1
    if planned is None:
        nok += 1  # no plan: the producer died before it wrote one
    elif ok + nok + sk < planned:
        nok += planned - (ok + nok + sk)
    return ok, nok, sk


passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        failed += 1
        continue
    if path.endswith(".tap"):
        ok, nok, sk = count_tap(lines)
        passed += ok
        failed += nok
        skipped += sk
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
            # No TAP: the program's own result is its one test (a SKIP, e.g.
            # exit 77 where what it needs is missing, is skipped, not passed).
            if t["result"] == "SKIP":
                sk = 1
            else:
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
