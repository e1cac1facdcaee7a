"""The XLA:CPU kit: forms of the paper core's operations, and of the jobs around it, measured
faster or leaner on XLA:CPU (benchmarks/README.md), each computing what the reference does.

Chosen by `tfm.kernels` ("xla_cpu" everywhere, "auto" where a program runs on the CPU):

- `lean_ops`: layer normalization, the masked softmax and the ReLU with their gradients written
  out (the ReLU keeps its input's signs packed eight to a byte);
- `matmul`, `dense`: matrix products whose weight gradients are laid out as XLA:CPU prefers;
- `dropout`: the Threefry-2x32 rounds of `nn.Dropout`'s mask unrolled, so they fuse;
- `loss`: the output layer and loss in CPU-cache-sized chunks, gradients made with them;
- `on_cpu`: each of the above where the program runs on the CPU, the reference elsewhere.

Around the model, for jobs on the CPU: `backend_jit` (compiler options for decoding programs),
`saved_programs` (compiled decoding programs loaded untraced by a later process),
`side_by_side` (independent searches on a CPU's cores), `host_memory` (glibc's allocator).
"""

from __future__ import annotations

from tfm import ops
from tfm.xla_cpu import dense, dropout, lean_ops, loss, matmul

KIT = ops.Ops(
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
