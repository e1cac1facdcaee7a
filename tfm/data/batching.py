"""Batches for training and evaluation (section 5.1), as pure functions of the id cache: the
length rule (over-long pairs dropped or truncated), padded lengths chosen to minimise padding,
each epoch's plan of global batches, and the assembly of one batch's padded arrays.

A plan (`EpochPlan`) is the epoch's global batches, each rows of example positions, held in flat
arrays; it is a pure function of (seed, epoch), so serving it (`tfm.data.pipeline`) resumes
exactly.

A batch is a dict of int32 numpy arrays:
  src [rows, L], tgt_in [rows, L] (BOS + target), tgt_out [rows, L] (target + EOS, 0 = ignore);
packed batches add src_segments, tgt_segments, src_positions, tgt_positions.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Literal

import numpy as np

from tfm.data.id_cache import TokenizedSplit
from tfm.tokens import BOS_ID, EOS_ID

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """Batching settings.

    batch_tokens: padded tokens per side per global batch (the paper: ~25000).
    max_seq_len: longest sequence per side, EOS included (the row length when packing).
    overlong: "drop" or "truncate" pairs with a side longer than max_seq_len.
    buckets: padded lengths; None = the `num_buckets` lengths that minimise padding for this
      split's length distribution. Each bucket is one batch shape, so jit compiles at most
      that many programs (1 when packing).
    num_buckets: how many shapes to choose when `buckets` is None.
    bucket_multiple: bucket lengths are multiples of this (8 suits TPU tiles).
    pack: put several pairs in one row of length max_seq_len (segment ids keep them apart).
    row_multiple: rows per batch are a multiple of this (processes x local devices).
    """

    batch_tokens: int = 4096
    max_seq_len: int = 128
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
        if self.max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2, got {self.max_seq_len}")
        if self.batch_tokens < self.max_seq_len:
            raise ValueError(
                f"batch_tokens ({self.batch_tokens}) must be at least max_seq_len "
                f"({self.max_seq_len}) so that the longest pair fits in a batch"
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
class Examples:
    """The pairs kept for batching: their indices into a TokenizedSplit and their lengths on each
    side with EOS (after truncation; a truncated target's last slot holds its next token, not
    EOS), plus the count of pairs filtered by reason."""

    indices: np.ndarray
    src_lengths: np.ndarray
    tgt_lengths: np.ndarray
    filtered: collections.Counter


def position_dtype(count: int) -> np.dtype:
    """int32 for positions below 2**31 (half the memory of int64 per pair), else int64."""
    return np.dtype(np.int32 if count < 1 << 31 else np.int64)


def select_examples(split: TokenizedSplit, config: BatchConfig) -> Examples:
    """Apply the length rule: +1 for EOS on each side; over max_seq_len -> drop or truncate."""
    src_lengths = split.src_lengths + 1
    tgt_lengths = split.tgt_lengths + 1
    filtered: collections.Counter = collections.Counter()
    empty = (split.src_lengths == 0) | (split.tgt_lengths == 0)
    filtered["empty_after_tokenization"] = int(empty.sum())
    overlong = ((src_lengths > config.max_seq_len) | (tgt_lengths > config.max_seq_len)) & ~empty
    if config.overlong == "drop":
        filtered["overlong_dropped"] = int(overlong.sum())
        keep = ~empty & ~overlong
    else:
        filtered["overlong_truncated"] = int(overlong.sum())
        keep = ~empty
    indices = np.nonzero(keep)[0].astype(position_dtype(len(split)))
    return Examples(
        indices,
        np.minimum(src_lengths[indices], config.max_seq_len).astype(np.int32),
        np.minimum(tgt_lengths[indices], config.max_seq_len).astype(np.int32),
        +filtered,
    )


def optimal_buckets(
    lengths: np.ndarray, longest: int, count: int, multiple: int = 1
) -> tuple[int, ...]:
    """At most `count` padded lengths (multiples of `multiple`, the last = longest) that
    minimise the total padding of `lengths` when each is padded to the next bucket: dynamic
    programming over the length histogram."""
    candidates = sorted(
        {min(longest, -(-int(n) // multiple) * multiple) for n in np.unique(lengths)} | {longest}
    )
    histogram = np.bincount(lengths, minlength=longest + 1).astype(np.float64)
    counts = np.cumsum(histogram)
    totals = np.cumsum(histogram * np.arange(longest + 1))

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


def bucket_lengths(examples: Examples, config: BatchConfig) -> tuple[int, ...]:
    """The padded lengths batches use (one when packing)."""
    if config.pack:
        return (config.max_seq_len,)
    if config.buckets:
        return tuple(
            sorted({min(b, config.max_seq_len) for b in config.buckets} | {config.max_seq_len})
        )
    lengths = np.maximum(examples.src_lengths, examples.tgt_lengths)
    return optimal_buckets(lengths, config.max_seq_len, config.num_buckets, config.bucket_multiple)


@dataclasses.dataclass(frozen=True, eq=False)
class BatchRows:
    """The rows of one global batch: row r holds positions into `Examples`
    members[starts[r]:starts[r+1]] (an empty row is all padding). Slicing gives the rows of one
    process; iterating gives each row's positions as a list."""

    members: np.ndarray  # [pairs in the batch]
    starts: np.ndarray  # [rows + 1], starts[0] == 0

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            begin, end, step = index.indices(len(self))
            if step != 1:
                raise ValueError("batch rows slice with step 1 only")
            starts = self.starts[begin : max(begin, end) + 1]
            return BatchRows(self.members[starts[0] : starts[-1]], starts - starts[0])
        return self.members[self.starts[index] : self.starts[index + 1]].tolist()

    def __iter__(self):
        return (self[r] for r in range(len(self)))

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, BatchRows)
            and np.array_equal(self.members, other.members)
            and np.array_equal(self.starts, other.starts)
        )


