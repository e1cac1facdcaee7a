"""Greedy decoding WITHOUT a cache: the baseline that the cached decoders are measured against
(decode_throughput.py, compare.py's tfm system) and checked against (tests/test_decoding.py)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tfm.inference.decoding import max_output_lengths
from tfm.inference.search import PAPER_EXTRA_LENGTH, Hypotheses, SearchResult
from tfm.model import Transformer
from tfm.tokens import BOS_ID, EOS_ID

Array = jax.Array


@functools.partial(jax.jit, static_argnames=("model", "eos_id", "extra_length"))
def greedy_search_uncached(
    model: Transformer,
    params,
    src: Array,
    *,
    eos_id: int | None = EOS_ID,
    extra_length: int = PAPER_EXTRA_LENGTH,
) -> SearchResult:
    """Greedy decoding WITHOUT a cache: every step re-runs the whole decoder over the full
    `[batch, max_steps]` prefix buffer (the causal mask hides the unwritten tail). The baseline
    that the cached decoders are measured and checked against."""
    batch = src.shape[0]
    max_steps = src.shape[1] + extra_length
    max_lengths = max_output_lengths(src, extra_length, max_steps)
    variables = {"params": params}
    encoded = model.apply(variables, src, method=Transformer.encode)

    def step(carry, i):
        inputs, out = carry
        logits = model.apply(variables, encoded, src, inputs, method=Transformer.decode)
        logits = jax.lax.dynamic_index_in_dim(logits, i, 1, False)
        token, out = out.extend(jnp.argmax(logits, -1), logits, i, max_lengths, eos_id)
        inputs = jax.lax.dynamic_update_index_in_dim(
            inputs, token, jnp.minimum(i + 1, max_steps - 1), 1
        )
        return (inputs, out), None

    inputs = jnp.zeros((batch, max_steps), jnp.int32).at[:, 0].set(BOS_ID)
    carry = (inputs, Hypotheses.empty(batch, max_steps, max_lengths))
    (_, out), _ = jax.lax.scan(step, carry, jnp.arange(max_steps))
    return SearchResult(ids=out.ids, scores=out.scores, lengths=out.lengths)
