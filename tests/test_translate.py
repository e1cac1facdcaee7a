"""tfm.inference.translate: every translated sentence fits the model's positions, and the held-out
split that the final evaluation scores is the configured one."""

import sys

import jax
import numpy as np
import pytest

from tests.conftest import fresh_model_config, tiny_model_config
from tfm import Transformer
from tfm.inference import decoding, translate


class WordTokenizer:
    """Each word of a fixed list is one id (4, 5, ...); enough to drive translate()."""

    def __init__(self, words):
        self.ids = {w: i + 4 for i, w in enumerate(words)}
        self.words = {i: w for w, i in self.ids.items()}

    def encode(self, text):
        return [self.ids[w] for w in text.split()]

    def decode(self, ids):
        out = []
        for token in np.asarray(ids).tolist():
            if token == 2:
                break
            if token > 3:
                out.append(self.words.get(token, "?"))
        return " ".join(out)

    def pieces(self, ids):
        return [self.words.get(int(i), "<s>") for i in ids]


def test_a_learned_position_table_bounds_sources_and_translations():
    """A learned table of 64 positions (Table 3 row E) is never read past position 63: sources
    up to 64 tokens are accepted whole, and translations stop at 64 tokens (`init_cache` refuses
    a longer cache, so a search that needed more would fail here)."""
    config = tiny_model_config(40, positional="learned", max_positions=64)
    model = Transformer(config)
    src = np.ones((1, 4), np.int32)
    params = model.init(jax.random.key(0), src, src)["params"]
    tokenizer = WordTokenizer([f"w{i}" for i in range(36)])
    assert translate.max_source_len_for(config) == 64
    assert decoding.longest_output(model) == 64
    # 64, 41 and 6 tokens with EOS
    sources = [" ".join(f"w{i % 36}" for i in range(n)) for n in (63, 40, 5)]
    accepting = translate.TranslateConfig(max_source_len=64)
    ids = translate.encode_sources(tokenizer, sources, accepting)
    outputs = translate.translate_ids(
        model, params, ids, translate.TranslateConfig(max_source_len=64, beam_size=2)
    )
    assert len(outputs) == 3
    assert all(len(out) <= 64 for out in outputs)
    # an untrained model seldom stops: the long sources' outputs run to the cap, not past it
    longest = np.asarray([ids[0] + [2]])
    greedy = decoding.greedy_search(model, params, longest, eos_id=None)
    assert greedy.ids.shape[1] == 64 and bool(greedy.complete.all())
    assert int(greedy.lengths[0]) == 64


def test_sinusoids_bound_the_source_by_max_positions_only():
    config = tiny_model_config(40, max_positions=64)
    assert translate.max_source_len_for(config) == 64


def test_table3_configs_score_the_validation_split():
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from configs import default, table3
    from tfm.job.config import job_config_from

    assert job_config_from(table3.get_config("E")).final.split == "validation"
    assert job_config_from(default.get_config()).final.split == "test"


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_batch_that_needs_every_position_is_searched_again_with_all_of_them(beam_size):
    """translate first decodes in fewer positions than the longest allowed output; an untrained
    model rarely emits EOS, so its outputs run to the limit (source + 50) and must come out as
    the search over every position gives them."""
    config = tiny_model_config(40)
    model = Transformer(config)
    src = np.array([[5, 6, 7, 2], [8, 9, 2, 0]], np.int32)
    params = model.init(jax.random.key(3), src, src)["params"]
    settings = translate.TranslateConfig(beam_size=beam_size)
    assert translate.first_try_steps(src.shape[1]) < src.shape[1] + settings.extra_length
    full = translate.run_search(model, params, src, settings)
    assert np.asarray(full.lengths).max() > translate.first_try_steps(src.shape[1])
    searched = translate.search_batch(model, params, src, settings)
    np.testing.assert_array_equal(searched.ids, full.ids)
    np.testing.assert_array_equal(searched.lengths, full.lengths)
    # the same through translate_ids (beam search: streamed through slots, then searched again)
    left = []
    outputs = translate.translate_ids(
        model, params, [[5, 6, 7], [8, 9]], settings, progress=left.append
    )
    assert sum(left) == 2  # progress hears of each sentence once
    for row, length in enumerate(np.asarray(full.lengths)):
        np.testing.assert_array_equal(outputs[row][:length], np.asarray(full.ids)[row, :length])
        assert not outputs[row][length:].any()  # padding after the hypothesis


