"""Prepare a corpus and its vocabulary once: `python -m tfm.data.prepare SPEC --data_dir DIR`.

Reads the corpus (building the TFDS dataset for gettext), trains or loads the shared
SentencePiece vocabulary, tokenizes every split into the id cache, and prints a summary: pairs
per split and how many were filtered, by reason. Streams in bounded memory on every core, and
an interrupted run continues where it stopped.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import hashlib
import itertools
import json
import pathlib
import sys

from tqdm import tqdm

from tfm.data import batching, id_cache, sources, streaming, tokenizer
from tfm.data.corpus import SPLITS, CorpusError
from tfm.data.gettext_catalogs import CatalogError
from tfm.job import file_lock

CHUNK_RECORDS = 20_000  # lines (records) per chunk: a few MB of text and of ids


@dataclasses.dataclass
class PreparedData:
    """A corpus ready for batching: the spec, vocabulary, and each split's ids (memory-mapped),
    pair counts and content fingerprint; the held-out splits' texts on request (`texts`)."""

    spec: sources.SourceSpec
    tokenizer: tokenizer.Tokenizer
    ids: dict[str, id_cache.TokenizedSplit]
    id_paths: dict[str, pathlib.Path]
    sizes: dict[str, int]  # pairs per split
    filtered: collections.Counter  # what reading dropped or changed, by reason
    fingerprints: dict[str, str]  # SHA-256 of each split's text (`corpus.fingerprint`)
    caches: dict[str, str]  # vocabulary and each split's ids: "built" or "reused"

    def texts(self, split: str) -> list[tuple[str, str]]:
        """(source, reference) texts of a held-out split, as the corpus has them."""
        if split not in streaming.HELD_OUT:
            raise ValueError(
                f"only held-out splits keep their text, not {split!r}; read the corpus with "
                "tfm.data.sources.load_corpus"
            )
        return id_cache.texts(self.id_paths[split])

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
            pairs=dict(self.sizes),
            counted_while_reading=dict(self.filtered),
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


@dataclasses.dataclass
class _Scan:
    sizes: dict[str, int]
    fingerprints: dict[str, str]
    filtered: collections.Counter
    chunk_digests: dict[str, list[bytes]]  # per split, SHA-256 of each chunk's part


