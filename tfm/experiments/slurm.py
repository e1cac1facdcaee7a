"""A Slurm job array for a sweep: one task per (row, seed), each one train.py invocation; then
`python -m tfm.experiments collect --workdir DIR` builds the table from the finished workdirs."""

from __future__ import annotations

import shlex

from tfm.experiments.sweep import Run, Sweep


def job_array(sweep: Sweep, runs: list[Run], python: str, sbatch_options: list[str]) -> str:
    """The text of an `sbatch` script whose array task i runs `runs[i]`."""
    logs = sweep.root / "logs"
    header = [
        "#!/usr/bin/env bash",
        f"# Table 3 sweep at {sweep.settings.scale} scale: {len(runs)} tasks (row x seed).",
        f"# Submit with: sbatch {shlex.quote(str(sweep.root / 'table3.sbatch'))}",
        f"# Then: {python} -m tfm.experiments collect --workdir {shlex.quote(str(sweep.root))}",
        "#SBATCH --job-name=tfm-table3",
        f"#SBATCH --array=0-{len(runs) - 1}",
        f"#SBATCH --output={logs}/%x-%A_%a.log",
        *(f"#SBATCH {option}" for option in sbatch_options),
        "set -euo pipefail",
        "",
        "commands=(",
    ]
    body = [
        f"  {shlex.quote(shlex.join(sweep.command(run, python)))}  # {run.name}" for run in runs
    ]
    footer = [
        ")",
        f"cd {shlex.quote(str(sweep.repo))}",
        # each task resumes its own workdir, so a requeued or re-submitted task continues
        'eval "${commands[$SLURM_ARRAY_TASK_ID]}"',
        "",
    ]
    return "\n".join(header + body + footer)
