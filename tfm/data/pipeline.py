"""Batches for training and evaluation (section 5.1): token ids cached once, over-long pairs
dropped or truncated, pairs of similar length batched together under a token budget per side,
optionally packed several to a row, sharded per JAX process, resumable exactly.

Every epoch has a plan — a list of global batches, each a list of rows of example indices —
that is a pure function of (seed, epoch). A grain `MapDataset` serves one epoch's plan, so the
iterator state is two integers (epoch, position) and a restored iterator yields exactly the next
batch. Each process takes its own contiguous slice of every global batch's rows, so all processes
see batches of one shape at every step.

A batch is a dict of int32 numpy arrays:
  src [rows, L], tgt_in [rows, L] (BOS + target), tgt_out [rows, L] (target + EOS, 0 = ignore);
packed batches add src_segments, tgt_segments, src_positions, tgt_positions.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import pathlib
from collections.abc import Iterator, Sequence
from typing import Literal

import grain
import numpy as np

from tfm.tokens import BOS_ID, EOS_ID

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Batching settings.

    batch_tokens: padded tokens per side per global batch (the paper: ~25000).
    max_len: longest sequence per side, EOS included.
    overlong: "drop" or "truncate" pairs with a side longer than max_len.
    buckets: padded lengths; None = the `num_buckets` lengths that minimise padding for this
      split's length distribution. Each bucket is one batch shape, so jit compiles at most
      that many programs (1 when packing).
    num_buckets: how many shapes to choose when `buckets` is None.
    bucket_multiple: bucket lengths are multiples of this (8 suits TPU tiles).
    pack: put several pairs in one row of length max_len (segment ids keep them apart).
    row_multiple: rows per batch are a multiple of this (processes x local devices).
    """

    batch_tokens: int = 4096
    max_len: int = 128
    overlong: Literal["drop", "truncate"] = "drop"
    buckets: tuple[int, ...] | None = None
    num_buckets: int = 8
    bucket_multiple: int = 1
    pack: bool = False
    row_multiple: int = 1
    seed: int = 0
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.overlong not in ("drop", "truncate"):
            raise ValueError(f"overlong must be 'drop' or 'truncate', got {self.overlong!r}")
        if self.max_len < 2:
            raise ValueError(f"max_len must be >= 2, got {self.max_len}")
        if self.batch_tokens < self.max_len:
            raise ValueError(
                f"batch_tokens ({self.batch_tokens}) must be at least max_len "
                f"({self.max_len}) so that the longest pair fits in a batch"
            )
        if self.row_multiple < 1:
            raise ValueError(f"row_multiple must be >= 1, got {self.row_multiple}")

    def rows_for(self, length: int) -> int:
        rows = (self.batch_tokens // length) // self.row_multiple * self.row_multiple
        if rows == 0:
            raise ValueError(
                f"batch_tokens={self.batch_tokens} holds no row of length {length} when rows must "
                f"be a multiple of {self.row_multiple}; raise batch_tokens"
            )
        return rows


@dataclasses.dataclass
class TokenizedSplit:
    """Ids of one split, flat: pair i's source is src_ids[src_offsets[i]:src_offsets[i+1]]
    (EOS not included)."""

    src_ids: np.ndarray
    src_offsets: np.ndarray
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def source(self, i: int) -> np.ndarray:
        return self.src_ids[self.src_offsets[i] : self.src_offsets[i + 1]]

    def target(self, i: int) -> np.ndarray:
        return self.tgt_ids[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]

    @property
    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)


def _flatten(sequences: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(sequences) + 1, np.int64)
    offsets[1:] = np.cumsum([len(s) for s in sequences])
    flat = np.fromiter((t for s in sequences for t in s), np.int32, count=int(offsets[-1]))
    return flat, offsets


