import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.conftest import tiny_model_config
from tfm import Transformer, training
from tfm import loss as tfm_loss
from tfm.tokens import BOS_ID, EOS_ID
from tfm.xla_cpu import loss as kit_loss


def test_schedule_matches_eq3():
    for d_model, warmup in ((512, 4000), (256, 100)):
        for step in (1, 10, warmup - 1, warmup, warmup + 1, 10 * warmup, 100_000):
            expected = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
            got = float(training.learning_rate(step, d_model, warmup))
            assert math.isclose(got, expected, rel_tol=1e-5), (step, got, expected)
    # the peak is at warmup_steps
    steps = np.arange(1, 20000)
    assert int(np.argmax(training.learning_rate(steps, 512, 4000))) + 1 == 4000


def test_optimizer_applies_eq3_from_step_one():
    config = training.TrainConfig(warmup_steps=10)
    optimizer = training.make_optimizer(config, d_model=64)
    params = {"w": jnp.zeros(3)}
    state = optimizer.init(params)
    grads = {"w": jnp.ones(3)}
    updates, state = optimizer.update(grads, state, params)
    # Adam's first update is lr * g / (|g| + eps) = lr (bias-corrected), at step 1
    np.testing.assert_allclose(-updates["w"], float(training.learning_rate(1, 64, 10)), rtol=1e-4)


def _numpy_smoothed_loss(logits, targets, eps):
    logits = np.asarray(logits, np.float64)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs = log_probs - np.log(np.exp(log_probs).sum(-1, keepdims=True))
    vocab = logits.shape[-1]
    loss = nll = count = 0.0
    for index in np.ndindex(targets.shape):
        target = targets[index]
        if target == 0:
            continue
        q = np.full(vocab, eps / vocab)
        q[target] += 1 - eps
        loss += -(q * log_probs[index]).sum()
        nll += -log_probs[index][target]
        count += 1
    return loss, nll, count


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2])
def test_label_smoothed_loss_matches_numpy(eps):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32) * 3
    targets = rng.integers(1, 11, (3, 5))
    targets[0, 3:] = 0
    targets[2, 1:] = 0
    got = tfm_loss.label_smoothed_cross_entropy(jnp.asarray(logits), jnp.asarray(targets), eps)
    loss, nll, count = _numpy_smoothed_loss(logits, targets, eps)
    np.testing.assert_allclose(got["loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(got["nll"], nll, rtol=1e-5)
    assert float(got["tokens"]) == count


def _numpy_loss_gradients(logits, targets, eps):
    """d loss / dz = (softmax(z) - q) and d nll / dz = (softmax(z) - onehot) per non-pad token."""
    logits = np.asarray(logits, np.float64)
    softmax = np.exp(logits - logits.max(-1, keepdims=True))
    softmax /= softmax.sum(-1, keepdims=True)
    onehot = np.eye(logits.shape[-1])[targets]
    weights = (targets != 0)[..., None]
    smoothed = (1 - eps) * onehot + eps / logits.shape[-1]
    return (softmax - smoothed) * weights, (softmax - onehot) * weights


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_label_smoothed_loss_gradients_match_numpy(eps):
    """The written-out gradient (one pass over the logits) against softmax - q."""
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(2, 6, 13)).astype(np.float32) * 3)
    targets = rng.integers(1, 13, (2, 6))
    targets[1, 4:] = 0
    targets = jnp.asarray(targets)

    def term(name, z):
        return tfm_loss.label_smoothed_cross_entropy(z, targets, eps)[name]

    loss_grad, nll_grad = _numpy_loss_gradients(logits, np.asarray(targets), eps)
    np.testing.assert_allclose(jax.grad(lambda z: term("loss", z))(logits), loss_grad, atol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda z: term("nll", z))(logits), nll_grad, atol=1e-6)
    # both outputs' cotangents at once, and through a bfloat16 -> float32 cast
    both = jax.grad(lambda z: 2 * term("loss", z) - 3 * term("nll", z))(logits)
    np.testing.assert_allclose(both, 2 * loss_grad - 3 * nll_grad, atol=5e-6)
    half = jax.grad(lambda z: term("loss", z))(logits.astype(jnp.bfloat16))
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(half.astype(np.float32), loss_grad, atol=2e-2)


