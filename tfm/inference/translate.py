"""Translate and score: text -> ids -> length-bucketed batches -> search -> text, and BLEU both
ways. The one path that train.py's final evaluation, decode.py and `tfm.inference.attention_maps`
call.

Decoding settings have one home, `TranslateConfig`, whose defaults are the paper's (section 6.1:
beam 4, alpha 0.6, output up to the source length + 50).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import jax
import numpy as np

from tfm import metrics
from tfm.config import ModelConfig
from tfm.cpu_host import side_by_side
from tfm.inference import decoding, slots
from tfm.model import Transformer
from tfm.tokens import EOS_ID, PAD_ID


@dataclasses.dataclass(frozen=True)
class TranslateConfig:
    """Decoding settings.

    beam_size: 1 = greedy search, otherwise beam search with `alpha` (section 6.1).
    alpha: exponent of the GNMT length penalty.
    extra_length: each sentence generates at most its source length + this many tokens.
    batch_tokens: padded source tokens x beams per decoding batch; None: `default_batch_tokens()`
      for the backend decoding runs on.
    max_source_len: longest source in tokens, EOS included; longer lines are `overlong`.
    overlong: "truncate" (with a warning) or "error".
    length_buckets: padded source lengths; each is one compiled program.
    streams: searches run side by side (`tfm.cpu_host.side_by_side`): beam search's streams per
    length
      bucket, each through its own batch of slots with a share of the bucket's sentences;
      greedy search's consecutive batches of one bucket. None: `side_by_side.default_parts()`
      for the backend decoding runs on (2 on a CPU of 2 cores or more, 1 on an accelerator).
      Results do not depend on it.
    """

    beam_size: int = decoding.PAPER_BEAM_SIZE
    alpha: float = decoding.PAPER_ALPHA
    extra_length: int = decoding.PAPER_EXTRA_LENGTH
    batch_tokens: int | None = None
    max_source_len: int = 256
    overlong: str = "truncate"
    length_buckets: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    streams: int | None = None

    def __post_init__(self) -> None:
        if self.overlong not in ("truncate", "error"):
            raise ValueError(f"overlong must be 'truncate' or 'error', got {self.overlong!r}")
        for name in ("beam_size", "batch_tokens", "max_source_len", "streams"):
            value = getattr(self, name)
            if name in ("batch_tokens", "streams") and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.extra_length, bool) or not isinstance(self.extra_length, int):
            raise ValueError(f"extra_length must be an integer, got {self.extra_length!r}")
        if self.extra_length < 0:
            raise ValueError(f"extra_length must be >= 0, got {self.extra_length}")

    def batch_tokens_on_this_backend(self) -> int:
        """`batch_tokens`, or where it is None the default for JAX's backend."""
        return self.batch_tokens or default_batch_tokens()

    def streams_on_this_backend(self) -> int:
        """`streams`, or where it is None the default for JAX's backend."""
        return self.streams or side_by_side.default_parts()


def default_batch_tokens(backend: str | None = None) -> int:
    """Padded source tokens x beams per decoding batch (beam search: per batch of slots,
    `tfm.inference.slots`) on `backend` (default: JAX's): 1024 on CPU, 4096 on an accelerator. On 2
    CPU cores the main job's test split (beam 4, streamed through slots) decoded in 6.2-6.5 s at
    1024, 7.4-7.5 s at 512 and at 2048 (measured alone, 2026-12-01). Accelerators want wide
    batches; 4096 is not tuned."""
    backend = backend or jax.default_backend()
    return 1024 if backend == "cpu" else 4096


def max_source_len_for(model: ModelConfig) -> int:
    """The longest source (EOS included) translation accepts: the model's `max_positions`.
    Outputs are capped there too (`decoding.longest_output`), so a learned table (row E) is
    never read past the positions it was trained on, whatever `extra_length` asks."""
    return model.max_positions


class OverlongInputError(ValueError):
    """An input line longer than the model's maximum source length."""


