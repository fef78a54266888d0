"""bench/gpu/run's first phases: the kit unpacked and checked, the
machine's CUDA libraries found and their versions, and (dry run) the watch
that no kit process maps a library from outside the kit but glibc's and
CUDA's. Standard library only (torch where phase_env asks for it)."""

import glob
import json
import os
import platform
import re
import shutil
import site
import subprocess
import sys
import tarfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import cpu_model  # noqa: E402

CUDA_SONAMES = ["libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13", "libcudnn.so.9"]
GLIBC_LIBS = ("libc.so", "libm.so", "libdl.so", "libpthread.so", "librt.so", "libresolv.so",
              "ld-linux", "libutil.so", "libanl.so", "linux-vdso")
CUDA_LIBS = ("libcuda.so", "libcudart", "libcudnn", "libcublas", "libnvidia", "libnvrtc",
             "libnvJitLink")


def last_lines(text, n=3):
    lines = [x for x in (text or "").strip().splitlines() if x.strip()]
    return " | ".join(lines[-n:])[-600:]


class LibWatch:
    """Dry run: reads /proc/PID/maps of a kit process (and its children)
    while it runs, and records every shared library mapped from outside the
    kit that is neither glibc's nor CUDA's."""

    def __init__(self, run, pid):
        import threading
        self.run, self.pid, self.stop_flag = run, pid, threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def start(self):
        self.thread.start()

    def stop(self):
        self.stop_flag.set()
        self.thread.join(timeout=2)

    def loop(self):
        while not self.stop_flag.is_set():
            check_maps(self.run, [self.pid] + children(self.pid))
            self.stop_flag.wait(0.05)


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def check_maps(run, pids):
    bad = run.res.setdefault("foreign_libraries", [])
    kit = os.path.realpath(os.path.dirname(run.kit_lib))
    for pid in pids:
        try:
            with open("/proc/%d/maps" % pid) as f:
                maps = f.read()
            exe = os.path.realpath("/proc/%d/exe" % pid)
        except OSError:
            continue
        if not exe.startswith(kit):
            continue  # not (yet) a kit binary: the fork before exec
        for line in maps.splitlines():
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            path = parts[5].strip()
            base = os.path.basename(path)
            if not re.search(r"\.so(\.[0-9.]+)?$", base) or not path.startswith("/"):
                continue
            if os.path.realpath(path).startswith(kit) or base.startswith(GLIBC_LIBS) or \
                    base.startswith(CUDA_LIBS):
                continue
            entry = "%s: %s" % (os.path.basename(exe), path)
            if entry not in bad:
                bad.append(entry)


# ---- phases ----

def phase_kit(run):
    a = run.a
    kit = os.path.abspath(a.kit)
    manifest_path = os.path.join(kit, "manifest.json")
    tarball = os.path.join(kit, "squish-kit.tar.xz")
    if not os.path.exists(tarball):
        raise RuntimeError("no kit at %s: build it with scripts/gpu-kit and carry that folder" % kit)
    with open(manifest_path) as f:
        man = json.load(f)
    dest = os.path.join(run.work, "kit")
    with tarfile.open(tarball) as t:
        t.extractall(dest)
    run.kit_bin = os.path.join(dest, "bin")
    run.kit_lib = os.path.join(dest, "lib")
    libc = platform.libc_ver()
    run.res["kit"] = {"commit": man.get("commit"), "built": man.get("built"),
                      "cuda_backend": man.get("cuda_backend"),
                      "glibc_needed": man.get("glibc_needed"),
                      "glibc_here": libc[1], "bytes": os.path.getsize(tarball),
                      "photo": man.get("photo")}
    need = man.get("glibc_needed") or "0"
    if libc[0] == "glibc" and vtuple(libc[1]) < vtuple(need):
        raise RuntimeError("this machine's glibc %s is older than the kit's %s" % (libc[1], need))
    if not a.dry_run and not man.get("cuda_backend"):
        raise RuntimeError("the kit was built without the cuda backend (no CUDA where it was built)")
    run.say("kit %s (%s), %.1f MiB, glibc %s needed, %s here" % (
        man.get("commit"), man.get("built"), os.path.getsize(tarball) / 2**20, need, libc[1]))


def vtuple(v):
    return tuple(int(x) for x in re.findall(r"\d+", v or "0"))


def site_dirs():
    dirs = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:
        pass
    return [d for d in dirs if os.path.isdir(d)]


