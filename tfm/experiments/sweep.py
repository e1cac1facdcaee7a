"""A sweep of training jobs: which runs a Table 3 sweep holds, how each one is launched (one
`train.py` invocation, the same code path a user runs by hand), and reading back finished runs.

A sweep directory holds:

    DIR/sweep.json              the sweep's settings (scale, data dir, overrides); a later
                                invocation with different settings is refused, never mixed in
    DIR/runs/ROW/seedS/         one train.py workdir per row and seed
    DIR/runs/ROW/seedS/cost.jsonl   what each train.py invocation of the run cost (see
                                tfm.experiments.ledger)
    DIR/logs/ROW-seedS.log      that run's stdout and stderr
    DIR/logs/sweep.lock         held by the process training the sweep here: a second one is
                                refused, naming the first
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

from tfm.config import table3
from tfm.experiments import ledger
from tfm.job import file_lock, metrics_file

# config file of each scale, relative to the repository root
CONFIG_FILES = {"miniature": "configs/table3_mini.py", "paper": "configs/table3.py"}
ROWS = tuple(table3())


class SweepError(RuntimeError):
    """A sweep that cannot go on as asked; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """What makes two invocations the same sweep."""

    scale: str
    data_dir: str
    overrides: tuple[str, ...] = ()  # --config.KEY=VALUE flags given to every run

    def __post_init__(self) -> None:
        if self.scale not in CONFIG_FILES:
            raise SweepError(f"--scale must be one of {sorted(CONFIG_FILES)}, got {self.scale!r}")
        for flag in self.overrides:
            if not flag.startswith("--config.") or "=" not in flag:
                raise SweepError(f"override {flag!r} must look like --config.KEY=VALUE")


@dataclasses.dataclass(frozen=True)
class Run:
    """One row trained with one seed."""

    row: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.row}-seed{self.seed}"


def plan(rows: list[str], seeds: int, base_seeds: int) -> list[Run]:
    """Runs in the paper's row order: `seeds` seeds per row, `base_seeds` for the base row,
    whose spread decides which differences count."""
    unknown = [row for row in rows if row not in ROWS]
    if not rows:
        raise SweepError(f"--rows names no row; the rows are {', '.join(ROWS)}")
    if unknown:
        raise SweepError(f"--rows: unknown row {unknown[0]!r}; the rows are {', '.join(ROWS)}")
    if seeds < 1 or base_seeds < 1:
        raise SweepError("--seeds and --base_seeds must be at least 1")
    return [
        Run(row, seed)
        for row in ROWS
        if row in rows
        for seed in range(base_seeds if row == "base" else seeds)
    ]


def parse_rows(text: str) -> list[str]:
    """ "all", or a comma-separated list of rows and row groups ("A" = A1, A4, A16, A32)."""
    if text == "all":
        return list(ROWS)
    chosen = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        group = [
            row for row in ROWS if row == item or row.split("_")[0].rstrip("0123456789") == item
        ]
        if not group:
            raise SweepError(
                f"--rows: unknown row or group {item!r}; the rows are {', '.join(ROWS)}"
            )
        chosen += [row for row in group if row not in chosen]
    return chosen


