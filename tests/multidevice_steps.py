"""Run as a script with 8 fake CPU devices (see test_parallel.py): one training step under each
strategy, printed as JSON of parameter differences against the 1-device step."""

import functools
import json
import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + (
    " --xla_force_host_platform_device_count=8"
)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from conftest import largest_difference, tiny_model_config  # noqa: E402  (run as a script from tests/)

from tfm import Transformer, training  # noqa: E402
from tfm.job import parallel  # noqa: E402


def batch(rows=16, length=8, vocab=64, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(3, vocab, (rows, length)).astype(np.int32)
    tgt = rng.integers(3, vocab, (rows, length)).astype(np.int32)
    src[:, -2:] = 0
    return {"src": src, "tgt_in": tgt, "tgt_out": np.roll(tgt, -1, 1)}


def main():
    assert jax.device_count() == 8, jax.devices()
    results = {}
    for dropout in (0.0, 0.1):
        config = tiny_model_config(64, dropout_rate=dropout)
        model = Transformer(config)
        # Adam's first step moves a parameter by lr * g / (|g| + eps): with the paper's eps 1e-9
        # a gradient within ~1e-8 of zero (summands ~1e-3 that cancel) turns the summation
        # order's rounding into a change of up to 2 lr. eps 1e-3 bounds that amplification by
        # lr / eps, so the steps can be compared to float32 rounding of the parameters.
        train_config = training.TrainConfig(warmup_steps=10, adam_eps=1e-3)
        optimizer = training.make_optimizer(train_config, 32)
        example = batch()

        def init(rng, model=model, optimizer=optimizer, example=example):
            return training.init_train_state(model, optimizer, rng, example)

        def step(state, b, model=model, optimizer=optimizer):
            return training.train_step(state, b, model=model, optimizer=optimizer, smoothing=0.1)

        rng = jax.random.PRNGKey(0)
        single = jax.jit(step)(jax.jit(init)(rng), example)[0]
        single = jax.device_get(single.params)
        for strategy, model_parallel in (("data", 1), ("fsdp", 1), ("tensor", 2)):
            mesh = parallel.make_mesh(model_parallel)
            shardings = parallel.state_shardings(
                jax.eval_shape(init, rng), strategy, mesh, fsdp_min_size=1024
            )
            state = jax.jit(init, out_shardings=shardings)(rng)
            sharded_leaves = sum(
                1 for leaf in jax.tree.leaves(state.params) if not leaf.sharding.is_fully_replicated
            )
            placed = parallel.global_batch(example, parallel.batch_sharding(mesh))
            new_state, _ = jax.jit(
                step, in_shardings=(shardings, None), out_shardings=(shardings, None)
            )(state, placed)
            diff = largest_difference(jax.device_get(new_state.params), single)
            results[f"{strategy}_dropout{dropout}"] = dict(
                max_abs_diff=diff, sharded_leaves=sharded_leaves
            )
        if dropout == 0.0:
            state = parallel.replicate_for_pmap(jax.jit(init)(rng))
            pmapped = jax.pmap(
                functools.partial(
                    training.train_step,
                    model=model,
                    optimizer=optimizer,
                    smoothing=0.1,
                    axis_name="batch",
                ),
                axis_name="batch",
            )
            new_state, _ = pmapped(state, parallel.split_for_pmap(example, 8))
            params = jax.device_get(jax.tree.map(lambda x: x[0], new_state.params))
            diff = largest_difference(params, single)
            results["pmap_dropout0.0"] = dict(max_abs_diff=diff)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
