"""The command lines the README and docs/cli.md name, run as a user runs them, on one tiny
workdir that `train.py` trains once for this module (6 steps, a checkpoint at every step):
decode.py's flags, the reliability table's rows (damaged checkpoints, Ctrl-C, an Inf loss,
invalid UTF-8, overlong lines) and the module commands. Each test that changes the workdir
works on its own copy."""

import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests import bounded, checkpoint_damage
from tests.built_once import built_once
from tests.e2e_corpus import write_corpus
from tests.subprocess_json import run_in_repo
from tests.test_config import _closed_form_count
from tfm.data.corpus import split_of
from tfm.inference import translate
from tfm.job import checkpoint as ckpt
from tfm.job import workdir as workdirs

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = 6
TINY = [
    "--config.vocab_size=400",
    "--config.max_seq_len=24",
    "--config.batch_tokens=256",
    "--config.model.num_layers=1",
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.model.num_heads=4",
    "--config.model.d_k=8",
    "--config.model.d_v=8",
    "--config.model.max_positions=32",
    "--config.model.dropout_rate=0.1",
    "--config.warmup_steps=4",
    "--config.eval_batches=1",
    "--config.eval_every_steps=1000",
    "--config.log_every_steps=1",
    "--config.checkpoint_every_steps=1",
    "--config.keep_checkpoints=20",
    "--config.decode.enabled=False",
]


@dataclasses.dataclass(frozen=True)
class TinyRun:
    root: pathlib.Path  # corpus/ and data/ (shared, read-only for the tests)
    workdir: pathlib.Path  # the trained run (read-only: copy it to change it)
    sources: list[str]  # sentences of the corpus's test split

    def train_args(self, workdir: pathlib.Path, steps: int = STEPS, extra=()) -> list[str]:
        corpus = self.root / "corpus"
        return [
            str(ROOT / "train.py"),
            f"--workdir={workdir}",
            f"--config.dataset=text:{corpus / 'train.en'},{corpus / 'train.de'}",
            f"--config.data_dir={self.root / 'data'}",
            f"--config.num_train_steps={steps}",
            *TINY,
            *extra,
        ]

    def copy(self, tmp_path: pathlib.Path) -> pathlib.Path:
        copied = tmp_path / "run"
        shutil.copytree(self.workdir, copied)
        return copied


def _run(args, timeout=300, **kwargs) -> subprocess.CompletedProcess:
    return run_in_repo([sys.executable, *args], timeout, **kwargs)


def _decode(workdir, *args, **kwargs) -> subprocess.CompletedProcess:
    return _run([str(ROOT / "decode.py"), f"--workdir={workdir}", *args], **kwargs)


