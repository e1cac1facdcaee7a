"""Scaled dot-product attention (section 3.2.1, Eq. 1) and its masks, as pure functions.

No Flax, no parameters. Shapes follow one convention throughout: queries `[batch, q_len, heads,
d_k]`, keys `[batch, kv_len, heads, d_k]`, values `[batch, kv_len, heads, d_v]`, masks
broadcastable to `[batch, heads, q_len, kv_len]` and True where attending is allowed.

Keys and values may instead be stored heads-first, `[batch, heads, kv_len, d]`
(`kv_layout="heads_first"`): the layout of the decoding caches, which the per-head products of
Eq. 1 read without transposing them at every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp

Array = jax.Array
Implementation = Literal["reference", "xla", "cudnn"]
KVLayout = Literal["length_first", "heads_first"]
_KV_AXES = {"length_first": "bkhd", "heads_first": "bhkd"}


def _kv_axes(kv_layout: KVLayout) -> str:
    if kv_layout not in _KV_AXES:
        raise ValueError(f"kv_layout must be one of {sorted(_KV_AXES)}, got {kv_layout!r}")
    return _KV_AXES[kv_layout]


def key_padding_mask(kv_valid: Array) -> Array:
    """`[batch, 1, 1, kv_len]` mask hiding padded keys only (every query row attends)."""
    return kv_valid[:, None, None, :]


def causal_mask(length: int) -> Array:
    """`[1, 1, length, length]` mask letting position i see positions <= i (section 3.2.3)."""
    return jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))[None, None]


def segment_mask(q_segments: Array, kv_segments: Array) -> Array:
    """`[batch, 1, q_len, kv_len]` mask for packed rows: attend only inside the same segment.

    Segment ids are positive for real tokens and 0 for padding, so padding never attends or is
    attended to.
    """
    same = q_segments[:, None, :, None] == kv_segments[:, None, None, :]
    real = (q_segments[:, None, :, None] > 0) & (kv_segments[:, None, None, :] > 0)
    return same & real


def masked_softmax(logits: Array, mask: Array) -> Array:
    """softmax over the last axis of `[..., kv_len]` logits, restricted to the keys where the
    bool `mask` (broadcastable) is True: 0 for every other key, and all 0 for a row with no
    allowed key (not NaN, not a uniform spread over forbidden keys)."""
    return jax.nn.softmax(logits, axis=-1, where=mask)


def attention_weights(
    q: Array,
    k: Array,
    mask: Array | None = None,
    *,
    kv_layout: KVLayout = "length_first",
    softmax: Callable[[Array, Array], Array] = masked_softmax,
) -> Array:
    """softmax(Q K^T / sqrt(d_k)) of Eq. 1, `[batch, heads, q_len, kv_len]`, always float32.
    `softmax` is `masked_softmax` or a kit's equal of it (`tfm.implementation`)."""
    d_k = q.shape[-1]
    logits = jnp.einsum(
        f"bqhd,{_kv_axes(kv_layout)}->bhqk", q, k, preferred_element_type=jnp.float32
    )
    logits = logits.astype(jnp.float32) / math.sqrt(d_k)
    if mask is None:
        return jax.nn.softmax(logits, axis=-1)
    return softmax(logits, mask)


def weighted_values(weights: Array, v: Array, *, kv_layout: KVLayout = "length_first") -> Array:
    """The "... V" of Eq. 1: `[batch, heads, q_len, kv_len]` weights times `[batch, kv_len, heads,
    d_v]` values -> `[batch, q_len, heads, d_v]` in the dtype of `v`, accumulated in float32."""
    out = jnp.einsum(
        f"bhqk,{_kv_axes(kv_layout)}->bqhd",
        weights.astype(v.dtype),
        v,
        preferred_element_type=jnp.float32,
    )
    return out.astype(v.dtype)


def scaled_dot_product_attention(
    q: Array,
    k: Array,
    v: Array,
    mask: Array | None = None,
    *,
    implementation: Implementation = "reference",
    kv_layout: KVLayout = "length_first",
    softmax: Callable[[Array, Array], Array] = masked_softmax,
    on_weights: Callable[[Array], Array] | None = None,
) -> Array:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (Eq. 1), per head.

    Args:
      q: `[batch, q_len, heads, d_k]`.
      k: `[batch, kv_len, heads, d_k]`.
      v: `[batch, kv_len, heads, d_v]`.
      mask: bool, broadcastable to `[batch, heads, q_len, kv_len]`, True where attending is allowed.
      implementation: "reference" (the einsums here; softmax in float32), or "xla" / "cudnn"
        through `jax.nn.dot_product_attention` (fused kernels on GPU).
      kv_layout: "length_first" (shapes above) or "heads_first" (`k`, `v` are
        `[batch, heads, kv_len, d]`).
      softmax: the masked softmax (`masked_softmax`, or a kit's equal of it).
      on_weights: applied to the `[batch, heads, q_len, kv_len]` weights before they weight V
        (reference implementation only): how a layer records them or applies its own dropout;
        the fused implementations never form the weights (`ModelConfig` refuses attention
        dropout with them).

    Returns:
      `[batch, q_len, heads, d_v]` in the dtype of `v`. Query rows with no allowed key are zero.
    """
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k need the same d_k, got {q.shape[-1]} and {k.shape[-1]}")
    if implementation == "reference":
        weights = attention_weights(q, k, mask, kv_layout=kv_layout, softmax=softmax)
        if on_weights is not None:
            weights = on_weights(weights)
        return weighted_values(weights, v, kv_layout=kv_layout)
    if implementation in ("xla", "cudnn"):
        if _kv_axes(kv_layout) == "bhkd":  # the fused kernels take length-first K/V
            k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
        return _fused_attention(q, k, v, mask, implementation)
    raise ValueError(
        f"implementation must be 'reference', 'xla' or 'cudnn', got {implementation!r}"
    )


def _fused_attention(
    q: Array, k: Array, v: Array, mask: Array | None, implementation: Literal["xla", "cudnn"]
) -> Array:
    """Eq. 1 through `jax.nn.dot_product_attention`, which needs one head width for K and V.

    When d_k != d_v (Table 3 row B) the narrower side is zero-padded: zeros add nothing to Q K^T
    and produce extra output columns that are sliced off; the scale stays 1/sqrt(d_k).
    """
    d_k, d_v = q.shape[-1], v.shape[-1]
    width = max(d_k, d_v)

    def pad(x: Array) -> Array:
        extra = width - x.shape[-1]
        return x if extra == 0 else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])

    if mask is not None:
        mask = jnp.broadcast_to(mask, (q.shape[0], mask.shape[1], q.shape[1], k.shape[1]))
    out = jax.nn.dot_product_attention(
        pad(q), pad(k), pad(v), mask=mask, scale=1.0 / math.sqrt(d_k), implementation=implementation
    )[..., :d_v]
    if mask is not None:
        # Fused kernels give a fully masked row a uniform average; the contract is zeros.
        has_key = jnp.any(mask, axis=-1)  # [batch, heads_or_1, q_len]
        out = jnp.where(jnp.transpose(has_key, (0, 2, 1))[..., None], out, 0)
    return out.astype(v.dtype)
