"""tfm.host_memory: after keep_freed_blocks, a train step run again reuses the pages of its
scratch buffer instead of faulting in fresh ones (counted by the kernel: minor page faults)."""

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent(
    """
    import json, resource, sys
    from tfm import host_memory
    kept = host_memory.keep_freed_blocks() if sys.argv[1] == "keep" else None
    import functools
    import jax, jax.numpy as jnp, numpy as np
    from tfm import ModelConfig, Transformer, training

    # a large vocabulary: the [2048, 16000] logits and their gradient make ~400 MB of scratch
    config = ModelConfig(vocab_size=16000, num_layers=1, d_model=32, d_ff=64, num_heads=4,
                         d_k=8, d_v=8, dropout_rate=0.0)
    model = Transformer(config)
    optimizer = training.make_optimizer(training.TrainConfig(), config.d_model)
    ids = np.random.default_rng(0).integers(4, config.vocab_size, (32, 64))
    batch = {k: jnp.asarray(ids, jnp.int32) for k in ("src", "tgt_in", "tgt_out")}
    state = training.init_train_state(model, optimizer, jax.random.key(0), batch)
    step = jax.jit(functools.partial(training.train_step, model=model, optimizer=optimizer,
                                     smoothing=0.1), donate_argnums=0)
    temp = step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
    for _ in range(2):  # the heap grows to the step's size
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(2):
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 2
    print(json.dumps(dict(kept=kept, temp_pages=temp / 4096, faults_per_run=faults)))
    """
)


def _run(mode: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode],
        capture_output=True,
        text=True,
        check=True,
        cwd=pathlib.Path(__file__).resolve().parents[1],
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_train_step_run_again_reuses_its_scratch_pages():
    default = _run("default")
    if default["faults_per_run"] < 0.5 * default["temp_pages"]:
        pytest.skip("this C library already reuses XLA's scratch buffer; nothing to change")
    kept = _run("keep")
    assert kept["kept"] is True
    assert kept["temp_pages"] > 10_000  # the scratch is large enough to have been mmapped
    assert kept["faults_per_run"] < 0.05 * kept["temp_pages"], (default, kept)
