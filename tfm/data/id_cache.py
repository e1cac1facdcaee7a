"""The id cache: every split's token ids on disk, compact and memory-mapped, built in resumable
chunks.

A split's cache is a directory of `.npy` files (ids as `id_dtype`, offsets as int64) and
`meta.json`, written last and renamed into place, so a reader never sees a half-written one.
Read back memory-mapped: all processes on a host share one copy through the page cache
and each touches only the rows its batches use. Held-out splits also keep their text
(`texts.json`), which translation and scoring need.

Building at scale goes through `ChunkStore`: the ids of each chunk of the corpus (all splits) are
written to their own file as they are computed, so an interrupted prepare continues where it
stopped, and `ChunkStore.finish` joins them into the splits' caches without holding a split in
memory.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import pathlib
import shutil
from collections.abc import Sequence

import numpy as np

ID_ARRAYS = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
FORMAT = 2  # 2: uint16/uint32 ids, held-out texts kept


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


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every id of the vocabulary."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def flatten(sequences: Sequence[Sequence[int]], dtype) -> tuple[np.ndarray, np.ndarray]:
    """Ragged id lists -> (flat ids as `dtype`, int32 lengths)."""
    lengths = np.fromiter(map(len, sequences), np.int32, count=len(sequences))
    flat = np.fromiter(
        (t for s in sequences for t in s), dtype, count=int(lengths.sum(dtype=np.int64))
    )
    return flat, lengths


def read(path: str | pathlib.Path, key: str, pairs: int) -> TokenizedSplit | None:
    """The memory-mapped split at `path`, or None if absent, unreadable, of an older format, or
    built from other pairs (`key`, `pairs`)."""
    path = pathlib.Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
        if (meta.get("key"), meta.get("pairs"), meta.get("format")) != (key, pairs, FORMAT):
            return None
        if meta.get("texts") and not (path / "texts.json").is_file():
            return None
        split = TokenizedSplit(*(_map(path / f"{name}.npy") for name in ID_ARRAYS))
    except (OSError, ValueError, KeyError):
        return None
    return split if len(split) == pairs else None


def _map(path: pathlib.Path) -> np.ndarray:
    """A read-only memory map of the flat `.npy` array at `path`. (Read-ahead is left on: with it
    off, a cold cache is read 4 KB at a time and the first thousand 25k-token batches of a
    10M-pair cache took minutes; the kernel maps pages around each touched one either way.)"""
    with open(path, "rb") as file:
        version = np.lib.format.read_magic(file)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(file)
        else:
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(file)
        if fortran_order or len(shape) != 1:
            raise ValueError(f"{path}: not a flat array")
        offset = file.tell()
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mapped, dtype, count=shape[0], offset=offset)


def texts(path: str | pathlib.Path) -> list[tuple[str, str]]:
    """The (source, target) texts a held-out split's cache keeps."""
    path = pathlib.Path(path) / "texts.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: this split's text is not kept (only held-out splits')")
    return [tuple(pair) for pair in json.loads(path.read_text())]


def write(
    path: str | pathlib.Path,
    arrays: dict[str, np.ndarray],
    key: str,
    pair_texts: Sequence[tuple[str, str]] | None = None,
) -> TokenizedSplit:
    """Write a split's cache from in-memory arrays (`ID_ARRAYS`) and read it back mapped."""
    path = pathlib.Path(path)
    partial = _partial(path)
    for name in ID_ARRAYS:
        np.save(partial / f"{name}.npy", arrays[name])
    pairs = len(arrays["src_offsets"]) - 1
    if pair_texts is not None:
        (partial / "texts.json").write_text(json.dumps([list(p) for p in pair_texts]))
    _complete(partial, path, key, pairs, arrays["src_ids"].dtype, pair_texts is not None)
    return read(path, key, pairs) or TokenizedSplit(*(arrays[n] for n in ID_ARRAYS))


