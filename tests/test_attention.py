import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import reference
from tfm import attention as attn


def _qkv(seed, batch=2, q_len=5, kv_len=7, heads=3, d_k=4, d_v=6):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, q_len, heads, d_k)).astype(np.float32)
    k = rng.normal(size=(batch, kv_len, heads, d_k)).astype(np.float32)
    v = rng.normal(size=(batch, kv_len, heads, d_v)).astype(np.float32)
    return q, k, v


def test_matches_numpy_eq1_without_mask():
    q, k, v = _qkv(0)
    out = attn.scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(out, reference.attention(q, k, v), atol=1e-5)
    assert out.shape == (2, 5, 3, 6)


def test_matches_numpy_eq1_with_random_mask_and_dk_ne_dv():
    q, k, v = _qkv(1, d_k=8, d_v=3)
    mask = np.random.default_rng(2).random((2, 3, 5, 7)) > 0.4
    mask[0, 1, 2] = False  # a query row with nothing to attend to
    out = attn.scaled_dot_product_attention(q, k, v, mask)
    np.testing.assert_allclose(out, reference.attention(q, k, v, mask), atol=1e-5)
    np.testing.assert_array_equal(out[0, 2, 1], 0.0)


def test_weights_rows_sum_to_one_and_are_float32_for_bfloat16_inputs():
    q, k, _ = _qkv(3)
    weights = attn.attention_weights(jnp.asarray(q, jnp.bfloat16), jnp.asarray(k, jnp.bfloat16))
    assert weights.dtype == jnp.float32
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)


def test_fully_masked_rows_give_zeros_and_finite_gradients():
    q, k, v = _qkv(4)
    mask = np.zeros((2, 1, 5, 7), bool)
    mask[:, :, :2, :3] = True  # rows 2.. see nothing

    def loss(q, k, v):
        return jnp.sum(attn.scaled_dot_product_attention(q, k, v, mask) ** 2)

    out = attn.scaled_dot_product_attention(q, k, v, mask)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[:, 2:], 0.0)
    for grad in jax.grad(loss, argnums=(0, 1, 2))(q, k, v):
        assert np.all(np.isfinite(grad))


def test_bfloat16_with_huge_logits_stays_finite():
    q, k, v = _qkv(5)
    big = jnp.asarray(q * 300, jnp.bfloat16)
    out = attn.scaled_dot_product_attention(
        big, jnp.asarray(k * 300, jnp.bfloat16), jnp.asarray(v, jnp.bfloat16)
    )
    assert out.dtype == jnp.bfloat16
    assert np.all(np.isfinite(np.asarray(out, np.float32)))


@pytest.mark.parametrize("d_k,d_v", [(4, 4), (8, 3), (2, 6)])
def test_xla_implementation_equals_reference(d_k, d_v):
    q, k, v = _qkv(6, d_k=d_k, d_v=d_v)
    mask = np.random.default_rng(7).random((2, 1, 5, 7)) > 0.5
    mask[1, 0, 0] = False
    ours = attn.scaled_dot_product_attention(q, k, v, mask)
    fused = attn.scaled_dot_product_attention(q, k, v, mask, implementation="xla")
    np.testing.assert_allclose(fused, ours, atol=1e-5)
    np.testing.assert_allclose(fused, reference.attention(q, k, v, mask), atol=1e-5)


def test_unknown_implementation_is_rejected():
    q, k, v = _qkv(8)
    with pytest.raises(ValueError, match="implementation"):
        attn.scaled_dot_product_attention(q, k, v, implementation="flash")


def test_mismatched_d_k_is_rejected():
    q, k, v = _qkv(9)
    with pytest.raises(ValueError, match="d_k"):
        attn.scaled_dot_product_attention(q, k[..., :2], v)


def test_causal_mask_is_lower_triangular():
    mask = np.asarray(attn.causal_mask(4))[0, 0]
    expected = np.array([[j <= i for j in range(4)] for i in range(4)])
    np.testing.assert_array_equal(mask, expected)


def test_padding_and_segment_masks():
    kv_valid = np.array([[True, False]])
    np.testing.assert_array_equal(
        np.asarray(attn.key_padding_mask(kv_valid))[0, 0, 0], [True, False]
    )
    segments = np.array([[1, 1, 2, 0]])
    seg = np.asarray(attn.segment_mask(segments, segments))[0, 0]
    expected = np.array([[a == b and a > 0 for b in segments[0]] for a in segments[0]])
    np.testing.assert_array_equal(seg, expected)
