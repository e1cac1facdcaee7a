"""The training job's settings: a config file's ConfigDict (configs/common.py lists its keys)
read once, here, into typed and validated values. Nothing after this module reads the
ConfigDict; a key that is misspelled or holds a wrong value stops the job before any work,
with a message that names the key.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from tfm import implementation
from tfm.config import ModelConfig
from tfm.data.batching import BatchConfig
from tfm.data.sources import SourceSpec, parse_spec
from tfm.inference.translate import TranslateConfig
from tfm.job import parallel
from tfm.training import TrainConfig


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """How long to train and how often to log, evaluate and checkpoint (in steps)."""

    num_train_steps: int
    log_every_steps: int
    eval_every_steps: int
    checkpoint_every_steps: int
    keep_checkpoints: int
    eval_batches: int  # 0 = the whole validation split
    seed: int
    eval_bleu_every_steps: int = 0  # 0 = off; else translate the validation split this often
    eval_bleu_beam_size: int = 1  # 1 = greedy


@dataclasses.dataclass(frozen=True)
class FinalEvaluation:
    """Translating and scoring a held-out split after training (section 6.1; Table 3 scores the
    validation split, the paper's newstest2013)."""

    enabled: bool
    split: str  # "test" or "validation"
    average_last: int  # checkpoints averaged (1 = the last one)
    num_samples: int  # sentences printed with source, reference and translation
    translate: TranslateConfig  # max_source_len is set from the model when the job is built


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """Every value the training job uses, typed and validated."""

    spec: SourceSpec
    data_dir: pathlib.Path
    vocab_size: int
    batches: BatchConfig  # row_multiple is set from the devices when the job is built
    grad_accum_steps: int
    train: TrainConfig
    model: dict[str, Any]  # ModelConfig fields but vocab_size, which the vocabulary decides
    parallelism: str
    model_parallel: int
    loop: LoopConfig
    final: FinalEvaluation
    # tfm.implementation: not part of the model; a run may resume with another
    kernels: str = "auto"
    encoding_errors: str = "strict"  # invalid UTF-8 in a text/tsv corpus: "strict" or "replace"

    def model_config(self, vocab_size: int) -> ModelConfig:
        return ModelConfig(vocab_size=vocab_size, **self.model)


class _Reader:
    """Reads keys of a ConfigDict once each, so that keys nobody read can be reported."""

    def __init__(self, config, prefix: str = "config"):
        self._config = config
        self._prefix = prefix
        self.read: set[str] = set()

    def get(self, key: str):
        self.read.add(key)
        try:
            return self._config[key]
        except (KeyError, AttributeError):
            raise ValueError(f"{self._prefix}.{key} is missing from the config") from None

    def positive_int(self, key: str) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{self._prefix}.{key} must be a positive integer, got {value!r}")
        return value

    def optional_positive_int(self, key: str) -> int | None:
        """A positive integer, or None for "the default"."""
        if self.get(key) is None:
            return None
        return self.positive_int(key)

    def non_negative_int(self, key: str) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{self._prefix}.{key} must be an integer >= 0, got {value!r}")
        return value

    def boolean(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            raise ValueError(f"{self._prefix}.{key} must be True or False, got {value!r}")
        return value

    def unread(self) -> list[str]:
        return sorted(f"{self._prefix}.{k}" for k in self._config.keys() if k not in self.read)


def _valid(build, prefix: str):
    """Run a constructor whose ValueError names a field; prefix it with the config's key."""
    try:
        return build()
    except (ValueError, TypeError) as error:
        raise ValueError(f"{prefix}: {error}") from None


# keys of older config files and their names now
_RENAMED = {"max_len": "max_seq_len", "model.max_len": "model.max_positions"}


def _check_renamed(config) -> None:
    for old, new in _RENAMED.items():
        section, _, key = old.rpartition(".")
        holder = config[section] if section else config
        if key in holder.keys():
            raise ValueError(f"config.{old} is now config.{new}; rename it in the config file")


def job_config_from(config) -> JobConfig:
    """Read and validate a ConfigDict; ValueError names the first bad key."""
    top = _Reader(config)
    decode = _Reader(top.get("decode"), "config.decode")
    _check_renamed(config)
    model_dict = dict(top.get("model").to_dict())
    if "vocab_size" in model_dict:
        raise ValueError(
            "config.model.vocab_size: the vocabulary decides it; set config.vocab_size"
        )
    vocab_size = top.positive_int("vocab_size")
    model = _valid(lambda: ModelConfig(vocab_size=vocab_size, **model_dict), "config.model")
    batches = _valid(
        lambda: BatchConfig(
            batch_tokens=top.positive_int("batch_tokens"),
            max_seq_len=top.positive_int("max_seq_len"),
            overlong=top.get("overlong"),
            pack=top.boolean("pack"),
            seed=top.non_negative_int("seed"),
        ),
        "config",
    )
    clip = top.get("grad_clip_norm")
    train = _valid(
        lambda: TrainConfig(
            label_smoothing=top.get("label_smoothing"),
            warmup_steps=top.positive_int("warmup_steps"),
            learning_rate_scale=top.get("learning_rate_scale"),
            grad_clip_norm=clip or None,
        ),
        "config",
    )
    parallelism = top.get("parallelism")
    if parallelism not in parallel.STRATEGIES:
        raise ValueError(
            f"config.parallelism must be one of {parallel.STRATEGIES}, got {parallelism!r}"
        )
    loop = LoopConfig(
        num_train_steps=top.positive_int("num_train_steps"),
        log_every_steps=top.positive_int("log_every_steps"),
        eval_every_steps=top.positive_int("eval_every_steps"),
        checkpoint_every_steps=top.positive_int("checkpoint_every_steps"),
        keep_checkpoints=top.positive_int("keep_checkpoints"),
        eval_batches=top.non_negative_int("eval_batches"),
        seed=batches.seed,
        eval_bleu_every_steps=top.non_negative_int("eval_bleu_every_steps"),
        eval_bleu_beam_size=top.positive_int("eval_bleu_beam_size"),
    )
    translate = _valid(
        lambda: TranslateConfig(
            beam_size=decode.positive_int("beam_size"),
            alpha=decode.get("alpha"),
            extra_length=decode.non_negative_int("extra_length"),
            batch_tokens=decode.optional_positive_int("batch_tokens"),
            streams=decode.optional_positive_int("streams"),
        ),
        "config.decode",
    )
    split = decode.get("split")
    if split not in ("test", "validation"):
        raise ValueError(f"config.decode.split must be 'test' or 'validation', got {split!r}")
    final = FinalEvaluation(
        enabled=decode.boolean("enabled"),
        split=split,
        average_last=decode.positive_int("average_last"),
        num_samples=decode.non_negative_int("num_samples"),
        translate=translate,
    )
    if loop.keep_checkpoints < final.average_last:
        raise ValueError(
            f"config.keep_checkpoints ({loop.keep_checkpoints}) must be at least "
            f"config.decode.average_last ({final.average_last})"
        )
    spec = _valid(
        lambda: parse_spec(
            top.get("dataset"), top.get("source_language"), top.get("target_language")
        ),
        "config.dataset",
    )
    kernels_setting = _valid(lambda: implementation.check(top.get("kernels")), "config.kernels")
    encoding_errors = top.get("encoding_errors")
    if encoding_errors not in ("strict", "replace"):
        raise ValueError(
            f"config.encoding_errors must be 'strict' or 'replace', got {encoding_errors!r}"
        )
    job = JobConfig(
        kernels=kernels_setting,
        encoding_errors=encoding_errors,
        spec=spec,
        data_dir=pathlib.Path(top.get("data_dir")),
        vocab_size=vocab_size,
        batches=batches,
        grad_accum_steps=top.positive_int("grad_accum_steps"),
        train=train,
        model={k: v for k, v in dataclasses.asdict(model).items() if k != "vocab_size"},
        parallelism=parallelism,
        model_parallel=top.positive_int("model_parallel"),
        loop=loop,
        final=final,
    )
    unread = top.unread() + decode.unread()
    if unread:
        raise ValueError(f"{unread[0]} is not a key tfm knows; see configs/common.py")
    return job