@pytest.mark.parametrize("beam_size", [1, 2])
def test_translations_do_not_depend_on_the_batch_size(beam_size, monkeypatch):
    """The default batch (None: sized for the backend) and any other, and any number of streams
    side by side, give the same outputs: filler rows, batch boundaries and the sentences that
    share a stream (beam search) or run beside each other in batches (greedy) never leak into a
    sentence's search."""
    from tfm.cpu_host import side_by_side

    jobs_at_once = []
    original = side_by_side.run_side_by_side

    def recording(jobs):
        jobs_at_once.append(len(jobs))
        return original(jobs)

    monkeypatch.setattr(side_by_side, "run_side_by_side", recording)
    config = tiny_model_config(40)
    model = Transformer(config)
    src = np.ones((1, 4), np.int32)
    params = model.init(jax.random.key(5), src, src)["params"]
    words = [f"w{i}" for i in range(36)]
    tokenizer = WordTokenizer(words)
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, rng.integers(1, 20))) for _ in range(23)] + [""]
    outputs = {
        (batch_tokens, streams): translate.translate(
            model,
            params,
            tokenizer,
            texts,
            translate.TranslateConfig(
                beam_size=beam_size, extra_length=6, batch_tokens=batch_tokens, streams=streams
            ),
        )
        for batch_tokens, streams in ((None, None), (32, 1), (4096, 1), (32, 2), (32, 3))
    }
    assert len({tuple(out) for out in outputs.values()}) == 1, outputs
    assert max(jobs_at_once) == 3  # the 3 streams or 3 batches of a bucket did run side by side
    assert outputs[None, None][-1] == ""
    assert outputs[32, 1] != [""] * len(texts)  # the model emits words: a real comparison


def test_the_default_batch_is_read_from_the_config_or_sized_for_the_backend():
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from configs import default
    from tfm.job.config import job_config_from

    config = default.get_config()
    assert job_config_from(config).final.translate.batch_tokens is None
    assert translate.default_batch_tokens("cpu") < translate.default_batch_tokens("gpu")
    config.decode.batch_tokens = 2048
    assert job_config_from(config).final.translate.batch_tokens == 2048
    config.decode.batch_tokens = 0
    with pytest.raises(ValueError, match="config.decode.batch_tokens must be a positive integer"):
        job_config_from(config)
    assert job_config_from(default.get_config()).final.translate.streams is None
    config = default.get_config()
    config.decode.streams = 0
    with pytest.raises(ValueError, match="config.decode.streams must be a positive integer"):
        job_config_from(config)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_each_batch_shape_is_compiled_ahead_once(beam_size, monkeypatch):
    """translate compiles a bucket's search program(s) on its background thread before that
    bucket's first batch, into jit's own cache, which the batches then use: one program per
    shape (beam search: `tfm.inference.slots.stream`)."""
    from tfm.inference import decoding, slots

    config = fresh_model_config(37)  # a model no other test compiles for
    model = Transformer(config)
    params = model.init(jax.random.key(7), np.ones((1, 4), np.int32), np.ones((1, 4), np.int32))
    tokenizer = WordTokenizer([f"w{i}" for i in range(33)])
    lines = [" ".join(f"w{j}" for j in range(n)) for n in (3, 5, 9, 12, 4)]  # buckets 8 and 16
    # outputs of at most source + 2 tokens always fit the first try: no second program
    settings = translate.TranslateConfig(beam_size=beam_size, extra_length=2, batch_tokens=64)
    if beam_size == 1:
        programs, owner, name = [decoding.greedy_search], translate, "search_batch"
    else:
        programs, owner, name = [slots.stream], slots, "search_stream"
    before = [program._cache_size() for program in programs]

    def compiled() -> list[int]:
        return [p._cache_size() - b for p, b in zip(programs, before, strict=True)]

    seen_at_each_batch = []
    original = getattr(owner, name)

    def recording(model, params, sources, *args, **kwargs):
        length = sources.shape[1] if beam_size == 1 else args[0].src_len
        seen_at_each_batch.append((length, compiled()))
        return original(model, params, sources, *args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    translate.translate(model, params["params"], tokenizer, lines, settings)
    first_of_bucket = {}
    for length, counts in seen_at_each_batch:
        first_of_bucket.setdefault(length, counts)
    assert min(first_of_bucket[8]) >= 1  # compiled before it ran
    assert first_of_bucket[16] == [2] * len(programs)
    assert compiled() == [2] * len(programs)