def find_cuda(run):
    """Dirs holding each CUDA library the kit's worker needs: the python's
    NVIDIA wheels first (what torch itself loads), then a toolkit."""
    cands = []
    for sp in site_dirs():
        for so in glob.glob(os.path.join(sp, "nvidia", "**", "lib*.so*"), recursive=True):
            cands.append(os.path.dirname(so))
        cands.append(os.path.join(sp, "torch", "lib"))
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append(os.path.join(os.environ[env], "lib64"))
    cands += ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
              "/usr/lib/x86_64-linux-gnu"]
    seen, dirs, found = set(), [], {}
    for d in cands:
        d = os.path.realpath(d)
        if d in seen or not os.path.isdir(d):
            continue
        seen.add(d)
        for so in CUDA_SONAMES:
            if so not in found and os.path.exists(os.path.join(d, so)):
                found[so] = os.path.join(d, so)
                if d not in dirs:
                    dirs.append(d)
    # The rest of the NVIDIA wheels (nvrtc, which cuDNN's runtime-compiled
    # engines load, may lie apart from cudart) after them.
    for sp in site_dirs():
        for so in sorted(glob.glob(os.path.join(sp, "nvidia", "**", "lib*.so*"), recursive=True)):
            d = os.path.realpath(os.path.dirname(so))
            if d not in dirs:
                dirs.append(d)
    return dirs, found


VERSIONS_PY = r"""
import ctypes, json, sys
found = json.loads(sys.argv[1])
out = {}
def load(so):
    return ctypes.CDLL(found[so], mode=ctypes.RTLD_GLOBAL)
try:
    rt = load("libcudart.so.13")
    v = ctypes.c_int(0)
    rt.cudaRuntimeGetVersion(ctypes.byref(v)); out["cudart"] = v.value
    rt.cudaDriverGetVersion(ctypes.byref(v)); out["driver_cuda"] = v.value
    n = ctypes.c_int(0)
    out["devices"] = n.value if rt.cudaGetDeviceCount(ctypes.byref(n)) == 0 else 0
    out["devices"] = n.value
except Exception as e:
    out["cudart_error"] = str(e)
try:
    load("libcublasLt.so.13")
    bl = load("libcublas.so.13")
    parts = []
    for k in range(3):
        v = ctypes.c_int(0)
        bl.cublasGetProperty(k, ctypes.byref(v)); parts.append(str(v.value))
    out["cublas"] = ".".join(parts)
except Exception as e:
    out["cublas_error"] = str(e)
try:
    dnn = load("libcudnn.so.9")
    dnn.cudnnGetVersion.restype = ctypes.c_size_t
    out["cudnn"] = int(dnn.cudnnGetVersion())
except Exception as e:
    out["cudnn_error"] = str(e)
print(json.dumps(out))
"""


def phase_env(run):
    env = {"python": sys.version.split()[0], "platform": platform.platform(),
           "cpu": cpu_model(), "cores": os.cpu_count()}
    import numpy
    import torch
    env["torch"] = torch.__version__
    env["numpy"] = numpy.__version__
    try:
        import torchvision
        env["torchvision"] = torchvision.__version__
    except ImportError as e:
        env["torchvision"] = "missing: %s" % e
    env["torch_cuda"] = torch.version.cuda
    env["torch_cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    dirs, found = find_cuda(run)
    run.cuda_dirs = dirs
    env["cuda_libraries"] = found
    missing = [so for so in CUDA_SONAMES if so not in found]
    if missing:
        env["cuda_missing"] = missing
    if shutil.which("nvidia-smi"):
        p = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
        run.say(p.stdout)
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                            "clocks.max.sm,power.limit", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        env["nvidia_smi"] = q.stdout.strip()
    if len(found) == len(CUDA_SONAMES):
        p = subprocess.run([sys.executable, "-c", VERSIONS_PY, json.dumps(found)],
                           capture_output=True, text=True, timeout=60)
        try:
            env["versions"] = json.loads(p.stdout)
        except ValueError:
            env["versions"] = {"error": (p.stdout + p.stderr)[-1000:]}
    run.res["env"] = env
    run.say(json.dumps(env, indent=1))
    if not run.a.dry_run:
        if missing:
            raise RuntimeError("CUDA libraries not found: %s (looked in the python's nvidia "
                               "wheels and CUDA toolkits)" % ", ".join(missing))
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no GPU")


