"""Table 3 from finished runs: per-row dev perplexity, dev BLEU (sacreBLEU and the paper's
tokenized BLEU) and parameter count beside the paper's figures; whether the base reached the
regime where verdicts mean something; the section 6.2 findings, each difference judged against
its standard error; the Spearman rank correlation with the paper's rows (as text:
`table3_text`; as a figure: `table3_figure`)."""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np

from tfm.config import ModelConfig, table3
from tfm.params import count_parameters

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


def run_summary(result: dict, curve: list[tuple[int, float]], cost: dict | None = None) -> dict:
    """One finished run's figures from its results.json, its validation perplexity curve
    `[(step, perplexity), ...]` (the last point is the run's final perplexity) and its cost
    ledger's totals (`ledger.cost`; None where the run has none)."""
    perplexity = curve[-1][1]
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
        host=result.get("host", {}).get("cpu"),
        cpu_seconds=None if cost is None else cost["cpu_seconds"],
        cpu_seconds_by_host={} if cost is None else cost["cpu_seconds_by_host"],
        steps_costed=None if cost is None else cost["steps_covered"],
        curve=[list(point) for point in curve],
    )


def core_hours(summaries: list[dict]) -> dict:
    """The sweep's cost in core-hours: what the runs' ledgers measured, and the whole sweep
    estimated by scaling each run's measured CPU time to all its steps (an approximation where
    a ledger covers only part of a run). `measured_by_host` splits the measured time by the CPU
    model each invocation ran on (runs resumed on another machine count on both)."""
    costed = [s for s in summaries if s["cpu_seconds"] is not None and s["steps_costed"]]
    measured = sum(s["cpu_seconds"] for s in costed) / 3600
    by_host: dict[str, float] = {}
    for summary in costed:
        for host, seconds in summary["cpu_seconds_by_host"].items():
            by_host[host] = by_host.get(host, 0.0) + seconds / 3600
    per_run = [s["cpu_seconds"] * s["settings"]["train_steps"] / s["steps_costed"] for s in costed]
    uncovered = [s for s in costed if s["steps_costed"] < s["settings"]["train_steps"]]
    return dict(
        measured=round(measured, 2),
        measured_by_host={host: round(hours, 2) for host, hours in sorted(by_host.items())},
        estimated_all_steps=round(sum(per_run) / 3600, 2),
        runs=len(summaries),
        runs_without_ledger=len(summaries) - len(costed),
        runs_partly_measured=len(uncovered),
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
                copy_floor=summaries[0]["dev_copy_source_sacrebleu"],
                last_quarter_change=_spread([last_quarter_change(s["curve"]) for s in summaries]),
                curve=mean_curve([s["curve"] for s in summaries]),
                paper=dict(
                    params_millions=preset.paper_params_millions,
                    dev_perplexity=preset.paper_dev_ppl,
                    dev_bleu=preset.paper_dev_bleu,
                ),
            )
        )
    return rows


def last_quarter_change(curve: list) -> float:
    """How much validation perplexity fell over the last quarter of training: 1 - ppl(T) /
    ppl(3T/4), the evaluation nearest 3T/4 standing for it."""
    final_step, final = curve[-1]
    quarter = min(curve, key=lambda point: abs(point[0] - 0.75 * final_step))
    return 1.0 - final / quarter[1]


def mean_curve(curves: list[list]) -> list[list[float]]:
    """The seeds' validation perplexity averaged step by step (steps all seeds evaluated)."""
    steps = sorted(set.intersection(*(set(step for step, _ in c) for c in curves)))
    by_step = [dict((step, ppl) for step, ppl in c) for c in curves]
    return [[step, statistics.fmean(c[step] for c in by_step)] for step in steps]


# The regime where Table 3's verdicts mean something (issue: a base that learned, and settled)
REGIME_BLEU_ABOVE_COPY = 5.0
REGIME_LAST_QUARTER_CHANGE = 0.10


def regime(rows: list[dict]) -> dict:
    """Whether the base row reached the regime: its dev sacreBLEU at least 5 above copying the
    source, and its dev perplexity changing by less than 10% over the last quarter of training
    (mean over seeds)."""
    base = next((r for r in rows if r["row"] == "base"), None)
    if base is None:
        return dict(reached=False, why="the base row has not run")
    seeds = len(base["dev_sacrebleu"]["values"])
    above = base["dev_sacrebleu"]["mean"] - base["copy_floor"]
    change = base["last_quarter_change"]["mean"]
    reached = above >= REGIME_BLEU_ABOVE_COPY and abs(change) < REGIME_LAST_QUARTER_CHANGE
    return dict(
        reached=reached,
        bleu_above_copy=above,
        last_quarter_change=change,
        base_seeds=seeds,
        why=(
            f"mean of {seeds} base seed(s): dev sacreBLEU {above:+.2f} over copying the source "
            f"(needs >= "
            f"{REGIME_BLEU_ABOVE_COPY:g}); dev perplexity changed {100 * change:.1f}% over the "
            f"last quarter of training (needs < {100 * REGIME_LAST_QUARTER_CHANGE:g}%)"
        ),
    )


