"""Table 3 as text: table3.md's full table (laid out like the paper's) and the README's compact
block, both from the figures `table3_report` computes."""

from __future__ import annotations

from tfm.experiments.table3_report import COLUMNS, MIN_RANKED_ROWS, regime


def cost_line(hours: dict, hosts: list[str] = ()) -> str:
    """The sweep's cost as table3.md states it, and the CPUs the runs trained on, each with the
    core-hours measured on it (a core-hour buys different amounts of training on each)."""
    line = (
        f"Cost: {hours['measured']:.2f} core-hours of CPU time measured over {hours['runs']} "
        f"runs; ~{hours['estimated_all_steps']:.2f} core-hours with every step counted"
    )
    gaps = []
    if hours["runs_partly_measured"]:
        gaps.append(f"{hours['runs_partly_measured']} run(s) scaled up from part of their steps")
    if hours["runs_without_ledger"]:
        gaps.append(f"{hours['runs_without_ledger']} run(s) without a cost ledger, not counted")
    line += f" ({'; '.join(gaps)})." if gaps else "."
    by_host = hours.get("measured_by_host", {})
    named = [
        f"{host}: {by_host[host]:.2f} core-hours" if host in by_host else host
        for host in sorted({*hosts, *by_host})
    ]
    return line + (f" Hosts: {'; '.join(named)}." if named else "")


def cost_table(runs: dict[str, list[dict]]) -> str:
    """Each run's measured cost: the steps its ledger covers and the core-hours it spent on each
    CPU model (a run resumed on another machine lists both), in the table's row order."""
    lines = [
        "| run | steps measured | core-hours measured (by host CPU) |",
        "|---|---|---|",
    ]
    for row, summaries in runs.items():
        for s in sorted(summaries, key=lambda s: s["seed"]):
            if s["cpu_seconds"] is None:
                spent, steps = "no cost ledger", "—"
            else:
                spent = "; ".join(
                    f"{seconds / 3600:.2f} on {host}"
                    for host, seconds in sorted(s["cpu_seconds_by_host"].items())
                )
                steps = f"{s['steps_costed']:,} of {s['settings']['train_steps']:,}"
            lines.append(f"| {row} seed {s['seed']} | {steps} | {spent} |")
    return "\n".join(lines) + "\n"


METRIC_NAMES = {
    "dev_tokenized_bleu": "tok. BLEU",
    "dev_sacrebleu": "sacreBLEU",
    "dev_perplexity": "PPL",
}


def _measured(finding: dict) -> str:
    """A judged finding's difference beside its two standard errors (`judge_findings`)."""
    return (
        f"{METRIC_NAMES[finding['metric']]} {finding['difference']:+.2f}, "
        f"2 SE {finding['two_standard_errors']:.2f}"
    )


def _changed_keys(settings: dict, base: dict) -> set[str]:
    """The Table 3 columns where a row departs from the base (the paper leaves the rest blank)."""
    return {key for _, key in COLUMNS if settings[key] != base[key]}


def _cell(spread: dict, digits: int) -> str:
    text = f"{spread['mean']:.{digits}f}"
    if spread["std"] is not None:
        text += f" ± {spread['std']:.{digits}f}"
    return text


