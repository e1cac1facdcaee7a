"""Preparing in bounded chunks on several processes gives exactly what reading the corpus whole
gives; an interrupted prepare resumes without redoing finished chunks and never serves a
half-built cache; the flat-array epoch plans equal the list-of-lists planner they replaced."""

import fcntl
import functools
import json
import mmap
import pathlib
import queue
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests import list_planner
from tests.e2e_corpus import write_corpus
from tfm.data import batching, corpus, id_cache, pipeline, prepare, sources, streaming
from tfm.data.corpus import SPLITS


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    src, tgt = write_corpus(folder, pairs=1500, seed=4)
    # lines the readers must handle the same way at any chunk boundary: CRLF, an empty side
    with open(src, "a", encoding="utf-8") as s, open(tgt, "a", encoding="utf-8") as t:
        s.write("carriage return\r\n\nlast one\n")
        t.write("Wagenrücklauf\r\nleer\nletzte\n")
    return f"text:{src},{tgt}"


@pytest.fixture(scope="module")
def one_shot(spec, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("whole")
    return prepare.prepare(spec, data_dir, 400, workers=1, chunk_records=corpus.WHOLE_FILE)


def _arrays(split: id_cache.TokenizedSplit) -> list[np.ndarray]:
    return [np.asarray(getattr(split, name)) for name in id_cache.ID_ARRAYS]


def test_chunked_prepare_on_two_processes_equals_reading_whole(spec, one_shot, tmp_path):
    chunked = prepare.prepare(spec, tmp_path, 400, workers=2, chunk_records=7)
    assert chunked.sizes == one_shot.sizes and chunked.filtered == one_shot.filtered
    assert chunked.filtered["empty_side"] == 1
    assert chunked.fingerprints == one_shot.fingerprints
    assert chunked.tokenizer.path.read_bytes() == one_shot.tokenizer.path.read_bytes()
    for split in SPLITS:
        for a, b in zip(_arrays(chunked.ids[split]), _arrays(one_shot.ids[split]), strict=True):
            np.testing.assert_array_equal(a, b)
    for split in ("validation", "test"):
        assert chunked.texts(split) == one_shot.texts(split)


def test_prepared_ids_and_fingerprints_match_the_corpus_read_whole(spec, one_shot):
    whole = sources.load_corpus(sources.parse_spec(spec))  # the in-memory reader
    tok = one_shot.tokenizer
    for split in SPLITS:
        pairs = whole.splits[split]
        assert one_shot.sizes[split] == len(pairs)
        assert one_shot.fingerprints[split] == corpus.fingerprint(pairs)
        ids = one_shot.ids[split]
        assert ids.src_ids.dtype == np.uint16 and isinstance(ids.src_ids.base.obj, mmap.mmap)
        for i in range(0, len(pairs), 37):
            assert ids.source(i).tolist() == tok.encode(pairs[i][0])
            assert ids.target(i).tolist() == tok.encode(pairs[i][1])
    assert one_shot.texts("validation") == whole.splits["validation"]
    with pytest.raises(ValueError, match="held-out"):
        one_shot.texts("train")


class Interrupted(Exception):
    pass


def test_an_interrupted_prepare_resumes_and_never_serves_a_half_built_cache(
    spec, one_shot, tmp_path, monkeypatch
):
    put = id_cache.ChunkStore.put
    written = []

    def put_then_die(store, index, arrays):
        if len(written) == 10:
            raise Interrupted
        written.append(index)
        put(store, index, arrays)

    monkeypatch.setattr(id_cache.ChunkStore, "put", put_then_die)
    with pytest.raises(Interrupted):
        prepare.prepare(spec, tmp_path, 400, workers=1, chunk_records=50)
    assert not [p for p in (tmp_path / "ids").iterdir() if not p.name.endswith(".chunks")]
    monkeypatch.setattr(id_cache.ChunkStore, "put", put)

    encode = streaming.encode_chunk
    encoded = []

    def counting_encode(task):
        encoded.append(task[0])
        return encode(task)

    monkeypatch.setattr(streaming, "encode_chunk", counting_encode)
    resumed = prepare.prepare(spec, tmp_path, 400, workers=1, chunk_records=50)
    chunks = -(-(1500 + 3) // 50)
    assert encoded == list(range(10, chunks))  # finished chunks were not encoded again
    assert not list((tmp_path / "ids").glob("*.chunks"))  # the chunk files are gone
    for split in SPLITS:
        for a, b in zip(_arrays(resumed.ids[split]), _arrays(one_shot.ids[split]), strict=True):
            np.testing.assert_array_equal(a, b)
    again = prepare.prepare(spec, tmp_path, 400, workers=1, chunk_records=50)
    assert set(again.caches.values()) == {"reused"}


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("epoch", [0, 3])
def test_flat_plans_equal_the_list_planner(one_shot, pack, epoch):
    config = batching.BatchConfig(batch_tokens=256, max_seq_len=16, pack=pack, seed=7)
    pipe = pipeline.BatchPipeline(one_shot.ids["train"], config)
    expected = list_planner.plan_epoch(pipe.examples, config, epoch, pipe.buckets)
    plan = pipe.plan(epoch)
    assert [list(rows) for rows in plan] == expected
    for b in range(0, len(plan), 5):
        by_lists = batching.assemble_batch(
            one_shot.ids["train"], pipe.examples, expected[b], pipe.row_length(plan[b]), pack
        )
        by_plan = pipe.local_batch(plan[b])
        for key in by_lists:
            np.testing.assert_array_equal(by_plan[key], by_lists[key])
    assert len(plan[:3]) == 3 and list(plan[:3][2]) == expected[2]


def test_a_tfds_dataset_streams_in_chunks_as_it_reads_whole():
    import tensorflow_datasets as tfds

    from tfm.data import tfds_sources

    with tfds.testing.mock_data(num_examples=7):
        whole = sources.load_corpus(sources.parse_spec("tfds:wmt14_translate/de-en"))
        chunks = list(tfds_sources.dataset_chunks("wmt14_translate/de-en", "en", "de", None, 3))
    assert [len(chunk.data[1]) for chunk in chunks] == [3, 3, 1] * 3
    streamed = corpus.merge(map(corpus.parse_chunk, chunks))
    assert streamed.splits == whole.splits and sum(map(len, whole.splits.values())) == 21


def test_a_script_without_a_main_guard_gets_told_what_to_do(spec, tmp_path):
    """Workers are spawned, which re-imports the calling script: one that calls prepare at its
    top level kills them, and must hear why in one line, not a bare BrokenProcessPool."""
    script = tmp_path / "no_guard.py"
    script.write_text(
        "from tfm.data.prepare import prepare\n"
        f"prepare({spec!r}, {str(tmp_path / 'data')!r}, 400, workers=2)\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert out.returncode != 0
    assert "if __name__ == '__main__':" in out.stderr.strip().splitlines()[-1]


def test_a_corpus_edited_during_prepare_is_refused_not_cached(tmp_path, monkeypatch):
    src, tgt = write_corpus(tmp_path / "corpus", pairs=600, seed=9)
    spec = f"text:{src},{tgt}"
    encode = prepare._encode

    def edit_then_encode(*args):
        lines = pathlib.Path(tgt).read_text().splitlines()
        lines[5] = "EDITED WHILE PREPARING"  # same line count: only the content tells
        pathlib.Path(tgt).write_text("\n".join(lines) + "\n")
        return encode(*args)

    monkeypatch.setattr(prepare, "_encode", edit_then_encode)
    with pytest.raises(ValueError, match="changed after prepare had scanned it"):
        prepare.prepare(spec, tmp_path / "data", 400, workers=1, chunk_records=100)
    assert not list((tmp_path / "data" / "ids").iterdir())  # no split cache, no chunk files
    monkeypatch.setattr(prepare, "_encode", encode)
    again = prepare.prepare(spec, tmp_path / "data", 400, workers=1, chunk_records=100)
    whole = sources.load_corpus(sources.parse_spec(spec))
    assert again.fingerprints["train"] == corpus.fingerprint(whole.splits["train"])


PREPARE_AND_REPORT = """
import json, sys
from tfm.data.prepare import prepare
if __name__ == "__main__":
    data = prepare(sys.argv[1], sys.argv[2], 400, workers=1, chunk_records=100)
    print(json.dumps(data.caches))
"""


def _start_prepare(spec: str, data_dir: pathlib.Path, script: pathlib.Path) -> subprocess.Popen:
    script.write_text(PREPARE_AND_REPORT)
    return subprocess.Popen(
        [sys.executable, str(script), spec, str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=pathlib.Path(__file__).parents[1],
    )


def _line_containing(process: subprocess.Popen, text: str, timeout: float) -> str:
    """The first line of `process`'s stderr that contains `text`, read on a thread so that a
    process that hangs without printing it fails the test after `timeout` seconds."""
    found: queue.Queue = queue.Queue()

    def read() -> None:
        for line in process.stderr:
            if text in line:
                found.put(line)
                return
        found.put(None)  # the process ended without printing it

    threading.Thread(target=read, daemon=True).start()
    try:
        line = found.get(timeout=timeout)
    except queue.Empty:
        process.kill()
        raise AssertionError(f"no line with {text!r} within {timeout} s") from None
    assert line is not None, f"the process ended without printing {text!r}"
    return line


def test_a_prepare_waits_for_the_one_already_building_in_its_data_dir(spec, one_shot, tmp_path):
    """A local sweep starts several runs on one data dir at once: a second builder would
    delete or replace caches the first is writing, so it waits for the lock and then reuses."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    slug = sources.parse_spec(spec).slug
    with open(data_dir / f".prepare-{slug}.lock", "w") as held:
        held.write("12345\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        waiting = _start_prepare(spec, data_dir, tmp_path / "run.py")
        line = _line_containing(waiting, "waiting", timeout=300)
        assert "process 12345" in line and ".lock" in line
        assert not (data_dir / "ids").exists() and not list(data_dir.glob("*.model"))
        fcntl.flock(held, fcntl.LOCK_UN)
    out, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 0, err
    assert set(json.loads(out.splitlines()[-1]).values()) == {"built"}


def test_two_prepares_started_together_build_once_and_agree(spec, one_shot, tmp_path):
    data_dir = tmp_path / "data"
    runs = [_start_prepare(spec, data_dir, tmp_path / f"run{i}.py") for i in range(2)]
    reports = []
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-2000:]
        reports.append(set(json.loads(out.splitlines()[-1]).values()))
    assert sorted(map(sorted, reports)) == [["built"], ["reused"]]
    again = prepare.prepare(spec, data_dir, 400, workers=1, chunk_records=100)
    assert set(again.caches.values()) == {"reused"}
    for split in SPLITS:
        for a, b in zip(_arrays(again.ids[split]), _arrays(one_shot.ids[split]), strict=True):
            np.testing.assert_array_equal(a, b)


@functools.cache
def _translation_builder():
    """The base of the test-only TFDS builders: German-English pairs, version 1.0.0. It stays
    out of TFDS's registry (skip_registration); each subclass registers under its own name."""
    import tensorflow_datasets as tfds

    class TranslationBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.Translation(languages=("de", "en"))
            )

    return TranslationBuilder


def _tiny_tfds_builder(pairs: dict[str, list[tuple[str, str]]]):
    """A TFDS translation builder that `tfds.builder("tfm_tiny_translate")` finds by name (TFDS
    registers it when the class is made), generating `pairs` per split: no download, no TF."""

    class TfmTinyTranslate(_translation_builder()):
        def _split_generators(self, dl_manager):
            return {split: self._generate_examples(split) for split in pairs}

        def _generate_examples(self, split):
            for i, (english, german) in enumerate(pairs[split]):
                yield f"{split}-{i}", {"en": english, "de": german}

    return TfmTinyTranslate


def test_the_first_use_of_a_tfds_dataset_builds_it_then_prepares_it(tmp_path, capsys):
    """`python -m tfm.data.prepare tfds:NAME` on a dataset that is not there yet builds it as
    array_record (TFDS's download_and_prepare), then reads and encodes it; the next call reuses
    both."""
    src, tgt = write_corpus(tmp_path / "corpus", pairs=900, seed=11)
    lines = list(
        dict.fromkeys(
            zip(
                pathlib.Path(src).read_text().splitlines(),
                pathlib.Path(tgt).read_text().splitlines(),
                strict=True,
            )
        )
    )
    pairs = dict(train=lines[:-100], validation=lines[-100:-50], test=lines[-50:])
    _tiny_tfds_builder(pairs)
    data_dir = tmp_path / "data"
    argv = ["tfds:tfm_tiny_translate", "--data_dir", str(data_dir), "--vocab_size", "400"]
    argv += ["--source_language", "en", "--target_language", "de", "--workers", "1"]
    with pytest.raises(SystemExit, match="^error: prepare: vocab_size must be a positive integer"):
        prepare.main([*argv, "--vocab_size", "0"])  # refused before anything is built
    assert not (data_dir / "tfm_tiny_translate").exists()
    prepare.main(argv)
    first = capsys.readouterr()
    assert "first use of tfds:tfm_tiny_translate: building it under" in first.err
    assert list((data_dir / "tfm_tiny_translate" / "1.0.0").glob("*.array_record*"))
    summary = json.loads(first.out)
    assert summary["pairs"] == {split: len(p) for split, p in pairs.items()}
    assert summary["direction"] == "en->de"
    assert set(summary["caches"].values()) == {"built"}

    prepare.main(argv)
    again = capsys.readouterr()
    assert "first use" not in again.err
    assert set(json.loads(again.out)["caches"].values()) == {"reused"}
    spec = sources.parse_spec("tfds:tfm_tiny_translate", "en", "de")
    data = prepare.prepare(spec, data_dir, 400, workers=1)
    assert sorted(data.texts("validation")) == sorted(pairs["validation"])
    # a name without a language pair, and no languages given: one line naming what it has
    with pytest.raises(SystemExit) as error:
        prepare.main(argv[:5])
    assert str(error.value) == (
        "error: tfds:tfm_tiny_translate: its records have the languages de, en, not 'src' or "
        "'tgt'; name two of them with --source_language and --target_language "
        "(tfds:NAME/xx-yy names them itself)"
    )


def test_a_tfds_build_that_cannot_reach_its_sources_says_so_in_one_line(tmp_path):
    class TfmUnreachableTranslate(_translation_builder()):
        def _split_generators(self, dl_manager):
            raise ConnectionError("Failed to resolve 'www.statmt.org'")  # what no network gives

        def _generate_examples(self):
            yield from ()

    argv = ["tfds:tfm_unreachable_translate", "--data_dir", str(tmp_path), "--workers", "1"]
    with pytest.raises(SystemExit) as error:
        prepare.main([*argv, "--source_language", "en", "--target_language", "de"])
    message = str(error.value)
    assert "\n" not in message and message.startswith(
        f"error: tfds:tfm_unreachable_translate: building it under {tmp_path} failed "
        "(ConnectionError: Failed to resolve 'www.statmt.org'); TFDS downloads its sources"
    )
