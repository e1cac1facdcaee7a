"""The training job that train.py runs: build everything from a `JobConfig` (`tfm.job.config`),
train with resumption (step -> log -> evaluate -> checkpoint), then translate and score the test
split.

The pure pieces live elsewhere: the loss, schedule and steps in `tfm.training`, their compiled
mesh/pmap forms in `tfm.job.steps`, the records in `tfm.job.train_log`, the workdir's files in
`tfm.job.workdir`, translation and BLEU in `tfm.inference.translate`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import pathlib
import signal
import sys
import time

import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm import tqdm

from tfm import metrics, training, viz
from tfm.cpu_host import host_memory
from tfm.data.pipeline import BatchPipeline
from tfm.data.prepare import PreparedData, prepare
from tfm.inference import translate
from tfm.job import checkpoint as ckpt
from tfm.job import host, parallel, steps
from tfm.job.config import JobConfig
from tfm.job.train_log import TrainingDiverged, TrainLog
from tfm.job.workdir import ModelCard, Workdir, check_resume, exclusive, write_model_card
from tfm.job.workdir import start_over as move_previous_run_aside
from tfm.model import Transformer

__all__ = ["Job", "TrainingDiverged", "build_job", "format_report", "train", "train_and_evaluate"]


@dataclasses.dataclass
class Job:
    """Everything built from the config before the first step."""

    config: JobConfig
    workdir: Workdir
    data: PreparedData
    model: Transformer
    pipeline: BatchPipeline
    eval_pipeline: BatchPipeline
    steps: steps.MeshSteps | steps.PmapSteps


def build_job(config: JobConfig, workdir: str | pathlib.Path) -> Job:
    """Prepare the data (built once, cached in the data dir), the model, the device mesh or pmap,
    the batch pipelines; check that the workdir holds this run (or none), then write the model
    card."""
    workdir = Workdir(workdir)
    data = prepare(
        config.spec, config.data_dir, config.vocab_size, encoding_errors=config.encoding_errors
    )
    model = Transformer(config.model_config(data.tokenizer.vocab_size), kernels=config.kernels)
    optimizer = training.make_optimizer(config.train, model.config.d_model)
    tensor = config.parallelism == "tensor"
    mesh = parallel.make_mesh(config.model_parallel if tensor else 1)
    compiled = steps.make_steps(
        model,
        optimizer,
        config.train.label_smoothing,
        config.parallelism,
        mesh,
        config.grad_accum_steps,
    )
    rows = math.lcm(mesh.shape["data"] * config.grad_accum_steps, jax.process_count())
    batches = dataclasses.replace(config.batches, row_multiple=rows)
    shard = (jax.process_index(), jax.process_count())
    pipeline = BatchPipeline(data.ids["train"], batches, *shard)
    eval_batches = dataclasses.replace(batches, shuffle=False)
    eval_pipeline = BatchPipeline(data.ids["validation"], eval_batches, *shard)
    card = ModelCard(
        model=model.config,
        vocabulary=str(data.tokenizer.path.absolute()),
        dataset=data.spec.name,
        source_language=data.spec.source_language,
        target_language=data.spec.target_language,
        dataset_fingerprint=data.dataset_fingerprint,
        vocabulary_fingerprint=data.tokenizer.fingerprint,
        settings=resumable_settings(config),
    )
    changed = check_resume(workdir, card)  # raises before anything is written
    if changed and jax.process_index() == 0:
        print(f"Resuming with changed settings (allowed): {'; '.join(changed)}", file=sys.stderr)
    if jax.process_index() == 0:
        write_model_card(workdir, card)
    return Job(config, workdir, data, model, pipeline, eval_pipeline, compiled)


def resumable_settings(config: JobConfig) -> dict:
    """The settings a resumed run may change (recorded in the model card, compared on resume)."""
    loop = dataclasses.asdict(config.loop)
    return dict(
        loop,
        parallelism=config.parallelism,
        model_parallel=config.model_parallel,
        processes=jax.process_count(),
        devices=jax.device_count(),
        batch_tokens=config.batches.batch_tokens,
        grad_accum_steps=config.grad_accum_steps,
        learning_rate_scale=config.train.learning_rate_scale,
    )


def due(step: int, every: int, total: int) -> bool:
    """Whether something done every `every` steps (and at the last step) is due at `step`."""
    return step % every == 0 or step == total


class _StopSignal:
    """SIGTERM / SIGINT set a flag; the loop saves a checkpoint and exits cleanly."""

    def __init__(self):
        self.received: int | None = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        del frame
        self.received = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def validation_loss(job: Job, state) -> dict[str, float]:
    """Per-token label-smoothed loss, NLL and perplexity on the validation split (the first
    `eval_batches` batches, or all)."""
    totals = dict(loss=0.0, nll=0.0, tokens=0.0)
    plan = job.eval_pipeline.plan(0)
    if job.config.loop.eval_batches:
        plan = plan[: job.config.loop.eval_batches]
    for rows in plan:
        sums = job.steps.eval_sums(state, job.eval_pipeline.local_batch(rows))
        for key in totals:
            totals[key] += sums[key]
    tokens = max(totals["tokens"], 1.0)
    return dict(
        loss=totals["loss"] / tokens,
        nll=totals["nll"] / tokens,
        perplexity=metrics.perplexity(totals["nll"], tokens),
        tokens=totals["tokens"],
    )


def validation_bleu(job: Job, state) -> dict[str, float]:
    """sacreBLEU of translating the whole validation split with the current parameters (beam
    `eval_bleu_beam_size`, 1 = greedy), as t2t / fairseq report it while training. Every process
    translates the same sentences, so no collective is needed beyond gathering the parameters."""
    params = job.steps.host_state(state).params
    if jax.process_count() > 1:
        params = multihost_utils.process_allgather(params, tiled=True)
    pairs = job.data.texts("validation")
    config = dataclasses.replace(
        job.config.final.translate,
        beam_size=job.config.loop.eval_bleu_beam_size,
        max_source_len=_max_source_len(job),
    )
    hypotheses = translate.translate(
        job.model,
        jax.device_put(params, jax.local_devices()[0]),
        job.data.tokenizer,
        [s for s, _ in pairs],
        config,
    )
    bleu = metrics.sacre_bleu(hypotheses, [t for _, t in pairs])
    return dict(sacrebleu=bleu["score"], bleu_beam_size=config.beam_size)


def _max_source_len(job: Job) -> int:
    """The longest source translated: what the model's positions allow, at most 4x the training
    length rule."""
    fits = translate.max_source_len_for(job.model.config)
    return min(fits, 4 * job.config.batches.max_seq_len)


def train(job: Job, profile: bool = False) -> dict:
    """Train to num_train_steps, resuming from the workdir's latest checkpoint."""
    loop = job.config.loop
    state = job.steps.init_state(loop.seed, job.pipeline.config.row_multiple)
    checkpointer = ckpt.Checkpointer(job.workdir.root, keep=loop.keep_checkpoints)
    iterator = job.pipeline.iterator()
    start = 0
    if checkpointer.steps():
        state, data_state, _, start = checkpointer.restore(steps.abstract_state(state))
        iterator.set_state(data_state)
        print(f"Resumed from step {start} in {checkpointer.directory}", file=sys.stderr)
    total = loop.num_train_steps
    if start >= total:
        print(
            f"Training already complete: step {start} of {total} in {job.workdir.root}",
            file=sys.stderr,
        )
        checkpointer.close()
        return dict(step=start, resumed_from=start, already_complete=True)
    state = job.steps.to_device(state)
    # what the compiled initialisation or the restore freed (~230 MB at BASE size) goes back
    # to the system before the first step's compilation and scratch buffer come on top of it
    host_memory.return_freed_memory()
    log = TrainLog(job.workdir.metrics, job.workdir.tensorboard, start, total)

    def learning_rate(step: int) -> float:
        schedule = job.config.train
        return float(
            training.learning_rate(
                step, job.model.config.d_model, schedule.warmup_steps, schedule.learning_rate_scale
            )
        )

    def save(step: int) -> None:
        checkpointer.save(step, job.steps.host_state(state), iterator.get_state())

    step, stop_reason = start, None
    try:
        with _StopSignal() as stop:
            while step < total:
                if profile and step == start + 2:
                    jax.profiler.start_trace(str(job.workdir.profile))
                state, step_metrics = job.steps.train(state, next(iterator))
                step += 1
                log.step_done(step, step_metrics)
                if profile and step == start + 5:
                    jax.block_until_ready(state)
                    jax.profiler.stop_trace()
                # read once: a signal arriving later in this step is handled at the next one
                stopping = stop.received
                bleu_now = bool(loop.eval_bleu_every_steps) and due(
                    step, loop.eval_bleu_every_steps, total
                )
                evaluate_now = due(step, loop.eval_every_steps, total) or bleu_now
                save_now = due(step, loop.checkpoint_every_steps, total) or stopping is not None
                if due(step, loop.log_every_steps, total) or evaluate_now or save_now:
                    log.flush(learning_rate(step))  # raises before a diverged state is used
                if evaluate_now:
                    values = validation_loss(job, state)
                    if bleu_now:
                        values.update(validation_bleu(job, state))
                    log.evaluation(step, values)
                if save_now:
                    save(step)
                if stopping is not None:
                    stop_reason = signal.Signals(stopping).name
                    break
    finally:
        log.close()
        checkpointer.close()
    if stop_reason:
        print(
            f"Received {stop_reason}: saved checkpoint {step} in {job.workdir.root}; run the same "
            "command again to resume",
            file=sys.stderr,
        )
    seconds = log.seconds
    return dict(
        step=step,
        resumed_from=start,
        stopped_by=stop_reason,
        seconds=seconds,
        target_tokens=log.trained_tokens,
        target_tokens_per_second=log.trained_tokens / max(seconds, 1e-9),
    )


