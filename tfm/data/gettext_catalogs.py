"""Reading the host's gettext translation catalogs (`.mo` files) as English -> X sentence pairs.

The embedded default corpus: the software on the machine ships translations of its messages
under `/usr/share/locale/<lang>/LC_MESSAGES/*.mo` (English msgid -> translated msgstr).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import pathlib
import re
import struct

DEFAULT_LOCALE_DIR = pathlib.Path("/usr/share/locale")
_CONTEXT_SEPARATOR = "\x04"


@dataclasses.dataclass(frozen=True)
class CatalogEntry:
    """One message of a `.mo` file: optional context, singular/plural msgid, translations."""

    context: str | None
    msgid: str
    msgid_plural: str | None
    msgstrs: tuple[str, ...]


class CatalogError(ValueError):
    """A `.mo` file that cannot be read; the message names the file."""


def _charset(header: str) -> str:
    match = re.search(r"charset=([\w.-]+)", header)
    return match.group(1) if match else "utf-8"


def read_mo(path: str | pathlib.Path) -> list[CatalogEntry]:
    """Parse a GNU `.mo` file (either byte order) into its entries, header excluded.

    Raises CatalogError naming the file when it is truncated or not a `.mo` file.
    """
    path = pathlib.Path(path)
    data = path.read_bytes()
    if len(data) < 20:
        raise CatalogError(f"{path}: too short to be a gettext .mo file ({len(data)} bytes)")
    magic = struct.unpack("<I", data[:4])[0]
    if magic == 0x950412DE:
        order = "<"
    elif magic == 0xDE120495:
        order = ">"
    else:
        raise CatalogError(f"{path}: not a gettext .mo file (magic {magic:#x})")
    _, count, originals_at, translations_at = struct.unpack(order + "4I", data[4:20])

    def string_at(table: int, index: int) -> bytes:
        length, offset = struct.unpack(
            order + "2I", data[table + 8 * index : table + 8 * index + 8]
        )
        if offset + length > len(data):
            raise CatalogError(f"{path}: string {index} runs past the end of the file")
        return data[offset : offset + length]

    # gettext stores each string once, so all strings together fit in the file; entries that
    # share bytes would make the decoded text grow with the square of the file size
    budget = 2 * len(data)
    raw = []
    try:
        for i in range(count):
            pair = (string_at(originals_at, i), string_at(translations_at, i))
            budget -= len(pair[0]) + len(pair[1])
            if budget < 0:
                raise CatalogError(
                    f"{path}: its {count} entries reference more than twice the file's "
                    f"{len(data)} bytes; overlapping strings, not a catalog msgfmt writes"
                )
            raw.append(pair)
    except struct.error as error:
        raise CatalogError(f"{path}: truncated string table ({error})") from None
    charset = "utf-8"
    for original, translation in raw:
        if original == b"":
            charset = _charset(translation.decode("ascii", errors="replace"))
    entries = []
    for original, translation in raw:
        if original == b"":
            continue
        try:
            source = original.decode(charset)
            target = translation.decode(charset)
        except (UnicodeDecodeError, LookupError):
            source = original.decode("utf-8", errors="replace")
            target = translation.decode("utf-8", errors="replace")
        context = None
        if _CONTEXT_SEPARATOR in source:
            context, source = source.split(_CONTEXT_SEPARATOR, 1)
        msgid, _, plural = source.partition("\x00")
        entries.append(CatalogEntry(context, msgid, plural or None, tuple(target.split("\x00"))))
    return entries


def _normalise(text: str) -> str:
    """One line, single spaces: catalogs wrap long messages and pad them with spaces."""
    return " ".join(text.split())


def entry_pairs(entry: CatalogEntry) -> list[tuple[str, str]]:
    """The (English, translation) pairs of one entry.

    Singular msgid -> msgstr[0]; a plural msgid -> the last plural form (the "many" form).
    Multi-line messages whose two sides have the same number of non-empty lines become one pair
    per line (aligned line by line); otherwise the lines are joined with spaces. Pairs with an
    empty side are dropped here and counted by the caller.
    """
    candidates = [(entry.msgid, entry.msgstrs[0] if entry.msgstrs else "")]
    if entry.msgid_plural is not None and len(entry.msgstrs) > 1:
        candidates.append((entry.msgid_plural, entry.msgstrs[-1]))
    pairs = []
    for source, target in candidates:
        source_lines = [line for line in source.splitlines() if line.strip()]
        target_lines = [line for line in target.splitlines() if line.strip()]
        if len(source_lines) > 1 and len(source_lines) == len(target_lines):
            pairs.extend(
                zip(map(_normalise, source_lines), map(_normalise, target_lines), strict=True)
            )
        else:
            pairs.append((_normalise(source), _normalise(target)))
    return pairs


@dataclasses.dataclass
class CatalogCorpus:
    """Deduplicated pairs from all catalogs of one language and what was filtered, by reason."""

    pairs: list[tuple[str, str]]
    filtered: collections.Counter
    files: int
    entries: int


def catalog_files(language: str, locale_dir: str | pathlib.Path = DEFAULT_LOCALE_DIR):
    """`<locale_dir>/<language>/LC_MESSAGES/*.mo`, in name order."""
    folder = pathlib.Path(locale_dir) / language / "LC_MESSAGES"
    return sorted(folder.glob("*.mo")) if folder.is_dir() else []


def catalogs_fingerprint(language: str, locale_dir: str | pathlib.Path = DEFAULT_LOCALE_DIR) -> str:
    """SHA-256 of the catalogs' names and bytes: a dataset built from them is stale when it
    changes (a package installed, updated or removed)."""
    digest = hashlib.sha256()
    for path in catalog_files(language, locale_dir):
        digest.update(path.name.encode() + b"\0")
        try:
            digest.update(path.read_bytes() if path.is_file() else b"<not a regular file>")
        except OSError as error:
            digest.update(f"<unreadable: {error.errno}>".encode())
    return digest.hexdigest()


def read_catalogs(
    language: str, locale_dir: str | pathlib.Path = DEFAULT_LOCALE_DIR
) -> CatalogCorpus:
    """All (English, `language`) pairs from `<locale_dir>/<language>/LC_MESSAGES/*.mo`.

    Files are read in name order and the first translation of each English text wins, so the
    result is deterministic. Unreadable files are skipped and counted.
    """
    folder = pathlib.Path(locale_dir) / language / "LC_MESSAGES"
    files = catalog_files(language, locale_dir)
    if not files:
        raise FileNotFoundError(
            f"no gettext catalogs (*.mo) under {folder}: this machine ships no '{language}' "
            "translations. Use another source, e.g. --config.dataset=text:train.en,train."
            f"{language} or tfds:wmt14_translate/de-en (see README, 'Data')"
        )
    filtered: collections.Counter = collections.Counter()
    seen: dict[str, str] = {}
    entries = 0
    for path in files:
        try:
            if not path.is_file():  # a directory or a broken symlink named *.mo
                raise CatalogError(f"{path}: not a regular file")
            catalog = read_mo(path)
        except (CatalogError, OSError):
            filtered["unreadable_file"] += 1
            continue
        for entry in catalog:
            entries += 1
            if not any(entry.msgstrs):
                filtered["untranslated"] += 1
                continue
            for source, target in entry_pairs(entry):
                if not source or not target:
                    filtered["empty_side"] += 1
                elif source in seen:
                    filtered["duplicate_source"] += 1
                else:
                    seen[source] = target
    return CatalogCorpus(
        pairs=list(seen.items()), filtered=filtered, files=len(files), entries=entries
    )
