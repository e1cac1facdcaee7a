"""The Transformer (section 3, Figure 1): teacher-forced training pass and incremental decoding.

Incremental decoding uses an explicit cache value (`tfm.cache.DecodeCache`), not a mutable Flax
collection: `init_cache` computes every decoder layer's cross-attention K/V once from the encoder
output and allocates empty self-attention K/V; `decode_step` takes the cache and returns a new
one, so a `lax.scan` can carry it.
"""

from __future__ import annotations

import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfm import attention as attn
from tfm import implementation
from tfm.cache import DecodeCache, LayerCache
from tfm.config import ModelConfig
from tfm.layers import (
    DecoderLayer,
    EncoderLayer,
    LearnedPositions,
    SharedEmbedding,
    compute_dtype,
    normalization,
    position_ids,
    sinusoidal_encoding,
)
from tfm.tokens import PAD_ID

Array = jax.Array


def _rematerialized(layer_cls: type[nn.Module]) -> type[nn.Module]:
    """`layer_cls` recomputing its activations in the backward pass (`nn.remat`), with its
    `deterministic` argument static (a Python bool), found by name so that it cannot drift when
    the call's signature changes. (`nn.remat` counts the module itself as argument 0, as the
    signature of the unbound `__call__` does with `self`.)"""
    parameters = list(inspect.signature(layer_cls.__call__).parameters)
    return nn.remat(layer_cls, static_argnums=(parameters.index("deterministic"),))


