"""The Transformer's building blocks (sections 3.1-3.5) as small Flax linen modules.

Every module holds parameters and little else; the arithmetic lives in `tfm.attention` and in the
few lines of each `__call__`, on Flax's own modules: `nn.Dense` / `nn.DenseGeneral` for x W,
`nn.LayerNorm`, `nn.Dropout`, `jax.nn.relu`. Activations are `[batch, length, d_model]`.

Each module's `kernels` (`tfm.kernels`) may swap a backend kit's equal for one of those
(`ops.LayerNorm` is `nn.LayerNorm` under "reference", and so on); the parameters are the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfm import attention as attn
from tfm import kernels as kernels_lib
from tfm.config import ModelConfig

Array = jax.Array


def compute_dtype(config: ModelConfig) -> jnp.dtype:
    """The activation / matmul dtype named by `config.dtype`."""
    return jnp.dtype(config.dtype)


def sinusoidal_encoding(positions: Array, d_model: int) -> Array:
    """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same).

    Args:
      positions: integer array of any shape `[...]` (token positions, from 0).
      d_model: even width.
    Returns:
      float32 `[..., d_model]`, sines in even columns and cosines in odd columns.
    """
    two_i = jnp.arange(0, d_model, 2, dtype=jnp.float32)
    angles = positions[..., None].astype(jnp.float32) / jnp.power(10_000.0, two_i / d_model)
    encoding = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    return encoding.reshape(*positions.shape, d_model)


class SharedEmbedding(nn.Module):
    """ONE `[vocab, d_model]` matrix for the source embedding, the target embedding and the
    pre-softmax projection (section 3.4); lookups are scaled by sqrt(d_model)."""

    vocab_size: int
    d_model: int
    dtype: jnp.dtype = jnp.float32
    kernels: str = "auto"

    def setup(self) -> None:
        self.table = self.param(
            "embedding",
            nn.initializers.normal(stddev=self.d_model**-0.5),
            (self.vocab_size, self.d_model),
            jnp.float32,
        )

    def __call__(self, ids: Array) -> Array:
        """`[batch, length]` ids -> `[batch, length, d_model]` embeddings times sqrt(d_model)."""
        return (jnp.take(self.table, ids, axis=0) * math.sqrt(self.d_model)).astype(self.dtype)

    def logits(self, x: Array) -> Array:
        """Pre-softmax linear layer with the shared weights: `[..., d_model]` -> float32
        `[..., vocab]`."""
        tied_logits = kernels_lib.ops_for(self.kernels).tied_logits
        return tied_logits(x.astype(self.dtype), self.table.astype(self.dtype))


class LearnedPositions(nn.Module):
    """Learned positional embeddings (Table 3 row E): one trained vector per position."""

    num_positions: int
    d_model: int

    @nn.compact
    def __call__(self, positions: Array) -> Array:
        table = self.param(
            "positions",
            nn.initializers.normal(stddev=0.02),
            (self.num_positions, self.d_model),
            jnp.float32,
        )
        return jnp.take(table, positions, axis=0)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K,
    V W_i^V) (section 3.2.2). h, d_k and d_v are independent (Table 3 rows A and B).

    Projections are kept per head, W^Q, W^K, W^V as `[d_model, heads, depth]` and W^O as
    `[heads, d_v, d_model]` (`nn.DenseGeneral`), the same linear maps as one `[d_model, heads *
    depth]` matrix followed by a head split; each is Glorot-uniform over that flattened matrix.
    (Concatenating [W^Q | W^K | W^V] into one matmul was measured: no gain on CPU, and the
    concatenation is a weight copy in every step, so each projection is its own matmul.)
    """

    num_heads: int
    d_k: int
    d_v: int
    d_model: int
    attention_dropout_rate: float = 0.0
    implementation: attn.Implementation = "reference"
    dtype: jnp.dtype = jnp.float32
    kernels: str = "auto"
    precision: jax.lax.PrecisionLike = None

    def setup(self) -> None:
        ops = kernels_lib.ops_for(self.kernels)
        projection = dict(
            use_bias=False,
            dtype=self.dtype,
            param_dtype=jnp.float32,
            kernel_init=nn.initializers.xavier_uniform(),
            precision=self.precision,
            dot_general_cls=ops.dot_general_cls,
        )
        h = self.num_heads
        self.query = nn.DenseGeneral((h, self.d_k), **projection)
        self.key = nn.DenseGeneral((h, self.d_k), **projection)
        self.value = nn.DenseGeneral((h, self.d_v), **projection)
        self.out = nn.DenseGeneral(self.d_model, axis=(-2, -1), **projection)
        self.softmax = ops.masked_softmax
        if self.attention_dropout_rate > 0.0:
            self.weight_dropout = ops.Dropout(self.attention_dropout_rate)

    def _project(self, x: Array, projection: nn.DenseGeneral) -> Array:
        """`[batch, length, d_model]` x times one W -> `[batch, length, heads, depth]`."""
        return projection(x)

    def project_qkv(self, x: Array) -> tuple[Array, Array, Array]:
        """Self-attention's Q, K, V of one input `[batch, length, d_model]`: `[batch, length,
        heads, d_k | d_k | d_v]`."""
        return (
            self._project(x, self.query),
            self._project(x, self.key),
            self._project(x, self.value),
        )

    def project_kv(self, inputs_kv: Array) -> tuple[Array, Array]:
        """K = X W^K `[batch, kv_len, heads, d_k]` and V = X W^V `[batch, kv_len, heads, d_v]`."""
        return self._project(inputs_kv, self.key), self._project(inputs_kv, self.value)

    def project_q(self, inputs_q: Array) -> Array:
        """Q = X W^Q `[batch, q_len, heads, d_k]`."""
        return self._project(inputs_q, self.query)

    def attend(
        self,
        q: Array,
        k: Array,
        v: Array,
        mask: Array | None,
        deterministic: bool = True,
        kv_layout: attn.KVLayout = "length_first",
    ) -> Array:
        """Eq. 1 for projected `[batch, q_len, heads, d_k]` queries against projected K/V (in
        `kv_layout`), then Concat(heads) W^O -> `[batch, q_len, d_model]`."""

        def on_weights(weights: Array) -> Array:
            # Visible to callers that ask for mutable=["intermediates"] (attention plots).
            self.sow("intermediates", "attention_weights", weights)
            if self.attention_dropout_rate > 0.0 and not deterministic:
                weights = self.weight_dropout(weights, deterministic=False)
            return weights

        heads = attn.scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            implementation=self.implementation,
            kv_layout=kv_layout,
            softmax=self.softmax,
            on_weights=on_weights,
        )
        return self.out(heads.astype(self.dtype))

    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array | None = None,
        mask: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        """`[batch, q_len, d_model]` queries attend over `[batch, kv_len, d_model]` inputs;
        `inputs_kv=None` is self-attention (queries, keys and values from `inputs_q`)."""
        if inputs_kv is None:
            q, k, v = self.project_qkv(inputs_q)
        else:
            q = self.project_q(inputs_q)
            k, v = self.project_kv(inputs_kv)
        return self.attend(q, k, v, mask, deterministic)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position alone (section 3.3)."""

    d_model: int
    d_ff: int
    dtype: jnp.dtype = jnp.float32
    kernels: str = "auto"
    precision: jax.lax.PrecisionLike = None

    @nn.compact
    def __call__(self, x: Array) -> Array:
        ops = kernels_lib.ops_for(self.kernels)
        dense = dict(
            dtype=self.dtype,
            param_dtype=jnp.float32,
            kernel_init=nn.initializers.xavier_uniform(),
            precision=self.precision,
            dot_general_cls=ops.dot_general_cls,
        )
        hidden = ops.relu(nn.Dense(self.d_ff, name="inner", **dense)(x))  # max(0, x W1 + b1)
        return nn.Dense(self.d_model, name="outer", **dense)(hidden)


class ResidualSublayer(nn.Module):
    """One residual block around a sub-layer (section 5.4 / 3.1).

    post-LN (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    pre-LN (option):     x + Dropout(Sublayer(LayerNorm(x))).
    """

    config: ModelConfig
    kernels: str = "auto"

    @nn.compact
    def __call__(
        self, x: Array, sublayer: Callable[[Array], Array], deterministic: bool = True
    ) -> Array:
        ops = kernels_lib.ops_for(self.kernels)
        norm = ops.LayerNorm(
            epsilon=self.config.layer_norm_epsilon,
            dtype=compute_dtype(self.config),
            param_dtype=jnp.float32,
            name="norm",
        )
        dropout = ops.Dropout(self.config.dropout_rate)
        if self.config.norm == "pre":
            return x + dropout(sublayer(norm(x)), deterministic=deterministic)
        return norm(x + dropout(sublayer(x), deterministic=deterministic))


def _attention(config: ModelConfig, kernels: str, precision, name: str) -> MultiHeadAttention:
    return MultiHeadAttention(
        num_heads=config.num_heads,
        d_k=config.d_k,
        d_v=config.d_v,
        d_model=config.d_model,
        attention_dropout_rate=config.attention_dropout_rate,
        implementation=config.attention,
        dtype=compute_dtype(config),
        kernels=kernels,
        precision=precision,
        name=name,
    )


class EncoderLayer(nn.Module):
    """Encoder layer (section 3.1): self-attention, then the feed-forward network."""

    config: ModelConfig
    kernels: str = "auto"
    precision: jax.lax.PrecisionLike = None

    def setup(self) -> None:
        c, kernels, precision = self.config, self.kernels, self.precision
        self.self_attention = _attention(c, kernels, precision, "self_attention")
        self.feed_forward = FeedForward(
            c.d_model, c.d_ff, compute_dtype(c), kernels=kernels, precision=precision
        )
        self.attention_block = ResidualSublayer(c, kernels)
        self.feed_forward_block = ResidualSublayer(c, kernels)

    def __call__(self, x: Array, mask: Array | None, deterministic: bool = True) -> Array:
        """`[batch, src_len, d_model]` -> same shape; `mask` is the source self-attention mask."""
        x = self.attention_block(
            x, lambda y: self.self_attention(y, None, mask, deterministic), deterministic
        )
        return self.feed_forward_block(x, self.feed_forward, deterministic)


def _write_position(cache: Array, new: Array, position: Array) -> Array:
    """`new` `[batch, heads, 1, d]` written into `cache` `[batch, heads, max_steps, d]` at
    `position`: one slice update for a scalar, one row each for `[batch]` positions."""
    new = new.astype(cache.dtype)
    if jnp.ndim(position) == 0:
        return jax.lax.dynamic_update_slice_in_dim(cache, new, position, axis=2)
    rows = jnp.arange(cache.shape[0])
    return cache.at[rows, :, position].set(new[:, :, 0], mode="promise_in_bounds")


class DecoderLayer(nn.Module):
    """Decoder layer (section 3.1): masked self-attention, attention over the final encoder
    output (queries from the decoder, keys/values projected by this layer's own W^K, W^V), then
    the feed-forward network."""

    config: ModelConfig
    kernels: str = "auto"
    precision: jax.lax.PrecisionLike = None

    def setup(self) -> None:
        c, kernels, precision = self.config, self.kernels, self.precision
        self.self_attention = _attention(c, kernels, precision, "self_attention")
        self.cross_attention = _attention(c, kernels, precision, "cross_attention")
        self.feed_forward = FeedForward(
            c.d_model, c.d_ff, compute_dtype(c), kernels=kernels, precision=precision
        )
        self.self_attention_block = ResidualSublayer(c, kernels)
        self.cross_attention_block = ResidualSublayer(c, kernels)
        self.feed_forward_block = ResidualSublayer(c, kernels)

    def __call__(
        self,
        y: Array,
        encoded: Array,
        self_mask: Array | None,
        cross_mask: Array | None,
        deterministic: bool = True,
    ) -> Array:
        """Teacher forcing: `[batch, tgt_len, d_model]` decoder input and `[batch, src_len,
        d_model]` final encoder output -> `[batch, tgt_len, d_model]`."""
        cross_k, cross_v = self.cross_attention.project_kv(encoded)
        y = self.self_attention_block(
            y, lambda z: self.self_attention(z, None, self_mask, deterministic), deterministic
        )
        return self._cross_and_feed_forward(y, cross_k, cross_v, cross_mask, deterministic)

    def cross_kv(self, encoded: Array) -> tuple[Array, Array]:
        """This layer's K, V of the final encoder output, computed once per source for decoding,
        heads first: `[batch, heads, src_len, d_k | d_v]`."""
        k, v = self.cross_attention.project_kv(encoded)
        return jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)

    def step(
        self,
        y: Array,
        self_k: Array,
        self_v: Array,
        cross_k: Array,
        cross_v: Array,
        position: Array,
        cross_mask: Array | None,
        beams: int = 1,
    ) -> tuple[Array, Array, Array]:
        """One incremental decoding step for `[batch, 1, d_model]` input at `position`: a
        scalar (every row at the same position) or `[batch]` (each row its own, as when rows
        start decoding at different times).

        Writes this step's self-attention K/V into the heads-first `[batch, heads, max_steps, d]`
        caches at `position` and attends over positions <= `position` (later ones may hold
        another sentence's stale K/V); `cross_k`/`cross_v` are heads-first too (`cross_kv`), one
        copy per sentence when the `[batch]` rows are `beams` consecutive beams of each
        sentence. Returns the output and both self-attention caches.
        """

        def self_attend(z: Array) -> Array:
            nonlocal self_k, self_v
            q, k, v = self.self_attention.project_qkv(z)
            self_k = _write_position(self_k, jnp.swapaxes(k, 1, 2), position)
            self_v = _write_position(self_v, jnp.swapaxes(v, 1, 2), position)
            keys = jnp.arange(self_k.shape[2])
            visible = keys[None, :] <= jnp.reshape(position, (-1, 1))  # [1 or batch, max_steps]
            return self.self_attention.attend(
                q, self_k, self_v, visible[:, None, None, :], kv_layout="heads_first"
            )

        y = self.self_attention_block(y, self_attend)
        y = self._cross_and_feed_forward(
            y, cross_k, cross_v, cross_mask, True, "heads_first", beams
        )
        return y, self_k, self_v

    def _cross_and_feed_forward(
        self,
        y: Array,
        cross_k: Array,
        cross_v: Array,
        cross_mask: Array | None,
        deterministic: bool,
        kv_layout: attn.KVLayout = "length_first",
        beams: int = 1,
    ) -> Array:
        def cross_attend(z: Array) -> Array:
            q = self.cross_attention.project_q(z)  # [rows, q_len, heads, d_k]
            rows, q_len = q.shape[:2]
            # A sentence's beams share its source: they attend as extra query positions of one
            # row, `[batch, beams * q_len, heads, d_k]`, to one copy of its K/V (no per-beam
            # copies to build, read or reorder).
            grouped = q.reshape(rows // beams, beams * q_len, *q.shape[2:])
            out = self.cross_attention.attend(
                grouped, cross_k, cross_v, cross_mask, deterministic, kv_layout
            )
            return out.reshape(rows, q_len, out.shape[-1])

        y = self.cross_attention_block(y, cross_attend, deterministic)
        return self.feed_forward_block(y, self.feed_forward, deterministic)


def position_ids(length: int) -> Array:
    """Default positions 0..length-1, `[1, length]` int32: one row that every row of a batch
    broadcasts against, so the position encodings are computed once per position, not once per
    token (the sines and cosines of a `[batch, length, d_model / 2]` grid took 4.7 ms of a
    390 ms SMALL training step, benchmarks/README.md round eleven)."""
    return jnp.arange(length, dtype=jnp.int32)[None]
