"""The command line of the training job (`tfm.job.trainer`): read a config file once, train a
Transformer, then translate and score the test split.

    python train.py [--config configs/NAME.py] [--workdir DIR] [--config.key=value ...]

With no flags: configs/default.py (the embedded gettext En->De corpus, CPU-sized) in
workdirs/default. Running again with the same workdir resumes, or reports that training is done.
"""

import pathlib
import re
import sys

if __name__ == "__main__":  # first thing, and only when asked: see tfm/cpu_host/host_memory.py
    from tfm.cpu_host import host_memory

    host_memory.restart_if_asked("--huge_page_malloc")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # configs/ import each other as a package


def _unknown_key(error: Exception) -> SystemExit:
    overrides = [arg.split("=")[0] for arg in sys.argv[1:] if arg.startswith("--config.")]
    # ml_collections' KeyError starts with the missing key (quoted): name the override that
    # failed, not every one given
    missing = re.search(r"[A-Za-z_]\w*", str(error))
    if missing:
        overrides = [o for o in overrides if o.rsplit(".", 1)[-1] == missing.group()] or overrides
    suggestion = re.search(r'Did you mean "([^"]+)"', str(error))
    hint = f' (did you mean "{suggestion.group(1)}"?)' if suggestion else ""
    return SystemExit(
        f"error: {' '.join(overrides) or 'the config'}: no such key in the config{hint}; the "
        "keys are listed in configs/common.py"
    )


try:  # ml_collections applies --config.KEY=VALUE while defining the flag
    config_flags.DEFINE_config_file(
        "config",
        str(ROOT / "configs" / "default.py"),
        "Config file (a Python file with get_config()).",
        lock_config=True,
    )
except (AttributeError, KeyError) as error:
    raise _unknown_key(error) from None
flags.DEFINE_string(
    "workdir", None, "Checkpoints, metrics and results go here (default: workdirs/<config name>)."
)
flags.DEFINE_bool("profile", False, "Write a JAX profiler trace of steps 3-5 to WORKDIR/profile.")
flags.DEFINE_bool(
    "start_over",
    False,
    "Move the workdir's previous run (checkpoints, metrics, results, model card) aside to "
    "WORKDIR/previous-N, then train from scratch.",
)
flags.DEFINE_string(
    "compilation_cache_dir",
    None,
    "Persistent JAX compilation cache, shared with decode.py: a resumed run loads its compiled "
    "steps, and decode.py on this machine loads the programs that the final translation "
    "compiled (default: $TFM_COMPILATION_CACHE or ~/.cache/tfm/jax; '' = off).",
)
flags.DEFINE_bool(
    "huge_page_malloc",
    False,
    "Restart once with glibc's malloc asking for transparent huge pages: faster XLA:CPU steps "
    "with large scratch buffers (Linux, glibc >= 2.35; also TFM_HUGE_PAGE_MALLOC=1).",
)
flags.DEFINE_bool(
    "check_config",
    False,
    "Read the config and its --config.KEY=VALUE overrides, say what is wrong with them (or that "
    "they are valid) and exit: nothing is prepared, trained or written.",
)
flags.DEFINE_bool(
    "distributed",
    True,
    "Start JAX's distributed runtime when a cluster is detected (Slurm, Open MPI, TPU pods) or "
    "TFM_COORDINATOR is set; --nodistributed runs this process alone.",
)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every file operation at INFO
    from tfm import compilation_cache
    from tfm.job import parallel, trainer
    from tfm.job.checkpoint import CheckpointError
    from tfm.job.config import job_config_from
    from tfm.job.workdir import WorkdirError

    if FLAGS.check_config:
        try:
            job_config_from(FLAGS.config)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        print("the config is valid (--check_config: nothing trained)", file=sys.stderr)
        return 0
    workdir = FLAGS.workdir or str(
        ROOT / "workdirs" / pathlib.Path(flags.FLAGS["config"].config_filename).stem
    )
    cache = FLAGS.compilation_cache_dir
    compilation_cache.enable(compilation_cache.default_directory() if cache is None else cache)
    if FLAGS.distributed:
        parallel.initialize_distributed()
    try:
        config = job_config_from(FLAGS.config)
        result = trainer.train_and_evaluate(
            config, workdir, profile=FLAGS.profile, start_over=FLAGS.start_over
        )
    except (
        ValueError,
        FileNotFoundError,
        trainer.TrainingDiverged,
        WorkdirError,
        CheckpointError,
    ) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(trainer.format_report(result))
    return 0


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's parse, each failure said in one line: a config file's own error arrives with its
    traceback (its last line says it), and a file that fails to load is only reported when
    the config is first read."""
    try:
        argv = FLAGS(argv)
    except flags.Error as error:
        raise SystemExit(f"error: {_last_line(error)}") from None
    except SyntaxError as error:
        raise SystemExit(f"error: {error.filename}:{error.lineno}: {error.msg}") from None
    try:
        FLAGS.config.get("model")
    except OSError as error:
        raise SystemExit(f"error: --config: {_last_line(error)}") from None
    return argv


def _last_line(error: Exception) -> str:
    return str(error).strip().splitlines()[-1].strip()


if __name__ == "__main__":
    try:
        app.run(main, flags_parser=_parse_flags)
    except (AttributeError, KeyError) as error:
        if FLAGS.is_parsed():
            raise  # not from the flags: a bug, shown in full
        raise _unknown_key(error) from None  # a --config.KEY that the config file lacks
