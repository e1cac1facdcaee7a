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


def _decode_lines(
    path: pathlib.Path, errors: str, counts: collections.Counter | None = None
) -> list[str]:
    """UTF-8 lines without line ends; a BOM is dropped and CRLF accepted. Invalid UTF-8 raises
    CorpusError naming file and line, unless `errors="replace"`, which substitutes U+FFFD and
    counts the lines it changed in `counts["lines_with_invalid_utf8_replaced"]`."""
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    lines = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                if errors != "replace":
                    raise CorpusError(
                        f"{path}, line {number}: invalid UTF-8 at byte {error.start} "
                        f"({raw[max(0, error.start - 10) : error.start + 10]!r}); fix the file "
                        "or pass encoding_errors='replace' to substitute U+FFFD"
                    ) from None
                text = raw.decode("utf-8", errors="replace")
                if counts is not None:
                    counts["lines_with_invalid_utf8_replaced"] += 1
            if number == 1 and text.startswith("\ufeff"):
                text = text[1:]
            lines.append(text.rstrip("\r\n"))
    return lines


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
