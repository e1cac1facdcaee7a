"""Hugging Face: a `MarianMTModel` checkpoint (safetensors) and a `MarianTokenizer` over tfm's own
SentencePiece model, so `pipeline("translation", model=OUT)` translates raw text.

Two differences from tfm that the export bridges exactly:
- Marian lays its sinusoids out as [sines | cosines]; section 3.5 interleaves them. A transformer
  computes the same function under any fixed permutation of the d_model axis applied to every
  weight that touches it, so the export permutes the embedding columns, LayerNorms, attention and
  FFN weights once, and Marian's own table then equals the paper's at every position.
- Marian's attention projections and its final logits carry biases; tfm has none: all zero.
One it cannot: Marian's LayerNorm epsilon is fixed at 1e-5 (tfm's default is 1e-6); the
log-probabilities move by ~1e-6 (tests/test_export.py measures it).
"""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np

from tfm.config import ModelConfig
from tfm.export.weights import Weights, check_exportable
from tfm.tokens import BOS_ID, EOS_ID, PAD_ID


def marian_permutation(d_model: int) -> np.ndarray:
    """Index of tfm's column for each of Marian's: [0, 2, 4, ..., 1, 3, 5, ...]."""
    return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def permuted(weights: Weights, d_model: int) -> Weights:
    """The same model with its d_model axis in Marian's sinusoid order."""
    perm = marian_permutation(d_model)
    out = {}
    for name, value in weights.items():
        part = name.rsplit(".", 1)[-1]
        if name == "embedding" or part in ("o", "w2"):  # d_model is the last axis
            out[name] = value[:, perm]
        elif part in ("q", "k", "v", "w1"):  # d_model is the first axis
            out[name] = value[perm, :]
        elif part in ("scale", "bias", "b2"):
            out[name] = value[perm]
        else:  # b1 [d_ff]; position tables are Marian's own
            out[name] = value
    return out


def marian_config(config: ModelConfig, max_positions: int):
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=config.vocab_size,
        decoder_vocab_size=config.vocab_size,
        d_model=config.d_model,
        encoder_layers=config.num_layers,
        decoder_layers=config.num_layers,
        encoder_attention_heads=config.num_heads,
        decoder_attention_heads=config.num_heads,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        activation_function="relu",
        dropout=config.dropout_rate,
        attention_dropout=config.attention_dropout_rate,
        activation_dropout=0.0,
        max_position_embeddings=max_positions,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
    )


def generation_config(max_positions: int, beam_size: int):
    """`generate`'s defaults for the export: beam search of `beam_size`, outputs up to the position
    table's length. Transformers 5 ignores generation settings in the model's config and would
    otherwise stop every output at its model-agnostic 20 tokens."""
    from transformers import GenerationConfig

    return GenerationConfig(
        num_beams=beam_size,
        max_length=max_positions,
        bos_token_id=BOS_ID,
        decoder_start_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )


def build_model(config: ModelConfig, weights: Weights, max_positions: int, beam_size: int):
    """A `MarianMTModel` computing `config`'s Transformer with `weights` (neutral layout)."""
    import torch
    from transformers import MarianMTModel

    check_exportable(config, "Hugging Face MarianMTModel", pre_norm=False, learned=False)
    model = MarianMTModel(marian_config(config, max_positions))
    model.generation_config = generation_config(max_positions, beam_size)
    w = permuted(weights, config.d_model)
    t = lambda a: torch.from_numpy(np.array(a, np.float32))  # a writable copy
    core = model.model
    with torch.no_grad():
        core.shared.weight.copy_(t(w["embedding"]))
        model.final_logits_bias.zero_()

        def attention(module, prefix: str) -> None:
            for part, linear in zip(
                "qkvo", (module.q_proj, module.k_proj, module.v_proj, module.out_proj), strict=True
            ):
                linear.weight.copy_(t(w[f"{prefix}.{part}"].T))
                linear.bias.zero_()

        def norm(module, prefix: str) -> None:
            module.weight.copy_(t(w[f"{prefix}.scale"]))
            module.bias.copy_(t(w[f"{prefix}.bias"]))

        def ffn(layer, prefix: str) -> None:
            layer.fc1.weight.copy_(t(w[f"{prefix}.w1"].T))
            layer.fc1.bias.copy_(t(w[f"{prefix}.b1"]))
            layer.fc2.weight.copy_(t(w[f"{prefix}.w2"].T))
            layer.fc2.bias.copy_(t(w[f"{prefix}.b2"]))

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
    return model.eval()


def write_tokenizer(
    pieces: list[str], spm_model: pathlib.Path, out: pathlib.Path, languages: tuple[str, str]
) -> None:
    """A `MarianTokenizer` directory over tfm's SentencePiece model: the same model for both
    sides, and a vocabulary mapping every piece to its SentencePiece id."""
    shutil.copyfile(spm_model, out / "source.spm")
    shutil.copyfile(spm_model, out / "target.spm")
    (out / "vocab.json").write_text(
        json.dumps({piece: i for i, piece in enumerate(pieces)}, ensure_ascii=False)
    )
    settings = dict(
        tokenizer_class="MarianTokenizer",
        source_lang=languages[0],
        target_lang=languages[1],
        unk_token=pieces[3],
        eos_token=pieces[2],
        pad_token=pieces[0],
        separate_vocabs=False,
        # keep " ." and " '" as SentencePiece decodes them, as tfm does
        clean_up_tokenization_spaces=False,
        # text such as "</s>" or "<unk>" in a sentence is text, as SentencePiece reads it
        split_special_tokens=True,
        model_max_length=100_000,
    )
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=1))


def export(
    config: ModelConfig,
    weights: Weights,
    pieces: list[str],
    spm_model: pathlib.Path,
    out: pathlib.Path,
    languages: tuple[str, str],
    max_positions: int = 1024,
    beam_size: int = 4,
) -> None:
    """Write the `MarianMTModel` checkpoint and its tokenizer to `out`."""
    model = build_model(config, weights, max_positions, beam_size)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    write_tokenizer(pieces, spm_model, out, languages)
