"""The Table 3 sweep (`python -m tfm.experiments`): the miniature rows against the paper's row
definitions, the Slurm job array, the sweep's refusal to mix settings, the section 6.2 verdicts,
and (slow) a real two-row sweep that a second invocation only reads back."""

import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests import bounded
from tests.e2e_corpus import write_corpus
from tfm.config import table3
from tfm.experiments import slurm, table3_report, table3_text
from tfm.experiments.__main__ import main as experiments_main
from tfm.experiments.ledger import cost
from tfm.experiments.sweep import Run, Settings, Sweep, SweepError, parse_rows, plan

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from configs import table3 as paper_config  # noqa: E402
from configs import table3_mini  # noqa: E402

# what a Table 3 row may change: model fields, label smoothing, training length
MODEL_FIELDS = (
    "num_layers",
    "d_model",
    "d_ff",
    "num_heads",
    "d_k",
    "d_v",
    "dropout_rate",
    "positional",
)


def _paper_values(preset) -> dict:
    values = {f: getattr(preset.model, f) for f in MODEL_FIELDS}
    return dict(values, label_smoothing=preset.label_smoothing, train_steps=preset.train_steps)


def _config_values(config) -> dict:
    values = {f: config.model[f] for f in MODEL_FIELDS}
    return dict(values, label_smoothing=config.label_smoothing, train_steps=config.num_train_steps)


def _changes(values: dict, base: dict) -> dict:
    return {k: v for k, v in values.items() if v != base[k]}


def _direction(value, base) -> object:
    return np.sign(value - base) if isinstance(value, (int, float)) else value


@pytest.mark.parametrize("row", list(table3()))
def test_each_miniature_row_changes_what_its_paper_row_changes(row):
    paper = table3()
    paper_base = _paper_values(paper["base"])
    paper_change = _changes(_paper_values(paper[row]), paper_base)
    mini_base = _config_values(table3_mini.get_config("base"))
    mini_change = _changes(_config_values(table3_mini.get_config(row)), mini_base)
    assert sorted(mini_change) == sorted(paper_change)
    for field, value in paper_change.items():
        if field in ("dropout_rate", "label_smoothing", "positional"):
            assert mini_change[field] == value, field  # the same value
        else:  # the same ratio to the base: heads, widths, layers, steps
            assert mini_change[field] / mini_base[field] == value / paper_base[field], field
    mini = table3_mini.get_config(row).model
    if row.startswith("A"):  # row A keeps h * d_k = d_model
        assert mini.num_heads * mini.d_k == mini.d_model == mini.num_heads * mini.d_v


def test_the_miniature_base_keeps_the_papers_proportions():
    base = table3_mini.get_config("base").model
    assert base.d_ff == 4 * base.d_model and base.d_k * base.num_heads == base.d_model


# Table 3 of the paper, typed from the paper (blank cells = the base's): N, d_model, d_ff, h,
# d_k, d_v, P_drop, eps_ls, train steps, positions
PAPER_TABLE3 = {
    "base": (6, 512, 2048, 8, 64, 64, 0.1, 0.1, 100_000, "sinusoidal"),
    "A1": (6, 512, 2048, 1, 512, 512, 0.1, 0.1, 100_000, "sinusoidal"),
    "A4": (6, 512, 2048, 4, 128, 128, 0.1, 0.1, 100_000, "sinusoidal"),
    "A16": (6, 512, 2048, 16, 32, 32, 0.1, 0.1, 100_000, "sinusoidal"),
    "A32": (6, 512, 2048, 32, 16, 16, 0.1, 0.1, 100_000, "sinusoidal"),
    "B16": (6, 512, 2048, 8, 16, 64, 0.1, 0.1, 100_000, "sinusoidal"),
    "B32": (6, 512, 2048, 8, 32, 64, 0.1, 0.1, 100_000, "sinusoidal"),
    "C_N2": (2, 512, 2048, 8, 64, 64, 0.1, 0.1, 100_000, "sinusoidal"),
    "C_N4": (4, 512, 2048, 8, 64, 64, 0.1, 0.1, 100_000, "sinusoidal"),
    "C_N8": (8, 512, 2048, 8, 64, 64, 0.1, 0.1, 100_000, "sinusoidal"),
    "C_d256": (6, 256, 2048, 8, 32, 32, 0.1, 0.1, 100_000, "sinusoidal"),
    "C_d1024": (6, 1024, 2048, 8, 128, 128, 0.1, 0.1, 100_000, "sinusoidal"),
    "C_ff1024": (6, 512, 1024, 8, 64, 64, 0.1, 0.1, 100_000, "sinusoidal"),
    "C_ff4096": (6, 512, 4096, 8, 64, 64, 0.1, 0.1, 100_000, "sinusoidal"),
    "D_drop0.0": (6, 512, 2048, 8, 64, 64, 0.0, 0.1, 100_000, "sinusoidal"),
    "D_drop0.2": (6, 512, 2048, 8, 64, 64, 0.2, 0.1, 100_000, "sinusoidal"),
    "D_ls0.0": (6, 512, 2048, 8, 64, 64, 0.1, 0.0, 100_000, "sinusoidal"),
    "D_ls0.2": (6, 512, 2048, 8, 64, 64, 0.1, 0.2, 100_000, "sinusoidal"),
    "E": (6, 512, 2048, 8, 64, 64, 0.1, 0.1, 100_000, "learned"),
    "big": (6, 1024, 4096, 16, 64, 64, 0.3, 0.1, 300_000, "sinusoidal"),
}


