"""What a training workdir holds and how to read it back: the model card (`model.json`: model
shape, vocabulary, dataset and their fingerprints), the files the training job writes, the lock
of the one process that writes them, and loading a trained model (checkpoint or checkpoint
average, vocabulary) for translation.

A workdir holds one run: a resumed run must train the same model on the same data with the same
vocabulary (`check_resume`); anything else needs a new workdir or `start_over`, which moves the
old run aside and never deletes it.

    WORKDIR/model.json              model card: ModelConfig, vocabulary, dataset, fingerprints
    WORKDIR/.lock                   held (flock) by the training process that writes here
    WORKDIR/checkpoints/STEP/       orbax checkpoints (`tfm.job.checkpoint`)
    WORKDIR/metrics.jsonl           one JSON record per log / evaluation
    WORKDIR/tensorboard/            the same scalars for TensorBoard
    WORKDIR/results.json            the finished job's summary (training, final BLEU)
    WORKDIR/SPLIT_translations.txt  the final evaluation's translations (test or validation)
    WORKDIR/loss_curve.png          training curves
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tfm.config import ModelConfig
from tfm.data.tokenizer import Tokenizer
from tfm.job import checkpoint as ckpt
from tfm.job import file_lock
from tfm.model import Transformer

MODEL_CARD = "model.json"
# keys that model cards written before a rename carry, and their current names
_RENAMED_MODEL_KEYS = {"max_len": "max_positions"}
# ModelConfig fields that change how, not what, the model computes: free to change on resume
_COMPUTATION_ONLY = ("attention", "remat")


class LoadError(RuntimeError):
    """A workdir whose checkpoint, model card or vocabulary cannot be used; says what to do."""


class WorkdirError(RuntimeError):
    """A workdir that this run must not write to: busy, or holding another run."""


@dataclasses.dataclass(frozen=True)
class Workdir:
    """The paths of one training workdir."""

    root: pathlib.Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", pathlib.Path(self.root))

    @property
    def model_card(self) -> pathlib.Path:
        return self.root / MODEL_CARD

    @property
    def metrics(self) -> pathlib.Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> pathlib.Path:
        return self.root / "tensorboard"

    @property
    def results(self) -> pathlib.Path:
        return self.root / "results.json"

    def translations(self, split: str) -> pathlib.Path:
        return self.root / f"{split}_translations.txt"

    @property
    def loss_curve(self) -> pathlib.Path:
        return self.root / "loss_curve.png"

    @property
    def profile(self) -> pathlib.Path:
        return self.root / "profile"

    @property
    def checkpoints(self) -> pathlib.Path:
        return ckpt.Checkpointer.directory_of(self.root)

    @property
    def lock_file(self) -> pathlib.Path:
        return self.root / ".lock"

    def has_checkpoints(self) -> bool:
        folder = self.checkpoints
        return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())

    def run_files(self) -> list[pathlib.Path]:
        """What one run writes here (and `start_over` moves aside)."""
        paths = [
            self.model_card,
            self.checkpoints,
            self.metrics,
            self.tensorboard,
            self.results,
            *self.root.glob("*_translations.txt"),
            self.loss_curve,
            self.profile,
        ]
        return [path for path in paths if path.exists()]


@contextlib.contextmanager
def exclusive(workdir: Workdir):
    """Hold the workdir's advisory lock for the block: a second writer fails at once, naming the
    holder. The OS releases the lock when the process dies, so a killed run never blocks the
    next one."""
    workdir.root.mkdir(parents=True, exist_ok=True)

    def refuse(holder: str) -> None:
        raise WorkdirError(
            f"{workdir.root} is in use by {holder} (it holds {workdir.lock_file}); "
            "wait for it to finish, stop it, or train in another --workdir"
        )

    with file_lock.held(workdir.lock_file, refuse):
        yield


def start_over(workdir: Workdir) -> pathlib.Path | None:
    """Move the previous run's files into WORKDIR/previous-N (never deleted); None if none."""
    files = workdir.run_files()
    if not files:
        return None
    number = 1
    while (workdir.root / f"previous-{number}").exists():
        number += 1
    folder = workdir.root / f"previous-{number}"
    folder.mkdir()
    for path in files:
        path.rename(folder / path.name)
    return folder


