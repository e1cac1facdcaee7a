"""Compiled decoding programs kept on disk beside JAX's persistent compilation cache, so that a
later process loads each one without tracing or lowering it.

JAX's cache is keyed on a program's lowered HLO, so a run that finds every program there still
traces and lowers each one to compute its key: 0.28-0.37 s per bucket program of the main job's
beam search on an Intel Xeon, against 0.09-0.11 s to load the compiled program. Here a program
is keyed on everything its tracing reads instead:

- the source files of `tfm` and of the traced function's module, and the installed JAX, jaxlib
  and Flax (versions, and each file's size and modification time);
- every `jax.config` value as the calling thread sees it, the `XLA_*`/`JAX_*`/`TPU_*`/`CUDA_*`
  environment, the devices and the host's CPU;
- the function, its `jax.jit` arguments and compiler options, the value of each static argument
  and the shape, dtype, weak type and sharding of each other one.

A static argument outside plain values (numbers, strings, tuples, dicts, dataclasses and named
tuples of them, an unbound Flax module) or a program on several devices is not saved: it runs
through `jax.jit` as before, and so does one that XLA cannot serialize (an executable jit
compiled earlier in the same process is one: the next process saves it). Entries live in
`<jax_compilation_cache_dir>/tfm-programs/`, only when JAX's cache directory was set by tfm
(`tfm.compilation_cache.enable`, which makes that subdirectory), and like JAX's own entries are
never pruned (delete the directory to reclaim the space). Loading one runs compiled code from that
directory, the same trust as JAX's own cache.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import os
import pathlib
import pickle
import platform
import sys
import threading
import warnings
import zlib
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.experimental import serialize_executable

SUBDIRECTORY = "tfm-programs"
_FORMAT = 1  # bump when what an entry holds changes: zlib(pickle((executable, outputs)))
_ENVIRONMENT_PREFIXES = ("XLA_", "JAX_", "TPU_", "LIBTPU", "CUDA_", "NVIDIA_", "ROCR_", "HIP_")


class Unsaveable(Exception):
    """A call whose program is not keyed safely here (it runs through `jax.jit`)."""


def directory() -> pathlib.Path | None:
    """Where programs are saved: `tfm-programs/` under JAX's persistent cache directory, when
    that directory is tfm's own (`tfm.compilation_cache.enable` made the subdirectory); None
    otherwise, so a cache directory that a user set for JAX gets nothing of tfm's."""
    cache = jax.config.jax_compilation_cache_dir
    if not cache:
        return None
    root = pathlib.Path(cache) / SUBDIRECTORY
    return root if root.is_dir() else None


class Call(NamedTuple):
    """A call of a jitted function, split as its compiled program is called."""

    signature: tuple  # equal signatures, the same program (statics compared as jax.jit does)
    statics: dict  # the static arguments, by position or by name
    dynamic_args: tuple  # the positional arguments that are not static, in order
    dynamic_kwargs: dict  # the keyword arguments that are not static


def static_parameters(fun, jit_kwargs: dict) -> tuple[frozenset[str], frozenset[int]]:
    """The static parameters by name and by position, each completed from the other as
    `jax.jit` does."""
    names = _as_tuple(jit_kwargs.get("static_argnames", ()))
    numbers = _as_tuple(jit_kwargs.get("static_argnums", ()))
    parameters = list(inspect.signature(fun).parameters)
    names += tuple(parameters[i] for i in numbers if i < len(parameters))
    numbers += tuple(i for i, p in enumerate(parameters) if p in names)
    return frozenset(names), frozenset(numbers)


def split_call(static: tuple[frozenset[str], frozenset[int]], args: tuple, kwargs: dict) -> Call:
    """The call's signature (statics by value, the rest by type and placement, JAX's
    configuration) and its dynamic arguments; `static` from `static_parameters`. Cheap: called
    on every call of a program."""
    static_names, static_numbers = static
    statics = {i: a for i, a in enumerate(args) if i in static_numbers}
    statics.update((k, v) for k, v in kwargs.items() if k in static_names)
    dynamic_args = tuple(a for i, a in enumerate(args) if i not in static_numbers)
    dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in static_names}
    leaves, treedef = jax.tree.flatten((dynamic_args, dynamic_kwargs))
    signature = (
        tuple((key, type(value), value) for key, value in statics.items()),
        treedef,
        tuple(map(_leaf_type, leaves)),
        jax.default_backend(),
        _jax_configuration(),
    )
    return Call(signature, statics, dynamic_args, dynamic_kwargs)


