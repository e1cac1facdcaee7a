"""Tooling for jobs that run on a CPU host, around the model rather than inside it: compiler
options for the decoding programs (`backend_jit`), decoding programs saved compiled and loaded
untraced by a later process (`saved_programs`), independent searches side by side on a CPU's
cores (`side_by_side`), and glibc's allocator (`host_memory`). Each does nothing off the CPU.
The XLA:CPU kit's op forms are `tfm.xla_cpu`."""
