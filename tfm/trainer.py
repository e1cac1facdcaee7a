"""The training job: data -> sharded train steps -> metrics and checkpoints -> evaluation.

`train_and_evaluate(config, workdir)` is what `train.py` runs. The config (an ml_collections
ConfigDict, see configs/common.py) is read here, once, and turned into plain values.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import signal
import sys
import time
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from tfm import checkpoint as ckpt
from tfm import metrics as bleu
from tfm import parallel, training, viz
from tfm.config import ModelConfig
from tfm.data import pipeline as data_pipeline
from tfm.data import sources as data_sources
from tfm.data.prepare import PreparedData, prepare
from tfm.inference import MODEL_CARD
from tfm.model import Transformer
from tfm.translate import TranslateConfig, translate


class TrainingDiverged(RuntimeError):
    """The loss became NaN or Inf."""


@dataclasses.dataclass
class _Job:
    """Everything built from the config before the first step."""

    config: Any
    workdir: pathlib.Path
    data: PreparedData
    model: Transformer
    train_config: training.TrainConfig
    optimizer: Any
    pipeline: data_pipeline.BatchPipeline
    eval_pipeline: data_pipeline.BatchPipeline
    mesh: Any
    strategy: str


def model_config_from(config, vocab_size: int) -> ModelConfig:
    try:
        return ModelConfig(vocab_size=vocab_size, **config.model.to_dict())
    except TypeError as error:
        raise ValueError(f"config.model has a key ModelConfig does not know: {error}") from None


def _check_config(config) -> None:
    positive = (
        "num_train_steps",
        "batch_tokens",
        "max_len",
        "log_every_steps",
        "eval_every_steps",
        "checkpoint_every_steps",
        "keep_checkpoints",
        "grad_accum_steps",
        "vocab_size",
        "warmup_steps",
        "model_parallel",
    )
    for key in positive:
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"config.{key} must be a positive integer, got {value!r}")
    if config.parallelism not in parallel.STRATEGIES:
        raise ValueError(
            f"config.parallelism must be one of {parallel.STRATEGIES}, got {config.parallelism!r}"
        )
    if config.keep_checkpoints < config.decode.average_last:
        raise ValueError(
            f"config.keep_checkpoints ({config.keep_checkpoints}) must be at least "
            f"config.decode.average_last ({config.decode.average_last})"
        )


def build_job(config, workdir: str | pathlib.Path) -> _Job:
    _check_config(config)
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    data = prepare(_spec(config), config.data_dir, config.vocab_size)
    model_config = model_config_from(config, data.tokenizer.vocab_size)
    model = Transformer(model_config)
    train_config = training.TrainConfig(
        label_smoothing=config.label_smoothing,
        warmup_steps=config.warmup_steps,
        learning_rate_scale=config.learning_rate_scale,
        grad_clip_norm=config.grad_clip_norm or None,
    )
    optimizer = training.make_optimizer(train_config, model_config.d_model)
    strategy = config.parallelism
    mesh = parallel.make_mesh(config.model_parallel if strategy == "tensor" else 1)
    data_devices = mesh.shape["data"]
    row_multiple = math.lcm(data_devices * config.grad_accum_steps, jax.process_count())
    common = dict(
        max_len=config.max_len,
        overlong=config.overlong,
        pack=config.pack,
        row_multiple=row_multiple,
    )
    pipeline = data_pipeline.BatchPipeline(
        data.ids["train"],
        data_pipeline.PipelineConfig(batch_tokens=config.batch_tokens, seed=config.seed, **common),
        jax.process_index(),
        jax.process_count(),
    )
    eval_pipeline = data_pipeline.BatchPipeline(
        data.ids["validation"],
        data_pipeline.PipelineConfig(batch_tokens=config.batch_tokens, shuffle=False, **common),
        jax.process_index(),
        jax.process_count(),
    )
    if jax.process_index() == 0:
        write_model_card(workdir, model_config, data)
    return _Job(
        config,
        workdir,
        data,
        model,
        train_config,
        optimizer,
        pipeline,
        eval_pipeline,
        mesh,
        strategy,
    )


def write_model_card(workdir: pathlib.Path, model_config: ModelConfig, data: PreparedData):
    """What decode.py needs to rebuild the model and its vocabulary from a workdir."""
    card = dict(
        model=dataclasses.asdict(model_config),
        vocabulary=str(data.tokenizer.path.absolute()),
        dataset=f"{data.spec.kind}:{data.spec.argument}",
        source_language=data.spec.source_language,
        target_language=data.spec.target_language,
    )
    (workdir / MODEL_CARD).write_text(json.dumps(card, indent=1))


def _spec(config):
    return data_sources.parse_spec(config.dataset, config.source_language, config.target_language)


def _micro_batched(batch: dict[str, np.ndarray], micro: int) -> dict[str, np.ndarray]:
    if micro == 1:
        return batch
    return {k: v.reshape(micro, v.shape[0] // micro, *v.shape[1:]) for k, v in batch.items()}


class _StepRunner:
    """The compiled train and eval steps for the chosen strategy, and batch placement."""

    def __init__(self, job: _Job):
        self.job = job
        model, optimizer = job.model, job.optimizer
        smoothing = job.train_config.label_smoothing
        self.micro = job.config.grad_accum_steps
        if job.strategy == "pmap":
            self.devices = jax.local_device_count()
            self._train = jax.pmap(
                lambda s, b: training.train_step(
                    s, b, model=model, optimizer=optimizer, smoothing=smoothing, axis_name="batch"
                ),
                axis_name="batch",
                donate_argnums=(0,),
            )
            self._eval = jax.pmap(
                lambda p, b: jax.lax.psum(
                    training.eval_step(p, b, model=model, smoothing=smoothing), "batch"
                ),
                axis_name="batch",
            )
        else:
            self._train_fn = lambda s, b: training.train_step(
                s, b, model=model, optimizer=optimizer, smoothing=smoothing
            )
            self._eval = jax.jit(
                lambda p, b: training.eval_step(p, b, model=model, smoothing=smoothing)
            )

    def init_state(self, rng_seed: int):
        job = self.job
        example = {
            k: np.zeros((job.pipeline.config.row_multiple, 8), np.int32)
            for k in ("src", "tgt_in", "tgt_out")
        }
        init = lambda rng: training.init_train_state(  # noqa: E731
            job.model, job.optimizer, rng, example
        )
        rng = jax.random.PRNGKey(rng_seed)
        if job.strategy == "pmap":
            return init(rng)
        shapes = jax.eval_shape(init, rng)
        self.state_sharding = parallel.state_shardings(shapes, job.strategy, job.mesh)
        self._train = jax.jit(
            self._train_fn,
            in_shardings=(self.state_sharding, None),
            out_shardings=(self.state_sharding, None),
            donate_argnums=(0,),
        )
        return jax.jit(init, out_shardings=self.state_sharding)(rng)

    def abstract_state(self, state):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
            state,
        )

    def place(self, batch: dict[str, np.ndarray], micro: int):
        batch = _micro_batched(batch, micro)
        if self.job.strategy == "pmap":
            return parallel.split_for_pmap(batch, self.devices)
        sharding = parallel.batch_sharding(self.job.mesh, micro_batched=micro > 1)
        return parallel.global_batch(batch, sharding)

    def to_device(self, state):
        if self.job.strategy == "pmap":
            return parallel.replicate_for_pmap(state)
        return state

    def from_device(self, state):
        if self.job.strategy == "pmap":
            return jax.tree.map(lambda x: x[0], state)
        return state

    def train(self, state, batch):
        return self._train(state, self.place(batch, self.micro))

    def evaluate(self, params, max_batches: int) -> dict[str, float]:
        totals = dict(loss=0.0, nll=0.0, tokens=0.0)
        plan = self.job.eval_pipeline.plan(0)
        if max_batches:
            plan = plan[:max_batches]
        for rows in plan:
            sums = self._eval(params, self.place(self.job.eval_pipeline.local_batch(rows), 1))
            sums = jax.device_get(sums)
            for key in totals:
                value = np.asarray(sums[key])
                totals[key] += float(value[0] if value.ndim else value)
        tokens = max(totals["tokens"], 1.0)
        return dict(
            loss=totals["loss"] / tokens,
            nll=totals["nll"] / tokens,
            perplexity=bleu.perplexity(totals["nll"], tokens),
            tokens=totals["tokens"],
        )


class _MetricWriter:
    """metrics.jsonl (every record) and TensorBoard event files (scalars), process 0 only."""

    def __init__(self, workdir: pathlib.Path):
        self.enabled = jax.process_index() == 0
        self.path = workdir / "metrics.jsonl"
        self._tensorboard = None
        if self.enabled:
            from tensorboardX import SummaryWriter

            self._tensorboard = SummaryWriter(str(workdir / "tensorboard"))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        prefix = record.get("kind", "train")
        for key, value in record.items():
            if isinstance(value, (int, float)) and key not in ("step", "time"):
                self._tensorboard.add_scalar(f"{prefix}/{key}", value, record["step"])
        self._tensorboard.flush()

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()


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


def train(job: _Job, profile: bool = False) -> dict:
    """Train to config.num_train_steps, resuming from the workdir's latest checkpoint."""
    config = job.config
    runner = _StepRunner(job)
    state = runner.init_state(config.seed)
    checkpointer = ckpt.Checkpointer(job.workdir, keep=config.keep_checkpoints)
    iterator = job.pipeline.iterator()
    start_step = 0
    if checkpointer.steps():
        target = runner.abstract_state(state)
        state, data_state, _, start_step = checkpointer.restore(target)
        iterator.set_state(data_state)
        print(f"Resumed from step {start_step} in {checkpointer.directory}", file=sys.stderr)
    total = config.num_train_steps
    if start_step >= total:
        print(
            f"Training already complete: step {start_step} of {total} in {job.workdir}",
            file=sys.stderr,
        )
        checkpointer.close()
        return dict(step=start_step, resumed_from=start_step, already_complete=True)
    state = runner.to_device(state)
    writer = _MetricWriter(job.workdir)
    d_model = job.model.config.d_model

    def save(step: int) -> None:
        host_state = runner.from_device(state)
        checkpointer.save(
            step,
            host_state,
            iterator.get_state(),
            dict(step=step, digest=ckpt.params_digest(host_state.params)),
        )

    step = start_step
    last_saved = start_step
    pending: list[tuple[int, Any]] = []
    window_tokens, window_start = 0.0, time.perf_counter()
    train_start = time.perf_counter()
    trained_tokens = 0.0
    bar = tqdm(
        total=total,
        initial=start_step,
        desc="train",
        unit="step",
        dynamic_ncols=True,
        disable=jax.process_index() != 0,
        file=sys.stderr,
    )
    stop_reason = None
    try:
        with _StopSignal() as stop:
            while step < total:
                if profile and step == start_step + 2:
                    jax.profiler.start_trace(str(job.workdir / "profile"))
                batch = next(iterator)
                state, step_metrics = runner.train(state, batch)
                step += 1
                pending.append((step, step_metrics))
                if profile and step == start_step + 5:
                    jax.block_until_ready(state)
                    jax.profiler.stop_trace()
                # every save and evaluation first checks all steps since the last check
                due = (
                    step % config.log_every_steps == 0
                    or step == total
                    or stop.received
                    or step % config.checkpoint_every_steps == 0
                    or step % config.eval_every_steps == 0
                )
                if due:
                    records = _check_finite(jax.device_get(pending))
                    pending = []
                    now = time.perf_counter()
                    tokens = sum(r["tokens"] for r in records)
                    window_tokens += tokens
                    trained_tokens += tokens
                    rate = window_tokens / max(now - window_start, 1e-9)
                    window_tokens, window_start = 0.0, now
                    last = records[-1]
                    lr = float(
                        training.learning_rate(
                            step, d_model, config.warmup_steps, config.learning_rate_scale
                        )
                    )
                    writer.write(
                        dict(
                            kind="train",
                            step=step,
                            loss=last["loss"],
                            nll=last["nll"],
                            learning_rate=lr,
                            target_tokens_per_second=rate,
                            grad_norm=last["grad_norm"],
                            time=now - train_start,
                        )
                    )
                    bar.set_postfix(
                        loss=f"{last['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:,.0f}"
                    )
                bar.update(1)
                if step % config.eval_every_steps == 0 or step == total:
                    # under pmap the state's parameters are already one copy per device
                    evaluation = runner.evaluate(state.params, config.eval_batches)
                    writer.write(dict(kind="eval", step=step, **evaluation))
                    bar.write(
                        f"step {step}: validation loss {evaluation['loss']:.3f}, "
                        f"perplexity {evaluation['perplexity']:.2f}",
                        file=sys.stderr,
                    )
                if step % config.checkpoint_every_steps == 0 or step == total:
                    save(step)
                    last_saved = step
                if stop.received:
                    stop_reason = signal.Signals(stop.received).name
                    break
    finally:
        bar.close()
        writer.close()
    if step != last_saved:
        save(step)
    checkpointer.close()
    elapsed = time.perf_counter() - train_start
    if stop_reason:
        print(
            f"Received {stop_reason}: saved checkpoint {step} in {job.workdir}; run the same "
            "command again to resume",
            file=sys.stderr,
        )
    return dict(
        step=step,
        resumed_from=start_step,
        stopped_by=stop_reason,
        seconds=elapsed,
        target_tokens=trained_tokens,
        target_tokens_per_second=trained_tokens / max(elapsed, 1e-9),
    )


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


