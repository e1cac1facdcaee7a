"""Autoregressive inference (section 6.1): greedy search, sampling and beam search.

Every decoder encodes the source once, builds the `DecodeCache` (cross-attention K/V computed
once, before the loop), and runs `decode_step` inside a `lax.scan` that carries the cache. The
scan runs in chunks inside a `lax.while_loop` that stops as soon as every sequence has finished,
so steps after the last EOS cost nothing. Shapes are static: one compiled program per
(batch size, source length, settings), whatever the sentences.

The maximum output length is the paper's: each sentence may generate up to its own source
length + `extra_length` (50) tokens, EOS included.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import struct

from tfm.model import DecodeCache, Transformer
from tfm.tokens import BOS_ID, EOS_ID, PAD_ID

Array = jax.Array
NEG_INF = -1.0e9  # large finite negative: scores stay finite under arithmetic


@struct.dataclass
class SearchResult:
    """ids: `[batch, max_steps]` generated tokens (EOS included, PAD after it); scores: `[batch]`
    sum of token log-probabilities (beam search: divided by the length penalty); lengths:
    `[batch]` tokens generated, EOS included."""

    ids: Array
    scores: Array
    lengths: Array


@struct.dataclass
class BeamSearchResult(SearchResult):
    """The best hypothesis per sentence (`ids`, `scores`, `lengths`) and all kept finished
    hypotheses, best first: beams `[batch, beam, max_steps]`, beam_scores `[batch, beam]`."""

    beams: Array = None
    beam_scores: Array = None


def length_penalty(length: Array, alpha: float) -> Array:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016), used by section 6.1."""
    return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


def output_limits(src: Array, extra_length: int, max_steps: int) -> Array:
    """`[batch]` most tokens each sentence may generate: its source length + extra_length."""
    src_lengths = jnp.sum(src != PAD_ID, axis=-1)
    return jnp.minimum(src_lengths + extra_length, max_steps)


def _max_steps(src_len: int, extra_length: int, chunk: int) -> int:
    return int(math.ceil((src_len + extra_length) / chunk) * chunk)


def _prepare(model: Transformer, params, src: Array, copies: int, max_steps: int) -> DecodeCache:
    """Encode once and build the cache; with `copies` > 1 each row is repeated (beam search)."""
    variables = {"params": params}
    encoded = model.apply(variables, src, method=Transformer.encode)
    if copies > 1:
        encoded = jnp.repeat(encoded, copies, axis=0)
        src = jnp.repeat(src, copies, axis=0)
    return model.apply(variables, encoded, src, max_steps, method=Transformer.init_cache)


def _chunked_loop(step_fn, state, done_fn, max_steps: int, chunk: int):
    """Run `step_fn(state, i)` for i = 0..max_steps-1 as scans of `chunk` steps, stopping between
    chunks once `done_fn(state)` holds."""

    def run_chunk(carry):
        state, start = carry

        def body(state, offset):
            return step_fn(state, start + offset), None

        # Two steps per loop iteration: measured ~5% faster beam search on CPU (less loop
        # overhead per step), no change for greedy; more unrolling only lengthens compilation.
        state, _ = jax.lax.scan(body, state, jnp.arange(chunk), unroll=2)
        return state, start + chunk

    def keep_going(carry):
        state, start = carry
        return (start < max_steps) & ~done_fn(state)

    state, _ = jax.lax.while_loop(keep_going, run_chunk, (state, jnp.int32(0)))
    return state


@struct.dataclass
class _Emitted:
    """What one-token-per-step decoders have produced so far."""

    ids: Array  # [batch, max_steps]
    scores: Array  # [batch] sum of log-probabilities
    lengths: Array  # [batch]
    done: Array  # [batch]

    @classmethod
    def start(cls, batch: int, max_steps: int, limits: Array) -> _Emitted:
        return cls(
            ids=jnp.full((batch, max_steps), PAD_ID, jnp.int32),
            scores=jnp.zeros((batch,), jnp.float32),
            lengths=jnp.zeros((batch,), jnp.int32),
            done=limits <= 0,
        )

    def emit(
        self, token: Array, log_probs: Array, i: Array, limits: Array, eos_id: int | None
    ) -> tuple[Array, _Emitted]:
        """Record step i's `[batch]` token for sentences still running (PAD for finished ones),
        add its log-probability; a sentence finishes on EOS or at its length limit."""
        active = ~self.done
        token = jnp.where(active, token, PAD_ID).astype(jnp.int32)
        token_log_prob = jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]
        finished = i + 1 >= limits
        if eos_id is not None:
            finished = finished | (token == eos_id)
        return token, _Emitted(
            ids=self.ids.at[:, i].set(token),
            scores=self.scores + jnp.where(active, token_log_prob, 0.0),
            lengths=self.lengths + active.astype(jnp.int32),
            done=self.done | finished,
        )


