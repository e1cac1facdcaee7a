"""The searches of section 6.1 over any autoregressive model: greedy search and sampling (one
token per step) and beam search with the GNMT length penalty.

A model enters only as a step function

    step_fn(cache, tokens [rows], position) -> (logits [rows, vocab] float32, cache)

and a cache (any pytree) that beam search asks to reorder its own rows with
`cache.reorder_beams(rows)`. The step runs inside a `lax.scan` of `chunk` steps within a
`lax.while_loop` that stops once every sentence has finished, so steps after the last EOS cost
nothing. `tfm.inference.decoding` plugs the Transformer in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from tfm.tokens import BOS_ID, EOS_ID, PAD_ID

Array = jax.Array
StepFn = Callable[[Any, Array, Array], tuple[Array, Any]]
NEG_INF = -1.0e9  # large finite negative: scores stay finite under arithmetic

# Section 6.1: beam size 4, length penalty alpha 0.6, maximum output length input length + 50.
PAPER_BEAM_SIZE = 4
PAPER_ALPHA = 0.6
PAPER_EXTRA_LENGTH = 50


@struct.dataclass
class SearchResult:
    """ids: `[batch, max_steps]` generated tokens (EOS included, PAD after it); scores: `[batch]`
    sum of token log-probabilities (beam search: divided by the length penalty); lengths:
    `[batch]` tokens generated, EOS included; complete: `[batch]` the row's search ended within
    `max_steps` (False only when its length limit lies beyond them: its result is then cut
    short, and a caller runs it again with more steps)."""

    ids: Array
    scores: Array
    lengths: Array
    complete: Array = None


@struct.dataclass
class BeamSearchResult(SearchResult):
    """The best hypothesis per sentence (`ids`, `scores`, `lengths`) and all kept finished
    hypotheses, best first: beams `[batch, beam, max_steps]`, beam_scores `[batch, beam]`."""

    beams: Array = None
    beam_scores: Array = None


def length_penalty(length: Array, alpha: float | Array) -> Array:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016), used by section 6.1."""
    return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


def first_argmax(x: Array) -> Array:
    """`jnp.argmax(x, axis=-1)`: the first index of each row's maximum, a NaN counting as the
    maximum. Computed with plain reductions (a max, then the least index holding it or a NaN),
    which XLA:CPU vectorizes, where its argmax is one (value, index) pair reduction that it does
    not: SMALL greedy decoding ran ~5% faster (benchmarks/README.md, round six). The indices are
    float32 where they are exact (below 2^24): XLA:CPU splits an int32 min-reduction into three
    passes, a float32 one runs as one; and the first NaN and the first maximum come from one
    min-reduction (benchmarks/README.md, round eight)."""
    size = x.shape[-1]
    dtype = jnp.float32 if size < 2**24 else jnp.int32
    indices = jnp.arange(size, dtype=dtype)
    # XLA:CPU's max may skip NaNs or return one; either way a NaN's key is below every other
    # (index - size < 0), so one min-reduction finds the first NaN, else the first maximum
    maximum = jnp.max(x, axis=-1, keepdims=True)
    key = jnp.where(jnp.isnan(x), indices - size, jnp.where(x == maximum, indices, size))
    first = jnp.min(key, axis=-1)
    return jnp.where(first < 0, first + size, first).astype(jnp.int32)


def token_log_probs(logits: Array, tokens: Array) -> Array:
    """`log_softmax(logits)` at `tokens` (`[batch, vocab]`, `[batch]` -> `[batch]`): the token's
    logit less the log of the partition sum, without writing the whole `[batch, vocab]`
    log-softmax that a one-token-per-step search reads one entry of."""
    maximum = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    log_sum = jnp.log(jnp.sum(jnp.exp(logits - maximum), axis=-1))
    picked = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
    return picked - maximum[:, 0] - log_sum


