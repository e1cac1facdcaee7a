"""table3.png: each Table 3 row's change from the base beside the paper's, and each row's
validation perplexity curve, from the rows of `table3_report.aggregate`."""

from __future__ import annotations

import math
import pathlib

import matplotlib
import matplotlib.ticker
from matplotlib.figure import Figure  # not pyplot: no global backend or figure state


def figure(rows: list[dict], output: pathlib.Path, title: str) -> None:
    """Each row's change from the base row in dev BLEU (tokenized, the paper's way) and dev PPL,
    in percent of the base's value so that the miniature and the paper share one scale: tfm
    (seed std as error bars, the base's ±2 std band shaded) beside the paper (crosses); below,
    each row's validation perplexity curve."""
    by_row = {r["row"]: r for r in rows}
    if "base" not in by_row:
        return
    base = by_row["base"]
    names = [r["row"] for r in rows]
    fig = Figure(figsize=(11, 11), dpi=120)
    grid = fig.add_gridspec(3, 1, height_ratios=(1, 1, 1.4))
    top = fig.add_subplot(grid[0])
    axes = (top, fig.add_subplot(grid[1], sharex=top))
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
        band = 0.0 if math.isnan(band) else band  # the scored-0 base above: no band either
        positions = range(len(names))
        ax.axhspan(-band, band, color="0.85", label="base ± 2 seed std (tfm)")
        ax.errorbar(positions, ours, yerr=errors, fmt="o", color="C0", label="tfm miniature")
        ax.plot(positions, theirs, "x", color="C3", markersize=8, label="paper")
        ax.axhline(0, color="0.4", lw=0.8)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    axes[0].set_title(title)
    axes[0].tick_params(labelbottom=False)
    axes[1].set_xticks(range(len(names)))
    axes[1].set_xticklabels(names, rotation=60, fontsize=8)
    learning_curves(rows, fig.add_subplot(grid[2]))
    fig.tight_layout()
    fig.savefig(output)


def learning_curves(rows: list[dict], ax) -> None:
    """Each row's validation perplexity against training step (mean over its seeds), log
    scale, the base in black, one colour per group of rows (A, B, ...) and one line style per
    row within it: how far each row had settled when it stopped (the first sixth of training,
    where every row is still far off, runs off the top). Steps are on a log axis when rows
    trained for different lengths."""
    hues = matplotlib.colormaps["tab10"]
    hue_of: dict[str, int] = {}  # Table 3 group (A, B, ...) -> its colour, in order of first row
    drawn: dict[str, int] = {}  # Table 3 group -> rows of it drawn so far (picks the line style)
    styles = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
    shown = []  # perplexities after the first sixth of each run: the axis is set to show them
    for r in rows:
        if not r.get("curve"):
            continue
        steps, ppl = zip(*r["curve"], strict=True)
        shown += [p for step, p in r["curve"] if step >= steps[-1] / 6]
        base = r["row"] == "base"
        group = r["row"] if r["row"] in ("base", "big") else r["row"][0]
        hue_of.setdefault(group, len(hue_of))
        within = drawn.get(group, 0)
        drawn[group] = within + 1
        ax.plot(
            steps,
            ppl,
            color="black" if base else hues(hue_of[group] % 10),
            linestyle=styles[within % len(styles)],
            lw=2.2 if base else 1.1,
            label=r["row"],
        )
    ax.set_yscale("log")
    # plain numbers ("4", "6") on the log axis, not the default "4 x 10^0"
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    if shown:
        ax.set_ylim(min(shown) / 1.05, max(shown) * 1.05)
    lengths = {r["curve"][-1][0] for r in rows if r.get("curve")}
    if lengths and max(lengths) > 1.5 * min(lengths):
        # the big row trains 3x longer: on a linear axis the others would fill a third of it
        ax.set_xscale("log")
        ax.set_xlim(min(lengths) / 6, max(lengths) * 1.05)
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("training step (log scale)")
    else:
        ax.set_xlabel("training step")
    ax.set_ylabel("validation perplexity (per target piece)")
    ax.set_title("learning curves (mean over seeds)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(ncol=4, fontsize=7, loc="upper right")
