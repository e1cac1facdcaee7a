"""Checkpoints with orbax: train state + data-iterator state + metadata, every N steps and on
exit, the last K kept; atomic (orbax writes a temporary directory and renames it when complete).

Verified: each checkpoint stores SHA-256 digests of everything it holds (parameters, optimizer
state, step, RNG, data-iterator state), and every restore compares what it read with them. A
checkpoint that cannot be read or does not match is damaged: restoring the newest one warns,
moves it aside (`checkpoints/STEP.damaged`, never deleted, so later saves of that step succeed)
and falls back to the previous one.

Also checkpoint averaging (section 6.1: the last 5 for base, 20 for big) and a command:

    python -m tfm.job.checkpoint info WORKDIR      # steps, parameter digests, verified or not
    python -m tfm.job.checkpoint verify WORKDIR    # exit 1 if any checkpoint is damaged
    python -m tfm.job.checkpoint average WORKDIR --last 5 --output PARAMS_DIR
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was expected; the message says where and what to do."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose contents differ from the digests stored with it."""


def _local_copy(leaf) -> np.ndarray | None:
    """The whole value of a leaf as a host array, or None where this process holds only part of
    it (a parameter sharded across processes)."""
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        if not leaf.is_fully_replicated:
            return None
        leaf = leaf.addressable_data(0)
    return np.asarray(jax.device_get(leaf))