@struct.dataclass
class _SamplingState:
    cache: DecodeCache
    last: Array  # [batch] token fed at the next step
    out: _Emitted


def _pick_greedy(logits: Array, step: Array) -> Array:
    del step
    return jnp.argmax(logits, axis=-1)


def _autoregressive(
    model: Transformer, params, src: Array, pick, eos_id: int | None, extra_length: int, chunk: int
) -> SearchResult:
    """Greedy search and sampling: one token per step chosen by `pick(logits, step)`."""
    batch = src.shape[0]
    max_steps = _max_steps(src.shape[1], extra_length, chunk)
    limits = output_limits(src, extra_length, max_steps)
    variables = {"params": params}
    state = _SamplingState(
        cache=_prepare(model, params, src, 1, max_steps),
        last=jnp.full((batch,), BOS_ID, jnp.int32),
        out=_Emitted.start(batch, max_steps, limits),
    )

    def step(state: _SamplingState, i: Array) -> _SamplingState:
        logits, cache = model.apply(
            variables, state.cache, state.last, i, method=Transformer.decode_step
        )
        token, out = state.out.emit(pick(logits, i), jax.nn.log_softmax(logits), i, limits, eos_id)
        return _SamplingState(cache=cache, last=token, out=out)

    state = _chunked_loop(step, state, lambda s: jnp.all(s.out.done), max_steps, chunk)
    return SearchResult(ids=state.out.ids, scores=state.out.scores, lengths=state.out.lengths)


@functools.partial(jax.jit, static_argnames=("model", "eos_id", "extra_length", "chunk"))
def greedy_search(
    model: Transformer,
    params,
    src: Array,
    *,
    eos_id: int | None = EOS_ID,
    extra_length: int = 50,
    chunk: int = 8,
) -> SearchResult:
    """Greedy decoding with the KV cache: at each step the most probable next token.

    Args:
      model: the `Transformer` (static: its config selects the program).
      params: its parameters (`variables["params"]`).
      src: `[batch, src_len]` source ids, 0 = padding.
      eos_id: stop a sentence after this token; None never stops early (benchmarks).
      extra_length: each sentence generates at most its source length + extra_length tokens.
      chunk: decoding steps per scan between checks for "all finished".
    Returns:
      `SearchResult`; `ids` is `[batch, max_steps]`, max_steps = src_len + extra_length rounded up
      to a multiple of `chunk`.
    """
    return _autoregressive(model, params, src, _pick_greedy, eos_id, extra_length, chunk)


