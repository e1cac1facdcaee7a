"""benchmarks/ reporting: the FLOP formula of every MFU figure, summarize.py's medians and the
goals' verdicts. Pure Python over JSON and shapes: none of it needs the [bench] peers."""

import math
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers.workloads import Shape  # noqa: E402

TINY = Shape(vocab_size=64, num_layers=2, d_model=16, d_ff=32, num_heads=2)


def test_flop_formula_counts_every_matmul():
    from peers.workloads import forward_flops

    s, b, n, m = TINY, 2, 7, 6
    d, f, v, layers = s.d_model, s.d_ff, s.vocab_size, s.num_layers
    mm = lambda rows, k, cols: 2 * rows * k * cols  # noqa: E731
    encoder = mm(n, d, 3 * d) + 2 * mm(n, d, n) + mm(n, d, d) + mm(n, d, f) + mm(n, f, d)
    decoder = (
        mm(m, d, 3 * d)
        + 2 * mm(m, d, m)
        + mm(m, d, d)  # self-attention
        + mm(m, d, d)
        + mm(n, d, 2 * d)
        + 2 * mm(m, d, n)
        + mm(m, d, d)  # cross-attention
        + mm(m, d, f)
        + mm(m, f, d)
    )
    expected = b * (layers * (encoder + decoder) + mm(m, d, v))
    assert forward_flops(s, b, n, m) == expected
    assert math.isclose(forward_flops(s, 2 * b, n, m), 2 * expected)


def test_the_readme_medians_are_the_medians_of_the_runs():
    """summarize.py quotes, per figure, the median over runs of each run's median."""
    import summarize

    def run(tfm_seconds, torch_seconds, ct2_file_seconds, cached_first_run=None):
        systems = {
            "tfm": dict(tokens_per_second=100 / tfm_seconds, mfu=0.1 / tfm_seconds),
            "torch": dict(tokens_per_second=100 / torch_seconds, peak_rss_mb=torch_seconds),
        }
        real = {"tfm": 10.0, "ct2_float32": ct2_file_seconds}
        return dict(
            date="d",
            workloads=dict(
                train_small=dict(
                    systems=systems, ratios_tfm_over={"torch": torch_seconds / tfm_seconds}
                ),
                real_file_beam4=dict(
                    systems={
                        name: dict(median_seconds=s, sentences_per_second=50 / s, sacrebleu=30.0)
                        for name, s in real.items()
                    },
                    tfm_first_run_seconds_with_compilation=15.0,
                    **(
                        {}
                        if cached_first_run is None
                        else dict(
                            tfm_first_run_seconds_with_cache_from_a_previous_run=cached_first_run
                        )
                    ),
                ),
            ),
        )

    table = summarize.summarize(
        [run(1.0, 2.0, 5.0, 11.0), run(2.0, 2.0, 20.0, 13.0), run(4.0, 3.0, 10.0, 12.0)]
    )
    lines = summarize.markdown(table).splitlines()
    assert "| train_small | tfm | 50 [25-100] tok/s, MFU 5 [2-10]% | - | - |" in lines
    assert "| train_small | torch | 50 [33-50] tok/s | 2 [2-3] | 1.00 [0.75-2.00] |" in lines
    assert (
        "| real_file_beam4 | ct2_float32 | 5.0 [2.5-10.0] sentences/s | - | 1.00 [0.50-2.00] |"
        in lines
    )
    assert "| real_file_beam4 | tfm first run / warm | 1.50 [1.50-1.50] | - | - |" in lines
    assert (
        "| real_file_beam4 | tfm first run with a previous run's cache / warm "
        "| 1.20 [1.10-1.30] | - | - |" in lines
    )
    # runs from before the cached first run was measured still summarize
    older = summarize.markdown(summarize.summarize([run(1.0, 2.0, 5.0)])).splitlines()
    assert not any("previous run's cache" in line for line in older)


def test_the_goals_summary_counts_the_runs_that_met_each_goal():
    import summarize

    def run(speed_ratio, peak_ratio):  # "met" as compare.py decides it
        return dict(
            goals=[
                dict(
                    workload="train_base",
                    tfm_over="hf",
                    goal=1.1,
                    measured=speed_ratio,
                    met=speed_ratio >= 1.1,
                ),
                dict(
                    workload="train_base",
                    peak_rss_mb_tfm_over="torch",
                    goal="<= 1.0",
                    measured=peak_ratio,
                    met=peak_ratio <= 1.0,
                ),
            ]
        )

    runs = [run(1.0, 1.2), run(1.2, 0.9), run(1.15, 1.1)]
    lines = summarize.goals_markdown(summarize.goals(runs)).splitlines()
    assert "| train_base: tfm_over=hf, goal=1.1 | 1.15 [1.00-1.20] | 2 of 3 |" in lines
    assert (
        "| train_base: peak_rss_mb_tfm_over=torch, goal=<= 1.0 | 1.10 [0.90-1.20] | 1 of 3 |"
        in lines
    )


def test_a_run_is_judged_on_speed_ratios_and_peak_memory():
    import goals

    results = {
        "train_base": {
            "ratios_tfm_over": {"torch": 1.2, "hf": 1.05},
            "systems": {"tfm": {"peak_rss_mb": 1800.0}, "torch": {"peak_rss_mb": 1500.0}},
        }
    }
    judged = goals.judged(results, None)
    speed = [(g["tfm_over"], g["met"]) for g in judged if "tfm_over" in g]
    assert speed == [("torch", True), ("hf", False)]  # goal 1.1x each
    (memory,) = [g for g in judged if "peak_rss_mb_tfm_over" in g]
    assert memory["measured"] == 1.2 and not memory["met"]  # 1,800 / 1,500 MB
    assert len(judged) == 3  # nothing for the workloads the run did not measure


def test_goals_that_the_open_issue_did_not_set_say_which_issue_did():
    import goals

    results = {"beam4_small": {"ratios_tfm_over": {"ct2": 0.9, "hf": 2.5}}}
    judged = {g["tfm_over"]: g for g in goals.judged(results, None)}
    assert "set_in" not in judged["ct2"] and not judged["ct2"]["met"]  # round two: >= 1.0x
    assert judged["hf"]["set_in"] == "round one" and judged["hf"]["met"]  # >= 2.0x