class Sweep:
    """The sweep directory and the runs in it."""

    def __init__(self, root: str | pathlib.Path, settings: Settings, repo: pathlib.Path):
        self.root = pathlib.Path(root).resolve()
        self.settings = settings
        self.repo = repo

    def workdir(self, run: Run) -> pathlib.Path:
        return self.root / "runs" / run.row / f"seed{run.seed}"

    def runs_on_disk(self) -> list[Run]:
        """Every run of a known row that this sweep directory holds a workdir for, in the order
        of their paths."""
        workdirs = sorted((self.root / "runs").glob("*/seed*"))
        return [
            Run(workdir.parent.name, int(workdir.name.removeprefix("seed")))
            for workdir in workdirs
            if workdir.parent.name in ROWS
        ]

    def log(self, run: Run) -> pathlib.Path:
        return self.root / "logs" / f"{run.name}.log"

    def claim(self) -> None:
        """Write sweep.json, or check that an existing one has the same settings."""
        manifest = self.root / "sweep.json"
        wanted = dataclasses.asdict(self.settings)
        wanted["overrides"] = list(self.settings.overrides)
        if manifest.is_file():
            found = json.loads(manifest.read_text())
            if found != wanted:
                changed = sorted(k for k in wanted if found.get(k) != wanted[k])
                raise SweepError(
                    f"{manifest}: this sweep was started with {changed[0]}="
                    f"{found.get(changed[0])!r}, not {wanted[changed[0]]!r}; rerun with the same "
                    "options to continue it, or pick a new --workdir"
                )
            return
        self.root.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps(wanted, indent=1) + "\n")

    def command(self, run: Run, python: str = sys.executable) -> list[str]:
        """The train.py invocation of one run (what a Slurm task runs too)."""
        return [
            python,
            str(self.repo / "train.py"),
            f"--config={self.repo / CONFIG_FILES[self.settings.scale]}:{run.row}",
            f"--workdir={self.workdir(run)}",
            f"--config.seed={run.seed}",
            f"--config.data_dir={self.repo / self.settings.data_dir}",
            *self.settings.overrides,
        ]

    def check_config(self, run: Run) -> None:
        """Refuse overrides that train.py would refuse in every run, before sweep.json records
        them or any run starts: one `train.py --check_config` of the run's command."""
        checked = subprocess.run(
            [*self.command(run), "--check_config"], capture_output=True, text=True, cwd=self.repo
        )
        if checked.returncode != 0:
            said = checked.stderr.strip().splitlines() or [f"exit code {checked.returncode}"]
            raise SweepError(
                f"{CONFIG_FILES[self.settings.scale]}:{run.row} with the overrides given: "
                f"{said[-1].removeprefix('error: ')}"
            )

    def finished(self, run: Run) -> dict | None:
        """The run's results.json when it trained to its last step and scored the validation
        split; None otherwise (not started, interrupted, or failed)."""
        path = self.workdir(run) / "results.json"
        if not path.is_file():
            return None
        result = json.loads(path.read_text())
        total = result.get("config", {}).get("loop", {}).get("num_train_steps")
        if result.get("training", {}).get("step") != total or "validation" not in result:
            return None
        return result

    def run_locally(self, runs: list[Run], parallel: int = 1) -> list[Run]:
        """Train and score every unfinished run, `parallel` at a time, each pinned to its own
        share of this machine's cores (small models use two cores poorly; two one-core runs
        train ~15% more tokens per second in all). Each run resumes from its own checkpoints.
        Returns the runs that failed; their logs say why."""
        lock = self.root / "logs" / "sweep.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)

        def refuse(holder: str) -> None:
            raise SweepError(
                f"{self.root} is being trained by {holder} (it holds {lock}); wait for it, or "
                "stop it with kill -TERM (its runs save a checkpoint) and run this again"
            )

        with file_lock.held(lock, refuse):
            return self._run_locally(runs, parallel)

    def _run_locally(self, runs: list[Run], parallel: int) -> list[Run]:
        todo = []
        for run in runs:
            if self.finished(run):
                print(f"{run.name}: finished, read back", file=sys.stderr)
            else:
                todo.append(run)
        # (results.json, data_identity) of a finished run, planned or not: the data every other
        # run must see
        reference = next(
            (
                self._trained_on(run, result)
                for run in self.runs_on_disk()
                if (result := self.finished(run))
            ),
            None,
        )
        # longest first (the paper's step count of the row), so no long run starts last
        todo.sort(key=lambda run: -table3()[run.row].train_steps)
        cores = sorted(os.sched_getaffinity(0))
        if not 1 <= parallel <= len(cores):
            raise SweepError(f"--parallel must be between 1 and {len(cores)} (the cores here)")
        lanes = [cores[i::parallel] for i in range(parallel)] if parallel > 1 else [cores]
        for run in runs:
            ledger.settle_killed_invocation(self.workdir(run), self.last_checkpoint(run))
        running: dict[int, tuple[Run, subprocess.Popen, ledger.Invocation]] = {}
        failed = []

        def snapshot() -> None:
            for run, proc, started in running.values():
                ledger.snapshot(self.workdir(run), started, proc.pid, self.last_checkpoint(run))
                self._check_data(reference, run)

        try:
            while todo or running:
                for lane, lane_cores in enumerate(lanes):
                    if lane not in running and todo:
                        run = todo.pop(0)
                        started = ledger.Invocation(lane_cores, self.last_checkpoint(run))
                        running[lane] = (run, self._start(run, lane_cores), started)
                lane, usage = ledger.wait_any(
                    {lane: proc for lane, (_, proc, _) in running.items()}, snapshot
                )
                run, proc, started = running.pop(lane)
                self._record_cost(run, started, usage, proc.returncode)
                self._check_data(reference, run)
                if proc.returncode != 0 or not (result := self.finished(run)):
                    print(
                        f"{run.name} failed (exit code {proc.returncode}); see {self.log(run)}",
                        file=sys.stderr,
                    )
                    failed.append(run)
                else:
                    print(f"{run.name}: done", file=sys.stderr, flush=True)
                    reference = reference or self._trained_on(run, result)
        finally:
            for run, proc, started in running.values():  # interrupted: each run saves and stops
                proc.terminate()
                _, status, usage = os.wait4(proc.pid, 0)
                self._record_cost(run, started, usage, os.waitstatus_to_exitcode(status))
        return failed

    def _trained_on(self, run: Run, result: dict) -> tuple[pathlib.Path, dict]:
        return self.workdir(run) / "results.json", data_identity(result["data"])

    def _check_data(self, reference: tuple[pathlib.Path, dict] | None, run: Run) -> None:
        """Stop the sweep as soon as a run's model card (written once its data is prepared,
        before its first step) names other data than the finished runs: continued on another
        machine, a sweep would otherwise train every remaining run on a different corpus and
        only the table would refuse them."""
        card = self.workdir(run) / "model.json"
        if reference is not None and card.is_file():
            check_same_data([reference, (card, data_identity(json.loads(card.read_text())))])

    def last_checkpoint(self, run: Run) -> int:
        """The newest checkpoint step of the run (0 before its first)."""
        steps = [
            int(p.name) for p in (self.workdir(run) / "checkpoints").glob("*") if p.name.isdigit()
        ]
        return max(steps, default=0)

    def _record_cost(self, run: Run, started: ledger.Invocation, usage, exit_code: int) -> None:
        ledger.record(self.workdir(run), started, usage, self.last_checkpoint(run), exit_code)

    def _start(self, run: Run, cores: list[int]) -> subprocess.Popen:
        self.log(run).parent.mkdir(parents=True, exist_ok=True)
        print(
            f"{run.name}: training on cores {cores} (log: {self.log(run)})",
            file=sys.stderr,
            flush=True,
        )
        with self.log(run).open("a") as log:
            return subprocess.Popen(
                self.command(run),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.repo,
                preexec_fn=lambda: os.sched_setaffinity(0, cores),
            )


