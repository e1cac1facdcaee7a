"""Beam search over a stream of sentences through a fixed batch of slots (continuous batching).

A batch of beam searches runs until its slowest sentence settles: on the main job's test split,
~44% of the sentence-steps went to sentences already finished. Here each of `rows` slots holds
one sentence; the step after a sentence settles, its slot takes the next waiting sentence, which
starts at step 0 while the others go on (each row at its own decoder position,
`Transformer.decode_step`). Waiting sentences arrive in blocks of `block` (encoded once per
block); a slot's result leaves with the call in which it settled.

Every sentence runs exactly the steps of its own beam search (section 6.1, `tfm.inference.search`),
so the results are those of `tfm.inference.decoding.beam_search`; only the work per step is better
spent. One compiled program per (rows, source length, block).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tfm import implementation
from tfm.cpu_host.backend_jit import DECODING_CPU_OPTIONS, cpu_tuned_jit
from tfm.inference.decoding import (
    encode_and_init_cache,
    longest_output,
    max_output_lengths,
    transformer_step_fn,
)
from tfm.inference.search import PAPER_ALPHA, PAPER_EXTRA_LENGTH, BeamState, beam_search_step
from tfm.model import Transformer
from tfm.tokens import EOS_ID, PAD_ID

Array = jax.Array


@struct.dataclass
class Slots:
    """`rows` beam searches, each at its own step.

    beams: the searches (`BeamState`); `done` is True for a settled sentence and an empty slot.
    steps: `[rows]` each sentence's next step (its next decoder position).
    max_lengths: `[rows]` most tokens each sentence may generate.
    incomplete: `[rows]` the sentence used every position allocated without settling.
    sentence: `[rows]` the caller's index of the sentence in each slot; -1 = empty.
    """

    beams: BeamState
    steps: Array
    max_lengths: Array
    incomplete: Array
    sentence: Array


@struct.dataclass
class Settled:
    """Sentences that left their slots during one call: the first `count` entries of each.

    sentence: `[capacity]` the caller's index; ids: `[capacity, max_steps]` best hypothesis;
    complete: `[capacity]` False where the sentence needs more positions (search it again).
    """

    sentence: Array
    ids: Array
    complete: Array
    count: Array


def empty_slots(
    model: Transformer, params, rows: int, src_len: int, beam_size: int, max_steps: int
) -> Slots:
    """`rows` empty slots for sources of `src_len` tokens, `max_steps` decoder positions.

    A slot is empty when its `sentence` is -1 and its search `done` (as `_release` leaves it);
    `_admit` sets every other field of a slot it fills, so they start as zeros. Built on the
    host from the traced shapes: built as JAX ops, a first run compiled them once per length
    bucket (~0.2 s each)."""
    leaves, treedef = jax.tree.flatten(params)
    params_signature = (treedef, tuple((leaf.shape, jnp.dtype(leaf.dtype)) for leaf in leaves))
    shapes = _slot_shapes(model, params_signature, rows, src_len, beam_size, max_steps)
    zeros = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), shapes)
    empty = zeros.replace(
        beams=zeros.beams.replace(done=np.ones((rows,), bool)),
        sentence=np.full((rows,), -1, np.int32),
    )
    return jax.device_put(empty)  # each leaf its own buffer: `stream` takes them over (donates)


@functools.lru_cache(maxsize=64)
def _slot_shapes(
    model: Transformer, params_signature, rows: int, src_len: int, beam_size: int, max_steps: int
) -> Slots:
    """The shapes and dtypes of `rows` slots (`jax.ShapeDtypeStruct` leaves), traced once per
    bucket and parameter shapes: traced per `search_stream` call, the encoder and cache set-up
    cost ~0.09 s of host time per length bucket and run, the device idle meanwhile (0.43 s of a
    6.4 s warm translation of the main job's test split)."""
    treedef, leaf_shapes = params_signature
    params = jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(*shape) for shape in leaf_shapes])
    src = jax.ShapeDtypeStruct((rows, src_len), jnp.int32)

    def slots_shape(params, src):
        cache = encode_and_init_cache(model, params, src, beam_size, max_steps)
        return Slots(
            beams=BeamState.start(cache, jnp.zeros((rows,), jnp.int32), beam_size, max_steps),
            steps=jnp.zeros((rows,), jnp.int32),
            max_lengths=jnp.zeros((rows,), jnp.int32),
            incomplete=jnp.zeros((rows,), bool),
            sentence=jnp.zeros((rows,), jnp.int32),
        )

    return jax.eval_shape(slots_shape, params, src)


