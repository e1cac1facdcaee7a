"""Everything TFDS: the gettext catalogs as a TFDS dataset, reading any TFDS translation dataset
into a `Corpus`, and preparing (downloading and converting) one.

Reading goes through `data_source` on the array_record format, so it needs no TensorFlow.
Preparing WMT from its raw downloads does: `pip install -e '.[wmt]'`.
"""

from __future__ import annotations

import collections
import pathlib
import shutil
import sys
from collections.abc import Iterator

import tensorflow_datasets as tfds

from tfm.data import gettext_catalogs
from tfm.data.corpus import SPLITS, Corpus, CorpusError, RawChunk, merge, parse_chunk, split_pairs
from tfm.job import file_lock

# keys of the gettext dataset's metadata: what reading the catalogs filtered (stored with the
# prepared data instead of being recomputed from the catalogs), and which catalogs it was built
# from (a dataset of other catalogs is stale)
FILTERED_KEY = "filtered_while_reading"
CATALOGS_KEY = "catalogs_fingerprint"


class GettextTranslations(tfds.core.GeneratorBasedBuilder):
    """English -> X message pairs from the host's gettext `.mo` catalogs.

    Duplicated English texts are removed (first catalog in name order wins), plural forms,
    message contexts and multi-line messages handled as in `tfm.data.gettext_catalogs`, and the
    splits made by a hash of the English text (2% validation, 2% test). What was filtered, by
    reason, is stored in the dataset's metadata.
    """

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [
        tfds.core.BuilderConfig(name=f"en-{lang}", description=f"English -> {lang}")
        for lang in ("de", "fr", "es", "it", "nl", "pt", "ru", "ja", "zh_CN")
    ]

    def __init__(
        self, *, locale_dir: str | pathlib.Path = gettext_catalogs.DEFAULT_LOCALE_DIR, **kwargs
    ):
        self._locale_dir = pathlib.Path(locale_dir)
        super().__init__(**kwargs)

    @property
    def target_language(self) -> str:
        return self.builder_config.name.split("-", 1)[1]

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.__doc__,
            features=tfds.features.FeaturesDict(
                {"en": tfds.features.Text(), self.target_language: tfds.features.Text()}
            ),
            supervised_keys=("en", self.target_language),
            metadata=tfds.core.MetadataDict(),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # everything is on the machine already
        catalogs = gettext_catalogs.read_catalogs(self.target_language, self._locale_dir)
        corpus = split_pairs(catalogs.pairs, catalogs.filtered)
        self.info.metadata[FILTERED_KEY] = dict(corpus.filtered)
        self.info.metadata[CATALOGS_KEY] = gettext_catalogs.catalogs_fingerprint(
            self.target_language, self._locale_dir
        )
        return {split: self._generate_examples(pairs) for split, pairs in corpus.splits.items()}

    def _generate_examples(self, pairs):
        for index, (english, translated) in enumerate(pairs):
            yield index, {"en": english, self.target_language: translated}


def gettext_builder(
    target_language: str,
    data_dir: str | pathlib.Path,
    locale_dir: str | pathlib.Path = gettext_catalogs.DEFAULT_LOCALE_DIR,
) -> GettextTranslations:
    """The builder for `gettext:en-<target_language>`, writing array_record under data_dir."""
    return GettextTranslations(
        config=f"en-{target_language}",
        data_dir=str(data_dir),
        file_format="array_record",
        locale_dir=locale_dir,
    )


def read_records(
    records, source_language: str, target_language: str, dataset: str = "the dataset"
) -> list[tuple[str, str]]:
    """(source, target) strings from `{lang: text}` records (a TFDS data source or a part)."""
    pairs = []
    for record in records:
        missing = [lang for lang in (source_language, target_language) if lang not in record]
        if missing:
            raise CorpusError(
                f"{dataset}: its records have the languages {', '.join(sorted(record))}, not "
                f"{' or '.join(map(repr, missing))}; name two of them with --source_language "
                "and --target_language (tfds:NAME/xx-yy names them itself)"
            )
        source, target = record[source_language], record[target_language]
        pairs.append(
            (
                source.decode("utf-8") if isinstance(source, bytes) else str(source),
                target.decode("utf-8") if isinstance(target, bytes) else str(target),
            )
        )
    return pairs


