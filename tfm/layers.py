"""The Transformer's building blocks (sections 3.1-3.5) as small Flax linen modules.

Every module holds parameters and little else; the arithmetic lives in `tfm.attention` and in the
few lines of each `__call__`, on Flax's own modules: `nn.Dense` / `nn.DenseGeneral` for x W,
`nn.LayerNorm`, `nn.Dropout`, `jax.nn.relu`. Activations are `[batch, length, d_model]`.

Each module receives its op set (`ops`, resolved once per model by `tfm.implementation`), which
may put a backend kit's equal in place of one of those; the parameters are the same.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfm import attention as attn
from tfm import cache as decode_cache
from tfm.config import ModelConfig
from tfm.implementation import REFERENCE, Ops

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


def position_ids(length: int) -> Array:
    """Default positions 0..length-1, `[1, length]` int32: one row that every row of a batch
    broadcasts against, so each position's encoding is computed once, not once per token."""
    return jnp.arange(length, dtype=jnp.int32)[None]


def normalization(config: ModelConfig, ops: Ops) -> nn.Module:
    """The normalization after (post-LN) or before (pre-LN) each sub-layer and, for pre-LN, at
    the end of each stack: layer normalization (Ba et al., 2016), as section 5.4 applies it (the
    op set's), or with `normalization="rms"` Flax's `nn.RMSNorm` (no mean, no bias)."""
    norm_cls = ops.LayerNorm if config.normalization == "layer" else nn.RMSNorm
    return norm_cls(
        epsilon=config.layer_norm_epsilon, dtype=compute_dtype(config), param_dtype=jnp.float32
    )