def evaluate_translations(job: Job) -> dict:
    """Average the last checkpoints, translate the held-out split (`decode.split`), score BLEU
    both ways and the copy floor."""
    final = job.config.final
    params, averaged = ckpt.average_last(job.workdir.root, final.average_last)
    pairs = job.data.texts(final.split)
    sources = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    config = dataclasses.replace(final.translate, max_source_len=_max_source_len(job))
    start = time.perf_counter()
    with tqdm(
        total=len(sources),
        desc=f"translate {final.split}",
        unit="sent",
        file=sys.stderr,
        dynamic_ncols=True,
    ) as bar:
        hypotheses = translate.translate(
            job.model, jax.device_put(params), job.data.tokenizer, sources, config, bar.update
        )
    seconds = time.perf_counter() - start
    rng = np.random.default_rng(0)
    shown = rng.choice(len(sources), min(final.num_samples, len(sources)), replace=False)
    job.workdir.translations(final.split).write_text("\n".join(hypotheses) + "\n")
    scores = translate.score(hypotheses, references, job.data.spec.target_language, sources)
    return dict(
        split=final.split,
        sentences=len(sources),
        averaged_steps=averaged,
        beam_size=config.beam_size,
        alpha=config.alpha,
        batch_tokens=config.batch_tokens_on_this_backend(),
        decode_seconds=seconds,
        **scores,
        samples=[
            dict(source=sources[i], reference=references[i], translation=hypotheses[i])
            for i in shown
        ],
    )


