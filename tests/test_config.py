import dataclasses

import pytest

from tfm import ModelConfig
from tfm.config import base, big, table3
from tfm.params import count_parameters


@pytest.mark.parametrize(
    "field,value,rule",
    [
        ("vocab_size", 0, "positive integer"),
        ("vocab_size", 2, "at least 4"),
        ("num_layers", -1, "positive integer"),
        ("d_model", 7, "even"),
        ("d_ff", 1.5, "positive integer"),
        ("num_heads", True, "positive integer"),
        ("d_k", 0, "positive integer"),
        ("dropout_rate", 1.0, r"\[0, 1\)"),
        ("attention_dropout_rate", -0.1, r"\[0, 1\)"),
        ("positional", "rotary", "one of"),
        ("norm", "sandwich", "one of"),
        ("dtype", "float16", "one of"),
        ("attention", "flash", "one of"),
        ("remat", "yes", "True or False"),
    ],
)
def test_invalid_values_name_the_field_and_rule(field, value, rule):
    with pytest.raises(ValueError, match=rf"ModelConfig\.{field}.*{rule}"):
        ModelConfig(**{"vocab_size": 100, field: value})


def test_config_is_frozen_and_replace_validates():
    config = base()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 3
    assert config.replace(num_layers=2).num_layers == 2
    with pytest.raises(ValueError, match="num_layers"):
        config.replace(num_layers=0)


def test_presets_follow_the_paper():
    b = base()
    assert (b.num_layers, b.d_model, b.d_ff, b.num_heads, b.d_k, b.d_v, b.dropout_rate) == (
        6,
        512,
        2048,
        8,
        64,
        64,
        0.1,
    )
    g = big()
    assert (g.d_model, g.d_ff, g.num_heads, g.dropout_rate) == (1024, 4096, 16, 0.3)
    rows = table3()
    assert len(rows) == 20
    assert rows["B16"].model.d_k == 16 and rows["B16"].model.d_v == 64
    assert rows["A1"].model.num_heads == 1 and rows["A1"].model.d_k == 512
    assert rows["D_ls0.2"].label_smoothing == 0.2
    assert rows["E"].model.positional == "learned"
    assert rows["big"].train_steps == 300_000


def _closed_form_count(vocab, n, d, d_ff, h, d_k, d_v, learned_positions=0):
    """Parameters by hand: attention has no biases, LayerNorm has scale + bias."""
    attention = d * h * d_k * 2 + d * h * d_v + h * d_v * d
    ffn = d * d_ff + d_ff + d_ff * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    return vocab * d + n * (encoder_layer + decoder_layer) + learned_positions


def test_parameter_counts_match_the_closed_form():
    assert count_parameters(base()) == _closed_form_count(37000, 6, 512, 2048, 8, 64, 64)
    assert count_parameters(table3()["B16"].model) == _closed_form_count(
        37000, 6, 512, 2048, 8, 16, 64
    )
    learned = table3()["E"].model
    assert count_parameters(learned) == _closed_form_count(
        37000, 6, 512, 2048, 8, 64, 64, learned_positions=2 * learned.max_positions * 512
    )


@pytest.mark.parametrize("implementation", ["xla", "cudnn"])
def test_attention_dropout_with_a_fused_implementation_is_refused_naming_both_keys(implementation):
    """The fused kernels never form the attention weights, so their dropout could not run: the
    model would train without it, silently."""
    with pytest.raises(ValueError) as refused:
        ModelConfig(vocab_size=100, attention=implementation, attention_dropout_rate=0.1)
    message = str(refused.value)
    assert "attention_dropout_rate" in message and "attention=" in message
    ModelConfig(vocab_size=100, attention=implementation)  # without attention dropout: fine
    ModelConfig(vocab_size=100, attention_dropout_rate=0.1)  # with the reference: fine
