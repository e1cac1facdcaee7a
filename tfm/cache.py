"""The state of incremental decoding as explicit values: each decoder layer's keys and values
(`LayerCache`), the whole decoder's (`DecodeCache`), and the two pieces of bookkeeping decoding
adds to the paper's layers: writing one position's K/V, and grouping a sentence's beams.

A decoding step takes a cache and returns a new one (`Transformer.decode_step`), so a `lax.scan`
can carry it; nothing lives in a mutable Flax collection.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

Array = jax.Array


def write_position(cache: Array, new: Array, position: Array) -> Array:
    """`new` `[batch, heads, 1, d]` written into `cache` `[batch, heads, max_steps, d]` at
    `position`: one slice update for a scalar, one row each for `[batch]` positions."""
    new = new.astype(cache.dtype)
    if jnp.ndim(position) == 0:
        return jax.lax.dynamic_update_slice_in_dim(cache, new, position, axis=2)
    rows = jnp.arange(cache.shape[0])
    return cache.at[rows, :, position].set(new[:, :, 0], mode="promise_in_bounds")


def visible_positions(max_steps: int, position: Array) -> Array:
    """`[1 or batch, 1, 1, max_steps]` mask of the cache positions <= `position` (a scalar or
    `[batch]`): section 3.2.3's causal mask for one query. Later positions may hold another
    sentence's stale K/V, which it hides."""
    keys = jnp.arange(max_steps)
    return (keys[None, :] <= jnp.reshape(position, (-1, 1)))[:, None, None, :]


def group_beams(x: Array, beams: int) -> Array:
    """`[sentences * beams, 1, ...]` rows -> `[sentences, beams, ...]`: a sentence's beams as
    query positions of one row, so they attend to one copy of its source's K/V (no per-beam
    copies to build, read or reorder). Position-wise layers give the same values either way."""
    return x.reshape(x.shape[0] // beams, beams, *x.shape[2:])


def ungroup_beams(x: Array) -> Array:
    """The inverse of `group_beams`: `[sentences, beams, ...]` -> `[sentences * beams, 1, ...]`."""
    return x.reshape(x.shape[0] * x.shape[1], 1, *x.shape[2:])


@struct.dataclass
class LayerCache:
    """One decoder layer's attention state during incremental decoding.

    Heads first, so each step's per-head products read them without a transpose:
    self_k: `[batch, heads, max_steps, d_k]`, self_v: `[batch, heads, max_steps, d_v]` — the
    decoder's own keys/values, written one position per step (a row per beam in beam search).
    cross_k: `[sentences, heads, src_len, d_k]`, cross_v: `[sentences, heads, src_len, d_v]` —
    this layer's projection of the final encoder output, computed once per sentence.
    """

    self_k: Array
    self_v: Array
    cross_k: Array
    cross_v: Array

    def written(self, k: Array, v: Array, position: Array) -> LayerCache:
        """This cache with one step's self-attention K `[batch, heads, 1, d_k]` and V
        `[batch, heads, 1, d_v]` written at `position` (a scalar or `[batch]`)."""
        return self.replace(
            self_k=write_position(self.self_k, k, position),
            self_v=write_position(self.self_v, v, position),
        )


@struct.dataclass
class DecodeCache:
    """Everything `decode_step` needs besides parameters: per-layer caches and `[batch, src_len]`
    source validity (True for real tokens), which masks padded source positions. Self-attention
    K/V have a row per decoded hypothesis (`[batch * beams]`), cross-attention K/V and the source
    mask one per sentence."""

    layers: tuple[LayerCache, ...]
    src_valid: Array

    @property
    def max_steps(self) -> int:
        """Decoder positions the self-attention caches hold."""
        return self.layers[0].self_k.shape[2]

    def reorder_beams(self, rows: Array) -> DecodeCache:
        """Beam search's reorder: new row r is old row `rows[r]` (`[batch * beam]` flat rows).

        Rows move only within one sentence's beams, so the sentence-constant parts
        (cross-attention K/V, source mask) stay as they are; each self-attention K/V is one
        gather of contiguous `[heads, max_steps, d]` blocks, which XLA lowers to row copies.
        """

        def gather(x: Array) -> Array:
            return x.at[rows].get(mode="promise_in_bounds")

        layers = tuple(
            layer.replace(self_k=gather(layer.self_k), self_v=gather(layer.self_v))
            for layer in self.layers
        )
        return self.replace(layers=layers)