@dataclasses.dataclass(frozen=True, eq=False)
class EpochPlan:
    """One epoch's global batches in three flat arrays (no Python object per pair): batch b is
    rows row_starts[batch_starts[b]] ... of `members`, see `BatchRows`."""

    members: np.ndarray  # positions into Examples, batch after batch, row after row
    row_starts: np.ndarray  # [rows + 1]
    batch_starts: np.ndarray  # [batches + 1], into rows
    # (int32 below 2**31 pairs: `position_dtype`)

    def __len__(self) -> int:
        return len(self.batch_starts) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):  # the first batches (an evaluation cap)
            begin, end, _ = index.indices(len(self))
            batches = self.batch_starts[begin : max(begin, end) + 1]
            rows = self.row_starts[batches[0] : batches[-1] + 1]
            return EpochPlan(self.members[rows[0] : rows[-1]], rows - rows[0], batches - batches[0])
        first, last = self.batch_starts[index], self.batch_starts[index + 1]
        starts = self.row_starts[first : last + 1]
        return BatchRows(self.members[starts[0] : starts[-1]], starts - starts[0])

    def __iter__(self):
        return (self[b] for b in range(len(self)))

    def __eq__(self, other) -> bool:
        return isinstance(other, EpochPlan) and all(
            np.array_equal(getattr(self, name), getattr(other, name))
            for name in ("members", "row_starts", "batch_starts")
        )


def plan_epoch(
    examples: Examples, config: BatchConfig, epoch: int, buckets: tuple[int, ...] | None = None
) -> EpochPlan:
    """Global batches of one epoch. A pure function of (config.seed, epoch)."""
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
    dtype = position_dtype(len(examples.indices))
    members = np.concatenate([m for m, _ in batches] or [np.zeros(0, dtype)]).astype(dtype)
    row_sizes = np.concatenate([s for _, s in batches] or [np.zeros(0, dtype)])
    row_starts = np.zeros(len(row_sizes) + 1, dtype)
    np.cumsum(row_sizes, out=row_starts[1:])
    batch_starts = np.zeros(len(batches) + 1, dtype)
    np.cumsum([len(s) for _, s in batches], out=batch_starts[1:])
    return EpochPlan(members, row_starts, batch_starts)