def markdown(
    rows: list[dict],
    findings: list[dict],
    title: str,
    copy_floor: float | None = None,
    agreement: dict | None = None,
) -> str:
    """The table laid out like the paper's Table 3: settings (blank = as in base), then tfm's
    dev PPL / BLEU / params beside the paper's."""
    base = next((r["settings"] for r in rows if r["row"] == "base"), None)
    head = [name for name, _ in COLUMNS]
    figures = ["PPL (dev)", "sacreBLEU (dev)", "tok. BLEU (dev)", "params ×10⁶"]
    paper = ["paper PPL", "paper BLEU", "paper params ×10⁶"]
    lines = [
        f"### {title}",
        "",
        "| row | seeds | " + " | ".join(head + figures + paper) + " |",
        "|" + "---|" * (2 + len(head) + len(figures) + len(paper)),
    ]
    for r in rows:
        shown = (
            {key for _, key in COLUMNS}
            if base is None or r["row"] == "base"
            else _changed_keys(r["settings"], base)
        )
        cells = [str(r["settings"][key]) if key in shown else "" for _, key in COLUMNS]
        cells += [
            _cell(r["dev_perplexity"], 2),
            _cell(r["dev_sacrebleu"], 2),
            _cell(r["dev_tokenized_bleu"], 2),
            f"{r['params_millions']:.2f}",
        ]
        p = r["paper"]
        cells += [str(p["dev_perplexity"]), str(p["dev_bleu"]), str(p["params_millions"])]
        lines.append(f"| {r['row']} | {len(r['seeds'])} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Means over seeds, ± their standard deviation where a row ran with several seeds. PPL is "
        "per target piece on the validation split; BLEU on the validation split, beam 4, alpha "
        "0.6, the last checkpoint (no averaging), as the paper's Table 3; tokenized BLEU is the "
        "paper's way (Moses tokens, compounds split) and decides the findings below."
        + (
            ""
            if copy_floor is None
            else f" Copying the source unchanged scores {copy_floor:.2f} sacreBLEU on this split."
        ),
    ]
    state = regime(rows)
    lines += [
        "",
        f"Regime: {'reached' if state['reached'] else 'NOT reached'} ({state['why']}).",
    ]
    for name, figure_agreement in (agreement or {}).items():
        if figure_agreement["spearman"] is None:
            lines.append(
                f"Spearman rank correlation with the paper's rows, {name}: not computed "
                f"({figure_agreement['rows']} row(s) with results; needs {MIN_RANKED_ROWS})."
            )
            continue
        lines.append(
            f"Spearman rank correlation with the paper's rows, {name}: "
            f"{figure_agreement['spearman']:+.2f} (95% bootstrap interval "
            f"{figure_agreement['low']:+.2f} to {figure_agreement['high']:+.2f}, "
            f"{figure_agreement['rows']} rows)."
        )
    lines += [
        "",
        "| finding (section 6.2) | comparison | at this scale | difference (2 standard errors) |",
        "|---|---|---|---|",
    ]
    for f in findings:
        measured = _measured(f) if "difference" in f else "not run (or < 2 seeds)"
        lines.append(f"| {f['claim']} | {f['comparison']} | {f['verdict']} | {measured} |")
    lines += [
        "",
        "A difference counts when it exceeds twice its standard error: the seed standard "
        "deviation pooled over every row with several seeds, times sqrt(1/n1 + 1/n2). No verdict "
        "is given when the base did not reach the regime.",
    ]
    return "\n".join(lines) + "\n"


def _changes(settings: dict, base: dict) -> str:
    """A row's settings where they differ from the base's, as Table 3 prints them."""
    changed = _changed_keys(settings, base)
    return ", ".join(f"{name} {settings[key]}" for name, key in COLUMNS if key in changed)


VERDICT_ORDER = ("reproduced", "not reproduced", "not resolved", "regime not reached", "not run")


def readme_summary(table: dict) -> str:
    """The README's compact form of a collected table (`table3.json`): each row's change from
    the base with its dev tokenized BLEU and perplexity beside the paper's, the findings grouped
    by verdict, the Spearman figures and the cost (`tests/test_readme.py` holds the README to
    it)."""
    rows = table["rows"]
    base = next((r["settings"] for r in rows if r["row"] == "base"), None)
    lines = [
        "| row | change from the base | seeds | tok. BLEU (dev) | PPL (dev) | paper BLEU "
        "| paper PPL |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        change = "—" if base is None or r["row"] == "base" else _changes(r["settings"], base)
        lines.append(
            f"| {r['row']} | {change} | {len(r['seeds'])} | {_cell(r['dev_tokenized_bleu'], 2)} "
            f"| {_cell(r['dev_perplexity'], 2)} | {r['paper']['dev_bleu']} "
            f"| {r['paper']['dev_perplexity']} |"
        )
    state = table["regime"]
    lines += ["", f"Regime {'reached' if state['reached'] else 'NOT reached'} ({state['why']})."]
    grouped: dict[str, list[str]] = {v: [] for v in VERDICT_ORDER}
    for f in table["findings"]:
        measured = (
            f" ({f['comparison']}: {_measured(f)})"
            if "difference" in f
            else f" ({f['comparison']})"
        )
        grouped.setdefault(f["verdict"], []).append(f["claim"] + measured)
    lines.append("")
    lines += [f"- **{v}**: {'; '.join(claims)}." for v, claims in grouped.items() if claims]
    agreement = [
        f"{name} {a['spearman']:+.2f} (95% bootstrap interval {a['low']:+.2f} to {a['high']:+.2f})"
        for name, a in table["spearman"].items()
        if a["spearman"] is not None
    ]
    if agreement:
        ranked = max(a["rows"] for a in table["spearman"].values())
        lines += [
            "",
            f"Spearman rank correlation with the paper over {ranked} rows: "
            + "; ".join(agreement)
            + ".",
        ]
    lines += ["", cost_line(table["core_hours"], table["hosts"])]
    return "\n".join(lines) + "\n"
