"""Training throughput: target tokens/s of the jitted train step and MFU.

Prints one JSON object. MFU = model FLOPs per second / the float32 matmul peak measured in the
same run (a 2048^3 matmul). Model FLOPs per step = 3 x forward matmul FLOPs (forward + backward),
counting every projection, the attention score and value products, the FFN and the output
layer; embeddings lookups, softmax and LayerNorm are not counted.

    python benchmarks/train_throughput.py [--shapes small base] [--steps 5] [--dtype float32]
        [--kernels auto|reference|xla_cpu]

`--kernels` picks the ops (tfm.implementation): run it once per setting to see what a backend kit
buys on this machine; `mini` is the Table 3 miniature's base (configs/table3_mini.py) at its packed
2,048-token batch.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import flops
import jax
import jax.numpy as jnp
import numpy as np

from tfm import ModelConfig, Transformer, training
from tfm.implementation import KERNELS
from tfm.job.host import cpu_model

SHAPES = {
    # name: (model, batch rows, source length, target length)
    "mini": (
        dict(vocab_size=4000, num_layers=3, d_model=128, d_ff=512, num_heads=8, d_k=16, d_v=16),
        32,
        64,
        64,
    ),
    "small": (
        dict(vocab_size=8000, num_layers=2, d_model=256, d_ff=1024, num_heads=4, d_k=64, d_v=64),
        32,
        64,
        64,
    ),
    "base": (
        dict(vocab_size=32000, num_layers=6, d_model=512, d_ff=2048, num_heads=8, d_k=64, d_v=64),
        8,
        64,
        64,
    ),
    # the paper's batch on one accelerator: ~25000 target tokens
    "base_25k": (
        dict(vocab_size=32000, num_layers=6, d_model=512, d_ff=2048, num_heads=8, d_k=64, d_v=64),
        390,
        64,
        64,
    ),
    "big_25k": (
        dict(vocab_size=32000, num_layers=6, d_model=1024, d_ff=4096, num_heads=16, d_k=64, d_v=64),
        390,
        64,
        64,
    ),
}


def forward_flops(c: ModelConfig, batch: int, src_len: int, tgt_len: int) -> float:
    """Matmul FLOPs of one forward pass (`flops.forward_flops`)."""
    return flops.forward_flops(
        num_layers=c.num_layers,
        d_model=c.d_model,
        d_ff=c.d_ff,
        qk_width=c.num_heads * c.d_k,
        v_width=c.num_heads * c.d_v,
        vocab_size=c.vocab_size,
        batch=batch,
        src_len=src_len,
        tgt_len=tgt_len,
    )


def matmul_peak(n: int = 2048, repeats: int = 5, dtype=jnp.float32) -> float:
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x: x @ x)
    jax.block_until_ready(f(a))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f(a))
        times.append(time.perf_counter() - start)
    return 2 * n**3 / min(times)


def measure(name: str, steps: int, dtype: str, peak: float, kernels: str) -> dict:
    shape, rows, src_len, tgt_len = SHAPES[name]
    config = ModelConfig(**shape, dropout_rate=0.1, dtype=dtype)
    model = Transformer(config, kernels=kernels)
    optimizer = training.make_optimizer(training.TrainConfig(), config.d_model)
    rng = np.random.default_rng(0)
    batch = {
        "src": rng.integers(4, config.vocab_size, (rows, src_len), dtype=np.int32),
        "tgt_in": rng.integers(4, config.vocab_size, (rows, tgt_len), dtype=np.int32),
        "tgt_out": rng.integers(4, config.vocab_size, (rows, tgt_len), dtype=np.int32),
    }
    batch = jax.device_put(batch)
    state = training.init_train_state(model, optimizer, jax.random.PRNGKey(0), batch)
    step = jax.jit(
        lambda s, b: training.train_step(s, b, model=model, optimizer=optimizer, smoothing=0.1),
        donate_argnums=(0,),
    )
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_seconds = time.perf_counter() - start
    state, _ = compiled(state, batch)
    jax.block_until_ready(state)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    flops = 3 * forward_flops(config, rows, src_len, tgt_len)
    return dict(
        batch=f"{rows} x {src_len}+{tgt_len}",
        dtype=dtype,
        seconds_per_step=round(seconds, 4),
        target_tokens_per_second=round(rows * tgt_len / seconds, 1),
        model_tflops_per_step=round(flops / 1e12, 4),
        achieved_gflops=round(flops / seconds / 1e9, 1),
        mfu=round(flops / seconds / peak, 4),
        compile_seconds=round(compile_seconds, 2),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", nargs="+", default=["small", "base"], choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kernels", default="auto", choices=KERNELS)
    parser.add_argument(
        "--peak_tflops",
        type=float,
        help="use this peak instead of measuring (e.g. 790 for an H200 in bf16)",
    )
    args = parser.parse_args()
    peak = args.peak_tflops * 1e12 if args.peak_tflops else matmul_peak(dtype=jnp.dtype(args.dtype))
    results = {
        name: measure(name, args.steps, args.dtype, peak, args.kernels) for name in args.shapes
    }
    print(
        json.dumps(
            dict(
                benchmark="train_throughput",
                backend=jax.default_backend(),
                device=str(jax.devices()[0].device_kind),
                cpu=cpu_model(),
                devices=jax.device_count(),
                python=platform.python_version(),
                jax=jax.__version__,
                kernels=args.kernels,
                peak_gflops=round(peak / 1e9, 1),
                peak_source="given" if args.peak_tflops else "measured 2048^3 matmul",
                flop_formula="3 x forward matmul FLOPs (see forward_flops)",
                results=results,
            ),
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
