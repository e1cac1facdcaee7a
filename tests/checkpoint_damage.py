"""Damage one part of a stored checkpoint by changing that part's own bytes, as a bad disk or an
interrupted copy would, leaving the digests stored with it alone.

A checkpoint (tfm.job.checkpoint) holds the train state in orbax's OCDBT store (one zarr array
per leaf: `params.*`, `opt_state.*`, `step`, `rng`) and the data-iterator position as JSON in
`data/metadata`. The arrays are rewritten through tensorstore, so the store stays readable and
only the check against the stored digests can notice the change.
"""

import json
import pathlib

import numpy as np
import tensorstore as ts

PARTS = ("params", "opt_state", "rng", "data")


def _state_array(state_dir: pathlib.Path, name: str):
    spec = {
        "driver": "zarr",
        "kvstore": {"driver": "ocdbt", "base": f"file://{state_dir}/", "path": f"{name}/"},
    }
    return ts.open(spec).result()


def stored_arrays(state_dir: pathlib.Path, part: str) -> list[str]:
    """The names of the arrays of one part of the train state, in the OCDBT store."""
    store = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{state_dir}/"}).result()
    names = {key.decode().split("/")[0] for key in store.list().result()}
    return sorted(n for n in names if n == part or n.startswith(part + "."))


def damage(checkpoint_dir: pathlib.Path, part: str) -> str:
    """Change one stored value of `part` ("params", "opt_state", "rng" or "data") in the
    checkpoint at `checkpoint_dir` (WORKDIR/checkpoints/STEP); returns what was changed."""
    if part == "data":
        path = checkpoint_dir / "data" / "metadata"
        position = json.loads(path.read_text())
        text = json.dumps(position)
        digits = next(i for i, c in enumerate(text) if c.isdigit())
        changed = text[:digits] + str((int(text[digits]) + 1) % 10) + text[digits + 1 :]
        path.write_text(changed)
        return f"{path}: {text} -> {changed}"
    state_dir = checkpoint_dir / "state"
    # a floating-point array where there is one (Adam's moments rather than its step count)
    for name in stored_arrays(state_dir, part):
        array = _state_array(state_dir, name)
        if np.issubdtype(array.dtype.numpy_dtype, np.floating) or part == "rng":
            break
    value = array.read().result()
    changed = value.copy()
    changed.reshape(-1).view(np.uint8)[0] ^= 0x01  # the lowest bit of the first element
    array.write(changed).result()
    assert (array.read().result() != value).sum() == 1
    return f"{state_dir}: {name}[0] lowest bit flipped"