def _step(step_fn, slots: Slots, alpha: float | Array, eos_id: int | None) -> Slots:
    """One beam-search step of every slot, each at its own position."""
    max_steps = slots.beams.alive_ids.shape[2]
    beams = beam_search_step(step_fn, slots.beams, slots.steps, slots.max_lengths, alpha, eos_id)
    # a sentence that used every position allocated stops there, marked incomplete
    out_of_steps = (slots.steps + 1 >= max_steps) & ~beams.done
    beams = beams.replace(done=beams.done | out_of_steps)
    return slots.replace(
        beams=beams,
        # a settled sentence stays at its last position (its further steps are discarded)
        steps=jnp.where(beams.done, slots.steps, slots.steps + 1),
        incomplete=slots.incomplete | out_of_steps,
    )


def _release(slots: Slots, settled: Settled) -> tuple[Slots, Settled]:
    """Move every settled sentence's best hypothesis out of its slot, which becomes empty."""
    leaving = slots.beams.done & (slots.sentence >= 0)  # [rows]
    order = settled.count + jnp.cumsum(leaving) - 1
    at = jnp.where(leaving, order, settled.sentence.shape[0])  # out of range: dropped
    settled = Settled(
        sentence=settled.sentence.at[at].set(slots.sentence, mode="drop"),
        ids=settled.ids.at[at].set(slots.beams.finished_ids[:, 0], mode="drop"),
        complete=settled.complete.at[at].set(~slots.incomplete, mode="drop"),
        count=settled.count + jnp.sum(leaving),
    )
    return slots.replace(sentence=jnp.where(leaving, -1, slots.sentence)), settled


@struct.dataclass
class Waiting:
    """A block of sentences waiting for slots, encoded: per layer `(cross_k, cross_v)`
    `[block, heads, src_len, d]`, `src_valid` `[block, src_len]`, `max_lengths` `[block]`,
    `sentence` `[block]` the caller's indices (-1 = padding, after every real one)."""

    cross: tuple[tuple[Array, Array], ...]
    src_valid: Array
    max_lengths: Array
    sentence: Array


def _encode_waiting(
    model: Transformer, params, src: Array, sentence: Array, extra_length: int
) -> Waiting:
    cache = encode_and_init_cache(model, params, src, 1, 1)  # its one-position self K/V unused
    return Waiting(
        cross=tuple((layer.cross_k, layer.cross_v) for layer in cache.layers),
        src_valid=cache.src_valid,
        max_lengths=max_output_lengths(src, extra_length, longest_output(model)),
        sentence=sentence,
    )


def _admit(slots: Slots, waiting: Waiting, next_waiting: Array) -> tuple[Slots, Array]:
    """Empty slots take the next waiting sentences in order, each starting at step 0."""
    free = slots.sentence < 0  # [rows]
    pick = next_waiting + jnp.cumsum(free) - 1  # the waiting sentence each free slot would take
    take = free & (pick < jnp.sum(waiting.sentence >= 0))
    pick = jnp.minimum(pick, waiting.sentence.shape[0] - 1)

    def where_taken(now: Array, new: Array) -> Array:
        return jnp.where(take.reshape((-1,) + (1,) * (now.ndim - 1)), new, now)

    def from_waiting(now: Array, block: Array) -> Array:
        return where_taken(now, block[pick])

    old = slots.beams
    max_lengths = from_waiting(slots.max_lengths, waiting.max_lengths)
    fresh = BeamState.start(None, max_lengths, *old.alive_ids.shape[1:])
    # self-attention K/V need no reset: positions a sentence has not written are masked out
    layers = tuple(
        layer.replace(
            cross_k=from_waiting(layer.cross_k, k), cross_v=from_waiting(layer.cross_v, v)
        )
        for layer, (k, v) in zip(old.cache.layers, waiting.cross, strict=True)
    )
    cache = old.cache.replace(
        layers=layers, src_valid=from_waiting(old.cache.src_valid, waiting.src_valid)
    )
    beams = fresh.replace(
        cache=cache,
        **{
            name: where_taken(getattr(old, name), getattr(fresh, name))
            for name in (
                "alive_ids",
                "alive_log_probs",
                "finished_ids",
                "finished_scores",
                "finished_lengths",
                "done",
            )
        },
    )
    slots = Slots(
        beams=beams,
        steps=where_taken(slots.steps, jnp.zeros_like(slots.steps)),
        max_lengths=max_lengths,
        incomplete=slots.incomplete & ~take,
        sentence=from_waiting(slots.sentence, waiting.sentence),
    )
    return slots, next_waiting + jnp.sum(take)


