"""How the host's C allocator treats the large buffers of XLA:CPU programs.

XLA:CPU allocates each run's scratch ("temp") buffer with posix_memalign on one of its worker
threads: 472 MB for the SMALL training step of `benchmarks/compare.py`, 596 MB for BASE. glibc
serves a block that large from a thread's arena with a fresh mmap and unmaps it when freed, so
every step faults in every page of it again: measured on 2 cores, 0.35-0.45 s of kernel time per
step, a third of a SMALL step. `keep_freed_blocks` makes every thread allocate from the main heap
and keep what is freed there, so a step reuses the pages of the one before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt parameters, from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def keep_freed_blocks() -> bool:
    """Make glibc keep freed memory for reuse instead of returning it to the OS: one arena for
    every thread (new threads only), no mmap for large blocks, no trimming of the heap (up to
    2 GB free at its top). Call it before JAX's first computation (its worker threads pick their
    arena when they first allocate); train.py and decode.py call it first thing. The process's
    resident memory then stays at its peak instead of falling after each step; the peak itself
    does not grow. Returns False, changing nothing, off Linux/glibc."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # e.g. musl, which has no mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return all(
        mallopt(parameter, value) == 1
        for parameter, value in (
            (_M_ARENA_MAX, 1),
            (_M_MMAP_MAX, 0),
            (_M_TRIM_THRESHOLD, 2**31 - 1),
        )
    )
