"""The `metrics.jsonl` file of a workdir: one JSON record per line, appended as training goes
(`kind` "train" or "eval", with its `step`), trimmed back to the checkpoint a run resumes from.

Kept free of JAX so that light readers (the Table 3 sweep's driver, plotting) can use it; the
sweep's cost ledger (cost.jsonl) is read by the same strict reader.
"""

from __future__ import annotations

import json
import pathlib


class DamagedRecords(ValueError):
    """A line of a JSON-lines file is not a JSON record."""


def append(path: pathlib.Path, record: dict) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(record) + "\n")


def read(path: str | pathlib.Path) -> list[dict]:
    """Every record of a JSON-lines file, in the order written. A finished or resumed run's
    file is whole (a resume drops a line cut short by a kill), so a line that does not parse is
    damage: it raises, naming the file and line."""
    path = pathlib.Path(path)
    lines = path.read_text().splitlines()
    return [_record(path, n, line) for n, line in enumerate(lines, start=1) if line.strip()]


def _record(path: pathlib.Path, number: int, line: str) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DamagedRecords(
            f"{path}:{number}: not a JSON record ({error.msg}); restore the file from its "
            "source or delete the line, then try again"
        ) from None
    if not isinstance(record, dict):
        raise DamagedRecords(f"{path}:{number}: a JSON {type(record).__name__}, not a record")
    return record


def drop_records_after(path: pathlib.Path, step: int) -> None:
    """Keep the records up to `step`, where a resumed run continues: an interrupted run wrote
    records past its last checkpoint, which the resumed run writes again. A last line cut short
    by the interruption is dropped with them; damage anywhere else raises DamagedRecords
    (naming the line) before anything is rewritten, so a resume never hides it."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    kept = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = _record(path, number, line)
        except DamagedRecords:
            if number == len(lines):
                continue
            raise
        if record.get("step", 0) <= step:
            kept.append(line)
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(line + "\n" for line in kept))
    partial.replace(path)