# Two steps per loop iteration: the cache reorder's gathers then write the loop's buffers in
# place every other step, where one step per iteration copies each gathered array into them
# (main job's test split, interleaved in one process: 6.15-6.57 -> 5.73-6.15 s warm).
_STEPS_PER_ITERATION = 2


@cpu_tuned_jit(
    DECODING_CPU_OPTIONS,
    static_argnames=("model", "eos_id", "extra_length"),
    donate_argnums=2,
)
def stream(
    model: Transformer,
    params,
    slots: Slots,
    src: Array,
    sentence: Array,
    run_to_end: Array,
    *,
    alpha: float | Array,
    eos_id: int | None,
    extra_length: int,
) -> tuple[Slots, Settled]:
    """Feed a block of `[block, src_len]` sources (their indices `sentence`, -1 for padding rows)
    through the slots, a step at a time, each free slot taking the next waiting sentence. Stops
    once the whole block has a slot, or with `run_to_end`, once every slot is empty (checked
    every `_STEPS_PER_ITERATION` steps: a step more changes no sentence's search). Returns the
    slots (still running sentences) and the sentences that settled meanwhile."""
    settings = dict(alpha=alpha, eos_id=eos_id, extra_length=extra_length)
    run = functools.partial(_stream, **settings)
    return implementation.per_platform(run, model, params, slots, src, sentence, run_to_end)


def _stream(
    model: Transformer,
    params,
    slots: Slots,
    src: Array,
    sentence: Array,
    run_to_end: Array,
    *,
    alpha: float | Array,
    eos_id: int | None,
    extra_length: int,
) -> tuple[Slots, Settled]:
    step_fn = transformer_step_fn(model, params)
    waiting = _encode_waiting(model, params, src, sentence, extra_length)
    queued = jnp.sum(sentence >= 0)
    capacity = slots.sentence.shape[0] + sentence.shape[0]
    settled = Settled(
        sentence=jnp.full((capacity,), -1, jnp.int32),
        ids=jnp.full((capacity, slots.beams.alive_ids.shape[2]), PAD_ID, jnp.int32),
        complete=jnp.zeros((capacity,), bool),
        count=jnp.int32(0),
    )

    def one_step(carry):
        slots, next_waiting, settled = carry
        slots, next_waiting = jax.lax.cond(
            jnp.any(slots.sentence < 0) & (next_waiting < queued),
            _admit,
            lambda slots, waiting, next_waiting: (slots, next_waiting),
            slots,
            waiting,
            next_waiting,
        )
        slots, settled = _release(_step(step_fn, slots, alpha, eos_id), settled)
        return slots, next_waiting, settled

    def keep_going(carry) -> Array:
        slots, next_waiting, _ = carry
        return (next_waiting < queued) | (run_to_end & jnp.any(slots.sentence >= 0))

    # traced once, called twice: a first run with a previous run's compilation cache still
    # traces every bucket's program (0.61-0.90 -> 0.38-0.58 s each); once XLA inlines the
    # call, the compiled program has the same fusions, dots and gathers
    step_once = jax.jit(one_step)

    def body(carry):
        for _ in range(_STEPS_PER_ITERATION):  # each step admits, steps and releases
            carry = step_once(carry)
        return carry

    slots, _, settled = jax.lax.while_loop(keep_going, body, (slots, jnp.int32(0), settled))
    return slots, settled


