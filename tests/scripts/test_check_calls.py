#!/usr/bin/env python3
"""scripts/check_calls.py on objects compiled here: it must pass a stack whose
calls go down, and fail a call from a lower layer into a higher one and a
call circle between the files of one layer. TAP. Usage: test_check_calls.py
CHECK_CALLS_PY"""

import os
import subprocess
import sys
import tempfile


def compile_into(d, name, src):
    os.makedirs(d, exist_ok=True)
    c = os.path.join(d, name + ".c")
    with open(c, "w") as f:
        f.write(src)
    subprocess.run(["cc", "-c", c, "-o", os.path.join(d, name + ".c.o")], check=True)


def run(script, *args):
    p = subprocess.run([sys.executable, script] + list(args), capture_output=True, text=True)
    return p.returncode, p.stdout


def main():
    script = sys.argv[1]
    tests = []
    with tempfile.TemporaryDirectory() as tmp:
        low, high, circ = (os.path.join(tmp, n) for n in ("low", "high", "circle"))
        compile_into(low, "base", "int low_fn(int x) { return x + 1; }\n")
        compile_into(high, "top", "int low_fn(int);\nint high_fn(int x) { return low_fn(x) * 2; }\n")
        rc, out = run(script, "--layers", "low=" + low, "high=" + high)
        tests.append(("a call down from a higher layer passes", rc == 0 and "not ok" not in out, out))

        # The same stack with a call up: low/up.c calls high_fn.
        compile_into(low, "up", "int high_fn(int);\nint up_fn(int x) { return high_fn(x); }\n")
        rc, out = run(script, "--layers", "low=" + low, "high=" + high)
        tests.append(("a call from a lower layer up to a higher one fails, naming it",
                      rc == 1 and "low/up -> high/top: high_fn" in out, out))

        compile_into(circ, "a", "int b_fn(int);\nint a_fn(int x) { return x ? b_fn(x - 1) : 0; }\n")
        compile_into(circ, "b", "int a_fn(int);\nint b_fn(int x) { return a_fn(x); }\n")
        rc, out = run(script, circ)
        tests.append(("a call circle between two files fails, naming them",
                      rc == 1 and "# circle: a b" in out, out))
    print("1..%d" % len(tests))
    failed = 0
    for n, (name, ok, out) in enumerate(tests, 1):
        print("%s %d - %s" % ("ok" if ok else "not ok", n, name))
        if not ok:
            failed += 1
            for ln in out.splitlines():
                print("# " + ln)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
