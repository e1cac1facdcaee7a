"""`import tfm` (and the export package's own modules) must not pull in torch, transformers or
CTranslate2: they are an optional extra."""

import subprocess
import sys

HEAVY = ("torch", "transformers", "ctranslate2")


def test_importing_tfm_and_its_exporters_loads_no_peer_library():
    code = (
        "import sys, tfm, tfm.export, tfm.export.weights, tfm.export.ct2, tfm.export.hf, "
        "tfm.export.__main__, tfm.experiments.sweep\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_prepare_workers_import_no_jax():
    """prepare's worker processes import `tfm.data.streaming`: JAX there would cost each worker
    seconds and hundreds of MB."""
    code = "import sys, tfm.data.streaming, tfm.data.prepare\nprint('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
