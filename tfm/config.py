"""Model hyper-parameters (section 3, Table 3) as one frozen, validated dataclass.

The config is a plain value: it is built once at the edge (train.py, decode.py, a user's script)
and passed down; nothing in the library looks it up globally.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

POSITIONAL_KINDS = ("sinusoidal", "learned")
NORM_PLACEMENTS = ("post", "pre")
ACTIVATIONS = ("relu", "gelu", "swish")
NORMALIZATIONS = ("layer", "rms")
COMPUTE_DTYPES = ("float32", "bfloat16")
ATTENTION_IMPLEMENTATIONS = ("reference", "xla", "cudnn")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and regularisation of one Transformer (Table 3 columns N, d_model, d_ff, h, d_k, d_v,
    P_drop, positional encoding).

    Attributes:
      vocab_size: size of the ONE vocabulary shared by source and target (section 3.4).
      num_layers: N, the number of encoder layers and of decoder layers.
      d_model: width of every sub-layer output and of the embeddings.
      d_ff: inner width of the position-wise feed-forward network (section 3.3).
      num_heads: h, the number of attention heads.
      d_k: width of each head's queries and keys. Need not equal d_model / h (Table 3 rows A, B).
      d_v: width of each head's values.
      dropout_rate: P_drop, applied to each sub-layer output before the residual add and to the
        embedding + positional-encoding sum (section 5.4).
      attention_dropout_rate: dropout on the attention weights (not in the paper; tensor2tensor
        offers it). 0 disables it; needs `attention="reference"`.
      positional: "sinusoidal" (section 3.5) or "learned" (Table 3 row E).
      max_positions: positions a learned table covers (row E), and the default decoding cache
        length; sinusoids need no table.
      norm: "post" for the paper's LayerNorm(x + Dropout(Sublayer(x))), "pre" for
        x + Dropout(Sublayer(LayerNorm(x))) with a final LayerNorm on each stack.
      dtype: compute dtype of activations and matmuls; parameters stay float32 and softmax and
        logits are always float32.
      attention: "reference" (tfm's own Eq. 1), or "xla" / "cudnn" through
        `jax.nn.dot_product_attention`.
      normalization: "layer" (the paper's layer normalization, scale and bias) or "rms" (RMSNorm,
        Zhang & Sennrich 2019: x / rms(x) * scale, no mean and no bias), wherever `norm` puts one.
      activation: the FFN's nonlinearity (section 3.3): "relu" (the paper's max(0, x)), "gelu"
        (x Phi(x), the exact erf form) or "swish" (x sigmoid(x), as OPUS-MT's Marian models).
      attention_bias: biases on the Q, K, V and output projections (section 3.2.2 has none;
        Marian's models have them).
      remat: recompute each layer's activations in the backward pass to save memory.
      layer_norm_epsilon: epsilon inside LayerNorm.
    """

    vocab_size: int
    num_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    d_k: int = 64
    d_v: int = 64
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    positional: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_positions: int = 256
    norm: Literal["post", "pre"] = "post"
    dtype: Literal["float32", "bfloat16"] = "float32"
    attention: Literal["reference", "xla", "cudnn"] = "reference"
    remat: bool = False
    normalization: Literal["layer", "rms"] = "layer"
    activation: Literal["relu", "gelu", "swish"] = "relu"
    attention_bias: bool = False
    layer_norm_epsilon: float = 1e-6

    def __post_init__(self) -> None:
        positive = (
            "vocab_size",
            "num_layers",
            "d_model",
            "d_ff",
            "num_heads",
            "d_k",
            "d_v",
            "max_positions",
        )
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        if self.vocab_size < 4:
            raise ValueError(
                f"ModelConfig.vocab_size must be at least 4 (pad, unk, bos, eos), got "
                f"{self.vocab_size}"
            )
        for name in ("dropout_rate", "attention_dropout_rate"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (0.0 <= value < 1.0)
            ):
                raise ValueError(f"ModelConfig.{name} must be a number in [0, 1), got {value!r}")
        if not (isinstance(self.layer_norm_epsilon, (int, float)) and self.layer_norm_epsilon > 0):
            raise ValueError(
                f"ModelConfig.layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon!r}"
            )
        choices = {
            "positional": POSITIONAL_KINDS,
            "norm": NORM_PLACEMENTS,
            "dtype": COMPUTE_DTYPES,
            "attention": ATTENTION_IMPLEMENTATIONS,
            "activation": ACTIVATIONS,
            "normalization": NORMALIZATIONS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"ModelConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}"
                )
        if self.attention != "reference" and self.attention_dropout_rate > 0.0:
            # the fused kernels never form the weights, so their dropout would silently not run
            raise ValueError(
                f"ModelConfig.attention_dropout_rate={self.attention_dropout_rate} needs "
                f"ModelConfig.attention='reference' (the fused {self.attention!r} kernels have "
                "no attention-weight dropout); set one of them back"
            )
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(
                f"ModelConfig.d_model must be even for sinusoidal positions (sin/cos pairs, "
                f"section 3.5), got {self.d_model}"
            )
        for name in ("remat", "attention_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"ModelConfig.{name} must be True or False, got {getattr(self, name)!r}"
                )

    def replace(self, **changes) -> ModelConfig:
        """A copy with `changes` applied, validated again."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class Preset:
    """One row of Table 3 (or Table 2's big model): the model, the training recipe values the
    row changes, and the paper's reported figures to compare against."""

    name: str
    model: ModelConfig
    label_smoothing: float = 0.1
    train_steps: int = 100_000
    paper_params_millions: float | None = None
    paper_dev_ppl: float | None = None
    paper_dev_bleu: float | None = None


PAPER_VOCAB_SIZE = 37_000  # shared BPE vocabulary for WMT14 En-De (section 5.1)


def base(vocab_size: int = PAPER_VOCAB_SIZE, **overrides) -> ModelConfig:
    """Transformer (base): N=6, d_model=512, d_ff=2048, h=8, d_k=d_v=64, P_drop=0.1."""
    return ModelConfig(vocab_size=vocab_size, **overrides)


def big(vocab_size: int = PAPER_VOCAB_SIZE, **overrides) -> ModelConfig:
    """Transformer (big): N=6, d_model=1024, d_ff=4096, h=16, d_k=d_v=64, P_drop=0.3 (En-De)."""
    values = dict(d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3)
    values.update(overrides)
    return ModelConfig(vocab_size=vocab_size, **values)


# (name, changes from base, label smoothing, steps, paper params (M), dev PPL, dev BLEU).
# A blank params cell in Table 3 means "as in base" (65M).
_TABLE3_ROWS = (
    ("base", {}, 0.1, 100_000, 65, 4.92, 25.8),
    ("A1", dict(num_heads=1, d_k=512, d_v=512), 0.1, 100_000, 65, 5.29, 24.9),
    ("A4", dict(num_heads=4, d_k=128, d_v=128), 0.1, 100_000, 65, 5.00, 25.5),
    ("A16", dict(num_heads=16, d_k=32, d_v=32), 0.1, 100_000, 65, 4.91, 25.8),
    ("A32", dict(num_heads=32, d_k=16, d_v=16), 0.1, 100_000, 65, 5.01, 25.4),
    ("B16", dict(d_k=16), 0.1, 100_000, 58, 5.16, 25.1),
    ("B32", dict(d_k=32), 0.1, 100_000, 60, 5.01, 25.4),
    ("C_N2", dict(num_layers=2), 0.1, 100_000, 36, 6.11, 23.7),
    ("C_N4", dict(num_layers=4), 0.1, 100_000, 50, 5.19, 25.3),
    ("C_N8", dict(num_layers=8), 0.1, 100_000, 80, 4.88, 25.5),
    ("C_d256", dict(d_model=256, d_k=32, d_v=32), 0.1, 100_000, 28, 5.75, 24.5),
    ("C_d1024", dict(d_model=1024, d_k=128, d_v=128), 0.1, 100_000, 168, 4.66, 26.0),
    ("C_ff1024", dict(d_ff=1024), 0.1, 100_000, 53, 5.12, 25.4),
    ("C_ff4096", dict(d_ff=4096), 0.1, 100_000, 90, 4.75, 26.2),
    ("D_drop0.0", dict(dropout_rate=0.0), 0.1, 100_000, 65, 5.77, 24.6),
    ("D_drop0.2", dict(dropout_rate=0.2), 0.1, 100_000, 65, 4.95, 25.5),
    ("D_ls0.0", {}, 0.0, 100_000, 65, 4.67, 25.3),
    ("D_ls0.2", {}, 0.2, 100_000, 65, 5.47, 25.7),
    ("E", dict(positional="learned"), 0.1, 100_000, 65, 4.92, 25.7),
    (
        "big",
        dict(d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3),
        0.1,
        300_000,
        213,
        4.33,
        26.4,
    ),
)


def table3(vocab_size: int = PAPER_VOCAB_SIZE) -> dict[str, Preset]:
    """Every row of Table 3 (En-De, newstest2013) as a Preset, keyed by a short row name."""
    return {
        name: Preset(
            name=name,
            model=ModelConfig(vocab_size=vocab_size, **changes),
            label_smoothing=ls,
            train_steps=steps,
            paper_params_millions=params,
            paper_dev_ppl=ppl,
            paper_dev_bleu=bleu,
        )
        for name, changes, ls, steps, params, ppl, bleu in _TABLE3_ROWS
    }