def evaluate_translations(job: _Job) -> dict:
    """Average the last checkpoints, translate the test split, score BLEU and the copy floor."""
    config = job.config
    params, steps = ckpt.average_last(job.workdir, config.decode.average_last)
    test_pairs = job.data.corpus.splits["test"]
    sources = [s for s, _ in test_pairs]
    references = [t for _, t in test_pairs]
    translate_config = TranslateConfig(
        beam_size=config.decode.beam_size,
        alpha=config.decode.alpha,
        extra_length=config.decode.extra_length,
        batch_tokens=config.decode.batch_tokens,
        max_source_len=min(job.model.config.max_len, 4 * config.max_len),
    )
    start = time.perf_counter()
    with tqdm(
        total=len(sources), desc="translate test", unit="sent", file=sys.stderr, dynamic_ncols=True
    ) as bar:
        hypotheses = translate(
            job.model,
            jax.device_put(params),
            job.data.tokenizer,
            sources,
            translate_config,
            progress=bar.update,
        )
    seconds = time.perf_counter() - start
    compound = job.data.spec.target_language == "de"
    rng = np.random.default_rng(0)
    samples = [
        dict(source=sources[i], reference=references[i], translation=hypotheses[i])
        for i in rng.choice(
            len(sources), min(config.decode.num_samples, len(sources)), replace=False
        )
    ]
    (job.workdir / "test_translations.txt").write_text("\n".join(hypotheses) + "\n")
    return dict(
        test_sentences=len(sources),
        averaged_steps=steps,
        beam_size=config.decode.beam_size,
        alpha=config.decode.alpha,
        decode_seconds=seconds,
        sacrebleu=bleu.sacre_bleu(hypotheses, references),
        tokenized_bleu=bleu.tokenized_bleu(hypotheses, references, compound_split=compound),
        copy_source_sacrebleu=bleu.sacre_bleu(sources, references),
        samples=samples,
    )