class Transformer(nn.Module):
    """Encoder-decoder Transformer with one shared embedding matrix (section 3.4).

    Token id 0 is padding. `tgt_in` is the target shifted right (starting with the BOS id).
    Packed rows (several sentence pairs in one row) pass `*_segments` (1, 2, ... per pair, 0 for
    padding) and `*_positions` (restarting at 0 for each pair); attention never crosses pairs.

    `kernels` ("auto", "reference", "xla_cpu"; `tfm.implementation`) picks the implementation
    of the few operations a backend kit may replace, resolved here once and handed to every
    layer; it changes no parameter and no value, so it is not part of the config. `precision`
    is that of every `nn.Dense` product (`lax.Precision`).
    """

    config: ModelConfig
    kernels: str = "auto"
    precision: jax.lax.PrecisionLike = None

    @property
    def ops(self) -> implementation.Ops:
        """The op set of `kernels`, which every layer receives."""
        return implementation.resolve(self.kernels)

    def setup(self) -> None:
        c, ops = self.config, self.ops
        self.embedding = SharedEmbedding(c.vocab_size, c.d_model, compute_dtype(c), ops)
        if c.positional == "learned":
            self.src_position_table = LearnedPositions(c.max_positions, c.d_model)
            self.tgt_position_table = LearnedPositions(c.max_positions, c.d_model)
        encoder_cls, decoder_cls = EncoderLayer, DecoderLayer
        if c.remat:
            encoder_cls, decoder_cls = map(_rematerialized, (EncoderLayer, DecoderLayer))
        layer = dict(ops=ops, precision=self.precision)
        self.encoder_layers = [
            encoder_cls(c, **layer, name=f"encoder_{i}") for i in range(c.num_layers)
        ]
        self.decoder_layers = [
            decoder_cls(c, **layer, name=f"decoder_{i}") for i in range(c.num_layers)
        ]
        self.embedding_dropout = ops.Dropout(c.dropout_rate)
        if c.norm == "pre":
            self.encoder_norm = normalization(c, ops)
            self.decoder_norm = normalization(c, ops)

    def _embed(self, ids: Array, positions: Array, side: str, deterministic: bool) -> Array:
        """Dropout(Embedding(ids) * sqrt(d_model) + PE(positions)) (sections 3.4, 3.5, 5.4)."""
        if self.config.positional == "learned":
            table = self.src_position_table if side == "src" else self.tgt_position_table
            encoding = table(positions)
        else:
            encoding = sinusoidal_encoding(positions, self.config.d_model)
        x = self.embedding(ids) + encoding.astype(compute_dtype(self.config))
        return self.embedding_dropout(x, deterministic=deterministic)

    def encode(
        self,
        src: Array,
        src_segments: Array | None = None,
        src_positions: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        """Encoder stack: `[batch, src_len]` ids -> `[batch, src_len, d_model]` final output."""
        if src_positions is None:
            src_positions = position_ids(src.shape[1])
        if src_segments is None:
            mask = attn.key_padding_mask(src != PAD_ID)
        else:
            mask = attn.segment_mask(src_segments, src_segments)
        x = self._embed(src, src_positions, "src", deterministic)
        for layer in self.encoder_layers:
            x = layer(x, mask, deterministic)
        if self.config.norm == "pre":
            x = self.encoder_norm(x)
        return x

    def decode(
        self,
        encoded: Array,
        src: Array,
        tgt_in: Array,
        src_segments: Array | None = None,
        tgt_segments: Array | None = None,
        tgt_positions: Array | None = None,
        deterministic: bool = True,
        return_states: bool = False,
    ) -> Array:
        """Decoder stack with teacher forcing: float32 logits `[batch, tgt_len, vocab]`, or with
        `return_states` the decoder's final states `[batch, tgt_len, d_model]` that the
        pre-softmax linear layer reads (section 3.4; the training loss applies that layer
        itself, `tfm.loss.tied_output_cross_entropy`).

        `encoded` is the FINAL encoder output `[batch, src_len, d_model]`; every decoder layer's
        cross-attention reads it.
        """
        if (src_segments is None) != (tgt_segments is None):
            raise ValueError(
                "packed rows need both src_segments and tgt_segments (or neither); got only "
                + ("src_segments" if tgt_segments is None else "tgt_segments")
            )
        length = tgt_in.shape[1]
        if tgt_positions is None:
            tgt_positions = position_ids(length)
        causal = attn.causal_mask(length)
        if tgt_segments is None:
            # Target padding is trailing, so the causal mask alone keeps real positions from
            # seeing it; padded positions then compute exactly what decode_step would.
            self_mask = causal
            cross_mask = attn.key_padding_mask(src != PAD_ID)
        else:
            self_mask = causal & attn.segment_mask(tgt_segments, tgt_segments)
            cross_mask = attn.segment_mask(tgt_segments, src_segments)
        y = self._embed(tgt_in, tgt_positions, "tgt", deterministic)
        for layer in self.decoder_layers:
            y = layer(y, encoded, self_mask, cross_mask, deterministic)
        return self._final_states(y) if return_states else self._logits(y)

    def _final_states(self, y: Array) -> Array:
        return self.decoder_norm(y) if self.config.norm == "pre" else y

    def _logits(self, y: Array) -> Array:
        return self.embedding.logits(self._final_states(y))

    def output_embedding(self) -> Array:
        """E `[vocab, d_model]` in the compute dtype: the pre-softmax linear layer's weights
        (section 3.4), for a loss that applies that layer itself."""
        return self.embedding.table.astype(self.embedding.dtype)

    def __call__(
        self,
        src: Array,
        tgt_in: Array,
        src_segments: Array | None = None,
        tgt_segments: Array | None = None,
        src_positions: Array | None = None,
        tgt_positions: Array | None = None,
        deterministic: bool = True,
        return_states: bool = False,
    ) -> Array:
        """Training pass: `[batch, src_len]` source and `[batch, tgt_len]` shifted target ids ->
        float32 logits `[batch, tgt_len, vocab]` (the decoder's final states with
        `return_states`, as `decode`). Dropout is active when `deterministic=False` (needs a
        "dropout" RNG)."""
        encoded = self.encode(src, src_segments, src_positions, deterministic)
        return self.decode(
            encoded,
            src,
            tgt_in,
            src_segments,
            tgt_segments,
            tgt_positions,
            deterministic,
            return_states,
        )

    def init_cache(
        self, encoded: Array, src: Array, max_steps: int | None = None, beams: int = 1
    ) -> DecodeCache:
        """Decoding state for `[batch, src_len, d_model]` encoder output of `[batch, src_len]` ids,
        decoded as `beams` rows per sentence (beam search; 1 otherwise).

        Cross-attention K/V are computed here, once per sentence (its beams share them);
        self-attention K/V are zeros for `[batch * beams]` rows and `max_steps` decoder positions
        (default `config.max_positions`), filled by `decode_step`.
        """
        c = self.config
        max_steps = c.max_positions if max_steps is None else max_steps
        if c.positional == "learned" and max_steps > c.max_positions:
            raise ValueError(
                f"decoding {max_steps} positions exceeds the learned position table "
                f"(ModelConfig.max_positions={c.max_positions})"
            )
        batch = src.shape[0] * beams
        dtype = compute_dtype(c)
        layers = []
        for layer in self.decoder_layers:
            cross_k, cross_v = layer.cross_kv(encoded)
            layers.append(
                LayerCache(
                    self_k=jnp.zeros((batch, c.num_heads, max_steps, c.d_k), dtype),
                    self_v=jnp.zeros((batch, c.num_heads, max_steps, c.d_v), dtype),
                    cross_k=cross_k.astype(dtype),
                    cross_v=cross_v.astype(dtype),
                )
            )
        return DecodeCache(layers=tuple(layers), src_valid=src != PAD_ID)

    def decode_step(
        self, cache: DecodeCache, tokens: Array, position: Array | int
    ) -> tuple[Array, DecodeCache]:
        """One autoregressive step: `[rows]` last tokens at `position` (0 for the BOS token), a
        scalar or one per row `[rows]` -> float32 logits `[rows, vocab]` for the next token, and
        the updated cache. Rows are the cache's sentences, or `beams` consecutive rows per
        sentence."""
        beams = tokens.shape[0] // cache.src_valid.shape[0]
        position = jnp.asarray(position, jnp.int32)
        positions = jnp.broadcast_to(jnp.reshape(position, (-1, 1)), (tokens.shape[0], 1))
        y = self._embed(tokens[:, None], positions, "tgt", deterministic=True)
        cross_mask = attn.key_padding_mask(cache.src_valid)
        new_layers = []
        for layer, layer_cache in zip(self.decoder_layers, cache.layers, strict=True):
            y, layer_cache = layer.step(y, layer_cache, position, cross_mask, beams)
            new_layers.append(layer_cache)
        logits = self._logits(y)[:, 0]
        return logits, cache.replace(layers=tuple(new_layers))
