"""CTranslate2: a `TransformerSpec` (ReLU, scaled shared embeddings, post- or pre-LN) filled
with a tfm model's weights and position tables, saved as a model directory that
`ctranslate2.Translator(OUT)` loads, with the SentencePiece model copied beside it.

The source side gets EOS appended by CTranslate2 itself (`add_source_eos`), as tfm encodes
sources; decoding starts from BOS. Vocabularies are the SentencePiece pieces in id order.
"""

from __future__ import annotations

import pathlib
import shutil

import numpy as np

from tfm.config import ModelConfig
from tfm.export.weights import ExportError, Weights, check_exportable

QUANTIZATIONS = ("float32", "int8", "int8_float32", "float16", "bfloat16")
SPM_FILE = "sentencepiece.model"


def build_spec(config: ModelConfig, weights: Weights, pieces: list[str]):
    """The `TransformerSpec` of a model in the neutral layout (`tfm.export.weights`)."""
    from ctranslate2.specs import TransformerSpec

    check_exportable(config, "CTranslate2", pre_norm=True, learned=True)
    pre = config.norm == "pre"
    spec = TransformerSpec.from_config(
        (config.num_layers, config.num_layers),
        config.num_heads,
        pre_norm=pre,
        no_final_norm=not pre,
    )

    def attention(target, prefix: str, fused_self: bool) -> None:
        q, k, v, o = (weights[f"{prefix}.{p}"].T for p in "qkvo")
        if fused_self:
            target.linear[0].weight = np.concatenate([q, k, v], axis=0)
            target.linear[1].weight = np.ascontiguousarray(o)
        else:
            target.linear[0].weight = np.ascontiguousarray(q)
            target.linear[1].weight = np.concatenate([k, v], axis=0)
            target.linear[2].weight = np.ascontiguousarray(o)

    def norm(target, prefix: str) -> None:
        target.gamma = weights[f"{prefix}.scale"]
        target.beta = weights[f"{prefix}.bias"]

    def ffn(target, prefix: str) -> None:
        target.linear_0.weight = np.ascontiguousarray(weights[f"{prefix}.w1"].T)
        target.linear_0.bias = weights[f"{prefix}.b1"]
        target.linear_1.weight = np.ascontiguousarray(weights[f"{prefix}.w2"].T)
        target.linear_1.bias = weights[f"{prefix}.b2"]

    embedding = weights["embedding"]
    spec.encoder.embeddings[0].weight = embedding
    spec.encoder.scale_embeddings = True
    spec.encoder.position_encodings.encodings = weights["encoder.positions"]
    spec.decoder.embeddings.weight = embedding
    spec.decoder.scale_embeddings = True
    spec.decoder.position_encodings.encodings = weights["decoder.positions"]
    spec.decoder.projection.weight = embedding
    for i, layer in enumerate(spec.encoder.layer):
        attention(layer.self_attention, f"encoder.{i}.self", fused_self=True)
        norm(layer.self_attention.layer_norm, f"encoder.{i}.self_norm")
        ffn(layer.ffn, f"encoder.{i}.ffn")
        norm(layer.ffn.layer_norm, f"encoder.{i}.ffn_norm")
    for i, layer in enumerate(spec.decoder.layer):
        attention(layer.self_attention, f"decoder.{i}.self", fused_self=True)
        norm(layer.self_attention.layer_norm, f"decoder.{i}.self_norm")
        attention(layer.attention, f"decoder.{i}.cross", fused_self=False)
        norm(layer.attention.layer_norm, f"decoder.{i}.cross_norm")
        ffn(layer.ffn, f"decoder.{i}.ffn")
        norm(layer.ffn.layer_norm, f"decoder.{i}.ffn_norm")
    if pre:
        norm(spec.encoder.layer_norm, "encoder.final_norm")
        norm(spec.decoder.layer_norm, "decoder.final_norm")
    spec.config.layer_norm_epsilon = config.layer_norm_epsilon
    spec.config.add_source_eos = True
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = (
        pieces[3],
        pieces[1],
        pieces[2],
    )
    spec.config.decoder_start_token = pieces[1]
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.validate()
    return spec


def export(
    config: ModelConfig,
    weights: Weights,
    pieces: list[str],
    spm_model: pathlib.Path,
    out: pathlib.Path,
    quantization: str = "float32",
) -> None:
    """Write the CTranslate2 model directory `out` (weights stored as `quantization`)."""
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"--quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    spec = build_spec(config, weights, pieces)
    spec.optimize(quantization=None if quantization == "float32" else quantization)
    out.mkdir(parents=True, exist_ok=True)
    spec.save(str(out))
    shutil.copyfile(spm_model, out / SPM_FILE)
