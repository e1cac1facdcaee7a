"""How the host's C allocator serves the large buffers of XLA:CPU programs.

XLA:CPU allocates each run's scratch ("temp") buffer with posix_memalign: 472 MB for the SMALL
training step of `benchmarks/compare.py`, 596 MB for BASE. glibc serves a block that large with a
fresh mmap and unmaps it when freed, so every step the kernel faults in and zero-fills each 4 KiB
page of it again: ~100k faults and 0.3-0.6 s of kernel time per step on 2 cores, a third of a
SMALL step. With glibc's tunable `glibc.malloc.hugetlb=1` (glibc >= 2.35), malloc asks the kernel
for transparent huge pages on such blocks (`madvise(MADV_HUGEPAGE)`): 2 MiB pages, 512x fewer
faults and fewer TLB misses. Measured on a train step with a 403 MB scratch: 500 -> 210 ms per
step, 103k -> 740 faults, resident memory unchanged.

Tried first and dropped: keeping freed blocks in the heap (`mallopt`: one arena, no mmap, no
trim). Steps then reuse the pages, but small allocations split the freed block now and then, the
next scratch no longer fits in it, and the heap grows by a whole scratch block (935 -> 1,739 MB
within 40 steps), faulting it in again.

glibc reads tunables when a process starts, so a running process cannot turn this on for itself:
`restart_with_huge_page_malloc` re-executes the process with the tunable set. train.py and
decode.py do that first thing only when asked (`--huge_page_malloc` or TFM_HUGE_PAGE_MALLOC=1,
`restart_if_asked`), never inside an interactive interpreter or notebook kernel, and the
restarted process puts GLIBC_TUNABLES back as it was, so its children do not inherit it.
`benchmarks/compare.py` gives the tunable to every system's worker alike.

Memory freed by one-off work (the compiled initialisation of a training state, the compiler)
stays in malloc's heap, resident, beneath the peak of the training steps that follow:
`return_freed_memory` hands it back (compare.py's BASE trainer: peak 1,903 -> 1,739 MB).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

TUNABLE = "glibc.malloc.hugetlb"
ASK_VARIABLE = "TFM_HUGE_PAGE_MALLOC"
# set in the restarted process's environment: GLIBC_TUNABLES as it was before the restart
_ORIGINAL = "TFM_GLIBC_TUNABLES_BEFORE_RESTART"
_UNSET = "<unset>"
TRANSPARENT_HUGE_PAGES = "/sys/kernel/mm/transparent_hugepage/enabled"


def transparent_huge_pages_mode(path: str = TRANSPARENT_HUGE_PAGES) -> str | None:
    """The kernel's transparent huge page mode: "always", "madvise" or "never" (the bracketed
    word of `path`); None where the file is missing (not Linux, or no THP support)."""
    try:
        with open(path) as file:
            text = file.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the running glibc; None for any other C library."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, OSError, ValueError):
        return None


def environment_with_huge_page_malloc(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of `environ` whose GLIBC_TUNABLES also sets glibc.malloc.hugetlb=1; tunables
    already there are kept, and a hugetlb value already chosen is left as it is."""
    environment = dict(environ)
    tunables = [t for t in environment.get("GLIBC_TUNABLES", "").split(":") if t]
    if not any(t.split("=")[0] == TUNABLE for t in tunables):
        environment["GLIBC_TUNABLES"] = ":".join([*tunables, f"{TUNABLE}=1"])
    return environment


def huge_page_malloc_can_help() -> bool:
    """Whether glibc's malloc can ask for huge pages here: Linux, glibc >= 2.35 (which has the
    tunable) and a kernel that gives transparent huge pages on request ("madvise" mode; with
    "always" every mapping gets them already, with "never" none does)."""
    return (
        sys.platform.startswith("linux")
        and (glibc_version() or (0, 0)) >= (2, 35)
        and transparent_huge_pages_mode() == "madvise"
    )


def return_freed_memory() -> bool:
    """Ask glibc's malloc to hand the memory it holds free back to the kernel (`malloc_trim`),
    lowering resident memory; True if it returned any. For after one-off work whose freed
    buffers would otherwise sit in the heap beneath the peak of what follows (the compiled
    initialisation of a training state leaves ~230 MB of them at BASE size). A no-op returning
    False on any other C library."""
    if glibc_version() is None:
        return False
    return bool(ctypes.CDLL(None).malloc_trim(0))


def restart_with_huge_page_malloc() -> None:
    """Re-execute this process (same interpreter, same command line, same pid) with glibc's
    malloc asking for transparent huge pages, when that can help (`huge_page_malloc_can_help`)
    and the tunable is not set yet. Returns without doing anything otherwise, and in the
    restarted process. For a program's entry point only, before it does any work: nothing of
    the current process survives but its open files."""
    if not huge_page_malloc_can_help():
        return
    environment = environment_with_huge_page_malloc(os.environ)
    if environment.get("GLIBC_TUNABLES") == os.environ.get("GLIBC_TUNABLES"):
        return  # already set (by us, before the restart, or by the user)
    environment[_ORIGINAL] = os.environ.get("GLIBC_TUNABLES", _UNSET)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment)


def interactive() -> bool:
    """Whether this is an interactive interpreter or an IPython / Jupyter kernel, where a
    restart would lose the session (`%run train.py` runs it as `__main__` there too)."""
    return hasattr(sys, "ps1") or "IPython" in sys.modules or "ipykernel" in sys.modules


def restart_if_asked(flag: str, argv: list[str] | None = None) -> None:
    """A command line's first step: `restart_with_huge_page_malloc` when `flag` is among the
    arguments or TFM_HUGE_PAGE_MALLOC=1, except in an interactive session (a warning says so).
    In the restarted process, GLIBC_TUNABLES is put back as it was in this process's
    environment (malloc has read it already), so that its children start as they would have."""
    if _ORIGINAL in os.environ:  # the restarted process
        original = os.environ.pop(_ORIGINAL)
        if original == _UNSET:
            os.environ.pop("GLIBC_TUNABLES", None)
        else:
            os.environ["GLIBC_TUNABLES"] = original
        return
    argv = sys.argv[1:] if argv is None else argv
    if flag not in argv and os.environ.get(ASK_VARIABLE) != "1":
        return
    if interactive():
        print(
            f"tfm: not restarting with huge-page malloc ({flag}) in an interactive session",
            file=sys.stderr,
        )
        return
    restart_with_huge_page_malloc()
