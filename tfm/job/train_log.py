"""What the training loop records as it goes: per-step metrics to `metrics.jsonl` and
TensorBoard, the progress bar, and the target-token throughput, on process 0.

Step metrics stay on the device until a record is due: fetching them every step would make the
host wait for each step to finish and stall the dispatch of the next one. When they are fetched,
every buffered step is checked for a non-finite loss, so a diverged state is never checkpointed
or evaluated.
"""

from __future__ import annotations

import math
import pathlib
import sys
import time
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from tfm.job import metrics_file


class TrainingDiverged(RuntimeError):
    """The loss became NaN or Inf."""


class TrainLog:
    """Buffers step metrics, writes records, shows progress; `close()` when done."""

    def __init__(
        self, metrics_path: pathlib.Path, tensorboard_dir: pathlib.Path, start: int, total: int
    ):
        self.enabled = jax.process_index() == 0
        self.path = metrics_path
        self._pending: list[tuple[int, Any]] = []
        self._window_tokens = 0.0
        self._window_start = self._start = time.perf_counter()
        self.trained_tokens = 0.0
        self._tensorboard = None
        if self.enabled:
            metrics_file.drop_records_after(metrics_path, start)
            from tensorboardX import SummaryWriter

            self._tensorboard = SummaryWriter(str(tensorboard_dir))
        self._bar = tqdm(
            total=total,
            initial=start,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=not self.enabled,
            file=sys.stderr,
        )

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self._start

    def step_done(self, step: int, metrics) -> None:
        """Keep one step's metrics (device arrays, not yet fetched)."""
        self._pending.append((step, metrics))
        self._bar.update(1)

    def flush(self, learning_rate: float) -> None:
        """Fetch and check the buffered steps; write one record for the last of them with the
        throughput since the previous record. Raises TrainingDiverged on a non-finite loss."""
        if not self._pending:
            return
        records = _check_finite(jax.device_get(self._pending))
        step = self._pending[-1][0]
        self._pending = []
        now = time.perf_counter()
        tokens = sum(r["tokens"] for r in records)
        self._window_tokens += tokens
        self.trained_tokens += tokens
        rate = self._window_tokens / max(now - self._window_start, 1e-9)
        self._window_tokens, self._window_start = 0.0, now
        last = records[-1]
        self.write(
            dict(
                kind="train",
                step=step,
                loss=last["loss"],
                nll=last["nll"],
                learning_rate=learning_rate,
                target_tokens_per_second=rate,
                grad_norm=last["grad_norm"],
                time=now - self._start,
            )
        )
        self._bar.set_postfix(
            loss=f"{last['loss']:.3f}", lr=f"{learning_rate:.2e}", tok_s=f"{rate:,.0f}"
        )

    def evaluation(self, step: int, values: dict) -> None:
        self.write(dict(kind="eval", step=step, **values))
        line = (
            f"step {step}: validation loss {values['loss']:.3f}, "
            f"perplexity {values['perplexity']:.2f}"
        )
        if "sacrebleu" in values:
            beam = values["bleu_beam_size"]
            search = "greedy" if beam == 1 else f"beam {beam}"
            line += f", validation sacreBLEU {values['sacrebleu']:.2f} ({search})"
        self._bar.write(
            line,
            file=sys.stderr,
        )

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        metrics_file.append(self.path, record)
        prefix = record.get("kind", "train")
        for key, value in record.items():
            if isinstance(value, (int, float)) and key not in ("step", "time"):
                self._tensorboard.add_scalar(f"{prefix}/{key}", value, record["step"])
        self._tensorboard.flush()

    def close(self) -> None:
        self._bar.close()
        if self._tensorboard is not None:
            self._tensorboard.close()


def _check_finite(fetched: list[tuple[int, dict]]) -> list[dict]:
    records = []
    for step, values in fetched:
        record = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in values.items()}
        if not math.isfinite(record["loss"]):
            raise TrainingDiverged(
                f"loss is {record['loss']} at step {step}; stopping without saving it. The last "
                "good checkpoint is kept in the workdir: lower learning_rate_scale, set "
                "grad_clip_norm, or check the data, then run again"
            )
        records.append(record)
    return records
