"""The model's matrix products whose gradients are computed in another, equal form: XLA:CPU
lowers autodiff's weight gradients (a contraction over the token axis) by first writing one
operand transposed, and which operand it picks decides what that pass costs. Values and
gradients are those of the plain products (tests/test_layers.py checks them against the chain
rule in NumPy); benchmarks/README.md (rounds five and nine) has the measurements.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def summed_outer_product(a: Array, b: Array, dtype=None) -> Array:
    """sum over rows t of a_t^T b_t: `[..., m]` a and `[..., n]` b, summed over every leading
    axis -> `[m, n]` (in `dtype`, else the inputs'). A weight gradient x^T g is computed here as
    the transpose of `summed_outer_product(g, x)` or taken as (x^T g)^T where that is cheaper to
    lay out (below)."""
    return jnp.einsum("...m,...n->mn", a, b, preferred_element_type=dtype)


@jax.custom_vjp
def tied_logits(x: Array, table: Array) -> Array:
    """Section 3.4's pre-softmax linear layer, x E^T with the embedding matrix E: `[..., d_model]`
    x, `[vocab, d_model]` E -> float32 `[..., vocab]` logits (products in x's dtype, summed in
    float32). Its gradient is autodiff's; only how E's gradient is computed differs (below)."""
    return jnp.einsum("...d,vd->...v", x, table, preferred_element_type=jnp.float32)


def _tied_logits_forward(x: Array, table: Array) -> tuple[Array, tuple[Array, Array]]:
    return tied_logits(x, table), (x, table)


def _tied_logits_backward(saved: tuple[Array, Array], grad: Array) -> tuple[Array, Array]:
    """dx = g E and dE = g^T x, with dE computed as (x^T g)^T: XLA:CPU lowers g^T x by first
    writing the `[tokens, vocab]` logit gradient transposed, a strided pass over the largest
    array of the step (62 ms of a 0.96 s profiled SMALL training step); transposing the
    `[d_model, vocab]` product instead moves tokens / d_model times less memory."""
    x, table = saved
    grad = grad.astype(x.dtype)
    grad_x = jnp.einsum("...v,vd->...d", grad, table, preferred_element_type=jnp.float32)
    x_rows, grad_rows = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
    grad_table_t = summed_outer_product(x_rows, grad_rows, jnp.float32)
    return grad_x.astype(x.dtype), grad_table_t.T.astype(table.dtype)


tied_logits.defvjp(_tied_logits_forward, _tied_logits_backward)


@jax.custom_vjp
def linear(x: Array, w: Array) -> Array:
    """x W: `[..., fan_in]` x, `[fan_in, fan_out]` W -> `[..., fan_out]` (the projections of
    sections 3.2.2 and 3.3). Its gradient is autodiff's; only how W's is computed differs."""
    return jnp.dot(x, w)


def _linear_forward(x: Array, w: Array) -> tuple[Array, tuple[Array, Array]]:
    return linear(x, w), (x, w)


def _linear_backward(saved: tuple[Array, Array], grad: Array) -> tuple[Array, Array]:
    """dx = g W^T and dW = x^T g, with dW computed as (g^T x)^T. For x^T g XLA:CPU writes g
    transposed first, in the same pass as whatever produced g; after a residual dropout (W^O,
    the FFN's W2) that pass redoes dropout's random draw while reading strided, ~70 ms of a
    0.47 s SMALL training step. For g^T x it is x that it lays out anew, and the transpose of
    the `[fan_out, fan_in]` product is small."""
    x, w = saved
    grad_x = jnp.dot(grad, w.T)
    x_rows, grad_rows = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
    grad_w_t = summed_outer_product(grad_rows, x_rows)
    return grad_x, grad_w_t.T


linear.defvjp(_linear_forward, _linear_backward)