class SharedEmbedding(nn.Module):
    """ONE `[vocab, d_model]` matrix for the source embedding, the target embedding and the
    pre-softmax projection (section 3.4); lookups are scaled by sqrt(d_model)."""

    vocab_size: int
    d_model: int
    dtype: jnp.dtype = jnp.float32
    ops: Ops = REFERENCE

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
        return self.ops.tied_logits(x.astype(self.dtype), self.table.astype(self.dtype))


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
    Each projection is its own matmul: concatenating [W^Q | W^K | W^V] would copy the weights in
    every step, for no gain measured on CPU. `use_bias` adds a bias to each projection
    (`[heads, depth]` for Q, K, V; `[d_model]` for W^O), as Marian's models have.
    """

    num_heads: int
    d_k: int
    d_v: int
    d_model: int
    attention_dropout_rate: float = 0.0
    implementation: attn.Implementation = "reference"
    dtype: jnp.dtype = jnp.float32
    ops: Ops = REFERENCE
    precision: jax.lax.PrecisionLike = None
    use_bias: bool = False

    def setup(self) -> None:
        projection = dict(
            use_bias=self.use_bias,
            dtype=self.dtype,
            param_dtype=jnp.float32,
            kernel_init=nn.initializers.xavier_uniform(),
            precision=self.precision,
            dot_general_cls=self.ops.dot_general_cls,
        )
        h = self.num_heads
        self.query = nn.DenseGeneral((h, self.d_k), **projection)
        self.key = nn.DenseGeneral((h, self.d_k), **projection)
        self.value = nn.DenseGeneral((h, self.d_v), **projection)
        self.out = nn.DenseGeneral(self.d_model, axis=(-2, -1), **projection)
        if self.attention_dropout_rate > 0.0:
            self.weight_dropout = self.ops.Dropout(self.attention_dropout_rate)

    def project_qkv(self, x: Array) -> tuple[Array, Array, Array]:
        """Self-attention's Q, K, V of one input `[batch, length, d_model]`: `[batch, length,
        heads, d_k | d_k | d_v]`."""
        return self.query(x), self.key(x), self.value(x)

    def project_kv(self, inputs_kv: Array) -> tuple[Array, Array]:
        """K = X W^K `[batch, kv_len, heads, d_k]` and V = X W^V `[batch, kv_len, heads, d_v]`."""
        return self.key(inputs_kv), self.value(inputs_kv)

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
            softmax=self.ops.masked_softmax,
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
            q = self.query(inputs_q)
            k, v = self.project_kv(inputs_kv)
        return self.attend(q, k, v, mask, deterministic)


# The FFN's nonlinearities besides section 3.3's ReLU (which the op set gives: a kit may have its
# own), by `ModelConfig.activation`: GELU in its exact erf form, and swish (= SiLU).
_LATER_ACTIVATIONS = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "swish": jax.nn.swish,
}


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position alone (section 3.3);
    `activation` may put GELU or swish in place of max(0, .)."""

    d_model: int
    d_ff: int
    dtype: jnp.dtype = jnp.float32
    ops: Ops = REFERENCE
    precision: jax.lax.PrecisionLike = None
    activation: str = "relu"

    @nn.compact
    def __call__(self, x: Array) -> Array:
        dense = dict(
            dtype=self.dtype,
            param_dtype=jnp.float32,
            kernel_init=nn.initializers.xavier_uniform(),
            precision=self.precision,
            dot_general_cls=self.ops.dot_general_cls,
        )
        nonlinearity = (
            self.ops.relu if self.activation == "relu" else _LATER_ACTIVATIONS[self.activation]
        )
        hidden = nonlinearity(nn.Dense(self.d_ff, name="inner", **dense)(x))  # max(0, x W1 + b1)
        return nn.Dense(self.d_model, name="outer", **dense)(hidden)


class AddAndNorm(nn.Module):
    """Figure 1's "Add & Norm" around one sub-layer, with section 5.4's residual dropout.

    post-LN (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    pre-LN (option):     x + Dropout(Sublayer(LayerNorm(x))).

    A layer calls `sublayer_input(x)`, runs its sub-layer on that, and hands the output here.
    """

    config: ModelConfig
    ops: Ops = REFERENCE

    def setup(self) -> None:
        self.norm = normalization(self.config, self.ops)

    def sublayer_input(self, x: Array) -> Array:
        """What the sub-layer reads: x (post-LN), or LayerNorm(x) (pre-LN)."""
        return self.norm(x) if self.config.norm == "pre" else x

    @nn.compact
    def __call__(self, x: Array, sublayer_output: Array, deterministic: bool = True) -> Array:
        """The block's output from its input `x` and the sub-layer's output, both `[batch,
        length, d_model]`."""
        y = x + self.ops.Dropout(self.config.dropout_rate)(sublayer_output, deterministic)
        return y if self.config.norm == "pre" else self.norm(y)


def _attention(config: ModelConfig, ops: Ops, precision, name: str) -> MultiHeadAttention:
    return MultiHeadAttention(
        num_heads=config.num_heads,
        d_k=config.d_k,
        d_v=config.d_v,
        d_model=config.d_model,
        attention_dropout_rate=config.attention_dropout_rate,
        implementation=config.attention,
        dtype=compute_dtype(config),
        ops=ops,
        precision=precision,
        use_bias=config.attention_bias,
        name=name,
    )


def _feed_forward(config: ModelConfig, ops: Ops, precision) -> FeedForward:
    return FeedForward(
        config.d_model, config.d_ff, compute_dtype(config), ops, precision, config.activation
    )


class EncoderLayer(nn.Module):
    """Encoder layer (section 3.1, Figure 1): self-attention, then the feed-forward network,
    each inside Add & Norm."""

    config: ModelConfig
    ops: Ops = REFERENCE
    precision: jax.lax.PrecisionLike = None

    def setup(self) -> None:
        c, ops, precision = self.config, self.ops, self.precision
        self.self_attention = _attention(c, ops, precision, "self_attention")
        self.feed_forward = _feed_forward(c, ops, precision)
        self.attention_block = AddAndNorm(c, ops)
        self.feed_forward_block = AddAndNorm(c, ops)

    def __call__(self, x: Array, mask: Array | None, deterministic: bool = True) -> Array:
        """`[batch, src_len, d_model]` -> same shape; `mask` is the source self-attention mask."""
        block = self.attention_block
        z = block.sublayer_input(x)
        x = block(x, self.self_attention(z, None, mask, deterministic), deterministic)
        block = self.feed_forward_block
        return block(x, self.feed_forward(block.sublayer_input(x)), deterministic)


class DecoderLayer(nn.Module):
    """Decoder layer (section 3.1, Figure 1): masked self-attention, attention over the final
    encoder output (queries from the decoder, keys/values projected by this layer's own W^K,
    W^V), then the feed-forward network, each inside Add & Norm."""

    config: ModelConfig
    ops: Ops = REFERENCE
    precision: jax.lax.PrecisionLike = None

    def setup(self) -> None:
        c, ops, precision = self.config, self.ops, self.precision
        self.self_attention = _attention(c, ops, precision, "self_attention")
        self.cross_attention = _attention(c, ops, precision, "cross_attention")
        self.feed_forward = _feed_forward(c, ops, precision)
        self.self_attention_block = AddAndNorm(c, ops)
        self.cross_attention_block = AddAndNorm(c, ops)
        self.feed_forward_block = AddAndNorm(c, ops)

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
        block = self.self_attention_block
        z = block.sublayer_input(y)
        y = block(y, self.self_attention(z, None, self_mask, deterministic), deterministic)
        block = self.cross_attention_block
        z = block.sublayer_input(y)
        y = block(y, self.cross_attention(z, encoded, cross_mask, deterministic), deterministic)
        block = self.feed_forward_block
        return block(y, self.feed_forward(block.sublayer_input(y)), deterministic)

    def cross_kv(self, encoded: Array) -> tuple[Array, Array]:
        """This layer's K, V of the final encoder output, computed once per source for decoding,
        heads first: `[batch, heads, src_len, d_k | d_v]`."""
        k, v = self.cross_attention.project_kv(encoded)
        return jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)

    def step(
        self,
        y: Array,
        cache: decode_cache.LayerCache,
        position: Array,
        cross_mask: Array | None,
        beams: int = 1,
    ) -> tuple[Array, decode_cache.LayerCache]:
        """`__call__` for one position at a time: `[batch, 1, d_model]` input at `position` (a
        scalar, or `[batch]`, each row at its own) -> the output and the cache with this step's
        self-attention K/V written in.

        Self-attention reads the cache's positions <= `position`; cross-attention reads the
        cache's K/V of each sentence, whose `beams` consecutive rows attend as one row
        (`tfm.cache.group_beams`).
        """
        block = self.self_attention_block
        q, k, v = self.self_attention.project_qkv(block.sublayer_input(y))
        cache = cache.written(jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), position)
        visible = decode_cache.visible_positions(cache.self_k.shape[2], position)
        attended = self.self_attention.attend(
            q, cache.self_k, cache.self_v, visible, kv_layout="heads_first"
        )
        y = decode_cache.group_beams(block(y, attended), beams)  # [sentences, beams, d_model]
        block = self.cross_attention_block
        q = self.cross_attention.query(block.sublayer_input(y))
        attended = self.cross_attention.attend(
            q, cache.cross_k, cache.cross_v, cross_mask, kv_layout="heads_first"
        )
        y = block(y, attended)
        block = self.feed_forward_block
        y = block(y, self.feed_forward(block.sublayer_input(y)))
        return decode_cache.ungroup_beams(y), cache