def test_paper_scale_rows_are_the_papers_rows():
    """configs/table3.py against Table 3 as printed in the paper (not against tfm.config)."""
    assert list(PAPER_TABLE3) == list(table3())
    for row, values in PAPER_TABLE3.items():
        config = paper_config.get_config(row)
        got = _config_values(config)
        assert (
            tuple(got[k] for k in (*MODEL_FIELDS[:7], "label_smoothing", "train_steps"))
            + (got["positional"],)
            == values
        ), row
        assert config.decode.split == "validation" and config.decode.average_last == 1


def test_rows_and_groups_parse_in_the_papers_order():
    assert parse_rows("E,A") == ["E", "A1", "A4", "A16", "A32"]
    assert parse_rows("C")[:3] == ["C_N2", "C_N4", "C_N8"]
    runs = plan(parse_rows("E,base"), seeds=1, base_seeds=3)
    assert [r.name for r in runs] == ["base-seed0", "base-seed1", "base-seed2", "E-seed0"]
    with pytest.raises(SweepError, match="unknown row or group 'F'"):
        parse_rows("A,F")
    with pytest.raises(SweepError, match="--rows names no row; the rows are base, A1"):
        plan(parse_rows(" , "), seeds=1, base_seeds=1)


def test_a_sweep_refuses_other_settings_naming_the_key(tmp_path):
    first = Settings("miniature", "data", ("--config.num_train_steps=10",))
    Sweep(tmp_path, first, ROOT).claim()
    Sweep(tmp_path, first, ROOT).claim()  # the same settings: continue
    other = Settings("miniature", "data", ("--config.num_train_steps=20",))
    with pytest.raises(SweepError, match="started with overrides=.*pick a new --workdir"):
        Sweep(tmp_path, other, ROOT).claim()
    with pytest.raises(SweepError, match="started with scale="):
        Sweep(tmp_path, Settings("paper", "data", first.overrides), ROOT).claim()
    with pytest.raises(SweepError, match="--config.KEY=VALUE"):
        Settings("miniature", "data", ("num_train_steps=5",))


def test_collect_names_each_unfinished_run_and_its_newest_checkpoint(tmp_path, capsys):
    Sweep(tmp_path, Settings("miniature", "data", ()), ROOT).claim()
    for step in ("1000", "1351", "tmp-1500"):  # a checkpoint being written is not one yet
        (tmp_path / "runs" / "big" / "seed0" / "checkpoints" / step).mkdir(parents=True)
    # no finished run: no rows, exit code 1
    assert experiments_main(["collect", "--workdir", str(tmp_path)]) == 1
    said = capsys.readouterr().err
    assert (
        f"{tmp_path / 'runs' / 'big' / 'seed0'}: not finished (newest checkpoint: step 1351), "
        "left out of the table"
    ) in said


