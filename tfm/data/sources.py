"""Parallel corpora named by one spec string, each giving (source, target) text pairs per split.

Specs:
  tfds:NAME                 a TFDS translation dataset, e.g. tfds:wmt14_translate/de-en, read with
                            `tfds.data_source` (array_record; no TensorFlow needed to read).
  gettext:en-de             the host's gettext catalogs as a TFDS dataset (the embedded default).
  text:SRC_FILE,TGT_FILE    line-aligned UTF-8 files.
  tsv:FILE                  one "source<TAB>target" pair per line.

Directions default to the paper's: English is the source (En->De, En->Fr). Local files and the
catalogs have no official splits; they are split by a hash of the source text (2% validation,
2% test), so a sentence lands in the same split on every machine and every run.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import pathlib

from tfm.data import gettext_catalogs

SPLITS = ("train", "validation", "test")
HELD_OUT_PERCENT = 2


class CorpusError(ValueError):
    """Bad input in a corpus; the message names the file, the line and what to do."""


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """A parsed spec string: kind, its argument, and the language direction."""

    kind: str
    argument: str
    source_language: str
    target_language: str

    @property
    def slug(self) -> str:
        """A file-name-safe identifier, used to key caches in the data dir."""
        digest = hashlib.sha256(f"{self.kind}:{self.argument}".encode()).hexdigest()[:10]
        stem = self.argument.replace("/", "_").replace(",", "_").split(".")[0][-40:]
        stem = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in stem)
        return f"{self.kind}-{stem}-{self.source_language}{self.target_language}-{digest}"


def parse_spec(
    spec: str, source_language: str | None = None, target_language: str | None = None
) -> SourceSpec:
    """Parse `kind:argument`; the direction defaults to English -> the other language."""
    kind, sep, argument = spec.partition(":")
    if not sep or not argument:
        raise ValueError(
            f"dataset spec {spec!r} must look like tfds:NAME, gettext:en-de, "
            "text:SRC_FILE,TGT_FILE or tsv:FILE"
        )
    if kind == "gettext":
        languages = argument.split("-")
        if len(languages) != 2 or languages[0] != "en":
            raise ValueError(
                f"dataset spec {spec!r}: gettext catalogs translate from English; "
                "use gettext:en-XX, e.g. gettext:en-de"
            )
        pair = ("en", languages[1])
    elif kind == "tfds":
        config = argument.split("/")[-1]
        languages = config.split("-") if "-" in config else ["src", "tgt"]
        other = [lang for lang in languages if lang != "en"]
        pair = ("en", other[0]) if "en" in languages and other else tuple(languages[:2])
    elif kind == "text":
        if len(argument.split(",")) != 2:
            raise ValueError(f"dataset spec {spec!r}: text needs two files, text:SRC_FILE,TGT_FILE")
        pair = ("src", "tgt")
    elif kind == "tsv":
        pair = ("src", "tgt")
    else:
        raise ValueError(
            f"dataset spec {spec!r}: unknown kind {kind!r}; expected tfds, gettext, text or tsv"
        )
    return SourceSpec(kind, argument, source_language or pair[0], target_language or pair[1])


def split_of(source_text: str) -> str:
    """Deterministic split of a pair by the SHA-256 of its source text."""
    bucket = int.from_bytes(hashlib.sha256(source_text.encode("utf-8")).digest()[:8], "big") % 100
    if bucket < HELD_OUT_PERCENT:
        return "validation"
    if bucket < 2 * HELD_OUT_PERCENT:
        return "test"
    return "train"


@dataclasses.dataclass
class Corpus:
    """Pairs of every split and the count of pairs filtered, by reason."""

    splits: dict[str, list[tuple[str, str]]]
    filtered: collections.Counter = dataclasses.field(default_factory=collections.Counter)


def _decode_lines(path: pathlib.Path, errors: str) -> list[str]:
    """UTF-8 lines without line ends; a BOM is dropped and CRLF accepted. Invalid UTF-8 raises
    CorpusError naming file and line, unless `errors="replace"`."""
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    lines = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8", errors=errors)
            except UnicodeDecodeError as error:
                raise CorpusError(
                    f"{path}, line {number}: invalid UTF-8 at byte {error.start} "
                    f"({raw[max(0, error.start - 10) : error.start + 10]!r}); fix the file or "
                    "pass encoding_errors='replace' to substitute U+FFFD"
                ) from None
            if number == 1 and text.startswith("\ufeff"):
                text = text[1:]
            lines.append(text.rstrip("\r\n"))
    return lines


def _split_pairs(pairs, filtered: collections.Counter) -> Corpus:
    """Skip pairs with an empty side (counted), and split the rest by hash."""
    splits: dict[str, list[tuple[str, str]]] = {name: [] for name in SPLITS}
    for source, target in pairs:
        source, target = source.strip(), target.strip()
        if not source or not target:
            filtered["empty_side"] += 1
            continue
        splits[split_of(source)].append((source, target))
    return Corpus(splits, filtered)


def read_text_pair(source_file: str, target_file: str, encoding_errors: str = "strict") -> Corpus:
    """Line-aligned files: line i of one translates line i of the other."""
    source_lines = _decode_lines(pathlib.Path(source_file), encoding_errors)
    target_lines = _decode_lines(pathlib.Path(target_file), encoding_errors)
    if len(source_lines) != len(target_lines):
        raise CorpusError(
            f"line counts differ: {source_file} has {len(source_lines)} lines, {target_file} has "
            f"{len(target_lines)}; the files must be line-aligned translations"
        )
    return _split_pairs(zip(source_lines, target_lines, strict=True), collections.Counter())


def read_tsv(path: str, encoding_errors: str = "strict") -> Corpus:
    """One `source<TAB>target` pair per line; a line without exactly one tab raises an error
    naming the file and line."""
    pairs = []
    filtered: collections.Counter = collections.Counter()
    for number, line in enumerate(_decode_lines(pathlib.Path(path), encoding_errors), start=1):
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
    return _split_pairs(pairs, filtered)


def read_gettext(
    target_language: str, locale_dir: str | pathlib.Path = gettext_catalogs.DEFAULT_LOCALE_DIR
) -> Corpus:
    """The host's catalogs, deduplicated, split by hash."""
    catalogs = gettext_catalogs.read_catalogs(target_language, locale_dir)
    corpus = _split_pairs(catalogs.pairs, catalogs.filtered)
    return corpus


