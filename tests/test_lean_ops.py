"""tfm.xla_cpu.lean_ops: the same values as the Flax / jax.nn computations they replace, and
gradients that match central differences of a float64 NumPy forward (an independent derivation)."""

import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.subprocess_json import run_python
from tfm.xla_cpu import lean_ops


def _numeric_vjp(f, inputs, cotangent, step=1e-6):
    """sum(cotangent * f(inputs)) differentiated by central differences, input by input."""
    grads = []
    for i, x in enumerate(inputs):
        grad = np.zeros_like(x)
        for index in np.ndindex(x.shape):
            shifted = [a.copy() for a in inputs]
            shifted[i][index] += step
            up = np.sum(cotangent * f(*shifted))
            shifted[i][index] -= 2 * step
            down = np.sum(cotangent * f(*shifted))
            grad[index] = (up - down) / (2 * step)
        grads.append(grad)
    return grads


def _numpy_layer_norm(x, scale, bias, epsilon=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * scale + bias


def _layer_norm_inputs(seed=0, shape=(2, 3, 8)):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * 2 + 0.5
    scale = rng.normal(size=shape[-1:]) + 1.0
    bias = rng.normal(size=shape[-1:])
    return x, scale, bias


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_layer_norm_values_equal_flax(dtype):
    x, scale, bias = _layer_norm_inputs()
    x = jnp.asarray(x, dtype)
    params = {"params": {"scale": jnp.asarray(scale, jnp.float32), "bias": jnp.asarray(bias)}}
    ours = lean_ops.LayerNorm(epsilon=1e-6, dtype=dtype).apply(params, x)
    flax = nn.LayerNorm(epsilon=1e-6, dtype=dtype, param_dtype=jnp.float32).apply(params, x)
    assert ours.dtype == flax.dtype == dtype
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(flax, np.float32))
    # same parameters, same names, as the module it replaces
    shapes = jax.tree.map(jnp.shape, lean_ops.LayerNorm().init(jax.random.key(0), x))
    assert shapes == jax.tree.map(jnp.shape, nn.LayerNorm().init(jax.random.key(0), x))


def test_layer_norm_gradients_match_central_differences():
    x, scale, bias = _layer_norm_inputs(1)
    cotangent = np.random.default_rng(2).normal(size=x.shape)
    expected = _numeric_vjp(_numpy_layer_norm, [x, scale, bias], cotangent)

    def objective(x, scale, bias):
        y = lean_ops.layer_norm(x, scale, bias, 1e-6, jnp.float32)
        return jnp.sum(jnp.asarray(cotangent, jnp.float32) * y)

    args = [jnp.asarray(a, jnp.float32) for a in (x, scale, bias)]
    got = jax.grad(objective, argnums=(0, 1, 2))(*args)
    for name, g, e in zip(("x", "scale", "bias"), got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=2e-5, rtol=1e-4, err_msg=name)
    # bfloat16 input: the gradient comes back in bfloat16, close to the float32 one
    half = jax.grad(objective)(args[0].astype(jnp.bfloat16), args[1], args[2])
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(half.astype(np.float32), expected[0], atol=0.1, rtol=0.05)


def _masked_softmax_case(seed=3):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(2, 2, 3, 5)) * 2
    mask = rng.random((2, 1, 3, 5)) < 0.7
    mask[0, 0, 1] = False  # a query row with no allowed key
    mask[1, 0, 2] = True
    return logits, mask


def _numpy_masked_softmax(logits, mask):
    mask = np.broadcast_to(mask, logits.shape)
    shifted = np.where(mask, logits, -np.inf)
    shifted = shifted - np.max(np.where(mask, logits, -1e300), -1, keepdims=True)
    e = np.where(mask, np.exp(shifted), 0.0)
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)


