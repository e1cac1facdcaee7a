"""A seeded WMT-like parallel corpus for scale benchmarks: two 40,000-word vocabularies of
made-up words, word frequencies following Zipf's law (rank^-1), ~25 words a side, the target a
word-by-word image of the source with its own length jitter (so a vocabulary trained on it
behaves like one trained on real text: frequent words whole, rare ones split).

    python benchmarks/wmt_like.py --pairs 1000000 --out DIR   # writes DIR/src.txt, DIR/tgt.txt
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

WORDS = 40_000
MEAN_WORDS = 25
LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzaeiouaeioulnrst", np.uint8)


def _vocabulary(rng: np.random.Generator) -> list[bytes]:
    """WORDS distinct lowercase words, 2-12 letters, the frequent ones shorter (as in text)."""
    words: dict[bytes, None] = {}
    while len(words) < WORDS:
        rank = len(words)
        length = int(min(12, 2 + rng.poisson(1.5 + np.log1p(rank) / 2)))
        words[LETTERS[rng.integers(0, len(LETTERS), length)].tobytes()] = None
    return list(words)


def _zipf_sampler(rng: np.random.Generator):
    cumulative = np.cumsum(1.0 / np.arange(1, WORDS + 1))
    cumulative /= cumulative[-1]
    return lambda n: np.minimum(np.searchsorted(cumulative, rng.random(n)), WORDS - 1)


def _table(words: list[bytes]) -> list[bytes]:
    """Each word followed by a space, then each word ending a sentence (full stop, newline)."""
    return [w + b" " for w in words] + [w + b".\n" for w in words]


def _lines(table: list[bytes], word_ids: np.ndarray, lengths: np.ndarray) -> bytes:
    """Sentences of `lengths` words from `word_ids`, one per line."""
    last = np.zeros(len(word_ids), bool)
    last[np.cumsum(lengths) - 1] = True
    return b"".join(map(table.__getitem__, (word_ids + np.where(last, WORDS, 0)).tolist()))


def write_corpus(pairs: int, out: str | pathlib.Path, seed: int = 0, chunk: int = 200_000) -> None:
    """DIR/src.txt and DIR/tgt.txt: `pairs` line-aligned sentences."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    source_words, target_words = _vocabulary(rng), _vocabulary(rng)
    # the target vocabulary's rank r translates source rank ~r (frequencies line up)
    translation = np.argsort(np.arange(WORDS) + rng.normal(0, 50, WORDS))
    sample = _zipf_sampler(rng)
    source_table, target_table = _table(source_words), _table(target_words)
    with open(out / "src.txt", "wb") as src, open(out / "tgt.txt", "wb") as tgt:
        for start in range(0, pairs, chunk):
            n = min(chunk, pairs - start)
            src_lengths = 1 + rng.poisson(MEAN_WORDS - 1, n)
            src_ids = sample(int(src_lengths.sum()))
            tgt_lengths = np.maximum(1, src_lengths + rng.integers(-3, 4, n))
            # each target sentence: its source's words translated, cut or padded with samples
            tgt_ids = sample(int(tgt_lengths.sum()))
            src_starts = np.cumsum(src_lengths) - src_lengths
            tgt_starts = np.cumsum(tgt_lengths) - tgt_lengths
            position = np.arange(int(tgt_lengths.sum())) - np.repeat(tgt_starts, tgt_lengths)
            sentence = np.repeat(np.arange(n), tgt_lengths)
            aligned = position < src_lengths[sentence]
            tgt_ids[aligned] = translation[
                src_ids[src_starts[sentence[aligned]] + position[aligned]]
            ]
            src.write(_lines(source_table, src_ids, src_lengths))
            tgt.write(_lines(target_table, tgt_ids, tgt_lengths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_corpus(args.pairs, args.out, args.seed)


if __name__ == "__main__":
    main()
