"""The training objective of section 5.4 on the pre-softmax linear layer of section 3.4:
label-smoothed cross-entropy over the non-pad target tokens, by log-softmax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfm.tokens import PAD_ID

Array = jax.Array


def tied_logits(x: Array, table: Array) -> Array:
    """Section 3.4's pre-softmax linear layer, x E^T with the shared embedding matrix E:
    `[..., d_model]` x, `[vocab, d_model]` E -> float32 `[..., vocab]` logits (products in x's
    dtype, summed in float32)."""
    return jnp.einsum("...d,vd->...v", x, table, preferred_element_type=jnp.float32)


def token_losses(logits: Array, targets: Array, smoothing: float) -> tuple[Array, Array]:
    """Per-token smoothed cross-entropy and plain negative log-likelihood `[...]` of float32
    logits `[..., vocab]` and `[...]` targets.

    The smoothed target distribution q puts 1 - eps on the reference token and eps / vocab on
    every token (section 5.4, eps_ls), so the loss is -(1 - eps) log p_target - eps mean_v
    log p_v.
    """
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    target_log_prob = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    loss = -(1.0 - smoothing) * target_log_prob - smoothing * jnp.mean(log_probs, axis=-1)
    return loss, -target_log_prob


def label_smoothed_cross_entropy(
    logits: Array, targets: Array, smoothing: float
) -> dict[str, Array]:
    """Sums over the non-pad target tokens (id 0 is padding): loss (smoothed cross-entropy), nll
    (plain negative log-likelihood) and tokens (their count), each float32."""
    loss, nll = token_losses(logits.astype(jnp.float32), targets, smoothing)
    weights = (targets != PAD_ID).astype(jnp.float32)
    return dict(loss=jnp.sum(loss * weights), nll=jnp.sum(nll * weights), tokens=jnp.sum(weights))


def output_loss_sums(
    states: Array, table: Array, targets: Array, smoothing: float
) -> tuple[Array, Array]:
    """Summed loss and nll of `[batch, length, d_model]` decoder states through the pre-softmax
    linear layer with `[vocab, d_model]` E: `label_smoothed_cross_entropy(tied_logits(...))`."""
    sums = label_smoothed_cross_entropy(tied_logits(states, table), targets, smoothing)
    return sums["loss"], sums["nll"]