def load_or_compile(
    root: pathlib.Path, fun, jit_kwargs: dict, compiler_options: dict | None, call: Call, compile
):
    """`call`'s compiled program: loaded from `root`, else `compile()` and saved there. None
    for a call that is not keyed safely here (run it through `jax.jit`)."""
    try:
        path = entry(root, fun, jit_kwargs, compiler_options, call)
        device = _device(call)
    except Unsaveable:
        return None
    program = load(path, call, device)
    if program is None:
        program = compile()
        save(path, program)
    return program


def _device(call: Call):
    """The one device `call`'s program runs on (that of its arrays, else JAX's default)."""
    shardings = {sharding for *_, sharding in call.signature[2] if sharding is not None}
    devices = {device for sharding in shardings for device in sharding.device_set}
    if len(devices) > 1:
        raise Unsaveable("a program on several devices")
    return devices.pop() if devices else (jax.config.jax_default_device or jax.devices()[0])


def _as_tuple(value) -> tuple:
    if value is None:
        return ()
    return (value,) if isinstance(value, int | str) else tuple(value)


def _describe(value: Any) -> str:
    """A static value as text that two processes write alike exactly when the values are equal
    (for the kinds of value accepted); anything else raises `Unsaveable`."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return repr(value)
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if isinstance(value, enum.Enum):
        return f"{kind}.{value.name}"
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        return kind + _describe(value._asdict())
    if isinstance(value, list | tuple):
        return kind + "(" + ",".join(_describe(v) for v in value) + ")"
    if isinstance(value, dict):
        items = sorted((_describe(k), _describe(v)) for k, v in value.items())
        return kind + "{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
    if isinstance(value, frozenset | set):
        return kind + "{" + ",".join(sorted(_describe(v) for v in value)) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if _is_flax_module(value) and fields.pop("parent", None) is not None:
            raise Unsaveable(f"a bound {kind}")  # its scope, not its fields, fixes its program
        return kind + _describe(fields)
    raise Unsaveable(f"a static argument of type {kind}")


def _is_flax_module(value) -> bool:
    linen = sys.modules.get("flax.linen")
    return linen is not None and isinstance(value, linen.Module)


def _leaf_type(leaf) -> tuple:
    """What a dynamic argument contributes to the program: shape, dtype, weak type, and for a
    `jax.Array` its sharding."""
    if isinstance(leaf, jax.Array):
        return (leaf.shape, leaf.dtype, leaf.weak_type, leaf.sharding)
    if isinstance(leaf, np.ndarray | np.generic):
        return (leaf.shape, leaf.dtype, False, None)
    aval = jax.typeof(leaf)  # a Python scalar: weakly typed
    return (aval.shape, aval.dtype, aval.weak_type, None)


def _jax_configuration() -> tuple:
    """Every `jax.config` value, as the calling thread sees it (context managers included)."""
    return tuple(
        (name, getattr(jax.config, name) if hasattr(jax.config, name) else value)
        for name, value in sorted(jax.config.values.items())
    )


def entry(
    root: pathlib.Path, fun, jit_kwargs: dict, compiler_options: dict | None, call: Call
) -> pathlib.Path:
    """The file of `call`'s program: named by a SHA-256 of the installation, the source of
    `tfm` and of the function's module, the function, its `jax.jit` arguments and compiler
    options, and the call's signature. Raises `Unsaveable`."""
    _, treedef, leaf_types, backend, configuration = call.signature
    module = sys.modules.get(fun.__module__)
    parts = [
        f"format {_FORMAT}",
        _installation(),
        _source_fingerprint(getattr(module, "__file__", None) or ""),
        f"{fun.__module__}.{fun.__qualname__}",
        _describe(jit_kwargs),
        _describe(dict(compiler_options or {})),
        _describe(call.statics),
        str(treedef),
        repr(leaf_types),
        backend,
        repr(configuration),
    ]
    return root / (hashlib.sha256("\n".join(parts).encode()).hexdigest() + ".program")