def _partial(path: pathlib.Path) -> pathlib.Path:
    """A fresh per-process directory beside `path`: processes of a multi-host job build the
    same cache at once."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    return partial


def _npy_writer(path: pathlib.Path, dtype, length: int):
    """An open `.npy` file of `length` elements of `dtype`, header written: append the data."""
    file = path.open("wb")
    header = dict(descr=np.lib.format.dtype_to_descr(np.dtype(dtype)), fortran_order=False)
    np.lib.format.write_array_header_2_0(file, dict(header, shape=(length,)))
    return file


def _complete(partial, path, key, pairs, dtype, texts: bool) -> None:
    """meta.json (which marks the cache complete, texts.json already written if `texts`), then
    the rename into place."""
    meta = dict(key=key, pairs=pairs, dtype=np.dtype(dtype).name, format=FORMAT, texts=texts)
    (partial / "meta.json").write_text(json.dumps(meta))
    if path.exists():  # a stale or damaged cache under this name
        shutil.rmtree(path, ignore_errors=True)
    try:
        partial.rename(path)
    except OSError:  # another process renamed its identical copy first
        shutil.rmtree(partial, ignore_errors=True)


class ChunkStore:
    """Per-chunk ids of every split under one directory (`NNNNNNN.npz`, each written whole and
    renamed into place), joined by `finish` into each split's cache.

    A chunk holds, for each split, `{split}.src_ids` / `.src_lengths` / `.tgt_ids` /
    `.tgt_lengths` and, for held-out splits, `{split}.texts` (UTF-8 JSON)."""

    def __init__(self, directory: str | pathlib.Path):
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _file(self, index: int) -> pathlib.Path:
        return self.directory / f"{index:07d}.npz"

    def has(self, index: int) -> bool:
        return self._file(index).is_file()

    def put(self, index: int, arrays: dict[str, np.ndarray]) -> None:
        """Write chunk `index` whole under a per-process name, then rename it into place."""
        partial = self.directory / f"{index:07d}.{os.getpid()}.partial.npz"
        np.savez(partial, **arrays)
        partial.replace(self._file(index))

    def finish(
        self, split: str, path: pathlib.Path, key: str, keep_texts: bool, digests: list[bytes]
    ) -> TokenizedSplit:
        """Join `split`'s part of chunks 0..len(digests)-1 into its cache at `path`, streaming:
        one chunk in memory at a time, appended to the `.npy` files with plain writes (a memory
        map would make every written page resident in this process). Each chunk's text digest
        must equal `digests` (what the scan saw): a corpus edited during a prepare is refused,
        never cached under the old content's key."""
        chunks = len(digests)
        totals = dict(pairs=0, src=0, tgt=0)
        dtype = None
        for index in range(chunks):
            with np.load(self._file(index)) as chunk:
                if chunk[f"{split}.digest"].tobytes() != digests[index]:
                    self.remove()
                    raise ValueError(
                        f"chunk {index} of the corpus changed after prepare had scanned it (a "
                        "file edited during prepare?); nothing was cached: run prepare again"
                    )
                totals["pairs"] += len(chunk[f"{split}.src_lengths"])
                for side in ("src", "tgt"):
                    totals[side] += int(chunk[f"{split}.{side}_lengths"].sum(dtype=np.int64))
                if dtype is None:  # the same in every chunk; reading ids costs a pass
                    dtype = chunk[f"{split}.src_ids"].dtype
        partial = _partial(path)
        files = {}
        for side in ("src", "tgt"):
            files[f"{side}_ids"] = _npy_writer(partial / f"{side}_ids.npy", dtype, totals[side])
            files[f"{side}_offsets"] = _npy_writer(
                partial / f"{side}_offsets.npy", np.int64, totals["pairs"] + 1
            )
            files[f"{side}_offsets"].write(np.zeros(1, np.int64).tobytes())
        texts_file = (partial / "texts.json").open("wb") if keep_texts else None
        if texts_file:
            texts_file.write(b"[")
        filled, texts_written = dict(src=0, tgt=0), False
        for index in range(chunks):
            with np.load(self._file(index)) as chunk:
                for side in ("src", "tgt"):
                    ids = chunk[f"{split}.{side}_ids"]
                    lengths = chunk[f"{split}.{side}_lengths"]
                    ends = filled[side] + np.cumsum(lengths, dtype=np.int64)
                    files[f"{side}_ids"].write(ids.tobytes())
                    files[f"{side}_offsets"].write(ends.tobytes())
                    filled[side] += len(ids)
                if texts_file:
                    items = chunk[f"{split}.texts"].tobytes()[1:-1]  # the list's items
                    if items:
                        texts_file.write(b"," + items if texts_written else items)
                        texts_written = True
        for file in files.values():
            file.close()
        if texts_file:
            texts_file.write(b"]")
            texts_file.close()
        _complete(partial, path, key, totals["pairs"], dtype, keep_texts)
        split_ids = read(path, key, totals["pairs"])
        if split_ids is None:
            raise OSError(f"{path}: the id cache just written does not read back")
        return split_ids

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
