"""Independent searches side by side on a CPU's cores.

Each sentence's search is its own (section 6.1: a beam search per sentence), so a batch can be
searched as a few smaller batches at once, and a length bucket's stream of sentences
(`tfm.inference.slots`) as a few streams, with every sentence's result unchanged. On CPU that uses
the cores better than one search: XLA:CPU splits each op of a decoding step over its threads, and a
step's ops are small (16-64 rows): on a 2-core AMD EPYC (2026-12-03, interleaved A/B in one
process) two searches at once, each on half the batch, decoded 1.20x (beam 4 SMALL, 1,893 ->
2,263 tok/s) and 1.13x (greedy, 5,658 -> 6,374) the tokens/s of the whole batch in one search,
four parts less; the main job's test split (beam 4, `tfm.inference.translate`) took 6.56 s warm
with two streams per bucket against 8.14 s with one (three: 7.75 s), identical translations
(`benchmarks/README.md`, round seventeen); greedy, two of a bucket's batches at once, 2.27-2.33
against 2.65-2.69 s on a 2-core Intel Xeon (2026-12-04, round twenty-one). On an accelerator
one wide search is better; `default_parts` says 1 there.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from tfm.tokens import PAD_ID

T = TypeVar("T")

# Measured on 2-core hosts only; more parts on bigger CPUs are untested.
MOST_CPU_PARTS = 2


def default_parts(backend: str | None = None) -> int:
    """How many searches to run side by side on `backend` (default: JAX's): on CPU the cores
    this process may run on, at most `MOST_CPU_PARTS`; 1 on an accelerator."""
    if (backend or jax.default_backend()) != "cpu":
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return min(cores, MOST_CPU_PARTS)


def run_side_by_side(jobs: Sequence[Callable[[], T]]) -> list[T]:
    """Each job's result, in order, the jobs running at once on threads of their own (one job
    runs on this thread). JAX releases the GIL while a program runs, so the programs that the
    jobs call run concurrently; a job's exception is raised here once every job has ended."""
    if len(jobs) <= 1:
        return [job() for job in jobs]
    with concurrent.futures.ThreadPoolExecutor(len(jobs), thread_name_prefix="tfm-part") as pool:
        futures = [pool.submit(job) for job in jobs]
        concurrent.futures.wait(futures)
    return [future.result() for future in futures]


def split_rows(batch: int, parts: int) -> int:
    """Rows per part: `batch` rows in `parts` equal parts (the last padded), so that every part
    runs one compiled program."""
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts must be a positive integer, got {parts!r}")
    return -(-batch // min(parts, batch))


def search_in_parts(search: Callable, model, params, src, parts: int | None = None, **settings):
    """`search(model, params, src, **settings)` (a search of `tfm.inference.decoding`) over `[batch,
    src_len]` sources as `parts` searches of equal row count side by side (None:
    `default_parts()`). The last part is filled with all-padding rows, which are finished from
    the start and cut off; the result equals the one search's, row for row."""
    src = np.asarray(src)
    parts = default_parts() if parts is None else parts
    rows = split_rows(src.shape[0], parts)
    if rows == src.shape[0]:
        return search(model, params, src, **settings)
    padded_rows = -(-src.shape[0] // rows) * rows
    padded = np.full((padded_rows, src.shape[1]), PAD_ID, src.dtype)
    padded[: src.shape[0]] = src
    # threads that call a program not yet compiled wait for one compilation (jit's cache)
    results = run_side_by_side(
        [
            lambda start=start: search(model, params, padded[start : start + rows], **settings)
            for start in range(0, padded_rows, rows)
        ]
    )
    return jax.tree.map(lambda *leaves: jnp.concatenate(leaves)[: src.shape[0]], *results)
