import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfm.cpu_host.backend_jit import DECODING_CPU_OPTIONS, CpuTunedJit, cpu_tuned_jit
from tfm.inference import decoding, slots


def _scaled(x, factor):
    """Doubles or triples: a static argument."""
    return x * factor


def test_the_cpu_options_reach_the_cpu_compiler_and_no_other_backend_gets_them():
    # an option XLA does not know fails the compile, so it shows where the options went
    tuned = CpuTunedJit(_scaled, {"no_such_xla_option": 1}, dict(static_argnames="factor"))
    assert jax.default_backend() == "cpu"
    with pytest.raises(Exception, match="no_such_xla_option"):
        tuned(jnp.ones(3), factor=2)
    # the program for another backend is jit's own, without them (it compiles here on the CPU)
    other = tuned.for_backend("gpu")
    np.testing.assert_array_equal(other(jnp.arange(3.0), factor=3), [0.0, 3.0, 6.0])


def test_behaves_as_jax_jit():
    tuned = cpu_tuned_jit({"xla_backend_optimization_level": 2}, static_argnames="factor")(_scaled)
    np.testing.assert_array_equal(tuned(jnp.arange(3.0), factor=2), [0.0, 2.0, 4.0])
    assert tuned.__doc__ == _scaled.__doc__ and tuned.__wrapped__ is _scaled
    before = tuned._cache_size()
    tuned(jnp.arange(3.0), factor=2)
    assert tuned._cache_size() == before  # same shapes, same static argument: no new program
    tuned(jnp.arange(3.0), factor=5)
    assert tuned._cache_size() == before + 1
    lowered = tuned.lower(jnp.arange(4.0), factor=3)
    np.testing.assert_array_equal(lowered.compile()(jnp.arange(4.0)), [0.0, 3.0, 6.0, 9.0])


def test_one_jitted_function_per_backend_across_threads():
    tuned = CpuTunedJit(_scaled, {}, dict(static_argnames="factor"))
    found = []
    threads = [
        threading.Thread(target=lambda: found.append(tuned.for_backend("cpu"))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive()
    assert len(found) == 4 and all(f is found[0] for f in found)
    assert tuned.for_backend("gpu") is not found[0]


def test_the_decoding_programs_compile_with_llvm_level_2_on_the_cpu():
    assert DECODING_CPU_OPTIONS == {"xla_backend_optimization_level": 2}
    programs = [
        decoding.greedy_search,
        decoding.sample,
        decoding.beam_search,
        slots.stream,
    ]
    for program in programs:
        assert isinstance(program, CpuTunedJit)
        assert program.cpu_options == DECODING_CPU_OPTIONS