def load_corpus(
    spec: SourceSpec,
    data_dir: str | pathlib.Path | None = None,
    locale_dir: str | pathlib.Path = gettext_catalogs.DEFAULT_LOCALE_DIR,
    encoding_errors: str = "strict",
) -> Corpus:
    """Every split of the corpus named by `spec` (TFDS datasets are prepared if needed for
    gettext; WMT must have been prepared once, see README)."""
    if spec.kind == "text":
        source_file, target_file = spec.argument.split(",")
        return read_text_pair(source_file, target_file, encoding_errors)
    if spec.kind == "tsv":
        return read_tsv(spec.argument, encoding_errors)

    import tensorflow_datasets as tfds

    from tfm.data import tfds_sources

    if spec.kind == "gettext":
        builder = tfds_sources.gettext_builder(spec.target_language, data_dir, locale_dir)
        builder.download_and_prepare()
        data_sources = builder.as_data_source()
        # the builder stores pairs only; re-reading the catalogs (well under a second) recovers
        # what was filtered and why, for the prepare summary
        filtered = gettext_catalogs.read_catalogs(spec.target_language, locale_dir).filtered

        def split_source(split):
            if split not in data_sources:
                raise CorpusError(f"gettext:{spec.argument} has no {split!r} split")
            return data_sources[split]
    else:
        filtered = collections.Counter()
        tfds_sources.register_translation_datasets()

        def split_source(split):
            try:
                return tfds.data_source(
                    spec.argument, split=split, data_dir=data_dir, download=False
                )
            except Exception as error:  # TFDS raises several types for "not prepared"
                raise CorpusError(
                    f"TFDS dataset {spec.argument!r} (split {split!r}) is not prepared in "
                    f"array_record format under {data_dir or '~/tensorflow_datasets'} "
                    f"({type(error).__name__}: {str(error)[:200]}). Prepare it once with: "
                    "pip install -e '.[wmt]' && python -m tfm.data.prepare "
                    f"tfds:{spec.argument} --data_dir DIR"
                ) from error

    splits = {
        split: tfds_sources.read_data_source(
            split_source(split), spec.source_language, spec.target_language
        )
        for split in SPLITS
    }
    return Corpus(splits, filtered)