def top_k_in_chunks(x: Array, k: int, chunk: int = 64) -> tuple[Array, Array]:
    """`jax.lax.top_k(x, k)` over the last axis, same values and indices (ties to the lower
    index) for input without NaN, reading most of `x` only once: the k best are in the k chunks
    of `chunk` entries with the best maxima (any other chunk has k entries ahead of its best),
    so XLA:CPU's TopK runs over those k chunks, not the row. Beam search's `[batch, beam * vocab]`
    candidates: 0.63 -> 0.16 ms for `[16, 32000]` (benchmarks/README.md, round eight)."""
    n = x.shape[-1]
    if n < 2 * k * chunk:
        return jax.lax.top_k(x, k)
    if n % chunk:  # -inf padding comes after every real entry, so it is never picked over one
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, chunk - n % chunk)], constant_values=-jnp.inf)
    chunks = x.reshape(x.shape[:-1] + (-1, chunk))  # [..., chunks, chunk]
    _, best = jax.lax.top_k(jnp.max(chunks, axis=-1), k)  # [..., k]
    best = jnp.sort(best, axis=-1)  # in index order, so that ties resolve as over the whole row
    picked = jnp.take_along_axis(chunks, best[..., None], axis=-2)  # [..., k, chunk]
    values, at = jax.lax.top_k(picked.reshape(picked.shape[:-2] + (k * chunk,)), k)
    return values, jnp.take_along_axis(best, at // chunk, axis=-1) * chunk + at % chunk


def _run_in_chunks(step_fn, state, done_fn, max_steps: int, chunk: int):
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


# ---------------------------------------------------------------------------------------------
# One token per step: greedy search and sampling.


@struct.dataclass
class Hypotheses:
    """What a one-token-per-step search has produced so far, one hypothesis per row."""

    ids: Array  # [batch, max_steps]
    scores: Array  # [batch] sum of log-probabilities
    lengths: Array  # [batch]
    done: Array  # [batch]

    @classmethod
    def empty(cls, batch: int, max_steps: int, max_lengths: Array) -> Hypotheses:
        return cls(
            ids=jnp.full((batch, max_steps), PAD_ID, jnp.int32),
            scores=jnp.zeros((batch,), jnp.float32),
            lengths=jnp.zeros((batch,), jnp.int32),
            done=max_lengths <= 0,
        )

    def extend(
        self, token: Array, logits: Array, i: Array, max_lengths: Array, eos_id: int | None
    ) -> tuple[Array, Hypotheses]:
        """Record step i's `[batch]` token for sentences still running (PAD for finished ones),
        add its log-probability under `[batch, vocab]` logits; a sentence finishes on EOS or at
        its length limit."""
        active = ~self.done
        token = jnp.where(active, token, PAD_ID).astype(jnp.int32)
        token_log_prob = token_log_probs(logits, token)
        finished = i + 1 >= max_lengths
        if eos_id is not None:
            finished = finished | (token == eos_id)
        return token, Hypotheses(
            ids=self.ids.at[:, i].set(token),
            scores=self.scores + jnp.where(active, token_log_prob, 0.0),
            lengths=self.lengths + active.astype(jnp.int32),
            done=self.done | finished,
        )


@struct.dataclass
class _TokenByTokenState:
    cache: Any
    last: Array  # [batch] token fed at the next step
    out: Hypotheses


def search_one_token_per_step(
    step_fn: StepFn,
    cache,
    max_lengths: Array,
    max_steps: int,
    pick: Callable[[Array, Array], Array],
    *,
    eos_id: int | None = EOS_ID,
    chunk: int = 8,
) -> SearchResult:
    """Greedy search or sampling over any model: at step i, `pick(logits [batch, vocab], i)`
    chooses each row's next token, which is fed back through `step_fn`.

    Args:
      step_fn: `(cache, tokens [batch], position) -> (logits [batch, vocab], cache)`.
      cache: the step function's state for `batch` rows (any pytree).
      max_lengths: `[batch]` most tokens each row may generate; a row whose limit lies beyond
        `max_steps` and that has not ended by then is left incomplete (`complete`).
      max_steps: output positions allocated (static).
      pick: the choice rule, e.g. argmax.
      eos_id: a row finishes after emitting this token; None = only at its length limit.
      chunk: steps per scan between checks for "all finished".
    """
    batch = max_lengths.shape[0]
    state = _TokenByTokenState(
        cache=cache,
        last=jnp.full((batch,), BOS_ID, jnp.int32),
        out=Hypotheses.empty(batch, max_steps, max_lengths),
    )

    def step(state: _TokenByTokenState, i: Array) -> _TokenByTokenState:
        logits, cache = step_fn(state.cache, state.last, i)
        token, out = state.out.extend(pick(logits, i), logits, i, max_lengths, eos_id)
        return _TokenByTokenState(cache=cache, last=token, out=out)

    state = _run_in_chunks(step, state, lambda s: jnp.all(s.out.done), max_steps, chunk)
    out = state.out
    return SearchResult(ids=out.ids, scores=out.scores, lengths=out.lengths, complete=out.done)


# ---------------------------------------------------------------------------------------------
# Beam search.


@struct.dataclass
class BeamState:
    """Beam search after each step, for `batch` sentences of `beam` hypotheses each.

    cache: the step function's state for `batch * beam` rows (sentence-major).
    alive_ids: `[batch, beam, max_steps]` hypotheses still growing, best first.
    alive_log_probs: `[batch, beam]` their summed log-probabilities (NEG_INF = empty slot).
    finished_ids: `[batch, beam, max_steps]` hypotheses that ended (EOS or length limit).
    finished_scores: `[batch, beam]` log P(Y) / lp(Y), best first; NEG_INF = empty slot.
    finished_lengths: `[batch, beam]` tokens of each finished hypothesis, EOS included.
    done: `[batch]` no alive hypothesis can beat the worst kept finished one any more.
    """

    cache: Any
    alive_ids: Array
    alive_log_probs: Array
    finished_ids: Array
    finished_scores: Array
    finished_lengths: Array
    done: Array

    @classmethod
    def start(cls, cache, max_lengths: Array, beam: int, max_steps: int) -> BeamState:
        batch = max_lengths.shape[0]
        return cls(
            cache=cache,
            alive_ids=jnp.full((batch, beam, max_steps), PAD_ID, jnp.int32),
            # only beam 0 is live at the start, so the first step does not pick duplicates
            alive_log_probs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (beam - 1)), (batch, 1)),
            finished_ids=jnp.full((batch, beam, max_steps), PAD_ID, jnp.int32),
            finished_scores=jnp.full((batch, beam), NEG_INF, jnp.float32),  # not weakly typed
            finished_lengths=jnp.zeros((batch, beam), jnp.int32),
            done=max_lengths <= 0,
        )