@pytest.mark.parametrize(
    "override, said",
    [
        (
            "--config.num_train_step=5",
            '--config.num_train_step: no such key in the config (did you mean "num_train_steps"?)',
        ),
        (
            "--config.learning_rate_scale=-1",
            "config: learning_rate_scale must be a number > 0, got -1.0",
        ),
    ],
)
def test_a_sweep_refuses_a_bad_override_before_it_records_or_trains_anything(
    tmp_path, override, said
):
    """Were it not checked up front, every run would fail alike and sweep.json would record the
    typo, so the corrected command would be refused as another sweep."""
    refused = subprocess.run(
        [sys.executable, "-m", "tfm.experiments", "table3", "--workdir", str(tmp_path / "sweep"),
         "--rows=E", f"--override={override}"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        f"error: configs/table3_mini.py:E with the overrides given: {said}"
    )
    assert refused.stderr.count("\n") == 1 and not (tmp_path / "sweep").exists()


def test_the_job_array_is_valid_bash_and_runs_one_train_py_per_row_and_seed(tmp_path):
    sweep = Sweep(tmp_path / "sweep", Settings("paper", "/data/wmt"), ROOT)
    runs = plan(list(table3()), seeds=1, base_seeds=3)
    # a stand-in python that prints its arguments, so each task's command can be read back
    echo = tmp_path / "python"
    echo.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    echo.chmod(0o755)
    script = tmp_path / "table3.sbatch"
    script.write_text(slurm.job_array(sweep, runs, str(echo), ["--gres=gpu:8"]))
    assert subprocess.run(["bash", "-n", str(script)], timeout=60).returncode == 0
    text = script.read_text()
    assert f"#SBATCH --array=0-{len(runs) - 1}" in text and "#SBATCH --gres=gpu:8" in text
    for row in table3():
        assert f"configs/table3.py:{row} " in text
    for task, run in enumerate(runs):
        env = dict(os.environ, SLURM_ARRAY_TASK_ID=str(task))
        out = subprocess.run(
            ["bash", str(script)], capture_output=True, text=True, env=env, timeout=60
        )
        assert out.returncode == 0, out.stderr
        args = out.stdout.splitlines()
        assert args[0] == str(ROOT / "train.py")
        assert f"--config={ROOT / 'configs/table3.py'}:{run.row}" in args
        assert f"--workdir={sweep.workdir(run)}" in args
        assert f"--config.seed={run.seed}" in args and "--config.data_dir=/data/wmt" in args


def _row(name, bleu, ppl, curve=None, copy_floor=10.0):
    """An aggregated row as `table3_report.aggregate` makes it, from per-seed values."""

    def spread(values):
        return dict(
            mean=float(np.mean(values)),
            std=float(np.std(values, ddof=1)) if len(values) > 1 else None,
            values=list(values),
        )

    curve = curve or [[1000, 8.0], [3750, 5.0], [5000, 4.9]]
    return dict(
        row=name,
        dev_tokenized_bleu=spread(bleu),
        dev_sacrebleu=spread(bleu),
        dev_perplexity=spread(ppl),
        copy_floor=copy_floor,
        last_quarter_change=spread([table3_report.last_quarter_change(curve)] * len(bleu)),
        curve=curve,
        paper=dict(dev_bleu=None, dev_perplexity=None, params_millions=None),
    )


def test_findings_count_differences_beyond_twice_their_standard_error():
    # BLEU: the base's 3 seeds have variance 0.25, every other row's 2 seeds 0.08; pooled over
    # 2 + 6 x 1 degrees of freedom: sqrt((2 x 0.25 + 6 x 0.08) / 8) = 0.35, so a difference
    # from the base counts beyond 2 x 0.35 x sqrt(1/3 + 1/2) = 0.639, between two 2-seed rows
    # beyond 0.70. Perplexity: 0.04 and 0.02, pooled 0.158; beyond 0.289 from the base.
    def seeds(mean, half):
        return [mean - half, mean + half]

    rows = [
        _row("base", [19.5, 20.0, 20.5], [9.8, 10.0, 10.2]),
        _row("A1", seeds(18.9, 0.2), seeds(11.0, 0.1)),  # -1.1: worse, reproduced
        _row("A16", seeds(20.2, 0.2), seeds(10.0, 0.1)),
        _row("A32", seeds(19.6, 0.2), seeds(10.0, 0.1)),  # -0.6 vs A16: not resolved
        _row("B16", seeds(21.5, 0.2), seeds(9.0, 0.1)),  # +1.5: the opposite of the claim
        _row("D_ls0.0", seeds(19.8, 0.2), seeds(9.0, 0.1)),  # ppl -1.0 beyond; bleu -0.2 within
        _row("E", seeds(20.4, 0.2), seeds(10.0, 0.1)),  # +0.4 within: "nearly identical"
        _row("C_N2", seeds(20.0, 0.2), seeds(10.0, 0.1)),
    ]
    std, freedom = table3_report.pooled_std(rows, "dev_tokenized_bleu")
    assert freedom == 9 and std == pytest.approx(np.sqrt((2 * 0.25 + 7 * 0.08) / 9))
    rows = rows[:-1]  # C_N2 only checked the pooling; C_N8 has not run
    std, freedom = table3_report.pooled_std(rows, "dev_tokenized_bleu")
    assert freedom == 8 and std == pytest.approx(0.35)
    verdicts = {f["comparison"]: f for f in table3_report.judge_findings(rows)}
    assert verdicts["A1 - base"]["verdict"] == "reproduced"
    assert verdicts["A1 - base"]["metric"] == "dev_tokenized_bleu"
    assert verdicts["A1 - base"]["difference"] == pytest.approx(18.9 - 20.0)
    assert verdicts["A1 - base"]["two_standard_errors"] == pytest.approx(
        2 * 0.35 * np.sqrt(1 / 3 + 1 / 2)
    )
    assert verdicts["A32 - A16"]["verdict"] == "not resolved"
    assert verdicts["B16 - base"]["verdict"] == "not reproduced"
    claims = {f["claim"]: f["verdict"] for f in table3_report.judge_findings(rows)}
    assert claims["label smoothing hurts perplexity"] == "reproduced"
    assert claims["label smoothing helps BLEU"] == "not resolved"
    assert claims["learned positions are nearly identical to sinusoids"] == "reproduced"
    assert claims["deeper is better (N 8 against 2)"] == "not run"
    settings = {key: 1 for _, key in table3_report.COLUMNS}
    text = table3_text.markdown(
        [
            dict(r, seeds=r["dev_perplexity"]["values"], settings=settings, params_millions=1.0)
            for r in rows
        ],
        table3_report.judge_findings(rows),
        "t",
    )
    assert "| A1 - base | reproduced | tok. BLEU -1.10, 2 SE 0.64 |" in text
    assert "| C_N8 - C_N2 | not run | not run (or < 2 seeds) |" in text


def test_no_verdict_when_the_base_has_not_reached_the_regime():
    settled = [[1000, 8.0], [3750, 5.0], [5000, 4.8]]  # -4% over the last quarter
    learning = [[1000, 8.0], [3750, 6.0], [5000, 5.0]]  # -17%
    for curve, bleu, reached in (
        (settled, 26.0, True),
        (learning, 26.0, False),
        (settled, 22.0, False),
    ):
        rows = [
            _row("base", [bleu, bleu + 0.4], [4.8, 4.8], curve=curve, copy_floor=19.35),
            _row("A1", [bleu - 3, bleu - 3], [6.0, 6.0], curve=curve),
        ]
        assert table3_report.regime(rows)["reached"] is reached
        (verdict,) = [
            f for f in table3_report.judge_findings(rows) if f["comparison"] == "A1 - base"
        ]
        assert verdict["verdict"] == ("reproduced" if reached else "regime not reached")
        # the README's block says so too, and lists no finding as reproduced
        settings = {key: 1 for _, key in table3_report.COLUMNS}
        block = table3_text.readme_summary(
            dict(
                rows=[dict(r, seeds=[0, 1], settings=settings) for r in rows],
                regime=table3_report.regime(rows),
                findings=table3_report.judge_findings(rows),
                spearman={},
                core_hours=table3_report.core_hours([]),
                hosts=[],
            )
        )
        assert ("Regime reached (" in block) is reached
        assert ("Regime NOT reached (" in block) is not reached
        assert ("- **reproduced**: single-head attention" in block) is reached
        assert ("- **regime not reached**: single-head attention" in block) is not reached


def test_both_tables_show_only_the_settings_a_row_changes_from_the_base():
    """As the paper's Table 3: a row's cell is blank where it keeps the base's value; the README
    block names the changed settings only."""
    names = [name for name, _ in table3_report.COLUMNS]
    base_settings = {key: 10 + i for i, (_, key) in enumerate(table3_report.COLUMNS)}
    first_key = table3_report.COLUMNS[0][1]
    row_settings = dict(base_settings, **{first_key: 99})
    rows = [
        dict(
            _row("base", [20.0, 21.0], [5.0, 5.1]),
            seeds=[0, 1],
            settings=base_settings,
            params_millions=1.0,
        ),
        dict(
            _row("X", [19.0, 19.5], [5.5, 5.6]),
            seeds=[0, 1],
            settings=row_settings,
            params_millions=1.0,
        ),
    ]
    text = table3_text.markdown(rows, [], "t")
    header = next(line for line in text.splitlines() if line.startswith("| row |"))
    (x_line,) = [line for line in text.splitlines() if line.startswith("| X |")]
    (base_line,) = [line for line in text.splitlines() if line.startswith("| base |")]
    columns = [c.strip() for c in header.strip("|").split("|")]
    x_cells = dict(zip(columns, [c.strip() for c in x_line.strip("|").split("|")], strict=True))
    base_cells = dict(
        zip(columns, [c.strip() for c in base_line.strip("|").split("|")], strict=True)
    )
    assert x_cells[names[0]] == "99"
    assert all(x_cells[name] == "" for name in names[1:])
    assert [base_cells[name] for name in names] == [str(10 + i) for i in range(len(names))]
    block = table3_text.readme_summary(
        dict(
            rows=rows,
            regime=table3_report.regime(rows),
            findings=[],
            spearman={},
            core_hours=table3_report.core_hours([]),
            hosts=[],
        )
    )
    assert f"| X | {names[0]} 99 | 2 |" in block
    assert "| base | — | 2 |" in block


def test_spearman_is_the_rank_formula_and_its_interval_holds_it():
    ours, paper = [3.0, 1.0, 2.0, 5.0, 4.0], [30.0, 10.0, 40.0, 50.0, 20.0]
    ranks_ours, ranks_paper = [3, 1, 2, 5, 4], [3, 1, 4, 5, 2]
    d2 = sum((a - b) ** 2 for a, b in zip(ranks_ours, ranks_paper, strict=True))
    assert table3_report.spearman(ours, paper) == pytest.approx(1 - 6 * d2 / (5 * 24))
    assert table3_report.spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)  # ties
    rows = [
        dict(_row(f"r{i}", [v, v + 0.1], [1.0, 1.0]), paper=dict(dev_bleu=p, dev_perplexity=1.0))
        for i, (v, p) in enumerate(zip(ours, paper, strict=True))
    ]
    agreement = table3_report.rank_agreement(rows, "dev_tokenized_bleu", "dev_bleu", draws=500)
    assert agreement["spearman"] == pytest.approx(1 - 6 * d2 / (5 * 24))
    assert -1.0 <= agreement["low"] <= agreement["spearman"] <= agreement["high"] <= 1.0
    # two rows rank nothing: no figure, and the table says why
    two = table3_report.rank_agreement(rows[:2], "dev_tokenized_bleu", "dev_bleu")
    assert two == dict(spearman=None, low=None, high=None, rows=2)
    text = table3_text.markdown([], [], "t", agreement={"tokenized BLEU": two})
    assert "tokenized BLEU: not computed (2 row(s) with results; needs 3)" in text


