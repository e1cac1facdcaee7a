"""Hugging Face `MarianMTModel` (post-LN, sinusoidal positions, shared and scaled embeddings),
configured to the paper's architecture: ReLU, no attention-weight or activation dropout, the
sinusoidal table replaced by the paper's interleaved one, zero attention biases. Decoding goes
through `generate` with its KV cache."""

from __future__ import annotations

import numpy as np
import torch
from transformers import MarianConfig, MarianMTModel

from peers import weights as neutral
from peers.torch_system import TorchTraining
from peers.workloads import (
    BOS_ID,
    DROPOUT,
    EOS_ID,
    LAYER_NORM_EPSILON,
    PAD_ID,
    Workload,
    decoding_source,
    sinusoidal_table,
)

NAME = "hf"


def build(w: Workload, dropout: float) -> MarianMTModel:
    s = w.shape
    config = MarianConfig(
        vocab_size=s.vocab_size,
        decoder_vocab_size=s.vocab_size,
        d_model=s.d_model,
        encoder_layers=s.num_layers,
        decoder_layers=s.num_layers,
        encoder_attention_heads=s.num_heads,
        decoder_attention_heads=s.num_heads,
        encoder_ffn_dim=s.d_ff,
        decoder_ffn_dim=s.d_ff,
        activation_function="relu",
        dropout=dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=512,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
    )
    torch.manual_seed(0)
    model = MarianMTModel(config)
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = LAYER_NORM_EPSILON
    return model


def load_weights(model: MarianMTModel, weights: neutral.Weights) -> None:
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))
    core = model.model
    table = t(sinusoidal_table(core.encoder.embed_positions.weight.shape[0], model.config.d_model))
    with torch.no_grad():
        core.shared.weight.copy_(t(weights["embedding"]))
        core.encoder.embed_positions.weight.copy_(table)
        core.decoder.embed_positions.weight.copy_(table)
        model.final_logits_bias.zero_()

        def attention(module, prefix: str) -> None:
            for part, linear in (
                ("q", module.q_proj),
                ("k", module.k_proj),
                ("v", module.v_proj),
                ("o", module.out_proj),
            ):
                linear.weight.copy_(t(weights[f"{prefix}.{part}"].T))
                linear.bias.zero_()

        def norm(module, prefix: str) -> None:
            module.weight.copy_(t(weights[f"{prefix}.scale"]))
            module.bias.copy_(t(weights[f"{prefix}.bias"]))

        def ffn(layer, prefix: str) -> None:
            layer.fc1.weight.copy_(t(weights[f"{prefix}.w1"].T))
            layer.fc1.bias.copy_(t(weights[f"{prefix}.b1"]))
            layer.fc2.weight.copy_(t(weights[f"{prefix}.w2"].T))
            layer.fc2.bias.copy_(t(weights[f"{prefix}.b2"]))

        for i, layer in enumerate(core.encoder.layers):
            attention(layer.self_attn, f"encoder.{i}.self")
            norm(layer.self_attn_layer_norm, f"encoder.{i}.self_norm")
            ffn(layer, f"encoder.{i}.ffn")
            norm(layer.final_layer_norm, f"encoder.{i}.ffn_norm")
        for i, layer in enumerate(core.decoder.layers):
            attention(layer.self_attn, f"decoder.{i}.self")
            norm(layer.self_attn_layer_norm, f"decoder.{i}.self_norm")
            attention(layer.encoder_attn, f"decoder.{i}.cross")
            norm(layer.encoder_attn_layer_norm, f"decoder.{i}.cross_norm")
            ffn(layer, f"decoder.{i}.ffn")
            norm(layer.final_layer_norm, f"decoder.{i}.ffn_norm")
    if model.lm_head.weight.data_ptr() != core.shared.weight.data_ptr():
        raise RuntimeError("MarianMTModel did not tie the output layer to the shared embedding")


def Trainer(w: Workload, weights_path: str) -> TorchTraining:
    model = build(w, DROPOUT)
    load_weights(model, neutral.load(weights_path))

    def forward(src, tgt_in):
        return model(
            input_ids=src, attention_mask=(src != PAD_ID).long(), decoder_input_ids=tgt_in
        ).logits

    return TorchTraining(w, model, forward)


class Decoder:
    """`generate` with exactly `tgt_len` new tokens (greedy, or beam search of `beam_size`)."""

    def __init__(self, w: Workload, weights_path: str):
        self.model = build(w, 0.0).eval()
        load_weights(self.model, neutral.load(weights_path))
        self.src = torch.from_numpy(decoding_source(w)).long()
        self.settings = dict(
            max_new_tokens=w.tgt_len,
            min_new_tokens=w.tgt_len,
            num_beams=w.beam_size,
            do_sample=False,
            early_stopping=False,
            length_penalty=1.0,
        )

    @torch.inference_mode()
    def run(self) -> np.ndarray:
        out = self.model.generate(
            input_ids=self.src, attention_mask=(self.src != PAD_ID).long(), **self.settings
        )
        return out[:, 1:].numpy()  # drop the decoder start token
