"""JAX's persistent compilation cache, so that a second run of the same program (decode.py on
the same model, train.py resuming) loads its compiled XLA programs instead of compiling them.
With it on, the decoding programs are also saved compiled under it (`tfm.cpu_host.saved_programs`),
and a second run loads those without tracing them."""

from __future__ import annotations

import os
import pathlib

import jax

from tfm.cpu_host import saved_programs


def default_directory() -> str:
    """$TFM_COMPILATION_CACHE, else $XDG_CACHE_HOME/tfm/jax (~/.cache/tfm/jax)."""
    if "TFM_COMPILATION_CACHE" in os.environ:
        return os.environ["TFM_COMPILATION_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return str(pathlib.Path(base) / "tfm" / "jax")


def enable(directory: str | None) -> None:
    """Cache every compiled program in `directory` ("" or None: leave caching off). Programs are
    keyed by JAX on their computation, devices and compiler version, so a stale entry is never
    used."""
    if not directory:
        return
    # the decoding programs tfm saves compiled go here too (`tfm.cpu_host.saved_programs`)
    (pathlib.Path(directory) / saved_programs.SUBDIRECTORY).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", directory)
    # the decoders' programs compile in well under JAX's default 1 s threshold, and there are
    # many (one per length bucket): cache them all
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
