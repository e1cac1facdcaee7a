"""Spec strings -> parallel corpora: the one entry point that picks a reader for a dataset name.

Specs:
  tfds:NAME                 a TFDS translation dataset, e.g. tfds:wmt14_translate/de-en, read with
                            `tfds.data_source` (array_record; no TensorFlow needed to read).
  gettext:en-de             the host's gettext catalogs as a TFDS dataset (the embedded default).
  text:SRC_FILE,TGT_FILE    line-aligned UTF-8 files.
  tsv:FILE                  one "source<TAB>target" pair per line.

Directions default to the paper's: English is the source (En->De, En->Fr). Readers live in
`tfm.data.corpus` (plain files) and `tfm.data.tfds_sources` (everything TFDS).
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
from collections.abc import Iterator

from tfm.data import corpus as plain
from tfm.data import gettext_catalogs
from tfm.data.corpus import Corpus, RawChunk


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """A parsed spec string: kind, its argument, and the language direction."""

    kind: str
    argument: str
    source_language: str
    target_language: str

    @property
    def name(self) -> str:
        """The spec as written: `kind:argument`."""
        return f"{self.kind}:{self.argument}"

    @property
    def slug(self) -> str:
        """A file-name-safe identifier, used to key caches in the data dir."""
        digest = hashlib.sha256(self.name.encode()).hexdigest()[:10]
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


def load_corpus(
    spec: SourceSpec,
    data_dir: str | pathlib.Path | None = None,
    locale_dir: str | pathlib.Path = gettext_catalogs.DEFAULT_LOCALE_DIR,
    encoding_errors: str = "strict",
) -> Corpus:
    """Every split of the corpus named by `spec`. The gettext dataset is built on first use; a
    TFDS dataset such as WMT must have been prepared once (see README, 'Data')."""
    if spec.kind == "text":
        source_file, target_file = spec.argument.split(",")
        return plain.read_text_pair(source_file, target_file, encoding_errors)
    if spec.kind == "tsv":
        return plain.read_tsv(spec.argument, encoding_errors)

    from tfm.data import tfds_sources  # imports TFDS: only for the kinds that need it

    if spec.kind == "gettext":
        return tfds_sources.read_gettext(spec.target_language, data_dir, locale_dir)
    return tfds_sources.read_dataset(
        spec.argument, spec.source_language, spec.target_language, data_dir
    )


def corpus_chunks(
    spec: SourceSpec,
    data_dir: str | pathlib.Path | None,
    records: int,
    locale_dir: str | pathlib.Path = gettext_catalogs.DEFAULT_LOCALE_DIR,
    encoding_errors: str = "strict",
) -> Iterator[RawChunk]:
    """The corpus named by `spec` as chunks of `records` lines or records, in a fixed order (the
    same chunks on every call): what `tfm.data.prepare` streams through worker processes."""
    if spec.kind == "text":
        source_file, target_file = spec.argument.split(",")
        yield from plain.text_pair_chunks(source_file, target_file, records, encoding_errors)
        return
    if spec.kind == "tsv":
        yield from plain.tsv_chunks(spec.argument, records, encoding_errors)
        return

    from tfm.data import tfds_sources

    if spec.kind == "gettext":  # a few thousand messages: read whole, served in chunks
        corpus = tfds_sources.read_gettext(spec.target_language, data_dir, locale_dir)
        yield from plain.pair_chunks(spec.name, corpus.splits, records, corpus.filtered)
        return
    yield from tfds_sources.dataset_chunks(
        spec.argument, spec.source_language, spec.target_language, data_dir, records
    )