def tokenize_split(
    pairs: Sequence[tuple[str, str]], tokenizer, cache_path: str | pathlib.Path
) -> TokenizedSplit:
    """Ids of `pairs`, computed once and cached at `cache_path` (.npz) for later epochs and runs.

    A cache that does not hold exactly len(pairs) pairs is rebuilt.
    """
    cache_path = pathlib.Path(cache_path)
    if cache_path.is_file():
        try:
            with np.load(cache_path) as data:
                split = TokenizedSplit(
                    *(data[k] for k in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets"))
                )
            if len(split) == len(pairs):
                return split
        except (OSError, ValueError, KeyError):
            pass  # unreadable cache: rebuild it below
    src_flat, src_offsets = _flatten(tokenizer.encode_batch([s for s, _ in pairs]))
    tgt_flat, tgt_offsets = _flatten(tokenizer.encode_batch([t for _, t in pairs]))
    split = TokenizedSplit(src_flat, src_offsets, tgt_flat, tgt_offsets)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    # One temporary name per process: processes of a multi-host job build the same cache at
    # once, and a shared name let one rename away the file another was still writing.
    partial = cache_path.with_name(f"{cache_path.name}.{os.getpid()}.partial.npz")
    np.savez(partial, **dataclasses.asdict(split))
    partial.replace(cache_path)
    return split


@dataclasses.dataclass
class Examples:
    """The pairs kept for batching: their indices into a TokenizedSplit and their lengths on each
    side with EOS (after truncation), plus the count of pairs filtered by reason."""

    indices: np.ndarray
    src_lengths: np.ndarray
    tgt_lengths: np.ndarray
    filtered: collections.Counter


def select_examples(split: TokenizedSplit, config: PipelineConfig) -> Examples:
    """Apply the length rule: +1 for EOS on each side; over max_len -> drop or truncate."""
    src_lengths = split.src_lengths + 1
    tgt_lengths = split.tgt_lengths + 1
    filtered: collections.Counter = collections.Counter()
    empty = (split.src_lengths == 0) | (split.tgt_lengths == 0)
    filtered["empty_after_tokenization"] = int(empty.sum())
    overlong = ((src_lengths > config.max_len) | (tgt_lengths > config.max_len)) & ~empty
    if config.overlong == "drop":
        filtered["overlong_dropped"] = int(overlong.sum())
        keep = ~empty & ~overlong
    else:
        filtered["overlong_truncated"] = int(overlong.sum())
        keep = ~empty
    indices = np.nonzero(keep)[0]
    return Examples(
        indices,
        np.minimum(src_lengths[indices], config.max_len),
        np.minimum(tgt_lengths[indices], config.max_len),
        +filtered,
    )


def optimal_buckets(
    lengths: np.ndarray, max_len: int, count: int, multiple: int = 1
) -> tuple[int, ...]:
    """At most `count` padded lengths (multiples of `multiple`, the last = max_len) that
    minimise the total padding of `lengths` when each is padded to the next bucket: dynamic
    programming over the length histogram."""
    candidates = sorted(
        {min(max_len, -(-int(n) // multiple) * multiple) for n in np.unique(lengths)} | {max_len}
    )
    histogram = np.bincount(lengths, minlength=max_len + 1).astype(np.float64)
    counts = np.cumsum(histogram)
    totals = np.cumsum(histogram * np.arange(max_len + 1))

    def padding(lo: int, hi: int) -> float:
        """Padding of lengths in (lo, hi] padded to hi."""
        n = counts[hi] - counts[lo]
        return n * hi - (totals[hi] - totals[lo])

    m = len(candidates)
    # best[k][j]: least padding covering lengths <= candidates[j] with k buckets, last at j
    best = np.full((count + 1, m), np.inf)
    parent = np.zeros((count + 1, m), np.int64)
    for j, hi in enumerate(candidates):
        best[1, j] = padding(0, hi)
    for k in range(2, count + 1):
        for j in range(m):
            for i in range(j):
                cost = best[k - 1, i] + padding(candidates[i], candidates[j])
                if cost < best[k, j]:
                    best[k, j], parent[k, j] = cost, i
    k = int(np.argmin(best[1:, m - 1])) + 1
    chosen, j = [], m - 1
    while k >= 1:
        chosen.append(candidates[j])
        j = parent[k, j]
        k -= 1
    return tuple(sorted(set(chosen)))


def bucket_lengths(examples: Examples, config: PipelineConfig) -> tuple[int, ...]:
    """The padded lengths batches use (one when packing)."""
    if config.pack:
        return (config.max_len,)
    if config.buckets:
        return tuple(sorted({min(b, config.max_len) for b in config.buckets} | {config.max_len}))
    lengths = np.maximum(examples.src_lengths, examples.tgt_lengths)
    return optimal_buckets(lengths, config.max_len, config.num_buckets, config.bucket_multiple)


def plan_epoch(
    examples: Examples, config: PipelineConfig, epoch: int, buckets: tuple[int, ...] | None = None
) -> list[list[list[int]]]:
    """Global batches of one epoch: batch -> rows -> positions into `examples` (empty row = all
    padding). A pure function of (config.seed, epoch)."""
    buckets = buckets or bucket_lengths(examples, config)
    rng = np.random.default_rng([config.seed, epoch])
    order = (
        rng.permutation(len(examples.indices))
        if config.shuffle
        else np.arange(len(examples.indices))
    )
    if config.pack:
        batches = _plan_packed(order, examples, config)
    else:
        batches = _plan_bucketed(order, examples, config, buckets)
    if config.shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def _plan_bucketed(order, examples: Examples, config: PipelineConfig, buckets):
    lengths = np.maximum(examples.src_lengths, examples.tgt_lengths)
    buckets = np.asarray(buckets)
    bucket_of = np.searchsorted(buckets, lengths)
    batches = []
    for b, length in enumerate(buckets):
        members = order[bucket_of[order] == b]
        rows = config.rows_for(int(length))
        for start in range(0, len(members), rows):
            chunk = members[start : start + rows].tolist()
            batches.append([[i] for i in chunk] + [[] for _ in range(rows - len(chunk))])
    return batches


def _plan_packed(order, examples: Examples, config: PipelineConfig):
    """First-fit packing into rows of max_len tokens per side, in shuffled order."""
    rows_per_batch = config.rows_for(config.max_len)
    rows: list[list[int]] = []
    used: list[tuple[int, int]] = []
    open_rows: list[int] = []  # rows with space left, most recent last (bounded search)
    for i in order.tolist():
        s, t = int(examples.src_lengths[i]), int(examples.tgt_lengths[i])
        for r in open_rows:
            if used[r][0] + s <= config.max_len and used[r][1] + t <= config.max_len:
                rows[r].append(i)
                used[r] = (used[r][0] + s, used[r][1] + t)
                break
        else:
            rows.append([i])
            used.append((s, t))
            open_rows.append(len(rows) - 1)
            if len(open_rows) > 64:
                open_rows.pop(0)
    batches = [rows[k : k + rows_per_batch] for k in range(0, len(rows), rows_per_batch)]
    if batches:
        batches[-1] = batches[-1] + [[] for _ in range(rows_per_batch - len(batches[-1]))]
    return batches


def _segment_ranges(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For segments of `lengths`: each token's segment number and its offset inside it."""
    total = int(lengths.sum())
    starts = np.cumsum(lengths) - lengths
    segment = np.repeat(np.arange(len(lengths)), lengths)
    return segment, np.arange(total) - starts[segment]


def assemble_batch(
    split: TokenizedSplit,
    examples: Examples,
    rows: Sequence[Sequence[int]],
    length: int,
    packed: bool,
) -> Batch:
    """Padded int32 arrays for `rows` (each a list of positions into `examples`), built with
    vectorised gathers from the flat id cache."""
    n = len(rows)
    members = np.fromiter((m for row in rows for m in row), np.int64)
    row_of = np.repeat(np.arange(n), [len(row) for row in rows])
    batch = dict(
        src=np.zeros((n, length), np.int32),
        tgt_in=np.zeros((n, length), np.int32),
        tgt_out=np.zeros((n, length), np.int32),
    )
    if packed:
        for key in ("src_segments", "tgt_segments", "src_positions", "tgt_positions"):
            batch[key] = np.zeros((n, length), np.int32)
    if len(members) == 0:
        return batch
    index = examples.indices[members]
    # segment number inside its row (1, 2, ...) and where each segment starts in the row
    first_of_row = np.r_[True, row_of[1:] != row_of[:-1]]
    row_starts = np.flatnonzero(first_of_row)
    segment_number = (
        np.arange(len(members))
        - np.repeat(row_starts, np.diff(np.r_[row_starts, len(members)]))
        + 1
    )
    for side, lengths, offsets, ids in (
        ("src", examples.src_lengths[members], split.src_offsets, split.src_ids),
        ("tgt", examples.tgt_lengths[members], split.tgt_offsets, split.tgt_ids),
    ):
        lengths = lengths.astype(np.int64)
        ends = np.cumsum(lengths)
        row_begin = np.repeat(
            ends[row_starts] - lengths[row_starts], np.diff(np.r_[row_starts, len(members)])
        )
        start_in_row = ends - lengths - row_begin
        seg, within = _segment_ranges(lengths)
        columns = start_in_row[seg] + within
        rows_of_tokens = row_of[seg]
        is_last = within == lengths[seg] - 1  # the EOS slot
        token_index = offsets[index[seg]] + within
        tokens = np.where(is_last, EOS_ID, ids[np.minimum(token_index, len(ids) - 1)])
        if side == "src":
            batch["src"][rows_of_tokens, columns] = tokens
        else:
            batch["tgt_out"][rows_of_tokens, columns] = tokens
            # decoder input: BOS then the target, i.e. tgt_out shifted right inside the segment
            shifted = np.where(within == 0, BOS_ID, np.roll(tokens, 1))
            batch["tgt_in"][rows_of_tokens, columns] = shifted
        if packed:
            batch[f"{side}_segments"][rows_of_tokens, columns] = segment_number[seg]
            batch[f"{side}_positions"][rows_of_tokens, columns] = within
    return batch


class _EpochBatches(grain.MapDataset):
    """One epoch's plan as a grain random-access dataset of this process's batch slices."""

    def __init__(self, pipeline: BatchPipeline, epoch: int):
        super().__init__()
        self._pipeline = pipeline
        self._plan = pipeline.plan(epoch)

    def __len__(self) -> int:
        return len(self._plan)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return self._pipeline.local_batch(self._plan[index])

    def __str__(self) -> str:
        return "EpochBatches"


class BatchPipeline:
    """Global batch plans over one tokenized split, and this process's share of each batch."""

    def __init__(
        self,
        split: TokenizedSplit,
        config: PipelineConfig,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if config.row_multiple % process_count:
            raise ValueError(
                f"row_multiple={config.row_multiple} must be a multiple of the "
                f"process count {process_count}"
            )
        self.split = split
        self.config = config
        self.process_index = process_index
        self.process_count = process_count
        self.examples = select_examples(split, config)
        if len(self.examples.indices) == 0:
            raise ValueError("no pair survives the length filter; raise max_len")
        self.buckets = bucket_lengths(self.examples, config)
        self._plans: dict[int, list] = {}

    def plan(self, epoch: int) -> list[list[list[int]]]:
        if epoch not in self._plans:
            self._plans = {epoch: plan_epoch(self.examples, self.config, epoch, self.buckets)}
        return self._plans[epoch]

    def row_length(self, rows: Sequence[Sequence[int]]) -> int:
        """The bucket length of a batch (its longest member's bucket)."""
        if self.config.pack:
            return self.config.max_len
        longest = max(
            (
                max(self.examples.src_lengths[m[0]], self.examples.tgt_lengths[m[0]])
                for m in rows
                if m
            ),
            default=1,
        )
        return self.buckets[int(np.searchsorted(self.buckets, longest))]

    def local_batch(self, rows: Sequence[Sequence[int]]) -> Batch:
        """This process's contiguous slice of a global batch's rows, assembled."""
        per_process = len(rows) // self.process_count
        mine = rows[self.process_index * per_process : (self.process_index + 1) * per_process]
        return assemble_batch(
            self.split, self.examples, mine, self.row_length(rows), self.config.pack
        )

    def epoch_dataset(self, epoch: int) -> grain.MapDataset:
        return _EpochBatches(self, epoch)

    def iterator(self, state: dict | None = None) -> BatchIterator:
        return BatchIterator(self, state)


class BatchIterator(Iterator[Batch]):
    """Endless batches, epoch after epoch; `get_state()` / `set_state()` resume exactly."""

    def __init__(self, pipeline: BatchPipeline, state: dict | None = None):
        self._pipeline = pipeline
        self._epoch = 0
        self._iterator = None
        if state is not None:
            self.set_state(state)
        else:
            self._start_epoch(0, None)

    def _start_epoch(self, epoch: int, grain_state: dict | None) -> None:
        self._epoch = epoch
        self._iterator = iter(self._pipeline.epoch_dataset(epoch).to_iter_dataset())
        if grain_state is not None:
            self._iterator.set_state(grain_state)

    @property
    def epoch(self) -> int:
        return self._epoch

    def __next__(self) -> Batch:
        try:
            return next(self._iterator)
        except StopIteration:
            self._start_epoch(self._epoch + 1, None)
            return next(self._iterator)

    def get_state(self) -> dict:
        return {"epoch": self._epoch, "grain": self._iterator.get_state()}

    def set_state(self, state: dict) -> None:
        try:
            epoch, grain_state = int(state["epoch"]), state["grain"]
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a data-iterator state: {state!r} ({error})") from None
        self._start_epoch(epoch, grain_state)
