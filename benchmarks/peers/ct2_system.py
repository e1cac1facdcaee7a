"""CTranslate2 (float32, CPU): a `TransformerSpec` (post-LN, no final norm, ReLU) filled with the
shared weights and the paper's sinusoidal table, saved to a model directory and decoded with
`Translator.translate_batch`."""

from __future__ import annotations

import os
import tempfile

import ctranslate2
import numpy as np
from ctranslate2.specs import TransformerSpec

from peers import weights as neutral
from peers.workloads import (
    LAYER_NORM_EPSILON,
    Workload,
    decoding_source,
    sinusoidal_table,
)

NAME = "ct2"
SPECIAL_TOKENS = ["<blank>", "<s>", "</s>", "<unk>"]  # ids 0..3, as in tfm


def vocabulary(size: int) -> list[str]:
    return SPECIAL_TOKENS + [f"t{i}" for i in range(len(SPECIAL_TOKENS), size)]


def build_spec(w: Workload, weights: neutral.Weights) -> TransformerSpec:
    s = w.shape
    spec = TransformerSpec.from_config(
        (s.num_layers, s.num_layers), s.num_heads, pre_norm=False, no_final_norm=True
    )
    table = sinusoidal_table(512, s.d_model)
    embedding = weights["embedding"]

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

    spec.encoder.embeddings[0].weight = embedding
    spec.encoder.scale_embeddings = True
    spec.encoder.position_encodings.encodings = table
    spec.decoder.embeddings.weight = embedding
    spec.decoder.scale_embeddings = True
    spec.decoder.position_encodings.encodings = table
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
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    tokens = vocabulary(s.vocab_size)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.validate()
    spec.optimize(quantization=None)
    return spec


class Decoder:
    """`translate_batch` forced to exactly `tgt_len` new tokens, float32, all CPU cores."""

    def __init__(self, w: Workload, weights_path: str):
        self._directory = tempfile.TemporaryDirectory(prefix="tfm-ct2-")
        build_spec(w, neutral.load(weights_path)).save(self._directory.name)
        self.translator = ctranslate2.Translator(
            self._directory.name,
            device="cpu",
            compute_type="float32",
            inter_threads=1,
            intra_threads=os.cpu_count() or 1,
        )
        self.tokens = vocabulary(w.shape.vocab_size)
        self.index = {token: i for i, token in enumerate(self.tokens)}
        self.source = [[self.tokens[i] for i in row] for row in decoding_source(w)]
        self.settings = dict(
            beam_size=w.beam_size,
            max_decoding_length=w.tgt_len,
            min_decoding_length=w.tgt_len,
            length_penalty=0.0,
            max_batch_size=0,
        )

    def run(self) -> np.ndarray:
        results = self.translator.translate_batch(self.source, **self.settings)
        return np.array([[self.index[t] for t in r.hypotheses[0]] for r in results], np.int64)
