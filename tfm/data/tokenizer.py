"""Text -> ids, once: one SentencePiece BPE vocabulary shared by source and target (section 5.1),
trained once on the training split and cached in the data dir under a key of corpus and
settings, and the id cache that holds every split's token ids (`TokenizedSplit`).

Special ids (`tfm.tokens`): 0 pad, 1 BOS, 2 EOS, 3 unk. Normalisation is the identity and bytes
fall back to byte pieces, so decode(encode(text)) == text for any text.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

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
    input_sentence_size=4_000_000,
    shuffle_input_sentence=True,
    max_sentence_length=16_384,
    hard_vocab_limit=False,
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

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._processor.encode(list(texts), num_threads=2)

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
            num_threads=2,
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
    partial = model_path.with_suffix(f".{os.getpid()}.partial")  # per process: see tokenize_split
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


@dataclasses.dataclass
class TokenizedSplit:
    """Ids of one split, flat: pair i's source is src_ids[src_offsets[i]:src_offsets[i+1]]
    (EOS not included)."""

    src_ids: np.ndarray
    src_offsets: np.ndarray
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def source(self, i: int) -> np.ndarray:
        return self.src_ids[self.src_offsets[i] : self.src_offsets[i + 1]]

    def target(self, i: int) -> np.ndarray:
        return self.tgt_ids[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]

    @property
    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)


def _flatten(sequences: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(sequences) + 1, np.int64)
    offsets[1:] = np.cumsum([len(s) for s in sequences])
    flat = np.fromiter((t for s in sequences for t in s), np.int32, count=int(offsets[-1]))
    return flat, offsets


ID_ARRAYS = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every id of the vocabulary."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def tokenize_split(
    pairs: Sequence[tuple[str, str]],
    tokenizer,
    cache_path: str | pathlib.Path,
    key: str = "",
) -> TokenizedSplit:
    """Ids of `pairs`, computed once and cached at `cache_path` for later epochs and runs.

    The cache is a directory of `.npy` files (ids as `id_dtype`, offsets as int64) plus
    `meta.json`, read back memory-mapped: every process on a host shares one copy through the
    page cache and touches only the rows its batches use. `key` names what the ids were built
    from (see `ids_key`); a cache with another key, or that does not hold exactly len(pairs)
    pairs, is rebuilt.
    """
    cache_path = pathlib.Path(cache_path)
    cached = _read_cache(cache_path, key, len(pairs))
    if cached is not None:
        return cached
    src_flat, src_offsets = _flatten(tokenizer.encode_batch([s for s, _ in pairs]))
    tgt_flat, tgt_offsets = _flatten(tokenizer.encode_batch([t for _, t in pairs]))
    dtype = id_dtype(tokenizer.vocab_size)
    arrays = dict(
        src_ids=src_flat.astype(dtype),
        src_offsets=src_offsets,
        tgt_ids=tgt_flat.astype(dtype),
        tgt_offsets=tgt_offsets,
    )
    _write_cache(cache_path, arrays, dict(key=key, pairs=len(pairs), dtype=dtype.name))
    return _read_cache(cache_path, key, len(pairs)) or TokenizedSplit(**arrays)


def _read_cache(path: pathlib.Path, key: str, pairs: int) -> TokenizedSplit | None:
    """The memory-mapped split at `path`, or None if absent, unreadable or for other pairs."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        if meta.get("key") != key or meta.get("pairs") != pairs:
            return None
        split = TokenizedSplit(*(np.load(path / f"{n}.npy", mmap_mode="r") for n in ID_ARRAYS))
    except (OSError, ValueError, KeyError):
        return None
    return split if len(split) == pairs else None


def _write_cache(path: pathlib.Path, arrays: dict, meta: dict) -> None:
    """Write the cache under a per-process name, then rename it into place: processes of a
    multi-host job build the same cache at once, and a reader never sees a half-written one."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name, array in arrays.items():
        np.save(partial / f"{name}.npy", array)
    (partial / "meta.json").write_text(json.dumps(meta))  # written last: marks it complete
    if path.exists():  # a stale or damaged cache under this name
        shutil.rmtree(path, ignore_errors=True)
    try:
        partial.rename(path)
    except OSError:  # another process renamed its identical copy first
        shutil.rmtree(partial, ignore_errors=True)


def ids_key(tokenizer: Tokenizer, split_fingerprint: str) -> str:
    """What a split's ids depend on: the vocabulary file and the split's text."""
    return hashlib.sha256(f"{tokenizer.fingerprint}:{split_fingerprint}".encode()).hexdigest()[:16]