def filter_logits(
    logits: Array, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> Array:
    """Logits for sampling: divided by temperature, then all but the top_k (0 = all) and all
    outside the smallest set whose probability reaches top_p (1.0 = all) set to -inf-like."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = logits.astype(jnp.float32) / temperature
    if top_k:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, NEG_INF, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits), axis=-1)
        # keep a token when the probability mass before it is still below top_p
        keep_sorted = (cumulative - jax.nn.softmax(sorted_logits)) < top_p
        threshold = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, NEG_INF, logits)
    return logits


@functools.partial(
    jax.jit,
    static_argnames=("model", "temperature", "top_k", "top_p", "eos_id", "extra_length", "chunk"),
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
    extra_length: int = 50,
    chunk: int = 8,
) -> SearchResult:
    """Ancestral sampling with temperature, top-k and nucleus (top-p) filtering; reproducible for
    a fixed `rng` (step i draws with `fold_in(rng, i)`). Arguments as `greedy_search`; scores are
    log-probabilities under the unfiltered model."""

    def pick(logits: Array, step: Array) -> Array:
        filtered = filter_logits(logits, temperature, top_k, top_p)
        return jax.random.categorical(jax.random.fold_in(rng, step), filtered, axis=-1)

    return _autoregressive(model, params, src, pick, eos_id, extra_length, chunk)


@struct.dataclass
class _BeamState:
    cache: DecodeCache  # batch * beam rows
    alive_ids: Array  # [batch, beam, max_steps]
    alive_log_probs: Array  # [batch, beam]
    finished_ids: Array  # [batch, beam, max_steps]
    finished_scores: Array  # [batch, beam], length-penalised; NEG_INF when empty
    finished_lengths: Array  # [batch, beam]
    done: Array  # [batch]


def _gather_beams(x: Array, indices: Array) -> Array:
    """x `[batch, beams, ...]`, indices `[batch, k]` -> `[batch, k, ...]`."""
    return jnp.take_along_axis(x, indices.reshape(indices.shape + (1,) * (x.ndim - 2)), axis=1)


def reorder_cache(cache: DecodeCache, beam_indices: Array) -> DecodeCache:
    """Make row (b, j) of every self-attention K/V cache the former row (b, beam_indices[b, j]).

    Cross-attention K/V and the source mask are the same for every beam of a sentence, so they
    are left alone.
    """
    batch, beam = beam_indices.shape
    # One row index per new row: a plain gather of contiguous [heads, max_len, d] blocks, which
    # XLA lowers to row copies (take_along_axis over a beam axis became a select per element).
    rows = (jnp.arange(batch)[:, None] * beam + beam_indices).reshape(-1)

    def gather(x: Array) -> Array:
        return x.at[rows].get(mode="promise_in_bounds")

    layers = tuple(
        layer.replace(self_k=gather(layer.self_k), self_v=gather(layer.self_v))
        for layer in cache.layers
    )
    return cache.replace(layers=layers)


@functools.partial(
    jax.jit, static_argnames=("model", "beam_size", "alpha", "eos_id", "extra_length", "chunk")
)
def beam_search(
    model: Transformer,
    params,
    src: Array,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    eos_id: int | None = EOS_ID,
    extra_length: int = 50,
    chunk: int = 8,
) -> BeamSearchResult:
    """Beam search with the GNMT length penalty (section 6.1: beam 4, alpha 0.6, source length +
    50). Hypotheses are ranked by log P(Y) / lp(Y), |Y| counting EOS. A hypothesis that reaches
    its maximum length without EOS is finished there. A sentence stops once its k-th best
    finished score beats anything its alive beams could still reach.

    Returns a `BeamSearchResult` (best hypothesis first). Other arguments as `greedy_search`.
    """
    batch, beam = src.shape[0], beam_size
    max_steps = _max_steps(src.shape[1], extra_length, chunk)
    limits = output_limits(src, extra_length, max_steps)
    variables = {"params": params}
    state = _BeamState(
        cache=_prepare(model, params, src, beam, max_steps),
        alive_ids=jnp.full((batch, beam, max_steps), PAD_ID, jnp.int32),
        # only beam 0 is live at the start, so the first step does not pick duplicates
        alive_log_probs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (beam - 1)), (batch, 1)),
        finished_ids=jnp.full((batch, beam, max_steps), PAD_ID, jnp.int32),
        finished_scores=jnp.full((batch, beam), NEG_INF),
        finished_lengths=jnp.zeros((batch, beam), jnp.int32),
        done=limits <= 0,
    )

    def step(state: _BeamState, i: Array) -> _BeamState:
        last = jnp.where(i == 0, BOS_ID, state.alive_ids[:, :, jnp.maximum(i - 1, 0)])
        logits, cache = model.apply(
            variables, state.cache, last.reshape(-1), i, method=Transformer.decode_step
        )
        log_probs = jax.nn.log_softmax(logits).reshape(batch, beam, -1)
        vocab = log_probs.shape[-1]
        candidates = (state.alive_log_probs[:, :, None] + log_probs).reshape(batch, -1)
        # 2k candidates always leave k that did not just end
        top_log_probs, top_flat = jax.lax.top_k(candidates, 2 * beam)
        top_beams, top_tokens = top_flat // vocab, top_flat % vocab
        top_ids = _gather_beams(state.alive_ids, top_beams).at[:, :, i].set(top_tokens)
        ended = (i + 1 >= limits)[:, None]
        if eos_id is not None:
            ended = ended | (top_tokens == eos_id)

        # alive: the k best candidates that did not end
        alive_scores = jnp.where(ended, NEG_INF, top_log_probs)
        alive_log_probs, alive_pick = jax.lax.top_k(alive_scores, beam)
        alive_ids = _gather_beams(top_ids, alive_pick)
        cache = reorder_cache(cache, jnp.take_along_axis(top_beams, alive_pick, axis=1))

        # finished: the k best of the old finished and the candidates that ended now
        length = i + 1
        new_scores = jnp.where(ended, top_log_probs / length_penalty(length, alpha), NEG_INF)
        all_scores = jnp.concatenate([state.finished_scores, new_scores], axis=1)
        all_ids = jnp.concatenate([state.finished_ids, top_ids], axis=1)
        all_lengths = jnp.concatenate(
            [state.finished_lengths, jnp.full((batch, 2 * beam), length, jnp.int32)], axis=1
        )
        finished_scores, finished_pick = jax.lax.top_k(all_scores, beam)
        finished_ids = _gather_beams(all_ids, finished_pick)
        finished_lengths = jnp.take_along_axis(all_lengths, finished_pick, axis=1)

        # the best an alive beam can still reach: its log-prob can only fall, and the penalty
        # is largest at the sentence's length limit (alpha >= 0)
        best_reachable = alive_log_probs[:, 0] / length_penalty(limits, alpha)
        if alpha < 0:
            best_reachable = alive_log_probs[:, 0] / length_penalty(length + 1, alpha)
        done_now = (finished_scores[:, -1] >= best_reachable) | (length >= limits)

        def keep_if_done(old: Array, new: Array) -> Array:
            shape = (batch,) + (1,) * (new.ndim - 1)
            return jnp.where(state.done.reshape(shape), old, new)

        return _BeamState(
            cache=cache,
            alive_ids=alive_ids,
            alive_log_probs=alive_log_probs,
            finished_ids=keep_if_done(state.finished_ids, finished_ids),
            finished_scores=keep_if_done(state.finished_scores, finished_scores),
            finished_lengths=keep_if_done(state.finished_lengths, finished_lengths),
            done=state.done | done_now,
        )

    state = _chunked_loop(step, state, lambda s: jnp.all(s.done), max_steps, chunk)
    return BeamSearchResult(
        ids=state.finished_ids[:, 0],
        scores=state.finished_scores[:, 0],
        lengths=state.finished_lengths[:, 0],
        beams=state.finished_ids,
        beam_scores=state.finished_scores,
    )


@functools.partial(jax.jit, static_argnames=("model", "eos_id", "extra_length"))
def greedy_search_uncached(
    model: Transformer, params, src: Array, *, eos_id: int | None = EOS_ID, extra_length: int = 50
) -> SearchResult:
    """Greedy decoding WITHOUT a cache: every step re-runs the whole decoder over the full
    `[batch, max_steps]` prefix buffer (the causal mask hides the unwritten tail). The baseline
    that the cached decoders are measured and checked against."""
    batch = src.shape[0]
    max_steps = src.shape[1] + extra_length
    limits = output_limits(src, extra_length, max_steps)
    variables = {"params": params}
    encoded = model.apply(variables, src, method=Transformer.encode)

    def step(carry, i):
        inputs, out = carry
        logits = model.apply(variables, encoded, src, inputs, method=Transformer.decode)
        log_probs = jax.nn.log_softmax(jax.lax.dynamic_index_in_dim(logits, i, 1, False))
        token, out = out.emit(jnp.argmax(log_probs, -1), log_probs, i, limits, eos_id)
        inputs = jax.lax.dynamic_update_index_in_dim(
            inputs, token, jnp.minimum(i + 1, max_steps - 1), 1
        )
        return (inputs, out), None

    inputs = jnp.zeros((batch, max_steps), jnp.int32).at[:, 0].set(BOS_ID)
    carry = (inputs, _Emitted.start(batch, max_steps, limits))
    (_, out), _ = jax.lax.scan(step, carry, jnp.arange(max_steps))
    return SearchResult(ids=out.ids, scores=out.scores, lengths=out.lengths)


__all__ = [
    "SearchResult",
    "BeamSearchResult",
    "greedy_search",
    "sample",
    "beam_search",
    "greedy_search_uncached",
    "length_penalty",
    "filter_logits",
    "reorder_cache",
    "output_limits",
]
