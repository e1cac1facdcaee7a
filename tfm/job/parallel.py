"""Parallelism: a `data` x `model` device mesh, sharding rules for parameters, global batches
from per-process data, multi-host start-up, and the pmap data-parallel path.

Strategies (config key `parallelism`):
  data    parameters and optimizer state replicated, batch split over `data`.
  fsdp    as data, but every large parameter (and its Adam moments) split over `data` too.
  tensor  heads and d_ff split over `model` (Megatron-style), batch over `data`.
  pmap    the data strategy through `jax.pmap` with explicit gradient all-reduce.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

STRATEGIES = ("data", "fsdp", "tensor", "pmap")
FSDP_MIN_SIZE = 2**14  # smaller leaves stay replicated: sharding them costs more than it saves


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    """Start multi-host JAX. With no arguments, JAX auto-detects TPU pods and Slurm/Open MPI
    clusters; on other clusters pass all three (or set TFM_COORDINATOR / TFM_NUM_PROCESSES /
    TFM_PROCESS_ID). A single process with nothing to detect stays single-process. Either way
    the others stop when a peer is silent for TFM_HEARTBEAT_TIMEOUT seconds (60 by default)."""
    coordinator_address = coordinator_address or os.environ.get("TFM_COORDINATOR")
    if num_processes is None:
        num_processes = _integer_from_environment("TFM_NUM_PROCESSES")
    if process_id is None:
        process_id = _integer_from_environment("TFM_PROCESS_ID", least=0)
    # a peer that dies is noticed within a minute instead of hanging the job
    heartbeat_timeout = _integer_from_environment("TFM_HEARTBEAT_TIMEOUT") or 60
    # CPU processes need an explicit collectives backend; GPUs and TPUs ignore this setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if coordinator_address is not None:
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
            heartbeat_timeout_seconds=heartbeat_timeout,
        )
        return
    cluster_markers = (
        "SLURM_JOB_ID",
        "OMPI_COMM_WORLD_SIZE",
        "TPU_WORKER_HOSTNAMES",
        "MEGASCALE_COORDINATOR_ADDRESS",
    )
    if any(marker in os.environ for marker in cluster_markers):
        jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout)


def _integer_from_environment(name: str, least: int = 1) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or number < least:
        raise ValueError(
            f"environment variable {name}={value!r}: set it to a whole number >= {least}"
        )
    return number


def make_mesh(model_parallel: int = 1, devices=None) -> Mesh:
    """A 2-D mesh (`data`, `model`) over all devices; `model_parallel` devices per model group."""
    devices = np.asarray(jax.devices() if devices is None else devices)
    if devices.size % model_parallel:
        raise ValueError(
            f"model_parallel={model_parallel} does not divide the {devices.size} devices"
        )
    return Mesh(devices.reshape(devices.size // model_parallel, model_parallel), ("data", "model"))


def _names(path) -> list[str]:
    names = []
    for key in path:
        name = getattr(key, "key", None) or getattr(key, "name", None)
        if name is not None:
            names.append(str(name))
    return names


def _tensor_spec(names: list[str], ndim: int) -> list:
    """Megatron-style rule by parameter name: heads and d_ff over `model`."""
    spec = [None] * ndim
    if len(names) >= 2 and names[-1] == "kernel":
        layer = names[-2]
        if layer in ("query", "key", "value") and ndim == 3:
            spec[1] = "model"  # [d_model, heads, d]
        elif layer == "out" and ndim == 3:
            spec[0] = "model"  # [heads, d_v, d_model]
        elif layer == "inner":
            spec[1] = "model"  # [d_model, d_ff]
        elif layer == "outer":
            spec[0] = "model"  # [d_ff, d_model]
    elif len(names) >= 2 and names[-2] == "inner" and names[-1] == "bias":
        spec[0] = "model"
    return spec


def parameter_spec(
    path, shape: tuple[int, ...], strategy: str, mesh: Mesh, fsdp_min_size: int = FSDP_MIN_SIZE
) -> P:
    """PartitionSpec of one parameter (or Adam moment, which shares the parameter's path
    suffix) under `strategy`. Axes that do not divide evenly stay unsplit."""
    if strategy not in STRATEGIES:
        raise ValueError(f"parallelism must be one of {STRATEGIES}, got {strategy!r}")
    spec: list = [None] * len(shape)
    if strategy == "tensor":
        spec = _tensor_spec(_names(path), len(shape))
        spec = [
            s if s is None or shape[i] % mesh.shape[s] == 0 else None for i, s in enumerate(spec)
        ]
    if strategy == "fsdp" and int(np.prod(shape, dtype=np.int64)) >= fsdp_min_size:
        for axis in np.argsort(shape)[::-1]:  # the largest axis that divides evenly
            if spec[axis] is None and shape[axis] % mesh.shape["data"] == 0:
                spec[axis] = "data"
                break
    return P(*spec)


def state_shardings(state, strategy: str, mesh: Mesh, fsdp_min_size: int = FSDP_MIN_SIZE):
    """NamedShardings for every leaf of a pytree of arrays (or ShapeDtypeStructs)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: NamedSharding(
            mesh, parameter_spec(path, leaf.shape, strategy, mesh, fsdp_min_size)
        ),
        state,
    )


def batch_sharding(mesh: Mesh, micro_batched: bool = False) -> NamedSharding:
    """Rows split over `data` (after the micro-batch axis, if any)."""
    return NamedSharding(mesh, P(None, "data") if micro_batched else P("data"))


def global_batch(
    local_batch: dict[str, np.ndarray], sharding: NamedSharding
) -> dict[str, jax.Array]:
    """One global jax.Array per key from this process's rows (each process passes its own
    contiguous slice; see `tfm.data.pipeline`)."""
    return {
        key: jax.make_array_from_process_local_data(sharding, value)
        for key, value in local_batch.items()
    }


def split_for_pmap(batch: dict[str, np.ndarray], devices: int) -> dict[str, np.ndarray]:
    """[rows, ...] -> [devices, rows / devices, ...] (micro-batch axis kept second)."""

    def split(x: np.ndarray) -> np.ndarray:
        if x.ndim == 3:  # [micro, rows, L]
            micro, rows = x.shape[:2]
            return x.reshape(micro, devices, rows // devices, *x.shape[2:]).swapaxes(0, 1)
        return x.reshape(devices, x.shape[0] // devices, *x.shape[1:])

    return {key: split(value) for key, value in batch.items()}


def replicate_for_pmap(tree, devices: int | None = None):
    """A copy of every leaf per local device along a new leading axis (pmap's input layout)."""
    devices = devices or jax.local_device_count()
    return jax.tree.map(
        lambda x: np.broadcast_to(np.asarray(x), (devices, *np.shape(x))), jax.device_get(tree)
    )
