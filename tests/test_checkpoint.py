import jax
import numpy as np
import pytest

from tfm import metrics
from tfm.job import checkpoint as ckpt


def _state(seed):
    rng = np.random.default_rng(seed)
    return {
        "params": {
            "dense": {
                "kernel": rng.normal(size=(3, 4)).astype(np.float32),
                "bias": rng.normal(size=(4,)).astype(np.float32),
            }
        },
        "step": np.array(seed, np.int32),
    }


def test_save_restore_round_trip_with_data_state(tmp_path):
    saver = ckpt.Checkpointer(tmp_path, keep=3)
    saver.save(5, _state(5), {"epoch": 1, "grain": {"next_index": 7}}, {"note": "x"})
    state, data, meta, step = saver.restore(_state(0))
    assert step == 5 and data == {"epoch": 1, "grain": {"next_index": 7}} and meta["note"] == "x"
    np.testing.assert_array_equal(
        state["params"]["dense"]["kernel"], _state(5)["params"]["dense"]["kernel"]
    )


def test_keeps_the_last_k(tmp_path):
    saver = ckpt.Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        saver.save(step, _state(step))
    assert saver.steps() == [3, 4]


def test_corrupt_latest_checkpoint_falls_back_with_a_warning(tmp_path, caplog):
    saver = ckpt.Checkpointer(tmp_path, keep=5)
    saver.save(1, _state(1))
    saver.save(2, _state(2))
    # truncate every data file of checkpoint 2, as a crash mid-copy or a bad disk would
    for path in (tmp_path / "checkpoints" / "2").rglob("*"):
        if path.is_file() and path.stat().st_size > 0:
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    state, _, _, step = ckpt.Checkpointer(tmp_path).restore(_state(0))
    assert step == 1
    np.testing.assert_array_equal(
        state["params"]["dense"]["bias"], _state(1)["params"]["dense"]["bias"]
    )
    assert "checkpoint 2" in caplog.text
    with pytest.raises(ckpt.CheckpointError, match="checkpoint 2"):
        ckpt.Checkpointer(tmp_path).restore(_state(0), step=2)


def test_average_of_last_n_equals_the_mean(tmp_path):
    saver = ckpt.Checkpointer(tmp_path, keep=10)
    for step in range(1, 6):
        saver.save(step, _state(step))
    averaged, steps = ckpt.average_last(tmp_path, 3)
    assert steps == [3, 4, 5]
    kernels = [_state(s)["params"]["dense"]["kernel"].astype(np.float64) for s in (3, 4, 5)]
    expected = sum(kernels) / 3
    np.testing.assert_allclose(averaged["dense"]["kernel"], expected, atol=1e-7)
    assert averaged["dense"]["kernel"].dtype == np.float32


def test_averaging_logs_nothing(tmp_path, caplog):
    """decode.py and the job's final evaluation average checkpoints; orbax's warnings about
    metadata it looks for in the wrong place would be printed once per checkpoint."""
    saver = ckpt.Checkpointer(tmp_path, keep=10)
    for step in range(1, 4):
        saver.save(step, _state(step))
    saver.close()
    with caplog.at_level("WARNING"):
        ckpt.average_last(tmp_path, 3)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= 30]


def test_digest_changes_with_any_parameter():
    a = _state(1)["params"]
    b = jax.tree.map(np.copy, a)
    assert ckpt.params_digest(a) == ckpt.params_digest(b)
    b["dense"]["bias"][0] += 1e-7
    assert ckpt.params_digest(a) != ckpt.params_digest(b)


def test_missing_workdir_is_a_clear_error(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="no checkpoints here"):
        ckpt.Checkpointer(tmp_path / "nothing", read_only=True)


def test_bleu_scorers():
    hyps = ["Die Katze sitzt auf der Matte .", "Ein Open-Source-Projekt"]
    refs = ["Die Katze sitzt auf der Matte .", "Ein Open-Source-Projekt"]
    assert metrics.sacre_bleu(hyps, refs)["score"] == pytest.approx(100.0)
    assert "nrefs:1" in metrics.sacre_bleu(hyps, refs)["signature"]
    assert metrics.split_compounds("Open-Source-Projekt - gut") == (
        "Open ##AT##-##AT## Source ##AT##-##AT## Projekt - gut"
    )
    # a hyphenation error costs more n-grams once compounds are split
    partial = metrics.tokenized_bleu(["Ein Open-Source Projekt"], ["Ein Open-Source-Projekt"])
    assert 0 < partial["score"] < 100
    with pytest.raises(ValueError, match="line-aligned"):
        metrics.sacre_bleu(["a"], ["a", "b"])
    assert metrics.perplexity(np.log(5.0) * 10, 10) == pytest.approx(5.0)
