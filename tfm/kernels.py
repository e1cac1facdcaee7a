"""The `kernels` setting: which implementation of a few operations the paper core runs.

- "reference": Flax's and JAX's own ops on every backend: `nn.LayerNorm`, `nn.Dropout`,
  `lax.dot_general` inside `nn.Dense`, `jax.nn.relu`, `jax.nn.softmax` over the allowed keys,
  and the log-softmax label-smoothed loss of `tfm.loss`.
- "xla_cpu": the XLA:CPU kit (`tfm.xla_cpu`) on every backend: the same values, computed and
  differentiated in forms measured faster and leaner on XLA:CPU.
- "auto" (the default): the kit where the program runs on the CPU, the reference anywhere else.
  The choice is made when the program is lowered (`jax.lax.platform_dependent`), not from the
  process's default backend, so a program exported with `jax.export` for `cuda` or `tpu` on a
  CPU-only host holds the reference ops only.

The setting is not part of the model: both paths make the same parameter tree, so a checkpoint
trained with one loads and continues with the other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax

from tfm.ops import REFERENCE, Ops

KERNELS = ("auto", "reference", "xla_cpu")


def check(kernels: str) -> str:
    """`kernels` if it is a known setting; a ValueError naming the choices otherwise."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}; got {kernels!r}")
    return kernels


def ops_for(kernels: str) -> Ops:
    """The operations of a setting ("auto" picks per op, when the program is lowered)."""
    if check(kernels) == "reference":
        return REFERENCE
    from tfm import xla_cpu  # the kit is loaded only when a setting asks for it

    return xla_cpu.KIT if kernels == "xla_cpu" else xla_cpu.CPU_ONLY


def per_platform(fn: Callable, model, *args):
    """`fn(model, *args)` with an "auto" model's choice made once for the whole of `fn`: the
    kit's model where the program runs on the CPU, the reference's anywhere else.

    Choosing per op inside a differentiated function would make the program carry both choices'
    saved residuals (zeros of the other's shapes); steps, losses and searches therefore choose
    here, around everything they differentiate or loop over.
    """
    if model.kernels != "auto":
        return fn(model, *args)
    on_cpu = functools.partial(fn, model.clone(kernels="xla_cpu"))
    elsewhere = functools.partial(fn, model.clone(kernels="reference"))
    return jax.lax.platform_dependent(*args, cpu=on_cpu, default=elsewhere)


__all__ = ["KERNELS", "REFERENCE", "Ops", "check", "ops_for", "per_platform"]
