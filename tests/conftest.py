"""What many tests share: the platform they run on, and the small Transformer they train,
decode and shard.

The suite runs tfm on JAX's CPU platform, whatever jaxlib is installed (a CUDA or TPU build
included): JAX_PLATFORMS=cpu is set here, before JAX is imported, and every subprocess a test
starts inherits it. Numbers the tests compare (equal outputs of two kernels, of a cached and an
uncached search, of one and eight devices) are then computed on the same backend everywhere.
Set TFM_TEST_PLATFORMS to run them on another platform instead (e.g. "cuda"); the tests that
need a particular one say so and are skipped elsewhere.
"""

import itertools
import os

os.environ["JAX_PLATFORMS"] = os.environ.get("TFM_TEST_PLATFORMS", "cpu")
# decode.py keeps a persistent compilation cache in ~/.cache/tfm/jax by default; tests leave the
# home directory alone (a test that checks the cache passes its own directory)
os.environ["TFM_COMPILATION_CACHE"] = ""

import jax  # noqa: E402
import numpy as np  # noqa: E402

from tfm import ModelConfig  # noqa: E402

TINY_MODEL = dict(num_layers=2, d_model=32, d_ff=64, num_heads=4, d_k=8, d_v=8, dropout_rate=0.0)


def pytest_report_header(config):
    return f"tfm tests on JAX platform(s): {os.environ['JAX_PLATFORMS']} (tests/conftest.py)"


def tiny_model_config(vocab_size: int = 40, **changes) -> ModelConfig:
    """2+2 layers, d_model 32, 4 heads of width 8, d_ff 64, no dropout (unless changed)."""
    return ModelConfig(vocab_size=vocab_size, **{**TINY_MODEL, **changes})


_FRESH = itertools.count(1)


def fresh_model_config(vocab_size: int = 40, **changes) -> ModelConfig:
    """A tiny config that no other call returns (its LayerNorm epsilon differs by a hair): the
    programs of a model built from it are compiled anew, so a test can count compilations
    whatever ran before it in the session."""
    epsilon = 1e-6 * (1 + next(_FRESH) / 1024)
    return tiny_model_config(vocab_size, layer_norm_epsilon=epsilon, **changes)


def largest_difference(tree_a, tree_b) -> float:
    """max |a - b| over every leaf of two trees of the same structure (e.g. two sets of
    parameters), read to the host."""
    return max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(jax.tree.leaves(tree_a), jax.tree.leaves(tree_b), strict=True)
    )
