import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfm import ModelConfig, Transformer
from tfm.layers import MultiHeadAttention

SMALL = dict(
    vocab_size=40,
    num_layers=2,
    d_model=16,
    d_ff=32,
    num_heads=4,
    d_k=4,
    d_v=3,
    dropout_rate=0.0,
    max_positions=32,
)
SRC = np.array([[5, 6, 7, 8, 9, 0, 0], [11, 12, 13, 0, 0, 0, 0], [3, 4, 5, 6, 7, 8, 9]])
TGT = np.array([[1, 20, 21, 22, 0, 0], [1, 23, 24, 25, 26, 27], [1, 28, 0, 0, 0, 0]])


def _model(**changes):
    config = ModelConfig(**{**SMALL, **changes})
    model = Transformer(config)
    variables = model.init(jax.random.key(0), SRC, TGT)
    return model, variables


def _stepwise_logits(model, variables, src, tgt):
    encoded = model.apply(variables, src, method=model.encode)
    cache = model.apply(variables, encoded, src, tgt.shape[1] + 2, method=model.init_cache)
    outputs = []
    for t in range(tgt.shape[1]):
        logits, cache = model.apply(variables, cache, tgt[:, t], t, method=model.decode_step)
        outputs.append(logits)
    return np.stack(outputs, axis=1)


def test_logits_shape_and_dtype():
    model, variables = _model()
    logits = model.apply(variables, SRC, TGT)
    assert logits.shape == (3, 6, 40)
    assert logits.dtype == jnp.float32


def test_one_embedding_matrix_is_shared():
    _, variables = _model()
    tables = [
        path
        for path, leaf in jax.tree_util.tree_leaves_with_path(variables["params"])
        if leaf.shape == (40, 16)
    ]
    assert len(tables) == 1


def test_pre_softmax_projection_uses_the_embedding_matrix():
    model, variables = _model()
    captured = {}

    def grab_final_hidden(next_fun, args, kwargs, context):
        if context.method_name == "logits":
            captured["hidden"] = args[0]
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(grab_final_hidden):
        logits = model.apply(variables, SRC, TGT)
    table = np.asarray(variables["params"]["embedding"]["embedding"])
    np.testing.assert_allclose(logits, np.asarray(captured["hidden"]) @ table.T, atol=1e-5)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        dict(positional="learned"),
        dict(norm="pre"),
        dict(attention="xla", d_v=4),
        dict(attention_bias=True, activation="swish"),
    ],
)
def test_teacher_forcing_equals_incremental_decoding(changes):
    model, variables = _model(**changes)
    full = np.asarray(model.apply(variables, SRC, TGT))
    stepwise = _stepwise_logits(model, variables, SRC, TGT)
    assert np.max(np.abs(full - stepwise)) <= 1e-5  # every position, padded ones included


def test_causality():
    model, variables = _model()
    base = np.asarray(model.apply(variables, SRC, TGT))
    for t in range(TGT.shape[1] - 1):
        changed = TGT.copy()
        changed[:, t + 1 :] = np.random.default_rng(t).integers(1, 40, changed[:, t + 1 :].shape)
        logits = np.asarray(model.apply(variables, SRC, changed))
        np.testing.assert_allclose(logits[:, : t + 1], base[:, : t + 1], atol=1e-6)


def test_source_padding_does_not_change_logits():
    model, variables = _model()
    base = np.asarray(model.apply(variables, SRC, TGT))
    padded = np.pad(SRC, ((0, 0), (0, 5)))
    np.testing.assert_allclose(model.apply(variables, padded, TGT), base, atol=1e-5)
    # and a different source does change them (the test can fail)
    assert not np.allclose(model.apply(variables, SRC[::-1], TGT), base, atol=1e-3)