def encode_sources(tokenizer, texts: Sequence[str], config: TranslateConfig) -> list[list[int]]:
    """Ids of each text without EOS ([] for a blank line), over-long ones truncated or refused."""
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
                stacklevel=3,
            )
            ids = ids[: config.max_source_len - 1]
        encoded.append(ids)
    return encoded


def run_search(
    model: Transformer,
    params,
    src: np.ndarray,
    config: TranslateConfig,
    max_steps: int | None = None,
):
    """Greedy (beam_size 1) or beam search over `[batch, src_len]` source ids, in `max_steps`
    decoder positions (None: every allowed output's)."""
    if config.beam_size == 1:
        return decoding.greedy_search(
            model, params, src, extra_length=config.extra_length, max_steps=max_steps
        )
    return decoding.beam_search(
        model,
        params,
        src,
        beam_size=config.beam_size,
        alpha=config.alpha,
        extra_length=config.extra_length,
        max_steps=max_steps,
    )


def first_try_steps(src_len: int) -> int:
    """Decoder positions of a batch's first try: twice the padded source length + 16. Outputs
    may run to the source length + 50 (section 6.1), but few come near it, and the cache, the
    self-attention and beam search's cache reorder all cost in proportion to the positions
    allocated; a batch with a row not finished within them is run again with all of them."""
    return 2 * src_len + 16


def search_batch(model: Transformer, params, src: np.ndarray, config: TranslateConfig):
    """`run_search` in `first_try_steps` positions, again in all of them if a row needed more:
    the same search either way (the positions never written are masked out)."""
    result = run_search(model, params, src, config, first_try_steps(src.shape[1]))
    if np.all(np.asarray(result.complete)):
        return result
    return run_search(model, params, src, config)


def _buckets(config: TranslateConfig) -> list[int]:
    buckets = sorted(b for b in config.length_buckets if b <= config.max_source_len)
    if not buckets or buckets[-1] < config.max_source_len:
        buckets.append(config.max_source_len)
    return buckets


class _Batch(NamedTuple):
    length: int  # padded source length (a bucket)
    rows: int  # sentences in the padded batch (beam search: slots, `tfm.inference.slots`)
    sentences: list[int]  # indices of the sources it holds: at most `rows`, or for beam search
    # every source of its bucket, streamed through the `rows` slots


