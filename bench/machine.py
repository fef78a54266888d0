"""What the benchmarks say of the machine they ran on (standard library
only: bench/gpu/run imports it on a bare GPU machine too)."""

import platform


def cpu_model():
    """The CPU's model name from /proc/cpuinfo, else platform's guess."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
