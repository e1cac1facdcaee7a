"""The command line of the training job (`tfm.trainer`): read a config file once, train a
Transformer, then translate and score the test split.

    python train.py [--config configs/NAME.py] [--workdir DIR] [--config.key=value ...]

With no flags: configs/default.py (the embedded gettext En->De corpus, CPU-sized) in
workdirs/default. Running again with the same workdir resumes, or reports that training is done.
"""

import pathlib
import sys

from absl import app, flags, logging
from ml_collections import config_flags

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # configs/ import each other as a package

config_flags.DEFINE_config_file(
    "config",
    str(ROOT / "configs" / "default.py"),
    "Config file (a Python file with get_config()).",
    lock_config=True,
)
flags.DEFINE_string(
    "workdir", None, "Checkpoints, metrics and results go here (default: workdirs/<config name>)."
)
flags.DEFINE_bool("profile", False, "Write a JAX profiler trace of steps 3-5 to WORKDIR/profile.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every file operation at INFO
    from tfm import trainer
    from tfm.job import job_config_from

    workdir = FLAGS.workdir or str(
        ROOT / "workdirs" / pathlib.Path(flags.FLAGS["config"].config_filename).stem
    )
    try:
        config = job_config_from(FLAGS.config)
        result = trainer.train_and_evaluate(config, workdir, profile=FLAGS.profile)
    except (ValueError, FileNotFoundError, trainer.TrainingDiverged) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(trainer.format_report(result))
    return 0


if __name__ == "__main__":
    app.run(main)