def train_and_evaluate(config, workdir: str | pathlib.Path, profile: bool = False) -> dict:
    """The main job: prepare data, train (resuming), then translate and score the test split."""
    wall_start = time.perf_counter()
    parallel.initialize_distributed()
    job = build_job(config, workdir)
    summary = job.data.summary(job.pipeline.config)
    if jax.process_index() == 0:
        print(
            json.dumps(
                dict(
                    data=summary,
                    model=dataclasses.asdict(job.model.config),
                    devices=jax.device_count(),
                    processes=jax.process_count(),
                ),
                indent=None,
            ),
            file=sys.stderr,
        )
    result = dict(config=config.to_dict(), data=summary, training=train(job, profile))
    if result["training"].get("stopped_by"):
        return result
    results_path = job.workdir / "results.json"
    if result["training"].get("already_complete") and results_path.is_file():
        previous = json.loads(results_path.read_text())
        if previous.get("training", {}).get("step") == result["training"]["step"]:
            print("Results of the finished run:", file=sys.stderr)
            return previous
    if (job.workdir / "metrics.jsonl").is_file() and jax.process_index() == 0:
        viz.plot_training_curves(job.workdir / "metrics.jsonl", job.workdir / "loss_curve.png")
    if config.decode.enabled and jax.process_index() == 0:
        result["test"] = evaluate_translations(job)
    result["wall_seconds"] = time.perf_counter() - wall_start
    if jax.process_index() == 0:
        results_path.write_text(json.dumps(result, indent=1, default=str))
    return result


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
    test = result.get("test")
    if test:
        lines.append(
            f"test split: {test['test_sentences']} sentences, beam {test['beam_size']}, "
            f"alpha {test['alpha']}, averaged checkpoints {test['averaged_steps']}"
        )
        lines.append(
            f"sacreBLEU          {test['sacrebleu']['score']:.2f}  "
            f"({test['sacrebleu']['signature']})"
        )
        lines.append(
            f"tokenized BLEU     {test['tokenized_bleu']['score']:.2f}  (13a tokens"
            + (", compounds split)" if test["tokenized_bleu"]["compound_split"] else ")")
        )
        lines.append(
            f"copy-source floor  {test['copy_source_sacrebleu']['score']:.2f}  "
            "(sacreBLEU of the untranslated source)"
        )
        for sample in test["samples"]:
            lines.append(
                f"  SRC {sample['source']}\n  REF {sample['reference']}\n"
                f"  HYP {sample['translation']}"
            )
    if "wall_seconds" in result:
        lines.append(f"wall time {result['wall_seconds'] / 60:.1f} min")
    return "\n".join(lines)
