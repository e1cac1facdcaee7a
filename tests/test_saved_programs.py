"""tfm.cpu_host.saved_programs: a decoding program compiled in one process is loaded, untraced, by
the next, and only when everything it was traced from is the same."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import tiny_model_config
from tests.subprocess_json import run_python
from tfm.cpu_host import saved_programs
from tfm.cpu_host.backend_jit import CpuTunedJit
from tfm.inference import slots, translate
from tfm.model import Transformer


class _Counted:
    """`x * scale + y`, counting its traces (the body runs only while JAX traces it)."""

    def __init__(self):
        self.traces = 0

    def program(self):
        """A new jitted function, as a new process has (nothing in memory)."""

        def affine(x, y, scale):
            self.traces += 1
            return x * scale + y

        affine.__module__ = __name__  # one function for the key, whichever instance
        affine.__qualname__ = "affine"
        return CpuTunedJit(affine, {"xla_backend_optimization_level": 2}, dict(static_argnums=2))


@pytest.fixture
def store(tmp_path, monkeypatch):
    """Saved programs on, in `tmp_path` (JAX's own cache stays as the tests set it: off)."""
    monkeypatch.setattr(saved_programs, "directory", lambda: tmp_path)
    return tmp_path


def test_a_new_process_loads_the_saved_program_instead_of_tracing_it(store):
    counted = _Counted()
    x, y = jnp.arange(4.0), np.ones(4, np.float32)
    first = counted.program()(x, y, 3.0)
    assert counted.traces == 1 and len(list(store.iterdir())) == 1
    again = counted.program()(x, y, 3.0)
    assert counted.traces == 1  # loaded, not traced
    np.testing.assert_array_equal(again, np.arange(4.0) * 3.0 + 1.0)
    np.testing.assert_array_equal(again, first)


@pytest.mark.parametrize(
    "changed",
    ["static value", "shape", "dtype", "weak type", "jax config in a context"],
)
def test_anything_that_changes_the_program_is_a_new_entry(store, changed):
    counted = _Counted()
    counted.program()(jnp.arange(4.0), np.float32(1.0), 3.0)
    x, y, scale = jnp.arange(4.0), np.float32(1.0), 3.0
    context = jax.default_matmul_precision("default")  # the test's default: no change
    if changed == "static value":
        scale = 2.0
    elif changed == "shape":
        x = jnp.arange(5.0)
    elif changed == "dtype":
        x = jnp.arange(4, dtype=jnp.int32)
    elif changed == "weak type":
        y = 1.0  # a Python float: weakly typed float32[]
    else:
        context = jax.default_matmul_precision("highest")
    with context:
        out = counted.program()(x, y, scale)
    assert counted.traces == 2 and len(list(store.iterdir())) == 2
    np.testing.assert_allclose(out, np.asarray(x) * scale + np.asarray(y))


def test_the_key_covers_the_source_it_was_traced_from(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("def f(x):\n    return x + 1\n")
    before = saved_programs._source_fingerprint(str(source))
    source.write_text("def f(x):\n    return x + 2\n")
    saved_programs._source_fingerprint.cache_clear()
    assert saved_programs._source_fingerprint(str(source)) != before


def test_an_unreadable_entry_is_compiled_again_with_a_warning_naming_it(store):
    counted = _Counted()
    x, y = jnp.arange(4.0), np.ones(4, np.float32)
    counted.program()(x, y, 3.0)
    (entry,) = store.iterdir()
    entry.write_bytes(entry.read_bytes()[:100])  # e.g. a disk that filled up mid-write
    with pytest.warns(UserWarning, match=f"{entry}: unreadable saved program"):
        out = counted.program()(x, y, 3.0)
    assert counted.traces == 2
    np.testing.assert_array_equal(out, np.arange(4.0) * 3.0 + 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        counted.program()(x, y, 3.0)  # saved again, whole
    assert counted.traces == 2


def test_a_static_argument_it_cannot_key_runs_through_jit_unsaved(store):
    def apply(x, f):
        return f(x)

    program = CpuTunedJit(apply, {}, dict(static_argnums=1))
    np.testing.assert_allclose(program(jnp.arange(3.0), jnp.sin), np.sin(np.arange(3.0)), rtol=1e-6)
    assert not list(store.iterdir())
    with pytest.raises(saved_programs.Unsaveable):
        saved_programs._describe(lambda x: x)


def test_a_second_process_loads_what_the_first_saved(tmp_path):
    cache = str(tmp_path / "cache")
    first = run_python(["tests/saved_program_worker.py", cache], timeout=120)
    second = run_python(["tests/saved_program_worker.py", cache], timeout=120)
    assert first["traces"] == 1 and second["traces"] == 0
    assert first["sum"] == second["sum"] == [1.0, 4.0, 7.0, 10.0] and second["max"] == 3.0
    assert len(list((tmp_path / "cache" / saved_programs.SUBDIRECTORY).iterdir())) == 1


@pytest.mark.parametrize("beam_size", [1, 3])
def test_translations_from_saved_programs_are_jits(store, monkeypatch, beam_size):
    config = tiny_model_config(40)
    model = Transformer(config)
    sources = [[5, 6, 7, 9, 11], [8, 9], [12, 13, 14, 15, 16, 17, 18, 19, 20], [4]]
    params = model.init(jax.random.key(5), np.ones((1, 4), np.int32), np.ones((1, 4), np.int32))
    settings = translate.TranslateConfig(beam_size=beam_size, length_buckets=(4, 8))
    # a program jit compiled earlier in this process is reused from JAX's memory, and such an
    # executable does not serialize (XLA:CPU: "`LessThan` is not serializable"), so it would
    # not be saved: start from none, as a new process does
    jax.clear_caches()
    saved = translate.translate_ids(model, params["params"], sources, settings)
    assert list(store.iterdir())
    for program in (slots.stream, *_decoding_programs()):
        monkeypatch.setattr(program, "_programs", {})  # a new process: only what is on disk

    def compiled_again(path, compiled):
        raise AssertionError(f"{path} was compiled again, not loaded")

    monkeypatch.setattr(saved_programs, "save", compiled_again)
    loaded = translate.translate_ids(model, params["params"], sources, settings)
    monkeypatch.setattr(saved_programs, "directory", lambda: None)
    expected = translate.translate_ids(model, params["params"], sources, settings)  # jit's
    for want, got_saved, got_loaded in zip(expected, saved, loaded, strict=True):
        np.testing.assert_array_equal(got_saved, want)
        np.testing.assert_array_equal(got_loaded, want)


def _decoding_programs():
    from tfm.inference import decoding

    return [value for value in vars(decoding).values() if isinstance(value, CpuTunedJit)]