def _gather_beams(x: Array, indices: Array) -> Array:
    """x `[batch, beams, ...]`, indices `[batch, k]` -> `[batch, k, ...]`."""
    return jnp.take_along_axis(x, indices.reshape(indices.shape + (1,) * (x.ndim - 2)), axis=1)


def _last_tokens(alive_ids: Array, i: Array) -> Array:
    """`[batch, beam]` tokens each hypothesis ends with before step `i` (BOS at step 0)."""
    if jnp.ndim(i) == 0:
        return jnp.where(i == 0, BOS_ID, alive_ids[:, :, jnp.maximum(i - 1, 0)])
    previous = jnp.maximum(i - 1, 0)[:, None, None]  # [b, 1, 1]
    last = jnp.take_along_axis(alive_ids, previous, axis=2)[:, :, 0]
    return jnp.where(i[:, None] == 0, BOS_ID, last)


def _write_step(ids: Array, tokens: Array, i: Array) -> Array:
    """`ids` `[batch, n, T]` with `tokens` `[batch, n]` written at step `i` (`[]` or `[batch]`)."""
    if jnp.ndim(i) == 0:
        return ids.at[:, :, i].set(tokens)
    at_step = jnp.arange(ids.shape[2]) == i[:, None, None]  # [b, 1, T]
    return jnp.where(at_step, tokens[:, :, None], ids)


def _flat_rows(beam_indices: Array) -> Array:
    """`[batch, beam]` beam picks within each sentence -> `[batch * beam]` flat cache rows."""
    batch, beam = beam_indices.shape
    return (jnp.arange(batch)[:, None] * beam + beam_indices).reshape(-1)