def _plan(encoded: Sequence[Sequence[int]], config: TranslateConfig) -> list[_Batch]:
    """The batches that translate `encoded`: non-empty sources sorted by length, grouped into
    each length bucket's batches of `batch_tokens` padded source tokens x beams. Beam search
    streams a whole bucket through one batch of slots."""
    buckets = _buckets(config)
    batch_tokens = config.batch_tokens_on_this_backend()
    order = sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: len(encoded[i]))
    plan, start = [], 0
    while start < len(order):
        length = next(b for b in buckets if b >= len(encoded[order[start]]) + 1)
        rows = max(1, batch_tokens // length // config.beam_size)
        fits = [i for i in order[start:] if len(encoded[i]) + 1 <= length]
        chunk = fits if config.beam_size > 1 else fits[:rows]
        plan.append(_Batch(length, rows, chunk))
        start += len(chunk)
    return plan


def _padded(sources: Sequence[Sequence[int]], rows: int, length: int) -> np.ndarray:
    """`[rows, length]` ids: each source then EOS, then padding (rows beyond them all padding)."""
    batch = np.zeros((rows, length), np.int32)
    for r, ids in enumerate(sources):
        batch[r, : len(ids)] = ids
        batch[r, len(ids)] = EOS_ID
    return batch


def _stream_settings(
    config: TranslateConfig, rows: int, length: int, longest: int
) -> slots.StreamSettings:
    """Beam search's `tfm.inference.slots` settings for a bucket: as many positions as
    `search_batch` first tries (at most the model's `longest` output), blocks of 4 batches'
    sentences."""
    first_try = decoding.positions_allocated(
        length, config.extra_length, chunk=8, max_steps=first_try_steps(length)
    )
    return slots.StreamSettings(
        rows=rows,
        src_len=length,
        max_steps=min(first_try, longest),
        block=4 * rows,
        beam_size=config.beam_size,
        alpha=config.alpha,
        extra_length=config.extra_length,
    )


def _beam_search_bucket(
    model: Transformer,
    params,
    encoded: Sequence[Sequence[int]],
    part: _Batch,
    config: TranslateConfig,
    progress: Callable[[int], None] | None,
) -> dict[int, np.ndarray]:
    """Best hypothesis of each source in `part`, streamed through slots in `first_try_steps`
    positions, `config.streams` streams side by side (each its own `part.rows` slots); the few
    that need more are searched again in batches with all of them. `progress` hears of sources
    as they leave the slots."""
    sources = [np.asarray([*encoded[i], EOS_ID], np.int32) for i in part.sentences]
    settings = _stream_settings(config, part.rows, part.length, decoding.longest_output(model))
    streams = config.streams_on_this_backend()
    # sources are sorted by length: every stream takes every `streams`-th, a share of each length
    shares = [range(k, len(sources), streams) for k in range(min(streams, len(sources)))]
    heard = _thread_safe(progress)
    searched = side_by_side.run_side_by_side(
        [
            lambda share=share: slots.search_stream(
                model, params, [sources[k] for k in share], settings, heard
            )
            for share in shares
        ]
    )
    outputs, needs_more = {}, []
    for share, (found, more) in zip(shares, searched, strict=True):
        outputs.update({part.sentences[share[k]]: ids for k, ids in found.items()})
        needs_more += [share[k] for k in more]
    for start in range(0, len(needs_more), part.rows):
        again = [part.sentences[k] for k in needs_more[start : start + part.rows]]
        outputs.update(
            _search_padded(
                run_search, model, params, encoded, _Batch(part.length, part.rows, again), config
            )
        )
    return outputs


def _search_padded(
    search: Callable,
    model: Transformer,
    params,
    encoded: Sequence[Sequence[int]],
    part: _Batch,
    config: TranslateConfig,
) -> dict[int, np.ndarray]:
    """Output ids of each source in `part`, searched as one padded `[part.rows, part.length]`
    batch by `search` (`run_search` or `search_batch`)."""
    src = _padded([encoded[i] for i in part.sentences], part.rows, part.length)
    ids = np.asarray(search(model, params, src, config).ids)
    return {i: ids[r] for r, i in enumerate(part.sentences)}


def _thread_safe(progress: Callable[[int], None] | None) -> Callable[[int], None] | None:
    """`progress`, called by one stream at a time."""
    if progress is None:
        return None
    lock = threading.Lock()

    def heard(count: int) -> None:
        with lock:
            progress(count)

    return heard


class _CompileAhead:
    """Compiles the search program of every batch shape in a plan, in order of first use, on one
    background thread, so the next bucket's program compiles while the current bucket decodes
    (in a first run, compiling was ~40% of the time). Each program is compiled by running the
    jitted search once on an all-padding batch, which is finished before its first step: jit's
    own cache (or with a compilation cache, `tfm.cpu_host.saved_programs`' memory) then holds it,
    for this call and every later one."""

    def __init__(self, model: Transformer, params, config: TranslateConfig, plan: list[_Batch]):
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tfm-compile")
        shapes = dict.fromkeys((batch.rows, batch.length) for batch in plan)  # in order of use
        self._ready = {
            shape: self._pool.submit(self._compile, model, params, config, shape)
            for shape in shapes
        }

    @staticmethod
    def _compile(model: Transformer, params, config: TranslateConfig, shape) -> None:
        padding = np.full(shape, PAD_ID, np.int32)
        if config.beam_size == 1:
            result = run_search(model, params, padding, config, first_try_steps(shape[1]))
            jax.block_until_ready(result)
            return
        longest = decoding.longest_output(model)
        slots.compile_ahead(model, params, _stream_settings(config, *shape, longest))

    def wait_for(self, shape) -> None:
        self._ready[shape].result()  # re-raises what compiling raised

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


def translate_ids(
    model: Transformer,
    params,
    encoded: Sequence[Sequence[int]],
    config: TranslateConfig,
    progress: Callable[[int], None] | None = None,
) -> list[np.ndarray | None]:
    """Output ids of each source (None for an empty one), in input order. Sources are grouped by
    length into a few padded shapes so the decoder compiles a few programs."""
    outputs: list[np.ndarray | None] = [None] * len(encoded)
    plan = _plan(encoded, config)
    # beam search runs a bucket's streams inside `_beam_search_bucket`
    streams = config.streams_on_this_backend() if config.beam_size == 1 else 1
    ahead = _CompileAhead(model, params, config, plan)
    try:
        for group in _side_by_side_groups(plan, streams):
            ahead.wait_for((group[0].rows, group[0].length))
            if config.beam_size > 1:
                found = _beam_search_bucket(model, params, encoded, group[0], config, progress)
            else:
                found = _greedy_batches(model, params, encoded, group, config)
                if progress is not None:
                    progress(len(found))
            for i, ids in found.items():
                outputs[i] = ids
    finally:
        ahead.close()
    return outputs


def _side_by_side_groups(plan: list[_Batch], streams: int) -> list[list[_Batch]]:
    """The plan's batches in groups that run at once: up to `streams` consecutive batches of one
    shape (the plan is sorted by length, so a shape's batches are consecutive)."""
    groups: list[list[_Batch]] = []
    for _, same_shape in itertools.groupby(plan, key=lambda part: (part.rows, part.length)):
        same_shape = list(same_shape)
        groups += [same_shape[k : k + streams] for k in range(0, len(same_shape), streams)]
    return groups


def _greedy_batches(
    model: Transformer,
    params,
    encoded: Sequence[Sequence[int]],
    parts: Sequence[_Batch],
    config: TranslateConfig,
) -> dict[int, np.ndarray]:
    """Output ids of every source in `parts` (batches of one shape), each batch its own greedy
    `search_batch`, the batches side by side (`tfm.cpu_host.side_by_side`)."""
    found: dict[int, np.ndarray] = {}
    for result in side_by_side.run_side_by_side(
        [lambda p=p: _search_padded(search_batch, model, params, encoded, p, config) for p in parts]
    ):
        found.update(result)
    return found


def translate(
    model: Transformer,
    params,
    tokenizer,
    texts: Sequence[str],
    config: TranslateConfig = TranslateConfig(),
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """Translations of `texts` in order. Empty lines translate to empty lines."""
    encoded = encode_sources(tokenizer, texts, config)
    outputs = translate_ids(model, params, encoded, config, progress)
    return ["" if ids is None else tokenizer.decode(ids) for ids in outputs]


def translate_in_order(
    model: Transformer,
    params,
    tokenizer,
    texts: Sequence[str],
    config: TranslateConfig = TranslateConfig(),
    block_lines: int = 1000,
    progress: Callable[[int], None] | None = None,
) -> Iterator[str]:
    """Translations of `texts`, yielded in input order block by block as they are done, so a
    caller can write them out as it goes. Every line is tokenized (and an over-long one refused)
    before any decoding."""
    encoded = encode_sources(tokenizer, texts, config)
    for start in range(0, len(encoded), block_lines):
        block = encoded[start : start + block_lines]
        for ids in translate_ids(model, params, block, config, progress):
            yield "" if ids is None else tokenizer.decode(ids)


def score(
    hypotheses: Sequence[str],
    references: Sequence[str],
    target_language: str | None,
    sources: Sequence[str] | None = None,
) -> dict:
    """BLEU both ways (section 6.1): sacreBLEU on detokenized text, and the paper's Moses-tokenized
    BLEU with hyphenated compounds split when the target is German; with `sources`, also the
    sacreBLEU of copying the source unchanged (the floor a model must clear)."""
    scores = dict(
        sacrebleu=metrics.sacre_bleu(hypotheses, references),
        tokenized_bleu=metrics.tokenized_bleu(hypotheses, references, target_language or "en"),
    )
    if sources is not None:
        scores["copy_source_sacrebleu"] = metrics.sacre_bleu(sources, references)
    return scores
