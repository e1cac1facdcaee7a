"""The compiled train and eval steps of the training job, behind one interface with two
implementations: `MeshSteps` (`jax.jit` over a device mesh: data, FSDP or tensor parallel, one
or many processes) and `PmapSteps` (`jax.pmap` data parallelism with an explicit gradient
all-reduce). The training loop calls only this interface, so the pmap path is this one seam.

Both take this process's rows of a batch (`tfm.data.pipeline`) and return host-fetchable metrics;
`host_state` gives the state as a checkpoint stores it.
"""

from __future__ import annotations

import jax
import numpy as np
import optax

from tfm import training
from tfm.cpu_host import host_memory
from tfm.job import parallel
from tfm.model import Transformer

Batch = dict[str, np.ndarray]


def micro_batched(batch: Batch, micro: int) -> Batch:
    """[rows, L] -> [micro, rows / micro, L] for gradient accumulation (unchanged if micro = 1)."""
    if micro == 1:
        return batch
    return {k: v.reshape(micro, v.shape[0] // micro, *v.shape[1:]) for k, v in batch.items()}


def _example_batch(rows: int) -> Batch:
    return {k: np.zeros((rows, 8), np.int32) for k in ("src", "tgt_in", "tgt_out")}


class CompiledPerShape:
    """A jitted or pmapped train step, compiled ahead of its first run for each batch shape it
    meets (one per bucket). jit's own cache compiles inside the first call; compiling first lets
    the compiler's freed working memory (~140 MB at BASE size) go back to the system before the
    step's scratch buffer comes on top of it, lowering the host's peak."""

    def __init__(self, step):
        self.step = step
        self.compiled = {}

    def __call__(self, state, placed: Batch):
        shape = tuple(sorted((name, array.shape) for name, array in placed.items()))
        if shape not in self.compiled:
            self.compiled[shape] = self.step.lower(state, placed).compile()
            host_memory.return_freed_memory()
        return self.compiled[shape](state, placed)


class MeshSteps:
    """Steps compiled with `jax.jit`, the state sharded over `mesh` by `strategy`'s rules."""

    def __init__(
        self,
        model: Transformer,
        optimizer: optax.GradientTransformation,
        smoothing: float,
        mesh,
        strategy: str,
        micro: int,
    ):
        self.model, self.optimizer, self.smoothing = model, optimizer, smoothing
        self.mesh, self.strategy, self.micro = mesh, strategy, micro
        self._train = None  # jitted in init_state, once the state's shardings are known
        self._eval = jax.jit(
            lambda p, b: training.eval_step(p, b, model=model, smoothing=smoothing)
        )

    def init_state(self, seed: int, example_rows: int) -> training.TrainState:
        example = _example_batch(example_rows)
        init = lambda rng: training.init_train_state(  # noqa: E731
            self.model, self.optimizer, rng, example
        )
        rng = jax.random.PRNGKey(seed)
        sharding = parallel.state_shardings(jax.eval_shape(init, rng), self.strategy, self.mesh)
        train = lambda s, b: training.train_step(  # noqa: E731
            s, b, model=self.model, optimizer=self.optimizer, smoothing=self.smoothing
        )
        self._train = CompiledPerShape(
            jax.jit(
                train,
                in_shardings=(sharding, None),
                out_shardings=(sharding, None),
                donate_argnums=0,
            )
        )
        return jax.jit(init, out_shardings=sharding)(rng)

    def _place(self, batch: Batch, micro: int):
        sharding = parallel.batch_sharding(self.mesh, micro_batched=micro > 1)
        return parallel.global_batch(micro_batched(batch, micro), sharding)

    def train(self, state, batch: Batch):
        return self._train(state, self._place(batch, self.micro))

    def eval_sums(self, state, batch: Batch) -> dict[str, float]:
        sums = jax.device_get(self._eval(state.params, self._place(batch, 1)))
        return {k: float(v) for k, v in sums.items()}

    def to_device(self, host_state):
        return host_state  # restored with the shardings of the abstract state already

    def host_state(self, state):
        return state


class PmapSteps:
    """Steps compiled with `jax.pmap` over the local devices; the state is replicated along a
    leading device axis and gradients are summed with `psum`."""

    def __init__(
        self,
        model: Transformer,
        optimizer: optax.GradientTransformation,
        smoothing: float,
        micro: int,
    ):
        self.micro = micro
        self.model, self.optimizer = model, optimizer
        self.devices = jax.local_device_count()
        self._train = CompiledPerShape(
            jax.pmap(
                lambda s, b: training.train_step(
                    s, b, model=model, optimizer=optimizer, smoothing=smoothing, axis_name="batch"
                ),
                axis_name="batch",
                donate_argnums=(0,),
            )
        )
        self._eval = jax.pmap(
            lambda p, b: jax.lax.psum(
                training.eval_step(p, b, model=model, smoothing=smoothing), "batch"
            ),
            axis_name="batch",
        )

    def init_state(self, seed: int, example_rows: int) -> training.TrainState:
        """One (host) copy; `to_device` replicates it."""
        example = _example_batch(example_rows)
        return training.init_train_state(
            self.model, self.optimizer, jax.random.PRNGKey(seed), example
        )

    def _place(self, batch: Batch, micro: int):
        return parallel.split_for_pmap(micro_batched(batch, micro), self.devices)

    def train(self, state, batch: Batch):
        return self._train(state, self._place(batch, self.micro))

    def eval_sums(self, state, batch: Batch) -> dict[str, float]:
        # the state's parameters are already one copy per device: no host round trip
        sums = jax.device_get(self._eval(state.params, self._place(batch, 1)))
        return {k: float(np.asarray(v)[0]) for k, v in sums.items()}

    def to_device(self, host_state):
        return parallel.replicate_for_pmap(host_state)

    def host_state(self, state):
        return jax.tree.map(lambda x: x[0], state)


def make_steps(
    model: Transformer,
    optimizer: optax.GradientTransformation,
    smoothing: float,
    strategy: str,
    mesh,
    micro: int,
) -> MeshSteps | PmapSteps:
    """The steps for a parallelism strategy (`tfm.job.parallel.STRATEGIES`)."""
    if strategy == "pmap":
        return PmapSteps(model, optimizer, smoothing, micro)
    return MeshSteps(model, optimizer, smoothing, mesh, strategy, micro)


def abstract_state(state):
    """Shapes, dtypes and shardings of a state: the target a checkpoint restores into."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        state,
    )
