"""Bad input and damaged state: each case gets a clear one-line error naming the file, line or
key, and nothing is lost, reused stale or silently changed (README, "Reliability")."""

import dataclasses
import fcntl
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import optax
import pytest

from tests import bounded, checkpoint_damage
from tests.e2e_corpus import write_corpus
from tests.mo_files import write_mo
from tests.subprocess_json import run_in_repo
from tfm import training
from tfm.config import ModelConfig
from tfm.data import corpus as corpora
from tfm.data import gettext_catalogs, prepare, sources
from tfm.job import checkpoint as ckpt
from tfm.job import file_lock, metrics_file
from tfm.job.train_log import TrainLog
from tfm.job.workdir import ModelCard, Workdir, WorkdirError, check_resume, exclusive, start_over

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(args, timeout=300, **kwargs) -> subprocess.CompletedProcess:
    return run_in_repo([sys.executable, *args], timeout, **kwargs)


# --- caches keyed by content -------------------------------------------------------------------


def test_an_edited_corpus_rebuilds_vocabulary_and_ids(tmp_path):
    src, tgt = write_corpus(tmp_path / "corpus", pairs=800)
    spec = f"text:{src},{tgt}"
    first = prepare.prepare(spec, tmp_path / "data", 400)
    assert set(first.caches.values()) == {"built"}
    again = prepare.prepare(spec, tmp_path / "data", 400)
    assert set(again.caches.values()) == {"reused"}
    # same number of lines, one line edited in place
    lines = pathlib.Path(tgt).read_text().splitlines()
    index = next(i for i, s in enumerate(open(src)) if corpora.split_of(s.strip()) == "train")
    lines[index] = "EDITED ZZZ QQQ"
    pathlib.Path(tgt).write_text("\n".join(lines) + "\n")
    edited = prepare.prepare(spec, tmp_path / "data", 400)
    assert edited.caches["vocabulary"] == "built" and edited.caches["ids_train"] == "built"
    assert edited.dataset_fingerprint != first.dataset_fingerprint
    assert edited.tokenizer.path != first.tokenizer.path
    train_pairs = sources.load_corpus(sources.parse_spec(spec)).splits["train"]
    position = [s for s, _ in train_pairs].index(open(src).readlines()[index].strip())
    expected = edited.tokenizer.encode("EDITED ZZZ QQQ")
    assert edited.ids["train"].target(position).tolist() == expected


def test_changed_catalogs_rebuild_the_gettext_dataset_under_the_data_dirs_lock(
    tmp_path, monkeypatch
):
    """Each build (and rebuild) of the catalogs' TFDS dataset holds the data dir's lock: two
    sweep runs started together on a fresh machine both built it and one died renaming it."""
    from tfm.data import tfds_sources

    lock = tmp_path / "data" / ".build-gettext-en-de.lock"
    builds_locked = []
    make_builder = tfds_sources.gettext_builder

    def probing_builder(*args, **kwargs):
        builder = make_builder(*args, **kwargs)
        build = builder.download_and_prepare

        def download_and_prepare(*a, **k):
            lock.parent.mkdir(parents=True, exist_ok=True)
            with open(lock, "a") as probe:
                try:
                    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(probe, fcntl.LOCK_UN)
                    builds_locked.append(False)
                except BlockingIOError:  # held by the builder's own handle
                    builds_locked.append(True)
            return build(*a, **k)

        builder.download_and_prepare = download_and_prepare
        return builder

    monkeypatch.setattr(tfds_sources, "gettext_builder", probing_builder)
    locale = tmp_path / "locale"
    many = [(f"Message number {i}", f"Nachricht Nummer {i}") for i in range(300)]
    catalog = locale / "de" / "LC_MESSAGES" / "app.mo"
    write_mo(catalog, many)
    spec = sources.parse_spec("gettext:en-de")
    before = sources.load_corpus(spec, tmp_path / "data", locale_dir=locale)
    write_mo(catalog, many[:-1] + [("Message number 299", "Geänderte Nachricht")])
    after = sources.load_corpus(spec, tmp_path / "data", locale_dir=locale)
    pairs = [p for split in after.splits.values() for p in split]
    assert ("Message number 299", "Geänderte Nachricht") in pairs
    assert before.splits != after.splits
    assert builds_locked and all(builds_locked)


