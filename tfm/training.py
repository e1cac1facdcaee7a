"""The training recipe of section 5 as pure functions: the Eq. 3 learning-rate schedule,
Adam(0.9, 0.98, 1e-9), `train_step` / `eval_step` on the label-smoothed loss of `tfm.loss`.
(`tfm.job.steps` compiles them; `tfm.job.trainer` is the job that runs them; `train.py` its command
line.)

A batch is a dict of int32 arrays (see `tfm.data.batching`): src, tgt_in, tgt_out [rows, L] and,
for packed rows, src_segments, tgt_segments, src_positions, tgt_positions. With gradient
accumulation every array has a leading micro-batch axis [micro, rows, L]; the k micro-batches'
summed gradients are divided by the total token count, so they equal one big batch exactly.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from tfm import implementation
from tfm.model import Transformer
from tfm.tokens import PAD_ID

Array = jax.Array
PACKED_KEYS = ("src_segments", "tgt_segments", "src_positions", "tgt_positions")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Recipe values (section 5.3, 5.4). `learning_rate_scale` multiplies Eq. 3."""

    label_smoothing: float = 0.1
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0
    adam_b1: float = 0.9
    adam_b2: float = 0.98
    adam_eps: float = 1e-9
    grad_clip_norm: float | None = None
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {self.warmup_steps}")
        scale = self.learning_rate_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ValueError(f"learning_rate_scale must be a number > 0, got {scale!r}")
        if self.grad_clip_norm is not None and self.grad_clip_norm <= 0:
            raise ValueError(f"grad_clip_norm must be > 0 or None, got {self.grad_clip_norm}")


def learning_rate(
    step: Array | int, d_model: int, warmup_steps: int = 4000, scale: float = 1.0
) -> Array:
    """Eq. 3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), step from 1."""
    step = jnp.maximum(jnp.asarray(step, jnp.float32), 1.0)
    return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)


def make_optimizer(config: TrainConfig, d_model: int) -> optax.GradientTransformation:
    """Adam with the Eq. 3 schedule; optional global-norm clipping and decoupled weight decay.

    optax counts updates from 0; the schedule is given update + 1 so the first update uses
    Eq. 3 at step 1.
    """

    def schedule(count):
        return learning_rate(count + 1, d_model, config.warmup_steps, config.learning_rate_scale)

    parts = []
    if config.grad_clip_norm is not None:
        parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
    parts.append(
        optax.adamw(
            schedule,
            b1=config.adam_b1,
            b2=config.adam_b2,
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
    )
    return optax.chain(*parts)


@struct.dataclass
class TrainState:
    """Everything a step changes: step count, parameters, optimizer state, dropout RNG."""

    step: Array
    params: Any
    opt_state: Any
    rng: Array


def init_train_state(
    model: Transformer,
    optimizer: optax.GradientTransformation,
    rng: Array,
    example_batch: dict[str, Array],
) -> TrainState:
    """Parameters from `rng` for the shapes of `example_batch` (micro-batch axis allowed)."""
    init_rng, dropout_rng = jax.random.split(rng)
    src, tgt_in = example_batch["src"], example_batch["tgt_in"]
    if src.ndim == 3:
        src, tgt_in = src[0], tgt_in[0]
    params = model.init(init_rng, src[:1], tgt_in[:1])["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=dropout_rng,
    )


def _model_inputs(batch: dict[str, Array]) -> dict[str, Array]:
    return {key: batch[key] for key in PACKED_KEYS if key in batch}


def _states_and_output_embedding(
    model: Transformer, batch: dict[str, Array], deterministic: bool
) -> tuple[Array, Array]:
    """The decoder's final states `[batch, tgt_len, d_model]` and the pre-softmax layer's
    weights E `[vocab, d_model]` (section 3.4), in one application of the model."""
    states = model(
        batch["src"],
        batch["tgt_in"],
        deterministic=deterministic,
        return_states=True,
        **_model_inputs(batch),
    )
    return states, model.output_embedding()


def batch_loss(
    model: Transformer, params, batch: dict[str, Array], smoothing: float, dropout_rng: Array | None
) -> dict[str, Array]:
    """Summed loss terms of one (micro-)batch; dropout on when `dropout_rng` is given."""
    deterministic = dropout_rng is None
    states, table = model.apply(
        {"params": params},
        batch,
        deterministic,
        method=_states_and_output_embedding,
        rngs=None if deterministic else {"dropout": dropout_rng},
    )
    output_loss = model.ops.output_loss
    loss, nll = output_loss(states.astype(table.dtype), table, batch["tgt_out"], smoothing)
    tokens = jnp.sum((batch["tgt_out"] != PAD_ID).astype(jnp.float32))
    return dict(loss=loss, nll=jax.lax.stop_gradient(nll), tokens=tokens)


def _accumulated_gradients(model, params, batch, rng, *, smoothing):
    """Summed gradients and loss terms over the micro-batch axis (if any)."""

    def sums_and_grads(micro_batch, micro_rng):
        def objective(p):
            terms = batch_loss(model, p, micro_batch, smoothing, micro_rng)
            return terms["loss"], terms

        (_, terms), grads = jax.value_and_grad(objective, has_aux=True)(params)
        return grads, terms

    if batch["src"].ndim == 2:
        return sums_and_grads(batch, rng)
    micro = batch["src"].shape[0]
    rngs = jax.random.split(rng, micro)

    def body(carry, xs):
        grads, terms = sums_and_grads(*xs)
        return jax.tree.map(jnp.add, carry, (grads, terms)), None

    zeros = (
        jax.tree.map(jnp.zeros_like, params),
        dict(loss=jnp.zeros(()), nll=jnp.zeros(()), tokens=jnp.zeros(())),
    )
    (grads, terms), _ = jax.lax.scan(body, zeros, (batch, rngs))
    return grads, terms


def train_step(
    state: TrainState,
    batch: dict[str, Array],
    *,
    model: Transformer,
    optimizer: optax.GradientTransformation,
    smoothing: float,
    axis_name: str | None = None,
) -> tuple[TrainState, dict[str, Array]]:
    """One update on the per-token mean of the label-smoothed loss over all non-pad targets.

    `axis_name` names a `pmap` axis over which the summed gradients and counts are added (the
    pmap path); under `jit` the batch is one global array and nothing more is needed. Dropout
    masks differ between the two paths (each pmap device draws its own).
    Metrics: loss and nll per token, tokens, grad_norm.
    """
    step_rng = jax.random.fold_in(state.rng, state.step)
    if axis_name is not None:
        step_rng = jax.random.fold_in(step_rng, jax.lax.axis_index(axis_name))
    accumulate = functools.partial(_accumulated_gradients, smoothing=smoothing)
    grads, terms = implementation.per_platform(accumulate, model, state.params, batch, step_rng)
    if axis_name is not None:
        grads, terms = jax.lax.psum((grads, terms), axis_name)
    tokens = jnp.maximum(terms["tokens"], 1.0)
    grads = jax.tree.map(lambda g: g / tokens, grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(
        loss=terms["loss"] / tokens,
        nll=terms["nll"] / tokens,
        tokens=terms["tokens"],
        grad_norm=optax.tree.norm(grads),
    )
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics


def eval_step(
    params, batch: dict[str, Array], *, model: Transformer, smoothing: float
) -> dict[str, Array]:
    """Summed loss, nll and token count of one batch without dropout (sum over batches, then
    perplexity = exp(nll / tokens))."""
    loss = functools.partial(batch_loss, smoothing=smoothing, dropout_rng=None)
    return implementation.per_platform(loss, model, params, batch)
