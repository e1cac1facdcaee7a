"""A process that calls one `CpuTunedJit` program with tfm's compilation cache at argv[1] and
prints JSON: how many times the function was traced, and its result. Two runs on one directory
show whether the second process loaded the program the first saved."""

import json
import sys

import jax.numpy as jnp
import numpy as np

from tfm import compilation_cache
from tfm.cpu_host.backend_jit import CpuTunedJit

traces: list[int] = []


def _affine(x, y, *, scale):
    traces.append(1)  # runs while tracing only
    return {"sum": x * scale + y, "max": jnp.max(x)}


if __name__ == "__main__":
    compilation_cache.enable(sys.argv[1])
    program = CpuTunedJit(
        _affine, {"xla_backend_optimization_level": 2}, {"static_argnames": "scale"}
    )
    out = program(jnp.arange(4.0), np.ones(4, np.float32), scale=3.0)
    print(
        json.dumps(
            dict(traces=len(traces), sum=np.asarray(out["sum"]).tolist(), max=float(out["max"]))
        )
    )