@functools.cache
def _source_fingerprint(path: str) -> str:
    """SHA-256 of a source file's bytes ("" for none)."""
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest() if path else ""


@functools.cache
def _installation() -> str:
    """What every program here depends on besides its own call: tfm's source, the installed JAX,
    jaxlib, Flax and NumPy, the Python, the environment XLA reads, the devices and the CPU."""
    import flax
    import jaxlib
    import numpy

    tfm_root = pathlib.Path(__file__).parent
    sources = hashlib.sha256()
    for path in sorted(tfm_root.rglob("*.py")):
        sources.update(str(path.relative_to(tfm_root)).encode() + b"\0" + path.read_bytes())
    installed = hashlib.sha256()
    for package in (jax, jaxlib, flax):
        for line in sorted(_code_files(os.path.dirname(package.__file__))):
            installed.update(line.encode())
    environment = sorted(
        (k, v) for k, v in os.environ.items() if k.startswith(_ENVIRONMENT_PREFIXES)
    )
    devices = [(d.platform, d.device_kind, d.id, d.process_index) for d in jax.devices()]
    return repr(
        dict(
            tfm=sources.hexdigest(),
            installed=installed.hexdigest(),
            versions=(jax.__version__, jaxlib.__version__, flax.__version__, numpy.__version__),
            python=sys.version,
            environment=environment,
            devices=devices,
            processes=jax.process_count(),
            platform_version=jax.devices()[0].client.platform_version,
            cpu=_cpu(),
        )
    )


def _code_files(root: str) -> list[str]:
    """Each code file under `root` as "path, size, mtime" (4 ms for JAX, jaxlib and Flax)."""
    lines, folders = [], [root]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for item in entries:
                if item.is_dir(follow_symlinks=False):
                    folders.append(item.path)
                elif item.name.endswith((".py", ".so", ".pyd", ".dylib")):
                    stat = item.stat()
                    lines.append(f"{item.path}\0{stat.st_size}\0{stat.st_mtime_ns}\n")
    return lines


def _cpu() -> str:
    """The host CPU's model and features (XLA:CPU compiles for them)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() + platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    lines = {line.split(":")[0].strip(): line for line in text.splitlines() if ":" in line}
    return "\n".join(lines.get(key, "") for key in wanted) + platform.machine()


def load(path: pathlib.Path, call: Call, device):
    """The compiled program saved at `path` for `call`, or None when there is none or it cannot
    be read (a warning names the file; the program is then compiled and saved again)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        payload, outputs = pickle.loads(zlib.decompress(data))
        in_tree = jax.tree.structure((call.dynamic_args, call.dynamic_kwargs))
        return serialize_executable.deserialize_and_load(
            payload, in_tree, jax.tree.structure(outputs), execution_devices=[device]
        )
    except Exception as error:  # noqa: BLE001 - any unreadable entry is compiled again
        # e.g. truncated by a full disk, or written by a JAX that pickled it otherwise
        warnings.warn(
            f"{path}: unreadable saved program ({error}); compiling it again", stacklevel=2
        )
        return None


def save(path: pathlib.Path, compiled) -> None:
    """Write `compiled` to `path` (atomically: a reader sees the whole entry or none). A program
    JAX cannot serialize, or a directory that cannot be written, only warns."""
    try:
        payload, _, out_tree = serialize_executable.serialize(compiled)
    except Exception:  # noqa: BLE001 - XLA raises its own error types
        # not every program serializes (XLA:CPU: a sort's comparator, "`LessThan` is not
        # serializable"; JAX: closed-over constants); such a program is compiled in each process
        return
    outputs = jax.tree.unflatten(out_tree, [0] * out_tree.num_leaves)
    # compressed 1.06 MB -> 153 kB for a bucket program of the main job (zlib: 14 ms to
    # compress, 2 ms to decompress)
    data = zlib.compress(pickle.dumps((payload, outputs)))
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(data)
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        warnings.warn(f"{path}: could not save the compiled program ({error})", stacklevel=2)
