"""Layer normalization, the masked softmax of Eq. 1 and the FFN's ReLU with their gradients
written out (`jax.custom_vjp`), so that the backward pass keeps only what it needs.

Autodiff keeps every operand its backward rules read: for `flax.linen.LayerNorm` both x - mean and
the broadcast rsqrt(var + eps) * scale, each `[tokens, d_model]`; for the masked softmax the
broadcast mask and the unmasked weights beside the weights returned. Here the backward of

- `layer_norm` keeps the input and the per-token mean and 1 / std `[...]`;
- `masked_softmax` keeps the weights (dlogits = w * (dw - sum(w * dw)) is 0 wherever w is);
- `relu` keeps the signs of its input as bits, eight to a byte.

The forward computations are those of the functions they replace, op for op, so the values are
the same; the gradients are the same functions, rounded differently. Measured on the training
steps of `benchmarks/compare.py` (both programs in one process, alternating steps): XLA:CPU's
scratch 471 -> 405 MiB at BASE (31 MiB from the norms, 36 from the softmaxes), 362 -> 319 MiB at
SMALL; steps 1.09x (BASE) and 1.03x (SMALL) faster.

Autodiff's ReLU keeps the FFN's pre-activation x W1 + b `[tokens, d_ff]` beside its output (which
the W2 product's gradient needs anyway) to test x > 0 in the backward. Keeping the output or a
boolean x > 0 instead saves nothing: XLA:CPU fuses their cheap producers into the backward's
consumers, which then read x W1 again. The packed bits come out of a reduction, which it does not
duplicate, so x W1 dies in the forward: XLA:CPU's scratch 405 -> 363 MiB at BASE, 235 -> 204 MiB
at SMALL (at the paper's 25k-token batches, 2.2 GiB over BASE's six encoder and six decoder FFNs).
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


# ---------------------------------------------------------------------------------------------
# Layer normalization (Ba et al. 2016), as section 5.4 applies it around every sub-layer.


def _layer_norm_statistics(x: Array) -> tuple[Array, Array]:
    """Mean and variance over the last axis in float32, var = E[x^2] - E[x]^2 clipped at 0 (the
    statistics of `flax.linen.LayerNorm`, `use_fast_variance`)."""
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = jnp.mean(x, axis=-1)
    mean_of_squares = jnp.mean(jax.lax.square(x), axis=-1)
    return mean, jnp.maximum(0.0, mean_of_squares - jax.lax.square(mean))


def _layer_norm_forward(x: Array, scale: Array, bias: Array, epsilon: float, dtype):
    mean, variance = _layer_norm_statistics(x)
    inverse_std = jax.lax.rsqrt(variance + epsilon)  # [...]
    y = (x - mean[..., None]) * (inverse_std[..., None] * scale) + bias
    return y.astype(dtype), (x, mean, inverse_std, scale)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def layer_norm(x: Array, scale: Array, bias: Array, epsilon: float, dtype) -> Array:
    """LayerNorm(x) = (x - mean) / sqrt(var + epsilon) * scale + bias over the last axis of
    `[..., d]` x, statistics in float32, the result in `dtype`."""
    return _layer_norm_forward(x, scale, bias, epsilon, dtype)[0]


def _layer_norm_backward(epsilon, dtype, residuals, dy):
    """With x_hat = (x - mean) / std and g = dy * scale: dx = (g - mean(g) - x_hat mean(g x_hat))
    / std, dscale = sum(dy x_hat), dbias = sum(dy), sums over every axis but the last."""
    x, mean, inverse_std, scale = residuals
    x_hat = (x - mean[..., None]) * inverse_std[..., None]
    dy = dy.astype(x_hat.dtype)
    g = dy * scale
    dx = inverse_std[..., None] * (
        g
        - jnp.mean(g, axis=-1, keepdims=True)
        - x_hat * jnp.mean(g * x_hat, axis=-1, keepdims=True)
    )
    leading = tuple(range(dy.ndim - 1))
    dscale = jnp.sum(dy * x_hat, axis=leading)
    dbias = jnp.sum(dy, axis=leading)
    return dx.astype(x.dtype), dscale.astype(scale.dtype), dbias.astype(scale.dtype)


layer_norm.defvjp(_layer_norm_forward, _layer_norm_backward)


class LayerNorm(nn.Module):
    """`flax.linen.LayerNorm` over the last axis (same "scale" and "bias" parameters, same
    values) through `layer_norm`."""

    epsilon: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        features = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (features,), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (features,), self.param_dtype)
        return layer_norm(x, scale, bias, self.epsilon, self.dtype)


# ---------------------------------------------------------------------------------------------
# The softmax of Eq. 1 over allowed keys.


def _masked_softmax_forward(logits: Array, mask: Array):
    mask = jnp.broadcast_to(mask, logits.shape)
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    weights = jnp.where(mask, jax.nn.softmax(logits, axis=-1), 0.0)
    return weights, weights


@jax.custom_vjp
def masked_softmax(logits: Array, mask: Array) -> Array:
    """softmax over the last axis of `[..., kv_len]` logits restricted to keys where the bool
    `mask` (broadcastable) is True; 0 elsewhere, and a row with no allowed key is all 0."""
    return _masked_softmax_forward(logits, mask)[0]


def _masked_softmax_backward(weights: Array, dweights: Array):
    """dlogits = w * (dw - sum_k w_k dw_k): 0 for every masked key, where w is 0."""
    dlogits = weights * (dweights - jnp.sum(weights * dweights, axis=-1, keepdims=True))
    return dlogits, None  # the mask is not differentiated


masked_softmax.defvjp(_masked_softmax_forward, _masked_softmax_backward)


# ---------------------------------------------------------------------------------------------
# The ReLU of section 3.3's FFN.


def _bit_values() -> Array:
    """1, 2, 4, ..., 128 as uint8 `[8, 1]`: bit i of a byte, one per row of a group of eight."""
    return (jnp.uint8(1) << jnp.arange(8, dtype=jnp.uint8))[:, None]


def _pack_positive(x: Array) -> Array:
    """Where x > 0, as bits packed eight to a byte across rows: `[..., n]` x, taken as `[rows,
    n]` and padded to 8 r rows, -> uint8 `[r, n]` whose byte [j, k] holds row 8 j + i in bit i.
    Across rows rather than along n, a group's eight rows are added whole, vectorised along n;
    groups of consecutive rows stay on the device that holds them when the batch is sharded."""
    positive = (x > 0).reshape(-1, x.shape[-1])
    groups = -(-positive.shape[0] // 8)
    positive = jnp.pad(positive, [(0, 8 * groups - positive.shape[0]), (0, 0)])
    bits = positive.astype(jnp.uint8).reshape(groups, 8, x.shape[-1])
    return jnp.sum(bits * _bit_values(), axis=1, dtype=jnp.uint8)


def _unpack(packed: Array, shape: tuple[int, ...]) -> Array:
    """`_pack_positive`'s inverse: uint8 `[r, n]` -> bool `shape`."""
    bits = (packed[:, None, :] & _bit_values()) != 0
    return bits.reshape(-1, shape[-1])[: math.prod(shape[:-1])].reshape(shape)


@jax.custom_vjp
def relu(x: Array) -> Array:
    """max(0, x), whose gradient dy * [x > 0] (0 at x = 0, as `jax.nn.relu`'s) is computed from
    the sign bits of x kept packed, 1/32 of a float32 x."""
    return jax.nn.relu(x)


def _relu_forward(x: Array) -> tuple[Array, Array]:
    return jax.nn.relu(x), _pack_positive(x)


def _relu_backward(packed: Array, dy: Array) -> tuple[Array]:
    return (jnp.where(_unpack(packed, dy.shape), dy, jnp.zeros_like(dy)),)


relu.defvjp(_relu_forward, _relu_backward)
