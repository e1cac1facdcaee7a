"""Exports (`python -m tfm.export`) compute what tfm computes: on a tiny trained workdir, greedy
output of tfm, the CTranslate2 export and the Hugging Face export are identical token for token,
teacher-forced log-probabilities agree to 1e-4, and the HF tokenizer's ids are tfm's. Models an
export cannot represent are refused."""

import dataclasses
import functools
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu

ctranslate2 = pytest.importorskip("ctranslate2")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.built_once import built_once  # noqa: E402
from tests.e2e_corpus import write_corpus  # noqa: E402
from tfm.config import ModelConfig  # noqa: E402
from tfm.export import ct2, hf  # noqa: E402
from tfm.export.__main__ import main as export_main  # noqa: E402
from tfm.export.weights import ExportError, check_exportable, from_tfm_params  # noqa: E402
from tfm.inference import translate  # noqa: E402
from tfm.inference.decoding import max_output_lengths  # noqa: E402
from tfm.job.workdir import load  # noqa: E402
from tfm.model import Transformer  # noqa: E402
from tfm.tokens import EOS_ID, PAD_ID  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
ODD_TEXT = [
    "%s of %d files",
    "Print\tpreview 🙂",
    "  two  spaces ",
    "naïve café — “quoted” «so»",
    "a\u00a0b\u2009c",
    "<b>bold</b> </s> <unk> <pad>",
    "{0} → {1}: 100%",
    "",
]


def _train(tmp: pathlib.Path) -> None:
    source, target = write_corpus(tmp / "corpus")
    workdir = tmp / "run"
    args = [
        sys.executable,
        str(ROOT / "train.py"),
        f"--workdir={workdir}",
        f"--config.dataset=text:{source},{target}",
        f"--config.data_dir={tmp / 'data'}",
        "--config.vocab_size=400",
        "--config.max_seq_len=24",
        "--config.batch_tokens=768",
        "--config.num_train_steps=300",
        "--config.warmup_steps=60",
        "--config.learning_rate_scale=0.5",
        "--config.checkpoint_every_steps=300",
        "--config.eval_every_steps=300",
        "--config.decode.enabled=False",
        "--config.decode.average_last=1",
        "--config.model.num_layers=2",
        "--config.model.d_model=64",
        "--config.model.d_ff=128",
        "--config.model.num_heads=4",
        "--config.model.d_k=16",
        "--config.model.d_v=16",
        "--config.model.dropout_rate=0.0",
    ]
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained for 300 steps on the synthetic corpus (copy BLEU ~0, learned ~60),
    once per session; exports go to a directory of this worker's own."""
    tmp = built_once(tmp_path_factory, "export-run", _train)
    sentences = (tmp / "corpus" / "train.en").read_text().splitlines()[:24]
    return tmp / "run", sentences, tmp_path_factory.mktemp("exports")


def _strip(ids) -> list[int]:
    """Output ids up to EOS; a row that ran to its length limit without one ends at its first
    padding."""
    ids = [int(i) for i in ids]
    end = ids.index(EOS_ID) if EOS_ID in ids else ids.index(PAD_ID) if PAD_ID in ids else None
    return ids[:end]


def _cut_to_tfms_limits(theirs, ours, sentences, tokenizer) -> list[list[int]]:
    """Their outputs, each cut to tfm's where tfm's ran to its length limit (source + EOS + 50
    tokens, section 6.1) without EOS: the peers stop at their own limit (80 tokens here), so a
    looping output is compared over the tokens both produced."""
    sources = [tokenizer.encode(sentence) + [EOS_ID] for sentence in sentences]
    src = np.full((len(sources), max(map(len, sources))), PAD_ID, np.int32)
    for row, ids in zip(src, sources, strict=True):
        row[: len(ids)] = ids
    limits = max_output_lengths(src, translate.TranslateConfig().extra_length).tolist()
    return [
        their[: len(our)] if len(our) == limit else their
        for their, our, limit in zip(theirs, ours, limits, strict=True)
    ]


def _tfm_greedy(loaded, sentences) -> list[list[int]]:
    config = translate.TranslateConfig(beam_size=1)
    encoded = translate.encode_sources(loaded.tokenizer, sentences, config)
    return [
        _strip(ids) for ids in translate.translate_ids(loaded.model, loaded.params, encoded, config)
    ]


