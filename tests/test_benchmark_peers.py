"""benchmarks/compare.py is only fair if every peer computes the same function as tfm: the same
logits from the same weights, the same label-smoothed loss, the same Eq. 3 schedule and the same
greedy outputs. Checked here on a tiny shape (needs the [bench] extra; skipped without it)."""

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import ct2_system, hf_system, tfm_system, torch_system  # noqa: E402
from peers import weights as neutral  # noqa: E402
from peers.workloads import Shape, Workload, decoding_source, training_batch  # noqa: E402

from tfm import Transformer  # noqa: E402
from tfm import loss as tfm_loss  # noqa: E402

TINY = Shape(vocab_size=64, num_layers=2, d_model=16, d_ff=32, num_heads=2)
TRAIN = Workload("train_tiny", "train", TINY, batch=3, src_len=7, tgt_len=6)
GREEDY = Workload("greedy_tiny", "greedy", TINY, batch=4, src_len=5, tgt_len=9)


@pytest.fixture(scope="module")
def weights_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("peers") / "tiny.npz")
    tfm_system.export_weights(TRAIN, path)
    return path


def _tfm_logits(batch) -> np.ndarray:
    model = Transformer(tfm_system._config(TRAIN, 0.0))
    params = tfm_system.initial_params(TRAIN)
    return np.asarray(model.apply({"params": params}, batch["src"], batch["tgt_in"]))


def test_peers_compute_tfm_logits_from_the_shared_weights(weights_path):
    batch = training_batch(TRAIN)
    batch["src"][0, 5:] = 0  # a padded source row: the masks must agree too
    expected = _tfm_logits(batch)
    weights = neutral.load(weights_path)
    src, tgt_in = (torch.from_numpy(batch[k]).long() for k in ("src", "tgt_in"))

    nn_transformer = torch_system.TorchTransformer(TRAIN, 0.0).eval()
    torch_system.load_weights(nn_transformer, weights)
    marian = hf_system.build(TRAIN, 0.0).eval()
    hf_system.load_weights(marian, weights)
    with torch.no_grad():
        torch_logits = nn_transformer(src, tgt_in).numpy()
        hf_logits = marian(
            input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt_in
        ).logits.numpy()
    np.testing.assert_allclose(torch_logits, expected, atol=2e-4, err_msg="nn.Transformer")
    np.testing.assert_allclose(hf_logits, expected, atol=2e-4, err_msg="MarianMTModel")


def test_peer_loss_is_tfm_label_smoothed_loss():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32)
    targets = rng.integers(1, 11, (3, 5)).astype(np.int32)
    targets[0, 3:] = 0
    terms = tfm_loss.label_smoothed_cross_entropy(jnp.asarray(logits), targets, 0.1)
    ours = float(terms["loss"] / terms["tokens"])
    theirs = float(torch_system.smoothed_loss(torch.from_numpy(logits), torch.from_numpy(targets)))
    assert theirs == pytest.approx(ours, rel=1e-5)


def test_peer_training_uses_eq3_from_step_1_and_same_initial_loss(weights_path):
    trainer = torch_system.Trainer(TRAIN, weights_path)
    d = TINY.d_model
    for step in (1, 2, 3):
        expected = d**-0.5 * min(step**-0.5, step * 4000**-1.5)  # Eq. 3
        assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-9)
        trainer.run()
    ours = tfm_system.Trainer(TRAIN, weights_path).initial_loss
    assert trainer.initial_loss == pytest.approx(ours, abs=1e-4)
    assert hf_system.Trainer(TRAIN, weights_path).initial_loss == pytest.approx(ours, abs=1e-4)


def test_every_greedy_decoder_emits_tfm_tokens(weights_path):
    expected = tfm_system.Decoder(GREEDY, weights_path).run()
    assert expected.shape == (GREEDY.batch, GREEDY.tgt_len)
    # an independent greedy loop over tfm's teacher-forced logits
    model = Transformer(tfm_system._config(GREEDY, 0.0))
    params = tfm_system.initial_params(GREEDY)
    src = decoding_source(GREEDY)
    prefix = np.ones((GREEDY.batch, 1), np.int32)
    for _ in range(GREEDY.tgt_len):
        logits = model.apply({"params": params}, src, prefix)[:, -1]
        prefix = np.concatenate([prefix, np.argmax(logits, -1)[:, None].astype(np.int32)], 1)
    np.testing.assert_array_equal(expected, prefix[:, 1:])
    for system in (torch_system, hf_system, ct2_system):
        np.testing.assert_array_equal(
            system.Decoder(GREEDY, weights_path).run(), expected, err_msg=system.NAME
        )


@pytest.mark.slow
def test_compare_runs_and_reports_agreement(tmp_path):
    out = tmp_path / "compare.json"
    args = ["--workloads", "greedy_small", "--rounds", "1", "--decode_runs", "1"]
    args += ["--systems", "tfm", "hf", "ct2"]  # the naive no-cache loops take minutes here
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "compare.py"), *args, "--out", str(out)],
        check=True,
        timeout=900,
        stdout=subprocess.DEVNULL,
    )
    report = json.loads(out.read_text())
    greedy = report["workloads"]["greedy_small"]
    assert set(greedy["systems"]) == {"tfm", "hf", "ct2"}
    for system, agreement in greedy["agreement_with_tfm"].items():
        assert agreement["rows_identical"] == 1.0, system
    assert {g["tfm_over"] for g in report["goals"]} == {"ct2", "hf"}
    assert jax.tree.leaves(report["matmul_ceiling_gflops"])