def _key_name(key) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def params_digest(tree) -> str | None:
    """SHA-256 over every leaf's path, dtype, shape and bytes, leaves in path order; None if
    some leaf is not wholly held by this process. Paths are written as plain names so that a
    state restored as nested dicts (no target structure) digests like the state it was saved
    from (optax's named tuples)."""
    leaves = sorted(
        (
            ("/".join(_key_name(k) for k in path), leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        ),
        key=lambda item: item[0],
    )
    digest = hashlib.sha256()
    for path, leaf in leaves:
        array = _local_copy(leaf)
        if array is None:
            return None
        digest.update(path.encode())
        digest.update(str(array.dtype).encode() + str(array.shape).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _parts(state) -> dict:
    """A train state's fields by name (params, opt_state, step, rng), whether it is the
    `TrainState` dataclass or the nested dicts of a restore without a target structure."""
    if dataclasses.is_dataclass(state):
        return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    if isinstance(state, dict):
        return dict(state)
    return {"state": state}


def state_digests(state, data_state: dict | None) -> dict[str, str | None]:
    """One digest per part of a checkpoint: each field of the train state (params, opt_state,
    step, rng) and the data-iterator state."""
    digests = {name: params_digest(value) for name, value in _parts(state).items()}
    text = json.dumps(data_state or {}, sort_keys=True, default=str)
    digests["data"] = hashlib.sha256(text.encode()).hexdigest()
    return digests


def _compare(step: int, directory: pathlib.Path, meta: dict, got: dict[str, str | None]) -> None:
    """Raise DamagedCheckpoint naming the parts whose digest differs from the stored one."""
    stored = dict(meta.get("digests") or {})  # absent in checkpoints of older tfm versions
    differ = [
        name
        for name, value in stored.items()
        if value is not None and got.get(name) is not None and got[name] != value
    ]
    if differ:
        raise DamagedCheckpoint(
            f"checkpoint {step} in {directory} is damaged: {', '.join(sorted(differ))} "
            "differ from the digests stored when it was written"
        )


@contextlib.contextmanager
def _quiet_absl(quiet: bool):
    """absl's (orbax's) warnings held back inside the block when `quiet`."""
    logger = logging.getLogger("absl")
    level = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class Checkpointer:
    """Saves and restores `{"state": pytree, "data": json, "meta": json}` under WORKDIR/checkpoints.

    `keep` last checkpoints are kept (>= 20 allows the paper's big-model averaging).
    """

    def __init__(self, workdir: str | pathlib.Path, keep: int = 20, read_only: bool = False):
        self.directory = self.directory_of(workdir)
        if read_only and not self.directory.is_dir():
            raise CheckpointError(
                f"{self.directory}: no checkpoints here; is WORKDIR the "
                "directory train.py was given?"
            )
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None if read_only else keep,
            save_interval_steps=0 if read_only else 1,
            create=not read_only,
            enable_async_checkpointing=False,
            read_only=read_only,
        )
        with _quiet_absl(read_only):  # orbax warns that a read-only manager is read-only
            self.manager = ocp.CheckpointManager(self.directory, options=options)
        self.read_only = read_only

    @staticmethod
    def directory_of(workdir: str | pathlib.Path) -> pathlib.Path:
        """Where a workdir's checkpoints live."""
        return pathlib.Path(workdir).absolute() / "checkpoints"

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(
        self, step: int, state, data_state: dict | None = None, meta: dict | None = None
    ) -> None:
        """Write checkpoint `step` (blocking; complete on return, or absent if interrupted), with
        the digests of everything it holds in its metadata."""
        meta = dict(meta or {}, step=step, digests=state_digests(state, data_state))
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=ocp.args.JsonSave(data_state or {}),
                meta=ocp.args.JsonSave(meta),
            ),
            force=True,
        )
        self.manager.wait_until_finished()

    def _first_readable(self, step: int | None, read: Callable[[int], Any]) -> tuple[Any, int]:
        """`read(step)`, or without a step `read` of the newest checkpoint that can be read and
        verified; newer damaged ones are moved aside (unless read-only) with a warning."""
        saved = self.steps()
        candidates = [step] if step is not None else saved[::-1]
        if not candidates:
            raise CheckpointError(f"{self.directory}: no checkpoints to restore")
        if step is not None and step not in saved:
            raise CheckpointError(
                f"{self.directory} has no checkpoint {step}; its steps are "
                f"{', '.join(map(str, saved)) or 'none'}"
            )
        errors = []
        for candidate in candidates:
            try:
                return read(candidate), candidate
            except Exception as error:  # orbax raises many types for damaged files
                message = (
                    str(error)
                    if isinstance(error, DamagedCheckpoint)
                    else f"checkpoint {candidate} in {self.directory} is unreadable "
                    f"({type(error).__name__}: {str(error)[:300]})"
                )
                if step is not None:
                    raise CheckpointError(
                        message + "; choose another step (python -m "
                        "tfm.job.checkpoint verify WORKDIR checks them all)"
                    ) from error
                if not self.read_only:
                    message += f"; moved aside to {self.move_aside(candidate).name}"
                log.warning("%s; trying the previous one", message)
                errors.append(message)
        raise CheckpointError("no readable checkpoint: " + "; ".join(errors))

    def move_aside(self, step: int) -> pathlib.Path:
        """Rename a damaged checkpoint to STEP.damaged (STEP.damaged-2, ...): kept for a look,
        and out of the way of a new checkpoint of the same step."""
        source = self.directory / str(step)
        target = self.directory / f"{step}.damaged"
        number = 1
        while target.exists():
            number += 1
            target = self.directory / f"{step}.damaged-{number}"
        if jax.process_index() == 0:  # one mover; every process falls back the same way
            source.rename(target)
        self.manager.reload()
        return target

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
            step, lambda candidate: self._verified(candidate, args)
        )
        return (
            restored["state"],
            dict(restored["data"] or {}),
            dict(restored["meta"] or {}),
            used,
        )

    def restore_params(self, step: int | None = None) -> tuple[Any, int]:
        """(parameters, step) of checkpoint `step` or the newest readable one, on one local
        device, whatever mesh wrote them (no target structure needed); verified like `restore`."""

        def read(candidate: int):
            args = ocp.args.Composite(
                state=ocp.args.StandardRestore(self._host_target(candidate)),
                data=ocp.args.JsonRestore(),
                meta=ocp.args.JsonRestore(),
            )
            return self._verified(candidate, args)["state"]["params"]

        return self._first_readable(step, read)

    def _verified(self, step: int, args):
        """Restore checkpoint `step` and compare it with its stored digests."""
        restored = self.manager.restore(step, args=args)
        digests = state_digests(restored["state"], dict(restored["data"] or {}))
        _compare(step, self.directory, dict(restored["meta"] or {}), digests)
        return restored

    def _host_target(self, step: int):
        """The saved state's shapes and dtypes, placed on one local device: a checkpoint written
        by any mesh or number of processes restores here (orbax needs a target for that)."""
        # the item's handler reads its own metadata; orbax's StandardCheckpointer would also look
        # for a checkpoint-level metadata file inside the item and log a warning per checkpoint
        metadata = ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "state")
        device = jax.sharding.make_single_device_sharding(jax.local_devices()[0])
        return jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata.tree
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
    if isinstance(last, bool) or not isinstance(last, int) or last < 1:
        raise ValueError(f"average the last N checkpoints: N must be at least 1, got {last!r}")
    checkpointer = Checkpointer(workdir, read_only=True)
    steps = checkpointer.steps()
    if not steps:
        raise CheckpointError(f"{checkpointer.directory}: no checkpoints to average")
    chosen, params = [], []
    for step in steps[::-1]:
        try:
            p, _ = checkpointer.restore_params(step)
        except CheckpointError as error:
            log.warning("skipping %s", error)
            continue
        chosen.append(step)
        params.append(p)
        if len(chosen) == last:
            break
    if not params:
        raise CheckpointError(f"{checkpointer.directory}: no readable checkpoint to average")
    if len(chosen) < last:
        log.warning(
            "averaging %d checkpoints %s: %s holds no %d verified ones",
            len(chosen), sorted(chosen), checkpointer.directory, last,
        )  # fmt: skip
    return average_params(params), sorted(chosen)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="each checkpoint's step and parameter digest")
    info.add_argument("workdir")
    verify = commands.add_parser("verify", help="check every checkpoint; exit 1 on any damage")
    verify.add_argument("workdir")
    average = commands.add_parser("average", help="average the last N checkpoints' parameters")
    average.add_argument("workdir")
    average.add_argument("--last", type=int, default=5)
    average.add_argument("--output", required=True, help="directory for the averaged params")
    args = parser.parse_args(argv)
    try:
        _run_command(args)
    except (CheckpointError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None


def _run_command(args: argparse.Namespace) -> None:
    if args.command in ("info", "verify"):
        checkpointer = Checkpointer(args.workdir, read_only=True)
        print(f"{'step':>8}  sha256(params) of a verified checkpoint, or what is wrong")
        damaged = 0
        for step in checkpointer.steps():
            try:
                params, _ = checkpointer.restore_params(step)
                print(f"{step:>8}  {params_digest(params)}")
            except CheckpointError as error:
                damaged += 1
                print(f"{step:>8}  DAMAGED: {error}")
        if args.command == "verify":
            print(f"{len(checkpointer.steps()) - damaged} verified, {damaged} damaged")
            raise SystemExit(1 if damaged else 0)
    else:
        output = pathlib.Path(args.output).absolute()
        if output.exists():  # checked before the checkpoints are read
            raise ValueError(f"--output {output} already exists; name a new directory")
        params, steps = average_last(args.workdir, args.last)
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(output, params)
        checkpointer.wait_until_finished()
        print(f"averaged steps {steps} -> {output} (sha256 {params_digest(params)})")


if __name__ == "__main__":
    main()
