"""Plain parallel corpora: the `Corpus` record (pairs per split, filter counts), the hash split,
and the readers of line-aligned text files and `source<TAB>target` files.

Local files have no official splits; they are split by a hash of the source text (2% validation,
2% test), so a sentence lands in the same split on every machine and every run.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import pathlib
from collections.abc import Iterable, Iterator, Sequence

SPLITS = ("train", "validation", "test")
HELD_OUT_PERCENT = 2
WHOLE_FILE = 1 << 62  # a chunk size that reads a file in one chunk


class CorpusError(ValueError):
    """Bad input in a corpus; the message names the file, the line and what to do."""


@dataclasses.dataclass
class Corpus:
    """Pairs of every split, and counts by reason of what reading dropped or changed (pairs
    with an empty side, lines whose invalid UTF-8 was replaced, ...). Readers in this module
    read a file whole; `*_chunks` + `parse_chunk` read it in bounded pieces."""

    splits: dict[str, list[tuple[str, str]]]
    filtered: collections.Counter = dataclasses.field(default_factory=collections.Counter)


def fingerprint(pairs: Iterable[tuple[str, str]]) -> str:
    """SHA-256 of a list of pairs' text, in order: what caches built from them are keyed by, so
    an edited corpus never reuses them. Computable in pieces: the digest of the concatenated
    `fingerprint_feed`s of consecutive parts."""
    return hashlib.sha256(fingerprint_feed(pairs)).hexdigest()


def fingerprint_feed(pairs: Iterable[tuple[str, str]]) -> bytes:
    """The bytes `fingerprint` hashes: each text, length-prefixed (8 bytes little-endian)."""
    parts = []
    for source, target in pairs:
        for text in (source, target):
            data = text.encode("utf-8")
            parts.append(len(data).to_bytes(8, "little"))
            parts.append(data)
    return b"".join(parts)


def split_of(source_text: str) -> str:
    """Deterministic split of a pair by the SHA-256 of its source text."""
    bucket = int.from_bytes(hashlib.sha256(source_text.encode("utf-8")).digest()[:8], "big") % 100
    if bucket < HELD_OUT_PERCENT:
        return "validation"
    if bucket < 2 * HELD_OUT_PERCENT:
        return "test"
    return "train"


def split_pairs(pairs: Iterable[tuple[str, str]], filtered: collections.Counter) -> Corpus:
    """Skip pairs with an empty side (counted in `filtered`), and split the rest by hash."""
    splits: dict[str, list[tuple[str, str]]] = {name: [] for name in SPLITS}
    filtered = collections.Counter(filtered)
    for source, target in pairs:
        source, target = source.strip(), target.strip()
        if not source or not target:
            filtered["empty_side"] += 1
            continue
        splits[split_of(source)].append((source, target))
    return Corpus(splits, filtered)


def decode_lines(
    data: bytes,
    where: str,
    errors: str = "strict",
    counts: collections.Counter | None = None,
    remedy: str = (
        "have U+FFFD substituted: --encoding_errors replace (python -m tfm.data.prepare), "
        "--config.encoding_errors=replace (train.py), encoding_errors='replace' (Python)"
    ),
    first_line: int = 1,
) -> list[str]:
    """UTF-8 lines of `data`, split on LF only: a CR before the LF ends a CRLF line, a CR inside
    a line belongs to it; a BOM starting the file (`first_line` 1) is dropped. Invalid UTF-8
    raises CorpusError naming `where` and the line (counted from `first_line`) and `remedy`,
    unless `errors="replace"`, which substitutes U+FFFD and counts the lines it changed in
    `counts["lines_with_invalid_utf8_replaced"]`."""
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the newline that ends the last line
    lines = []
    for number, raw in enumerate(raw_lines, start=first_line):
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            if errors != "replace":
                raise CorpusError(
                    f"{where}, line {number}: invalid UTF-8 at byte {error.start} "
                    f"({raw[max(0, error.start - 10) : error.start + 10]!r}); fix it or {remedy}"
                ) from None
            text = raw.decode("utf-8", errors="replace")
            if counts is not None:
                counts["lines_with_invalid_utf8_replaced"] += 1
        lines.append(text)
    if first_line == 1 and lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
    return lines


@dataclasses.dataclass(frozen=True)
class RawChunk:
    """Consecutive records of a corpus as read, not yet decoded or split: the unit that
    `parse_chunk` turns into pairs, in a worker process when preparing at scale.

    kind "text": data = (source bytes, target bytes) of the same lines of two files;
    "tsv": data = (bytes,) of lines; "pairs": data = (split, [(source, target), ...]) of a
    dataset with its own splits. `first` is the first line (record) number, for messages;
    `counts` what reading dropped before this chunk was made (a dataset's stored counts)."""

    kind: str
    where: tuple[str, ...]
    first: int
    data: tuple
    errors: str = "strict"
    counts: tuple[tuple[str, int], ...] = ()


def text_pair_chunks(
    source_file: str, target_file: str, lines: int, errors: str = "strict"
) -> Iterator[RawChunk]:
    """Line-aligned files in chunks of `lines` lines, read in bounded memory."""
    paths = [pathlib.Path(source_file), pathlib.Path(target_file)]
    for path in paths:
        if not path.is_file():
            raise CorpusError(f"{path}: no such file")
    with open(paths[0], "rb") as source, open(paths[1], "rb") as target:
        first = 1
        while True:
            source_lines = list(itertools.islice(source, lines))
            target_lines = list(itertools.islice(target, lines))
            if len(source_lines) != len(target_lines):
                source_total = first - 1 + len(source_lines) + sum(1 for _ in source)
                target_total = first - 1 + len(target_lines) + sum(1 for _ in target)
                raise CorpusError(
                    f"line counts differ: {source_file} has {source_total} lines, "
                    f"{target_file} has {target_total}; the files must be line-aligned "
                    "translations"
                )
            if not source_lines:
                return
            data = (b"".join(source_lines), b"".join(target_lines))
            yield RawChunk("text", (source_file, target_file), first, data, errors)
            first += len(source_lines)


def tsv_chunks(path: str, lines: int, errors: str = "strict") -> Iterator[RawChunk]:
    """A `source<TAB>target` file in chunks of `lines` lines."""
    if not pathlib.Path(path).is_file():
        raise CorpusError(f"{path}: no such file")
    with open(path, "rb") as file:
        first = 1
        while chunk := list(itertools.islice(file, lines)):
            yield RawChunk("tsv", (path,), first, (b"".join(chunk),), errors)
            first += len(chunk)


def pair_chunks(
    name: str, splits: dict[str, Sequence[tuple[str, str]]], records: int, counts=None
) -> Iterator[RawChunk]:
    """Chunks of a dataset that has its own splits, split after split."""
    counts = tuple(sorted((counts or {}).items()))
    for split, pairs in splits.items():
        for start in range(0, len(pairs), records):
            chunk_pairs = list(pairs[start : start + records])
            yield RawChunk("pairs", (name,), start, (split, chunk_pairs), counts=counts)
            counts = ()


def parse_chunk(chunk: RawChunk) -> Corpus:
    """The pairs of one chunk by split, and what was filtered reading it (see `Corpus`)."""
    counts: collections.Counter = collections.Counter(dict(chunk.counts))
    if chunk.kind == "pairs":
        split, pairs = chunk.data
        return Corpus({name: list(pairs) if name == split else [] for name in SPLITS}, counts)
    if chunk.kind == "text":
        source_lines, target_lines = (
            decode_lines(data, where, chunk.errors, counts, first_line=chunk.first)
            for data, where in zip(chunk.data, chunk.where, strict=True)
        )
        return split_pairs(zip(source_lines, target_lines, strict=True), counts)
    pairs = []
    lines = decode_lines(
        chunk.data[0], chunk.where[0], chunk.errors, counts, first_line=chunk.first
    )
    for number, line in enumerate(lines, start=chunk.first):
        if not line.strip():
            counts["empty_line"] += 1
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise CorpusError(
                f"{chunk.where[0]}, line {number}: expected 'source<TAB>target', found "
                f"{len(fields)} tab-separated fields"
            )
        pairs.append((fields[0], fields[1]))
    return split_pairs(pairs, counts)


def merge(parts: Iterable[Corpus]) -> Corpus:
    """One corpus of parsed chunks, in order."""
    whole = Corpus({name: [] for name in SPLITS})
    for part in parts:
        for name, pairs in part.splits.items():
            whole.splits[name].extend(pairs)
        whole.filtered.update(part.filtered)
    return whole


def read_text_pair(source_file: str, target_file: str, encoding_errors: str = "strict") -> Corpus:
    """Line-aligned files: line i of one translates line i of the other (read whole)."""
    chunks = text_pair_chunks(source_file, target_file, WHOLE_FILE, encoding_errors)
    return merge(map(parse_chunk, chunks))


def read_tsv(path: str, encoding_errors: str = "strict") -> Corpus:
    """One `source<TAB>target` pair per line (read whole); a line without exactly one tab raises
    an error naming the file and line."""
    return merge(map(parse_chunk, tsv_chunks(path, WHOLE_FILE, encoding_errors)))
