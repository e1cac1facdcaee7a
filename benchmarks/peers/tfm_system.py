"""tfm itself: the jitted train step of `tfm.training`, and `tfm.inference.decoding`'s searches (as
`tfm.cpu_host.side_by_side.search_in_parts` runs them: on CPU, a search per core)."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from uncached_greedy import greedy_search_uncached

from peers import weights as neutral
from peers.workloads import (
    ADAM,
    DROPOUT,
    EOS_ID,
    LABEL_SMOOTHING,
    LAYER_NORM_EPSILON,
    WARMUP_STEPS,
    Workload,
    decoding_source,
    training_batch,
)
from tfm import ModelConfig, Transformer, training
from tfm.cpu_host import host_memory, side_by_side
from tfm.inference import decoding

NAME = "tfm"


def _config(w: Workload, dropout: float) -> ModelConfig:
    s = w.shape
    return ModelConfig(
        vocab_size=s.vocab_size,
        num_layers=s.num_layers,
        d_model=s.d_model,
        d_ff=s.d_ff,
        num_heads=s.num_heads,
        d_k=s.head_dim,
        d_v=s.head_dim,
        dropout_rate=dropout,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        max_positions=256,
    )


def initial_params(w: Workload, seed: int = 0):
    """tfm's own initialisation; the EOS embedding row is zeroed so that EOS (logit exactly 0)
    is never the argmax and every system decodes exactly the requested number of tokens."""
    model = Transformer(_config(w, 0.0))
    ids = jnp.zeros((1, 2), jnp.int32)

    # compiled, as the training job initialises (tfm.job.steps): run op by op, the initialisation
    # leaves the allocator holding several times the parameters' size
    @jax.jit
    def init(rng):
        params = model.init(rng, ids, ids)["params"]
        table = params["embedding"]["embedding"].at[EOS_ID].set(0.0)
        return {**params, "embedding": {"embedding": table}}

    return init(jax.random.key(seed))


def export_weights(w: Workload, path: str, seed: int = 0) -> None:
    neutral.save(neutral.from_tfm_params(initial_params(w, seed), w.shape.num_layers), path)


def matmul_ceiling(n: int = 2048, repeats: int = 5) -> float:
    """Best FLOP/s of an n^3 float32 matmul through XLA."""
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    jax.block_until_ready(f(a))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f(a))
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def _initial_loss(w: Workload, params, batch) -> float:
    """Label-smoothed loss per target token without dropout; a function, so that nothing
    keeps the evaluation's compiled program alive once the loss is read."""
    model = Transformer(_config(w, 0.0))
    evaluate = jax.jit(
        lambda p, b: training.eval_step(p, b, model=model, smoothing=LABEL_SMOOTHING)
    )
    terms = evaluate(params, batch)
    return float(terms["loss"] / terms["tokens"])


class Trainer:
    """tfm's weights come from `initial_params` with the seed that wrote `weights_path`."""

    def __init__(self, w: Workload, weights_path: str, seed: int = 0):
        self.model = Transformer(_config(w, DROPOUT))
        config = training.TrainConfig(
            label_smoothing=LABEL_SMOOTHING,
            warmup_steps=WARMUP_STEPS,
            adam_b1=ADAM["b1"],
            adam_b2=ADAM["b2"],
            adam_eps=ADAM["eps"],
        )
        self.optimizer = training.make_optimizer(config, w.shape.d_model)
        self.batch = jax.device_put(training_batch(w))
        params = initial_params(w, seed)
        # before the Adam moments exist, as torch's trainer evaluates (its moments come with the
        # first step); evaluated after them, BASE's set-up and first step peaked at 1,550 MB,
        # against 1,523-1,528 MB now (benchmarks/README.md, round twenty-three)
        self.initial_loss = _initial_loss(w, params, self.batch)
        host_memory.return_freed_memory()
        self.state = training.TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=jax.jit(self.optimizer.init)(params),
            rng=jax.random.key(seed + 1),
        )
        # as the training job (tfm.job.trainer.train, tfm.job.steps.MeshSteps): freed memory goes
        # back to the system once the state is built and once the step is compiled
        host_memory.return_freed_memory()
        model, optimizer = self.model, self.optimizer
        self.step = (
            jax.jit(
                lambda s, b: training.train_step(
                    s, b, model=model, optimizer=optimizer, smoothing=LABEL_SMOOTHING
                ),
                donate_argnums=(0,),
            )
            .lower(self.state, self.batch)
            .compile()
        )
        host_memory.return_freed_memory()

    def compiled_text(self) -> str:
        """The optimised HLO of the train step (for profiles)."""
        return self.step.as_text()

    def run(self) -> None:
        self.state, metrics = self.step(self.state, self.batch)
        jax.block_until_ready(metrics)


class Decoder:
    def __init__(self, w: Workload, weights_path: str, seed: int = 0, cached: bool = True):
        self.model = Transformer(_config(w, 0.0))
        self.params = initial_params(w, seed)
        self.src = jnp.asarray(decoding_source(w))
        # limit = source length + extra_length = exactly tgt_len new tokens
        self.settings = dict(eos_id=None, extra_length=w.tgt_len - w.src_len)
        if w.kind == "beam":
            self.search = decoding.beam_search
            self.settings["beam_size"] = w.beam_size
        else:
            self.search = decoding.greedy_search if cached else greedy_search_uncached
        self.new_tokens = w.tgt_len
        self.parts = side_by_side.default_parts()

    def compiled_text(self) -> str:
        """The optimised HLO of the search program (for profiles)."""
        lowered = self.search.lower(self.model, self.params, self.src, **self.settings)
        return lowered.compile().as_text()

    def run(self) -> np.ndarray:
        result = side_by_side.search_in_parts(
            self.search, self.model, self.params, self.src, self.parts, **self.settings
        )
        return np.asarray(jax.block_until_ready(result).ids[:, : self.new_tokens])