def _tfm_log_probs(model, params, source: list[int], target: list[int]) -> np.ndarray:
    """log p(target + EOS | source + EOS), teacher-forced, one value per target token. Both
    sides are padded to 64 positions, or a multiple of 32 for an output at its length limit
    (padding is masked: the values are those of the unpadded pair), so that few compiled
    programs serve every sentence."""
    width = 32 * max(2, -(-(len(target) + 1) // 32))
    src = np.zeros((1, width), np.int32)
    src[0, : len(source) + 1] = source + [EOS_ID]
    tgt_in = np.zeros((1, width), np.int32)
    tgt_in[0, : len(target) + 1] = [1] + target
    log_probs = np.asarray(_log_softmax_logits(model, params, src, tgt_in))[0]
    return log_probs[np.arange(len(target) + 1), target + [EOS_ID]]


@functools.partial(jax.jit, static_argnums=0)
def _log_softmax_logits(model, params, src, tgt_in):
    return jax.nn.log_softmax(model.apply({"params": params}, src, tgt_in), axis=-1)


@pytest.mark.slow  # its fixture trains 300 steps (once per session)
def test_ct2_export_translates_and_scores_as_tfm(trained):
    workdir, sentences, tmp = trained
    out = tmp / "ct2"
    command = [sys.executable, "-m", "tfm.export", "ct2", str(workdir), str(out)]
    exported = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert exported.returncode == 0, exported.stderr[-3000:]
    provenance = json.loads((out / "tfm_export.json").read_text())
    assert provenance["parameters"].startswith("checkpoint 300")
    loaded = load(workdir, average=1)
    pieces = loaded.tokenizer.pieces(range(loaded.model.config.vocab_size))
    assert json.loads((out / "shared_vocabulary.json").read_text()) == pieces

    translator = ctranslate2.Translator(str(out), device="cpu", compute_type="float32")
    source_pieces = [loaded.tokenizer.pieces(loaded.tokenizer.encode(s)) for s in sentences]
    results = translator.translate_batch(source_pieces, beam_size=1, max_decoding_length=80)
    index = {piece: i for i, piece in enumerate(pieces)}
    theirs = [[index[p] for p in r.hypotheses[0]] for r in results]
    ours = _tfm_greedy(loaded, sentences)
    assert _cut_to_tfms_limits(theirs, ours, sentences, loaded.tokenizer) == ours
    text = [loaded.tokenizer.decode(ids) for ids in ours]
    assert sum(t == s for t, s in zip(text, sentences, strict=True)) == 0  # it translates

    scored = translator.score_batch(source_pieces, [loaded.tokenizer.pieces(t) for t in ours])
    for sentence, target, result in zip(sentences, ours, scored, strict=True):
        expected = _tfm_log_probs(
            loaded.model, loaded.params, loaded.tokenizer.encode(sentence), target
        )
        np.testing.assert_allclose(result.log_probs, expected, atol=1e-4)

    int8 = tmp / "ct2-int8"
    assert export_main(["ct2", str(workdir), str(int8), "--quantization", "int8"]) == 0
    assert (int8 / "model.bin").stat().st_size < 0.5 * (out / "model.bin").stat().st_size
    quantized = ctranslate2.Translator(str(int8), device="cpu", compute_type="int8")
    agree = quantized.translate_batch(source_pieces, beam_size=1, max_decoding_length=80)
    int8_ids = [[index[p] for p in r.hypotheses[0]] for r in agree]
    int8_ids = _cut_to_tfms_limits(int8_ids, ours, sentences, loaded.tokenizer)
    # int8 is an approximation: how many outputs stay identical depends on the CPU's int8
    # kernels, so what is held is their quality. Scored by the float model, the int8 outputs'
    # log-probability per token is within 0.3 nats of tfm's own greedy outputs', on average
    # over the sentences (a model decoding garbage scores several nats lower per token)
    gaps = []
    for sentence, target, approximate in zip(sentences, ours, int8_ids, strict=True):
        source = loaded.tokenizer.encode(sentence)
        best = _tfm_log_probs(loaded.model, loaded.params, source, target).mean()
        theirs = _tfm_log_probs(loaded.model, loaded.params, source, approximate).mean()
        gaps.append(best - theirs)
    assert np.mean(gaps) <= 0.3, gaps


@pytest.mark.slow  # its fixture trains 300 steps (once per session)
def test_hf_export_translates_scores_and_tokenizes_as_tfm(trained):
    workdir, sentences, tmp = trained
    out = tmp / "hf"
    assert export_main(["hf", str(workdir), str(out), "--max_positions", "128"]) == 0
    loaded = load(workdir, average=1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    for text in ODD_TEXT + sentences:
        assert tokenizer(text)["input_ids"] == loaded.tokenizer.encode(text) + [EOS_ID], text

    ours = _tfm_greedy(loaded, sentences)
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.inference_mode():
        generated = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=80)
    theirs = [_strip(row[1:]) for row in generated.tolist()]  # drop the decoder start token
    theirs = _cut_to_tfms_limits(theirs, ours, sentences, loaded.tokenizer)
    assert theirs == ours
    decoded = tokenizer.batch_decode(theirs, skip_special_tokens=True)
    assert decoded == [loaded.tokenizer.decode(ids) for ids in ours]
    longest = sorted(sentences, key=lambda s: len(loaded.tokenizer.encode(s)))[-4:]
    batch = tokenizer(longest, return_tensors="pt", padding=True)
    with torch.inference_mode():  # the export's defaults: beam 4, up to --max_positions tokens
        by_default = model.generate(**batch)
        beam4 = model.generate(**batch, num_beams=4, max_length=128)
    assert max(len(_strip(row[1:])) for row in beam4.tolist()) > 20
    assert by_default.tolist() == beam4.tolist()

    for sentence, target in zip(sentences, ours, strict=True):
        source = loaded.tokenizer.encode(sentence)
        with torch.inference_mode():
            logits = model(
                input_ids=torch.tensor([source + [EOS_ID]]),
                decoder_input_ids=torch.tensor([[1] + target]),
            ).logits[0]
        log_probs = torch.log_softmax(logits, dim=-1)[range(len(target) + 1), target + [EOS_ID]]
        expected = _tfm_log_probs(loaded.model, loaded.params, source, target)
        np.testing.assert_allclose(log_probs.numpy(), expected, atol=1e-4)


@pytest.mark.slow  # its fixture trains 300 steps (once per session)
def test_the_readme_recipes_translate_with_both_exports(trained, monkeypatch):
    from tests.test_readme import _python_blocks

    workdir, sentences, tmp = trained
    exported = tmp / "readme" / "exported"
    assert export_main(["ct2", str(workdir), str(exported / "ct2")]) == 0
    assert export_main(["hf", str(workdir), str(exported / "hf")]) == 0
    monkeypatch.chdir(tmp / "readme")
    recipes = _python_blocks("export")
    assert len(recipes) == 2
    loaded = load(workdir, average=1)
    greedy = [loaded.tokenizer.decode(ids) for ids in _tfm_greedy(loaded, sentences)]
    references = (workdir.parent / "corpus" / "train.de").read_text().splitlines()[: len(sentences)]
    greedy_bleu = sacrebleu.corpus_bleu(greedy, [references]).score
    assert greedy_bleu > 30  # the model has learned to translate
    for recipe in recipes:
        scope = {"lines": sentences}
        exec(compile(recipe, "docs/export.md", "exec"), scope)
        translations = scope["translations"]
        assert len(translations) == len(sentences) and all(translations)
        # beam 4, another length penalty (and int8 for CTranslate2): not tfm's greedy outputs
        # word for word, but translations as good
        bleu = sacrebleu.corpus_bleu(translations, [references]).score
        assert bleu >= 0.8 * greedy_bleu, (bleu, greedy_bleu)


def test_marian_permutation_turns_the_papers_sinusoids_into_marians():
    from tfm.export.weights import sinusoidal_table

    table = sinusoidal_table(50, 16)
    marian = transformers.MarianMTModel(
        hf.marian_config(ModelConfig(vocab_size=8, d_model=16, num_heads=2, d_k=8, d_v=8), 50)
    )
    np.testing.assert_allclose(
        table[:, hf.marian_permutation(16)],
        marian.model.encoder.embed_positions.weight.detach().numpy(),
        atol=1e-6,
    )


@pytest.mark.parametrize(
    "changes",
    [dict(norm="pre"), dict(positional="learned", max_positions=64)],
    ids=["pre-LN", "learned positions"],
)
def test_ct2_exports_pre_ln_and_learned_positions_exactly_and_hf_refuses_them(tmp_path, changes):
    config = ModelConfig(
        vocab_size=40, num_layers=2, d_model=32, d_ff=64, num_heads=4, d_k=8, d_v=8, **changes
    )
    model = Transformer(config)
    ids = jnp.ones((1, 4), jnp.int32)
    params = model.init(jax.random.key(0), ids, ids)["params"]
    weights = from_tfm_params(params, config, positions=64)
    pieces = ["<pad>", "<s>", "</s>", "<unk>"] + [f"p{i}" for i in range(4, 40)]
    spec = ct2.build_spec(config, weights, pieces)
    spec.optimize(quantization=None)
    spec.save(str(tmp_path))
    translator = ctranslate2.Translator(str(tmp_path), device="cpu")
    source, target = [5, 9, 17, 30, 4], [7, 7, 21, 33, 12, 8]
    (result,) = translator.score_batch([[pieces[i] for i in source]], [[pieces[i] for i in target]])
    np.testing.assert_allclose(
        result.log_probs, _tfm_log_probs(model, params, source, target), atol=1e-4
    )
    with pytest.raises(ExportError, match="MarianMTModel has only"):
        hf.build_model(config, weights, 64, 4)


def test_heads_narrower_than_d_model_over_h_are_refused_by_both():
    config = ModelConfig(vocab_size=40, d_model=64, num_heads=4, d_k=8, d_v=16)  # Table 3 row B
    for target in ("CTranslate2", "MarianMTModel"):
        with pytest.raises(ExportError, match="needs d_k = d_v = d_model / h"):
            check_exportable(config, target, pre_norm=True, learned=True)


def test_an_existing_output_directory_is_refused(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    assert export_main(["ct2", str(tmp_path / "run"), str(tmp_path / "out")]) == 2
    assert "exists; remove it" in capsys.readouterr().err


def test_numbers_that_name_no_checkpoint_are_refused_before_loading(tmp_path, capsys):
    """--average 0 used to mean 'what training scored' (0 is falsy); now every count is checked
    before the workdir is read (there is none here: a load would fail differently)."""
    for flag, value, least in (("--average", 0, 1), ("--step", -1, 0), ("--max_positions", 0, 1)):
        out = tmp_path / f"out{flag}"
        assert export_main(["hf", str(tmp_path / "run"), str(out), flag, str(value)]) == 2
        assert capsys.readouterr().err == f"error: {flag} must be at least {least}, got {value}\n"
        assert not out.exists()


def test_a_variant_field_no_exporter_names_is_refused_naming_it():
    """A ModelConfig field that is neither mapped as it is nor supported by the target is
    exported only at its default: a new variant is refused until an exporter represents it."""

    @dataclasses.dataclass(frozen=True)
    class WithVariant(ModelConfig):
        mixer: str = "attention"

    plain = WithVariant(vocab_size=40, d_model=64, num_heads=4, d_k=16, d_v=16)
    check_exportable(plain, "CTranslate2", pre_norm=True, learned=True)  # at its default
    changed = plain.replace(mixer="fourier")
    with pytest.raises(ExportError, match=r"ModelConfig.mixer='fourier'"):
        check_exportable(changed, "CTranslate2", pre_norm=True, learned=True)
    check_exportable(
        changed, "CTranslate2", pre_norm=True, learned=True, supported={"mixer": ("fourier",)}
    )


@pytest.mark.parametrize("activation", ["gelu", "swish"])
def test_an_ffn_activation_the_exports_do_not_map_yet_is_refused(activation):
    config = ModelConfig(vocab_size=40, d_model=64, num_heads=4, d_k=16, d_v=16)
    with pytest.raises(ExportError, match=f"ModelConfig.activation='{activation}'"):
        check_exportable(
            config.replace(activation=activation), "CTranslate2", pre_norm=True, learned=True
        )


def test_attention_biases_the_exports_do_not_map_yet_are_refused():
    config = ModelConfig(
        vocab_size=40, d_model=64, num_heads=4, d_k=16, d_v=16, attention_bias=True
    )
    for target in ("CTranslate2", "MarianMTModel"):
        with pytest.raises(ExportError, match="ModelConfig.attention_bias=True"):
            check_exportable(config, target, pre_norm=True, learned=True)


def test_rms_normalization_the_exports_do_not_map_yet_is_refused():
    config = ModelConfig(vocab_size=40, d_model=64, num_heads=4, d_k=16, d_v=16)
    for target in ("CTranslate2", "MarianMTModel"):
        with pytest.raises(ExportError, match="ModelConfig.normalization='rms'"):
            check_exportable(
                config.replace(normalization="rms"), target, pre_norm=True, learned=True
            )
