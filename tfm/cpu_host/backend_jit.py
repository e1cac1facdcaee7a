"""`jax.jit` with XLA compiler options for the CPU backend only.

XLA:CPU generates the code of every fusion that is not a library call (YNNPACK, Eigen) through
LLVM, at `xla_backend_optimization_level` 3 by default. The decoding programs run many small
such fusions per step (the beam reorder's gathers, top-k over chunks, the search's bookkeeping);
at level 2 they ran faster and compiled sooner, with the same outputs: the main job's test split
1.04-1.08x warm, beam 4 SMALL 1.04-1.05x, greedy unchanged; the beam 4 SMALL program compiled
in 1.40 against 1.57 s (benchmarks/README.md, round thirteen). GPU and TPU compile through their own
pipelines, where nothing was measured, so they keep XLA's defaults.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from typing import Any

import jax

from tfm.cpu_host import saved_programs

DECODING_CPU_OPTIONS = {"xla_backend_optimization_level": 2}
_OWN_FIELDS = frozenset(
    {"_fun", "_cpu_options", "_jit_kwargs", "_jitted", "_lock", "_static", "_programs"}
)
_MISSING = object()


class CpuTunedJit:
    """`jax.jit(fun, **jit_kwargs)`, compiled with `cpu_options` when JAX's default backend is
    the CPU and with XLA's defaults on any other. Any other attribute (`lower`, `eval_shape`,
    ...) is that of the jitted function for the current default backend.

    With JAX's persistent compilation cache on, each program is also saved compiled
    (`tfm.cpu_host.saved_programs`), and a later process loads it instead of tracing it."""

    def __init__(self, fun: Callable, cpu_options: Mapping[str, Any], jit_kwargs: dict):
        self._fun, self._cpu_options, self._jit_kwargs = fun, dict(cpu_options), jit_kwargs
        self._jitted: dict[str, Any] = {}
        # translate.py compiles on a background thread while the caller's thread decodes: one
        # jitted function per backend, or the two would compile the same program twice
        self._lock = threading.Lock()
        self._static = saved_programs.static_parameters(fun, jit_kwargs)
        # signature -> compiled program, or None for one not saved (`tfm.cpu_host.saved_programs`)
        self._programs: dict[tuple, Any] = {}
        functools.update_wrapper(self, fun)

    @property
    def cpu_options(self) -> dict[str, Any]:
        """The compiler options added on the CPU backend."""
        return dict(self._cpu_options)

    def for_backend(self, backend: str):
        """The jitted function used when `backend` ("cpu", "gpu", "tpu") is the default; for
        "nested" (a call inside another jit), the one without compiler options."""
        with self._lock:
            if backend not in self._jitted:
                options = self._cpu_options if backend == "cpu" else None
                self._jitted[backend] = jax.jit(
                    self._fun, compiler_options=options, **self._jit_kwargs
                )
            return self._jitted[backend]

    def __call__(self, *args, **kwargs):
        if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves((args, kwargs))):
            # inside a caller's jit (or export): part of its program, which compiles with the
            # caller's options, for the platform it is lowered for
            return self.for_backend("nested")(*args, **kwargs)
        jitted = self.for_backend(jax.default_backend())
        root = saved_programs.directory()
        if root is None:
            return jitted(*args, **kwargs)
        call = saved_programs.split_call(self._static, args, kwargs)
        try:
            program = self._programs.get(call.signature, _MISSING)
        except TypeError:  # an unhashable static argument: jax.jit says so
            return jitted(*args, **kwargs)
        if program is _MISSING:
            options = self._cpu_options if jax.default_backend() == "cpu" else None
            program = saved_programs.load_or_compile(
                root,
                self._fun,
                self._jit_kwargs,
                options,
                call,
                compile=lambda: jitted.lower(*args, **kwargs).compile(),
            )
            self._programs[call.signature] = program
        if program is None:
            return jitted(*args, **kwargs)
        return program(*call.dynamic_args, **call.dynamic_kwargs)

    def __getattr__(self, name: str):
        if name in _OWN_FIELDS:  # looked up before __init__ set them (copy, pickle)
            raise AttributeError(name)
        return getattr(self.for_backend(jax.default_backend()), name)


def cpu_tuned_jit(
    cpu_options: Mapping[str, Any], **jit_kwargs
) -> Callable[[Callable], CpuTunedJit]:
    """Decorator: `CpuTunedJit(fun, cpu_options, jit_kwargs)`; `jit_kwargs` as `jax.jit`'s."""
    return lambda fun: CpuTunedJit(fun, cpu_options, jit_kwargs)
