"""A trained tfm model in a library-neutral layout, and what each export target can represent.

Names: `embedding` `[vocab, d_model]` (shared by both embeddings and the pre-softmax layer,
section 3.4), `{encoder|decoder}.positions` `[max_positions, d_model]` (the sinusoids of section
3.5, or the learned tables of Table 3 row E), and per layer `{encoder|decoder}.{i}.{block}.{part}`
where block is `self`, `cross` (decoder only) or `ffn`, each with its LayerNorm
`{block}_norm.scale|bias` (after the residual add for post-LN, before the sub-layer for pre-LN,
whose stacks also end in `{encoder|decoder}.final_norm`). Attention parts `q k v` are
`[d_model, heads * head_dim]` and `o` `[heads * head_dim, d_model]`, used as `x @ W` (no biases,
as in tfm); FFN parts are `w1 [d_model, d_ff]`, `b1`, `w2 [d_ff, d_model]`, `b2`. A torch
`Linear.weight` is the transpose of these matrices.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfm.config import ModelConfig

Weights = dict[str, np.ndarray]


class ExportError(ValueError):
    """A model the target library cannot represent exactly; the message says why."""


def sinusoidal_table(length: int, d_model: int) -> np.ndarray:
    """Section 3.5 in float64 then float32: sines in even columns, cosines in odd ones,
    `[length, d_model]`."""
    two_i = np.arange(0, d_model, 2)
    angles = np.arange(length)[:, None] / np.power(10_000.0, two_i / d_model)
    table = np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(length, d_model)
    return table.astype(np.float32)


def from_tfm_params(params, config: ModelConfig, positions: int) -> Weights:
    """tfm's Flax parameter tree -> the neutral layout (head axes flattened), with position
    tables of `positions` rows."""
    out: Weights = {"embedding": np.array(params["embedding"]["embedding"], np.float32)}
    if config.positional == "learned":
        for side, name in (("encoder", "src_position_table"), ("decoder", "tgt_position_table")):
            out[f"{side}.positions"] = np.array(params[name]["positions"], np.float32)
    else:
        table = sinusoidal_table(positions, config.d_model)
        out["encoder.positions"] = out["decoder.positions"] = table

    def attention(prefix: str, tree) -> None:
        for part, name in (("q", "query"), ("k", "key"), ("v", "value")):
            kernel = np.array(tree[name]["kernel"], np.float32)  # [d_model, heads, d]
            out[f"{prefix}.{part}"] = kernel.reshape(kernel.shape[0], -1)
        kernel = np.array(tree["out"]["kernel"], np.float32)  # [heads, d, d_model]
        out[f"{prefix}.o"] = kernel.reshape(-1, kernel.shape[-1])

    def norm(prefix: str, tree) -> None:
        out[f"{prefix}.scale"] = np.array(tree["scale"], np.float32)
        out[f"{prefix}.bias"] = np.array(tree["bias"], np.float32)

    def ffn(prefix: str, tree) -> None:
        out[f"{prefix}.w1"] = np.array(tree["inner"]["kernel"], np.float32)
        out[f"{prefix}.b1"] = np.array(tree["inner"]["bias"], np.float32)
        out[f"{prefix}.w2"] = np.array(tree["outer"]["kernel"], np.float32)
        out[f"{prefix}.b2"] = np.array(tree["outer"]["bias"], np.float32)

    for i in range(config.num_layers):
        enc, dec = params[f"encoder_{i}"], params[f"decoder_{i}"]
        attention(f"encoder.{i}.self", enc["self_attention"])
        norm(f"encoder.{i}.self_norm", enc["attention_block"]["norm"])
        ffn(f"encoder.{i}.ffn", enc["feed_forward"])
        norm(f"encoder.{i}.ffn_norm", enc["feed_forward_block"]["norm"])
        attention(f"decoder.{i}.self", dec["self_attention"])
        norm(f"decoder.{i}.self_norm", dec["self_attention_block"]["norm"])
        attention(f"decoder.{i}.cross", dec["cross_attention"])
        norm(f"decoder.{i}.cross_norm", dec["cross_attention_block"]["norm"])
        ffn(f"decoder.{i}.ffn", dec["feed_forward"])
        norm(f"decoder.{i}.ffn_norm", dec["feed_forward_block"]["norm"])
    if config.norm == "pre":
        norm("encoder.final_norm", params["encoder_norm"])
        norm("decoder.final_norm", params["decoder_norm"])
    return out


# The fields every export maps as they are (shapes, the training-only and compute settings);
# any other field is a variant, exported only where the target says it supports the value.
MAPPED_FIELDS = frozenset(
    {
        "vocab_size",
        "num_layers",
        "d_model",
        "d_ff",
        "num_heads",
        "d_k",
        "d_v",
        "dropout_rate",
        "attention_dropout_rate",
        "max_positions",
        "dtype",
        "attention",
        "remat",
        "layer_norm_epsilon",
        "norm",
        "positional",
    }
)


def check_exportable(
    config: ModelConfig,
    target: str,
    *,
    pre_norm: bool,
    learned: bool,
    supported: dict[str, tuple] | None = None,
) -> None:
    """Refuse a model `target` cannot compute exactly (ExportError names the reason).

    `supported` maps each variant field the target can represent to the values it can; a field
    it does not name is exported only at `ModelConfig`'s default, so a new variant is refused,
    named, until an exporter says it represents it.
    """
    supported = supported or {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name in MAPPED_FIELDS or value == field.default:
            continue
        if value not in supported.get(field.name, ()):
            raise ExportError(
                f"{target} cannot represent ModelConfig.{field.name}={value!r} (exports "
                f"{supported.get(field.name, (field.default,))!r}); train with the default or "
                "export to another target"
            )
    if config.d_k * config.num_heads != config.d_model or config.d_v != config.d_k:
        raise ExportError(
            f"{target} needs d_k = d_v = d_model / h; this model has d_model {config.d_model}, "
            f"h {config.num_heads}, d_k {config.d_k}, d_v {config.d_v} (Table 3 rows A/B/C)"
        )
    if config.norm == "pre" and not pre_norm:
        raise ExportError(f"{target} has only post-LN layers; this model is pre-LN (norm='pre')")
    if config.positional == "learned" and not learned:
        raise ExportError(
            f"{target} has only sinusoidal positions; this model learned its positions "
            "(positional='learned', Table 3 row E)"
        )
