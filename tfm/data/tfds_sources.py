"""TFDS: the gettext catalogs as a TFDS dataset, and reading any TFDS translation dataset.

Both are served from the array_record format through `data_source`, so nothing here needs
TensorFlow. (Preparing WMT from its raw downloads does need it: `pip install -e '.[wmt]'`.)
"""

from __future__ import annotations

import pathlib

import tensorflow_datasets as tfds

from tfm.data import gettext_catalogs, sources


class GettextTranslations(tfds.core.GeneratorBasedBuilder):
    """English -> X message pairs from the host's gettext `.mo` catalogs.

    Duplicated English texts are removed (first catalog in name order wins), plural forms,
    message contexts and multi-line messages handled as in `tfm.data.gettext_catalogs`, and the
    splits made by a hash of the English text (2% validation, 2% test).
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
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # everything is on the machine already
        corpus = sources.read_gettext(self.target_language, self._locale_dir)
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


def register_translation_datasets() -> None:
    """Import TFDS's translation builders (wmt14_translate, ...) so their names resolve."""
    import tensorflow_datasets.translate  # noqa: F401  (registers the builders)


def read_data_source(
    data_source, source_language: str, target_language: str
) -> list[tuple[str, str]]:
    """(source, target) strings from one split of a TFDS data source of `{lang: text}` records."""
    pairs = []
    for record in data_source:
        source, target = record[source_language], record[target_language]
        pairs.append(
            (
                source.decode("utf-8") if isinstance(source, bytes) else str(source),
                target.decode("utf-8") if isinstance(target, bytes) else str(target),
            )
        )
    return pairs
