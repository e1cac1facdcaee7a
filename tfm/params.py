"""Parameter counts of every Table 3 row beside the paper's: `python -m tfm.params`.

Counts come from the model's own parameter shapes (`jax.eval_shape`, nothing is allocated).
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp

from tfm.config import PAPER_VOCAB_SIZE, ModelConfig, table3
from tfm.model import Transformer


def count_parameters(config: ModelConfig) -> int:
    """Number of trainable parameters of `Transformer(config)` (shared embedding counted once).
    The shapes are traced with the reference ops only: every kernels setting has the same
    parameters, and tracing one set is half the work of "auto"'s two."""
    ids = jnp.ones((1, 2), jnp.int32)
    model = Transformer(config, kernels="reference")
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids))
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes["params"]))


def parameter_table(vocab_size: int = PAPER_VOCAB_SIZE) -> list[dict]:
    """One dict per Table 3 row: name, counted millions, paper millions, relative difference."""
    rows = []
    for name, preset in table3(vocab_size).items():
        millions = count_parameters(preset.model) / 1e6
        paper = preset.paper_params_millions
        rows.append(
            dict(
                row=name,
                params_millions=round(millions, 2),
                paper_millions=paper,
                relative_difference=None if paper is None else round(millions / paper - 1, 4),
            )
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab_size", type=int, default=PAPER_VOCAB_SIZE)
    args = parser.parse_args(argv)
    if args.vocab_size < 1:
        parser.error(f"--vocab_size must be a positive integer, got {args.vocab_size}")
    print(f"Table 3 parameter counts, shared vocabulary of {args.vocab_size} tokens")
    print(f"{'row':<10} {'tfm (M)':>9} {'paper (M)':>10} {'diff':>8}")
    for row in parameter_table(args.vocab_size):
        diff = row["relative_difference"]
        print(
            f"{row['row']:<10} {row['params_millions']:>9.2f} {row['paper_millions']:>10}"
            f" {'' if diff is None else f'{diff:+.1%}':>8}"
        )


if __name__ == "__main__":
    main()