def _steps(workdir: pathlib.Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def _train_tiny_run(root: pathlib.Path) -> None:
    write_corpus(root / "corpus", pairs=1500)
    trained = _run(TinyRun(root, root / "run", []).train_args(root / "run"), timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> TinyRun:
    """Trained once per session (whichever worker asks first), read by every worker."""
    root = built_once(tmp_path_factory, "tiny-run", _train_tiny_run)
    run = TinyRun(root, root / "run", [])
    assert _steps(run.workdir) == list(range(1, STEPS + 1))
    from tfm.data.prepare import prepare

    corpus = root / "corpus"
    prepared = prepare(f"text:{corpus / 'train.en'},{corpus / 'train.de'}", root / "data", 400)
    sources = [s for s, _ in prepared.texts("test")][:12]
    return dataclasses.replace(run, sources=sources)


def _library_translation(workdir, sources, params, **settings) -> list[str]:
    """What the library translates with `params` (computed in this process, not by decode.py)."""
    loaded = workdirs.load(workdir, step=STEPS)
    config = translate.TranslateConfig(
        max_source_len=translate.max_source_len_for(loaded.model.config), **settings
    )
    return translate.translate(loaded.model, params, loaded.tokenizer, sources, config)


# --- decode.py ----------------------------------------------------------------------------------


def test_decode_reads_stdin_writes_stdout_and_translates_the_step_asked(tiny_run):
    sources = [*tiny_run.sources, "a\rb"]  # a lone CR stays inside its line
    text = "\n".join(sources) + "\n"
    flags = ["--step=4", "--beam_size=2", "--alpha=0.8"]
    first = _decode(
        tiny_run.workdir, *flags, "--streams=1", "--batch_tokens=64", "--kernels=reference",
        input=text,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"loaded checkpoint 4 from {tiny_run.workdir}" in first.stderr
    params, _ = ckpt.Checkpointer(tiny_run.workdir, read_only=True).restore_params(4)
    expected = _library_translation(tiny_run.workdir, sources, params, beam_size=2, alpha=0.8)
    assert first.stdout.splitlines() == expected
    # searches side by side, other batches and the kit's kernels: the same translations
    second = _decode(tiny_run.workdir, *flags, "--streams=2", "--kernels=xla_cpu", input=text)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout == first.stdout


def test_decode_checks_the_references_before_translating(tiny_run, tmp_path):
    (tmp_path / "in.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "ref.txt").write_text("eins\nzwei\n")
    out = tmp_path / "out.txt"
    refused = _decode(
        tiny_run.workdir, f"--input={tmp_path / 'in.txt'}", f"--output={out}",
        f"--reference={tmp_path / 'ref.txt'}",
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"error: {tmp_path / 'ref.txt'}: 2 references but 3 input lines; they must be line-aligned"
    )
    assert not out.exists()  # refused before the output was opened or a checkpoint loaded
    # a step that was never saved: the steps there are
    missing = _decode(tiny_run.workdir, "--step=99", input="a\n")
    assert missing.returncode == 2 and missing.stderr.strip().endswith(
        f"{tiny_run.workdir / 'checkpoints'} has no checkpoint 99; its steps are "
        + ", ".join(map(str, range(1, STEPS + 1)))
    )


def test_decode_averages_the_last_checkpoints_and_says_which(tiny_run, tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(tiny_run.sources) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(tiny_run.sources) + "\n")  # copying scores 100
    out = tmp_path / "out.txt"
    averaged = _decode(
        tiny_run.workdir, "--average=3", f"--input={tmp_path / 'in.txt'}", f"--output={out}",
        f"--reference={tmp_path / 'ref.txt'}", "--beam_size=1",
    )  # fmt: skip
    assert averaged.returncode == 0, averaged.stderr[-3000:]
    scores = json.loads(averaged.stderr.strip().splitlines()[-1])
    assert scores["translated"] == f"average of checkpoints [4, 5, 6] from {tiny_run.workdir}"
    assert "nrefs:1" in scores["signature"] and 0 <= scores["sacrebleu"] <= 100
    # the mean of the three checkpoints' parameters, taken here leaf by leaf in float64
    reader = ckpt.Checkpointer(tiny_run.workdir, read_only=True)
    trees = [reader.restore_params(step)[0] for step in (4, 5, 6)]
    mean = jax.tree.map(lambda *leaves: np.mean(np.stack(leaves), 0, np.float64), *trees)
    mean = jax.tree.map(lambda leaf: leaf.astype(np.float32), mean)
    expected = _library_translation(tiny_run.workdir, tiny_run.sources, mean, beam_size=1)
    assert out.read_text().splitlines() == expected

    # more than there are: all of them, and it says so
    everything = _decode(tiny_run.workdir, "--average=50", input="\n")
    assert everything.returncode == 0, everything.stderr[-3000:]
    assert f"averaging {STEPS} checkpoints [1, 2, 3, 4, 5, 6]" in everything.stderr

    # the module command writes the same average
    written = _run(
        ["-m", "tfm.job.checkpoint", "average", str(tiny_run.workdir), "--last=3",
         f"--output={tmp_path / 'averaged'}"],
    )  # fmt: skip
    assert written.returncode == 0, written.stderr[-3000:]
    import orbax.checkpoint as ocp

    stored = ocp.PyTreeCheckpointer().restore(tmp_path / "averaged")
    for got, want in zip(jax.tree.leaves(stored), jax.tree.leaves(mean), strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)

    # refused in one line, before any checkpoint is read: the output exists, N is 0, no workdir
    average = ["-m", "tfm.job.checkpoint", "average", str(tiny_run.workdir)]
    refusals = {
        (*average, f"--output={tmp_path / 'averaged'}"): (
            f"error: --output {tmp_path / 'averaged'} already exists; name a new directory"
        ),
        (*average, "--last=0", f"--output={tmp_path / 'zero'}"): (
            "error: average the last N checkpoints: N must be at least 1, got 0"
        ),
        ("-m", "tfm.job.checkpoint", "info", str(tmp_path / "nowhere")): (
            f"error: {tmp_path / 'nowhere' / 'checkpoints'}: no checkpoints here"
        ),
    }
    for command, message in refusals.items():
        refused = _run(list(command))
        assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
        assert refused.stderr.startswith(message), refused.stderr
    assert not (tmp_path / "zero").exists()


def test_decode_input_errors_replace_and_overlong_lines(tiny_run, tmp_path):
    good = tiny_run.sources[0].encode()
    overlong = " ".join([tiny_run.sources[1]] * 20).encode()  # past max_positions 32
    data = good + b"\n" + good[:3] + b"\xff\xfe" + good[3:] + b"\n" + overlong + b"\n"
    (tmp_path / "in.txt").write_bytes(data)
    source = f"--input={tmp_path / 'in.txt'}"

    strict = _decode(tiny_run.workdir, source)
    assert strict.returncode == 2
    assert f"{tmp_path / 'in.txt'}, line 2: invalid UTF-8" in strict.stderr
    assert "--encoding_errors replace" in strict.stderr and "loaded" not in strict.stderr

    refused = _decode(tiny_run.workdir, source, "--encoding_errors=replace", "--overlong=error")
    assert refused.returncode == 2 and "line 3" in refused.stderr
    assert refused.stdout == ""

    kept = _decode(tiny_run.workdir, source, "--encoding_errors=replace", "--overlong=truncate")
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert "1 lines had invalid UTF-8 replaced by U+FFFD" in kept.stderr
    assert "truncat" in kept.stderr
    assert len(kept.stdout.splitlines()) == 3


def test_translations_are_written_as_they_are_done(tiny_run, tmp_path):
    """decode.py translates in blocks of 1,000 lines and writes each block as it is done: killed
    as soon as the first line reaches its reader, it has not written them all."""
    lines = [tiny_run.sources[i % len(tiny_run.sources)] for i in range(2500)]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "decode.py"), f"--workdir={tiny_run.workdir}",
         f"--input={tmp_path / 'in.txt'}", "--beam_size=1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        first = bounded.readline_within(process, 300)
        process.kill()
        written = first + process.stdout.read()
    finally:
        process.kill()
        process.wait(timeout=60)
    assert first, "decode.py wrote nothing"
    assert 1 <= len(written.splitlines()) < len(lines)


# --- damaged checkpoints, through the commands --------------------------------------------------


def test_each_damaged_part_is_refused_and_training_resumes_before_it(tiny_run, tmp_path):
    workdir = tiny_run.copy(tmp_path)
    digests = {}
    info = _run(["-m", "tfm.job.checkpoint", "info", str(tiny_run.workdir)])
    for line in info.stdout.splitlines()[1:]:
        step, digest = line.split()
        digests[int(step)] = digest
    damaged = dict(zip((6, 5, 4, 3), checkpoint_damage.PARTS, strict=True))
    for step, part in damaged.items():
        checkpoint_damage.damage(workdir / "checkpoints" / str(step), part)

    verify = _run(["-m", "tfm.job.checkpoint", "verify", str(workdir)])
    assert verify.returncode == 1 and "2 verified, 4 damaged" in verify.stdout
    for step, part in damaged.items():
        refused = _decode(workdir, f"--step={step}", input="a\n")
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert f"checkpoint {step} in {workdir / 'checkpoints'} is damaged: {part}" in (
            refused.stderr
        )
        assert refused.stdout == ""
    averaged = _decode(workdir, "--average=3", "--beam_size=1", input="a\n")
    assert averaged.returncode == 0, averaged.stderr[-3000:]
    assert "averaging 2 checkpoints [1, 2]" in averaged.stderr
    assert _steps(workdir) == list(range(1, STEPS + 1))  # decode.py moves nothing

    # train.py sets each damaged one aside, resumes from step 2 and retrains to the same step 6
    resumed = _run(tiny_run.train_args(workdir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for step, part in damaged.items():
        assert f"checkpoint {step} in {workdir / 'checkpoints'} is damaged: {part}" in (
            resumed.stderr
        )
        assert (workdir / "checkpoints" / f"{step}.damaged").is_dir()
    assert "Resumed from step 2" in resumed.stderr
    info = _run(["-m", "tfm.job.checkpoint", "info", str(workdir)])
    again = dict(line.split() for line in info.stdout.splitlines()[1:])
    assert again[str(STEPS)] == digests[STEPS]  # bit-identical to the undamaged run


# --- stopping train.py ----------------------------------------------------------------------------


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])  # Ctrl-C; a scheduler's preemption
def test_a_stop_signal_saves_a_checkpoint_and_profile_writes_a_trace(tiny_run, tmp_path, stop):
    workdir = tiny_run.copy(tmp_path)
    metrics = workdir / "metrics.jsonl"
    logged = len(metrics.read_text().splitlines())
    extra = ["--config.checkpoint_every_steps=100000"]
    with open(tmp_path / "train.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, *tiny_run.train_args(workdir, 100000, extra), "--profile"],
            cwd=ROOT, stdout=log, stderr=log,
        )  # fmt: skip
    try:
        # --profile traces the 3rd to 5th steps of the run: stopped after them
        traced = lambda: any((workdir / "profile").rglob("*.xplane.pb"))  # noqa: E731
        more = lambda: len(metrics.read_text().splitlines()) > logged + 5  # noqa: E731
        finished = lambda: traced() and more()  # noqa: E731
        log = tmp_path / "train.log"
        assert bounded.wait_for(finished, 300, process), log.read_text()[-3000:]
        process.send_signal(getattr(signal, stop))
        process.wait(timeout=120)
    finally:
        process.kill()
        process.wait(timeout=60)
    output = (tmp_path / "train.log").read_text()
    assert process.returncode == 0, output[-3000:]
    saved = re.search(rf"Received {stop}: saved checkpoint (\d+)", output)
    assert saved, output[-3000:]
    assert _steps(workdir)[-1] == int(saved.group(1)) > STEPS


def test_a_wrong_config_value_is_one_line_naming_the_key(tiny_run, tmp_path):
    out = _run(tiny_run.train_args(tmp_path / "new", extra=["--config.learning_rate_scale=-1"]))
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1
    assert "learning_rate_scale" in out.stderr and "-1" in out.stderr
    assert not (tmp_path / "new").exists()


def test_a_config_file_that_does_not_load_is_one_line_naming_it(tmp_path):
    """A missing file, one with a syntax error, an unknown row: each one line, nothing made."""
    broken = tmp_path / "broken.py"
    broken.write_text("def get_config(:\n")
    expected = {
        "configs/no_such_file.py": "error: --config: [Errno 2] No such file or directory: "
        "'configs/no_such_file.py'",
        str(broken): f"error: {broken}:1: invalid syntax",
        "configs/table3_mini.py:Z9": "error: ValueError: configs/table3_mini.py:Z9: unknown row",
    }
    for config, message in expected.items():
        out = _run([str(ROOT / "train.py"), f"--config={config}", f"--workdir={tmp_path / 'w'}"])
        assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith(message), out.stderr
    assert not (tmp_path / "w").exists()


def test_nodistributed_leaves_a_configured_cluster_alone(tiny_run):
    """TFM_COORDINATOR names a cluster that does not exist: train.py would wait for it; with
    --nodistributed it runs alone (here: finds the run complete)."""
    cluster = {"TFM_COORDINATOR": "127.0.0.1:9", "TFM_NUM_PROCESSES": "2", "TFM_PROCESS_ID": "1"}
    out = _run(
        [*tiny_run.train_args(tiny_run.workdir), "--nodistributed"],
        env={**os.environ, **cluster},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"Training already complete: step {STEPS}" in out.stderr


INF_LOSS_TRAIN = """
import runpy, sys
from tfm import training
real = training.batch_loss
def overflowing(*args, **kwargs):
    terms = real(*args, **kwargs)
    return dict(terms, loss=terms["loss"] * float("inf"))
training.batch_loss = overflowing
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_loss_stops_naming_the_step_and_keeps_the_checkpoints(
    tiny_run, tmp_path, value
):
    """NaN: a learning rate of 1e30 from step 7 on (this model's overflow reaches attention first
    and turns into NaN); Inf: the loss scaled by +inf in the process's own train step, as no
    overflow of this model makes one."""
    workdir = tiny_run.copy(tmp_path)
    before = _steps(workdir)
    if value == "nan":
        out = _run(tiny_run.train_args(workdir, STEPS + 4, ["--config.learning_rate_scale=1e30"]))
        failed_at, kept = STEPS + 2, [*before, STEPS + 1]  # step 7 is finite, its update is not
    else:
        out = _run(["-c", INF_LOSS_TRAIN, *tiny_run.train_args(workdir, STEPS + 4)])
        failed_at, kept = STEPS + 1, before
    assert out.returncode == 1, out.stderr[-3000:]
    assert f"loss is {value} at step {failed_at}" in out.stderr
    assert "The last good checkpoint is kept" in out.stderr
    assert _steps(workdir) == kept


def test_a_workdir_holds_one_run_and_one_writer(tiny_run, tmp_path):
    workdir = tiny_run.copy(tmp_path)
    card, listing = (workdir / "model.json").read_text(), sorted(workdir.iterdir())

    # another model in the same workdir: one line, before anything is written
    other = _run(tiny_run.train_args(workdir, extra=["--config.model.d_ff=128"]))
    assert other.returncode == 1
    assert "holds checkpoints of another run (model.d_ff: 64 -> 128)" in other.stderr
    assert "--start_over" in other.stderr
    assert (workdir / "model.json").read_text() == card and sorted(workdir.iterdir()) == listing

    # more steps of the same run: allowed, and said
    longer = _run(tiny_run.train_args(workdir, STEPS + 1))
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert f"num_train_steps: {STEPS} -> {STEPS + 1}" in longer.stderr

    # starting over keeps the old run in previous-1
    wider = ["--config.model.d_ff=128"]
    over = _run([*tiny_run.train_args(workdir, 2, wider), "--start_over"])
    assert over.returncode == 0, over.stderr[-3000:]
    assert _steps(workdir) == [1, 2]
    assert _steps(workdir / "previous-1") == list(range(1, STEPS + 2))

    # a second writer while the first runs: stopped at once, naming the first
    with open(tmp_path / "long.log", "w") as log:
        running = subprocess.Popen(
            [sys.executable, *tiny_run.train_args(workdir, 100000, wider)],
            cwd=ROOT, stdout=log, stderr=log,
        )  # fmt: skip
    try:
        grew = lambda: len(_steps(workdir)) > 2  # noqa: E731
        assert bounded.wait_for(grew, 300, running), (tmp_path / "long.log").read_text()[-3000:]
        second = _run(tiny_run.train_args(workdir, 100000, wider))
        assert second.returncode == 1
        assert f"is in use by process {running.pid}" in second.stderr
    finally:
        running.kill()
        running.wait(timeout=60)


# --- module commands --------------------------------------------------------------------------


def test_prepare_reports_what_it_built_and_reused(tiny_run, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_run.root / "corpus", corpus)
    lines = (corpus / "train.en").read_bytes().splitlines()
    lines[7] = lines[7] + b" \xff"
    (corpus / "train.en").write_bytes(b"\n".join(lines) + b"\n")
    spec = f"text:{corpus / 'train.en'},{corpus / 'train.de'}"
    args = ["-m", "tfm.data.prepare", spec, f"--data_dir={tmp_path / 'data'}", "--vocab_size=400"]

    strict = _run(args)
    assert strict.returncode != 0 and "line 8" in strict.stderr and "invalid UTF-8" in strict.stderr
    assert len(strict.stderr.strip().splitlines()) == 1

    built = _run([*args, "--encoding_errors=replace"])
    assert built.returncode == 0, built.stderr[-3000:]
    summary = json.loads(built.stdout)
    assert summary["counted_while_reading"] == {"lines_with_invalid_utf8_replaced": 1}
    assert set(summary["caches"].values()) == {"built"}
    again = json.loads(_run([*args, "--encoding_errors=replace"]).stdout)
    assert set(again["caches"].values()) == {"reused"}
    assert again["dataset_fingerprint"] == summary["dataset_fingerprint"]
    # train.py on the same corpus: refused naming the line and its own flag, then trained on it
    train = [
        str(ROOT / "train.py"), f"--config.dataset={spec}",
        f"--config.data_dir={tmp_path / 'data'}", "--config.num_train_steps=1", *TINY,
    ]  # fmt: skip
    refused = _run([*train, f"--workdir={tmp_path / 'refused'}"])
    assert refused.returncode != 0 and "line 8: invalid UTF-8" in refused.stderr
    assert "--config.encoding_errors=replace (train.py)" in refused.stderr
    assert not (tmp_path / "refused" / "checkpoints").exists()
    trained = _run([*train, f"--workdir={tmp_path / 'run'}", "--config.encoding_errors=replace"])
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert _steps(tmp_path / "run") == [1]
    # a training target edited in place (the line count unchanged): vocabulary and ids built anew
    targets = (corpus / "train.de").read_text().splitlines()
    index = next(
        i for i, line in enumerate(lines) if split_of(line.decode("utf-8", "replace")) == "train"
    )
    targets[index] = "EDITED ZZZ QQQ"
    (corpus / "train.de").write_text("\n".join(targets) + "\n")
    edited = json.loads(_run([*args, "--encoding_errors=replace"]).stdout)
    assert edited["caches"]["vocabulary"] == "built" and edited["caches"]["ids_train"] == "built"
    assert edited["dataset_fingerprint"] != summary["dataset_fingerprint"]

    # a vocabulary below the characters the text needs: one line naming the number
    original = tiny_run.root / "corpus"
    too_small = _run(
        ["-m", "tfm.data.prepare", f"text:{original / 'train.en'},{original / 'train.de'}",
         f"--data_dir={tmp_path / 'other'}", "--vocab_size=20"]
    )  # fmt: skip
    assert too_small.returncode != 0 and len(too_small.stderr.strip().splitlines()) == 1
    assert re.search(r"vocab_size=20 is smaller than the \d+ distinct characters", too_small.stderr)


def test_params_prints_the_table3_parameter_counts():
    """Every row within 8% of the paper's printed count (its exact vocabulary is unpublished);
    four rows equal to the count by hand."""
    out = _run(["-m", "tfm.params"])
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()[2:]}
    assert len(rows) == 20
    for row, (tfm_millions, paper_millions, _) in rows.items():
        assert abs(float(tfm_millions) / float(paper_millions) - 1) <= 0.08, row
    for row, (layers, d_model, d_ff, heads, d_k, paper) in {
        "base": (6, 512, 2048, 8, 64, 65),
        "C_N2": (2, 512, 2048, 8, 64, 36),
        "B16": (6, 512, 2048, 8, 16, 58),
        "big": (6, 1024, 4096, 16, 64, 213),
    }.items():
        by_hand = _closed_form_count(37000, layers, d_model, d_ff, heads, d_k, 64)
        assert float(rows[row][0]) == round(by_hand / 1e6, 2)
        assert float(rows[row][1]) == paper
    bad = _run(["-m", "tfm.params", "--vocab_size", "0"])
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith(
        "--vocab_size must be a positive integer, got 0"
    )