def train_and_evaluate(
    config: JobConfig,
    workdir: str | pathlib.Path,
    profile: bool = False,
    start_over: bool = False,
) -> dict:
    """The main job: prepare data, train (resuming), then translate and score a held-out split
    (the test split unless `decode.split` says otherwise). Process 0 holds the workdir's lock
    throughout; `start_over` first moves a previous run's files aside.

    Runs on the processes and devices JAX has: on several hosts, start JAX's distributed runtime
    first (`tfm.job.parallel.initialize_distributed`, as train.py does)."""
    lead = jax.process_index() == 0
    with exclusive(Workdir(workdir)) if lead else contextlib.nullcontext():
        if start_over and lead:
            moved = move_previous_run_aside(Workdir(workdir))
            if moved:
                print(f"Moved the previous run aside to {moved}", file=sys.stderr)
        if start_over and jax.process_count() > 1:
            multihost_utils.sync_global_devices("tfm start_over")
        return _run(config, workdir, profile)


def _run(config: JobConfig, workdir: str | pathlib.Path, profile: bool) -> dict:
    wall_start = time.perf_counter()
    job = build_job(config, workdir)
    summary = job.data.summary(job.pipeline.config)
    lead = jax.process_index() == 0
    if lead:
        overview = dict(
            data=summary,
            model=dataclasses.asdict(job.model.config),
            devices=jax.device_count(),
            processes=jax.process_count(),
        )
        print(json.dumps(overview), file=sys.stderr)
    result = dict(config=dataclasses.asdict(config), data=summary, training=train(job, profile))
    if result["training"].get("stopped_by"):
        return result
    results_path = job.workdir.results
    if result["training"].get("already_complete") and results_path.is_file():
        previous = json.loads(results_path.read_text())
        if previous.get("training", {}).get("step") == result["training"]["step"]:
            print("Results of the finished run:", file=sys.stderr)
            return previous
    if job.workdir.metrics.is_file() and lead:
        viz.plot_training_curves(job.workdir.metrics, job.workdir.loss_curve)
    if config.final.enabled and lead:
        result[config.final.split] = evaluate_translations(job)
    result["wall_seconds"] = time.perf_counter() - wall_start
    result["host"] = host_description()
    if lead:
        results_path.write_text(json.dumps(result, indent=1, default=str))
    return result


