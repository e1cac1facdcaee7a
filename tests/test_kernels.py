"""tfm.implementation: the reference (Flax's and JAX's own ops) and the XLA:CPU kit are one
function.

Both settings are forced on this CPU host ("reference" and "xla_cpu"), over a covering set of the
model's variants (every pair of post/pre-LN x float32/bfloat16 x sinusoidal/learned positions x
packed rows x remat x gradient accumulation appears in some case): the same parameter tree, the
same loss and gradients, the same dropout masks, the same greedy and beam-4 ids; a checkpoint
written by one continues under the other. "auto" is checked where it differs: forward-mode
autodiff with "reference", `precision`, and the programs exported for other platforms.
"""

import collections
import functools
import itertools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import largest_difference, tiny_model_config
from tfm import Transformer, implementation, training
from tfm.inference import decoding
from tfm.job import checkpoint as ckpt

# (norm, dtype, positional, packed, remat, micro-batches): every pair of values of any two
# columns occurs in at least one row (checked below)
CASES = [
    ("post", "float32", "sinusoidal", False, False, 1),
    ("post", "bfloat16", "learned", True, True, 2),
    ("pre", "float32", "sinusoidal", False, True, 2),
    ("pre", "bfloat16", "learned", True, False, 1),
    ("post", "bfloat16", "sinusoidal", True, True, 1),
    ("pre", "float32", "learned", True, False, 2),
    ("pre", "bfloat16", "learned", False, True, 2),
]
# float32: the kit's forms round differently from autodiff's by a few ulps; bfloat16
# activations round every product to 8 bits, so two equal functions differ by their last bit
LOSS_RTOL = {"float32": 1e-6, "bfloat16": 1e-2}
GRAD_ATOL = {"float32": 1e-5, "bfloat16": 2e-2}


def test_the_cases_cover_every_pair_of_variants():
    columns = list(zip(*CASES, strict=True))
    for a, b in itertools.combinations(range(len(columns)), 2):
        wanted = set(itertools.product(set(columns[a]), set(columns[b])))
        assert wanted <= {(row[a], row[b]) for row in CASES}, (a, b)


