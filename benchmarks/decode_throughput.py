"""Decoding throughput: cached greedy, cached beam 4 and the uncached greedy baseline.

Prints one JSON object. SMALL shapes: d_model 256, 4 heads, 2+2 layers, d_ff 1024,
vocab 8000; batch 16, source length 32, exactly 64 new tokens (EOS disabled). Also measures the
early exit: the same greedy program when every sentence's limit is reached after 40 of 64 steps.

    python benchmarks/decode_throughput.py [--shapes small|base] [--batch N] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jax
import numpy as np
from uncached_greedy import greedy_search_uncached

from tfm import ModelConfig, Transformer
from tfm.inference import decoding

SHAPES = {
    "small": dict(
        vocab_size=8000, num_layers=2, d_model=256, d_ff=1024, num_heads=4, d_k=64, d_v=64
    ),
    "base": dict(
        vocab_size=32000, num_layers=6, d_model=512, d_ff=2048, num_heads=8, d_k=64, d_v=64
    ),
}


def _time(fn, repeats: int) -> tuple[float, float]:
    """(compile + first run seconds, median seconds of `repeats` further runs)."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="small")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--src_len", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--skip_naive", action="store_true")
    args = parser.parse_args()

    config = ModelConfig(
        **SHAPES[args.shapes],
        dropout_rate=0.0,
        dtype=args.dtype,
        max_positions=max(256, args.new_tokens + 8),
    )
    model = Transformer(config)
    rng = np.random.default_rng(0)
    src = rng.integers(4, config.vocab_size, (args.batch, args.src_len)).astype(np.int32)
    params = model.init(jax.random.key(0), src[:, :2], src[:, :2])["params"]
    extra = args.new_tokens - args.src_len  # limit = source length + extra = new_tokens
    new_tokens = args.batch * args.new_tokens

    runs = {
        "greedy_cached": lambda: decoding.greedy_search(
            model, params, src, eos_id=None, extra_length=extra
        ),
        "beam4_cached": lambda: decoding.beam_search(
            model, params, src, beam_size=4, eos_id=None, extra_length=extra
        ),
    }
    if not args.skip_naive:
        runs["greedy_uncached"] = lambda: greedy_search_uncached(
            model, params, src, eos_id=None, extra_length=extra
        )
    # Early exit: same shapes, but sentences of 8 real tokens finish after 8 + extra steps.
    short = src.copy()
    short[:, 8:] = 0
    runs["greedy_cached_all_done_early"] = lambda: decoding.greedy_search(
        model, params, short, eos_id=None, extra_length=extra
    )

    results = {}
    for name, fn in runs.items():
        first, seconds = _time(fn, args.repeats)
        results[name] = dict(
            seconds_per_batch=round(seconds, 4),
            tokens_per_second=round(new_tokens / seconds, 1),
            compile_and_first_run_seconds=round(first, 2),
        )
    early_steps = 8 + extra
    results["greedy_cached_all_done_early"].update(
        steps_run=int(np.ceil(early_steps / 8) * 8),
        steps_allocated=args.new_tokens,
        tokens_per_second=None,
    )
    report = dict(
        benchmark="decode_throughput",
        shapes=args.shapes,
        config=dict(SHAPES[args.shapes], dtype=args.dtype),
        batch=args.batch,
        src_len=args.src_len,
        new_tokens=args.new_tokens,
        device=str(jax.devices()[0].device_kind),
        backend=jax.default_backend(),
        cpu_count=__import__("os").cpu_count(),
        python=platform.python_version(),
        jax=jax.__version__,
        results=results,
    )
    if "greedy_uncached" in results:
        report["cached_over_uncached_greedy"] = round(
            results["greedy_uncached"]["seconds_per_batch"]
            / results["greedy_cached"]["seconds_per_batch"],
            2,
        )
    report["early_exit_time_fraction"] = round(
        results["greedy_cached_all_done_early"]["seconds_per_batch"]
        / results["greedy_cached"]["seconds_per_batch"],
        3,
    )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
