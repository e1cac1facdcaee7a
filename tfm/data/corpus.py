"""Plain parallel corpora: the `Corpus` record (pairs per split, filter counts), the hash split,
and the readers of line-aligned text files and `source<TAB>target` files.

Local files have no official splits; they are split by a hash of the source text (2% validation,
2% test), so a sentence lands in the same split on every machine and every run.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import pathlib
from collections.abc import Iterable

SPLITS = ("train", "validation", "test")
HELD_OUT_PERCENT = 2


class CorpusError(ValueError):
    """Bad input in a corpus; the message names the file, the line and what to do."""


@dataclasses.dataclass
class Corpus:
    """Pairs of every split, and counts by reason of what reading dropped or changed (pairs
    with an empty side, lines whose invalid UTF-8 was replaced, ...)."""

    splits: dict[str, list[tuple[str, str]]]
    filtered: collections.Counter = dataclasses.field(default_factory=collections.Counter)


def fingerprint(pairs: Iterable[tuple[str, str]]) -> str:
    """SHA-256 of a list of pairs' text, in order: what caches built from them are keyed by, so
    an edited corpus never reuses them."""
    digest = hashlib.sha256()
    for source, target in pairs:
        for text in (source, target):
            data = text.encode("utf-8")
            digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


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
    remedy: str = "pass encoding_errors='replace' to substitute U+FFFD",
) -> list[str]:
    """UTF-8 lines of `data`, split on LF only: a CR before the LF ends a CRLF line, a CR inside
    a line belongs to it; a BOM is dropped. Invalid UTF-8 raises CorpusError naming `where` and
    the line (and `remedy`), unless `errors="replace"`, which substitutes U+FFFD and counts the
    lines it changed in `counts["lines_with_invalid_utf8_replaced"]`."""
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the newline that ends the last line
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
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
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
    return lines


def _decode_lines(
    path: pathlib.Path, errors: str, counts: collections.Counter | None = None
) -> list[str]:
    """`decode_lines` of a file that must exist."""
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    return decode_lines(path.read_bytes(), str(path), errors, counts)


def read_text_pair(source_file: str, target_file: str, encoding_errors: str = "strict") -> Corpus:
    """Line-aligned files: line i of one translates line i of the other."""
    counts: collections.Counter = collections.Counter()
    source_lines = _decode_lines(pathlib.Path(source_file), encoding_errors, counts)
    target_lines = _decode_lines(pathlib.Path(target_file), encoding_errors, counts)
    if len(source_lines) != len(target_lines):
        raise CorpusError(
            f"line counts differ: {source_file} has {len(source_lines)} lines, {target_file} has "
            f"{len(target_lines)}; the files must be line-aligned translations"
        )
    return split_pairs(zip(source_lines, target_lines, strict=True), counts)


def read_tsv(path: str, encoding_errors: str = "strict") -> Corpus:
    """One `source<TAB>target` pair per line; a line without exactly one tab raises an error
    naming the file and line."""
    pairs = []
    filtered: collections.Counter = collections.Counter()
    lines = _decode_lines(pathlib.Path(path), encoding_errors, filtered)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            filtered["empty_line"] += 1
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise CorpusError(
                f"{path}, line {number}: expected 'source<TAB>target', found "
                f"{len(fields)} tab-separated fields"
            )
        pairs.append((fields[0], fields[1]))
    return split_pairs(pairs, filtered)
