"""One set of Transformer weights in a library-neutral layout, saved as `.npz`.

Names: `embedding` `[vocab, d_model]` (shared by both embeddings and the pre-softmax layer), and
per layer `{encoder|decoder}.{i}.{block}.{part}` where block is `self`, `cross` (decoder only) or
`ffn`, and each block has its post-residual LayerNorm `{block}_norm.scale|bias`. Attention parts
`q k v` are `[d_model, heads * head_dim]` and `o` is `[heads * head_dim, d_model]`, used as
`x @ W` (no biases, as in tfm); FFN parts are `w1 [d_model, d_ff]`, `b1`, `w2 [d_ff, d_model]`,
`b2`. Torch-style `Linear.weight` is the transpose of these matrices.
"""

from __future__ import annotations

import numpy as np

Weights = dict[str, np.ndarray]


def from_tfm_params(params, num_layers: int) -> Weights:
    """tfm's Flax parameter tree -> the neutral layout (head axes flattened)."""

    out: Weights = {"embedding": np.asarray(params["embedding"]["embedding"], np.float32)}

    def attention(prefix: str, tree) -> None:
        for part, name in (("q", "query"), ("k", "key"), ("v", "value")):
            kernel = np.asarray(tree[name]["kernel"], np.float32)  # [d_model, heads, d]
            out[f"{prefix}.{part}"] = kernel.reshape(kernel.shape[0], -1)
        kernel = np.asarray(tree["out"]["kernel"], np.float32)  # [heads, d, d_model]
        out[f"{prefix}.o"] = kernel.reshape(-1, kernel.shape[-1])

    def norm(prefix: str, tree) -> None:
        out[f"{prefix}.scale"] = np.asarray(tree["norm"]["scale"], np.float32)
        out[f"{prefix}.bias"] = np.asarray(tree["norm"]["bias"], np.float32)

    def ffn(prefix: str, tree) -> None:
        out[f"{prefix}.w1"] = np.asarray(tree["inner"]["kernel"], np.float32)
        out[f"{prefix}.b1"] = np.asarray(tree["inner"]["bias"], np.float32)
        out[f"{prefix}.w2"] = np.asarray(tree["outer"]["kernel"], np.float32)
        out[f"{prefix}.b2"] = np.asarray(tree["outer"]["bias"], np.float32)

    for i in range(num_layers):
        enc, dec = params[f"encoder_{i}"], params[f"decoder_{i}"]
        attention(f"encoder.{i}.self", enc["self_attention"])
        norm(f"encoder.{i}.self_norm", enc["attention_block"])
        ffn(f"encoder.{i}.ffn", enc["feed_forward"])
        norm(f"encoder.{i}.ffn_norm", enc["feed_forward_block"])
        attention(f"decoder.{i}.self", dec["self_attention"])
        norm(f"decoder.{i}.self_norm", dec["self_attention_block"])
        attention(f"decoder.{i}.cross", dec["cross_attention"])
        norm(f"decoder.{i}.cross_norm", dec["cross_attention_block"])
        ffn(f"decoder.{i}.ffn", dec["feed_forward"])
        norm(f"decoder.{i}.ffn_norm", dec["feed_forward_block"])
    return out


def save(weights: Weights, path: str) -> None:
    np.savez(path, **weights)


def load(path: str) -> Weights:
    with np.load(path) as data:
        return {name: data[name] for name in data.files}