# --- a workdir that knows what it holds --------------------------------------------------------


def _card(**changes) -> ModelCard:
    values = dict(
        model=ModelConfig(vocab_size=100, num_layers=1, d_model=16, d_ff=32, num_heads=2),
        vocabulary="/data/vocab.model",
        dataset="text:a,b",
        source_language="src",
        target_language="tgt",
        dataset_fingerprint="d1",
        vocabulary_fingerprint="v1",
        settings=dict(num_train_steps=100, parallelism="data"),
    )
    values.update(changes)
    return ModelCard(**values)


def _workdir_with_checkpoint(tmp_path, card) -> Workdir:
    workdir = Workdir(tmp_path / "run")
    (workdir.checkpoints / "50").mkdir(parents=True)
    workdir.model_card.write_text(card.to_json())
    return workdir


def test_a_run_of_another_model_or_data_stops_naming_the_keys(tmp_path):
    workdir = _workdir_with_checkpoint(tmp_path, _card())
    card_before = workdir.model_card.read_text()
    other_model = _card(model=ModelConfig(vocab_size=100, num_layers=2, d_model=16, d_ff=32))
    with pytest.raises(WorkdirError, match=r"model\.num_layers: 1 -> 2.*--start_over"):
        check_resume(workdir, other_model)
    with pytest.raises(WorkdirError, match="dataset_fingerprint: 'd1' -> 'd2'"):
        check_resume(workdir, _card(dataset_fingerprint="d2"))
    with pytest.raises(WorkdirError, match="vocabulary_fingerprint"):
        check_resume(workdir, _card(vocabulary_fingerprint="v2"))
    assert workdir.model_card.read_text() == card_before  # nothing written


def test_resumable_settings_may_change_and_are_reported(tmp_path):
    workdir = _workdir_with_checkpoint(tmp_path, _card())
    notes = check_resume(workdir, _card(settings=dict(num_train_steps=300, parallelism="fsdp")))
    assert notes == ["num_train_steps: 100 -> 300", "parallelism: 'data' -> 'fsdp'"]
    remat = _card(model=dataclasses.replace(_card().model, remat=True))
    assert check_resume(workdir, remat) == []  # how, not what, the model computes


def test_start_over_moves_the_previous_run_aside(tmp_path):
    workdir = _workdir_with_checkpoint(tmp_path, _card())
    workdir.metrics.write_text('{"step": 1}\n')
    moved = start_over(workdir)
    assert moved == workdir.root / "previous-1"
    assert (moved / "checkpoints" / "50").is_dir() and (moved / "metrics.jsonl").is_file()
    assert not workdir.has_checkpoints()
    assert check_resume(workdir, _card(dataset_fingerprint="d2")) == []


def test_a_second_writer_fails_naming_the_holder_and_a_killed_one_frees_the_lock(tmp_path):
    workdir = Workdir(tmp_path / "run")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from tfm.job.workdir import Workdir, exclusive\n"
            f"with exclusive(Workdir({str(workdir.root)!r})):\n"
            "    print('locked', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert bounded.readline_within(holder, 120).strip() == "locked"
        with pytest.raises(WorkdirError, match=f"in use by process {holder.pid}"):
            with exclusive(workdir):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    with exclusive(workdir):  # the OS released it
        pass


def test_a_taken_lock_names_its_holder_or_says_it_wrote_none(tmp_path):
    """Two runs started together: the second can find the lock taken before the first wrote its
    process id; it then says "another process", not "process another process"."""
    lock = tmp_path / "lock"
    seen = []

    def give_up(holder: str) -> None:
        seen.append(holder)
        raise WorkdirError(holder)

    with open(lock, "w") as taken:
        fcntl.flock(taken, fcntl.LOCK_EX)
        for written in ("", "4242\n"):
            lock.write_text(written)
            with pytest.raises(WorkdirError), file_lock.held(lock, give_up):
                pass
    assert seen == ["another process", "process 4242"]


