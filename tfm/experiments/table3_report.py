"""Table 3 from finished runs: per-row dev perplexity, dev BLEU (sacreBLEU and the paper's
tokenized BLEU) and parameter count beside the paper's figures; the section 6.2 findings judged
against the base row's seed spread; the table as Markdown and as a figure."""

from __future__ import annotations

import dataclasses
import pathlib
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tfm.config import ModelConfig, table3  # noqa: E402
from tfm.params import count_parameters  # noqa: E402

# Table 3's columns: the model fields and recipe values a row may change.
COLUMNS = (
    ("N", "num_layers"),
    ("d_model", "d_model"),
    ("d_ff", "d_ff"),
    ("h", "num_heads"),
    ("d_k", "d_k"),
    ("d_v", "d_v"),
    ("P_drop", "dropout_rate"),
    ("eps_ls", "label_smoothing"),
    ("steps", "train_steps"),
    ("positions", "positional"),
)


def run_summary(result: dict, perplexity: float) -> dict:
    """One finished run's figures from its results.json and final validation perplexity."""
    model = dict(result["config"]["model"])
    vocab_size = result["data"]["vocab_size"]
    validation = result["validation"]
    return dict(
        seed=result["config"]["loop"]["seed"],
        dev_perplexity=perplexity,
        dev_sacrebleu=validation["sacrebleu"]["score"],
        dev_tokenized_bleu=validation["tokenized_bleu"]["score"],
        dev_copy_source_sacrebleu=validation["copy_source_sacrebleu"]["score"],
        sentences=validation["sentences"],
        params=count_parameters(ModelConfig(vocab_size=vocab_size, **model)),
        settings=dict(
            model,
            label_smoothing=result["config"]["train"]["label_smoothing"],
            train_steps=result["config"]["loop"]["num_train_steps"],
        ),
        train_seconds=result["training"].get("seconds"),
        wall_seconds=result.get("wall_seconds"),
    )


def _spread(values: list[float]) -> dict:
    return dict(
        mean=statistics.fmean(values),
        std=statistics.stdev(values) if len(values) > 1 else None,
        values=values,
    )


def aggregate(runs: dict[str, list[dict]]) -> list[dict]:
    """Per row (paper order): tfm's mean / seed std of each figure and the paper's values."""
    paper = table3()
    rows = []
    for name, summaries in runs.items():
        if not summaries:
            continue
        preset = paper[name]
        rows.append(
            dict(
                row=name,
                seeds=[s["seed"] for s in summaries],
                settings=summaries[0]["settings"],
                params_millions=summaries[0]["params"] / 1e6,
                dev_perplexity=_spread([s["dev_perplexity"] for s in summaries]),
                dev_sacrebleu=_spread([s["dev_sacrebleu"] for s in summaries]),
                dev_tokenized_bleu=_spread([s["dev_tokenized_bleu"] for s in summaries]),
                paper=dict(
                    params_millions=preset.paper_params_millions,
                    dev_perplexity=preset.paper_dev_ppl,
                    dev_bleu=preset.paper_dev_bleu,
                ),
            )
        )
    return rows


@dataclasses.dataclass(frozen=True)
class Finding:
    """One claim of section 6.2 as comparisons between rows: (row, other, metric, sign) holds
    when sign * (row - other) > 0 by more than twice the base row's seed std of `metric`."""

    claim: str
    comparisons: tuple[tuple[str, str, str, int], ...]
    # "similar": the claim is that there is NO difference (row E)
    kind: str = "differs"


FINDINGS = (
    Finding("single-head attention is worse than the base", (("A1", "base", "bleu", -1),)),
    Finding("too many heads also hurt", (("A32", "A16", "bleu", -1),)),
    Finding("reducing the key size d_k hurts", (("B16", "base", "bleu", -1),)),
    Finding(
        "bigger models are better",
        (
            ("C_N8", "C_N2", "bleu", 1),
            ("C_d1024", "C_d256", "bleu", 1),
            ("C_ff4096", "C_ff1024", "bleu", 1),
            ("big", "base", "bleu", 1),
        ),
    ),
    Finding("dropout helps against over-fitting", (("D_drop0.0", "base", "bleu", -1),)),
    Finding(
        "label smoothing hurts perplexity but helps BLEU",
        (("D_ls0.0", "base", "perplexity", -1), ("D_ls0.0", "base", "bleu", -1)),
    ),
    Finding(
        "learned positions are nearly identical to sinusoids",
        (("E", "base", "bleu", 0),),
        kind="similar",
    ),
)


