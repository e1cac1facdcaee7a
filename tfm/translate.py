"""Translate text with a trained model: tokenize, batch by length, beam search or greedy,
detokenize, and return translations in input order."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from tfm import decoding
from tfm.model import Transformer
from tfm.tokens import EOS_ID


@dataclasses.dataclass(frozen=True)
class TranslateConfig:
    """Decoding settings (section 6.1 defaults: beam 4, alpha 0.6, source length + 50)."""

    beam_size: int = 4
    alpha: float = 0.6
    extra_length: int = 50
    batch_tokens: int = 4096
    max_source_len: int = 256
    overlong: str = "truncate"  # or "error"
    length_buckets: tuple[int, ...] = (8, 16, 32, 64, 128, 256)

    def __post_init__(self) -> None:
        if self.overlong not in ("truncate", "error"):
            raise ValueError(f"overlong must be 'truncate' or 'error', got {self.overlong!r}")
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")


class OverlongInputError(ValueError):
    """An input line longer than the model's maximum source length."""


def translate(
    model: Transformer,
    params,
    tokenizer,
    texts: Sequence[str],
    config: TranslateConfig = TranslateConfig(),
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """Translations of `texts` in order. Empty lines translate to empty lines. Sentences are
    grouped by token length into a few padded shapes so the decoder compiles a few programs."""
    encoded = []
    for number, text in enumerate(texts, start=1):
        ids = tokenizer.encode(text) if text.strip() else []
        if len(ids) + 1 > config.max_source_len:
            if config.overlong == "error":
                raise OverlongInputError(
                    f"input line {number} has {len(ids) + 1} tokens, more than max_source_len="
                    f"{config.max_source_len}; shorten it or translate with overlong='truncate'"
                )
            warnings.warn(
                f"input line {number}: {len(ids) + 1} tokens truncated to {config.max_source_len}",
                stacklevel=2,
            )
            ids = ids[: config.max_source_len - 1]
        encoded.append(ids)
    outputs = [""] * len(texts)
    buckets = sorted(b for b in config.length_buckets if b <= config.max_source_len)
    if not buckets or buckets[-1] < config.max_source_len:
        buckets.append(config.max_source_len)
    order = sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: len(encoded[i]))
    start = 0
    while start < len(order):
        length = next(b for b in buckets if b >= len(encoded[order[start]]) + 1)
        rows = max(1, config.batch_tokens // length // max(config.beam_size, 1))
        chunk = [i for i in order[start : start + rows] if len(encoded[i]) + 1 <= length]
        batch = np.zeros((rows, length), np.int32)
        for r, i in enumerate(chunk):
            batch[r, : len(encoded[i])] = encoded[i]
            batch[r, len(encoded[i])] = EOS_ID
        if config.beam_size == 1:
            result = decoding.greedy_search(model, params, batch, extra_length=config.extra_length)
        else:
            result = decoding.beam_search(
                model,
                params,
                batch,
                beam_size=config.beam_size,
                alpha=config.alpha,
                extra_length=config.extra_length,
            )
        ids = np.asarray(result.ids)
        for r, i in enumerate(chunk):
            outputs[i] = tokenizer.decode(ids[r])
        start += len(chunk)
        if progress is not None:
            progress(len(chunk))
    return outputs
