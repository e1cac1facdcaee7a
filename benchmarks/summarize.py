"""The medians of several `compare.py` runs, as the README's performance table quotes them:
per workload and system, throughput (and MFU for training), peak resident memory, tfm's ratio to
each peer, and the goals with the runs that met them.

    python benchmarks/summarize.py benchmarks/results/compare-*.json [--json]

Each figure is the median over the runs of that run's own median (so a system's figure and its
ratio may come from different runs); min-max over runs in brackets.
"""

from __future__ import annotations

import argparse
import json
import statistics


def _spread(values: list[float], digits: int = 0) -> str:
    def fmt(v: float) -> str:
        return f"{v:,.{digits}f}"

    middle = statistics.median(values)
    if len(values) == 1:
        return fmt(middle)
    return f"{fmt(middle)} [{fmt(min(values))}-{fmt(max(values))}]"


def summarize(runs: list[dict]) -> dict:
    """workload -> system -> {figure: [value per run]}, plus ratios and goals per run."""
    table: dict = {}
    for run in runs:
        for name, workload in run["workloads"].items():
            entry = table.setdefault(name, {"systems": {}, "ratios": {}})
            for system, result in workload["systems"].items():
                figures = entry["systems"].setdefault(system, {})
                if name == "real_file_beam4":
                    figures.setdefault("sentences_per_second", []).append(
                        result["sentences_per_second"]
                    )
                    figures.setdefault("sacrebleu", []).append(result["sacrebleu"])
                    continue
                figures.setdefault("tokens_per_second", []).append(result["tokens_per_second"])
                if result.get("mfu") is not None:
                    figures.setdefault("mfu_percent", []).append(100 * result["mfu"])
                if result.get("peak_rss_mb") is not None:
                    figures.setdefault("peak_rss_mb", []).append(result["peak_rss_mb"])
            for other, ratio in workload.get("ratios_tfm_over", {}).items():
                entry["ratios"].setdefault(other, []).append(ratio)
            if name == "real_file_beam4":
                warm = workload["systems"]["tfm"]["median_seconds"]
                first = workload["tfm_first_run_seconds_with_compilation"]
                for system, result in workload["systems"].items():
                    if system != "tfm":
                        ratio = result["median_seconds"] / warm
                        entry["ratios"].setdefault(system, []).append(ratio)
                entry.setdefault("first_run_over_warm", []).append(first / warm)
                cached = workload.get("tfm_first_run_seconds_with_cache_from_a_previous_run")
                if cached is not None:  # runs before the cached first run was measured
                    entry.setdefault("first_run_with_cache_over_warm", []).append(cached / warm)
    return table


def goals(runs: list[dict]) -> dict[str, list]:
    """ "workload: what, goal" -> [(measured, met) per run that measured it], from each run's
    `goals` block (the goals of the code that ran it)."""
    met: dict[str, list] = {}
    for run in runs:
        for goal in run.get("goals", []):
            # the real-file ratios name themselves by a key holding the measured value again
            what = [
                k if isinstance(v, float) and k != "goal" else f"{k}={v}"
                for k, v in goal.items()
                if k not in ("workload", "measured", "met")
            ]
            key = f"{goal['workload']}: {', '.join(what)}"
            met.setdefault(key, []).append((goal["measured"], goal["met"]))
    return met


def goals_markdown(met: dict[str, list]) -> str:
    lines = ["| goal | measured, median [min-max over runs] | runs that met it |", "|---|---|---|"]
    for key, results in met.items():
        measured = _spread([m for m, _ in results], 2)
        lines.append(f"| {key} | {measured} | {sum(ok for _, ok in results)} of {len(results)} |")
    return "\n".join(lines)


def markdown(table: dict) -> str:
    lines = ["| workload | system | median [min-max over runs] | peak RSS MB | tfm / system |"]
    lines.append("|---|---|---|---|---|")
    for name, entry in table.items():
        for system, figures in entry["systems"].items():
            if "sentences_per_second" in figures:
                speed = _spread(figures["sentences_per_second"], 1) + " sentences/s"
            else:
                speed = _spread(figures["tokens_per_second"]) + " tok/s"
                if "mfu_percent" in figures:
                    speed += f", MFU {_spread(figures['mfu_percent'])}%"
            memory = _spread(figures["peak_rss_mb"]) if "peak_rss_mb" in figures else "-"
            ratio = entry["ratios"].get(system)
            ratio_text = _spread(ratio, 2) if ratio else "-"
            lines.append(f"| {name} | {system} | {speed} | {memory} | {ratio_text} |")
        if "first_run_over_warm" in entry:
            text = _spread(entry["first_run_over_warm"], 2)
            lines.append(f"| {name} | tfm first run / warm | {text} | - | - |")
        if "first_run_with_cache_over_warm" in entry:
            text = _spread(entry["first_run_with_cache_over_warm"], 2)
            lines.append(
                f"| {name} | tfm first run with a previous run's cache / warm | {text} | - | - |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="+", help="compare.py JSON files")
    parser.add_argument("--json", action="store_true", help="print the per-run values as JSON")
    args = parser.parse_args()
    runs = []
    for path in args.runs:
        with open(path) as handle:
            runs.append(json.load(handle))
    table = summarize(runs)
    if args.json:
        print(json.dumps(table, indent=1))
        return
    print(f"{len(runs)} runs: " + ", ".join(run["date"] for run in runs))
    print(markdown(table))
    print()
    print(goals_markdown(goals(runs)))


if __name__ == "__main__":
    main()
