"""An exclusive advisory lock on a file (flock), held for a block, with the holder's process id
written in it so that whoever finds it taken can say by whom. The OS releases the lock when its
holder dies, so a killed process never blocks the next one. Standard library only: the data
workers import it without JAX."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import sys
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def held(
    path: pathlib.Path,
    when_taken: Callable[[str], None],
    when_unsupported: Callable[[OSError], None] | None = None,
) -> Iterator[None]:
    """Hold the lock on `path` for the block. If another process holds it, `when_taken(holder)`
    is called first (holder: "process PID" as the holder wrote it, or "another process" when it
    wrote none, e.g. between taking the lock and writing): it raises to give up, or returns to
    wait until the lock is free. On a file system without locks the error is
    raised, or, given `when_unsupported`, passed to it and the block runs unlocked."""
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            taken = False
        except BlockingIOError:
            taken = True
        except OSError as error:
            if when_unsupported is None:
                raise
            when_unsupported(error)
            yield
            return
        if taken:  # outside the except clause: what when_taken raises stands alone
            handle.seek(0)
            pid = handle.read().strip()
            when_taken(f"process {pid}" if pid else "another process")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def building(path: pathlib.Path, what: str) -> Iterator[None]:
    """Hold the lock on `path` while building `what` (a cache that processes started together
    would otherwise build at once and collide): a second builder says whom it waits for and
    waits, then finds the cache built. Where locks are unsupported it says so and builds."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def wait(holder: str) -> None:
        print(f"waiting for {holder}, which is {what} (it holds {path})", file=sys.stderr)

    def unlocked(error: OSError) -> None:
        print(f"{path} cannot be locked ({error}); {what} unlocked", file=sys.stderr)

    with held(path, wait, unlocked):
        yield
