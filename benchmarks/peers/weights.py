"""The library-neutral weight layout (`tfm.export.weights`), saved as `.npz` so peer processes
never import JAX."""

from __future__ import annotations

import numpy as np

Weights = dict[str, np.ndarray]


def from_tfm_params(params, num_layers: int) -> Weights:
    """tfm's Flax parameter tree of a post-LN model -> the neutral layout, without positions
    (peers build the sinusoid table themselves)."""
    from tfm.config import ModelConfig
    from tfm.export.weights import from_tfm_params as export_layout

    embedding = params["embedding"]["embedding"]
    heads, head_dim = params["encoder_0"]["self_attention"]["query"]["kernel"].shape[1:]
    config = ModelConfig(
        vocab_size=embedding.shape[0],
        num_layers=num_layers,
        d_model=embedding.shape[1],
        d_ff=params["encoder_0"]["feed_forward"]["inner"]["kernel"].shape[1],
        num_heads=heads,
        d_k=head_dim,
        d_v=head_dim,
    )
    weights = export_layout(params, config, positions=1)
    return {k: v for k, v in weights.items() if not k.endswith(".positions")}


def save(weights: Weights, path: str) -> None:
    np.savez(path, **weights)


def load(path: str) -> Weights:
    with np.load(path) as data:
        return {name: data[name] for name in data.files}