def beam_search_step(
    step_fn: StepFn,
    state: BeamState,
    i: Array,
    max_lengths: Array,
    alpha: float | Array,
    eos_id: int | None,
    settle: str = "best",
) -> BeamState:
    """Extend every alive hypothesis by every token, keep the best `beam` that did not end as the
    new alive set and merge those that ended into the finished set (section 6.1).

    `i` is the step: a scalar, or `[batch]` when each sentence is at its own step (sentences
    that started at different times, `tfm.inference.slots`)."""
    batch, beam = state.alive_log_probs.shape
    per_sentence = jnp.ndim(i) == 1
    last = _last_tokens(state.alive_ids, i)  # [b, k]
    positions = jnp.repeat(i, beam) if per_sentence else i
    logits, cache = step_fn(state.cache, last.reshape(-1), positions)  # [b * k, vocab]
    log_probs = jax.nn.log_softmax(logits).reshape(batch, beam, -1)  # [b, k, vocab]
    vocab = log_probs.shape[-1]
    candidates = (state.alive_log_probs[:, :, None] + log_probs).reshape(batch, -1)  # [b, k*V]
    # 2k candidates always leave k that did not just end
    top_log_probs, top_flat = top_k_in_chunks(candidates, 2 * beam)  # [b, 2k]
    top_beams, top_tokens = top_flat // vocab, top_flat % vocab  # [b, 2k]
    top_ids = _write_step(_gather_beams(state.alive_ids, top_beams), top_tokens, i)  # [b, 2k, T]
    ended = (i + 1 >= max_lengths)[:, None]  # [b, 1]
    if eos_id is not None:
        ended = ended | (top_tokens == eos_id)  # [b, 2k]

    # alive: the k best candidates that did not end
    alive_scores = jnp.where(ended, NEG_INF, top_log_probs)
    alive_log_probs, alive_pick = jax.lax.top_k(alive_scores, beam)  # [b, k]
    alive_ids = _gather_beams(top_ids, alive_pick)  # [b, k, T]
    parents = jnp.take_along_axis(top_beams, alive_pick, axis=1)  # [b, k]
    cache = cache.reorder_beams(_flat_rows(parents))

    # finished: the k best of the old finished and the candidates that ended now
    length = i + 1  # [] or [b]
    length_column = jnp.reshape(length, (-1, 1))  # [1 or b, 1]
    new_scores = jnp.where(ended, top_log_probs / length_penalty(length_column, alpha), NEG_INF)
    all_scores = jnp.concatenate([state.finished_scores, new_scores], axis=1)  # [b, 3k]
    all_ids = jnp.concatenate([state.finished_ids, top_ids], axis=1)  # [b, 3k, T]
    new_lengths = jnp.broadcast_to(length_column, (batch, 2 * beam)).astype(jnp.int32)
    all_lengths = jnp.concatenate([state.finished_lengths, new_lengths], axis=1)
    finished_scores, finished_pick = jax.lax.top_k(all_scores, beam)  # [b, k]
    finished_ids = _gather_beams(all_ids, finished_pick)  # [b, k, T]
    finished_lengths = jnp.take_along_axis(all_lengths, finished_pick, axis=1)

    # the best an alive beam can still reach: its log-prob can only fall, and the penalty is
    # largest at the sentence's length limit when alpha >= 0, at its next length when alpha < 0
    # (alpha may be traced: one program serves every alpha)
    reach = jnp.where(alpha < 0, length + 1, max_lengths)  # [b]
    best_reachable = alive_log_probs[:, 0] / length_penalty(reach, alpha)  # [b]
    settled = finished_scores[:, 0] if settle == "best" else finished_scores[:, -1]
    done_now = (settled >= best_reachable) | (length >= max_lengths)

    def keep_if_done(old: Array, new: Array) -> Array:
        shape = (batch,) + (1,) * (new.ndim - 1)
        return jnp.where(state.done.reshape(shape), old, new)

    return BeamState(
        cache=cache,
        alive_ids=alive_ids,
        alive_log_probs=alive_log_probs,
        finished_ids=keep_if_done(state.finished_ids, finished_ids),
        finished_scores=keep_if_done(state.finished_scores, finished_scores),
        finished_lengths=keep_if_done(state.finished_lengths, finished_lengths),
        done=state.done | done_now,
    )


def search_beams(
    step_fn: StepFn,
    cache,
    max_lengths: Array,
    max_steps: int,
    *,
    beam_size: int = PAPER_BEAM_SIZE,
    alpha: float = PAPER_ALPHA,
    eos_id: int | None = EOS_ID,
    chunk: int = 8,
    settle: str = "best",
) -> BeamSearchResult:
    """Beam search over any model. Hypotheses are ranked by log P(Y) / lp(Y), |Y| counting EOS;
    one that reaches its length limit without EOS is finished there; a sentence stops once its
    best finished score (`settle="best"`) or its k-th best (`settle="beams"`) beats anything its
    alive beams could still reach. Either way the best hypothesis is exact; "best" (the stop_early
    rule of the paper's tensor2tensor) stops sooner, and only "beams" makes every kept finished
    hypothesis (`beams`) the k best.

    Args:
      step_fn: `(cache, tokens [batch * beam], position) -> (logits [batch * beam, vocab],
        cache)`; row `b * beam + j` is beam j of sentence b.
      cache: the step function's state for `batch * beam` rows, with a method
        `reorder_beams(rows [batch * beam]) -> cache` that makes new row r the old row
        `rows[r]` (rows only ever move within one sentence's beams).
      max_lengths: `[batch]` most tokens each sentence may generate (see
        `search_one_token_per_step`).
      max_steps, eos_id, chunk: as `search_one_token_per_step`.
    """
    if settle not in ("best", "beams"):
        raise ValueError(f"settle must be 'best' or 'beams', got {settle!r}")
    state = BeamState.start(cache, max_lengths, beam_size, max_steps)
    step = functools.partial(
        beam_search_step,
        step_fn,
        max_lengths=max_lengths,
        alpha=alpha,
        eos_id=eos_id,
        settle=settle,
    )
    state = _run_in_chunks(step, state, lambda s: jnp.all(s.done), max_steps, chunk)
    return BeamSearchResult(
        ids=state.finished_ids[:, 0],
        scores=state.finished_scores[:, 0],
        lengths=state.finished_lengths[:, 0],
        complete=state.done,
        beams=state.finished_ids,
        beam_scores=state.finished_scores,
    )


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