class StreamSettings(NamedTuple):
    """What `stream` is called with, besides the model: all but `alpha` (traced) fix its
    compiled program."""

    rows: int
    src_len: int
    max_steps: int
    block: int
    beam_size: int
    alpha: float = PAPER_ALPHA
    extra_length: int = PAPER_EXTRA_LENGTH
    eos_id: int | None = EOS_ID


def _run_block(
    model, params, slots, src, sentence, run_to_end: bool, settings: StreamSettings, program=None
):
    """`stream` (or `program`, e.g. `stream.lower`), called the same way by `search_stream`,
    `compile_ahead` and `lowered`."""
    return (program or stream)(
        model,
        params,
        slots,
        src,
        sentence,
        np.bool_(run_to_end),
        alpha=settings.alpha,
        eos_id=settings.eos_id,
        extra_length=settings.extra_length,
    )


def _on_an_empty_block(model: Transformer, params, settings: StreamSettings, program=None):
    """`_run_block` on empty slots and a block of padding: the program finishes at once."""
    slots = empty_slots(
        model, params, settings.rows, settings.src_len, settings.beam_size, settings.max_steps
    )
    src = np.zeros((settings.block, settings.src_len), np.int32)
    sentence = np.full((settings.block,), -1, np.int32)
    return _run_block(model, params, slots, src, sentence, True, settings, program)


def compile_ahead(model: Transformer, params, settings: StreamSettings) -> None:
    """Compile `search_stream`'s program for `settings` into jit's cache (running it)."""
    jax.block_until_ready(_on_an_empty_block(model, params, settings))


def lowered(model: Transformer, params, settings: StreamSettings) -> jax.stages.Lowered:
    """`search_stream`'s program for `settings`, lowered (to read its compiled HLO)."""
    return _on_an_empty_block(model, params, settings, program=stream.lower)


def search_stream(
    model: Transformer,
    params,
    sources: Sequence[np.ndarray],
    settings: StreamSettings,
    progress: Callable[[int], None] | None = None,
) -> tuple[dict[int, np.ndarray], list[int]]:
    """Beam-search each of `sources` (ids ending with EOS, at most `settings.src_len` long)
    through `settings.rows` slots of `settings.max_steps` positions. Returns each source's best
    hypothesis `[max_steps]` by index, and the indices of those that needed more positions
    (search them again with more). `progress(n)` hears of the n sources that left their slots
    after each block."""
    if settings.beam_size < 2:
        raise ValueError(
            f"search_stream is beam search: beam_size must be >= 2, got {settings.beam_size}"
        )
    found: dict[int, np.ndarray] = {}
    needs_more: list[int] = []

    def collect(settled: Settled) -> None:
        # whole arrays to the host, cut there: a slice per count would be a program per count
        sentence, ids, complete, count = jax.device_get(
            (settled.sentence, settled.ids, settled.complete, settled.count)
        )
        for i, row, ok in zip(
            sentence[:count].tolist(), ids[:count], complete[:count], strict=True
        ):
            if ok:
                found[i] = row
            else:
                needs_more.append(i)
        if progress is not None:
            progress(int(count))

    slots = empty_slots(
        model, params, settings.rows, settings.src_len, settings.beam_size, settings.max_steps
    )
    pending = None
    for start in range(0, len(sources), settings.block):
        block = sources[start : start + settings.block]
        src = np.zeros((settings.block, settings.src_len), np.int32)
        sentence = np.full((settings.block,), -1, np.int32)
        for r, ids in enumerate(block):
            src[r, : len(ids)] = ids
            sentence[r] = start + r
        last = start + settings.block >= len(sources)
        slots, settled = _run_block(model, params, slots, src, sentence, last, settings)
        if pending is not None:  # the previous block's results, read while this block runs
            collect(pending)
        pending = settled
    if pending is not None:
        collect(pending)
    return found, needs_more
