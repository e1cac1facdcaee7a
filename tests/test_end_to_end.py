"""The main job through train.py and decode.py, in subprocesses (marked slow)."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tests import bounded
from tests.e2e_corpus import write_corpus
from tests.subprocess_json import run_in_repo
from tfm.cpu_host import saved_programs
from tfm.job.checkpoint import Checkpointer

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

SMALL = [
    "--config.vocab_size=400",
    "--config.max_seq_len=24",
    "--config.batch_tokens=768",
    "--config.model.num_layers=2",
    "--config.model.d_model=64",
    "--config.model.d_ff=128",
    "--config.model.num_heads=4",
    "--config.model.d_k=16",
    "--config.model.d_v=16",
    "--config.model.max_positions=64",
    "--config.model.dropout_rate=0.0",
    "--config.warmup_steps=60",
    "--config.learning_rate_scale=0.5",
    "--config.eval_batches=2",
    "--config.decode.batch_tokens=2048",
]
# for the tests of processes, devices and resuming, where depth changes nothing but compile time
ONE_LAYER = ["--config.model.num_layers=1"]


def _args(tmp_path, workdir, steps, extra=()):
    src, tgt = write_corpus(tmp_path / "corpus")
    return [
        sys.executable,
        str(ROOT / "train.py"),
        "--workdir",
        str(workdir),
        f"--config.dataset=text:{src},{tgt}",
        f"--config.data_dir={tmp_path / 'data'}",
        f"--config.num_train_steps={steps}",
        *SMALL,
        *extra,
    ]


def _run(argv, timeout=900, env=None):
    return run_in_repo(argv, timeout, env=env)


def _decode(workdir, *args):
    """decode.py on `workdir` with `args`, in a subprocess."""
    return _run([sys.executable, str(ROOT / "decode.py"), "--workdir", str(workdir), *args])


def _prepared(tmp_path):
    """The end-to-end corpus as the job prepared it (its splits and vocabulary)."""
    from tfm.data.prepare import prepare

    corpus = tmp_path / "corpus"
    return prepare(f"text:{corpus / 'train.en'},{corpus / 'train.de'}", tmp_path / "data", 400)


def _digest(workdir) -> dict[int, str]:
    out = _run([sys.executable, "-m", "tfm.job.checkpoint", "info", str(workdir)], timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines()[1:]]
    return {int(step): digest for step, digest in rows}


def _check_validation_bleu(tmp_path, workdir, records) -> None:
    """The sacreBLEU logged while training is greedy BLEU of the validation split at that step:
    recomputed here from the step's checkpoint with the sacrebleu library."""
    import sacrebleu

    from tfm.inference import translate
    from tfm.job.workdir import load

    scored = {
        r["step"]: r["sacrebleu"] for r in records if r["kind"] == "eval" and "sacrebleu" in r
    }
    assert sorted(scored) == [200, 400]
    assert scored[400] > scored[200]
    loaded = load(workdir, step=400, average=1)
    pairs = _prepared(tmp_path).texts("validation")
    greedy = translate.TranslateConfig(beam_size=1, max_source_len=96)
    hypotheses = translate.translate(
        loaded.model, loaded.params, loaded.tokenizer, [s for s, _ in pairs], greedy
    )
    expected = sacrebleu.corpus_bleu(hypotheses, [[t for _, t in pairs]]).score
    assert abs(scored[400] - expected) < 1e-6


def _check_decode_loads_the_jobs_programs(tmp_path, workdir, cache) -> None:
    """decode.py on the test split, with the job's decoding settings and the compilation cache
    train.py wrote: the job's test translations again, and no search program compiled anew."""
    test_sources = [s for s, _ in _prepared(tmp_path).texts("test")]
    (tmp_path / "test.en").write_text("\n".join(test_sources) + "\n")
    searches = {p.name for p in cache.iterdir() if p.name.startswith("jit_stream-")}
    assert searches  # the job's beam search over the test split, one program per length bucket
    decoded = _decode(
        workdir,
        "--input",
        str(tmp_path / "test.en"),
        "--output",
        str(tmp_path / "test.out"),
        "--batch_tokens=2048",  # as the job's config.decode.batch_tokens
        f"--compilation_cache_dir={cache}",
    )
    assert decoded.returncode == 0, decoded.stderr[-3000:]
    expected = (workdir / "test_translations.txt").read_text().splitlines()
    assert (tmp_path / "test.out").read_text().splitlines() == expected
    assert {p.name for p in cache.iterdir() if p.name.startswith("jit_stream-")} == searches


