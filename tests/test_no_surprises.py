"""A library user's process is theirs: importing tfm or calling its functions changes no JAX
setting, starts no distributed runtime and writes nowhere unasked."""

import json
import subprocess
import sys

import jax
import pytest

from tests.subprocess_json import ROOT, last_json_line
from tfm import compilation_cache
from tfm.cpu_host import saved_programs

CALLING_THE_JOB = """
import json, os, sys
import jax
before = {k: v for k, v in jax.config.values.items()}
import tfm
from configs import default
from tfm.job import trainer
from tfm.job.config import job_config_from

config = default.get_config()
config.dataset = "tsv:" + sys.argv[1]  # a corpus that is not there: the job stops at its data
config.data_dir = sys.argv[2]
try:
    trainer.train_and_evaluate(job_config_from(config), sys.argv[2])
    stopped = None
except Exception as error:
    stopped = f"{type(error).__name__}: {error}"
after = {k: v for k, v in jax.config.values.items()}
changed = sorted(k for k in after if repr(after[k]) != repr(before.get(k)))
print(json.dumps(dict(stopped=stopped, changed=changed,
                      distributed=jax.distributed.is_initialized())))
"""


def test_calling_the_training_job_on_a_cluster_node_leaves_jax_as_it_was(tmp_path):
    """Slurm's variables are what made train_and_evaluate start jax.distributed before; a
    library call must not (train.py's command line does, unless --nodistributed)."""
    environment = {"SLURM_JOB_ID": "1234", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"}
    process = subprocess.run(
        [sys.executable, "-c", CALLING_THE_JOB, str(tmp_path / "missing.tsv"), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**__import__("os").environ, **environment},
        timeout=300,
    )
    assert process.returncode == 0, process.stderr[-2000:]
    result = last_json_line(process.stdout)
    assert result["stopped"] and "missing.tsv" in result["stopped"]
    assert result["changed"] == []
    assert result["distributed"] is False


def test_a_jax_cache_directory_set_by_the_user_gets_no_saved_programs(tmp_path):
    own = tmp_path / "tfm-cache"
    previous = {
        name: getattr(jax.config, name)
        for name in (
            "jax_compilation_cache_dir",
            "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes",
        )
    }
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "users"))
        assert saved_programs.directory() is None  # JAX's own cache only
        compilation_cache.enable(str(own))
        assert saved_programs.directory() == own / saved_programs.SUBDIRECTORY
    finally:
        for name, value in previous.items():
            jax.config.update(name, value)


@pytest.mark.parametrize("module", ["tfm", "tfm.inference.decoding", "tfm.job.trainer"])
def test_importing_changes_no_jax_or_matplotlib_setting(module):
    """JAX's settings, and matplotlib's backend (the trainer draws its loss curve): a user who
    chose the pdf backend keeps it."""
    code = (
        "import json, jax, matplotlib\n"
        "matplotlib.use('pdf')\n"
        "before = {k: repr(v) for k, v in jax.config.values.items()}\n"
        "before['matplotlib backend'] = matplotlib.get_backend()\n"
        f"import {module}\n"
        "after = {k: repr(v) for k, v in jax.config.values.items()}\n"
        "after['matplotlib backend'] = matplotlib.get_backend()\n"
        "print(json.dumps(sorted(k for k in after if after[k] != before.get(k))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_suite_pins_the_cpu_platform_even_where_another_is_the_default():
    """A GPU user's jaxlib makes CUDA JAX's default; the suite's conftest must win. Here a
    subprocess asks JAX for a platform this host lacks first (as a CUDA jaxlib's default
    would be) and then loads the conftest's setting: JAX initialises the CPU only."""
    code = (
        "import os, json\n"
        "os.environ['JAX_PLATFORMS'] = 'cuda'\n"  # what a GPU install defaults to
        "import tests.conftest\n"
        "import jax\n"
        "print(json.dumps([jax.default_backend(), os.environ['JAX_PLATFORMS']]))"
    )
    environment = {k: v for k, v in __import__("os").environ.items() if k != "TFM_TEST_PLATFORMS"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environment,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["cpu", "cpu"]
    # and without the conftest, the same process would have asked for CUDA and failed
    bare = subprocess.run(
        [sys.executable, "-c", "import jax; jax.devices()"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**environment, "JAX_PLATFORMS": "cuda"},
        timeout=300,
    )
    assert bare.returncode != 0
