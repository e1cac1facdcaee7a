"""The whole Transformer against a NumPy model written from the paper (tests/reference.py's
pieces: Eq. 1 head by head with Python loops, section 3.3's FFN, 3.5's sinusoids element by
element, layer normalization from its definition), in float64: the teacher-forced forward pass
(post- and pre-LN, sinusoidal and learned positions) and incremental decoding step by step."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import reference
from tests.conftest import tiny_model_config
from tfm import Transformer

SRC = np.array([[5, 9, 7, 2, 0, 0], [11, 4, 6, 8, 3, 2]])  # the first row padded
TGT_IN = np.array([[1, 12, 13, 14, 0], [1, 6, 7, 8, 9]])


def _positions(params, side: str, length: int, config) -> np.ndarray:
    """Section 3.5's sinusoids, or row E's learned table."""
    if config.positional == "learned":
        return np.asarray(params[f"{side}_position_table"]["positions"], np.float64)[:length]
    return reference.sinusoids(length, config.d_model)


def _normalized(x, norm_params):
    """Layer normalization, or RMSNorm where the parameters have no bias."""
    scale = np.asarray(norm_params["scale"], np.float64)
    if "bias" not in norm_params:
        return reference.rms_norm(x, scale)
    return reference.layer_norm(x, scale, np.asarray(norm_params["bias"], np.float64))


def _sublayer(x, sublayer, norm_params, norm: str):
    """Section 5.4 / 3.1: LayerNorm(x + Sublayer(x)) (post-LN, the paper), or
    x + Sublayer(LayerNorm(x)) (pre-LN)."""
    if norm == "pre":
        return x + sublayer(_normalized(x, norm_params))
    return _normalized(x + sublayer(x), norm_params)


def numpy_transformer(params, config, src: np.ndarray, tgt_in: np.ndarray) -> np.ndarray:
    """Logits `[batch, tgt_len, vocab]` of the encoder-decoder of Figure 1, no dropout."""
    params = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    table = params["embedding"]["embedding"]  # one matrix for both embeddings and the output
    scale = math.sqrt(config.d_model)

    def embed(ids, side):
        return table[ids] * scale + _positions(params, side, ids.shape[1], config)[None]

    source_keys = (src != 0)[:, None, None, :]  # padded source positions are never attended
    x = embed(src, "src")
    for i in range(config.num_layers):
        layer = params[f"encoder_{i}"]
        x = _sublayer(
            x,
            lambda y, p=layer: reference.multi_head(p["self_attention"], y, y, source_keys),
            layer["attention_block"]["norm"],
            config.norm,
        )
        x = _sublayer(
            x,
            lambda y, p=layer: reference.feed_forward(p["feed_forward"], y, config.activation),
            layer["feed_forward_block"]["norm"],
            config.norm,
        )
    if config.norm == "pre":
        x = _normalized(x, params["encoder_norm"])
    length = tgt_in.shape[1]
    causal = np.tril(np.ones((length, length), bool))[None, None]  # section 3.2.3
    y = embed(tgt_in, "tgt")
    for i in range(config.num_layers):
        layer = params[f"decoder_{i}"]
        y = _sublayer(
            y,
            lambda z, p=layer: reference.multi_head(p["self_attention"], z, z, causal),
            layer["self_attention_block"]["norm"],
            config.norm,
        )
        y = _sublayer(  # queries from the decoder, keys and values from the encoder's output
            y,
            lambda z, p=layer: reference.multi_head(p["cross_attention"], z, x, source_keys),
            layer["cross_attention_block"]["norm"],
            config.norm,
        )
        y = _sublayer(
            y,
            lambda z, p=layer: reference.feed_forward(p["feed_forward"], z, config.activation),
            layer["feed_forward_block"]["norm"],
            config.norm,
        )
    if config.norm == "pre":
        y = _normalized(y, params["decoder_norm"])
    return y @ table.T  # section 3.4: the pre-softmax linear layer shares the embedding


CASES = [(norm, positional) for norm in ("post", "pre") for positional in ("sinusoidal", "learned")]


def _model_and_params(norm, positional, kernels="auto", **variant):
    config = tiny_model_config(
        vocab_size=20, norm=norm, positional=positional, max_positions=16, **variant
    )
    model = Transformer(config, kernels=kernels)
    params = model.init(jax.random.key(3), jnp.asarray(SRC), jnp.asarray(TGT_IN))["params"]
    if positional == "learned":  # the tables start near zero; make them count
        params = jax.tree_util.tree_map_with_path(
            lambda path, p: p * 50 if "position_table" in jax.tree_util.keystr(path) else p,
            params,
        )
    return config, model, params


@pytest.mark.parametrize(("norm", "positional"), CASES)
@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_the_forward_pass_is_the_papers(norm, positional, kernels):
    config, model, params = _model_and_params(norm, positional, kernels)
    expected = numpy_transformer(params, config, SRC, TGT_IN)
    got = model.apply({"params": params}, jnp.asarray(SRC), jnp.asarray(TGT_IN))
    assert np.abs(expected).max() > 1.0  # logits of some size, not all near zero
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("norm", "positional"), CASES)
def test_one_incremental_step_at_a_time_is_the_papers(norm, positional):
    """decode_step with its cache, position by position, gives the NumPy decoder's logits for
    the prefix so far (the decoder never sees a later position)."""
    config, model, params = _model_and_params(norm, positional)
    variables = {"params": params}
    src = jnp.asarray(SRC)
    encoded = model.apply(variables, src, method=model.encode)
    cache = model.apply(variables, encoded, src, 8, method=model.init_cache)
    for position in range(TGT_IN.shape[1]):
        tokens = jnp.asarray(TGT_IN[:, position])
        logits, cache = model.apply(variables, cache, tokens, position, method=model.decode_step)
        prefix = TGT_IN[:, : position + 1]
        expected = numpy_transformer(params, config, SRC, prefix)[:, -1]
        np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4, err_msg=position)


VARIANTS = [
    dict(activation="gelu"),
    dict(activation="swish"),
    dict(attention_bias=True),
    dict(normalization="rms"),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("kernels", ["auto", "reference", "xla_cpu"])
def test_each_variant_is_the_numpy_models(variant, norm, kernels):
    """A variant's forward pass, post- and pre-LN, under every kernels setting ("auto" and
    "xla_cpu" run the reference op for any piece the kit has no form of)."""
    config, model, params = _model_and_params(norm, "sinusoidal", kernels, **variant)
    if config.attention_bias:  # biases start at zero; make them count
        params = jax.tree_util.tree_map_with_path(
            lambda path, p: (
                p + 0.3
                if "attention']['" in jax.tree_util.keystr(path)
                and "bias" in jax.tree_util.keystr(path)
                else p
            ),
            params,
        )
        assert any(
            "bias" in jax.tree_util.keystr(path)
            for path, _ in jax.tree_util.tree_leaves_with_path(
                params["encoder_0"]["self_attention"]
            )
        )
    if config.normalization == "rms":  # RMSNorm has a scale only, and it must count
        norms = params["encoder_0"]["attention_block"]["norm"]
        assert set(norms) == {"scale"}
        params = jax.tree_util.tree_map_with_path(
            lambda path, p: p * 1.5 if "norm" in jax.tree_util.keystr(path) else p, params
        )
    expected = numpy_transformer(params, config, SRC, TGT_IN)
    got = model.apply({"params": params}, jnp.asarray(SRC), jnp.asarray(TGT_IN))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
