"""Autoregressive inference with the Transformer (section 6.1): greedy search, sampling and beam
search over source ids.

Each function encodes the source once, builds the `DecodeCache` (every decoder layer's
cross-attention K/V computed before the loop) and runs a search of `tfm.inference.search` with
`Transformer.decode_step` as its step function. Shapes are static: one compiled program per
(batch size, source length, settings), whatever the sentences. Under the model's "auto"
kernels the kit or the reference is chosen once for the whole search (`tfm.implementation`).

The maximum output length is the paper's: each sentence may generate up to its own source
length + `extra_length` (50) tokens, EOS included, and never more than the model's
`max_positions` (`longest_output`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from tfm import implementation
from tfm.cpu_host.backend_jit import DECODING_CPU_OPTIONS, cpu_tuned_jit
from tfm.inference.search import (
    PAPER_ALPHA,
    PAPER_BEAM_SIZE,
    PAPER_EXTRA_LENGTH,
    BeamSearchResult,
    SearchResult,
    StepFn,
    filter_logits,
    first_argmax,
    length_penalty,
    search_beams,
    search_one_token_per_step,
)
from tfm.model import DecodeCache, Transformer
from tfm.tokens import EOS_ID, PAD_ID

Array = jax.Array


def max_output_lengths(src: Array, extra_length: int, max_steps: int | None = None) -> Array:
    """`[batch]` most tokens each sentence may generate: its source length + extra_length (at
    most `max_steps` if given); 0 for an all-padding row (a row that only fills a batch), which
    is then finished from the start."""
    src_lengths = jnp.sum(src != PAD_ID, axis=-1)
    limits = src_lengths + extra_length
    if max_steps is not None:
        limits = jnp.minimum(limits, max_steps)
    return jnp.where(src_lengths > 0, limits, 0)


def steps_allocated(src_len: int, extra_length: int, chunk: int) -> int:
    """Output positions to allocate: src_len + extra_length rounded up to whole chunks."""
    return int(math.ceil((src_len + extra_length) / chunk) * chunk)


def positions_allocated(src_len: int, extra_length: int, chunk: int, max_steps: int | None) -> int:
    """The positions a search allocates: every allowed output's, or `max_steps` (whole chunks)
    when that is fewer, leaving rows that need more incomplete (`SearchResult.complete`)."""
    allowed = steps_allocated(src_len, extra_length, chunk)
    if max_steps is None:
        return allowed
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    return min(allowed, steps_allocated(max_steps, 0, chunk))


def longest_output(model: Transformer, chunk: int = 8) -> int:
    """The most tokens (EOS included) the model translates a sentence into, whatever its source:
    `ModelConfig.max_positions` in whole chunks of the search. A learned position table (Table 3
    row E) was trained on no more positions; for sinusoids it is the decoding cache's length."""
    return max(model.config.max_positions // chunk, 1) * chunk


def transformer_step_fn(model: Transformer, params) -> StepFn:
    """`Transformer.decode_step` with fixed parameters, as the searches call it."""
    variables = {"params": params}

    def step_fn(cache: DecodeCache, tokens: Array, position: Array):
        return model.apply(variables, cache, tokens, position, method=Transformer.decode_step)

    return step_fn


def encode_and_init_cache(
    model: Transformer, params, src: Array, copies: int, max_steps: int
) -> DecodeCache:
    """Encode `[batch, src_len]` once and build the cache, with `copies` decoded rows per
    sentence (its beams); the encoder output and cross-attention K/V are not copied."""
    variables = {"params": params}
    encoded = model.apply(variables, src, method=Transformer.encode)
    return model.apply(variables, encoded, src, max_steps, copies, method=Transformer.init_cache)


def _argmax(logits: Array, step: Array) -> Array:
    del step
    return first_argmax(logits)


def _transformer_one_token_per_step(
    model: Transformer,
    params,
    src: Array,
    pick,
    eos_id: int | None,
    extra_length: int,
    chunk: int,
    max_steps: int | None,
) -> SearchResult:
    longest = longest_output(model, chunk)
    steps = min(positions_allocated(src.shape[1], extra_length, chunk, max_steps), longest)

    def search(model: Transformer, params, src: Array) -> SearchResult:
        return search_one_token_per_step(
            transformer_step_fn(model, params),
            encode_and_init_cache(model, params, src, 1, steps),
            max_output_lengths(src, extra_length, longest),
            steps,
            pick,
            eos_id=eos_id,
            chunk=chunk,
        )

    return implementation.per_platform(search, model, params, src)


@cpu_tuned_jit(
    DECODING_CPU_OPTIONS, static_argnames=("model", "eos_id", "extra_length", "chunk", "max_steps")
)
def greedy_search(
    model: Transformer,
    params,
    src: Array,
    *,
    eos_id: int | None = EOS_ID,
    extra_length: int = PAPER_EXTRA_LENGTH,
    chunk: int = 8,
    max_steps: int | None = None,
) -> SearchResult:
    """Greedy decoding with the KV cache: at each step the most probable next token.

    Args:
      model: the `Transformer` (static: its config selects the program).
      params: its parameters (`variables["params"]`).
      src: `[batch, src_len]` source ids, 0 = padding.
      eos_id: stop a sentence after this token; None never stops early (benchmarks).
      extra_length: each sentence generates at most its source length + extra_length tokens.
      chunk: decoding steps per scan between checks for "all finished".
      max_steps: decoder positions to allocate, when fewer than the longest allowed output
        (src_len + extra_length, rounded up to a multiple of `chunk`): the cache and the work per
        step shrink with it; a row not finished within them has `complete` False (run it again
        without max_steps). Rounded up to a multiple of `chunk`.
    Returns:
      `SearchResult`; `ids` is `[batch, steps]`, steps = src_len + extra_length or `max_steps`,
      whichever is fewer, rounded up to a multiple of `chunk`.
    """
    return _transformer_one_token_per_step(
        model, params, src, _argmax, eos_id, extra_length, chunk, max_steps
    )


@cpu_tuned_jit(
    DECODING_CPU_OPTIONS,
    static_argnames=(
        "model",
        "temperature",
        "top_k",
        "top_p",
        "eos_id",
        "extra_length",
        "chunk",
        "max_steps",
    ),
)
def sample(
    model: Transformer,
    params,
    src: Array,
    rng: Array,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int | None = EOS_ID,
    extra_length: int = PAPER_EXTRA_LENGTH,
    chunk: int = 8,
    max_steps: int | None = None,
) -> SearchResult:
    """Ancestral sampling with temperature, top-k and nucleus (top-p) filtering; reproducible for
    a fixed `rng` (step i draws with `fold_in(rng, i)`). Arguments as `greedy_search`; scores are
    log-probabilities under the unfiltered model."""

    def pick(logits: Array, step: Array) -> Array:
        filtered = filter_logits(logits, temperature, top_k, top_p)
        return jax.random.categorical(jax.random.fold_in(rng, step), filtered, axis=-1)

    return _transformer_one_token_per_step(
        model, params, src, pick, eos_id, extra_length, chunk, max_steps
    )


@cpu_tuned_jit(
    DECODING_CPU_OPTIONS,
    static_argnames=(
        "model",
        "beam_size",
        "eos_id",
        "extra_length",
        "chunk",
        "max_steps",
        "settle",
    ),
)
def beam_search(
    model: Transformer,
    params,
    src: Array,
    *,
    beam_size: int = PAPER_BEAM_SIZE,
    alpha: float = PAPER_ALPHA,
    eos_id: int | None = EOS_ID,
    extra_length: int = PAPER_EXTRA_LENGTH,
    chunk: int = 8,
    max_steps: int | None = None,
    settle: str = "best",
) -> BeamSearchResult:
    """Beam search with the GNMT length penalty (section 6.1: beam 4, alpha 0.6, source length +
    50) over `[batch, src_len]` source ids; see `search_beams`.

    Returns a `BeamSearchResult` (best hypothesis first); `settle="beams"` when all its kept
    hypotheses (`beams`) must be the k best, not only the first. `alpha` is traced, so tuning it
    on the development set (as section 6.1 did) compiles the search once. Other arguments,
    `max_steps` too, as `greedy_search`.
    """
    longest = longest_output(model, chunk)
    steps = min(positions_allocated(src.shape[1], extra_length, chunk, max_steps), longest)

    def search(model: Transformer, params, src: Array) -> BeamSearchResult:
        return search_beams(
            transformer_step_fn(model, params),
            encode_and_init_cache(model, params, src, beam_size, steps),
            max_output_lengths(src, extra_length, longest),
            steps,
            beam_size=beam_size,
            alpha=alpha,
            eos_id=eos_id,
            chunk=chunk,
            settle=settle,
        )

    return implementation.per_platform(search, model, params, src)


__all__ = [
    # the Transformer's searches (this module)
    "beam_search",
    "encode_and_init_cache",
    "greedy_search",
    "longest_output",
    "max_output_lengths",
    "positions_allocated",
    "sample",
    "steps_allocated",
    "transformer_step_fn",
    # from tfm.inference.search, so callers of the searches need one import
    "PAPER_ALPHA",
    "PAPER_BEAM_SIZE",
    "PAPER_EXTRA_LENGTH",
    "BeamSearchResult",
    "SearchResult",
    "filter_logits",
    "length_penalty",
]
