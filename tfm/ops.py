"""The operations the paper core calls where a backend's kit may put its own: `Ops`, and the
reference set, Flax's and JAX's own (`REFERENCE`). `tfm.kernels` chooses among the sets."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax

from tfm import attention, loss


@dataclasses.dataclass(frozen=True)
class Ops:
    """The operations the paper core calls where a backend's kit may substitute its own. Every
    field computes the same function as the reference's; only speed, memory and the form of the
    gradient may differ.

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

    LayerNorm: Callable[..., nn.Module]
    Dropout: Callable[..., nn.Module]
    dot_general_cls: Any
    relu: Callable[[jax.Array], jax.Array]
    masked_softmax: Callable[[jax.Array, jax.Array], jax.Array]
    tied_logits: Callable[[jax.Array, jax.Array], jax.Array]
    output_loss: Callable[..., tuple[jax.Array, jax.Array]]


REFERENCE = Ops(
    LayerNorm=nn.LayerNorm,
    Dropout=nn.Dropout,
    dot_general_cls=None,
    relu=jax.nn.relu,
    masked_softmax=attention.masked_softmax,
    tied_logits=loss.tied_logits,
    output_loss=loss.output_loss_sums,
)
