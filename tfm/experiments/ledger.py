"""What a run of a sweep cost: one ledger line per train.py invocation, in the run's workdir.

WORKDIR/cost.jsonl          one line per finished invocation: the CPU seconds its process
                            used (user + system, all threads: unaffected by other work on the
                            machine or by the process being paused), wall seconds, cores,
                            host CPU, and the checkpoint steps before and after
WORKDIR/cost.pending.json   the running invocation's cost so far, rewritten every half
                            minute; a sweep killed outright (SIGKILL, a machine going away)
                            leaves it, and the next invocation moves it into the ledger
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import time
from collections.abc import Callable

from tfm.job import host, metrics_file

LEDGER = "cost.jsonl"
PENDING_COST = "cost.pending.json"
# how often a running invocation's cost so far is saved: what a sweep killed outright leaves
# uncharged is at most this much of its CPU time
SNAPSHOT_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class Invocation:
    """When and where one train.py invocation of a run started."""

    cores: list[int]
    step: int  # the checkpoint it resumes from
    monotonic: float = dataclasses.field(default_factory=time.monotonic)


def entry(started: Invocation, cpu_seconds: float, to_step: int, exit_code: int | None) -> dict:
    """One ledger line: what an invocation spent, and the steps it took the run through."""
    return dict(
        cpu_seconds=round(cpu_seconds, 1),
        wall_seconds=round(time.monotonic() - started.monotonic, 1),
        cores=started.cores,
        host=host.cpu_model(),
        from_step=started.step,
        to_step=to_step,
        exit_code=exit_code,
    )


def record(workdir: pathlib.Path, started: Invocation, usage, to_step: int, exit_code: int) -> None:
    """Append one finished invocation's cost (`usage`: os.wait4's) to the run's ledger."""
    append(workdir, entry(started, usage.ru_utime + usage.ru_stime, to_step, exit_code))


def append(workdir: pathlib.Path, line: dict) -> None:
    """Add a line to the ledger; the pending snapshot it supersedes goes."""
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / LEDGER).open("a") as ledger:
        ledger.write(json.dumps(line) + "\n")
    (workdir / PENDING_COST).unlink(missing_ok=True)


def snapshot(workdir: pathlib.Path, started: Invocation, pid: int, to_step: int) -> None:
    """Save the running invocation's cost so far (replaced whole, never half-written)."""
    cpu_seconds = cpu_seconds_so_far(pid)
    if cpu_seconds is None:
        return
    path = workdir / PENDING_COST
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(entry(started, cpu_seconds, to_step, None)) + "\n")
    os.replace(partial, path)


def settle_killed_invocation(workdir: pathlib.Path, to_step: int) -> None:
    """Move the cost a killed sweep left unrecorded into the ledger: its CPU time as of its
    last snapshot, and the steps up to the newest checkpoint it saved (`to_step`)."""
    path = workdir / PENDING_COST
    if not path.is_file():
        return
    line = json.loads(path.read_text())
    line.update(to_step=to_step, exit_code=None, killed=True)
    append(workdir, line)


def wait_any(
    processes: dict[int, subprocess.Popen], every_snapshot: Callable[[], None]
) -> tuple[int, object]:
    """The key of the first process to finish, and its resource usage (os.wait4's: the CPU time
    of the process and of every child it waited for); `every_snapshot` is called every
    SNAPSHOT_SECONDS meanwhile."""
    last_snapshot = time.monotonic()
    while True:
        for key, proc in processes.items():
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                return key, usage
        if time.monotonic() - last_snapshot >= SNAPSHOT_SECONDS:
            every_snapshot()
            last_snapshot = time.monotonic()
        time.sleep(min(1.0, SNAPSHOT_SECONDS))


def cpu_seconds_so_far(pid: int) -> float | None:
    """The CPU seconds a running process has used (user + system over its threads, and its
    waited-for children: what os.wait4 will report), from /proc/PID/stat; None where there is
    no /proc (not Linux) or the process is gone."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # after the command name (which may hold spaces) come fields 3...; utime, stime, cutime
    # and cstime are fields 14-17, in clock ticks
    fields = stat.rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def cost(workdir: pathlib.Path) -> dict | None:
    """A run's cost over its invocations (the ledger, and a killed sweep's unsettled snapshot):
    CPU seconds (in all, and per host CPU model: a core-second differs between CPUs), and the
    steps they cover (fewer than the run's where an invocation ran before the ledger existed).
    None without a ledger."""
    entries = [
        line
        for name in (LEDGER, PENDING_COST)
        if (workdir / name).is_file()
        for line in metrics_file.read(workdir / name)
    ]
    if not entries:
        return None
    by_host: dict[str, float] = {}
    for line in entries:
        cpu = line.get("host") or "unknown host"
        by_host[cpu] = by_host.get(cpu, 0.0) + line["cpu_seconds"]
    return dict(
        cpu_seconds=sum(line["cpu_seconds"] for line in entries),
        cpu_seconds_by_host=by_host,
        steps_covered=sum(max(0, line["to_step"] - line["from_step"]) for line in entries),
    )
