"""The workloads every system runs, and the inputs they share.

Shapes: SMALL = d_model 256, 4 heads, 2+2 layers, d_ff 1024, vocab 8000; BASE = the
paper's base model with a 32000-token vocabulary. Training: dropout 0.1 on sub-layer outputs and
embedding sums, label smoothing 0.1 (eps/vocab on every token, the reference token gets 1 - eps
more), Adam(0.9, 0.98, 1e-9) with the Eq. 3 schedule (warmup 4000), full-length rows with the
padding masks computed and applied all the same. Decoding: exactly 64 new tokens per sentence.

Everything here is NumPy only, so peer processes never import JAX.
"""

from __future__ import annotations

import dataclasses

import flops
import numpy as np

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_ORDINARY_ID = 4  # 0 pad, 1 BOS, 2 EOS, 3 unk
LAYER_NORM_EPSILON = 1e-6
DROPOUT = 0.1
LABEL_SMOOTHING = 0.1
ADAM = dict(b1=0.9, b2=0.98, eps=1e-9)
WARMUP_STEPS = 4000


@dataclasses.dataclass(frozen=True)
class Shape:
    vocab_size: int
    num_layers: int
    d_model: int
    d_ff: int
    num_heads: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


SMALL = Shape(vocab_size=8000, num_layers=2, d_model=256, d_ff=1024, num_heads=4)
BASE = Shape(vocab_size=32000, num_layers=6, d_model=512, d_ff=2048, num_heads=8)


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "train" | "greedy" | "beam"
    shape: Shape
    batch: int
    src_len: int
    tgt_len: int  # training target length, or new tokens for decoding
    beam_size: int = 1

    @property
    def tokens_per_run(self) -> int:
        """Target tokens one step (training) or one decode of the batch produces."""
        return self.batch * self.tgt_len


WORKLOADS = {
    w.name: w
    for w in [
        Workload("train_small", "train", SMALL, batch=32, src_len=64, tgt_len=64),
        Workload("train_base", "train", BASE, batch=8, src_len=64, tgt_len=64),
        Workload("greedy_small", "greedy", SMALL, batch=16, src_len=32, tgt_len=64),
        Workload("beam4_small", "beam", SMALL, batch=16, src_len=32, tgt_len=64, beam_size=4),
    ]
}


def learning_rate(step: int, d_model: int, warmup: int = WARMUP_STEPS) -> float:
    """Eq. 3: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), steps counted from 1."""
    step = max(step, 1)
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def training_batch(w: Workload, seed: int = 0) -> dict[str, np.ndarray]:
    """`[batch, src_len]` source, `[batch, tgt_len]` decoder input (BOS-shifted) and targets."""
    rng = np.random.default_rng(seed)
    v = w.shape.vocab_size
    src = rng.integers(FIRST_ORDINARY_ID, v, (w.batch, w.src_len), dtype=np.int32)
    tgt = rng.integers(FIRST_ORDINARY_ID, v, (w.batch, w.tgt_len), dtype=np.int32)
    tgt_in = np.concatenate([np.full((w.batch, 1), BOS_ID, np.int32), tgt[:, :-1]], axis=1)
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt}


def decoding_source(w: Workload, seed: int = 1) -> np.ndarray:
    """`[batch, src_len]` source ids with no padding and no special tokens."""
    rng = np.random.default_rng(seed)
    return rng.integers(FIRST_ORDINARY_ID, w.shape.vocab_size, (w.batch, w.src_len), np.int32)


def sinusoidal_table(length: int, d_model: int) -> np.ndarray:
    """Section 3.5, sines in even columns and cosines in odd ones: `[length, d_model]` float32."""
    angles = np.arange(length)[:, None] / np.power(10_000.0, np.arange(0, d_model, 2) / d_model)
    table = np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(length, d_model)
    return table.astype(np.float32)


def forward_flops(shape: Shape, batch: int, src_len: int, tgt_len: int) -> float:
    """`flops.forward_flops` for a workload shape (heads x head_dim = d_model here)."""
    return flops.forward_flops(
        num_layers=shape.num_layers,
        d_model=shape.d_model,
        d_ff=shape.d_ff,
        qk_width=shape.d_model,
        v_width=shape.d_model,
        vocab_size=shape.vocab_size,
        batch=batch,
        src_len=src_len,
        tgt_len=tgt_len,
    )


def agreement(reference: np.ndarray, other: np.ndarray) -> dict[str, float]:
    """Fraction of identical rows and of identical tokens between two `[batch, steps]` outputs."""
    reference, other = np.asarray(reference), np.asarray(other)
    if reference.shape != other.shape:
        return {"rows_identical": 0.0, "tokens_identical": 0.0, "shape_mismatch": True}
    return {
        "rows_identical": float(np.mean(np.all(reference == other, axis=1))),
        "tokens_identical": float(np.mean(reference == other)),
    }