@dataclasses.dataclass(frozen=True)
class ModelCard:
    """What decode.py needs to rebuild a trained model and its vocabulary, and what identifies
    the run: the data and vocabulary it trained on (fingerprints) and its resumable settings."""

    model: ModelConfig
    vocabulary: str
    dataset: str
    source_language: str
    target_language: str
    dataset_fingerprint: str = ""
    vocabulary_fingerprint: str = ""
    settings: dict = dataclasses.field(default_factory=dict)  # may change on resume

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the checkpoints: model, data, vocabulary. The
        model fields that only choose how the same function is computed may change."""
        values = {
            f"model.{k}": v
            for k, v in dataclasses.asdict(self.model).items()
            if k not in _COMPUTATION_ONLY
        }
        values.update(
            dataset=self.dataset,
            source_language=self.source_language,
            target_language=self.target_language,
            dataset_fingerprint=self.dataset_fingerprint,
            vocabulary_fingerprint=self.vocabulary_fingerprint,
        )
        return values

    def to_json(self) -> str:
        values = dataclasses.asdict(self)
        return json.dumps(values, indent=1)


def write_model_card(workdir: Workdir, card: ModelCard) -> None:
    """Write model.json atomically: other processes of the job may be reading it."""
    workdir.root.mkdir(parents=True, exist_ok=True)
    partial = workdir.model_card.with_name(f"{MODEL_CARD}.{os.getpid()}.partial")
    partial.write_text(card.to_json())
    partial.replace(workdir.model_card)


def read_model_card(workdir: Workdir) -> ModelCard:
    path = workdir.model_card
    if not path.is_file():
        raise LoadError(f"{path}: missing; is {workdir.root} a directory that train.py wrote?")
    try:
        values = json.loads(path.read_text())
        model = {_RENAMED_MODEL_KEYS.get(k, k): v for k, v in values["model"].items()}
        return ModelCard(
            model=ModelConfig(**model),
            vocabulary=values["vocabulary"],
            dataset=values.get("dataset", "unknown"),
            source_language=values.get("source_language", "unknown"),
            target_language=values.get("target_language", "unknown"),
            dataset_fingerprint=values.get("dataset_fingerprint", ""),
            vocabulary_fingerprint=values.get("vocabulary_fingerprint", ""),
            settings=dict(values.get("settings") or {}),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as error:
        raise LoadError(f"{path}: unreadable model card ({error})") from None


def check_resume(workdir: Workdir, card: ModelCard) -> list[str]:
    """Before a run writes anything: stop if the workdir's checkpoints belong to another model,
    dataset or vocabulary; return the resumable settings that changed, for the log."""
    if not workdir.has_checkpoints():
        return []
    ways_out = (
        "train in a new --workdir, or pass --start_over to move the old run aside to "
        f"{workdir.root}/previous-N (nothing is deleted)"
    )
    try:
        old = read_model_card(workdir)
    except LoadError as error:
        raise WorkdirError(f"{error}; the checkpoints here cannot be matched: {ways_out}") from None
    before, now = old.identity(), card.identity()
    # cards written before fingerprints existed have none to compare
    unknown = {k for k, v in before.items() if k.endswith("_fingerprint") and not v}
    differ = [k for k in now if k not in unknown and before.get(k) != now[k]]
    if differ:
        shown = "; ".join(f"{k}: {before.get(k)!r} -> {now[k]!r}" for k in differ[:4])
        raise WorkdirError(
            f"{workdir.root} holds checkpoints of another run ({shown}"
            f"{'; ...' if len(differ) > 4 else ''}): {ways_out}"
        )
    return [
        f"{k}: {old.settings[k]!r} -> {v!r}"
        for k, v in card.settings.items()
        if k in old.settings and old.settings[k] != v
    ]


def scored_average(root: str | pathlib.Path) -> int:
    """How many checkpoints the job's final evaluation averaged (results.json; 1 if that has not
    run): what `load(root, average=...)` needs to give the parameters the job scored."""
    path = Workdir(pathlib.Path(root)).results
    if not path.is_file():
        return 1
    result = json.loads(path.read_text())
    for split in ("test", "validation"):
        if split in result:
            return max(1, len(result[split].get("averaged_steps", [])))
    return 1


@dataclasses.dataclass
class Loaded:
    """A trained model ready to translate: module, parameters (on device), vocabulary, card, and
    which checkpoint(s) the parameters are ("checkpoint 1100 from ..." / "average of ...")."""

    model: Transformer
    params: Any
    tokenizer: Tokenizer
    card: ModelCard
    description: str


def _check_compatible(model: Transformer, params, where: str) -> None:
    ids = jnp.ones((1, 2), jnp.int32)
    expected = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids))["params"]
    want = {
        jax.tree_util.keystr(p): tuple(x.shape)
        for p, x in jax.tree_util.tree_leaves_with_path(expected)
    }
    got = {
        jax.tree_util.keystr(p): tuple(np.shape(x))
        for p, x in jax.tree_util.tree_leaves_with_path(params)
    }
    if want != got:
        missing = sorted(set(want) - set(got))[:3]
        differ = sorted(k for k in set(want) & set(got) if want[k] != got[k])[:3]
        raise LoadError(
            f"{where} does not fit the model in {MODEL_CARD}: missing {missing}, "
            f"different shapes {differ}; was it written by another config?"
        )


def load(
    root: str | pathlib.Path,
    step: int | None = None,
    average: int | None = 5,
    kernels: str = "auto",
) -> Loaded:
    """The model of a train.py workdir with the parameters of checkpoint `step`, or the average
    of the last `average` checkpoints (section 6.1); `average` None or 1 = the latest. `kernels`
    (`tfm.implementation`) is the model's, whatever the run was trained with."""
    workdir = Workdir(root)
    card = read_model_card(workdir)
    model = Transformer(card.model, kernels=kernels)
    try:
        tokenizer = Tokenizer(card.vocabulary)
    except (FileNotFoundError, ValueError) as error:
        raise LoadError(f"vocabulary for {workdir.root}: {error}") from None
    if tokenizer.vocab_size != model.config.vocab_size:
        raise LoadError(
            f"{card.vocabulary} has {tokenizer.vocab_size} pieces but the model "
            f"expects {model.config.vocab_size}; the vocabulary was replaced"
        )
    try:
        if step is not None or not average or average <= 1:
            params, used = ckpt.Checkpointer(workdir.root, read_only=True).restore_params(step)
            description = f"checkpoint {used} from {workdir.root}"
        else:
            params, steps = ckpt.average_last(workdir.root, average)
            description = f"average of checkpoints {steps} from {workdir.root}"
    except ckpt.CheckpointError as error:
        raise LoadError(str(error)) from None
    _check_compatible(model, params, f"checkpoint in {workdir.root}")
    return Loaded(model, jax.device_put(params), tokenizer, card, description)
