"""tfm: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in JAX/Flax."""

from tfm import attention, config, layers
from tfm.config import ModelConfig, Preset
from tfm.model import PAD_ID, DecodeCache, LayerCache, Transformer

__all__ = [
    "attention",
    "config",
    "layers",
    "ModelConfig",
    "Preset",
    "Transformer",
    "DecodeCache",
    "LayerCache",
    "PAD_ID",
]
__version__ = "0.1.0"
