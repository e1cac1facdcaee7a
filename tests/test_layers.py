from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import reference
from tfm import attention as attn
from tfm.config import ModelConfig
from tfm.layers import (
    EncoderLayer,
    FeedForward,
    MultiHeadAttention,
    sinusoidal_encoding,
)
from tfm.xla_cpu.dropout import Dropout, threefry2x32
from tfm.xla_cpu.matmul import linear, tied_logits


def test_sinusoidal_encoding_matches_section_3_5():
    positions = jnp.arange(50)
    np.testing.assert_allclose(
        sinusoidal_encoding(positions, 16), reference.sinusoids(50, 16), atol=1e-5
    )
    # arbitrary position arrays (packed rows restart at 0) give the same rows
    packed = jnp.array([[0, 1, 2, 0, 1]])
    table = reference.sinusoids(3, 16)
    np.testing.assert_allclose(
        sinusoidal_encoding(packed, 16)[0], table[[0, 1, 2, 0, 1]], atol=1e-6
    )


def test_multi_head_equals_concat_of_single_heads_times_w_o():
    module = MultiHeadAttention(num_heads=3, d_k=5, d_v=7, d_model=12)
    rng = np.random.default_rng(0)
    x_q = rng.normal(size=(2, 4, 12)).astype(np.float32)
    x_kv = rng.normal(size=(2, 6, 12)).astype(np.float32)
    mask = attn.key_padding_mask(jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool))
    variables = module.init(jax.random.key(1), x_q, x_kv, mask)
    params = variables["params"]
    assert params["query"]["kernel"].shape == (12, 3, 5)
    assert params["value"]["kernel"].shape == (12, 3, 7)
    assert params["out"]["kernel"].shape == (3, 7, 12)
    out = module.apply(variables, x_q, x_kv, mask)
    np.testing.assert_allclose(out, reference.multi_head(params, x_q, x_kv, mask), atol=1e-5)


def test_feed_forward_is_relu_mlp():
    module = FeedForward(d_model=6, d_ff=10)
    x = np.random.default_rng(1).normal(size=(2, 3, 6)).astype(np.float32)
    variables = module.init(jax.random.key(0), x)
    np.testing.assert_allclose(
        module.apply(variables, x), reference.feed_forward(variables["params"], x), atol=1e-5
    )


def _encoder_layer_reference(params, x, mask, norm):
    def ln(y, p):
        return reference.layer_norm(y, np.asarray(p["scale"]), np.asarray(p["bias"]))

    attn_norm = params["attention_block"]["norm"]
    ffn_norm = params["feed_forward_block"]["norm"]
    if norm == "post":  # LayerNorm(x + Sublayer(x)), section 3.1
        x = ln(x + reference.multi_head(params["self_attention"], x, x, mask), attn_norm)
        return ln(x + reference.feed_forward(params["feed_forward"], x), ffn_norm)
    y = ln(x, attn_norm)
    x = x + reference.multi_head(params["self_attention"], y, y, mask)
    return x + reference.feed_forward(params["feed_forward"], ln(x, ffn_norm))


def test_encoder_layer_post_and_pre_ln_match_numpy():
    x = np.random.default_rng(2).normal(size=(2, 5, 8)).astype(np.float32)
    mask = attn.key_padding_mask(jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool))
    for norm in ("post", "pre"):
        config = ModelConfig(
            vocab_size=10, d_model=8, d_ff=16, num_heads=2, d_k=3, d_v=5, norm=norm
        )
        layer = EncoderLayer(config)
        variables = layer.init(jax.random.key(3), x, mask)
        # perturb LayerNorm parameters away from (1, 0) so the test sees them
        variables = jax.tree.map(
            lambda p: p + 0.1 * jnp.cos(jnp.arange(p.size)).reshape(p.shape), variables
        )
        out = layer.apply(variables, x, mask)
        expected = _encoder_layer_reference(variables["params"], x, mask, norm)
        np.testing.assert_allclose(out, expected, atol=1e-4, err_msg=norm)


def test_dropout_only_when_not_deterministic():
    config = ModelConfig(
        vocab_size=10, d_model=8, d_ff=16, num_heads=2, d_k=4, d_v=4, dropout_rate=0.5
    )
    layer = EncoderLayer(config)
    x = np.random.default_rng(4).normal(size=(1, 5, 8)).astype(np.float32)
    variables = layer.init(jax.random.key(0), x, None)
    a = layer.apply(variables, x, None, True)
    b = layer.apply(variables, x, None, False, rngs={"dropout": jax.random.key(1)})
    c = layer.apply(variables, x, None, False, rngs={"dropout": jax.random.key(1)})
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(b, c)