def _numpy_tied_output_loss(states, table, targets, eps):
    """Loss, nll, token count and d loss / d states, d loss / d E of the pre-softmax linear layer
    z = states E^T followed by the smoothed loss, in float64 NumPy."""
    states, table = np.asarray(states, np.float64), np.asarray(table, np.float64)
    logits = states @ table.T
    loss, nll, count = _numpy_smoothed_loss(logits, targets, eps)
    logits_grad, _ = _numpy_loss_gradients(logits, targets, eps)
    states_grad = logits_grad @ table
    table_grad = np.einsum("btv,btd->vd", logits_grad, states)
    return loss, nll, count, states_grad, table_grad


@pytest.mark.parametrize("chunk_bytes", [None, 1, 2**30])  # the core's; the kit's most chunks, one
def test_output_loss_matches_numpy(chunk_bytes):
    """The output layer and loss, the core's (`tfm.loss`) and the XLA:CPU kit's (chunked,
    gradients made in the forward pass), against z = states E^T, the smoothed loss and its chain
    rule in NumPy."""
    rng = np.random.default_rng(2)
    batch, length, d_model, vocab, eps = 4, 12, 4, 13, 0.1
    states = jnp.asarray(rng.normal(size=(batch, length, d_model)).astype(np.float32))
    table = jnp.asarray(rng.normal(size=(vocab, d_model)).astype(np.float32))
    targets = rng.integers(1, vocab, (batch, length))
    targets[0, 5:] = 0
    targets[3, 1:] = 0
    if chunk_bytes is not None:
        chunks = kit_loss.length_chunks(batch, length, vocab, d_model, chunk_bytes)
        assert chunks == (6 if chunk_bytes == 1 else 1)  # 6: 8 tokens each, the fewest (2 d_model)

    def terms(s, e):
        if chunk_bytes is None:
            return tfm_loss.output_loss_sums(s, e, jnp.asarray(targets), eps)
        return kit_loss.output_loss_sums(s, e, jnp.asarray(targets), eps, chunk_bytes)

    loss, nll, count, states_grad, table_grad = _numpy_tied_output_loss(states, table, targets, eps)
    got = terms(states, table)
    np.testing.assert_allclose(got[0], loss, rtol=1e-5)
    np.testing.assert_allclose(got[1], nll, rtol=1e-5)
    # the backward pass scales the gradients by the loss's cotangent (here 3)
    grads = jax.grad(lambda s, e: 3 * terms(s, e)[0], argnums=(0, 1))(states, table)
    np.testing.assert_allclose(grads[0], 3 * states_grad, atol=2e-5)
    np.testing.assert_allclose(grads[1], 3 * table_grad, atol=2e-5)


def test_length_chunks_fit_the_byte_budget_above_the_fewest_tokens():
    # SMALL benchmark batch: 32 x 64 targets, vocab 8000, 16 MiB -> 4 chunks of 16 positions
    # (32 x 16 x 8000 x 4 bytes = 15.6 MiB; 2 chunks would be 31 MiB)
    assert kit_loss.length_chunks(32, 64, 8000, 256, 16 * 2**20) == 4
    # BASE benchmark batch, 8 x 64: 4 chunks would fit 16 MiB but hold 128 < 2 x 512 tokens
    assert kit_loss.length_chunks(8, 64, 32000, 512, 16 * 2**20) == 1
    # a 25,600-token batch at vocab 37000: 16 chunks of 1,600 tokens (2 x 512 is the floor)
    assert kit_loss.length_chunks(400, 64, 37000, 512, 16 * 2**20) == 16
    # only whole positions: 63 = 3 x 3 x 7, 21 positions x 32 rows = 672 >= 512 tokens
    assert kit_loss.length_chunks(32, 63, 8000, 256, 2**20) == 3
    # everything fits: one chunk
    assert kit_loss.length_chunks(2, 10, 100, 8, 16 * 2**20) == 1


def _copy_task_batch(rng, rows=16, length=7, vocab=16):
    body = rng.integers(4, vocab, (rows, length - 1))
    src = np.concatenate([body, np.full((rows, 1), EOS_ID)], 1)
    tgt_out = src.copy()
    tgt_in = np.concatenate([np.full((rows, 1), BOS_ID), src[:, :-1]], 1)
    return {
        "src": src.astype(np.int32),
        "tgt_in": tgt_in.astype(np.int32),
        "tgt_out": tgt_out.astype(np.int32),
    }


