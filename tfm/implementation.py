"""Which implementation of its operations the paper core runs: the one place that chooses.

Two settings choose, and both are resolved here, once per model:

- `kernels`: which op set runs the few operations a backend kit may replace (`Ops`):
  - "reference": Flax's and JAX's own ops on every backend (`REFERENCE`);
  - "xla_cpu": the XLA:CPU kit (`tfm.xla_cpu`) on every backend: the same values, computed and
    differentiated in forms measured faster and leaner on XLA:CPU;
  - "auto" (the default): the kit where the program runs on the CPU, the reference anywhere
    else, chosen when the program is lowered (`jax.lax.platform_dependent`), not from the
    process's default backend, so a program exported with `jax.export` for `cuda` or `tpu` on
    a CPU-only host holds the reference ops only.
- `ModelConfig.attention`: Eq. 1 as tfm's own einsums ("reference") or through
  `jax.nn.dot_product_attention` ("xla", "cudnn"); `tfm.attention` computes both.

`kernels` is not part of the model: every op set makes the same parameter tree, so a checkpoint
trained with one loads and continues with the other.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax

from tfm import attention, loss

KERNELS = ("auto", "reference", "xla_cpu")
ATTENTION_IMPLEMENTATIONS = typing.get_args(attention.Implementation)


@dataclasses.dataclass(frozen=True)
class Ops:
    """The operations the paper core calls where a backend's kit may substitute its own; each
    field defaults to the reference (Flax's or JAX's own), so a kit names only what it measured.
    Every field computes the same function as the reference's; only speed, memory and the form
    of the gradient may differ.

    Attributes:
      LayerNorm: a module class with `nn.LayerNorm`'s fields (epsilon, dtype, param_dtype) and
        parameters ("scale", "bias").
      Dropout: a module class with `nn.Dropout`'s `rate` and call `(x, deterministic)`, drawing
        its mask from the "dropout" RNG stream exactly as `nn.Dropout` does.
      dot_general_cls: `nn.Dense`'s hook (None: `lax.dot_general`).
      relu: max(0, x).
      masked_softmax: `(logits, mask) -> weights`, softmax over the allowed keys, 0 elsewhere.
      tied_logits: `(x [..., d_model], E [vocab, d_model]) -> float32 [..., vocab]`.
      output_loss: `(states, E, targets, smoothing) -> (loss sum, nll sum)`, the loss of
        section 5.4 on the pre-softmax linear layer of section 3.4.
    """

    LayerNorm: Callable[..., nn.Module] = nn.LayerNorm
    Dropout: Callable[..., nn.Module] = nn.Dropout
    dot_general_cls: Any = None
    relu: Callable[[jax.Array], jax.Array] = jax.nn.relu
    masked_softmax: Callable[[jax.Array, jax.Array], jax.Array] = attention.masked_softmax
    tied_logits: Callable[[jax.Array, jax.Array], jax.Array] = loss.tied_logits
    output_loss: Callable[..., tuple[jax.Array, jax.Array]] = loss.output_loss_sums


REFERENCE = Ops()


def check(kernels: str) -> str:
    """`kernels` if it is a known setting; a ValueError naming the choices otherwise."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}; got {kernels!r}")
    return kernels


@functools.cache
def resolve(kernels: str) -> Ops:
    """The op set of a setting ("auto": each op picks per platform when the program is
    lowered). Called once per model (`Transformer.setup`); its layers receive the result."""
    if check(kernels) == "reference":
        return REFERENCE
    from tfm import xla_cpu  # the kit is loaded only when a setting asks for it

    return Ops(**(xla_cpu.KIT if kernels == "xla_cpu" else xla_cpu.CPU_ONLY))


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