@pytest.mark.slow
def test_a_child_s_cpu_time_is_what_it_spent_not_its_wall_time(tmp_path):
    """The ledger's CPU seconds come from os.wait4: a child that sleeps 1 s spends ~0 of them,
    one that spins 1 s spends ~1 (what a paused or crowded run would get wrong by wall time)."""
    from tfm.experiments.ledger import wait_any

    programs = {
        "sleeps": "import time; time.sleep(1.0)",
        "spins": "import time\nend = time.process_time() + 1\nwhile time.process_time() < end: 0",
    }
    spent = {}
    for name, program in programs.items():
        process = subprocess.Popen([sys.executable, "-c", program])
        key, usage = wait_any({name: process}, every_snapshot=lambda: None)
        assert key == name and process.returncode == 0
        spent[name] = usage.ru_utime + usage.ru_stime
    assert spent["sleeps"] < 0.5 and 0.9 < spent["spins"] < 2.0, spent


# A stand-in for train.py: writes its model card (data fingerprint $STAND_IN_FINGERPRINT) and
# "checkpoint" 5, then spins on the CPU until it is killed (or, with STAND_IN_EXITS set, exits).
STAND_IN_TRAIN_PY = """
import json, os, pathlib, sys, time
workdir = pathlib.Path(next(a for a in sys.argv if a.startswith("--workdir=")).split("=", 1)[1])
(workdir / "checkpoints" / "5").mkdir(parents=True, exist_ok=True)
fingerprint = os.environ.get("STAND_IN_FINGERPRINT")
card = dict(vocabulary="/data/vocab/v.model", dataset_fingerprint=fingerprint)
(workdir / "model.json").write_text(json.dumps(card))
while not os.environ.get("STAND_IN_EXITS"):
    time.process_time()
"""


