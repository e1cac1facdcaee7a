import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.uncached_greedy import greedy_search_uncached
from tests.conftest import tiny_model_config
from tfm import Transformer
from tfm.inference import decoding
from tfm.tokens import BOS_ID, PAD_ID

SRC = np.array([[5, 6, 7, 8, 0, 0], [9, 10, 0, 0, 0, 0], [11, 12, 13, 14, 15, 16]])


def _model(seed=0, vocab_size=40, **changes):
    config = tiny_model_config(vocab_size, **{"max_positions": 64, **changes})
    model = Transformer(config)
    params = model.init(jax.random.key(seed), SRC, SRC)["params"]
    return model, params


def _teacher_forced_log_probs(model, params, ids):
    """`[batch, length, vocab]` log-probs of the model fed `ids` shifted right behind BOS, and
    `[batch, length]` those of `ids` themselves."""
    tgt_in = np.concatenate([np.full((ids.shape[0], 1), BOS_ID), ids[:, :-1]], axis=1)
    log_probs = np.asarray(jax.nn.log_softmax(model.apply({"params": params}, SRC, tgt_in)))
    return log_probs, np.take_along_axis(log_probs, ids[..., None], -1)[..., 0]


def _emitted_token(model, params, row, step):
    """A token greedy search emits at `step` of `row` (used as a stand-in EOS id)."""
    result = decoding.greedy_search(model, params, SRC, eos_id=None, extra_length=6)
    return int(result.ids[row, step])


def test_cached_greedy_equals_uncached_greedy():
    for seed in range(3):
        model, params = _model(seed)
        cached = decoding.greedy_search(model, params, SRC, eos_id=None, extra_length=7, chunk=4)
        naive = greedy_search_uncached(model, params, SRC, eos_id=None, extra_length=7)
        width = naive.ids.shape[1]
        np.testing.assert_array_equal(cached.ids[:, :width], naive.ids)
        np.testing.assert_array_equal(cached.ids[:, width:], PAD_ID)
        np.testing.assert_allclose(cached.scores, naive.scores, atol=1e-5)
        np.testing.assert_array_equal(cached.lengths, naive.lengths)


def test_greedy_scores_are_teacher_forced_log_probs():
    model, params = _model(1)
    result = decoding.greedy_search(model, params, SRC, eos_id=None, extra_length=4)
    ids = np.asarray(result.ids)
    log_probs, chosen = _teacher_forced_log_probs(model, params, ids)
    for row, length in enumerate(np.asarray(result.lengths)):
        # greedy picks the arg-max of the teacher-forced distribution at every step
        np.testing.assert_array_equal(ids[row, :length], np.argmax(log_probs, -1)[row, :length])
        np.testing.assert_allclose(result.scores[row], chosen[row, :length].sum(), atol=1e-4)


