"""tfm.cpu_host.side_by_side: searches run at once on threads, and a batch searched in parts gives
each row the result of the one search over the whole batch."""

import threading

import jax
import numpy as np
import pytest

from tests.conftest import tiny_model_config
from tfm import Transformer
from tfm.cpu_host import side_by_side
from tfm.inference import decoding


@pytest.fixture(scope="module")
def setup():
    model = Transformer(tiny_model_config(40))
    src = np.ones((1, 6), np.int32)
    params = model.init(jax.random.key(3), src, src)["params"]
    rng = np.random.default_rng(4)
    batch = np.zeros((5, 6), np.int32)
    for row, length in enumerate([6, 2, 5, 0, 3]):  # row 3: all padding
        batch[row, :length] = rng.integers(4, 40, length)
    return model, params, batch


@pytest.mark.parametrize("parts", [2, 3, 5])
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_a_batch_in_parts_gives_every_row_the_whole_batch_result(setup, parts, search):
    model, params, batch = setup
    if search == "greedy":
        run, settings = decoding.greedy_search, dict(extra_length=4)
    else:
        run, settings = decoding.beam_search, dict(beam_size=3, extra_length=4)
    whole = run(model, params, batch, **settings)
    split = side_by_side.search_in_parts(run, model, params, batch, parts, **settings)
    for name in ("ids", "scores", "lengths", "complete"):
        expected, got = np.asarray(getattr(whole, name)), np.asarray(getattr(split, name))
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=name)
    assert np.asarray(whole.lengths)[3] == 0 and np.asarray(whole.lengths)[0] > 0


def test_jobs_run_at_once():
    """Each job waits for the other at a barrier: run one after the other, they would time out."""
    barrier = threading.Barrier(2, timeout=30)
    names = side_by_side.run_side_by_side(
        [lambda k=k: (barrier.wait(30), threading.current_thread().name, k)[1:] for k in range(2)]
    )
    assert [k for _, k in names] == [0, 1] and names[0][0] != names[1][0]


def test_a_job_that_fails_raises_once_every_job_has_ended():
    ended = []

    def fails():
        raise RuntimeError("part 0 failed")

    with pytest.raises(RuntimeError, match="part 0 failed"):
        side_by_side.run_side_by_side([fails, lambda: ended.append(1)])
    assert ended == [1]


def test_parts_by_backend_and_cores(monkeypatch):
    assert side_by_side.default_parts("gpu") == 1
    monkeypatch.setattr(side_by_side.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert side_by_side.default_parts("cpu") == 1
    monkeypatch.setattr(
        side_by_side.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False
    )
    assert side_by_side.default_parts("cpu") == side_by_side.MOST_CPU_PARTS == 2
    assert side_by_side.split_rows(5, 2) == 3 and side_by_side.split_rows(2, 4) == 1
    with pytest.raises(ValueError, match="parts must be a positive integer, got 0"):
        side_by_side.split_rows(5, 0)