def _stand_in_sweep(tmp_path, then: str) -> tuple[pathlib.Path, pathlib.Path, str]:
    """A sweep directory, a checkout whose train.py is STAND_IN_TRAIN_PY, and a program that
    builds the Sweep `s` (saving its cost snapshots every 0.3 s) and runs `then`."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text(STAND_IN_TRAIN_PY)
    root = tmp_path / "sweep"
    driver = (
        "import pathlib, sys\n"
        "from tfm.experiments import ledger, sweep\n"
        "ledger.SNAPSHOT_SECONDS = 0.3\n"
        f"s = sweep.Sweep({str(root)!r}, sweep.Settings('miniature', 'data'), "
        f"pathlib.Path({str(repo)!r}))\n"
    )
    return root, repo, driver + then


def test_a_sweep_killed_outright_is_charged_its_cpu_time_on_the_next_invocation(
    tmp_path, monkeypatch
):
    """SIGKILL (a session or machine going away) gives the sweep no chance to record a run's
    cost at its end; the half-minute snapshot it left is moved into the ledger next time."""
    root, repo, driver = _stand_in_sweep(tmp_path, "s.run_locally([sweep.Run('base', 0)])\n")
    pending = root / "runs" / "base" / "seed0" / "cost.pending.json"
    process = subprocess.Popen([sys.executable, "-c", driver], start_new_session=True)
    try:

        def charged_a_second() -> bool:
            return pending.is_file() and json.loads(pending.read_text())["cpu_seconds"] >= 1.0

        assert bounded.wait_for(charged_a_second, 120, process)
        # one sweep trains a sweep directory at a time: a second is refused, naming the first
        second = Sweep(root, Settings("miniature", "data"), repo)
        monkeypatch.setenv("STAND_IN_EXITS", "1")  # were it not refused, it would not hang
        with pytest.raises(SweepError, match=f"is being trained by process {process.pid}"):
            second.run_locally([Run("base", 0)])
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the driver and its train.py, no clean-up
        process.wait(timeout=60)
    snapshot = json.loads(pending.read_text())
    assert not (pending.parent / "cost.jsonl").exists()  # nothing recorded by the killed sweep

    env = dict(os.environ, STAND_IN_EXITS="1")
    subprocess.run([sys.executable, "-c", driver], env=env, check=True, timeout=120)
    ledger = [json.loads(line) for line in (pending.parent / "cost.jsonl").read_text().splitlines()]
    killed, exited = ledger
    assert killed["killed"] and killed["exit_code"] is None
    assert killed["cpu_seconds"] >= snapshot["cpu_seconds"] >= 1.0
    assert (killed["from_step"], killed["to_step"]) == (0, 5)
    assert exited["exit_code"] == 0 and exited["from_step"] == 5 and "killed" not in exited
    assert not pending.exists()
    assert cost(pending.parent)["cpu_seconds"] == killed["cpu_seconds"] + exited["cpu_seconds"]


def test_a_sweep_stops_a_run_that_prepared_other_data_than_the_finished_runs(tmp_path):
    """A sweep continued on a machine whose corpus differs is stopped at the first run's model
    card (written before its first step), not hours later when the table refuses the runs."""
    root, _, driver = _stand_in_sweep(
        tmp_path,
        "runs = [sweep.Run('base', 1)]\n"
        "try:\n"
        "    print([run.name for run in s.run_locally(runs)])\n"
        "except sweep.SweepError as error:\n"
        "    sys.exit(f'error: {error}')\n",
    )
    # a finished run of a row this invocation does not train (row E): the table holds it
    finished = root / "runs" / "E" / "seed0" / "results.json"
    finished.parent.mkdir(parents=True)
    finished.write_text(
        json.dumps(
            dict(
                config=dict(loop=dict(num_train_steps=6000)),
                training=dict(step=6000),
                validation={},
                data=dict(dataset_fingerprint="a" * 64, vocabulary="/elsewhere/vocab/v.model"),
            )
        )
    )

    def sweep_with(environment: dict) -> subprocess.CompletedProcess:
        process = subprocess.Popen(
            [sys.executable, "-c", driver],
            env=dict(os.environ, **environment),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:  # not stopped: kill the driver and its stand-in
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=60)
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    # the same data: the run goes on (the stand-in exits without results, so it failed)
    same = sweep_with(dict(STAND_IN_FINGERPRINT="a" * 64, STAND_IN_EXITS="1"))
    assert same.returncode == 0 and same.stdout.strip() == "['base-seed1']", same.stderr
    # other data: stopped (SIGTERM, so it saves a checkpoint) and charged, the sweep exits
    other = sweep_with(dict(STAND_IN_FINGERPRINT="b" * 64))
    card = root / "runs" / "base" / "seed1" / "model.json"
    assert other.returncode == 1 and other.stderr.splitlines()[-1] == (
        f"error: data.dataset_fingerprint differs between {finished} ('{'a' * 64}') and {card} "
        f"('{'b' * 64}'); the runs of one table must see the same data: retrain the odd ones on "
        "the others' (or start a new --workdir for new data)"
    )
    ledger = [json.loads(line) for line in (card.parent / "cost.jsonl").read_text().splitlines()]
    assert [entry["exit_code"] for entry in ledger] == [0, -signal.SIGTERM]


def test_core_hours_scale_partly_measured_runs_and_say_so():
    def summary(cpu, costed, by_host, steps=100):
        return dict(
            cpu_seconds=cpu,
            steps_costed=costed,
            cpu_seconds_by_host=by_host,
            settings=dict(train_steps=steps),
        )

    hours = table3_report.core_hours(
        [  # 1 h; 0.5 h of a 1 h run, resumed on another CPU halfway; none
            summary(3600, 100, {"Xeon A": 3600}),
            summary(1800, 50, {"Xeon A": 900, "EPYC": 900}),
            summary(None, None, {}),
        ]
    )
    assert hours == dict(
        measured=1.5,
        measured_by_host={"EPYC": 0.25, "Xeon A": 1.25},
        estimated_all_steps=2.0,
        runs=3,
        runs_without_ledger=1,
        runs_partly_measured=1,
    )
    line = table3_text.cost_line(hours, ["Xeon A", "Xeon B"])
    assert line.endswith(
        " Hosts: EPYC: 0.25 core-hours; Xeon A: 1.25 core-hours; Xeon B."
    )  # Xeon B: the host of a run without a ledger
    assert (
        "1.50 core-hours" in line and "~2.00" in line and "1 run(s) without a cost ledger" in line
    )


def test_the_cost_table_lists_each_run_by_host_in_core_hours():
    def summary(seed, cpu, costed, by_host):
        return dict(
            seed=seed,
            cpu_seconds=cpu,
            steps_costed=costed,
            cpu_seconds_by_host=by_host,
            settings=dict(train_steps=18000),
        )

    table = table3_text.cost_table(
        {
            "base": [summary(1, None, None, {}), summary(0, 9000, 18000, {"Xeon": 9000})],
            "big": [summary(0, 5400, 12000, {"Xeon": 1800, "EPYC": 3600})],
        }
    )
    assert table.splitlines()[2:] == [
        "| base seed 0 | 18,000 of 18,000 | 2.50 on Xeon |",
        "| base seed 1 | — | no cost ledger |",
        "| big seed 0 | 12,000 of 18,000 | 1.00 on EPYC; 0.50 on Xeon |",
    ]


def test_a_runs_cost_is_split_by_the_cpu_each_invocation_ran_on(tmp_path):
    entries = [
        dict(cpu_seconds=100.0, host="Xeon A", from_step=0, to_step=40),
        dict(cpu_seconds=250.5, host="EPYC", from_step=40, to_step=60),
        dict(cpu_seconds=10.0, host="Xeon A", from_step=60, to_step=60),
        dict(cpu_seconds=3.0, from_step=60, to_step=61),  # a ledger line without its host
    ]
    (tmp_path / "cost.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    assert cost(tmp_path) == dict(
        cpu_seconds=363.5,
        cpu_seconds_by_host={"Xeon A": 110.0, "EPYC": 250.5, "unknown host": 3.0},
        steps_covered=61,
    )


@pytest.mark.slow  # three train.py runs, two at a time, then two read-backs (~1.5 min)
def test_a_two_row_sweep_writes_the_table_and_a_second_run_trains_nothing(tmp_path):
    source, target = write_corpus(tmp_path / "corpus", pairs=800)
    args = [
        sys.executable,
        "-m",
        "tfm.experiments",
        "table3",
        "--workdir",
        str(tmp_path / "sweep"),
        "--rows",
        "base,E",
        "--base_seeds",
        "2",
        "--parallel",
        "2",
        "--data_dir",
        str(tmp_path / "data"),
        f"--override=--config.dataset=text:{source},{target}",
        "--override=--config.vocab_size=400",
        "--override=--config.max_seq_len=24",
        "--override=--config.batch_tokens=512",
        "--override=--config.num_train_steps=8",
        "--override=--config.eval_every_steps=4",
        "--override=--config.checkpoint_every_steps=4",
        "--override=--config.decode.extra_length=8",
    ]
    first = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    sweep = tmp_path / "sweep"
    table = json.loads((sweep / "table3.json").read_text())
    assert [r["row"] for r in table["rows"]] == ["base", "E"]
    base, learned = table["rows"]
    assert base["seeds"] == [0, 1] and learned["seeds"] == [0]
    assert learned["settings"]["positional"] == "learned" and learned["paper"]["dev_bleu"] == 25.7
    for row in table["rows"]:
        (seed0,) = [r for r in table["runs"][row["row"]] if r["seed"] == 0]
        results = json.loads((sweep / "runs" / row["row"] / "seed0" / "results.json").read_text())
        assert seed0["dev_sacrebleu"] == results["validation"]["sacrebleu"]["score"]
        assert results["validation"]["split"] == "validation"
        assert (
            results["validation"]["beam_size"] == 4
            and len(results["validation"]["averaged_steps"]) == 1
        )
    assert "| base | 2 |" in (sweep / "table3.md").read_text()  # its row, and its seeds
    # each run's ledger: one invocation from step 0 to its last, its CPU time counted
    for run in ("base/seed0", "base/seed1", "E/seed0"):
        (entry,) = [json.loads(x) for x in (sweep / "runs" / run / "cost.jsonl").open()]
        assert entry["from_step"] == 0 and entry["to_step"] == 8 and entry["exit_code"] == 0
        assert 0 < entry["cpu_seconds"] and entry["cores"] and entry["host"]
    assert table["core_hours"]["runs"] == 3 and table["core_hours"]["runs_without_ledger"] == 0
    assert "core-hours of CPU time measured over 3 runs" in (sweep / "table3.md").read_text()
    assert "| E seed 0 | 8 of 8 | " in (sweep / "table3.md").read_text()
    assert (sweep / "table3.png").stat().st_size > 10_000
    checkpoints = sorted(p.stat().st_mtime_ns for p in sweep.glob("runs/*/*/checkpoints/*"))

    again = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (
        again.stderr.count("finished, read back") == 3 and "training on cores" not in again.stderr
    )
    assert sorted(p.stat().st_mtime_ns for p in sweep.glob("runs/*/*/checkpoints/*")) == checkpoints
    assert json.loads((sweep / "table3.json").read_text())["rows"] == table["rows"]

    # `collect` rebuilds the table from the finished runs alone
    for name in ("table3.json", "table3.md", "table3.png"):
        (sweep / name).unlink()
    collected = subprocess.run(
        [sys.executable, "-m", "tfm.experiments", "collect", "--workdir", str(sweep)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert collected.returncode == 0, collected.stderr[-3000:]
    assert json.loads((sweep / "table3.json").read_text())["rows"] == table["rows"]
    assert (sweep / "table3.png").stat().st_size > 10_000

    # a run trained on other data (a sweep continued where the corpus differs) is refused
    other = sweep / "runs" / "E" / "seed0" / "results.json"
    results = json.loads(other.read_text())
    results["data"]["dataset_fingerprint"] = "0" * 64
    other.write_text(json.dumps(results))
    mixed = subprocess.run(
        [sys.executable, "-m", "tfm.experiments", "collect", "--workdir", str(sweep)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert mixed.returncode == 2
    first = sweep / "runs" / "E" / "seed0" / "results.json"  # sorted first: upper case
    second = sweep / "runs" / "base" / "seed0" / "results.json"
    assert mixed.stderr.startswith(
        f"error: data.dataset_fingerprint differs between {first} ('{'0' * 64}') and {second} ("
    )
    assert mixed.stderr.count("\n") == 1 and "runs of one table must see the same" in mixed.stderr


def test_the_slurm_command_writes_the_job_array_and_trains_nothing(tmp_path):
    args = [
        sys.executable, "-m", "tfm.experiments", "table3", "--workdir", str(tmp_path / "sweep"),
        "--scale=paper", "--rows=base,A", "--seeds=2", "--base_seeds=3", "--data_dir=/data/wmt",
        "--slurm", "--sbatch_option=--gres=gpu:8",
    ]  # fmt: skip
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    script = (tmp_path / "sweep" / "table3.sbatch").read_text()
    assert "#SBATCH --array=0-10" in script  # base x 3 + A1, A4, A16, A32 x 2
    assert "#SBATCH --gres=gpu:8" in script and "configs/table3.py:A32 " in script
    assert not (tmp_path / "sweep" / "runs").exists()


@pytest.mark.parametrize("big_steps, scale", [(6000, "linear"), (18000, "log")])
def test_learning_curves_of_rows_of_different_lengths_share_a_log_step_axis(big_steps, scale):
    from matplotlib.figure import Figure

    from tfm.experiments import table3_figure

    def curve(steps):
        return [[s, 4.0 + 1000.0 / s] for s in range(250, steps + 1, 250)]

    rows = [dict(row="base", curve=curve(6000)), dict(row="A1", curve=curve(6000))]
    rows.append(dict(row="big", curve=curve(big_steps)))
    ax = Figure().add_subplot()
    table3_figure.learning_curves(rows, ax)
    assert ax.get_xscale() == scale
    drawn = {line.get_label(): line for line in ax.get_lines()}
    assert list(drawn) == ["base", "A1", "big"]
    assert drawn["base"].get_color() == "black"
    assert drawn["A1"].get_color() != drawn["big"].get_color()
    assert list(drawn["big"].get_xdata())[-1] == big_steps
