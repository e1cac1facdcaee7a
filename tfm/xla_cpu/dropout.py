"""Dropout (section 5.4, P_drop) with the masks of `flax.linen.Dropout`, drawn faster on XLA:CPU.

`nn.Dropout` draws its mask with `jax.random.bernoulli`, whose Threefry-2x32 hash JAX lowers on
CPU as a 5-iteration loop: XLA:CPU runs each iteration as its own passes over `[tokens,
d_model]` words, ~2.5 ms per SMALL dropout site of a training step. Written out here (the same
20 rounds, unrolled), the hash, the comparison and the select fuse into one pass (0.4 ms). The
bits are those `jax.random.bits` gives for the same key, so the masks, and a training run, are
unchanged (tests/test_layers.py compares against `nn.Dropout`); keys of another generator, or
JAX's non-partitionable Threefry layout, take `jax.random.bernoulli` itself.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# Threefry-2x32, 20 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", 2011):
# the rotation constants of its eight rounds, and the key schedule's parity constant
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x: Array, bits: int) -> Array:
    return (x << np.uint32(bits)) | (x >> np.uint32(32 - bits))


def threefry2x32(key: tuple[Array, Array], x0: Array, x1: Array) -> tuple[Array, Array]:
    """The Threefry-2x32 block cipher of counter words (x0, x1) under a two-word key, unrolled:
    20 rounds, the key injected after every 4. Elementwise over the counters' shape."""
    schedule = (key[0], key[1], key[0] ^ key[1] ^ _KEY_PARITY)
    x0, x1 = x0 + schedule[0], x1 + schedule[1]
    for injection in range(1, 6):
        for rotation in _ROTATIONS[(injection - 1) % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, rotation) ^ x0
        x0 = x0 + schedule[injection % 3]
        x1 = x1 + schedule[(injection + 1) % 3] + np.uint32(injection)
    return x0, x1


def _unrolled_applies(key: Array, shape: tuple[int, ...]) -> bool:
    """The bits below equal `jax.random.bits(key, shape)`: a typed Threefry key, JAX's
    partitionable counter layout, and fewer than 2^32 draws (a zero high counter word)."""
    return (
        jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
        and str(jax.random.key_impl(key)) == "threefry2x32"
        and jax.config.jax_threefry_partitionable
        and math.prod(shape) < 2**32
    )


def keep_mask(key: Array, keep_prob: float, shape: tuple[int, ...]) -> Array:
    """`jax.random.bernoulli(key, keep_prob, shape)`: True where a value is kept."""
    if not _unrolled_applies(key, shape):
        return jax.random.bernoulli(key, keep_prob, shape)
    words = jax.random.key_data(key)
    index = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
    high, low = threefry2x32((words[0], words[1]), jnp.zeros_like(index), index)
    # uniform in [0, 1): 23 random mantissa bits under the exponent of 1.0, minus 1.0
    mantissa = ((high ^ low) >> np.uint32(9)) | np.float32(1.0).view(np.uint32)
    uniform = jax.lax.bitcast_convert_type(mantissa, jnp.float32) - np.float32(1.0)
    return uniform < np.float32(keep_prob)


def dropout(x: Array, key: Array, rate: float) -> Array:
    """`nn.Dropout(rate)(x, deterministic=False, rng=key)`: each value zeroed with probability
    `rate`, the kept ones scaled by 1 / (1 - rate)."""
    if rate == 1.0:
        return jnp.zeros_like(x)
    keep_prob = 1.0 - rate
    keep = keep_mask(key, keep_prob, x.shape)
    return jax.lax.select(keep, x / keep_prob, jnp.zeros_like(x))


class Dropout(nn.Module):
    """`nn.Dropout` (same "dropout" RNG stream, same masks): zeroes each value with probability
    `rate` and scales the kept ones by 1 / (1 - rate); the identity when deterministic."""

    rate: float

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        if self.rate == 0.0 or deterministic:
            return x
        return dropout(x, self.make_rng("dropout"), self.rate)
