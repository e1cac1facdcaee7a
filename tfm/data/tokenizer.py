"""Text -> ids, once: one SentencePiece BPE vocabulary shared by source and target (section 5.1),
trained once on the training split and cached in the data dir under a key of corpus and
settings; `tokenize_split` fills the id cache (`tfm.data.id_cache`) from pairs in memory.

Special ids (`tfm.tokens`): 0 pad, 1 BOS, 2 EOS, 3 unk. Normalisation is the identity and bytes
fall back to byte pieces, so decode(encode(text)) == text for any text.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import pathlib
import re
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from tfm.data import id_cache
from tfm.data.corpus import CorpusError, fingerprint
from tfm.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

TRAINER_SETTINGS = dict(
    model_type="bpe",
    character_coverage=0.9995,
    byte_fallback=True,
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    split_digits=True,
    pad_id=PAD_ID,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
    unk_id=UNK_ID,
    input_sentence_size=2_000_000,  # a uniform sample of 1M pairs: memory flat beyond that
    shuffle_input_sentence=True,
    max_sentence_length=16_384,
    hard_vocab_limit=False,
    num_threads=2,  # fixed: SentencePiece's merges depend on it, the vocabulary must not
)


class Tokenizer:
    """Text <-> ids with a trained SentencePiece model."""

    def __init__(self, model_path: str | pathlib.Path):
        self.path = pathlib.Path(model_path)
        if not self.path.is_file():
            raise FileNotFoundError(
                f"{self.path}: no SentencePiece model; run "
                "`python -m tfm.data.prepare SPEC --data_dir DIR` first"
            )
        try:
            self._processor = spm.SentencePieceProcessor(model_file=str(self.path))
        except (OSError, RuntimeError) as error:
            raise ValueError(
                f"{self.path}: not a readable SentencePiece model ({error}); delete "
                "it and prepare again"
            ) from error
        if self._processor.pad_id() != PAD_ID or self._processor.eos_id() != EOS_ID:
            raise ValueError(
                f"{self.path}: special ids differ from tfm's (pad 0, bos 1, eos 2, "
                "unk 3); it was not trained by tfm"
            )

    @property
    def vocab_size(self) -> int:
        return self._processor.get_piece_size()

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the model file: ids made with another vocabulary never match it."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, without BOS/EOS."""
        return self._processor.encode(text)

    def encode_batch(self, texts: Sequence[str], threads: int = 2) -> list[list[int]]:
        return self._processor.encode(list(texts), num_threads=threads)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, stopping at the first EOS and ignoring pad and BOS."""
        kept = []
        for token in np.asarray(list(ids)).tolist():
            if token == EOS_ID:
                break
            if token not in (PAD_ID, BOS_ID):
                kept.append(token)
        return self._processor.decode(kept)

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self._processor.id_to_piece(int(i)) for i in ids]


def settings_key(train_fingerprint: str, vocab_size: int) -> str:
    """Cache key of a vocabulary: the content of its training text, its size and the trainer
    settings."""
    blob = json.dumps(
        dict(corpus=train_fingerprint, vocab_size=vocab_size, **TRAINER_SETTINGS), sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def vocabulary_path(
    data_dir: str | pathlib.Path, corpus_slug: str, vocab_size: int, train_fingerprint: str
) -> pathlib.Path:
    """Where the vocabulary for this training text and size is cached (named for people by the
    corpus, keyed for safety by the content)."""
    key = settings_key(train_fingerprint, vocab_size)
    return pathlib.Path(data_dir) / "vocab" / f"{corpus_slug}-{vocab_size}-{key}.model"


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    model_path: str | pathlib.Path,
    seed_sentencepiece_size: int = 1_000_000,
) -> Tokenizer:
    """Train a BPE model on `texts` (both languages) and write it atomically to model_path."""
    model_path = pathlib.Path(model_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=(text for text in texts if text),
            model_writer=buffer,
            vocab_size=vocab_size,
            seed_sentencepiece_size=seed_sentencepiece_size,
            minloglevel=2,
            **TRAINER_SETTINGS,
        )
    except RuntimeError as error:
        needed = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(error))
        if needed:
            raise CorpusError(
                f"vocab_size={vocab_size} is smaller than the {needed.group(1)} distinct "
                "characters the training text needs; raise vocab_size (--vocab_size or "
                "--config.vocab_size) well above that"
            ) from None
        raise CorpusError(f"SentencePiece could not train a vocabulary: {error}") from None
    partial = model_path.with_suffix(f".{os.getpid()}.partial")  # per process: several may train
    partial.write_bytes(buffer.getvalue())
    partial.replace(model_path)
    return Tokenizer(model_path)


def load_or_train(
    train_pairs: Sequence[tuple[str, str]],
    corpus_slug: str,
    vocab_size: int,
    data_dir: str | pathlib.Path,
    train_fingerprint: str | None = None,
) -> Tokenizer:
    """The cached vocabulary for these training pairs and size, trained on them if absent.
    `train_fingerprint` (`tfm.data.corpus.fingerprint` of the pairs) is computed if not given."""
    train_fingerprint = train_fingerprint or fingerprint(train_pairs)
    path = vocabulary_path(data_dir, corpus_slug, vocab_size, train_fingerprint)
    if path.is_file():
        return Tokenizer(path)
    texts = (text for pair in train_pairs for text in pair)
    return train_tokenizer(texts, vocab_size, path)


def encode_pairs(
    tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]], threads: int = 2
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """ "src" and "tgt" -> (every pair's ids, concatenated as the vocabulary's `id_dtype`, and
    `[pairs]` int32 lengths): what each id cache stores of a list of pairs."""
    dtype = id_cache.id_dtype(tokenizer.vocab_size)
    return {
        side: id_cache.flatten(tokenizer.encode_batch(texts, threads=threads), dtype)
        for side, texts in (("src", [s for s, _ in pairs]), ("tgt", [t for _, t in pairs]))
    }


def tokenize_split(
    pairs: Sequence[tuple[str, str]],
    tokenizer,
    cache_path: str | pathlib.Path,
    key: str = "",
    keep_texts: bool = False,
) -> id_cache.TokenizedSplit:
    """Ids of `pairs` (held in memory), computed once and cached at `cache_path` (see
    `tfm.data.id_cache`); a cache with another `key`, or that does not hold exactly len(pairs)
    pairs, is rebuilt. `tfm.data.prepare` builds large corpora in chunks instead."""
    cached = id_cache.read(cache_path, key, len(pairs))
    if cached is not None:
        return cached
    arrays = {}
    for side, (flat, lengths) in encode_pairs(tokenizer, pairs).items():
        arrays[f"{side}_ids"] = flat
        arrays[f"{side}_offsets"] = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    return id_cache.write(cache_path, arrays, key, pairs if keep_texts else None)


def ids_key(tokenizer: Tokenizer, split_fingerprint: str) -> str:
    """What a split's ids depend on: the vocabulary file and the split's text."""
    return hashlib.sha256(f"{tokenizer.fingerprint}:{split_fingerprint}".encode()).hexdigest()[:16]
