"""The searches of `tfm.inference.search` with a hand-made model: a 5-token second-order Markov
chain whose step function reads the token before last from its cache, so a search that reorders the
cache wrongly scores the wrong hypotheses. Checked against exhaustive enumeration in NumPy."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tfm.inference import search
from tfm.tokens import BOS_ID, EOS_ID, PAD_ID

A, B = 3, 4  # the two content tokens; 0 PAD, 1 BOS, 2 EOS complete the 5-token vocabulary
# P(next | token before last, last token) over (EOS, A, B); BOS stands in before the start
TABLE = {
    (BOS_ID, BOS_ID): (0.05, 0.55, 0.40),
    (BOS_ID, A): (0.30, 0.35, 0.35),
    (BOS_ID, B): (0.10, 0.15, 0.75),
    (A, A): (0.40, 0.30, 0.30),
    (A, B): (0.50, 0.25, 0.25),
    (B, A): (0.20, 0.20, 0.60),
    (B, B): (0.85, 0.05, 0.10),
}
ALPHA = 0.6


def _log_prob_table() -> np.ndarray:
    """`[5, 5, 5]` log P(next | before last, last); impossible tokens get -1e9."""
    table = np.full((5, 5, 5), -1e9, np.float32)
    for (before, last), probs in TABLE.items():
        table[before, last, [EOS_ID, A, B]] = np.log(probs)
    return table


@struct.dataclass
class HistoryCache:
    """Every token fed so far, per row: `[rows, max_steps]`."""

    history: jax.Array

    def reorder_beams(self, rows: jax.Array) -> "HistoryCache":
        return HistoryCache(self.history[rows])


@struct.dataclass
class ForgetfulCache(HistoryCache):
    """A cache that ignores beam search's reorder: its rows keep other hypotheses' history."""

    def reorder_beams(self, rows: jax.Array) -> "ForgetfulCache":
        return self


def _step_fn(cache, tokens, position):
    table = jnp.asarray(_log_prob_table())
    before = jnp.where(position > 0, cache.history[:, jnp.maximum(position - 1, 0)], BOS_ID)
    logits = table[before, tokens]
    return logits, cache.replace(history=cache.history.at[:, position].set(tokens))


def _exhaustive_best(max_length: int) -> tuple[list[int], float]:
    """The hypothesis with the highest log P / lp(|Y|): any content sequence followed by EOS
    within max_length tokens, or max_length content tokens (finished at the limit)."""
    log_probs = _log_prob_table()
    best, best_score = None, -np.inf
    for length in range(0, max_length + 1):
        for content in itertools.product((A, B), repeat=length):
            tokens = list(content) + ([EOS_ID] if length < max_length else [])
            before, last, total = BOS_ID, BOS_ID, 0.0
            for token in tokens:
                total += float(log_probs[before, last, token])
                before, last = last, token
            score = total / ((5.0 + len(tokens)) / 6.0) ** ALPHA
            if score > best_score:
                best, best_score = tokens, score
    return best, best_score


def _run_beams(cache_cls, max_lengths, beam_size=4, max_steps=8):
    rows = len(max_lengths) * beam_size
    cache = cache_cls(jnp.zeros((rows, max_steps), jnp.int32))
    return search.search_beams(
        _step_fn,
        cache,
        jnp.asarray(max_lengths),
        max_steps,
        beam_size=beam_size,
        alpha=ALPHA,
        eos_id=EOS_ID,
    )


def _tokens(ids, length) -> list[int]:
    return [int(t) for t in np.asarray(ids)[: int(length)]]


def test_beam_search_finds_the_exhaustive_optimum_of_a_toy_step_function():
    max_lengths = [6, 2]  # the second finishes at its limit, without EOS
    result = _run_beams(HistoryCache, max_lengths)
    for row, limit in enumerate(max_lengths):
        best, best_score = _exhaustive_best(limit)
        assert _tokens(result.ids[row], result.lengths[row]) == best
        np.testing.assert_allclose(float(result.scores[row]), best_score, rtol=1e-5)
        assert all(t == PAD_ID for t in np.asarray(result.ids[row])[len(best) :])


def test_greedy_misses_the_optimum_that_beam_search_finds():
    """The table is a garden path: the likelier first token leads nowhere good."""
    best, _ = _exhaustive_best(6)
    cache = HistoryCache(jnp.zeros((1, 8), jnp.int32))
    greedy = search.search_one_token_per_step(
        _step_fn, cache, jnp.array([6]), 8, lambda logits, i: jnp.argmax(logits, -1)
    )
    assert _tokens(greedy.ids[0], greedy.lengths[0]) != best
    assert _tokens(greedy.ids[0], greedy.lengths[0])[0] == A and best[0] == B


def test_a_cache_that_ignores_the_reorder_scores_the_wrong_hypotheses():
    best, best_score = _exhaustive_best(6)
    result = _run_beams(ForgetfulCache, [6])
    found = _tokens(result.ids[0], result.lengths[0])
    assert found != best or not np.isclose(float(result.scores[0]), best_score, rtol=1e-5)


def test_first_argmax_is_numpys_argmax_with_ties_infinities_and_nans():
    from tfm.inference.search import first_argmax

    rng = np.random.default_rng(0)
    rows = rng.integers(-3, 4, size=(200, 37)).astype(np.float32)  # many tied maxima
    rows[0] = -np.inf
    rows[1, 5:] = np.inf
    rows[2, [4, 9]] = np.nan
    rows[3] = np.nan
    rows[4, -1] = np.nan
    for row in (rows, rows.reshape(10, 20, 37)):
        # NumPy's argmax also returns the first maximum and treats NaN as the maximum
        np.testing.assert_array_equal(np.asarray(first_argmax(row)), np.argmax(row, axis=-1))


def test_token_log_probs_is_numpys_log_softmax_at_the_tokens():
    from tfm.inference.search import token_log_probs

    rng = np.random.default_rng(1)
    logits = rng.normal(scale=4.0, size=(6, 500)).astype(np.float32)
    logits[1] += 1e4  # large logits: the partition sum must not overflow
    logits[2, :250] = -np.inf  # tokens that can never be picked
    tokens = np.array([0, 499, 250, 17, 3, 123], np.int32)
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    expected = log_softmax[np.arange(6), tokens]
    found = np.asarray(token_log_probs(logits, tokens))
    np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-5)


def test_top_k_in_chunks_is_lax_top_k_with_ties_and_infinities():
    from tfm.inference.search import top_k_in_chunks

    rng = np.random.default_rng(2)
    for n, k, chunk in [(1000, 8, 16), (4000, 8, 64), (4003, 6, 64), (300, 8, 64), (2048, 1, 8)]:
        x = rng.integers(-6, 6, size=(9, n)).astype(np.float32)  # many ties
        x[x == -6] = -np.inf
        x[0] = -np.inf
        x[1, :] = 0.0
        x[1, -3:] = 1.0  # the maxima in the last (padded) chunk
        for rows in (x, x.reshape(3, 3, n)):
            expected = jax.lax.top_k(rows, k)
            found = top_k_in_chunks(rows, k, chunk)
            np.testing.assert_array_equal(np.asarray(found[0]), np.asarray(expected[0]))
            np.testing.assert_array_equal(np.asarray(found[1]), np.asarray(expected[1]))
