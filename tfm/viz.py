"""Pictures: training curves and attention heatmaps (the figures the paper's readers look at)."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure  # not pyplot: no global backend or figure state

from tfm.job import metrics_file


def plot_training_curves(metrics_path: str | pathlib.Path, output: str | pathlib.Path) -> None:
    """Training loss (label-smoothed and NLL), validation NLL and (when logged) validation
    sacreBLEU against step, as a PNG."""
    records = metrics_file.read(metrics_path)
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig = Figure(figsize=(7, 4.2), dpi=120)
    ax = fig.add_subplot()
    if train:
        steps = [r["step"] for r in train]
        ax.plot(steps, [r["loss"] for r in train], label="train loss (label-smoothed)", lw=1.2)
        ax.plot(steps, [r["nll"] for r in train], label="train NLL", lw=1.0, alpha=0.8)
    if evals:
        ax.plot(
            [r["step"] for r in evals],
            [r["nll"] for r in evals],
            "o-",
            label="validation NLL",
            lw=1.4,
        )
    ax.set_xlabel("step")
    ax.set_ylabel("nats per target token")
    ax.set_title("tfm training")
    ax.grid(alpha=0.3)
    scored = [r for r in evals if "sacrebleu" in r]
    if scored:
        bleu_axis = ax.twinx()
        bleu_axis.plot(
            [r["step"] for r in scored],
            [r["sacrebleu"] for r in scored],
            "s--",
            color="C3",
            label="validation sacreBLEU (right axis)",
        )
        bleu_axis.set_ylabel("validation sacreBLEU")
        bleu_axis.legend(loc="center right")
    ax.legend()
    fig.tight_layout()
    fig.savefig(output)


def plot_attention_grid(
    weights: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    title: str,
    axes_row,
) -> None:
    """One row of heatmaps: weights `[heads, q_len, kv_len]` of one layer, one panel per head."""
    for head, ax in enumerate(axes_row):
        ax.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(key_tokens)))
        ax.set_xticklabels(key_tokens, rotation=90, fontsize=6)
        ax.set_yticks(range(len(query_tokens)))
        ax.set_yticklabels(query_tokens, fontsize=6)
        ax.set_title(f"{title} head {head}", fontsize=7)


def plot_attention(
    maps: dict[str, list[np.ndarray]],
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    output: str | pathlib.Path,
) -> None:
    """Encoder self-, decoder self- and cross-attention as one figure: for each kind a block of
    rows (one per layer) by columns (one per head). `maps[kind][layer]` is `[heads, q, k]`."""
    kinds = [
        ("encoder self-attention", src_tokens, src_tokens),
        ("decoder self-attention", tgt_tokens, tgt_tokens),
        ("cross-attention", tgt_tokens, src_tokens),
    ]
    layers = sum(len(maps[kind]) for kind, _, _ in kinds)
    heads = max(m.shape[0] for kind, _, _ in kinds for m in maps[kind])
    cell = 0.28 * max(len(src_tokens), len(tgt_tokens), 6)
    fig = Figure(figsize=(cell * heads + 1, cell * layers + 1), dpi=110)
    axes = fig.subplots(layers, heads, squeeze=False)
    row = 0
    for kind, queries, keys in kinds:
        for layer, weights in enumerate(maps[kind]):
            plot_attention_grid(weights, queries, keys, f"{kind}, layer {layer}", axes[row])
            row += 1
    fig.tight_layout()
    fig.savefig(output)