def _setup(dropout=0.0, scale=0.2, **model_changes):
    config = tiny_model_config(16, **{"dropout_rate": dropout, **model_changes})
    model = Transformer(config)
    optimizer = training.make_optimizer(
        training.TrainConfig(warmup_steps=30, learning_rate_scale=scale), config.d_model
    )
    return model, optimizer


def test_loss_falls_to_near_zero_on_a_copy_task():
    model, optimizer = _setup()
    rng = np.random.default_rng(0)
    state = training.init_train_state(
        model, optimizer, jax.random.PRNGKey(0), _copy_task_batch(rng)
    )
    step = jax.jit(
        lambda s, b: training.train_step(s, b, model=model, optimizer=optimizer, smoothing=0.0)
    )
    first = None
    for _ in range(500):
        state, metrics = step(state, _copy_task_batch(rng, rows=32))
        first = first if first is not None else float(metrics["nll"])
    held_out = training.eval_step(
        state.params, _copy_task_batch(rng, rows=64), model=model, smoothing=0.0
    )
    assert first > 2.0
    assert float(held_out["nll"] / held_out["tokens"]) < 0.05
    assert int(state.step) == 500


def test_accumulated_micro_batches_equal_one_big_batch():
    model, _ = _setup()
    # plain SGD with rate 1: the parameter change IS the gradient (Adam would amplify rounding
    # noise in near-zero gradients into sign flips)
    optimizer = optax.sgd(1.0)
    batch = _copy_task_batch(np.random.default_rng(1), rows=12)
    batch["tgt_out"][:5, 4:] = 0  # uneven token counts across micro-batches
    batch["tgt_in"][:5, 5:] = 0
    state = training.init_train_state(model, optimizer, jax.random.PRNGKey(0), batch)

    def run(b):
        return training.train_step(state, b, model=model, optimizer=optimizer, smoothing=0.1)

    big_state, big_metrics = run(batch)
    micro = {k: v.reshape(3, 4, -1) for k, v in batch.items()}
    micro_state, micro_metrics = run(micro)
    for a, b in zip(
        jax.tree.leaves(big_state.params), jax.tree.leaves(micro_state.params), strict=True
    ):
        np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(big_metrics["loss"], micro_metrics["loss"], rtol=1e-6)
    assert float(big_metrics["tokens"]) == float(micro_metrics["tokens"])


def test_eval_step_sums_without_dropout():
    """eval_step's sums are the smoothed loss and nll of the model's deterministic logits,
    summed over the non-pad targets in NumPy, although the model has dropout 0.5 (a pass with
    dropout would give other sums)."""
    model, optimizer = _setup(dropout=0.5)
    batch = _copy_task_batch(np.random.default_rng(2))
    state = training.init_train_state(model, optimizer, jax.random.PRNGKey(0), batch)
    got = training.eval_step(state.params, batch, model=model, smoothing=0.1)
    logits = model.apply({"params": state.params}, batch["src"], batch["tgt_in"])
    loss, nll, count = _numpy_smoothed_loss(np.asarray(logits), np.asarray(batch["tgt_out"]), 0.1)
    np.testing.assert_allclose(float(got["loss"]), loss, rtol=1e-5)
    np.testing.assert_allclose(float(got["nll"]), nll, rtol=1e-5)
    assert float(got["tokens"]) == count == batch["tgt_out"].size
    dropped = model.apply(
        {"params": state.params},
        batch["src"],
        batch["tgt_in"],
        deterministic=False,
        rngs={"dropout": jax.random.key(1)},
    )
    with_dropout, _, _ = _numpy_smoothed_loss(
        np.asarray(dropped), np.asarray(batch["tgt_out"]), 0.1
    )
    assert abs(with_dropout - loss) > 1e-3 * abs(loss)


def test_bad_train_config_values_are_rejected():
    with pytest.raises(ValueError, match="label_smoothing"):
        training.TrainConfig(label_smoothing=1.0)
    with pytest.raises(ValueError, match="warmup_steps"):
        training.TrainConfig(warmup_steps=0)
    with pytest.raises(ValueError, match="grad_clip_norm"):
        training.TrainConfig(grad_clip_norm=-1.0)