def test_records_after_the_resumed_checkpoint_are_dropped(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    records = [dict(kind="train", step=s) for s in (25, 50, 75)] + [dict(kind="eval", step=50)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind": "tr')
    TrainLog(metrics, tmp_path / "tb", start=50, total=100).close()
    kept = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert kept == [records[0], records[1], records[3]]


def test_a_resume_drops_only_a_last_line_cut_short_and_names_other_damage(tmp_path):
    """A kill can cut short only the last line; a damaged line before it is damage the resume
    must not hide: it is named, and the file is left as it was."""
    metrics = tmp_path / "metrics.jsonl"
    whole = [json.dumps(dict(kind="train", step=s)) for s in (25, 50)]
    for damaged in ('{"kind": "tr', "[25]"):
        text = whole[0] + "\n" + damaged + "\n" + whole[1] + "\n"
        metrics.write_text(text)
        with pytest.raises(metrics_file.DamagedRecords, match=rf"{re.escape(str(metrics))}:2: "):
            metrics_file.drop_records_after(metrics, 50)
        assert metrics.read_text() == text
    metrics.write_text(whole[0] + "\n" + whole[1] + "\n" + "[25")
    metrics_file.drop_records_after(metrics, 50)
    assert metrics.read_text() == whole[0] + "\n" + whole[1] + "\n"


def test_a_damaged_metrics_line_is_named_not_skipped(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    whole = [dict(kind="train", step=25), dict(kind="eval", step=25, perplexity=4.0)]
    metrics.write_text(json.dumps(whole[0]) + "\n\n" + json.dumps(whole[1]) + "\n")
    assert metrics_file.read(metrics) == whole
    metrics.write_text(json.dumps(whole[0]) + "\n" + '{"kind": "ev' + "\n")
    with pytest.raises(metrics_file.DamagedRecords, match=rf"{re.escape(str(metrics))}:2: "):
        metrics_file.read(metrics)


# --- verified restores -------------------------------------------------------------------------


def _train_state(seed: int) -> training.TrainState:
    rng = np.random.default_rng(seed)
    params = {"dense": {"kernel": rng.normal(size=(8, 4)).astype(np.float32)}}
    optimizer = optax.adam(1e-3)
    opt_state = optimizer.init(params)
    opt_state = jax.tree.map(lambda x: x + seed if x.dtype == np.float32 else x, opt_state)
    return training.TrainState(
        step=np.array(seed, np.int32),
        params=params,
        opt_state=opt_state,
        rng=np.array([0, seed], np.uint32),
    )


def test_intact_checkpoints_verify_by_both_restore_paths(tmp_path):
    saver = ckpt.Checkpointer(tmp_path)
    saver.save(3, _train_state(3), {"epoch": 0, "grain": {"i": 3}})
    state, data, _, step = saver.restore(_train_state(0))
    assert step == 3 and data == {"epoch": 0, "grain": {"i": 3}}
    params, step = ckpt.Checkpointer(tmp_path, read_only=True).restore_params()
    assert step == 3
    np.testing.assert_array_equal(
        params["dense"]["kernel"], _train_state(3).params["dense"]["kernel"]
    )


@pytest.mark.parametrize("part", checkpoint_damage.PARTS)
def test_a_damaged_checkpoint_is_moved_aside_and_its_step_can_be_saved_again(
    tmp_path, caplog, part
):
    saver = ckpt.Checkpointer(tmp_path)
    for step in (1, 2):
        saver.save(step, _train_state(step), {"epoch": 0, "grain": {"i": step}})
    checkpoint_damage.damage(tmp_path / "checkpoints" / "2", part)
    restorer = ckpt.Checkpointer(tmp_path)
    state, _, _, step = restorer.restore(_train_state(0))
    assert step == 1 and int(state.step) == 1
    assert f"checkpoint 2 in {tmp_path / 'checkpoints'} is damaged: {part}" in caplog.text
    assert (tmp_path / "checkpoints" / "2.damaged").is_dir()
    restorer.save(2, _train_state(2))  # the step can be written again
    assert restorer.steps() == [1, 2]


def test_verify_command_and_decode_loading_notice_damage(tmp_path):
    saver = ckpt.Checkpointer(tmp_path)
    for step in (1, 2):
        saver.save(step, _train_state(step))
    ok = _run(["-m", "tfm.job.checkpoint", "verify", str(tmp_path)])
    assert ok.returncode == 0 and "2 verified, 0 damaged" in ok.stdout
    checkpoint_damage.damage(tmp_path / "checkpoints" / "2", "opt_state")
    bad = _run(["-m", "tfm.job.checkpoint", "verify", str(tmp_path)])
    assert bad.returncode == 1 and "DAMAGED" in bad.stdout and "opt_state" in bad.stdout
    with pytest.raises(ckpt.CheckpointError, match="damaged: opt_state"):
        ckpt.Checkpointer(tmp_path, read_only=True).restore_params(2)
    params, steps = ckpt.average_last(tmp_path, 2)  # averaging skips it, and says so
    assert steps == [1]
    assert (tmp_path / "checkpoints" / "2").is_dir()  # read-only users never move anything


def test_flipped_bytes_never_restore_silently(tmp_path):
    saver = ckpt.Checkpointer(tmp_path)
    saver.save(1, _train_state(1))
    saver.save(2, _train_state(2))
    files = [p for p in (tmp_path / "checkpoints" / "2" / "state").rglob("*") if p.is_file()]
    biggest = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(biggest.read_bytes())
    for offset in range(len(data) // 4, len(data) // 2, 97):
        data[offset] ^= 0xFF
    biggest.write_bytes(bytes(data))
    _, _, _, step = ckpt.Checkpointer(tmp_path).restore(_train_state(0))
    assert step == 1


def test_averaging_fewer_checkpoints_than_asked_says_so(tmp_path, caplog):
    saver = ckpt.Checkpointer(tmp_path)
    for step in (1, 2):
        saver.save(step, _train_state(step))
    _, steps = ckpt.average_last(tmp_path, 50)
    assert steps == [1, 2]
    assert "averaging 2 checkpoints [1, 2]" in caplog.text


# --- decode.py keeps lines and work ------------------------------------------------------------


def test_decode_reads_lines_split_on_lf_only():
    import decode

    lines, replaced = decode.read_lines(b"a\rb\nc\r\nd", "in.txt", "strict")
    assert lines == ["a\rb", "c", "d"] and replaced == 0
    with pytest.raises(ValueError, match="in.txt, line 2: invalid UTF-8"):
        decode.read_lines(b"ok\nbad \xff here\n", "in.txt", "strict")
    lines, replaced = decode.read_lines(b"ok\nbad \xff here\n", "in.txt", "replace")
    assert lines == ["ok", "bad \ufffd here"] and replaced == 1


def test_decode_refuses_bad_options_and_unwritable_output_before_any_work(tmp_path):
    (tmp_path / "in.txt").write_text("hello\n")
    missing_dir = tmp_path / "no" / "such" / "dir" / "out.txt"
    args = [
        "decode.py",
        "--workdir",
        str(tmp_path / "nowhere"),
        "--input",
        str(tmp_path / "in.txt"),
    ]
    unwritable = _run([*args, "--output", str(missing_dir)])
    assert unwritable.returncode == 2 and str(missing_dir) in unwritable.stderr
    assert "model.json" not in unwritable.stderr  # refused before loading anything
    for flag, value in [("--beam_size", "0"), ("--extra_length", "-1"), ("--alpha", "nan")]:
        bad = _run([*args, flag, value])
        assert bad.returncode == 2 and f"error: {flag} must be" in bad.stderr


# --- hostile catalogs ---------------------------------------------------------------------------


def _overlapping_mo(path: pathlib.Path, entries: int, length: int) -> None:
    """A .mo file whose entries all point at one long string."""
    import struct

    header = 28
    tables = header + 16 * entries
    text = b"x" * length
    body = struct.pack("<7I", 0x950412DE, 0, entries, header, header + 8 * entries, 0, 0)
    table = b"".join(struct.pack("<2I", length, tables) for _ in range(entries))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body + table + table + text)


def test_a_catalog_of_overlapping_strings_is_refused_without_blowing_up(tmp_path):
    path = tmp_path / "de" / "LC_MESSAGES" / "evil.mo"
    _overlapping_mo(path, entries=4000, length=64_000)
    start = time.perf_counter()
    with pytest.raises(gettext_catalogs.CatalogError, match="evil.mo.*overlapping"):
        gettext_catalogs.read_mo(path)
    assert time.perf_counter() - start < 5


def test_directories_and_broken_links_named_mo_are_skipped_and_counted(tmp_path):
    folder = tmp_path / "de" / "LC_MESSAGES"
    write_mo(folder / "good.mo", [("Quit", "Beenden")])
    (folder / "dir.mo").mkdir()
    os.symlink(folder / "missing-target", folder / "broken.mo")
    catalogs = gettext_catalogs.read_catalogs("de", tmp_path)
    assert catalogs.pairs == [("Quit", "Beenden")]
    assert catalogs.filtered["unreadable_file"] == 2


# --- the smaller items --------------------------------------------------------------------------


def _job_config(**overrides):
    sys.path.insert(0, str(ROOT))
    from configs import default
    from tfm.job.config import job_config_from

    config = default.get_config()
    config.unlock()
    for key, value in overrides.items():
        config[key] = value
    return job_config_from(config)


def test_config_values_are_checked_naming_the_key():
    with pytest.raises(ValueError, match="learning_rate_scale must be a number > 0, got -1"):
        _job_config(learning_rate_scale=-1.0)
    with pytest.raises(ValueError, match="config.warmup_stpes is not a key"):
        _job_config(warmup_stpes=10)
    with pytest.raises(ValueError, match="config.batch_tokens must be a positive integer"):
        _job_config(batch_tokens=0)
    with pytest.raises(ValueError, match="config.max_len is now config.max_seq_len"):
        _job_config(max_len=64)


def test_unknown_command_line_key_is_one_line():
    out = _run(["train.py", "--config.warmup_stpes=10", "--workdir", "/nonexistent"])
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        'error: --config.warmup_stpes: no such key in the config (did you mean "warmup_steps"?); '
        "the keys are listed in configs/common.py"
    ]
    # beside valid overrides, only the unknown one is named (a nested one too)
    out = _run(
        ["train.py", "--config.seed=3", "--config.model.nm_heads=2", "--config.decode.alpha=0.5",
         "--check_config"]
    )  # fmt: skip
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        'error: --config.model.nm_heads: no such key in the config (did you mean "num_heads"?); '
        "the keys are listed in configs/common.py"
    ]


def test_check_config_reads_the_config_and_writes_nothing(tmp_path):
    out = _run(["train.py", "--config.learning_rate_scale=-1", "--check_config"])
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        "error: config: learning_rate_scale must be a number > 0, got -1.0"
    )
    workdir = tmp_path / "run"
    out = _run(["train.py", "--config.seed=3", f"--workdir={workdir}", "--check_config"])
    assert out.returncode == 0 and "the config is valid" in out.stderr
    assert not workdir.exists()