def read_gettext(
    target_language: str,
    data_dir: str | pathlib.Path,
    locale_dir: str | pathlib.Path = gettext_catalogs.DEFAULT_LOCALE_DIR,
) -> Corpus:
    """The catalogs' pairs through their TFDS dataset, built under data_dir on first use and
    rebuilt when the catalogs changed since."""
    builder = _built_gettext(target_language, pathlib.Path(data_dir), locale_dir)
    data_sources = builder.as_data_source()
    missing = [split for split in SPLITS if split not in data_sources]
    if missing:
        raise CorpusError(
            f"gettext:en-{target_language} under {data_dir} has no {missing} split; delete "
            f"{builder.data_dir} and run again to rebuild it"
        )
    splits = {split: read_records(data_sources[split], "en", target_language) for split in SPLITS}
    filtered = collections.Counter(builder.info.metadata.get(FILTERED_KEY, {}))
    return Corpus(splits, filtered)


def _built_gettext(
    target_language: str, data_dir: pathlib.Path, locale_dir
) -> tfds.core.DatasetBuilder:
    """The gettext dataset's builder once its data is current, built (or rebuilt) under the
    data dir's lock: runs started together on a fresh data dir raced to rename the same
    directory and one died (FileExistsError)."""
    name = f"gettext:en-{target_language}"
    with file_lock.building(
        data_dir / f".build-gettext-en-{target_language}.lock", f"building {name} in {data_dir}"
    ):
        builder = gettext_builder(target_language, data_dir, locale_dir)
        if builder.is_prepared():
            current = gettext_catalogs.catalogs_fingerprint(target_language, locale_dir)
            if builder.info.metadata.get(CATALOGS_KEY) != current:
                print(
                    f"the catalogs under {locale_dir} changed since {builder.data_dir} was "
                    "built; rebuilding it",
                    file=sys.stderr,
                )
                shutil.rmtree(builder.data_dir)  # a derived cache: the catalogs are the data
                builder = gettext_builder(target_language, data_dir, locale_dir)
        builder.download_and_prepare()
    return builder


def _register_translation_datasets() -> None:
    """Import TFDS's translation builders (wmt14_translate, ...) so their names resolve."""
    import tensorflow_datasets.translate  # noqa: F401  (registers the builders)


def read_dataset(
    name: str,
    source_language: str,
    target_language: str,
    data_dir: str | pathlib.Path | None = None,
) -> Corpus:
    """Every split of a prepared TFDS translation dataset such as `wmt14_translate/de-en`."""
    chunks = dataset_chunks(name, source_language, target_language, data_dir, 1 << 62)
    return merge(map(parse_chunk, chunks))


def dataset_chunks(
    name: str,
    source_language: str,
    target_language: str,
    data_dir: str | pathlib.Path | None,
    records: int,
) -> Iterator[RawChunk]:
    """A prepared TFDS translation dataset in chunks of `records` records, split after split,
    read in bounded memory (random access into the array_record files)."""
    _register_translation_datasets()
    for split in SPLITS:
        try:
            source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
        except Exception as error:  # TFDS raises several types for "not prepared"
            raise CorpusError(
                f"TFDS dataset {name!r} (split {split!r}) is not prepared in array_record format "
                f"under {data_dir or '~/tensorflow_datasets'} ({type(error).__name__}: "
                f"{_first_line(error)}). Prepare it once with: pip install -e '.[wmt]' && "
                f"python -m tfm.data.prepare tfds:{name} --data_dir DIR"
            ) from error
        for start in range(0, len(source), records):
            part = (source[i] for i in range(start, min(start + records, len(source))))
            pairs = read_records(part, source_language, target_language, f"tfds:{name}")
            yield RawChunk("pairs", (name,), start, (split, pairs))


def _first_line(error: Exception, limit: int = 200) -> str:
    """An error's message cut to one line: TFDS's can list every dataset it knows."""
    lines = str(error).strip().splitlines()
    return lines[0][:limit] if lines else ""


def prepare_dataset(name: str, data_dir: str | pathlib.Path) -> None:
    """Download and convert a TFDS dataset to array_record (needs TensorFlow: the [wmt] extra)."""
    _register_translation_datasets()
    builder = tfds.builder(name, data_dir=str(data_dir), file_format="array_record")
    try:
        builder.download_and_prepare()
    except ImportError as error:
        raise CorpusError(
            f"preparing tfds:{name} needs TensorFlow: pip install -e '.[wmt]' ({error})"
        ) from error
    except OSError as error:  # requests' network errors are OSErrors too
        raise CorpusError(
            f"tfds:{name}: building it under {data_dir} failed ({type(error).__name__}: "
            f"{_first_line(error)}); TFDS downloads its sources: build it where they can be "
            "reached (or fix the cause) and run again (TFDS reuses the downloads it finished)"
        ) from error