def test_beam_size_one_equals_greedy():
    model, params = _model(2)
    greedy = decoding.greedy_search(model, params, SRC, extra_length=6)
    beam = decoding.beam_search(model, params, SRC, beam_size=1, alpha=0.0, extra_length=6)
    np.testing.assert_array_equal(beam.ids, greedy.ids)
    np.testing.assert_allclose(beam.scores, greedy.scores, atol=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_score_at_least_greedy_score(alpha):
    for seed in range(3):
        model, params = _model(seed)
        eos = _emitted_token(model, params, 0, 3)
        greedy = decoding.greedy_search(model, params, SRC, eos_id=eos, extra_length=6)
        beam = decoding.beam_search(
            model, params, SRC, beam_size=4, alpha=alpha, eos_id=eos, extra_length=6
        )
        greedy_normalised = (
            np.asarray(greedy.scores) / ((5.0 + np.asarray(greedy.lengths)) / 6.0) ** alpha
        )
        assert np.all(np.asarray(beam.scores) >= greedy_normalised - 1e-5)
        # finished hypotheses come best first
        assert np.all(np.diff(np.asarray(beam.beam_scores), axis=1) <= 1e-6)


def test_beam_search_finds_the_exhaustive_optimum_on_a_tiny_vocabulary():
    vocab, eos, alpha = 5, 2, 0.6
    model, params = _model(3, vocab_size=vocab)
    src = np.array([[4]])  # one source token: at most 1 + 2 = 3 output tokens
    best = -np.inf
    for length in (1, 2, 3):
        for seq in itertools.product(range(vocab), repeat=length):
            if eos in seq[:-1] or (length < 3 and seq[-1] != eos):
                continue
            tgt_in = np.array([[BOS_ID, *seq[:-1]]])
            log_probs = np.asarray(
                jax.nn.log_softmax(model.apply({"params": params}, src, tgt_in))
            )[0]
            total = sum(log_probs[t, tok] for t, tok in enumerate(seq))
            best = max(best, total / ((5 + length) / 6) ** alpha)
    result = decoding.beam_search(
        model, params, src, beam_size=vocab**2, alpha=alpha, eos_id=eos, extra_length=2, chunk=1
    )
    np.testing.assert_allclose(result.scores[0], best, atol=1e-4)


def test_length_penalty_formula():
    lengths = np.array([1, 2, 10, 55])
    for alpha in (0.0, 0.6, 1.0):
        np.testing.assert_allclose(
            decoding.length_penalty(jnp.asarray(lengths), alpha),
            ((5 + lengths) / 6) ** alpha,
            rtol=1e-6,
        )


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_batch_equals_one_by_one(search):
    model, params = _model(4)
    eos = _emitted_token(model, params, 1, 2)

    def run(src):
        if search == "greedy":
            return decoding.greedy_search(model, params, src, eos_id=eos, extra_length=5)
        return decoding.beam_search(model, params, src, eos_id=eos, extra_length=5)

    batched = run(SRC)
    for row in range(SRC.shape[0]):
        alone = run(SRC[row : row + 1])
        length = int(alone.lengths[0])
        assert int(batched.lengths[row]) == length
        np.testing.assert_array_equal(batched.ids[row, :length], alone.ids[0, :length])
        np.testing.assert_allclose(batched.scores[row], alone.scores[0], atol=1e-4)


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_eos_and_maximum_length(search):
    model, params = _model(5)
    extra = 3

    def run(eos):
        if search == "greedy":
            return decoding.greedy_search(model, params, SRC, eos_id=eos, extra_length=extra)
        if search == "beam":
            return decoding.beam_search(model, params, SRC, eos_id=eos, extra_length=extra)
        return decoding.sample(
            model, params, SRC, jax.random.key(0), eos_id=eos, extra_length=extra
        )

    unlimited = run(None)
    src_lengths = (SRC != PAD_ID).sum(1)
    np.testing.assert_array_equal(unlimited.lengths, src_lengths + extra)  # source length + extra
    for row, limit in enumerate(src_lengths + extra):
        assert np.all(np.asarray(unlimited.ids[row, limit:]) == PAD_ID)
    eos = int(unlimited.ids[0, 1])
    stopped = run(eos)
    ids = np.asarray(stopped.ids)
    for row, length in enumerate(np.asarray(stopped.lengths)):
        emitted = ids[row, :length]
        assert eos not in emitted[:-1]
        assert emitted[-1] == eos or length == src_lengths[row] + extra
        assert np.all(ids[row, length:] == PAD_ID)
    assert stopped.lengths[0] <= 2


def test_sampling_is_reproducible_and_top_k_one_is_greedy():
    model, params = _model(6)
    first = decoding.sample(model, params, SRC, jax.random.key(1), temperature=1.5, extra_length=5)
    again = decoding.sample(model, params, SRC, jax.random.key(1), temperature=1.5, extra_length=5)
    other = decoding.sample(model, params, SRC, jax.random.key(2), temperature=1.5, extra_length=5)
    np.testing.assert_array_equal(first.ids, again.ids)
    assert not np.array_equal(first.ids, other.ids)
    greedy = decoding.greedy_search(model, params, SRC, extra_length=5)
    top1 = decoding.sample(model, params, SRC, jax.random.key(3), top_k=1, extra_length=5)
    np.testing.assert_array_equal(top1.ids, greedy.ids)
    np.testing.assert_allclose(top1.scores, greedy.scores, atol=1e-5)


def test_filter_logits_top_k_and_top_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = jnp.log(jnp.asarray(probs))[None]
    kept = lambda x: np.asarray(x[0] > -1e8)  # noqa: E731
    np.testing.assert_array_equal(
        kept(decoding.filter_logits(logits, top_k=2)), [True, True, False, False]
    )
    # smallest set with mass >= 0.7 is {0.5, 0.3}; >= 0.9 adds 0.15
    np.testing.assert_array_equal(
        kept(decoding.filter_logits(logits, top_p=0.7)), [True, True, False, False]
    )
    np.testing.assert_array_equal(
        kept(decoding.filter_logits(logits, top_p=0.9)), [True, True, True, False]
    )
    np.testing.assert_allclose(decoding.filter_logits(logits, temperature=2.0), logits / 2.0)
    with pytest.raises(ValueError, match="temperature"):
        decoding.filter_logits(logits, temperature=0.0)


def test_one_program_per_shape():
    model, params = _model(7)
    decoding.greedy_search(model, params, SRC, extra_length=5)
    before = decoding.greedy_search._cache_size()
    decoding.greedy_search(model, params, SRC[::-1].copy(), extra_length=5)  # new sentences
    assert decoding.greedy_search._cache_size() == before


def test_one_beam_program_serves_every_alpha():
    """alpha is traced: tuning it (section 6.1) compiles nothing new, and each alpha's scores
    are still its hypotheses' teacher-forced log-probs over ((5 + |Y|) / 6)^alpha."""
    model, params = _model(7)
    common = dict(beam_size=2, eos_id=_emitted_token(model, params, 0, 2), extra_length=5)
    found = {0.6: decoding.beam_search(model, params, SRC, alpha=0.6, **common)}
    before = decoding.beam_search._cache_size()
    for alpha in (0.0, 1.0, -0.5):
        found[alpha] = decoding.beam_search(model, params, SRC, alpha=alpha, **common)
    assert decoding.beam_search._cache_size() == before
    for alpha, result in found.items():
        ids = np.asarray(result.ids)
        _, chosen = _teacher_forced_log_probs(model, params, ids)
        for row, length in enumerate(np.asarray(result.lengths)):
            penalty = ((5 + length) / 6) ** alpha
            np.testing.assert_allclose(
                result.scores[row], chosen[row, :length].sum() / penalty, atol=1e-4
            )


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_rows_of_padding_are_finished_from_the_start(search):
    """Rows that only fill a batch generate nothing, and do not keep the loop running."""
    model, params = _model(0)
    src = np.concatenate([SRC[:1], np.zeros((1, SRC.shape[1]), np.int32)])
    if search == "greedy":
        result = decoding.greedy_search(model, params, src)
    else:
        result = decoding.beam_search(model, params, src, beam_size=2)
    assert int(result.lengths[1]) == 0 and np.all(np.asarray(result.ids[1]) == PAD_ID)
    assert int(result.lengths[0]) > 0


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_fewer_steps_give_the_same_search_or_say_it_is_incomplete(search):
    """`max_steps` below the longest allowed output shrinks the cache; rows that end within it
    are the full search's rows, and rows that need more say so."""
    model, params = _model(5)
    eos = _emitted_token(model, params, 0, 2)  # row 0 ends at step 3, the others run on

    def run(max_steps):
        if search == "greedy":
            return decoding.greedy_search(
                model, params, SRC, eos_id=eos, extra_length=20, chunk=4, max_steps=max_steps
            )
        return decoding.beam_search(
            model, params, SRC, eos_id=eos, extra_length=20, chunk=4, max_steps=max_steps
        )

    full = run(None)
    assert np.all(np.asarray(full.complete))
    short = run(8)
    assert short.ids.shape[1] == 8 and full.ids.shape[1] == 6 + 20 + 2  # rounded to chunks
    lengths = np.asarray(full.lengths)
    assert lengths.min() <= 8 < lengths.max()  # both kinds of row
    complete = np.asarray(short.complete)
    for row in range(len(SRC)):
        if lengths[row] > 8:
            assert not complete[row]
        if complete[row]:
            np.testing.assert_array_equal(short.ids[row], full.ids[row, :8])
            assert short.lengths[row] == full.lengths[row]
            np.testing.assert_allclose(short.scores[row], full.scores[row], atol=1e-5)
    if search == "greedy":
        np.testing.assert_array_equal(complete, lengths <= 8)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_stopping_once_the_best_is_settled_keeps_the_best_hypothesis(alpha):
    """settle="best" (tensor2tensor's stop_early) stops a sentence once no alive beam can beat
    its best finished hypothesis, sooner than waiting for all k: the best must not change."""
    for seed in range(3):  # the stand-in EOS from each source row in turn
        model, params = _model(seed)
        eos = _emitted_token(model, params, seed, 2)
        common = dict(beam_size=4, alpha=alpha, eos_id=eos, extra_length=12, chunk=1)
        best = decoding.beam_search(model, params, SRC, settle="best", **common)
        every = decoding.beam_search(model, params, SRC, settle="beams", **common)
        np.testing.assert_array_equal(best.ids, every.ids)
        np.testing.assert_array_equal(best.lengths, every.lengths)
        np.testing.assert_allclose(best.scores, every.scores, atol=1e-6)
    with pytest.raises(ValueError, match="settle"):
        decoding.beam_search(model, params, SRC, settle="first")