def _plan_bucketed(order, examples: Examples, config: BatchConfig, buckets):
    """(members, row sizes) per batch: pairs of one bucket, one per row, in shuffled order."""
    lengths = np.maximum(examples.src_lengths, examples.tgt_lengths)
    buckets = np.asarray(buckets)
    bucket_of = np.searchsorted(buckets, lengths)
    batches = []
    for b, length in enumerate(buckets):
        members = order[bucket_of[order] == b]
        rows = config.rows_for(int(length))
        for start in range(0, len(members), rows):
            chunk = members[start : start + rows]
            sizes = np.zeros(rows, np.int32)
            sizes[: len(chunk)] = 1
            batches.append((chunk, sizes))
    return batches


def _plan_packed(order, examples: Examples, config: BatchConfig, block: int = 1 << 16):
    """(members, row sizes) per batch: first-fit packing into rows of max_seq_len tokens per
    side, in shuffled order, searching the 64 most recently opened rows."""
    rows_per_batch = config.rows_for(config.max_seq_len)
    limit = config.max_seq_len
    row_of = np.empty(len(order), np.int32)  # the row each position in `order` went to
    used_src: list[int] = []
    used_tgt: list[int] = []
    open_rows: list[int] = []  # rows with space left, most recent last (bounded search)
    for begin in range(0, len(order), block):  # Python ints for one block at a time
        part = order[begin : begin + block]
        src_part = examples.src_lengths[part].tolist()
        tgt_part = examples.tgt_lengths[part].tolist()
        for k, (s, t) in enumerate(zip(src_part, tgt_part, strict=True)):
            for r in open_rows:
                if used_src[r] + s <= limit and used_tgt[r] + t <= limit:
                    used_src[r] += s
                    used_tgt[r] += t
                    row_of[begin + k] = r
                    break
            else:
                row_of[begin + k] = len(used_src)
                open_rows.append(len(used_src))
                used_src.append(s)
                used_tgt.append(t)
                if len(open_rows) > 64:
                    open_rows.pop(0)
    by_row = np.argsort(row_of, kind="stable")  # rows in opening order, members as added
    members = order[by_row]
    sizes = np.bincount(row_of, minlength=len(used_src)).astype(np.int32)
    ends = np.cumsum(sizes)
    batches = []
    for first in range(0, len(sizes), rows_per_batch):
        batch_sizes = np.zeros(rows_per_batch, np.int32)
        part = sizes[first : first + rows_per_batch]
        batch_sizes[: len(part)] = part
        begin = int(ends[first - 1]) if first else 0
        batches.append((members[begin : begin + int(part.sum())], batch_sizes))
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
    rows: BatchRows | Sequence[Sequence[int]],
    length: int,
    packed: bool,
) -> Batch:
    """Padded int32 arrays for `rows` (`BatchRows`, or lists of positions into `examples`),
    built with vectorised gathers from the flat id cache."""
    if not isinstance(rows, BatchRows):
        sizes = np.fromiter(map(len, rows), np.int64, count=len(rows))
        members = np.fromiter((m for row in rows for m in row), np.int64, count=int(sizes.sum()))
        rows = BatchRows(members, np.concatenate([[0], np.cumsum(sizes)]))
    n = len(rows)
    members = rows.members
    row_of = np.repeat(np.arange(n), np.diff(rows.starts))
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
        token_index = offsets[index[seg]] + within
        if side == "src":
            eos = within == lengths[seg] - 1  # the last slot, also when the source was cut
        else:
            # EOS only where the target really ends: a target cut by the length rule did not
            # end there, and an EOS at the cut would teach the model to stop mid-sentence
            eos = token_index == offsets[index[seg] + 1]
        tokens = np.where(eos, EOS_ID, ids[np.minimum(token_index, len(ids) - 1)])
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