def prepare(
    spec: str | sources.SourceSpec,
    data_dir: str | pathlib.Path,
    vocab_size: int,
    workers: int | None = None,
    chunk_records: int = CHUNK_RECORDS,
    **reader_options,
) -> PreparedData:
    """Everything `train.py` and `decode.py` need from the data dir, built if missing.

    Streams the corpus in chunks of `chunk_records` lines through `workers` processes (default:
    every core this process may use), in memory that does not grow with the corpus: a scan
    (pair counts, fingerprints), the vocabulary's training text if it is not cached
    (SentencePiece keeps a bounded sample), and the encoding into resumable per-chunk files
    joined into each split's memory-mapped id cache (`tfm.data.id_cache`)."""
    if isinstance(spec, str):
        spec = sources.parse_spec(spec)
    for name, value in (("vocab_size", vocab_size), ("workers", workers or 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"prepare: {name} must be a positive integer, got {value!r}")
    data_dir = pathlib.Path(data_dir)
    workers = workers or streaming.available_cores()

    def chunks():
        return sources.corpus_chunks(spec, data_dir, chunk_records, **reader_options)

    with streaming.ChunkMap(workers) as chunk_map:
        scan = _scan(chunk_map, chunks())
        _check_splits(spec, scan.sizes)
        with _one_builder(data_dir, spec):
            return _build(spec, data_dir, vocab_size, chunk_records, chunk_map, chunks, scan)


def _one_builder(data_dir: pathlib.Path, spec: sources.SourceSpec):
    """Hold `DATA_DIR/.prepare-SLUG.lock` (flock) while the vocabulary and id caches are
    checked and built: runs started together on one data dir (a local sweep, the processes of
    a multi-host job) build them once, the others wait and then reuse them. The OS releases
    the lock when its holder dies. (The corpus scan runs before it: a script without a main
    guard re-runs `prepare` in each worker it spawns, and a worker waiting here would hang.)"""
    return file_lock.building(
        data_dir / f".prepare-{spec.slug}.lock", f"preparing {spec.name} in {data_dir}"
    )


def _build(spec, data_dir, vocab_size, chunk_records, chunk_map, chunks, scan) -> PreparedData:
    """The vocabulary and each split's id cache, each built if missing (under `_one_builder`)."""
    train_print = scan.fingerprints["train"]
    vocab_path = tokenizer.vocabulary_path(data_dir, spec.slug, vocab_size, train_print)
    caches = {"vocabulary": "reused" if vocab_path.is_file() else "built"}
    if not vocab_path.is_file():
        texts = itertools.chain.from_iterable(chunk_map(streaming.training_texts, chunks()))
        tokenizer.train_tokenizer(texts, vocab_size, vocab_path)
    vocab = tokenizer.Tokenizer(vocab_path)
    keys = {split: tokenizer.ids_key(vocab, scan.fingerprints[split]) for split in SPLITS}
    paths = {
        split: data_dir / "ids" / f"{vocab.path.stem}-{split}-{keys[split]}" for split in SPLITS
    }
    ids = {split: id_cache.read(paths[split], keys[split], scan.sizes[split]) for split in SPLITS}
    missing = [split for split in SPLITS if ids[split] is None]
    for split in SPLITS:
        caches[f"ids_{split}"] = "built" if split in missing else "reused"
    if missing:
        store_key = hashlib.sha256(
            f"{vocab.fingerprint}:{sorted(scan.fingerprints.items())}:{chunk_records}".encode()
        ).hexdigest()[:16]
        store = id_cache.ChunkStore(data_dir / "ids" / f"{vocab.path.stem}-{store_key}.chunks")
        count = _encode(chunk_map, chunks(), vocab, store)
        for split in missing:
            ids[split] = _finish(store, split, count, paths[split], keys[split], scan)
            if len(ids[split]) != scan.sizes[split]:
                raise CorpusError(
                    f"{spec.name}: the {split} split changed while it was being prepared "
                    f"({scan.sizes[split]} pairs, then {len(ids[split])}); run prepare again"
                )
        store.remove()
    return PreparedData(
        spec, vocab, ids, paths, scan.sizes, scan.filtered, scan.fingerprints, caches
    )


def _scan(chunk_map: streaming.ChunkMap, chunks) -> _Scan:
    """Pairs per split, fingerprints and filter counts, in one pass."""
    sizes = dict.fromkeys(SPLITS, 0)
    digests = {split: hashlib.sha256() for split in SPLITS}
    filtered: collections.Counter = collections.Counter()
    progress = tqdm(desc="prepare: scan", unit=" chunks", file=sys.stderr, disable=None)
    chunk_digests: dict[str, list[bytes]] = {split: [] for split in SPLITS}
    for chunk_sizes, feeds, counts in chunk_map(streaming.scan_chunk, chunks):
        for split in SPLITS:
            sizes[split] += chunk_sizes[split]
            digests[split].update(feeds[split])
            chunk_digests[split].append(hashlib.sha256(feeds[split]).digest())
        filtered.update(counts)
        progress.update()
    progress.close()
    prints = {split: digest.hexdigest() for split, digest in digests.items()}
    return _Scan(sizes, prints, +filtered, chunk_digests)


def _encode(chunk_map: streaming.ChunkMap, chunks, vocab, store: id_cache.ChunkStore) -> int:
    """Encode every chunk not already in `store` (an interrupted prepare resumes here); returns
    the number of chunks."""
    count = 0

    def tasks():
        nonlocal count
        for index, chunk in enumerate(chunks):
            count = index + 1
            if not store.has(index):
                yield index, chunk, str(vocab.path), str(store.directory)

    progress = tqdm(desc="prepare: encode", unit=" chunks", file=sys.stderr, disable=None)
    for _ in chunk_map(streaming.encode_chunk, tasks()):
        progress.update()
    progress.close()
    return count


def _finish(store, split, count, path, key, scan: _Scan) -> id_cache.TokenizedSplit:
    """Join a split's chunks into its cache, unless another process of a multi-host job (same
    data dir) finished it meanwhile; if that one removed the chunks mid-way, use its cache."""
    if count != len(scan.chunk_digests[split]):
        raise CorpusError(
            f"the corpus changed while it was being prepared ({len(scan.chunk_digests[split])} "
            f"chunks scanned, {count} encoded); run prepare again"
        )
    try:
        return id_cache.read(path, key, scan.sizes[split]) or store.finish(
            split, path, key, split in streaming.HELD_OUT, scan.chunk_digests[split]
        )
    except FileNotFoundError:
        finished = id_cache.read(path, key, scan.sizes[split])
        if finished is None:
            raise
        return finished


def _check_splits(spec: sources.SourceSpec, sizes: dict[str, int]) -> None:
    """Every split must hold pairs: training needs the training split, the validation loss and
    the final BLEU need the other two."""
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
    parser.add_argument(
        "--workers", type=int, help="processes that read and encode (default: every core)"
    )
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
    def prepare_now() -> PreparedData:
        return prepare(
            spec, args.data_dir, args.vocab_size, args.workers, encoding_errors=args.encoding_errors
        )

    try:
        return prepare_now()
    except CorpusError as error:
        if spec.kind != "tfds" or "is not prepared" not in str(error):
            raise
    from tfm.data import tfds_sources

    print(f"first use of {spec.name}: building it under {args.data_dir}", file=sys.stderr)
    with (
        _one_builder(pathlib.Path(args.data_dir), spec),
        contextlib.redirect_stdout(sys.stderr),  # TFDS prints its progress; stdout is the JSON
    ):
        tfds_sources.prepare_dataset(spec.argument, args.data_dir)
    return prepare_now()


if __name__ == "__main__":
    main()
