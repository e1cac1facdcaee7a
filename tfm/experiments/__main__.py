"""Run or collect a Table 3 sweep.

    python -m tfm.experiments table3 --workdir runs/table3-mini [--rows A,D,E] [--seeds 1]
        [--base_seeds 3] [--scale miniature|paper] [--slurm [--sbatch_option=--gres=gpu:8 ...]]
    python -m tfm.experiments collect --workdir runs/table3-mini

`table3` trains every unfinished row x seed here, one train.py run after another (finished runs
are read back, interrupted ones resume), then writes the table; with --slurm it writes
DIR/table3.sbatch (a job array, one task per run) instead of training. `collect` writes
DIR/table3.json, DIR/table3.md and DIR/table3.png from whatever runs have finished.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import signal
import sys
import time

from tfm.experiments import slurm, table3_figure, table3_report, table3_text
from tfm.experiments.ledger import cost
from tfm.experiments.sweep import (
    CONFIG_FILES,
    ROWS,
    Settings,
    Sweep,
    SweepError,
    check_same_data,
    data_identity,
    parse_rows,
    perplexity_curve,
    plan,
)


def _repo() -> pathlib.Path:
    """The checkout whose train.py and configs/ the runs use (tfm is installed editable)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    if not (root / "train.py").is_file():
        raise SweepError(
            f"no train.py beside the tfm package in {root}; run from a checkout of tfm installed "
            "with pip install -e"
        )
    return root


def collect(sweep: Sweep) -> dict:
    """Read every finished run of the sweep and write table3.json / .md / .png."""
    runs: dict[str, list[dict]] = {row: [] for row in ROWS}
    seen_data: list[tuple[pathlib.Path, dict]] = []
    for run in sweep.runs_on_disk():
        workdir = sweep.workdir(run)
        result = sweep.finished(run)
        if result is None:
            print(
                f"{workdir}: not finished (newest checkpoint: step {sweep.last_checkpoint(run)}), "
                "left out of the table",
                file=sys.stderr,
            )
            continue
        seen_data.append((workdir / "results.json", data_identity(result["data"])))
        summary = table3_report.run_summary(result, perplexity_curve(workdir), cost(workdir))
        runs[run.row].append(summary)
    check_same_data(seen_data)
    rows = table3_report.aggregate(runs)
    findings = table3_report.judge_findings(rows)
    agreement = {
        "tokenized BLEU": table3_report.rank_agreement(rows, "dev_tokenized_bleu", "dev_bleu"),
        "perplexity": table3_report.rank_agreement(rows, "dev_perplexity", "dev_perplexity"),
    }
    scale = sweep.settings.scale
    title = f"Table 3 ({scale} scale) — tfm beside the paper"
    table = dict(
        scale=scale,
        config_file=CONFIG_FILES[scale],
        data_dir=sweep.settings.data_dir,
        overrides=list(sweep.settings.overrides),
        evaluation="validation split, beam 4, alpha 0.6, last checkpoint (no averaging)",
        regime=table3_report.regime(rows),
        rows=rows,
        findings=findings,
        spearman=agreement,
        hosts=sorted({s["host"] or "unknown" for v in runs.values() for s in v}),
        runs={row: summaries for row, summaries in runs.items() if summaries},
        # the sum of every run's own wall time of its last invocation (training, evaluation,
        # translation), and the CPU time the runs' ledgers measured (every invocation)
        run_wall_seconds=sum(s["wall_seconds"] or 0 for v in runs.values() for s in v),
        core_hours=table3_report.core_hours([s for v in runs.values() for s in v]),
    )
    (sweep.root / "table3.json").write_text(json.dumps(table, indent=1) + "\n")
    floors = [s["dev_copy_source_sacrebleu"] for v in runs.values() for s in v]
    floor = floors[0] if floors else None
    (sweep.root / "table3.md").write_text(
        table3_text.markdown(rows, findings, title, floor, agreement)
        + "\n"
        + table3_text.cost_line(table["core_hours"], table["hosts"])
        + "\n\n"
        + table3_text.cost_table(table["runs"])
    )
    table3_figure.figure(rows, sweep.root / "table3.png", title)
    return table


def _settings_from_manifest(root: pathlib.Path) -> Settings:
    manifest = root / "sweep.json"
    if not manifest.is_file():
        raise SweepError(f"{manifest} not found: {root} is not a sweep directory")
    found = json.loads(manifest.read_text())
    return Settings(found["scale"], found["data_dir"], tuple(found["overrides"]))


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfm.experiments",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("table3", help="run (or write a job array for) a Table 3 sweep")
    run.add_argument("--workdir", required=True)
    run.add_argument("--rows", default="all", help=f"all, or rows/groups of {', '.join(ROWS)}")
    run.add_argument("--seeds", type=int, default=1, help="seeds per row (base: --base_seeds)")
    run.add_argument("--base_seeds", type=int, default=3)
    run.add_argument("--scale", default="miniature", choices=sorted(CONFIG_FILES))
    run.add_argument("--data_dir", default="data", help="prepared data (shared by every run)")
    run.add_argument(
        "--parallel", type=int, default=1, help="runs at a time, each on its share of the cores"
    )
    run.add_argument("--slurm", action="store_true", help="write DIR/table3.sbatch, train nothing")
    run.add_argument("--sbatch_option", action="append", default=[], help="an #SBATCH line")
    run.add_argument(
        "--override", action="append", default=[], help="--config.KEY=VALUE for every run"
    )
    gather = commands.add_parser("collect", help="build the table from finished runs")
    gather.add_argument("--workdir", required=True)
    gather.add_argument(
        "--readme", action="store_true", help="print the README's compact form of the table"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "collect":
            root = pathlib.Path(args.workdir).resolve()
            sweep = Sweep(root, _settings_from_manifest(root), _repo())
            table = collect(sweep)
            if args.readme:
                print(table3_text.readme_summary(table), end="")
            else:
                print((sweep.root / "table3.md").read_text())
            return 0 if table["rows"] else 1
        # kept as given: a relative data dir is the checkout's, so a sweep committed on one
        # machine continues in another checkout
        settings = Settings(args.scale, args.data_dir, tuple(args.override))
        sweep = Sweep(args.workdir, settings, _repo())
        runs = plan(parse_rows(args.rows), args.seeds, args.base_seeds)
        sweep.check_config(runs[0])
        sweep.claim()
        if args.slurm:
            script = sweep.root / "table3.sbatch"
            script.write_text(slurm.job_array(sweep, runs, sys.executable, args.sbatch_option))
            print(f"wrote {script} ({len(runs)} tasks); submit it with sbatch", file=sys.stderr)
            return 0
        start = time.perf_counter()
        # kill (SIGTERM) stops the sweep as Ctrl-C does: each run saves a checkpoint and its
        # invocation's cost is recorded before the sweep exits
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            failed = sweep.run_locally(runs, args.parallel)
        except KeyboardInterrupt:
            print("sweep stopped: run the same command to continue it", file=sys.stderr)
            return 130
        print(
            f"sweep wall time this invocation: {(time.perf_counter() - start) / 60:.1f} min",
            file=sys.stderr,
        )
        collect(sweep)
        print((sweep.root / "table3.md").read_text())
        if failed:
            print(
                f"{len(failed)} run(s) failed: {', '.join(r.name for r in failed)}", file=sys.stderr
            )
            return 1
        return 0
    except SweepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
