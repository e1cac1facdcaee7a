"""Checkpoints with orbax: train state + data-iterator state + metadata, every N steps and on
exit, the last K kept; atomic (orbax writes a temporary directory and renames it when complete);
a latest checkpoint that cannot be read falls back to the previous one with a warning.

Also checkpoint averaging (section 6.1: the last 5 for base, 20 for big) and a command:

    python -m tfm.checkpoint info WORKDIR
    python -m tfm.checkpoint average WORKDIR --last 5 --output PARAMS_DIR
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was expected; the message says where and what to do."""


def params_digest(params) -> str:
    """SHA-256 over every parameter's path, dtype, shape and bytes, in tree order."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        array = np.asarray(jax.device_get(leaf))
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(str(array.dtype).encode() + str(array.shape).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


class Checkpointer:
    """Saves and restores `{"state": pytree, "data": json, "meta": json}` under WORKDIR/checkpoints.

    `keep` last checkpoints are kept (>= 20 allows the paper's big-model averaging).
    """

    def __init__(self, workdir: str | pathlib.Path, keep: int = 20, read_only: bool = False):
        self.directory = pathlib.Path(workdir).absolute() / "checkpoints"
        if read_only and not self.directory.is_dir():
            raise CheckpointError(
                f"{self.directory}: no checkpoints here; is WORKDIR the "
                "directory train.py was given?"
            )
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=not read_only,
            enable_async_checkpointing=False,
            read_only=read_only,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(
        self, step: int, state, data_state: dict | None = None, meta: dict | None = None
    ) -> None:
        """Write checkpoint `step` (blocking; complete on return, or absent if interrupted)."""
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=ocp.args.JsonSave(data_state or {}),
                meta=ocp.args.JsonSave(meta or {}),
            ),
            force=True,
        )
        self.manager.wait_until_finished()

    def _first_readable(self, step: int | None, read: Callable[[int], Any]) -> tuple[Any, int]:
        """`read(step)`, or without a step `read` of the newest checkpoint that can be read;
        unreadable newer ones are skipped with a warning."""
        candidates = [step] if step is not None else self.steps()[::-1]
        if not candidates:
            raise CheckpointError(f"{self.directory}: no checkpoints to restore")
        errors = []
        for candidate in candidates:
            try:
                return read(candidate), candidate
            except Exception as error:  # orbax raises many types for damaged files
                message = (
                    f"checkpoint {candidate} in {self.directory} is unreadable "
                    f"({type(error).__name__}: {str(error)[:300]})"
                )
                if step is not None:
                    raise CheckpointError(
                        message + "; choose another step (python -m "
                        "tfm.checkpoint info WORKDIR lists them)"
                    ) from error
                log.warning("%s; trying the previous one", message)
                print(f"WARNING: {message}; trying the previous one", file=sys.stderr)
                errors.append(message)
        raise CheckpointError("no readable checkpoint: " + "; ".join(errors))

    def restore(self, target, step: int | None = None) -> tuple[Any, dict, dict, int]:
        """(state, data_state, meta, step) of checkpoint `step`, or of the newest readable one.

        `target` is a pytree of arrays or ShapeDtypeStructs (with shardings) giving structure and
        placement.
        """
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract),
            data=ocp.args.JsonRestore(),
            meta=ocp.args.JsonRestore(),
        )
        restored, used = self._first_readable(
            step, lambda candidate: self.manager.restore(candidate, args=args)
        )
        return (
            restored["state"],
            dict(restored["data"] or {}),
            dict(restored["meta"] or {}),
            used,
        )

    def restore_params(self, step: int | None = None) -> tuple[Any, int]:
        """(parameters, step) of checkpoint `step` or the newest readable one, on one local
        device, whatever mesh wrote them (no target structure needed)."""

        def read(candidate: int):
            args = ocp.args.Composite(state=ocp.args.StandardRestore(self._host_target(candidate)))
            return self.manager.restore(candidate, args=args)["state"]["params"]

        return self._first_readable(step, read)

    def _host_target(self, step: int):
        """The saved state's shapes and dtypes, placed on one local device: a checkpoint written
        by any mesh or number of processes restores here (orbax needs a target for that)."""
        metadata = ocp.StandardCheckpointer().metadata(self.directory / str(step) / "state")
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
            metadata.item_metadata,
        )

    def close(self) -> None:
        self.manager.close()


def average_params(params_list: list) -> Any:
    """Element-wise mean of several parameter pytrees (accumulated in float64)."""
    if not params_list:
        raise ValueError("average_params needs at least one parameter set")
    total = jax.tree.map(lambda x: np.asarray(x, np.float64), params_list[0])
    for params in params_list[1:]:
        total = jax.tree.map(lambda a, b: a + np.asarray(b, np.float64), total, params)
    return jax.tree.map(
        lambda a, ref: (a / len(params_list)).astype(np.asarray(ref).dtype), total, params_list[0]
    )


def average_last(workdir: str | pathlib.Path, last: int) -> tuple[Any, list[int]]:
    """Mean parameters of the last `last` readable checkpoints (section 6.1) and their steps."""
    checkpointer = Checkpointer(workdir, read_only=True)
    steps = checkpointer.steps()
    if not steps:
        raise CheckpointError(f"{checkpointer.directory}: no checkpoints to average")
    chosen, params = [], []
    for step in steps[::-1]:
        try:
            p, _ = checkpointer.restore_params(step)
        except CheckpointError as error:
            print(f"WARNING: skipping {error}", file=sys.stderr)
            continue
        chosen.append(step)
        params.append(p)
        if len(chosen) == last:
            break
    return average_params(params), sorted(chosen)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="each checkpoint's step and parameter digest")
    info.add_argument("workdir")
    average = commands.add_parser("average", help="average the last N checkpoints' parameters")
    average.add_argument("workdir")
    average.add_argument("--last", type=int, default=5)
    average.add_argument("--output", required=True, help="directory for the averaged params")
    args = parser.parse_args(argv)
    if args.command == "info":
        checkpointer = Checkpointer(args.workdir, read_only=True)
        print(f"{'step':>8}  sha256(params)")
        for step in checkpointer.steps():
            try:
                params, _ = checkpointer.restore_params(step)
                print(f"{step:>8}  {params_digest(params)}")
            except CheckpointError as error:
                print(f"{step:>8}  UNREADABLE: {error}")
    else:
        params, steps = average_last(args.workdir, args.last)
        checkpointer = ocp.StandardCheckpointer()
        output = pathlib.Path(args.output).absolute()
        checkpointer.save(output, params)
        checkpointer.wait_until_finished()
        print(f"averaged steps {steps} -> {output} (sha256 {params_digest(params)})")


if __name__ == "__main__":
    main()
