"""Prepare a corpus and its vocabulary once: `python -m tfm.data.prepare SPEC --data_dir DIR`.

Reads the corpus (building the TFDS dataset for gettext), trains or loads the shared
SentencePiece vocabulary, tokenizes every split into the id cache, and prints a summary: pairs
per split and how many were filtered, by reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import pathlib
import sys

from tfm.data import batching, sources, tokenizer
from tfm.data.corpus import SPLITS, Corpus, CorpusError, fingerprint
from tfm.data.gettext_catalogs import CatalogError


@dataclasses.dataclass
class PreparedData:
    """A corpus ready for batching: the spec, raw pairs, vocabulary and ids of each split."""

    spec: sources.SourceSpec
    corpus: Corpus
    tokenizer: tokenizer.Tokenizer
    ids: dict[str, tokenizer.TokenizedSplit]
    fingerprints: dict[str, str]  # SHA-256 of each split's text (`corpus.fingerprint`)
    caches: dict[str, str]  # vocabulary and each split's ids: "built" or "reused"

    @property
    def dataset_fingerprint(self) -> str:
        """One digest of every split's text: what a workdir's checkpoints were trained on."""
        text = ",".join(
            f"{split}:{self.fingerprints[split]}" for split in sorted(self.fingerprints)
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def summary(self, config: batching.BatchConfig | None = None) -> dict:
        """Pairs per split, filtered counts by reason (reading, and the length rule if a
        batch config is given)."""
        report = dict(
            dataset=self.spec.name,
            direction=f"{self.spec.source_language}->{self.spec.target_language}",
            vocabulary=str(self.tokenizer.path),
            vocab_size=self.tokenizer.vocab_size,
            pairs={split: len(pairs) for split, pairs in self.corpus.splits.items()},
            counted_while_reading=dict(self.corpus.filtered),
            dataset_fingerprint=self.dataset_fingerprint,
            caches=self.caches,
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
    _check_splits(spec, corpus)
    prints = {split: fingerprint(pairs) for split, pairs in corpus.splits.items()}
    vocab_path = tokenizer.vocabulary_path(data_dir, spec.slug, vocab_size, prints["train"])
    caches = {"vocabulary": "reused" if vocab_path.is_file() else "built"}
    vocab = tokenizer.load_or_train(
        corpus.splits["train"], spec.slug, vocab_size, data_dir, prints["train"]
    )
    ids = {}
    for split, pairs in corpus.splits.items():
        key = tokenizer.ids_key(vocab, prints[split])
        path = data_dir / "ids" / f"{vocab.path.stem}-{split}-{key}"
        caches[f"ids_{split}"] = "reused" if (path / "meta.json").is_file() else "built"
        ids[split] = tokenizer.tokenize_split(pairs, vocab, path, key)
    return PreparedData(spec, corpus, vocab, ids, prints, caches)


def _check_splits(spec: sources.SourceSpec, corpus: Corpus) -> None:
    """Every split must hold pairs: training needs the training split, the validation loss and
    the final BLEU need the other two."""
    sizes = {split: len(corpus.splits.get(split, ())) for split in SPLITS}
    empty = [split for split, size in sizes.items() if size == 0]
    if empty:
        raise CorpusError(
            f"{spec.name}: the {' and '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} "
            f"empty ({sizes}); a corpus split by hash needs a few hundred pairs so that 2% land "
            "in each held-out split"
        )


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
    try:
        spec = sources.parse_spec(args.spec, args.source_language, args.target_language)
        config = batching.BatchConfig(
            max_seq_len=args.max_seq_len,
            overlong=args.overlong,
            batch_tokens=max(4096, args.max_seq_len),
        )
        data = _prepare_or_build(spec, args)
    except (CorpusError, CatalogError, FileNotFoundError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    print(json.dumps(data.summary(config), indent=1))


def _prepare_or_build(spec: sources.SourceSpec, args) -> PreparedData:
    options = {} if spec.kind in ("tfds", "gettext") else dict(encoding_errors=args.encoding_errors)
    try:
        return prepare(spec, args.data_dir, args.vocab_size, **options)
    except CorpusError as error:
        if spec.kind != "tfds" or "is not prepared" not in str(error):
            raise
    from tfm.data import tfds_sources

    print(f"first use of {spec.name}: building it under {args.data_dir}", file=sys.stderr)
    tfds_sources.prepare_dataset(spec.argument, args.data_dir)
    return prepare(spec, args.data_dir, args.vocab_size, **options)


if __name__ == "__main__":
    main()