def test_a_tiny_corpus_says_which_split_is_empty(tmp_path):
    (tmp_path / "tiny.tsv").write_text("a b\tA B\nc d\tC D\ne f\tE F\n")
    with pytest.raises(corpora.CorpusError, match=r"(validation|test) splits? (is|are) empty"):
        prepare.prepare(f"tsv:{tmp_path / 'tiny.tsv'}", tmp_path / "data", 100)
    out = _run(
        ["-m", "tfm.data.prepare", f"tsv:{tmp_path / 'tiny.tsv'}", "--data_dir", str(tmp_path)]
    )
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1].startswith("error: tsv:")
    assert "Traceback" not in out.stderr


def test_a_vocabulary_too_small_for_the_characters_says_so(tmp_path):
    src, tgt = write_corpus(tmp_path / "corpus", pairs=800)
    with pytest.raises(corpora.CorpusError, match="vocab_size=20 is smaller than the"):
        prepare.prepare(f"text:{src},{tgt}", tmp_path / "data", 20)


def test_replaced_invalid_utf8_is_counted(tmp_path):
    (tmp_path / "a.tsv").write_bytes(b"ok\tgut\nbad \xff\tschlecht\n")
    corpus = corpora.read_tsv(str(tmp_path / "a.tsv"), encoding_errors="replace")
    assert corpus.filtered["lines_with_invalid_utf8_replaced"] == 1