def test_masked_softmax_values_and_gradient():
    logits, mask = _masked_softmax_case()
    weights = lean_ops.masked_softmax(jnp.asarray(logits, jnp.float32), jnp.asarray(mask))
    np.testing.assert_allclose(weights, _numpy_masked_softmax(logits, mask), atol=1e-6)
    assert np.all(np.asarray(weights)[0, :, 1] == 0.0)  # fully masked row: zeros, not uniform

    cotangent = np.random.default_rng(4).normal(size=logits.shape)
    (expected,) = _numeric_vjp(lambda z: _numpy_masked_softmax(z, mask), [logits], cotangent)
    got = jax.grad(
        lambda z: jnp.sum(jnp.asarray(cotangent, jnp.float32) * lean_ops.masked_softmax(z, mask))
    )(jnp.asarray(logits, jnp.float32))
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert np.all(np.asarray(got)[~np.broadcast_to(mask, logits.shape)] == 0.0)


@pytest.mark.parametrize("rows", [16, 13])  # a whole number of bytes of signs, and not
def test_relu_values_and_gradient(rows):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(rows, 2, 6)).astype(np.float32)
    x[0, 0, :4] = [0.0, -0.0, 1e-30, -1e-30]  # the gradient at 0 is 0, as jax.nn.relu's
    cotangent = rng.normal(size=x.shape).astype(np.float32)
    y, vjp = jax.vjp(lean_ops.relu, jnp.asarray(x))
    np.testing.assert_array_equal(y, np.maximum(x, 0.0))
    (got,) = vjp(jnp.asarray(cotangent))
    np.testing.assert_array_equal(got, np.where(x > 0, cotangent, 0.0))


def test_relu_keeps_its_signs_as_packed_bits():
    x = np.random.default_rng(6).normal(size=(3, 7, 5)).astype(np.float32)  # 21 rows of 5
    packed = lean_ops._pack_positive(jnp.asarray(x))
    rows = np.zeros((24, 5), bool)  # padded to 8 x 3 rows
    rows[:21] = (x > 0).reshape(21, 5)
    # NumPy's own bit packing: bit i of byte [j, k] is row 8 j + i
    expected = np.packbits(rows.reshape(3, 8, 5), axis=1, bitorder="little")[:, 0]
    assert packed.dtype == jnp.uint8 and packed.shape == (3, 5)
    np.testing.assert_array_equal(packed, expected)
    np.testing.assert_array_equal(lean_ops._unpack(packed, x.shape), x > 0)
    bf16 = lean_ops._pack_positive(jnp.asarray(x, jnp.bfloat16))
    np.testing.assert_array_equal(bf16, expected)


def test_an_ffn_gradient_through_relu_does_not_keep_the_pre_activation():
    """XLA's scratch for the gradient of relu(x W1) W2 shrinks by about the `[tokens, d_ff]`
    pre-activation that autodiff's ReLU keeps (4 MiB here)."""
    x, w1, w2 = jnp.ones((2048, 64)), jnp.ones((64, 512)), jnp.ones((512, 64))

    def scratch_bytes(relu):
        loss = lambda w1, w2, x: jnp.sum(relu(x @ w1) @ w2)  # noqa: E731
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(w1, w2, x).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    pre_activation = 2048 * 512 * 4
    assert scratch_bytes(lean_ops.relu) <= scratch_bytes(jax.nn.relu) - 0.75 * pre_activation


SHARDED_RELU = textwrap.dedent(
    """
    import json, os, re, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from tfm.xla_cpu import lean_ops
    mesh = Mesh(jax.devices(), ("data",))
    x = jax.device_put(jnp.ones((64, 32, 256)), NamedSharding(mesh, P("data")))
    w = jax.device_put(jnp.ones((256, 512)), NamedSharding(mesh, P()))
    counts = {}
    for name, relu in (("autodiff", jax.nn.relu), ("lean", lean_ops.relu)):
        grad = jax.jit(jax.grad(lambda w, x: jnp.sum(relu(x @ w))))
        text = grad.lower(w, x).compile().as_text()
        counts[name] = len(re.findall(r"= [^=]*? (all-reduce|all-gather|reduce-scatter|"
                                      r"all-to-all|collective-permute)(-start)?[(]", text))
    print(json.dumps(counts))
    """
)


def test_relu_packs_its_bits_without_communication_when_the_batch_is_sharded():
    """The bits of a row group stay on the device that holds its rows: a data-parallel FFN
    gradient has the same collectives (the weight gradient's all-reduce) as with autodiff."""
    counts = run_python(["-c", SHARDED_RELU], timeout=300)
    assert counts["autodiff"] >= 1 and counts["lean"] == counts["autodiff"], counts
