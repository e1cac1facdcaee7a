"""What the model attended to while translating one sentence: every layer's attention weights,
teacher-forced on the translation `tfm.inference.translate` chose (the paper's Figures 3-5;
`tfm.viz.plot_attention` draws them)."""

from __future__ import annotations

import dataclasses

import numpy as np

from tfm.inference.translate import TranslateConfig, encode_sources, translate_ids
from tfm.model import Transformer
from tfm.tokens import BOS_ID, EOS_ID, PAD_ID


@dataclasses.dataclass
class AttendedTranslation:
    """One sentence's translation and what the model attended to while producing it.

    maps: "encoder self-attention", "decoder self-attention", "cross-attention" -> one
    `[heads, queries, keys]` array per layer, teacher-forced on the chosen translation.
    """

    translation: str
    source_pieces: list[str]
    target_pieces: list[str]
    maps: dict[str, list[np.ndarray]]


def attention_maps(
    model: Transformer, params, src: np.ndarray, tgt_in: np.ndarray
) -> dict[str, list[np.ndarray]]:
    """Every layer's attention weights `[heads, q, k]` for one sentence pair (teacher forced),
    read from the reference implementation's `intermediates`."""
    reference = model.clone(config=model.config.replace(attention="reference"))
    _, state = reference.apply({"params": params}, src, tgt_in, mutable=["intermediates"])
    layers = state["intermediates"]
    n = model.config.num_layers

    def weights(stack: str, kind: str) -> list[np.ndarray]:
        return [
            np.asarray(layers[f"{stack}_{i}"][kind]["attention_weights"][0][0]) for i in range(n)
        ]

    return {
        "encoder self-attention": weights("encoder", "self_attention"),
        "decoder self-attention": weights("decoder", "self_attention"),
        "cross-attention": weights("decoder", "cross_attention"),
    }


def translate_with_attention(
    model: Transformer, params, tokenizer, sentence: str, config: TranslateConfig
) -> AttendedTranslation:
    """Translate one sentence as `translate` does, then read its attention weights."""
    (ids,) = encode_sources(tokenizer, [sentence], config)
    (out,) = translate_ids(model, params, [ids], config) if ids else (None,)
    out = [] if out is None else [int(t) for t in out if t != PAD_ID]
    out = out[: out.index(EOS_ID) + 1] if EOS_ID in out else out
    src = np.array([ids + [EOS_ID]], np.int32)
    tgt_in = np.array([[BOS_ID] + out[:-1]], np.int32)
    return AttendedTranslation(
        translation=tokenizer.decode(out),
        source_pieces=tokenizer.pieces(ids + [EOS_ID]),
        target_pieces=["<s>"] + tokenizer.pieces(out[:-1]),
        maps=attention_maps(model, params, src, tgt_in),
    )
