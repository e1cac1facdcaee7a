"""What a training workdir holds and how to read it back: the model card (`model.json`: model
shape, vocabulary, dataset), the files the training job writes, and loading a trained model
(checkpoint or checkpoint average, vocabulary) for translation.

    WORKDIR/model.json              model card: ModelConfig, vocabulary path, dataset, languages
    WORKDIR/checkpoints/STEP/       orbax checkpoints (`tfm.checkpoint`)
    WORKDIR/metrics.jsonl           one JSON record per log / evaluation
    WORKDIR/tensorboard/            the same scalars for TensorBoard
    WORKDIR/results.json            the finished job's summary (training, final BLEU)
    WORKDIR/test_translations.txt   the final evaluation's translations
    WORKDIR/loss_curve.png          training curves
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tfm import checkpoint as ckpt
from tfm.config import ModelConfig
from tfm.data.tokenizer import Tokenizer
from tfm.model import Transformer

MODEL_CARD = "model.json"
# keys that model cards written before a rename carry, and their current names
_RENAMED_MODEL_KEYS = {"max_len": "max_positions"}


class LoadError(RuntimeError):
    """A workdir whose checkpoint, model card or vocabulary cannot be used; says what to do."""


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

    @property
    def translations(self) -> pathlib.Path:
        return self.root / "test_translations.txt"

    @property
    def loss_curve(self) -> pathlib.Path:
        return self.root / "loss_curve.png"

    @property
    def profile(self) -> pathlib.Path:
        return self.root / "profile"


@dataclasses.dataclass(frozen=True)
class ModelCard:
    """What decode.py needs to rebuild a trained model and its vocabulary."""

    model: ModelConfig
    vocabulary: str
    dataset: str
    source_language: str
    target_language: str

    def to_json(self) -> str:
        values = dataclasses.asdict(self)
        return json.dumps(values, indent=1)


def write_model_card(workdir: Workdir, card: ModelCard) -> None:
    workdir.root.mkdir(parents=True, exist_ok=True)
    workdir.model_card.write_text(card.to_json())


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
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as error:
        raise LoadError(f"{path}: unreadable model card ({error})") from None


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


def load(root: str | pathlib.Path, step: int | None = None, average: int | None = 5) -> Loaded:
    """The model of a train.py workdir with the parameters of checkpoint `step`, or the average
    of the last `average` checkpoints (section 6.1); `average` None or 1 = the latest."""
    workdir = Workdir(root)
    card = read_model_card(workdir)
    model = Transformer(card.model)
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
