"""Work on a corpus chunk by chunk, on every core: an order-keeping map over a bounded window of
chunks in worker processes, and the three things `tfm.data.prepare` does with a chunk (scan it,
give its training text to SentencePiece, encode it).

Workers are started with "spawn": the caller may have imported JAX, whose threads do not survive
a fork. Each worker imports only `tfm.data` (numpy, sentencepiece), not JAX.
"""

from __future__ import annotations

import collections
import concurrent.futures
import concurrent.futures.process
import functools
import hashlib
import json
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from tfm.data.corpus import RawChunk, fingerprint_feed, parse_chunk
from tfm.data.id_cache import ChunkStore
from tfm.data.tokenizer import Tokenizer, encode_pairs

HELD_OUT = ("validation", "test")


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


class ChunkMap:
    """`map(func, chunks)` in `workers` processes, results in order, at most `window` chunks in
    flight (memory stays bounded however long the corpus). One worker runs in this process."""

    def __init__(self, workers: int, window: int | None = None):
        self.workers = max(1, workers)
        self.window = window or 2 * self.workers
        self._pool = None
        if self.workers > 1:
            context = multiprocessing.get_context("spawn")
            self._pool = concurrent.futures.ProcessPoolExecutor(self.workers, mp_context=context)

    def __call__(self, func: Callable, items: Iterable) -> Iterator:
        if self._pool is None:
            yield from map(func, items)
            return
        pending: collections.deque = collections.deque()
        try:
            for item in items:
                pending.append(self._pool.submit(func, item))
                if len(pending) >= self.window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except concurrent.futures.process.BrokenProcessPool as error:
            raise RuntimeError(
                f"prepare's {self.workers} worker processes died ({error}); a script that calls "
                "tfm.data.prepare.prepare needs an `if __name__ == '__main__':` guard (workers "
                "start by re-importing it), or pass workers=1"
            ) from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def __enter__(self) -> ChunkMap:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def scan_chunk(chunk: RawChunk) -> tuple[dict[str, int], dict[str, bytes], collections.Counter]:
    """Pairs per split, each split's `fingerprint_feed`, and the filter counts of one chunk."""
    part = parse_chunk(chunk)
    sizes = {split: len(pairs) for split, pairs in part.splits.items()}
    feeds = {split: fingerprint_feed(pairs) for split, pairs in part.splits.items()}
    return sizes, feeds, part.filtered


def training_texts(chunk: RawChunk) -> list[str]:
    """Source and target texts of the chunk's training pairs (what the vocabulary learns)."""
    return [text for pair in parse_chunk(chunk).splits["train"] for text in pair if text]


@functools.lru_cache(maxsize=2)
def _tokenizer(path: str) -> Tokenizer:
    """Loaded once per worker process and vocabulary."""
    return Tokenizer(path)


def encode_chunk(task: tuple[int, RawChunk, str, str]) -> int:
    """Encode chunk `index` into the `ChunkStore` at `store`: its ids per split and side as the
    vocabulary's `id_dtype`, their lengths, the held-out splits' texts, and each split's digest
    of the text encoded. The worker writes the file itself, so ids never travel back through
    the parent process."""
    index, chunk, vocabulary, store = task
    tokenizer = _tokenizer(vocabulary)
    arrays = {}
    for split, pairs in parse_chunk(chunk).splits.items():
        # what the scan saw of this chunk must be what is encoded (checked when joining)
        digest = hashlib.sha256(fingerprint_feed(pairs)).digest()
        arrays[f"{split}.digest"] = np.frombuffer(digest, np.uint8)
        for side, (flat, lengths) in encode_pairs(tokenizer, pairs, threads=1).items():
            arrays[f"{split}.{side}_ids"] = flat
            arrays[f"{split}.{side}_lengths"] = lengths
        if split in HELD_OUT:
            arrays[f"{split}.texts"] = np.frombuffer(json.dumps(pairs).encode(), np.uint8)
    ChunkStore(store).put(index, arrays)
    return index
