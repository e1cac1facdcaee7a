"""The XLA:CPU kit: forms of the paper core's operations measured faster or leaner on XLA:CPU
(benchmarks/README.md), each computing what the reference does.

Chosen by `tfm.implementation` ("xla_cpu" everywhere, "auto" where a program runs on the CPU):

- `lean_ops`: layer normalization, the masked softmax and the ReLU with their gradients written
  out (the ReLU keeps its input's signs packed eight to a byte);
- `matmul`, `dense`: matrix products whose weight gradients are laid out as XLA:CPU prefers;
- `dropout`: the Threefry-2x32 rounds of `nn.Dropout`'s mask unrolled, so they fuse;
- `loss`: the output layer and loss in CPU-cache-sized chunks, gradients made with them;
- `on_cpu`: each of the above where the program runs on the CPU, the reference elsewhere.

The CPU host tooling around the model (compiler options, saved programs, side-by-side searches,
the allocator) is `tfm.cpu_host`.
"""

from __future__ import annotations

from tfm.xla_cpu import dense, dropout, lean_ops, loss, matmul

# The kit's forms of `tfm.implementation.Ops` fields, the ops it was measured faster or leaner
# on (every field it leaves out stays the reference); `tfm.implementation` builds the op set.
KIT = dict(
    LayerNorm=lean_ops.LayerNorm,
    Dropout=dropout.Dropout,
    dot_general_cls=dense.KitDotGeneral,
    relu=lean_ops.relu,
    masked_softmax=lean_ops.masked_softmax,
    tied_logits=matmul.tied_logits,
    output_loss=loss.output_loss_sums,
)


def __getattr__(name: str):
    if name == "CPU_ONLY":  # imported on first use: it builds on KIT's modules
        from tfm.xla_cpu import on_cpu

        return on_cpu.OPS
    raise AttributeError(f"module 'tfm.xla_cpu' has no attribute {name!r}")