def _vjp_at_random_inputs(product, shapes, seed):
    """`product`'s value and both gradients at random float32 inputs: `shapes` gives the two
    operands' and the upstream gradient's, drawn in that order. Returns (inputs, results)."""
    rng = np.random.default_rng(seed)
    a, b, upstream = (rng.normal(size=shape).astype(np.float32) for shape in shapes)
    value, pullback = jax.vjp(product, jnp.asarray(a), jnp.asarray(b))
    return (a, b, upstream), (value, *pullback(jnp.asarray(upstream)))


def test_tied_logits_gradients_are_the_chain_rule_in_numpy():
    """x E^T with E's gradient computed as (x^T g)^T: both gradients against g E and g^T x."""
    (x, table, upstream), (logits, grad_x, grad_table) = _vjp_at_random_inputs(
        tied_logits, [(3, 5, 16), (40, 16), (3, 5, 40)], seed=0
    )
    np.testing.assert_allclose(logits, x @ table.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad_x, upstream @ table, rtol=1e-5, atol=1e-5)
    expected_table = upstream.reshape(-1, 40).T @ x.reshape(-1, 16)
    np.testing.assert_allclose(grad_table, expected_table, rtol=1e-5, atol=1e-5)


def test_linear_gradients_are_the_chain_rule_in_numpy():
    """x W with W's gradient computed as (g^T x)^T: both gradients against g W^T and x^T g, in
    float64 NumPy, with leading batch axes on x."""
    (x, w, upstream), (y, grad_x, grad_w) = _vjp_at_random_inputs(
        linear, [(3, 5, 16), (16, 24), (3, 5, 24)], seed=1
    )
    x64, w64, g64 = (a.astype(np.float64) for a in (x, w, upstream))
    np.testing.assert_allclose(y, x64 @ w64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad_x, g64 @ w64.T, rtol=1e-5, atol=1e-5)
    expected_w = x64.reshape(-1, 16).T @ g64.reshape(-1, 24)
    assert grad_w.shape == w.shape
    np.testing.assert_allclose(grad_w, expected_w, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "shape, dtype, impl",
    [
        ((2, 7, 16), jnp.float32, "threefry2x32"),
        ((3, 5, 4, 9), jnp.bfloat16, "threefry2x32"),  # odd size, attention-weights rank
        ((4, 6), jnp.float32, "rbg"),  # another generator: jax.random.bernoulli itself
    ],
)
def test_dropout_masks_are_flax_dropouts(shape, dtype, impl):
    """tfm's Dropout draws with an unrolled Threefry; its outputs must be those of
    `nn.Dropout` under the same "dropout" RNG and module path, bit for bit."""

    class Outer(nn.Module):
        dropout_cls: type

        @nn.compact
        def __call__(self, x):
            return self.dropout_cls(0.3, name="drop")(x, deterministic=False)

    x = jax.random.normal(jax.random.key(1), shape).astype(dtype) + 2.0
    rngs = {"dropout": jax.random.key(7, impl=impl)}
    mine = jax.jit(lambda x: Outer(Dropout).apply({}, x, rngs=rngs))(x)
    flax_dropout = partial(nn.Dropout, deterministic=None)
    theirs = jax.jit(lambda x: Outer(flax_dropout).apply({}, x, rngs=rngs))(x)
    assert mine.dtype == theirs.dtype == dtype
    np.testing.assert_array_equal(np.asarray(mine, np.float32), np.asarray(theirs, np.float32))
    kept = float(np.mean(np.asarray(mine, np.float32) != 0))
    assert 0.45 < kept < 0.9  # a mask, not all or nothing


def test_threefry_bits_are_jax_random_bits():
    """The unrolled hash against JAX's own Threefry (its loop on CPU), over a million draws."""
    key = jax.random.key(123)
    shape = (1000, 1001)
    words = jax.random.key_data(key)
    index = jnp.arange(np.prod(shape), dtype=jnp.uint32).reshape(shape)
    high, low = jax.jit(threefry2x32)((words[0], words[1]), jnp.zeros_like(index), index)
    np.testing.assert_array_equal(np.asarray(high ^ low), jax.random.bits(key, shape, jnp.uint32))