def pooled_std(rows: list[dict], key: str) -> tuple[float | None, int]:
    """The seed standard deviation pooled over every row with 2+ seeds, sqrt(sum (n_i - 1)
    s_i^2 / sum (n_i - 1)), and its degrees of freedom."""
    spreads = [r[key] for r in rows if len(r[key]["values"]) > 1]
    freedom = sum(len(s["values"]) - 1 for s in spreads)
    if not freedom:
        return None, 0
    variance = sum((len(s["values"]) - 1) * s["std"] ** 2 for s in spreads) / freedom
    return math.sqrt(variance), freedom


@dataclasses.dataclass(frozen=True)
class Finding:
    """One comparison behind a claim of section 6.2: `sign * (row - other)` of `metric` (dev
    BLEU or perplexity) should be positive (kind "differs"), or within its noise ("similar")."""

    claim: str
    row: str
    other: str
    metric: str
    sign: int
    kind: str = "differs"


# the paper's sentences split where they bundle several comparisons
FINDINGS = (
    Finding("single-head attention is worse than the base", "A1", "base", "bleu", -1),
    Finding("too many heads also hurt (32 against 16)", "A32", "A16", "bleu", -1),
    Finding("reducing the key size d_k hurts", "B16", "base", "bleu", -1),
    Finding("deeper is better (N 8 against 2)", "C_N8", "C_N2", "bleu", 1),
    Finding("a wider model is better (d_model 1024 against 256)", "C_d1024", "C_d256", "bleu", 1),
    Finding("a wider FFN is better (d_ff 4096 against 1024)", "C_ff4096", "C_ff1024", "bleu", 1),
    Finding("the big model is better than the base", "big", "base", "bleu", 1),
    Finding("dropout helps against over-fitting", "D_drop0.0", "base", "bleu", -1),
    Finding("label smoothing hurts perplexity", "D_ls0.0", "base", "perplexity", -1),
    Finding("label smoothing helps BLEU", "D_ls0.0", "base", "bleu", -1),
    Finding(
        "learned positions are nearly identical to sinusoids", "E", "base", "bleu", 0, "similar"
    ),
)


def judge_findings(rows: list[dict], metric_key: str = "dev_tokenized_bleu") -> list[dict]:
    """Each comparison: reproduced / not reproduced / not resolved, or "regime not reached"
    for all of them when the base did not reach the regime (`regime`). A difference counts when
    it exceeds twice its standard error, pooled seed std x sqrt(1/n1 + 1/n2). BLEU is the
    paper's tokenized BLEU unless `metric_key` says otherwise."""
    by_row = {r["row"]: r for r in rows}
    keys = {"bleu": metric_key, "perplexity": "dev_perplexity"}
    reached = regime(rows)["reached"]
    verdicts = []
    for finding in FINDINGS:
        key = keys[finding.metric]
        std, _ = pooled_std(rows, key)
        verdict = dict(claim=finding.claim, comparison=f"{finding.row} - {finding.other}")
        if finding.row not in by_row or finding.other not in by_row or std is None:
            verdicts.append(dict(verdict, verdict="not run"))
            continue
        ours, theirs = by_row[finding.row][key], by_row[finding.other][key]
        diff = ours["mean"] - theirs["mean"]
        error = std * math.sqrt(1 / len(ours["values"]) + 1 / len(theirs["values"]))
        if not reached:
            outcome = "regime not reached"
        elif finding.kind == "similar":
            outcome = "reproduced" if abs(diff) <= 2 * error else "not reproduced"
        elif abs(diff) <= 2 * error:
            outcome = "not resolved"
        else:
            outcome = "reproduced" if diff * finding.sign > 0 else "not reproduced"
        verdicts.append(
            dict(
                verdict,
                verdict=outcome,
                metric=key,
                difference=diff,
                two_standard_errors=2 * error,
            )
        )
    return verdicts


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their average rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a, b) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = math.sqrt(float((ra**2).sum() * (rb**2).sum()))
    return float((ra * rb).sum() / denominator) if denominator else float("nan")


# fewer rows than this have no rank correlation worth printing
MIN_RANKED_ROWS = 3


def rank_agreement(
    rows: list[dict], key: str, paper_key: str, draws: int = 2000, seed: int = 0
) -> dict:
    """Spearman correlation between tfm's rows and the paper's on one figure, with a 95%
    percentile bootstrap interval: each draw resamples the rows, and each row's seeds, with
    replacement. None for all three below MIN_RANKED_ROWS rows."""
    usable = [r for r in rows if r["paper"][paper_key] is not None]
    if len(usable) < MIN_RANKED_ROWS:
        return dict(spearman=None, low=None, high=None, rows=len(usable))
    ours = [r[key]["values"] for r in usable]
    paper = np.array([r["paper"][paper_key] for r in usable], float)
    estimate = spearman([np.mean(v) for v in ours], paper)
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(draws):
        pick = rng.integers(0, len(usable), len(usable))
        if len(set(paper[pick])) < 2:
            continue
        means = [np.mean(rng.choice(ours[i], len(ours[i]))) for i in pick]
        value = spearman(means, paper[pick])
        if not math.isnan(value):
            samples.append(value)
    low, high = np.percentile(samples, [2.5, 97.5]) if samples else (float("nan"),) * 2
    return dict(spearman=estimate, low=float(low), high=float(high), rows=len(usable))
