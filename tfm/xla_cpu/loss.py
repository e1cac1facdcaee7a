"""The XLA:CPU kit's form of the training loss (`tfm.loss.output_loss_sums`): the pre-softmax
linear layer and the label-smoothed loss as one operation, made in CPU-cache-sized chunks of
positions with their gradients written out.

Autodiff of the plain loss holds the whole `[tokens, vocab]` logits, their exponentials and
their gradient at once, and scatters the gather of the target logit into a `[tokens, vocab]`
zero array. Here each chunk's logits live only while their gradients are made, in the forward
pass; measured on XLA:CPU (benchmarks/README.md) the step is faster and its scratch smaller.
The values are those of `tfm.loss` (tests/test_kernels.py compares them).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tfm.tokens import PAD_ID
from tfm.xla_cpu.matmul import summed_outer_product, tied_logits

Array = jax.Array


def _log_partition(logits: Array) -> tuple[Array, Array, Array]:
    """exp(z - m) `[..., vocab]`, its sum `[...]` and log sum_v exp(z_v) `[...]` of logits z, m =
    max_v z_v; the ops of `jax.nn.logsumexp` (so the same values)."""
    max_logit = jnp.max(logits, axis=-1, keepdims=True)
    max_logit = jnp.where(jnp.isfinite(max_logit), max_logit, 0.0)
    shifted_exp = jnp.exp(logits - max_logit)
    partition = jnp.sum(shifted_exp, axis=-1)
    return shifted_exp, partition, jnp.log(partition) + max_logit[..., 0]


def _token_losses_forward(logits: Array, targets: Array, smoothing: float):
    shifted_exp, partition, log_normalizer = _log_partition(logits)
    # the target read by a gather: a one-hot compare here would write a whole [..., vocab]
    # select for XLA:CPU's library reduction to read
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    nll = log_normalizer - target_logit
    loss = nll + smoothing * (target_logit - jnp.mean(logits, axis=-1))
    return (loss, nll), (shifted_exp, partition, targets, smoothing)


def _token_losses_backward(residuals, cotangents):
    """d loss / dz = softmax(z) - q and d nll / dz = softmax(z) - onehot(target): one
    elementwise pass over the logits, the target by a one-hot compare."""
    shifted_exp, partition, targets, smoothing = residuals
    loss_cotangent, nll_cotangent = cotangents
    vocab = shifted_exp.shape[-1]
    softmax_weight = ((loss_cotangent + nll_cotangent) / partition)[..., None]
    target_weight = (loss_cotangent * (1.0 - smoothing) + nll_cotangent)[..., None]
    uniform = (loss_cotangent * (smoothing / vocab))[..., None]
    is_target = jnp.arange(vocab) == targets[..., None]
    logits_cotangent = shifted_exp * softmax_weight - jnp.where(is_target, target_weight, 0.0)
    return logits_cotangent - uniform, None, None  # targets and smoothing: not differentiated


# the most bytes of float32 logits one chunk of `tied_output_cross_entropy` writes
LOGITS_CHUNK_BYTES = 16 * 2**20
# the fewest tokens per chunk, in multiples of d_model: every chunk adds its `[d_model, vocab]`
# share of dE, one pass over as many floats as d_model tokens' logits (benchmarks/README.md,
# round fourteen: BASE's 512-token batch in 4 chunks of 128 tokens ran 0.90x)
MIN_CHUNK_TOKENS_PER_D_MODEL = 2


def length_chunks(batch: int, length: int, vocab: int, d_model: int, chunk_bytes: int) -> int:
    """How many chunks of whole positions (a divisor of `length`) `tied_output_cross_entropy`
    splits `[batch, length]` targets into: the fewest whose float32 logits fit in
    `chunk_bytes`, but none under MIN_CHUNK_TOKENS_PER_D_MODEL * d_model tokens (so 1 when the
    batch is that small)."""
    fewest_tokens = MIN_CHUNK_TOKENS_PER_D_MODEL * d_model
    chunks = 1
    for candidate in range(2, length + 1):
        if length % candidate:
            continue
        if batch * (length // chunks) * vocab * 4 <= chunk_bytes:
            break
        if batch * (length // candidate) < fewest_tokens:
            break
        chunks = candidate
    return chunks


def _chunk_sums_and_gradients(states, table, targets, smoothing: float, with_gradients: bool):
    """One chunk of `tied_output_cross_entropy`: the summed loss and nll of `[batch, positions,
    d_model]` states, and with_gradients the summed loss's gradients d/d states and d/d E^T
    (`[d_model, vocab]`, as `tfm.matmul.tied_logits` computes it)."""
    logits = tied_logits(states, table)
    (loss, nll), residuals = _token_losses_forward(logits, targets, smoothing)
    weights = (targets != PAD_ID).astype(jnp.float32)
    sums = (jnp.sum(loss * weights), jnp.sum(nll * weights))
    if not with_gradients:
        return sums, None
    logits_grad, _, _ = _token_losses_backward(residuals, (weights, jnp.zeros_like(weights)))
    logits_grad = logits_grad.astype(states.dtype)
    states_grad = jnp.einsum(
        "...v,vd->...d", logits_grad, table, preferred_element_type=jnp.float32
    )
    table_grad_t = summed_outer_product(states, logits_grad, jnp.float32)
    return sums, (states_grad.astype(states.dtype), table_grad_t)


def _by_chunks(states, table, targets, smoothing: float, chunk_bytes: int, with_gradients: bool):
    """`_chunk_sums_and_gradients` over chunks of positions in a `lax.scan`, summed."""
    batch, length, d_model = states.shape
    chunks = length_chunks(batch, length, table.shape[0], d_model, chunk_bytes)

    def split(x):  # [batch, length, ...] -> [chunks, batch, length / chunks, ...]
        x = x.reshape((batch, chunks, length // chunks) + x.shape[2:])
        return jnp.moveaxis(x, 1, 0)

    def body(carry, chunk):
        sums, table_grad_t = carry
        chunk_states, chunk_targets = chunk
        chunk_sums, grads = _chunk_sums_and_gradients(
            chunk_states, table, chunk_targets, smoothing, with_gradients
        )
        sums = jax.tree.map(jnp.add, sums, chunk_sums)
        if not with_gradients:
            return (sums, table_grad_t), None
        return (sums, table_grad_t + grads[1]), grads[0]

    zeros = (jnp.zeros(()), jnp.zeros(()))
    table_grad_t = jnp.zeros((d_model, table.shape[0]), jnp.float32) if with_gradients else None
    (sums, table_grad_t), states_grad = jax.lax.scan(
        body, (zeros, table_grad_t), (split(states), split(targets))
    )
    if not with_gradients:
        return sums, None
    states_grad = jnp.moveaxis(states_grad, 0, 1).reshape(states.shape)
    return sums, (states_grad, table_grad_t.T.astype(table.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _output_loss_sums(states, table, targets, smoothing: float, chunk_bytes: int):
    return _by_chunks(states, table, targets, smoothing, chunk_bytes, False)[0]


def _output_loss_sums_forward(states, table, targets, smoothing, chunk_bytes):
    return _by_chunks(states, table, targets, smoothing, chunk_bytes, True)


def _output_loss_sums_backward(smoothing, chunk_bytes, gradients, cotangents):
    """The summed loss's gradients, made in the forward pass, times its cotangent; the nll's
    cotangent is zero (`tied_output_cross_entropy` stops its gradient)."""
    del smoothing, chunk_bytes
    states_grad, table_grad = gradients
    loss_cotangent = cotangents[0]
    return (
        (loss_cotangent * states_grad).astype(states_grad.dtype),
        (loss_cotangent * table_grad).astype(table_grad.dtype),
        None,
    )


_output_loss_sums.defvjp(_output_loss_sums_forward, _output_loss_sums_backward)


def output_loss_sums(
    states: Array,
    table: Array,
    targets: Array,
    smoothing: float,
    chunk_bytes: int = LOGITS_CHUNK_BYTES,
) -> tuple[Array, Array]:
    """`tfm.loss.output_loss_sums`: the summed loss and nll of `[batch, length, d_model]` decoder
    states through the pre-softmax linear layer with `[vocab, d_model]` E (both in the compute
    dtype) for `[batch, length]` targets.

    The logits are made chunk by chunk of positions (`length_chunks`: at most `chunk_bytes` of
    them at a time), and under differentiation each chunk's gradients d loss / d states and
    d loss / d E are made with them, in the forward pass: the `[batch, length, vocab]` logits,
    their exponentials and their gradient are never whole and none is kept for the backward
    pass, which only scales the two gradients by the loss's cotangent. Only the loss is
    differentiable (the nll is reported, not trained on).
    """
    loss, nll = _output_loss_sums(states, table, targets, smoothing, chunk_bytes)
    return loss, jax.lax.stop_gradient(nll)