def data_identity(data: dict) -> dict:
    """What the runs of one table must share: the corpus (its fingerprint) and the vocabulary
    (its file name, which encodes the corpus and settings it was built from). `data` is a
    results.json's "data" or a model.json: both hold these two keys."""
    return {
        "dataset_fingerprint": data.get("dataset_fingerprint"),
        "vocabulary": pathlib.Path(data["vocabulary"]).name,
    }


def check_same_data(seen: list[tuple[pathlib.Path, dict]]) -> None:
    """Refuse runs that saw different data: rows trained on different corpora or vocabularies
    cannot be compared. `seen` holds the file each `data_identity` was read from."""
    if not seen:
        return
    first, first_values = seen[0]
    for path, values in seen[1:]:
        for key, value in values.items():
            if value != first_values[key]:
                raise SweepError(
                    f"data.{key} differs between {first} ({first_values[key]!r}) and {path} "
                    f"({value!r}); the runs of one table must see the same data: retrain the odd "
                    "ones on the others' (or start a new --workdir for new data)"
                )


def read_metrics(workdir: pathlib.Path) -> list[dict]:
    return metrics_file.read(workdir / "metrics.jsonl")


def perplexity_curve(workdir: pathlib.Path) -> list[tuple[int, float]]:
    """Validation perplexity per target piece (unsmoothed NLL) at every evaluation of the run,
    in step order, the last one at the run's last step."""
    evals = {
        r["step"]: float(r["perplexity"]) for r in read_metrics(workdir) if r.get("kind") == "eval"
    }
    if not evals:
        raise SweepError(f"{workdir / 'metrics.jsonl'}: no validation record")
    return sorted(evals.items())
