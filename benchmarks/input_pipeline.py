"""Input pipeline: batch assembly speed from the id cache, and padding with and without bucketing.

Prints one JSON object. Uses the embedded corpus (gettext:en-de) unless --dataset says otherwise.

    python benchmarks/input_pipeline.py [--dataset SPEC] [--data_dir data] [--batches 300]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from tfm.data import batching, pipeline
from tfm.data.prepare import prepare
from tfm.tokens import PAD_ID


def _assembly(pipe: pipeline.BatchPipeline, batches: int) -> dict:
    iterator = pipe.iterator()
    next(iterator)  # plan the epoch outside the timing
    real = slots = 0
    start = time.perf_counter()
    for _ in range(batches):
        batch = next(iterator)
        slots += batch["tgt_out"].size
        real += int((batch["tgt_out"] != PAD_ID).sum())
    seconds = time.perf_counter() - start
    return dict(
        batches=batches,
        seconds=round(seconds, 3),
        target_tokens_per_second=round(real / seconds),
        target_slots_per_second=round(slots / seconds),
    )


def _padding(pipe: pipeline.BatchPipeline) -> float:
    real = slots = 0
    for rows in pipe.plan(0):
        batch = pipe.local_batch(rows)
        slots += batch["tgt_out"].size
        real += int((batch["tgt_out"] != PAD_ID).sum())
    return real, slots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", default="gettext:en-de")
    parser.add_argument("--data_dir", default="data")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--batch_tokens", type=int, default=4096)
    parser.add_argument("--max_seq_len", type=int, default=64)
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args()
    data = prepare(args.dataset, args.data_dir, args.vocab_size)
    ids = data.ids["train"]
    results = {}
    for name, pack in (("bucketed", False), ("packed", True)):
        config = batching.BatchConfig(
            batch_tokens=args.batch_tokens, max_seq_len=args.max_seq_len, pack=pack
        )
        pipe = pipeline.BatchPipeline(ids, config)
        real, slots = _padding(pipe)
        results[name] = dict(
            assembly=_assembly(pipe, args.batches),
            padding_fraction=round(1 - real / slots, 4),
            shapes=len(pipe.buckets),
            buckets=list(pipe.buckets),
        )
    # unbucketed: the same pairs in shuffled batches of the bucketed average row count, each
    # padded to its longest pair (what batching without length grouping costs)
    pipe = pipeline.BatchPipeline(
        ids, batching.BatchConfig(batch_tokens=args.batch_tokens, max_seq_len=args.max_seq_len)
    )
    lengths = np.maximum(pipe.examples.src_lengths, pipe.examples.tgt_lengths)
    lengths = lengths[np.random.default_rng(0).permutation(len(lengths))]
    rows = max(1, args.batch_tokens // args.max_seq_len)
    padded = sum(len(c) * int(c.max()) for c in np.array_split(lengths, len(lengths) // rows))
    results["unbucketed"] = dict(
        padding_fraction=round(1 - float(pipe.examples.tgt_lengths.sum()) / padded, 4),
        rows_per_batch=rows,
    )
    print(
        json.dumps(
            dict(
                benchmark="input_pipeline",
                dataset=args.dataset,
                train_pairs=len(ids),
                kept_pairs=len(pipe.examples.indices),
                batch_tokens=args.batch_tokens,
                max_seq_len=args.max_seq_len,
                results=results,
            ),
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
