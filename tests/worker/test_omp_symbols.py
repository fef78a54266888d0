#!/usr/bin/python3
"""The worker's OpenMP runtime (worker/omp_pool.c) implements what libdnnl
calls of libgomp, and the worker exports it (TAP).

    test_omp_symbols.py SQUISH_WORKER OMP_POOL_SYMS

omp_pool.c stands in for libgomp only where libdnnl's references bind to
the executable's definitions: a oneDNN built to call more of libgomp
(GOMP_single_start, GOMP_critical_start, a newer GOMP_parallel_*) would
call libgomp's own for those, outside any team libgomp knows, and run
wrong. This fails then, naming the symbols to implement. The list of what the
pool implements is worker/omp_pool.syms, the file the link exports.
"""
import re
import subprocess
import sys


def ours(syms_path):
    with open(syms_path) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    return set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*;", text))


def symbols(path, which):
    out = subprocess.run(["nm", "-D", which, path], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def main():
    worker = sys.argv[1]
    pool = ours(sys.argv[2])
    ldd = subprocess.run(["ldd", worker], capture_output=True, text=True, check=True).stdout
    m = re.search(r"libdnnl\.so\S* => (\S+)", ldd)
    print("1..3")
    if not m:
        print("not ok 1 - libdnnl found in ldd %s" % worker)
        print("ok 2 # SKIP no libdnnl\nok 3 # SKIP no libdnnl")
        return
    print("ok 1 - libdnnl: %s" % m.group(1))
    wanted = {s for s in symbols(m.group(1), "--undefined-only")
              if s.startswith(("GOMP_", "GOACC_", "omp_", "kmp_", "__kmpc"))}
    missing = sorted(wanted - pool)
    print(("ok" if not missing else "not ok") +
          " 2 - libdnnl calls only what omp_pool.c implements (%s)%s"
          % (", ".join(sorted(wanted)), "; missing: " + ", ".join(missing) if missing else ""))
    exported = symbols(worker, "--defined-only")
    absent = sorted(pool - exported)
    print(("ok" if not absent else "not ok") +
          " 3 - squish-worker exports the runtime%s" % ("; absent: " + ", ".join(absent)
                                                       if absent else ""))


if __name__ == "__main__":
    main()
