"""Serving batch plans (`tfm.data.batching`) through grain: one epoch's plan as a random-access
dataset, this JAX process's contiguous slice of every global batch's rows, and an endless
iterator whose state is (epoch, position) so a restored run yields exactly the next batch.

Each process takes its own slice of the same global batches, so all processes see batches of
one shape at every step.
"""

from __future__ import annotations

from collections.abc import Iterator

import grain
import numpy as np

from tfm.data.batching import (
    Batch,
    BatchConfig,
    BatchRows,
    EpochPlan,
    assemble_batch,
    bucket_lengths,
    plan_epoch,
    select_examples,
)
from tfm.data.id_cache import TokenizedSplit

# A few batches assembled ahead by two threads: enough to hide assembly behind a train step;
# grain's default (16 threads, 500 batches) holds hundreds of MB of batches per process.
READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)


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
        config: BatchConfig,
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
            raise ValueError("no pair survives the length filter; raise max_seq_len")
        self.buckets = bucket_lengths(self.examples, config)
        self._plans: dict[int, EpochPlan] = {}

    def plan(self, epoch: int) -> EpochPlan:
        if epoch not in self._plans:
            self._plans = {epoch: plan_epoch(self.examples, self.config, epoch, self.buckets)}
        return self._plans[epoch]

    def row_length(self, rows: BatchRows) -> int:
        """The bucket length of a batch (its longest member's bucket)."""
        if self.config.pack:
            return self.config.max_seq_len
        firsts = rows.members[rows.starts[:-1][np.diff(rows.starts) > 0]]
        longest = max(
            int(self.examples.src_lengths[firsts].max(initial=1)),
            int(self.examples.tgt_lengths[firsts].max(initial=1)),
        )
        return self.buckets[int(np.searchsorted(self.buckets, longest))]

    def local_batch(self, rows: BatchRows) -> Batch:
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
        self._iterator = iter(self._pipeline.epoch_dataset(epoch).to_iter_dataset(READ_OPTIONS))
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