def _batch(packed: bool, micro: int) -> dict:
    rng = np.random.default_rng(0)
    rows, length = 4, 10
    src = rng.integers(3, 40, (rows, length)).astype(np.int32)
    tgt = rng.integers(3, 40, (rows, length + 1)).astype(np.int32)
    batch = dict(src=src, tgt_in=tgt[:, :-1].copy(), tgt_out=tgt[:, 1:].copy())
    batch["tgt_in"][:, 0] = 1
    if packed:  # two pairs per row, the second shorter, then padding
        segments = np.array([1] * 6 + [2] * 3 + [0])
        positions = np.array(list(range(6)) + list(range(3)) + [0])
        for key in ("src", "tgt_in", "tgt_out"):
            batch[key][:, -1] = 0
        batch.update(
            src_segments=np.tile(segments, (rows, 1)),
            tgt_segments=np.tile(segments, (rows, 1)),
            src_positions=np.tile(positions, (rows, 1)),
            tgt_positions=np.tile(positions, (rows, 1)),
        )
    else:  # trailing padding of different lengths
        for row, length_used in enumerate((10, 7, 4, 9)):
            for key in ("src", "tgt_in", "tgt_out"):
                batch[key][row, length_used:] = 0
    batch = {k: jnp.asarray(v, jnp.int32) for k, v in batch.items()}
    if micro > 1:
        batch = {k: v.reshape(micro, rows // micro, *v.shape[1:]) for k, v in batch.items()}
    return batch


def _config(norm, dtype, positional, remat):
    return tiny_model_config(
        norm=norm, dtype=dtype, positional=positional, remat=remat, dropout_rate=0.1
    )


@functools.partial(jax.jit, static_argnames=("model",))
def _grads_and_terms(model, params, batch, rng):
    return training._accumulated_gradients(model, params, batch, rng, smoothing=0.1)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_reference_and_kit_train_the_same(case):
    norm, dtype, positional, packed, remat, micro = case
    config = _config(norm, dtype, positional, remat)
    batch = _batch(packed, micro)
    first = batch["src"][0] if micro > 1 else batch["src"]
    inputs = jnp.ones_like(first[:1])
    models = {k: Transformer(config, kernels=k) for k in ("reference", "xla_cpu")}
    params = {k: m.init(jax.random.key(0), inputs, inputs)["params"] for k, m in models.items()}
    assert jax.tree.structure(params["reference"]) == jax.tree.structure(params["xla_cpu"])
    assert jax.tree.all(jax.tree.map(np.array_equal, params["reference"], params["xla_cpu"]))

    rng = jax.random.key(7)
    results = {k: _grads_and_terms(m, params["reference"], batch, rng) for k, m in models.items()}
    (ref_grads, ref_terms), (kit_grads, kit_terms) = results["reference"], results["xla_cpu"]
    assert float(ref_terms["tokens"]) == float(kit_terms["tokens"]) > 0
    for term in ("loss", "nll"):
        np.testing.assert_allclose(kit_terms[term], ref_terms[term], rtol=LOSS_RTOL[dtype])
    tokens = float(ref_terms["tokens"])  # per-token gradients, as train_step applies them
    for path, ref, kit in zip(
        jax.tree_util.tree_leaves_with_path(ref_grads),
        jax.tree.leaves(ref_grads),
        jax.tree.leaves(kit_grads),
        strict=True,
    ):
        np.testing.assert_allclose(
            np.asarray(kit, np.float32) / tokens,
            np.asarray(ref, np.float32) / tokens,
            atol=GRAD_ATOL[dtype],
            err_msg=jax.tree_util.keystr(path[0]),
        )


def _dropout_outputs(model, params, src, tgt):
    """Every dropout module's output, by module path, from one training-mode forward pass."""
    _, state = model.apply(
        {"params": params},
        src,
        tgt,
        deterministic=False,
        rngs={"dropout": jax.random.key(3)},
        capture_intermediates=lambda module, method: (
            "Dropout" in type(module).__name__ or "dropout" in (module.name or "")
        ),
        mutable=["intermediates"],
    )
    flat = jax.tree_util.tree_leaves_with_path(state["intermediates"])
    return {
        jax.tree_util.keystr(path): np.asarray(value)
        for path, value in flat
        if "__call__" in jax.tree_util.keystr(path)  # not the sown attention weights
    }


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_same_dropout_masks(dtype):
    config = _config("post", dtype, "sinusoidal", False)
    batch = _batch(False, 1)
    src, tgt = batch["src"], batch["tgt_in"]
    models = {k: Transformer(config, kernels=k) for k in ("reference", "xla_cpu", "auto")}
    params = models["reference"].init(jax.random.key(0), src, tgt)["params"]
    outputs = {k: _dropout_outputs(m, params, src, tgt) for k, m in models.items()}
    # embeddings, and 2 + 3 residual dropouts per encoder / decoder layer
    assert len(outputs["reference"]) == 2 + 2 * 2 + 2 * 3
    for kernels_setting in ("xla_cpu", "auto"):
        assert outputs[kernels_setting].keys() == outputs["reference"].keys()
        for name, reference in outputs["reference"].items():
            got = outputs[kernels_setting][name]
            np.testing.assert_array_equal(got == 0, reference == 0, err_msg=name)
            assert 0.02 < np.mean(reference == 0) < 0.3, name  # rate 0.1, really applied


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_same_greedy_and_beam_4_ids(dtype):
    config = _config("pre", dtype, "sinusoidal", False)
    src = _batch(False, 1)["src"]
    models = {k: Transformer(config, kernels=k) for k in ("reference", "xla_cpu", "auto")}
    params = models["reference"].init(jax.random.key(1), src, src)["params"]
    found = {}
    for name, model in models.items():
        greedy = decoding.greedy_search(model, params, src, eos_id=None, extra_length=6)
        beam = decoding.beam_search(model, params, src, beam_size=4, eos_id=None, extra_length=6)
        found[name] = (np.asarray(greedy.ids), np.asarray(beam.ids))
    for name in ("xla_cpu", "auto"):
        np.testing.assert_array_equal(found[name][0], found["reference"][0])
        np.testing.assert_array_equal(found[name][1], found["reference"][1])
    assert len(np.unique(found["reference"][1])) > 3  # varied ids, not one token repeated


def test_a_checkpoint_written_under_one_setting_continues_under_the_other(tmp_path):
    config = _config("post", "float32", "sinusoidal", False)
    batch = _batch(False, 1)
    optimizer = training.make_optimizer(training.TrainConfig(warmup_steps=10), config.d_model)

    def step_fn(kernels_setting):
        model = Transformer(config, kernels=kernels_setting)
        return jax.jit(
            functools.partial(training.train_step, model=model, optimizer=optimizer, smoothing=0.1)
        )

    kit_model = Transformer(config, kernels="xla_cpu")
    state = training.init_train_state(kit_model, optimizer, jax.random.PRNGKey(0), batch)
    for _ in range(2):
        state, _ = step_fn("xla_cpu")(state, batch)
    saver = ckpt.Checkpointer(tmp_path, keep=2)
    saver.save(2, state)
    saver.close()
    reference_model = Transformer(config, kernels="reference")
    target = jax.eval_shape(
        lambda: training.init_train_state(reference_model, optimizer, jax.random.PRNGKey(0), batch)
    )
    restored, _, _, step = ckpt.Checkpointer(tmp_path, read_only=True).restore(target)
    assert step == 2
    for saved, read in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        np.testing.assert_array_equal(read, saved)  # params, Adam moments and step, exactly
    on_reference, metrics_reference = step_fn("reference")(restored, batch)
    on_kit, metrics_kit = step_fn("xla_cpu")(state, batch)
    assert int(on_reference.step) == int(on_kit.step) == 3
    np.testing.assert_allclose(metrics_reference["loss"], metrics_kit["loss"], rtol=1e-6)
    # The two settings round differently, and how much depends on the CPU's code generation
    # (~1e-6 after this step on an AVX-512 host): bound the difference by the step's own size,
    # which a wrongly restored moment or step count would change by its whole order.
    step_size = largest_difference(on_kit.params, state.params)
    assert step_size > 1e-4
    for ref, kit in zip(
        jax.tree.leaves(on_reference.params), jax.tree.leaves(on_kit.params), strict=True
    ):
        np.testing.assert_allclose(ref, kit, rtol=0, atol=1e-3 * step_size)


def test_forward_mode_autodiff_through_the_reference_model():
    config = _config("post", "float32", "sinusoidal", False)
    src = _batch(False, 1)["src"]
    model = Transformer(config, kernels="reference")
    params = model.init(jax.random.key(0), src, src)["params"]
    direction = jax.tree.map(
        lambda p: jax.random.normal(jax.random.key(p.size), p.shape, p.dtype), params
    )

    def logits(p):
        return model.apply({"params": p}, src, src)

    value, tangent = jax.jvp(logits, (params,), (direction,))
    # <J d, c> = <d, J^T c> for any cotangent c: forward and reverse mode agree
    cotangent = jax.random.normal(jax.random.key(5), value.shape)
    _, pullback = jax.vjp(logits, params)
    (reverse,) = pullback(cotangent)
    forward_side = float(jnp.vdot(tangent, cotangent))
    reverse_side = float(
        sum(
            jnp.vdot(d, r)
            for d, r in zip(jax.tree.leaves(direction), jax.tree.leaves(reverse), strict=True)
        )
    )
    assert abs(forward_side) > 1.0
    np.testing.assert_allclose(forward_side, reverse_side, rtol=1e-4)


@pytest.mark.parametrize("kernels_setting", ["reference", "xla_cpu", "auto"])
def test_the_dense_layers_take_a_precision(kernels_setting):
    config = _config("post", "float32", "sinusoidal", False)
    src = _batch(False, 1)["src"]
    plain = Transformer(config, kernels=kernels_setting)
    exact = Transformer(config, kernels=kernels_setting, precision=jax.lax.Precision.HIGHEST)
    params = plain.init(jax.random.key(0), src, src)["params"]
    lowered = jax.jit(lambda p: exact.apply({"params": p}, src, src)).lower(params).as_text()
    assert "HIGHEST" in lowered
    np.testing.assert_allclose(
        exact.apply({"params": params}, src, src),
        plain.apply({"params": params}, src, src),
        atol=1e-4,
    )


def test_an_unknown_setting_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="kernels must be one of auto, reference, xla_cpu"):
        Transformer(tiny_model_config(), kernels="cuda").init(
            jax.random.key(0), jnp.ones((1, 2), jnp.int32), jnp.ones((1, 2), jnp.int32)
        )
    assert implementation.resolve("reference").LayerNorm is nn.LayerNorm
    assert implementation.resolve("reference").Dropout is nn.Dropout
    assert implementation.resolve("reference").relu is jax.nn.relu


# what only wraps or calls code, not what it computes: "auto" adds a one-branch case around a
# step's body (chosen when the program is lowered: its index is a constant), whose calls stay
# outlined
_STRUCTURE = {
    "func.call",
    "func.func",
    "func.return",
    "stablehlo.return",
    "stablehlo.case",
    "stablehlo.constant",
}


def _exported_programs(kernels_setting: str) -> dict:
    """The train step, eval step and beam search of a tiny model, jitted for `jax.export`, with
    abstract arguments (a typed dropout key, as the kit's Threefry expects)."""
    config = tiny_model_config(dropout_rate=0.1)
    model = Transformer(config, kernels=kernels_setting)
    batch = {k: jax.ShapeDtypeStruct((4, 10), jnp.int32) for k in ("src", "tgt_in", "tgt_out")}
    optimizer = training.make_optimizer(training.TrainConfig(), config.d_model)
    example = {k: jnp.ones(v.shape, v.dtype) for k, v in batch.items()}
    state = jax.eval_shape(
        lambda: training.init_train_state(model, optimizer, jax.random.key(0), example)
    )
    train = functools.partial(training.train_step, model=model, optimizer=optimizer, smoothing=0.1)
    evaluate = functools.partial(training.eval_step, model=model, smoothing=0.1)
    return {
        "train_step": (jax.jit(train), (state, batch)),
        "eval_step": (jax.jit(evaluate), (state.params, batch)),
        "beam_search": (
            jax.jit(lambda p, src: decoding.beam_search(model, p, src, beam_size=4)),
            (state.params, batch["src"]),
        ),
    }


def exported_op_counts(kernels_setting: str, platform: str) -> dict[str, collections.Counter]:
    """Each program's StableHLO ops (name -> count) as `jax.export` writes it for `platform`."""
    counts = {}
    for name, (jitted, args) in _exported_programs(kernels_setting).items():
        text = jax.export.export(jitted, platforms=[platform])(*args).mlir_module()
        ops = collections.Counter(re.findall(r"\b((?:stablehlo|chlo|func)\.\w+)", text))
        ops["uint8 values"] = len(re.findall(r"\bui8\b", text))
        counts[name] = ops
    return counts


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_auto_exports_for_another_platform_hold_none_of_the_kit(platform):
    """Exported on this CPU-only host for a GPU or TPU, "auto" programs compute with exactly the
    reference's ops (no packed uint8 signs, no unrolled Threefry rounds, no custom gradients);
    the same export with "xla_cpu" does carry the kit, so the comparison can tell."""
    auto = exported_op_counts("auto", platform)
    reference = exported_op_counts("reference", platform)
    kit = exported_op_counts("xla_cpu", platform)
    for name in ("train_step", "eval_step", "beam_search"):
        computing = {op: n for op, n in auto[name].items() if op not in _STRUCTURE}
        expected = {op: n for op, n in reference[name].items() if op not in _STRUCTURE}
        assert computing == expected, name
        extra_constants = auto[name]["stablehlo.constant"] - reference[name]["stablehlo.constant"]
        assert 0 <= extra_constants <= auto[name]["stablehlo.case"], name  # the case indices
        assert auto[name]["uint8 values"] == 0
    assert kit["train_step"]["uint8 values"] > 0  # the packed ReLU signs
    # the unrolled Threefry: 20 rounds of shifts per dropout site, beyond JAX's own draws
    shifts = "stablehlo.shift_left"
    assert kit["train_step"][shifts] > reference["train_step"][shifts] + 20