def test_main_job_trains_checkpoints_translates_and_scores(tmp_path):
    workdir = tmp_path / "run"
    args = _args(
        tmp_path,
        workdir,
        400,
        [
            "--config.checkpoint_every_steps=50",
            "--config.eval_every_steps=200",
            "--config.log_every_steps=50",
            "--config.eval_bleu_every_steps=200",
            f"--compilation_cache_dir={tmp_path / 'train-cache'}",
        ],
    )
    first = _run(args)
    assert first.returncode == 0, first.stderr[-3000:]
    results = json.loads((workdir / "results.json").read_text())
    test = results["test"]
    assert test["sacrebleu"]["score"] > test["copy_source_sacrebleu"]["score"] + 20
    assert "sacreBLEU" in first.stdout and "copy-source floor" in first.stdout
    assert (workdir / "loss_curve.png").stat().st_size > 10_000
    assert sorted(_digest(workdir)) == list(range(50, 401, 50))
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert losses[-1] < 0.5 * losses[0]
    _check_validation_bleu(tmp_path, workdir, records)
    assert list((workdir / "tensorboard").iterdir())

    # the same command again: nothing is retrained
    again = _run(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Training already complete: step 400" in again.stderr
    _check_decode_loads_the_jobs_programs(tmp_path, workdir, tmp_path / "train-cache")

    # decode.py on the workdir, with a reference
    sources = (tmp_path / "corpus" / "train.en").read_text().splitlines()[:40]
    references = (tmp_path / "corpus" / "train.de").read_text().splitlines()[:40]
    (tmp_path / "in.txt").write_text("\n".join(sources[:20] + [""] + sources[20:]) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(references[:20] + [""] + references[20:]) + "\n")
    decoded = _decode(
        workdir,
        "--input",
        str(tmp_path / "in.txt"),
        "--reference",
        str(tmp_path / "ref.txt"),
        "--output",
        str(tmp_path / "out.txt"),
        f"--compilation_cache_dir={tmp_path / 'jax-cache'}",
    )
    assert decoded.returncode == 0, decoded.stderr[-3000:]
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert len(lines) == 41 and lines[20] == ""  # input order kept, empty line stays empty
    scores = json.loads(decoded.stderr.strip().splitlines()[-1])
    assert scores["sacrebleu"] > 40 and "nrefs:1" in scores["signature"]
    # the same command again compiles nothing: every program comes from the persistent cache,
    # the decoding programs from tfm's saved programs (untraced)
    cached = _files(tmp_path / "jax-cache")
    assert any(name.startswith(f"{saved_programs.SUBDIRECTORY}/") for name in cached)
    again = _run(decoded.args)
    assert again.returncode == 0 and (tmp_path / "out.txt").read_text().splitlines() == lines
    assert _files(tmp_path / "jax-cache") == cached
    picture = tmp_path / "attention.png"
    plotted = _decode(workdir, "--plot_attention", str(picture), sources[0])
    assert plotted.returncode == 0, plotted.stderr[-3000:]
    assert picture.stat().st_size > 20_000
    missing = _decode(tmp_path)
    assert missing.returncode == 2 and "model.json" in missing.stderr


def _files(directory: pathlib.Path) -> dict[str, int]:
    """Each file under `directory` (relative path) with its modification time."""
    return {
        str(p.relative_to(directory)): p.stat().st_mtime_ns
        for p in directory.rglob("*")
        if p.is_file()
    }


def _two_processes(args, port, log_dir):
    """The same train.py command as processes 0 and 1 of a jax.distributed job on 127.0.0.1,
    each with 2 CPU devices and gloo collectives. Their output goes to `log_dir/rank{i}.log`:
    an unread pipe fills up and blocks the writer, which stalls the whole job at the next
    collective."""
    processes = []
    log_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(2):
        env = dict(
            os.environ,
            XLA_FLAGS="--xla_force_host_platform_device_count=2",
            JAX_PLATFORMS="cpu",
            TFM_COORDINATOR=f"127.0.0.1:{port}",
            TFM_NUM_PROCESSES="2",
            TFM_PROCESS_ID=str(rank),
        )
        with open(log_dir / f"rank{rank}.log", "w") as log:
            processes.append(
                subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            )
    return processes


def _log_tail(log_dir, rank: int) -> str:
    return (log_dir / f"rank{rank}.log").read_text(errors="replace")[-3000:]


def test_sigkill_and_restart_ends_bit_identical(tmp_path):
    steps = 36
    extra = [
        *ONE_LAYER,
        "--config.checkpoint_every_steps=7",
        "--config.log_every_steps=5",
        "--config.eval_every_steps=1000",
        "--config.decode.enabled=False",
        "--config.model.dropout_rate=0.1",
    ]
    reference = _run(_args(tmp_path, tmp_path / "straight", steps, extra))
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = _digest(tmp_path / "straight")

    workdir = tmp_path / "killed"
    kill_after = 14  # the second checkpoint: 22 steps still to run when it appears
    process = subprocess.Popen(
        _args(tmp_path, workdir, steps, extra),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoint = workdir / "checkpoints" / str(kill_after)
    assert bounded.wait_for(checkpoint.exists, 600, process)
    assert process.poll() is None, "the run finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    resumed = _run(_args(tmp_path, workdir, steps, extra))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resumed from step" in resumed.stderr
    got = _digest(workdir)
    assert got[steps] == expected[steps]
    # the records the killed run wrote after its last checkpoint are not repeated
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    logged = {s for s in range(1, steps + 1) if s % 5 == 0 or s % 7 == 0 or s == steps}
    assert train_steps == sorted(logged)  # every log and checkpoint step once


def _free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (the OS picks it), for the coordinator of
    two local processes: fixed ports collide with other runs on the same machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_processes_equal_one_process(tmp_path):
    steps = 12
    extra = [
        *ONE_LAYER,
        "--config.checkpoint_every_steps=12",
        "--config.decode.enabled=False",
        "--config.eval_every_steps=1000",
        "--config.log_every_steps=4",
    ]
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu"
    )
    single = _run(_args(tmp_path, tmp_path / "one", steps, extra), env=env)
    assert single.returncode == 0, single.stderr[-3000:]

    logs = tmp_path / "logs"
    processes = _two_processes(
        _args(tmp_path, tmp_path / "two", steps, extra),
        port=_free_port(),
        log_dir=logs,
    )
    for rank, p in enumerate(processes):
        assert p.wait(timeout=900) == 0, _log_tail(logs, rank)
    one, _ = Checkpointer(tmp_path / "one", read_only=True).restore_params()
    two, _ = Checkpointer(tmp_path / "two", read_only=True).restore_params()
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_the_pmap_job_equals_the_mesh_job(tmp_path):
    """`parallelism=pmap` (PmapSteps: replicated state, psum of gradients) trains the same
    parameters as the default mesh path over the same 4 devices."""
    extra = [
        *ONE_LAYER,
        "--config.checkpoint_every_steps=8",
        "--config.decode.enabled=False",
        "--config.eval_every_steps=4",
        "--config.log_every_steps=4",
    ]
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu"
    )
    for name, parallelism in (("mesh", "data"), ("pmap", "pmap")):
        args = _args(tmp_path, tmp_path / name, 8, [*extra, f"--config.parallelism={parallelism}"])
        run = _run(args, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
    mesh, _ = Checkpointer(tmp_path / "mesh", read_only=True).restore_params()
    pmap, _ = Checkpointer(tmp_path / "pmap", read_only=True).restore_params()
    for a, b in zip(jax.tree.leaves(mesh), jax.tree.leaves(pmap), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_a_killed_peer_makes_the_survivor_exit(tmp_path, monkeypatch):
    """The survivor notices within TFM_HEARTBEAT_TIMEOUT (60 s by default; 10 here) and exits
    instead of hanging in its next collective."""
    monkeypatch.setenv("TFM_HEARTBEAT_TIMEOUT", "10")
    port = _free_port()
    extra = [
        *ONE_LAYER,
        "--config.checkpoint_every_steps=100000",
        "--config.decode.enabled=False",
        "--config.eval_every_steps=100000",
        "--config.log_every_steps=1",
    ]
    logs = tmp_path / "logs"
    processes = _two_processes(
        _args(tmp_path, tmp_path / "two", 100000, extra), port=port, log_dir=logs
    )
    metrics = tmp_path / "two" / "metrics.jsonl"
    started = bounded.wait_for(
        lambda: metrics.exists() and metrics.stat().st_size > 0, 600, processes[0]
    )
    if not started:
        for p in processes:
            p.kill()
    assert started, _log_tail(logs, 0) + "\n--- rank 1 ---\n" + _log_tail(logs, 1)
    processes[1].send_signal(signal.SIGKILL)
    killed_at = time.time()
    try:
        processes[0].wait(timeout=90)
    except subprocess.TimeoutExpired:
        processes[0].kill()
        pytest.fail("the surviving process still runs 90 s after its peer was killed")
    assert time.time() - killed_at < 60
    assert processes[0].returncode != 0
