"""--plot_attention's weights (`tfm.inference.attention_maps`) on a model whose attention runs
fused (`attention="xla"`, which never forms the weights): drawn from the reference
implementation, they are Eq. 1's weights, checked against NumPy for the first encoder layer."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from tests import reference
from tests.conftest import tiny_model_config
from tfm import Transformer
from tfm.inference.attention_maps import attention_maps


def test_a_fused_models_attention_maps_are_eq1s_weights():
    config = tiny_model_config(attention="xla")
    model = Transformer(config, kernels="reference")
    src = np.array([[5, 9, 7, 2, 0]])
    tgt_in = np.array([[1, 12, 13]])
    params = model.init(jax.random.key(0), jnp.asarray(src), jnp.asarray(tgt_in))["params"]
    maps = attention_maps(model, params, src, tgt_in)
    assert [len(v) for v in maps.values()] == [config.num_layers] * 3
    # the first encoder layer's input: sqrt(d_model) E[ids] + PE (section 3.4, 3.5); post-LN,
    # so its self-attention reads it unnormalized
    table = np.asarray(params["embedding"]["embedding"], np.float64)
    x = table[src[0]] * math.sqrt(config.d_model) + reference.sinusoids(5, config.d_model)
    attention = params["encoder_0"]["self_attention"]
    wq, wk = (np.asarray(attention[n]["kernel"], np.float64) for n in ("query", "key"))
    for head in range(config.num_heads):
        scores = (x @ wq[:, head]) @ (x @ wk[:, head]).T / math.sqrt(config.d_k)
        scores[:, src[0] == 0] = -np.inf  # the padded source position is never attended
        np.testing.assert_allclose(
            maps["encoder self-attention"][0][head], reference.softmax(scores), atol=1e-5
        )
