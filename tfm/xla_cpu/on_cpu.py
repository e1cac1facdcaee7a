"""The kit's operations where the program runs on the CPU and the reference's anywhere else,
chosen per operation when the program is lowered (`jax.lax.platform_dependent`): the "auto"
setting of `tfm.implementation` for a model applied directly. (The training steps and searches
choose once for their whole program instead, `tfm.implementation.per_platform`.)

Each module has the reference module's name, fields and parameters, so a model's parameter tree
and its dropout RNG streams are the same under every setting.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfm import attention
from tfm import loss as reference_loss
from tfm.xla_cpu import dense, dropout, lean_ops, loss, matmul

Array = jax.Array


def _on_cpu(kit_fn, reference_fn):
    return lambda *args: jax.lax.platform_dependent(*args, cpu=kit_fn, default=reference_fn)


class LayerNorm(nn.Module):
    """`nn.LayerNorm` over the last axis, by `tfm.xla_cpu.lean_ops.layer_norm` on the CPU."""

    epsilon: float = 1e-6
    dtype: jnp.dtype | None = None
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        features = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (features,), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (features,), self.param_dtype)
        reference = nn.LayerNorm(
            epsilon=self.epsilon, dtype=self.dtype, param_dtype=self.param_dtype, parent=None
        )
        dtype = self.dtype or jnp.result_type(x, self.param_dtype)
        return jax.lax.platform_dependent(
            x,
            scale,
            bias,
            cpu=lambda x, s, b: lean_ops.layer_norm(x, s, b, self.epsilon, dtype),
            default=lambda x, s, b: reference.apply({"params": {"scale": s, "bias": b}}, x),
        )


class Dropout(nn.Module):
    """`nn.Dropout` (the same mask from the same key), by `tfm.xla_cpu.dropout` on the CPU."""

    rate: float

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        if self.rate == 0.0 or deterministic:
            return x
        reference = nn.Dropout(self.rate, parent=None)
        return jax.lax.platform_dependent(
            x,
            self.make_rng("dropout"),
            cpu=lambda x, key: dropout.dropout(x, key, self.rate),
            default=lambda x, key: reference.apply({}, x, deterministic=False, rng=key),
        )


class DotGeneral(dense.KitDotGeneral):
    """`nn.Dense`'s product as `tfm.xla_cpu.dense.KitDotGeneral` forms it, by the kit's `linear`
    on the CPU and the plain product elsewhere (chosen straight from the dense layer, with no
    call of tfm's between)."""

    product = staticmethod(
        functools.partial(jax.lax.platform_dependent, cpu=matmul.linear, default=jnp.dot)
    )


def _output_loss(states, table, targets, smoothing):
    return jax.lax.platform_dependent(
        states,
        table,
        targets,
        cpu=lambda s, t, y: loss.output_loss_sums(s, t, y, smoothing),
        default=lambda s, t, y: reference_loss.output_loss_sums(s, t, y, smoothing),
    )


# the kit's fields (`tfm.xla_cpu.KIT`), each chosen per platform
OPS = dict(
    LayerNorm=LayerNorm,
    Dropout=Dropout,
    dot_general_cls=DotGeneral,
    relu=_on_cpu(lean_ops.relu, jax.nn.relu),
    masked_softmax=_on_cpu(lean_ops.masked_softmax, attention.masked_softmax),
    tied_logits=_on_cpu(matmul.tied_logits, reference_loss.tied_logits),
    output_loss=_output_loss,
)
