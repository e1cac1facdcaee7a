"""What many tests share: the small Transformer they train, decode and shard."""

import os

from tfm import ModelConfig

# decode.py keeps a persistent compilation cache in ~/.cache/tfm/jax by default; tests leave the
# home directory alone (a test that checks the cache passes its own directory)
os.environ["TFM_COMPILATION_CACHE"] = ""

TINY_MODEL = dict(num_layers=2, d_model=32, d_ff=64, num_heads=4, d_k=8, d_v=8, dropout_rate=0.0)


def tiny_model_config(vocab_size: int = 40, **changes) -> ModelConfig:
    """2+2 layers, d_model 32, 4 heads of width 8, d_ff 64, no dropout (unless changed)."""
    return ModelConfig(vocab_size=vocab_size, **{**TINY_MODEL, **changes})