def judge_findings(rows: list[dict], metric_key: str = "dev_tokenized_bleu") -> list[dict]:
    """Each finding: reproduced / not reproduced / not resolved at this scale, with the
    differences behind it. A difference counts only beyond twice the base row's seed std. BLEU
    is the paper's tokenized BLEU unless `metric_key` says otherwise."""
    by_row = {r["row"]: r for r in rows}
    base = by_row.get("base")
    keys = {"bleu": metric_key, "perplexity": "dev_perplexity"}
    verdicts = []
    for finding in FINDINGS:
        details, outcomes = [], []
        for row, other, metric, sign in finding.comparisons:
            std = base[keys[metric]]["std"] if base else None
            if row not in by_row or other not in by_row or std is None:
                outcomes.append("missing")
                details.append(f"{row} vs {other}: not run (or the base has < 2 seeds)")
                continue
            diff = by_row[row][keys[metric]]["mean"] - by_row[other][keys[metric]]["mean"]
            threshold = 2 * std
            if finding.kind == "similar":
                outcomes.append("yes" if abs(diff) <= threshold else "no")
            elif abs(diff) <= threshold:
                outcomes.append("unresolved")
            else:
                outcomes.append("yes" if diff * sign > 0 else "no")
            details.append(f"{row} - {other} {metric} {diff:+.2f} (2 x base std {threshold:.2f})")
        if "missing" in outcomes:
            verdict = "not run"
        elif all(o == "yes" for o in outcomes):
            verdict = "reproduced"
        elif "no" in outcomes:
            verdict = "not reproduced"
        elif "yes" in outcomes:
            verdict = "partly reproduced"
        else:
            verdict = "not resolved at this scale"
        verdicts.append(dict(claim=finding.claim, verdict=verdict, details=details))
    return verdicts


def _cell(spread: dict, digits: int) -> str:
    text = f"{spread['mean']:.{digits}f}"
    if spread["std"] is not None:
        text += f" ± {spread['std']:.{digits}f}"
    return text


def markdown(
    rows: list[dict], findings: list[dict], title: str, copy_floor: float | None = None
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
        "| row | " + " | ".join(head + figures + paper) + " |",
        "|" + "---|" * (1 + len(head) + len(figures) + len(paper)),
    ]
    for r in rows:
        cells = []
        for _, key in COLUMNS:
            value = r["settings"][key]
            same = base is not None and r["row"] != "base" and base[key] == value
            cells.append("" if same else str(value))
        cells += [
            _cell(r["dev_perplexity"], 2),
            _cell(r["dev_sacrebleu"], 2),
            _cell(r["dev_tokenized_bleu"], 2),
            f"{r['params_millions']:.2f}",
        ]
        p = r["paper"]
        cells += [str(p["dev_perplexity"]), str(p["dev_bleu"]), str(p["params_millions"])]
        lines.append(f"| {r['row']} | " + " | ".join(cells) + " |")
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
        "",
        "| finding (section 6.2) | at this scale | differences |",
        "|---|---|---|",
    ]
    for f in findings:
        lines.append(f"| {f['claim']} | {f['verdict']} | {'; '.join(f['details'])} |")
    return "\n".join(lines) + "\n"


def figure(rows: list[dict], output: pathlib.Path, title: str) -> None:
    """Each row's change from the base row in dev BLEU (tokenized, the paper's way) and dev PPL,
    in percent of the base's value so that the miniature and the paper share one scale: tfm
    (seed std as error bars, the base's ±2 std band shaded) beside the paper (crosses)."""
    by_row = {r["row"]: r for r in rows}
    if "base" not in by_row:
        return
    base = by_row["base"]
    names = [r["row"] for r in rows]
    fig, axes = plt.subplots(2, 1, figsize=(11, 6.5), dpi=120, sharex=True)
    panels = (
        ("dev_tokenized_bleu", "dev_bleu", "dev BLEU, % change vs base"),
        ("dev_perplexity", "dev_perplexity", "dev PPL, % change vs base"),
    )
    for ax, (key, paper_key, label) in zip(axes, panels, strict=True):
        # a base that scored 0 (an untrained smoke run) has no % change: nothing is drawn
        ours_base = base[key]["mean"] or float("nan")
        theirs_base = base["paper"][paper_key]
        ours = [100 * (by_row[n][key]["mean"] / ours_base - 1) for n in names]
        errors = [100 * (by_row[n][key]["std"] or 0.0) / ours_base for n in names]
        theirs = [100 * (by_row[n]["paper"][paper_key] / theirs_base - 1) for n in names]
        band = 200 * (base[key]["std"] or 0.0) / ours_base
        band = 0.0 if band != band else band  # NaN
        positions = range(len(names))
        ax.axhspan(-band, band, color="0.85", label="base ± 2 seed std (tfm)")
        ax.errorbar(positions, ours, yerr=errors, fmt="o", color="C0", label="tfm miniature")
        ax.plot(positions, theirs, "x", color="C3", markersize=8, label="paper")
        ax.axhline(0, color="0.4", lw=0.8)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    axes[0].set_title(title)
    axes[1].set_xticks(range(len(names)))
    axes[1].set_xticklabels(names, rotation=60, fontsize=8)
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)
