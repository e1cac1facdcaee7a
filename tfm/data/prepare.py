"""Prepare a corpus and its vocabulary once: `python -m tfm.data.prepare SPEC --data_dir DIR`.

Reads the corpus (building the TFDS dataset for gettext), trains or loads the shared
SentencePiece vocabulary, tokenizes every split into the id cache, and prints a summary: pairs
per split and how many were filtered, by reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib

from tfm.data import batching, sources, tokenizer
from tfm.data.corpus import Corpus, CorpusError


@dataclasses.dataclass
class PreparedData:
    """A corpus ready for batching: the spec, raw pairs, vocabulary and ids of each split."""

    spec: sources.SourceSpec
    corpus: Corpus
    tokenizer: tokenizer.Tokenizer
    ids: dict[str, tokenizer.TokenizedSplit]

    def summary(self, config: batching.BatchConfig | None = None) -> dict:
        """Pairs per split, filtered counts by reason (reading, and the length rule if a
        batch config is given)."""
        report = dict(
            dataset=self.spec.name,
            direction=f"{self.spec.source_language}->{self.spec.target_language}",
            vocabulary=str(self.tokenizer.path),
            vocab_size=self.tokenizer.vocab_size,
            pairs={split: len(pairs) for split, pairs in self.corpus.splits.items()},
            filtered_while_reading=dict(self.corpus.filtered),
        )
        if config is not None:
            report["length_rule"] = dict(max_seq_len=config.max_seq_len, overlong=config.overlong)
            report["filtered_by_length"] = {
                split: dict(batching.select_examples(ids, config).filtered)
                for split, ids in self.ids.items()
            }
        return report


def prepare(
    spec: str | sources.SourceSpec, data_dir: str | pathlib.Path, vocab_size: int, **reader_options
) -> PreparedData:
    """Everything `train.py` and `decode.py` need from the data dir, built if missing."""
    if isinstance(spec, str):
        spec = sources.parse_spec(spec)
    data_dir = pathlib.Path(data_dir)
    corpus = sources.load_corpus(spec, data_dir, **reader_options)
    if not corpus.splits["train"]:
        raise ValueError(f"{spec.name}: the training split is empty")
    vocab = tokenizer.load_or_train(corpus.splits["train"], spec.slug, vocab_size, data_dir)
    key = vocab.path.stem
    ids = {
        split: tokenizer.tokenize_split(pairs, vocab, data_dir / "ids" / f"{key}-{split}.npz")
        for split, pairs in corpus.splits.items()
    }
    return PreparedData(spec, corpus, vocab, ids)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("spec", help="tfds:NAME, gettext:en-de, text:SRC,TGT or tsv:FILE")
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--max_seq_len", type=int, default=128)
    parser.add_argument("--overlong", choices=("drop", "truncate"), default="drop")
    parser.add_argument("--source_language")
    parser.add_argument("--target_language")
    parser.add_argument("--encoding_errors", choices=("strict", "replace"), default="strict")
    args = parser.parse_args(argv)
    spec = sources.parse_spec(args.spec, args.source_language, args.target_language)
    options = {} if spec.kind in ("tfds", "gettext") else dict(encoding_errors=args.encoding_errors)
    try:
        data = prepare(spec, args.data_dir, args.vocab_size, **options)
    except CorpusError:
        if spec.kind != "tfds":
            raise
        from tfm.data import tfds_sources

        tfds_sources.prepare_dataset(spec.argument, args.data_dir)  # first use: build, then retry
        data = prepare(spec, args.data_dir, args.vocab_size, **options)
    config = batching.BatchConfig(
        max_seq_len=args.max_seq_len,
        overlong=args.overlong,
        batch_tokens=max(4096, args.max_seq_len),
    )
    print(json.dumps(data.summary(config), indent=1))


if __name__ == "__main__":
    main()
