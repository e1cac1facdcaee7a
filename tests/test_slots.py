"""Continuous batching (`tfm.inference.slots`): sentences streamed through a few slots get exactly
the results of `tfm.inference.decoding.beam_search` on each sentence."""

import collections

import jax
import numpy as np
import pytest

from tests.conftest import fresh_model_config, tiny_model_config
from tfm import Transformer
from tfm.inference import decoding, slots
from tfm.tokens import EOS_ID

SRC_LEN = 8
POSITIONS = 2 * SRC_LEN + 16  # as translate's first try


@pytest.fixture(scope="module")
def setup():
    model = Transformer(tiny_model_config(40, max_positions=128))
    params = model.init(
        jax.random.key(0), np.ones((1, SRC_LEN), np.int32), np.ones((1, 4), np.int32)
    )["params"]
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, SRC_LEN, 23)
    sources = [np.array([*rng.integers(4, 40, n), EOS_ID], np.int32) for n in lengths]
    batch = np.zeros((len(sources), SRC_LEN), np.int32)
    for i, ids in enumerate(sources):
        batch[i, : len(ids)] = ids
    # an untrained model seldom ends a sentence: stand-in EOS ids are tokens greedy search emits
    greedy = decoding.greedy_search(model, params, batch, eos_id=None, max_steps=POSITIONS)
    common = collections.Counter(np.asarray(greedy.ids)[:, 3:8].ravel().tolist()).most_common(3)
    return model, params, sources, batch, [int(token) for token, _ in common]


@pytest.mark.parametrize("which_eos, block", [(0, 5), (0, 64), (2, 8), (None, 16)])
def test_streamed_results_equal_beam_search_sentence_by_sentence(setup, which_eos, block):
    """In blocks smaller than the slots and larger than all the sentences; with most sentences
    ending early, some, and none (every one out of positions)."""
    model, params, sources, batch, eos_ids = setup
    eos_id = None if which_eos is None else eos_ids[which_eos]
    settings = slots.StreamSettings(
        rows=4, src_len=SRC_LEN, max_steps=POSITIONS, block=block, beam_size=4, eos_id=eos_id
    )
    found, needs_more = slots.search_stream(model, params, sources, settings)
    expected = decoding.beam_search(model, params, batch, max_steps=POSITIONS, eos_id=eos_id)
    complete = np.asarray(expected.complete)
    assert sorted(found) == [i for i in range(len(sources)) if complete[i]]
    assert sorted(needs_more) == [i for i in range(len(sources)) if not complete[i]]
    for i, ids in found.items():
        np.testing.assert_array_equal(ids, np.asarray(expected.ids[i]), err_msg=f"source {i}")
    if which_eos == 0:  # the case meant to exercise refilling: most sentences end early
        assert complete.sum() > len(sources) // 2


def test_one_program_however_many_blocks(setup):
    """The slots a block leaves are the next block's input: their types match the first call's
    (a weakly typed score array once made every second block compile the program again); and
    another alpha runs the same program."""
    model, params, sources, _, eos_ids = setup
    model = model.clone(config=fresh_model_config(40, max_positions=128))  # compiled anew
    settings = slots.StreamSettings(
        rows=3, src_len=SRC_LEN, max_steps=POSITIONS, block=4, beam_size=4, eos_id=eos_ids[1]
    )
    before = slots.stream._cache_size()
    left = []
    slots.search_stream(model, params, sources, settings, progress=left.append)  # 6 blocks
    assert slots.stream._cache_size() - before == 1
    assert len(left) == 6 and sum(left) == len(sources)  # reported block by block
    slots.search_stream(model, params, sources, settings._replace(alpha=1.0))  # alpha is traced
    assert slots.stream._cache_size() - before == 1


def test_a_second_search_of_a_bucket_traces_nothing(setup, monkeypatch):
    """The empty slots' shapes come from tracing the encoder and cache set-up; a warm
    translation of a file re-traced them per length bucket (~0.09 s each, the device idle).
    Now once per bucket and parameter shapes; other rows, or other parameter dtypes, trace
    again, and the slots are those of a fresh trace."""
    model, params, sources, _, eos_ids = setup
    traced = []
    original = slots.encode_and_init_cache

    def counting(*args):
        traced.append(args[2].shape)  # src
        return original(*args)

    monkeypatch.setattr(slots, "encode_and_init_cache", counting)
    slots._slot_shapes.cache_clear()
    settings = slots.StreamSettings(
        rows=3, src_len=SRC_LEN, max_steps=POSITIONS, block=8, beam_size=4, eos_id=eos_ids[0]
    )
    first = slots.search_stream(model, params, sources, settings)
    after_first = list(traced)  # the slots' shapes, and jit tracing `stream` for the block
    second = slots.search_stream(model, params, sources, settings)
    assert traced == after_first and after_first.count((3, SRC_LEN)) == 1
    assert sorted(first[0]) == sorted(second[0]) and first[1] == second[1]
    for i, ids in first[0].items():
        np.testing.assert_array_equal(ids, second[0][i])
    slots.empty_slots(model, params, 5, SRC_LEN, 4, POSITIONS)
    halves = jax.tree.map(lambda p: p.astype(np.float16), params)
    empty = slots.empty_slots(model, halves, 5, SRC_LEN, 4, POSITIONS)
    assert traced == [*after_first, (5, SRC_LEN), (5, SRC_LEN)]
    fresh_cache = jax.eval_shape(
        lambda p: decoding.encode_and_init_cache(
            model, p, np.zeros((5, SRC_LEN), np.int32), 4, POSITIONS
        ),
        halves,
    )
    for mine, fresh in zip(
        jax.tree.leaves(empty.beams.cache), jax.tree.leaves(fresh_cache), strict=True
    ):
        assert (mine.shape, mine.dtype) == (fresh.shape, fresh.dtype)


def test_a_stream_program_traces_its_step_once(setup, monkeypatch):
    """`stream` runs `_STEPS_PER_ITERATION` steps per loop iteration; tracing each again made a
    first run with a previous run's compilation cache trace ~1.5x what one step needs, per
    length bucket. One trace of the step serves every step of the iteration."""
    model, params, _, _, eos_ids = setup
    assert slots._STEPS_PER_ITERATION > 1
    traced = []
    original = slots._step

    def counting(*args):
        traced.append(args[1].steps.shape)
        return original(*args)

    monkeypatch.setattr(slots, "_step", counting)
    settings = slots.StreamSettings(
        rows=7, src_len=SRC_LEN, max_steps=POSITIONS, block=8, beam_size=4, eos_id=eos_ids[0]
    )
    slots.lowered(model.clone(kernels="xla_cpu"), params, settings)
    assert traced == [(7,)]
    # "auto" stages both platforms' programs (the kit's and the reference's): one trace each
    traced.clear()
    slots.lowered(model.clone(kernels="auto"), params, settings)
    assert traced == [(7,), (7,)]
