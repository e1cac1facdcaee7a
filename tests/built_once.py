"""A directory that an expensive fixture builds once per test session, shared by every pytest-xdist
worker: the first worker to ask builds it under a lock while the others wait, then all read it."""

import fcntl
import os
import pathlib
import shutil
from collections.abc import Callable


def built_once(tmp_path_factory, name: str, build: Callable[[pathlib.Path], None]) -> pathlib.Path:
    """`build(directory)` run once per session; the directory (read-only for the tests)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # each worker's base is a child of the session's
    directory, done = root / name, root / f"{name}.built"
    with open(root / f"{name}.lock", "w") as lock:
        # the wait ends when the builder is done; its commands have their own timeouts
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            build(directory)
            done.touch()
    return directory
