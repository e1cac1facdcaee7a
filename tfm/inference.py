"""Loading a trained model from a workdir (checkpoint, averaged checkpoints, vocabulary), and the
attention picture for one sentence."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tfm import checkpoint as ckpt
from tfm import decoding, viz
from tfm.config import ModelConfig
from tfm.data.tokenizer import Tokenizer
from tfm.model import Transformer
from tfm.tokens import BOS_ID, EOS_ID, PAD_ID

MODEL_CARD = "model.json"


class LoadError(RuntimeError):
    """A workdir whose checkpoint, model card or vocabulary cannot be used; says what to do."""


@dataclasses.dataclass
class Loaded:
    model: Transformer
    params: Any
    tokenizer: Tokenizer
    card: dict
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


def load(workdir: str | pathlib.Path, step: int | None = None, average: int | None = 5) -> Loaded:
    """The model of a train.py workdir with the parameters of checkpoint `step`, or the average
    of the last `average` checkpoints."""
    workdir = pathlib.Path(workdir)
    card_path = workdir / MODEL_CARD
    if not card_path.is_file():
        raise LoadError(f"{card_path}: missing; is {workdir} a directory that train.py wrote?")
    try:
        card = json.loads(card_path.read_text())
        model = Transformer(ModelConfig(**card["model"]))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise LoadError(f"{card_path}: unreadable model card ({error})") from None
    try:
        tokenizer = Tokenizer(card["vocabulary"])
    except (FileNotFoundError, ValueError) as error:
        raise LoadError(f"vocabulary for {workdir}: {error}") from None
    if tokenizer.vocab_size != model.config.vocab_size:
        raise LoadError(
            f"{card['vocabulary']} has {tokenizer.vocab_size} pieces but the model "
            f"expects {model.config.vocab_size}; the vocabulary was replaced"
        )
    try:
        if step is not None or not average or average <= 1:
            params, used = ckpt.Checkpointer(workdir, read_only=True).restore_params(step)
            description = f"checkpoint {used} from {workdir}"
        else:
            params, steps = ckpt.average_last(workdir, average)
            description = f"average of checkpoints {steps} from {workdir}"
    except ckpt.CheckpointError as error:
        raise LoadError(str(error)) from None
    _check_compatible(model, params, f"checkpoint in {workdir}")
    return Loaded(model, jax.device_put(params), tokenizer, card, description)


def attention_maps(
    model: Transformer, params, src: np.ndarray, tgt_in: np.ndarray
) -> dict[str, list[np.ndarray]]:
    """Every layer's attention weights `[heads, q, k]` for one sentence pair (teacher forced):
    keys "encoder self-attention", "decoder self-attention", "cross-attention"."""
    reference = model.clone(config=model.config.replace(attention="reference"))
    _, state = reference.apply({"params": params}, src, tgt_in, mutable=["intermediates"])
    intermediates = state["intermediates"]
    n = model.config.num_layers
    return {
        "encoder self-attention": [
            np.asarray(intermediates[f"encoder_{i}"]["self_attention"]["attention_weights"][0][0])
            for i in range(n)
        ],
        "decoder self-attention": [
            np.asarray(intermediates[f"decoder_{i}"]["self_attention"]["attention_weights"][0][0])
            for i in range(n)
        ],
        "cross-attention": [
            np.asarray(intermediates[f"decoder_{i}"]["cross_attention"]["attention_weights"][0][0])
            for i in range(n)
        ],
    }


def plot_attention(
    loaded: Loaded,
    sentence: str,
    output: str | pathlib.Path,
    beam_size: int = 4,
    alpha: float = 0.6,
) -> str:
    """Translate `sentence`, then draw encoder self-, decoder self- and cross-attention (layer x
    head grids, tokens on the axes) into `output`. Returns the translation."""
    ids = loaded.tokenizer.encode(sentence)[: loaded.model.config.max_len - 1] + [EOS_ID]
    src = np.array([ids], np.int32)
    if beam_size > 1:
        result = decoding.beam_search(
            loaded.model, loaded.params, src, beam_size=beam_size, alpha=alpha
        )
    else:
        result = decoding.greedy_search(loaded.model, loaded.params, src)
    out = [int(t) for t in np.asarray(result.ids[0])[: int(result.lengths[0])] if t != PAD_ID]
    tgt_in = np.array([[BOS_ID] + out[:-1] if out else [BOS_ID]], np.int32)
    maps = attention_maps(loaded.model, loaded.params, src, tgt_in)
    src_tokens = loaded.tokenizer.pieces(ids)
    tgt_tokens = ["<s>"] + loaded.tokenizer.pieces(out[:-1]) if out else ["<s>"]
    viz.plot_attention(maps, src_tokens, tgt_tokens, output)
    return loaded.tokenizer.decode(out)
