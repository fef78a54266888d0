#!/usr/bin/env python3
"""scripts/check_calls.py on objects compiled here: it must pass a stack whose
calls go down, and fail a call from a lower layer into a higher one and a
call circle between the files of one layer, also one closed by a call
through a function pointer that a table or an assignment binds; an allowed
circle passes, a new or a vanished one fails. TAP. Usage:
test_check_calls.py CHECK_CALLS_PY"""

import json
import os
import shutil
import subprocess
import sys
import tempfile


def compile_into(d, name, src, src_dir=None):
    """d/NAME.c.o from src, written to src_dir/NAME.c (default d)."""
    src_dir = src_dir or d
    os.makedirs(d, exist_ok=True)
    os.makedirs(src_dir, exist_ok=True)
    c = os.path.join(src_dir, name + ".c")
    with open(c, "w") as f:
        f.write(src)
    subprocess.run(["cc", "-c", c, "-o", os.path.join(d, name + ".c.o")], check=True)
    return c


# A dispatcher-like pair: a.c calls b.c directly; b.c calls up into a.c only
# through the member "up" of a table of function pointers (gw_dispatch_ops_t's
# shape) that a.c binds.
OPS_H = """typedef struct { int (*up)(int); int (*other)(int); } ops_t;
typedef struct { const ops_t *ops; ops_t direct; int (*plain)(int); } holder_t;
"""
A_TABLE = OPS_H + """int b_fn(const holder_t *h, int x);
static int a_up(int x) { return x - 1; }
static const ops_t a_ops = {.other = 0, .up = a_up};
int a_fn(int x) { holder_t h = {.ops = &a_ops}; return b_fn(&h, x); }
"""
A_ASSIGN = OPS_H + """int b_fn(const holder_t *h, int x);
int a_up(int x) { return x - 1; }
int a_fn(int x) { holder_t h; h.plain = &a_up; h.direct.up = a_up; return b_fn(&h, x); }
"""
B_NO_POINTER_CALL = OPS_H + """int b_fn(const holder_t *h, int x) { return h != 0 ? x : 0; }
"""
B_VIA_TABLE = OPS_H + """int b_fn(const holder_t *h, int x) { return x > 0 ? h->ops->up(x) : 0; }
"""
B_VIA_STRUCT = OPS_H + """int b_fn(const holder_t *h, int x) { return x > 0 ? h->direct.up(x) : 0; }
"""
B_VIA_DEREF = OPS_H + """int b_fn(const holder_t *h, int x) { return x > 0 ? (*h->plain)(x) : 0; }
"""
B_ONLY_MENTIONS = OPS_H + """/* never h->ops->up(x) here */
const char *b_text = "h->ops->up(x)";
int b_fn(const holder_t *h, int x) { return h->ops != 0 && b_text[0] != ')' ? x : 0; }
"""


def run(script, *args):
    p = subprocess.run([sys.executable, script] + list(args), capture_output=True, text=True)
    return p.returncode, p.stdout


def pointer_tests(script):
    tests = []
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "room")

        def pair(a_src, b_src):
            shutil.rmtree(d, ignore_errors=True)
            compile_into(d, "a", a_src)
            compile_into(d, "b", b_src)
            return run(script, d)

        rc, out = pair(A_TABLE, B_NO_POINTER_CALL)
        tests.append(("a table bound but not called through makes no circle",
                      rc == 0 and "not ok" not in out, out))
        rc, out = pair(A_TABLE, B_VIA_TABLE)
        tests.append(("a circle closed through a designated-initializer table fails, naming "
                      "the member and the function",
                      rc == 1 and "# circle: a b" in out and "b -> a: ->up=>a_up" in out, out))
        rc, out = pair(A_ASSIGN, B_VIA_STRUCT)
        tests.append(("a circle closed through a member assigned a function (x.m.up = fn) fails",
                      rc == 1 and "# circle: a b" in out and "b -> a: ->up=>a_up" in out, out))
        rc, out = pair(A_ASSIGN, B_VIA_DEREF)
        tests.append(("a circle closed through (*h->plain)(x), plain = &fn, fails",
                      rc == 1 and "b -> a: ->plain=>a_up" in out, out))
        rc, out = pair(A_TABLE, B_ONLY_MENTIONS)
        tests.append(("a member named in a comment or a string is no call",
                      rc == 0 and "not ok" not in out, out))

        # The allow-list: the circle a b is known; a, b and c is not.
        pair(A_TABLE, B_VIA_TABLE)
        rc, out = run(script, "--allow-circle", "room:a,b", d)
        tests.append(("an allowed circle passes and is named",
                      rc == 0 and "# known circle (allowed): a b" in out, out))
        rc, out = run(script, "--allow-circle=room:a,b,c", d)
        tests.append(("a circle inside an allowed one passes, saying the list can shrink",
                      rc == 0 and "shrink the list" in out, out))
        compile_into(d, "c", "int b_fn(const void *, int);\nint c_fn(int x) { return b_fn(0, x); }\n")
        compile_into(d, "a", A_TABLE.replace("return b_fn(&h, x);",
                                            "return c_fn(x) + b_fn(&h, x);")
                     .replace("int b_fn(", "int c_fn(int);\nint b_fn("))
        rc, out = run(script, "--allow-circle", "room:a,b", d)
        tests.append(("a new file joining an allowed circle fails",
                      rc == 1 and "# circle: a b c" in out, out))
        pair(A_TABLE, B_NO_POINTER_CALL)
        rc, out = run(script, "--allow-circle", "room:a,b", d)
        tests.append(("an allowed circle that is gone fails, asking to remove it",
                      rc == 1 and "no longer found (remove it from the allow-list): a b" in out, out))
        rc, out = run(script, "--allow-circle", "elsewhere:a,b", d)
        tests.append(("an allowed circle in a layer not checked is a usage error", rc == 2, out))

        # Sources found as a meson build finds them: compile_commands.json at
        # the top of the build, the objects in a directory of their own.
        build, src = os.path.join(tmp, "build"), os.path.join(tmp, "src")
        objs = os.path.join(build, "room.a.p")
        entries = []
        for name, text in (("a", A_TABLE), ("b", B_VIA_TABLE)):
            c = compile_into(objs, name, text, src_dir=src)
            entries.append({"directory": build, "file": os.path.relpath(c, build),
                            "output": os.path.join("room.a.p", name + ".c.o"),
                            "command": "cc -c"})
        with open(os.path.join(build, "compile_commands.json"), "w") as f:
            json.dump(entries, f)
        rc, out = run(script, objs)
        tests.append(("the sources are found through compile_commands.json",
                      rc == 1 and "b -> a: ->up=>a_up" in out, out))
        os.remove(os.path.join(build, "compile_commands.json"))
        rc, out = run(script, objs)
        tests.append(("an object whose source cannot be found fails, saying so",
                      rc == 1 and "no source found for a" in out, out))
    return tests


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

    tests += pointer_tests(script)
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