def host_description() -> dict:
    """What the run's times were measured on: the CPU model, the cores this process may use,
    JAX's backend and devices."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return dict(
        cpu=host.cpu_model(),
        cores=cores,
        backend=jax.default_backend(),
        devices=[str(d.device_kind) for d in jax.local_devices()],
    )


def format_report(result: dict) -> str:
    """The human-readable summary train.py prints at the end."""
    lines = []
    training_info = result.get("training", {})
    if training_info.get("target_tokens_per_second"):
        lines.append(
            f"trained to step {training_info['step']} "
            f"({training_info['seconds'] / 60:.1f} min, "
            f"{training_info['target_tokens_per_second']:,.0f} target tokens/s)"
        )
    final = result.get("test") or result.get("validation")
    if final:
        split = final["split"]
        lines.append(
            f"{split} split: {final['sentences']} sentences, beam {final['beam_size']}, "
            f"alpha {final['alpha']}, checkpoints {final['averaged_steps']}"
            + (" averaged" if len(final["averaged_steps"]) > 1 else "")
        )
        lines.append(
            f"{split} sacreBLEU          {final['sacrebleu']['score']:.2f}  "
            f"({final['sacrebleu']['signature']})"
        )
        lines.append(
            f"{split} tokenized BLEU     {final['tokenized_bleu']['score']:.2f}  (the paper's way: "
            "Moses tokens"
            + (", compounds split)" if final["tokenized_bleu"]["compound_split"] else ")")
        )
        lines.append(
            f"{split} copy-source floor  {final['copy_source_sacrebleu']['score']:.2f}  "
            "(sacreBLEU of the untranslated source)"
        )
        for sample in final["samples"]:
            lines.append(
                f"  SRC {sample['source']}\n  REF {sample['reference']}\n"
                f"  HYP {sample['translation']}"
            )
    if "wall_seconds" in result:
        lines.append(f"wall time {result['wall_seconds'] / 60:.1f} min")
    return "\n".join(lines)
