"""The machine a run's times were measured on, named the way results.json and a sweep's cost
ledger record it."""

import platform


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers (Linux's /proc/cpuinfo), else what
    `platform` knows."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            fields = dict(line.split(":", 1) for line in cpuinfo if ":" in line and line.strip())
    except OSError:
        return cpu
    named = {k.strip(): v.strip() for k, v in fields.items()}
    cpu = named.get("model name", cpu)
    if "cpu family" in named and "model" in named:
        cpu += f" (family {named['cpu family']} model {named['model']})"
    return cpu