def test_cross_attention_reads_the_final_encoder_output():
    model, variables = _model(num_layers=3)
    seen = {"encoder_out": [], "cross_kv_inputs": []}

    def spy(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        module = context.module
        if context.method_name == "__call__" and module.name and module.name.startswith("encoder_"):
            seen["encoder_out"].append(np.asarray(out))
        if (
            isinstance(module, MultiHeadAttention)
            and module.name == "cross_attention"
            and context.method_name == "project_kv"
        ):
            seen["cross_kv_inputs"].append(np.asarray(args[0]))
        return out

    with nn.intercept_methods(spy):
        model.apply(variables, SRC, TGT)
    assert len(seen["encoder_out"]) == 3 and len(seen["cross_kv_inputs"]) == 3
    final = seen["encoder_out"][-1]
    for kv_input in seen["cross_kv_inputs"]:
        np.testing.assert_array_equal(kv_input, final)
        assert not np.allclose(kv_input, seen["encoder_out"][0])


def test_packed_rows_never_attend_across_pairs():
    model, variables = _model()
    src_a, tgt_a = np.array([[5, 6, 7]]), np.array([[1, 20, 21, 22]])
    src_b, tgt_b = np.array([[8, 9]]), np.array([[1, 23, 24]])
    alone_a = np.asarray(model.apply(variables, src_a, tgt_a))
    alone_b = np.asarray(model.apply(variables, src_b, tgt_b))
    packed = model.apply(
        variables,
        np.array([[5, 6, 7, 8, 9, 0]]),
        np.array([[1, 20, 21, 22, 1, 23, 24, 0]]),
        src_segments=np.array([[1, 1, 1, 2, 2, 0]]),
        tgt_segments=np.array([[1, 1, 1, 1, 2, 2, 2, 0]]),
        src_positions=np.array([[0, 1, 2, 0, 1, 0]]),
        tgt_positions=np.array([[0, 1, 2, 3, 0, 1, 2, 0]]),
    )
    np.testing.assert_allclose(packed[0, :4], alone_a[0], atol=1e-5)
    np.testing.assert_allclose(packed[0, 4:7], alone_b[0], atol=1e-5)
    with pytest.raises(ValueError, match="src_segments and tgt_segments"):
        model.apply(variables, SRC, TGT, src_segments=np.ones_like(SRC))


def test_bfloat16_compute_is_finite_with_float32_params_and_logits():
    model, variables = _model(dtype="bfloat16")
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(variables))
    logits = model.apply(variables, SRC, TGT)
    assert logits.dtype == jnp.float32
    assert np.all(np.isfinite(logits))
    reference_model, _ = _model()
    full = np.asarray(reference_model.apply(variables, SRC, TGT))
    assert np.max(np.abs(np.asarray(logits) - full)) < 0.1 * np.max(np.abs(full))


def test_remat_changes_memory_not_results():
    """On the reference ops (the kit's parity with them, remat included, is test_kernels.py's;
    its compile is ~4x slower here)."""
    model, variables = _model(dropout_rate=0.1)
    model = Transformer(model.config, kernels="reference")
    remat_model = Transformer(model.config.replace(remat=True), kernels="reference")

    def loss(m):
        def f(params):
            logits = m.apply(
                {"params": params},
                SRC,
                TGT,
                deterministic=False,
                rngs={"dropout": jax.random.key(7)},
            )
            return jnp.mean(logits**2)

        return jax.jit(jax.value_and_grad(f))(variables["params"])

    value, grads = loss(model)
    remat_value, remat_grads = loss(remat_model)
    np.testing.assert_allclose(remat_value, value, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(remat_grads), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_learned_positions_limit_the_cache_length():
    model, variables = _model(positional="learned")
    encoded = model.apply(variables, SRC, method=model.encode)
    with pytest.raises(ValueError, match="max_positions"):
        model.apply(variables, encoded, SRC, 64, method=model.init_cache)


def test_rows_decoding_at_their_own_positions_match_the_full_pass():
    """decode_step with one position per row: rows that start at different times, over a cache
    whose unwritten positions hold another sentence's stale K/V (as a reused slot does), give
    each row the teacher-forced logits of the full pass."""
    model, variables = _model()
    expected = np.asarray(model.apply(variables, SRC, TGT))  # [batch, tgt_len, vocab]
    encoded = model.apply(variables, SRC, method=model.encode)
    cache = model.apply(variables, encoded, SRC, TGT.shape[1] + 2, method=model.init_cache)

    def stale(x, seed):
        return jax.random.normal(jax.random.key(seed), x.shape, x.dtype)

    cache = cache.replace(
        layers=tuple(
            layer.replace(self_k=stale(layer.self_k, 1), self_v=stale(layer.self_v, 2))
            for layer in cache.layers
        )
    )
    starts = np.array([0, 2, 1])  # row r feeds its token t at global step starts[r] + t
    got = np.zeros_like(expected)
    for clock in range(TGT.shape[1] + starts.max()):
        positions = np.clip(clock - starts, 0, TGT.shape[1] - 1)
        tokens = TGT[np.arange(3), positions]
        logits, cache = model.apply(variables, cache, tokens, positions, method=model.decode_step)
        for row in range(3):
            if 0 <= clock - starts[row] < TGT.shape[1]:
                got[row, clock - starts[row]] = logits[row]
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-5)
