"""`nn.Dense`'s matrix product through the kit's `linear` (`tfm.xla_cpu.matmul`), whose weight
gradient XLA:CPU lays out more cheaply; every other product goes to `lax.dot_general`."""

from __future__ import annotations

import math

import jax

from tfm.xla_cpu.matmul import linear

Array = jax.Array


def _is_plain_product(lhs: Array, rhs: Array, dimension_numbers) -> bool:
    """x's trailing axes contracted with W's leading ones, in order, with no batch axes: the
    product of `nn.Dense` and `nn.DenseGeneral(axis=(-2, -1))`."""
    (lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch) = dimension_numbers
    n = len(lhs_contracting)
    return (
        not lhs_batch
        and not rhs_batch
        and tuple(lhs_contracting) == tuple(range(lhs.ndim - n, lhs.ndim))
        and tuple(rhs_contracting) == tuple(range(n))
    )


class KitDotGeneral:
    """A `dot_general` for `nn.Dense(dot_general_cls=KitDotGeneral)`: x W as `product` (the
    kit's `linear`) on the flattened `[rows, fan_in] x [fan_in, fan_out]` matrices when the
    product is x W at the default precision; `lax.dot_general` for anything else (a set
    `precision` included)."""

    product = staticmethod(linear)

    def __call__(
        self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs
    ):
        if (
            precision is not None
            or preferred_element_type is not None
            or kwargs
            or not _is_plain_product(lhs, rhs, dimension_numbers)
        ):
            return jax.lax.dot_general(
                lhs,
                rhs,
                dimension_numbers,
                precision=precision,
                preferred_element_type=preferred_element_type,
                **kwargs,
            )
        contracted = len(dimension_numbers[0][0])
        leading, fan_in = lhs.shape[: lhs.ndim - contracted], math.prod(rhs.shape[:contracted])
        out = self.product(lhs.reshape(*leading, fan_in), rhs.reshape(fan_in, -1))
        return out.reshape(*leading, *rhs.shape[contracted:])
